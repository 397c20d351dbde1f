"""Embedding and label files for the diagnostics: ``.npy``, ``.npz``, ``.pt`` / ``.pth`` and
(labels) ``.txt`` / ``.csv``; and :func:`load_reference`, the fixed reference embedding.

A *reference* is one ``[N, d]`` embedding of the N items (an array, a tensor or one of these
files) in which the batches of different samplers, runs or training steps are all measured:
hardness or loss gap in each run's own current embedding move with the model, so two samplers
are compared in one coordinate system only under a shared reference (e.g. the starting model's
embeddings of the training set, or those of a fixed encoder checkpoint).

Every problem is a ``ValueError`` naming the file and the fix (a missing file is a
``FileNotFoundError``); nothing here unpickles arbitrary objects.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["EMBEDDING_EXTENSIONS", "LABEL_EXTENSIONS", "load_reference", "read_embeddings_file",
           "read_labels_file"]

EMBEDDING_EXTENSIONS = (".npy", ".npz", ".pt", ".pth")
LABEL_EXTENSIONS = (".npy", ".npz", ".pt", ".pth", ".txt", ".csv")
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _check_file(path, what: str, extensions: tuple[str, ...]) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} file not found: {path}")
    if not p.is_file():
        raise ValueError(f"{what} path is not a file: {path}")
    suffix = p.suffix.lower()
    if suffix not in extensions:
        raise ValueError(f"{what} file {path} has extension {suffix or '(none)'!r}; use one "
                         f"of {', '.join(extensions)}")
    return p


def _check_magic(p: Path, what: str) -> None:
    """A ``.npy`` / ``.npz`` that is not one (a text file renamed, say) is named as such, rather
    than reported by NumPy as pickled data (whose ``allow_pickle`` hint would be unsafe)."""
    with open(p, "rb") as fh:
        head = fh.read(6)
    suffix = p.suffix.lower()
    if suffix == ".npy" and head != _NPY_MAGIC:
        raise ValueError(f"{what} file {p} is not a NumPy array file (it does not start with the "
                         ".npy header); write it with numpy.save(path, array)")
    if suffix == ".npz" and head[:4] != _ZIP_MAGIC:
        raise ValueError(f"{what} file {p} is not a NumPy .npz archive; write it with "
                         "numpy.savez(path, name=array)")


def _read_torch(p: Path, key: str, what: str):
    import torch

    obj = torch.load(p, map_location="cpu", weights_only=True)
    if isinstance(obj, dict):
        if key not in obj:
            raise ValueError(f"{what} file {p} holds a dict without key {key!r} (keys: "
                             f"{', '.join(map(str, list(obj)[:10]))}); save {{'{key}': tensor}} "
                             "or the tensor itself")
        obj = obj[key]
    if isinstance(obj, torch.Tensor):
        obj = obj.detach()
        if obj.is_floating_point() and obj.dtype != torch.float64:
            obj = obj.float()
        return obj.numpy()
    return np.asarray(obj)


def _read_array(p: Path, key: str, what: str):
    suffix = p.suffix.lower()
    if suffix in (".npy", ".npz"):
        _check_magic(p, what)
    try:
        if suffix == ".npy":
            return np.load(p, allow_pickle=False)
        if suffix == ".npz":
            with np.load(p, allow_pickle=False) as archive:
                names = list(archive.files)
                if not names:
                    raise ValueError(f"{what} file {p} holds no arrays")
                return archive[key if key in names else names[0]]
        if suffix in (".pt", ".pth"):
            return _read_torch(p, key, what)
        lines = [ln.strip() for ln in p.read_text().splitlines()]
        lines = [ln for ln in lines if ln]
        try:
            return np.array([int(ln) for ln in lines], dtype=np.int64)
        except ValueError:
            return np.array(lines)
    except ValueError as exc:
        if str(exc).startswith(f"{what} file"):
            raise
        raise ValueError(f"could not read {what} file {p}: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any reader failure: corrupt / unreadable file
        raise ValueError(f"could not read {what} file {p}: {type(exc).__name__}: {exc}") from None


def read_embeddings_file(path: str | os.PathLike, what: str = "embeddings") -> np.ndarray:
    """``[N, d]`` float32 embeddings from ``.npy``, ``.npz`` (array ``embeddings`` if present,
    else the first) or ``.pt`` / ``.pth`` (a tensor, or a dict with key ``embeddings``).

    Raises ``ValueError`` for a wrong extension, a file that is not what its extension says, a
    shape other than ``[N >= 2, d >= 1]``, a non-numeric dtype or NaN / inf values.

    Example:
        >>> import pathlib, tempfile
        >>> import numpy as np
        >>> from hardbatch.metrics import read_embeddings_file
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = pathlib.Path(tmp) / "train.npz"
        ...     np.savez(path, embeddings=np.ones((40, 8)))
        ...     x = read_embeddings_file(path)
        >>> x.shape, x.dtype
        ((40, 8), dtype('float32'))
    """
    p = _check_file(path, what, EMBEDDING_EXTENSIONS)
    x = _read_array(p, "embeddings", what)
    if x.ndim != 2:
        raise ValueError(f"{what} in {path} must be 2-D [N, d], got shape {tuple(x.shape)}; "
                         "save one row per item")
    if x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"{what} in {path} have shape {tuple(x.shape)}; need at least 2 items "
                         "with at least 1 feature")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)) \
            or x.dtype == bool:
        raise ValueError(f"{what} in {path} must be numeric, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise ValueError(f"{what} in {path} contain NaN or inf (first at row "
                         f"{int(np.flatnonzero(~finite)[0])})")
    return x


def read_labels_file(path: str | os.PathLike, num_items: int) -> np.ndarray:
    """``[N]`` labels from ``.npy`` / ``.npz`` / ``.pt`` (key ``labels`` in a dict or archive)
    or ``.txt`` / ``.csv`` (one label per line); ``num_items`` entries are required.

    Example:
        >>> import pathlib, tempfile
        >>> import numpy as np
        >>> from hardbatch.metrics import read_labels_file
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = pathlib.Path(tmp.name, "labels.txt")
        >>> np.savetxt(path, np.arange(40) % 4, fmt="%d")  # one label per line
        >>> read_labels_file(path, num_items=40)[:6].tolist()
        [0, 1, 2, 3, 0, 1]
        >>> tmp.cleanup()
    """
    p = _check_file(path, "labels", LABEL_EXTENSIONS)
    y = _read_array(p, "labels", "labels")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(f"labels in {path} must be 1-D [N], got shape {tuple(y.shape)}"
                         + ("; for one-hot labels save labels.argmax(1)" if y.ndim == 2 else ""))
    if y.shape[0] != num_items:
        raise ValueError(f"labels in {path} have {y.shape[0]} entries but the embeddings have "
                         f"{num_items} rows; pass one label per item, in the same order")
    if np.issubdtype(y.dtype, np.floating) and not np.isfinite(y).all():
        raise ValueError(f"labels in {path} contain NaN or inf (first at position "
                         f"{int(np.flatnonzero(~np.isfinite(y))[0])})")
    return y


def load_reference(reference, num_items: int | None = None,
                   name: str = "reference") -> np.ndarray:
    """The fixed reference embedding as a float32 ``[N, d]`` array (rows as given; the metrics
    L2-normalise them).

    Args:
        reference: an ``[N, d]`` array or tensor (any device), or the path of a ``.npy`` /
            ``.npz`` / ``.pt`` / ``.pth`` file holding one (see :func:`read_embeddings_file`).
        num_items: the number of items N it must cover (one row per item, in item order), or
            None to accept any N.
        name: how errors name it (e.g. ``"--reference"``).

    Raises:
        ValueError: wrong shape, non-finite values, or a row count other than ``num_items``.

    Example:
        >>> import pathlib, tempfile
        >>> import torch
        >>> from hardbatch.metrics import load_reference
        >>> load_reference(torch.ones(40, 8), num_items=40).shape
        (40, 8)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     torch.save({"embeddings": torch.ones(40, 8)}, pathlib.Path(tmp) / "ref.pt")
        ...     reference = load_reference(pathlib.Path(tmp) / "ref.pt", num_items=40)
        >>> reference.dtype
        dtype('float32')
        >>> load_reference(torch.ones(30, 8), num_items=40)
        Traceback (most recent call last):
            ...
        ValueError: reference has 30 rows but there are 40 items; ...
    """
    if isinstance(reference, (str, os.PathLike)):
        x = read_embeddings_file(reference, what=name)
    else:
        if hasattr(reference, "detach"):
            reference = reference.detach().float().cpu().numpy()
        try:
            x = np.asarray(reference)
        except Exception as exc:
            raise ValueError(f"{name} must be an [N, d] array, tensor or file path") from exc
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"{name} must be 2-D [N, d] (one row per item), got shape "
                             f"{tuple(x.shape)}")
        if x.dtype == bool or not (np.issubdtype(x.dtype, np.floating)
                                   or np.issubdtype(x.dtype, np.integer)):
            raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        finite = np.isfinite(x).all(axis=1)
        if not finite.all():
            raise ValueError(f"{name} row {int(np.flatnonzero(~finite)[0])} contains NaN or inf")
    if num_items is not None and x.shape[0] != num_items:
        raise ValueError(f"{name} has {x.shape[0]} rows but there are {num_items} items; a "
                         "reference holds one row per item, in the items' order")
    return x
