"""Checksums of saved states: training checkpoints and sampler states.

``torch.load`` checks no CRC: a flipped byte inside a tensor record of a checkpoint loads
silently. :func:`seal` adds to a state dict an ``integrity`` record: the SHA-256 of a canonical
serialisation of everything else in it (every tensor's dtype, shape, strides, offset and the
bytes of its whole storage, as ``torch.save`` writes them; numbers, strings, lists, tuples and
dicts with their types; every multi-byte number in little-endian order, so a checksum written
on one machine verifies on any other) and the version of hardbatch that wrote it.
:func:`verify` recomputes it and raises ``ValueError`` with the word "corrupted" on a mismatch;
a state without the record is reported as such (False), and the caller refuses it.

Public names of a private module: the library's own helpers, not part of the user API.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import struct
import sys

import numpy as np
import torch

__all__ = ["INTEGRITY_KEY", "digest", "library_version", "little_endian_bytes", "seal",
           "span_offset", "tensor_record_spans", "verify"]

INTEGRITY_KEY = "integrity"
FORMAT = 1  # of the canonical serialisation below
_BIG_ENDIAN = sys.byteorder == "big"  # the serialisation is little-endian on every machine


def stable_repr(value) -> str:
    """``repr(value)``, the same in every process: a ``repr`` holding a memory address (a
    function, a ``functools.partial``, an object without its own ``repr``) is replaced by the
    object's qualified name, or its type's.

    Example:
        >>> from hardbatch._integrity import stable_repr
        >>> stable_repr([0.5]), stable_repr(lambda e: 0.1), stable_repr(object())
        ('[0.5]', 'hardbatch._integrity.<lambda>', '<builtins.object>')
    """
    text = repr(value)
    if not re.search(r" at 0x[0-9a-fA-F]", text):
        return text
    if getattr(value, "__qualname__", None) and getattr(value, "__module__", None):
        return f"{value.__module__}.{value.__qualname__}"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def library_version() -> str:
    """The running hardbatch's version (read without importing the package's ``__init__``)."""
    version = getattr(sys.modules.get("hardbatch"), "__version__", None)
    if version is None:  # pragma: no cover - imported without the package
        try:
            version = importlib.metadata.version("hardbatch")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return str(version)


def little_endian_bytes(data: np.ndarray, dtype: torch.dtype, big_endian: bool) -> np.ndarray:
    """``data`` (the uint8 bytes of a storage of ``dtype`` elements, in the byte order of a
    ``big_endian`` machine or not) in little-endian order: a checksum written on one machine
    verifies on any other (complex numbers: each part swapped on its own).

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch._integrity import little_endian_bytes
        >>> big = np.array([1, 2], dtype=">i4").view(np.uint8)  # as a big-endian machine holds it
        >>> little_endian_bytes(big, torch.int32, big_endian=True).view("<i4").tolist()
        [1, 2]
    """
    size = dtype.itemsize // (2 if dtype.is_complex else 1)
    if not big_endian or size == 1 or data.size % size:
        return data
    return np.ascontiguousarray(data.reshape(-1, size)[:, ::-1]).reshape(-1)


def _tensor(h, t: torch.Tensor) -> None:
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.detach()
    storage = t.untyped_storage()
    if storage.device.type != "cpu":
        storage = storage.cpu()
    head = f"T{t.dtype}|{tuple(t.shape)}|{t.stride()}|{t.storage_offset()}|{storage.nbytes()}|"
    h.update(head.encode())
    if storage.nbytes():
        data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        h.update(little_endian_bytes(data, t.dtype, _BIG_ENDIAN))


def _feed(h, obj, path: str) -> None:
    """Feed ``obj``'s canonical serialisation to the hash ``h`` (``path``: for errors)."""
    if isinstance(obj, torch.Tensor):
        _tensor(h, obj)
    elif obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"B1" if obj else b"B0")
    elif isinstance(obj, int):
        h.update(f"I{obj}|".encode())
    elif isinstance(obj, float):
        h.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)}|".encode() + data)
    elif isinstance(obj, bytes):
        h.update(f"Y{len(obj)}|".encode() + obj)
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}|".encode())
        for key in sorted(obj, key=lambda k: (type(k).__name__, repr(k))):
            _feed(h, key, path)
            _feed(h, obj[key], f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}|".encode())
        for i, item in enumerate(obj):
            _feed(h, item, f"{path}[{i}]")
    elif isinstance(obj, (torch.dtype, torch.device)):
        h.update(f"O{type(obj).__name__}:{obj}|".encode())
    elif isinstance(obj, np.ndarray) and obj.dtype != object:
        obj = np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("<"))
        h.update(f"A{obj.dtype.str}|{obj.shape}|".encode())
        h.update(obj.view(np.uint8).reshape(-1))
    elif isinstance(obj, np.generic) and not isinstance(obj, np.object_):
        obj = obj.astype(obj.dtype.newbyteorder("<"))
        h.update(f"G{obj.dtype.str}|".encode() + obj.tobytes())
    else:
        raise TypeError(f"{path} is a {type(obj).__name__}: a saved state holds only tensors, "
                        "numbers, strings, lists, tuples and dicts (what torch.load(..., "
                        "weights_only=True) reads); convert it, e.g. to a tensor or a list")


def digest(obj, path: str = "state") -> str:
    """SHA-256 (hex) of ``obj``'s canonical serialisation (see the module docstring).

    Example:
        >>> import torch
        >>> from hardbatch._integrity import digest
        >>> a = {"step": 3, "x": torch.arange(4)}
        >>> digest(a) == digest({"x": torch.arange(4), "step": 3})  # key order does not matter
        True
        >>> digest(a) == digest({"step": 3, "x": torch.tensor([0, 1, 2, 4])})
        False
    """
    h = hashlib.sha256(f"hardbatch-state-v{FORMAT}|".encode())
    _feed(h, obj, path)
    return h.hexdigest()


def seal(state: dict, path: str = "state") -> dict:
    """A shallow copy of ``state`` with its ``integrity`` record: the SHA-256 of the rest of it,
    the format of the serialisation and the writing hardbatch's version.

    Example:
        >>> import torch
        >>> from hardbatch._integrity import seal, verify
        >>> state = seal({"epoch": 1, "order": torch.arange(5)})
        >>> sorted(state["integrity"]), verify(state, "the state")
        (['format', 'library', 'sha256'], True)
        >>> state["order"][2] = 7  # a flipped value
        >>> try:
        ...     verify(state, "the state")
        ... except ValueError as err:
        ...     print(str(err).split(":")[0])
        the state is corrupted
    """
    body = {k: v for k, v in state.items() if k != INTEGRITY_KEY}
    body[INTEGRITY_KEY] = {"sha256": digest(body, path), "format": FORMAT,
                           "library": library_version()}
    return body


def verify(state: dict, what: str) -> bool:
    """Check ``state``'s ``integrity`` record: True if it matches, False if there is none,
    ``ValueError`` naming ``what`` and "corrupted" if it does not match."""
    record = state.get(INTEGRITY_KEY)
    if record is None:
        return False
    try:
        want, fmt, writer = str(record["sha256"]), int(record["format"]), record["library"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{what} is corrupted: its integrity record is damaged ({exc!r}); "
                         "restore it from a copy or start afresh") from None
    if fmt != FORMAT:
        raise ValueError(f"{what} is corrupted or from a newer hardbatch: its checksum has "
                         f"format {fmt}, this hardbatch {library_version()} reads format "
                         f"{FORMAT} (it was written by hardbatch {writer})")
    body = {k: v for k, v in state.items() if k != INTEGRITY_KEY}
    got = digest(body)
    if got != want:
        raise ValueError(
            f"{what} is corrupted: the SHA-256 of its content ({got[:16]}...) differs from the "
            f"checksum written with it ({want[:16]}..., by hardbatch {writer}); a byte changed "
            "after it was written (disk, transfer or an edit); restore it from a copy or start "
            "afresh")
    return True


def tensor_record_spans(path) -> list[tuple[int, int]]:
    """``[start, end)`` byte offsets, in a file written by ``torch.save``, of every tensor
    storage record (the zip entries under ``data/``): where a flipped byte changes a tensor
    without breaking the file (what :func:`verify` must catch; used by the tests and
    ``scripts/fault_campaign.py``)."""
    import zipfile

    spans = []
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        for info in archive.infolist():
            parts = info.filename.split("/")
            if len(parts) < 2 or parts[-2] != "data" or not info.file_size:
                continue
            f.seek(info.header_offset)
            name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            spans.append((start, start + info.compress_size))
    return spans


def span_offset(spans: list[tuple[int, int]], pick: int) -> int:
    """The file offset of byte ``pick`` of the concatenated ``spans`` (of
    :func:`tensor_record_spans`): ``pick = rng.randrange(total)`` draws a byte of tensor data."""
    for start, end in spans:
        if pick < end - start:
            return start + pick
        pick -= end - start
    raise ValueError(f"pick={pick} lies beyond the spans' bytes")
