"""The plan file format of :mod:`hardbatch.plan_files`: writing a plan's Parquet table with
its metadata (the options as JSON: :func:`jsonable_options`) and checksum (atomically), and
reading it back checked (:func:`read_plan`, :class:`Plan`); the inputs plans are written from:
embeddings (:func:`load_embeddings`: arrays, files, or texts a model encodes), a Parquet
file's column (:func:`parquet_column`), a ``save_to_disk`` folder (:func:`dataset_folder`) and
recorded batches (:func:`batch_row_ids`). The format and why it is Parquet:
:mod:`hardbatch.plan_files`.

Public names of a private module: the library's own helpers; users import them from
:mod:`hardbatch.plan_files` (or :mod:`hardbatch`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import uuid
import warnings
from pathlib import Path

import numpy as np
import torch

from ._integrity import digest, library_version, stable_repr
from ._validation import check_int, embedding_tensor

__all__ = ["FORMAT", "META_FIELDS", "META_KEY", "VERSION", "Plan", "atomic_write",
           "batch_row_ids", "dataset_folder", "jsonable_options", "load_embeddings",
           "parquet_column", "parquet_names", "pyarrow_modules", "read_plan", "write_table"]

FORMAT, VERSION, META_KEY = "hardbatch-plan", 1, b"hardbatch.plan"
META_FIELDS = ("format", "version", "sampler", "options", "seed", "epochs", "world_size",
               "batch_size", "steps_per_epoch", "num_rows", "embeddings_sha256",
               "hardbatch_version", "sha256")


def pyarrow_modules():
    """``(pyarrow, pyarrow.parquet)``, or an ``ImportError`` naming the ``plans`` extra."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError('plan files are Parquet files, read and written with pyarrow: '
                          'pip install "hardbatch[plans]"') from None
    return pa, pq


def parquet_column(path, column, what: str):
    """Parquet file ``path``'s ``column`` (a pyarrow array); ``ValueError`` naming the file and
    the columns there are (``what``: the column's content, for the message).

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> from hardbatch._plan_format import parquet_column
        >>> tmp = tempfile.TemporaryDirectory()
        >>> pq.write_table(pa.table({"text": ["a", "b"]}), f"{tmp.name}/t.parquet")
        >>> parquet_column(f"{tmp.name}/t.parquet", "text", "text").to_pylist()
        ['a', 'b']
        >>> tmp.cleanup()
    """
    names = parquet_names(path)
    if column not in names:
        raise ValueError(f"{path} has no column {column!r} (its columns: {', '.join(names)}); "
                         f"pass column= (hardbatch plan --column) naming the {what} column")
    return pyarrow_modules()[1].read_table(path, columns=[column]).column(column) \
        .combine_chunks()


def parquet_names(path) -> list[str]:
    """The column names of Parquet file ``path``; ``ValueError`` if it is not one."""
    pa, pq = pyarrow_modules()
    try:
        return pq.read_schema(path).names
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{path} is not a readable Parquet file ({exc})") from None


def dataset_folder(path):
    """The ``datasets.Dataset`` that ``Dataset.save_to_disk`` wrote to the folder ``path``;
    ``ValueError`` for another folder or a ``DatasetDict``'s (naming the split folders).

    Example:
        >>> import tempfile, datasets
        >>> from hardbatch._plan_format import dataset_folder
        >>> tmp = tempfile.TemporaryDirectory()
        >>> datasets.Dataset.from_dict({"anchor": ["a", "b"]}).save_to_disk(tmp.name)
        >>> list(dataset_folder(tmp.name)["anchor"])
        ['a', 'b']
        >>> tmp.cleanup()
    """
    try:
        from datasets import load_from_disk
    except ImportError:
        raise ImportError(f"{path} is a folder: reading a save_to_disk folder needs datasets "
                          "(pip install datasets)") from None
    try:
        data = load_from_disk(os.fspath(path))
    except FileNotFoundError as exc:
        raise ValueError(f"embeddings={os.fspath(path)!r} is a folder but not one that datasets' "
                         f"save_to_disk wrote ({exc}); pass such a folder, a .parquet file or a "
                         "list of texts") from None
    if isinstance(data, dict):  # a DatasetDict: one folder per split
        raise ValueError(f"embeddings={os.fspath(path)!r} holds a DatasetDict; pass the folder "
                         f"of one split: {', '.join(os.path.join(path, k) for k in data)}")
    return data


def jsonable_options(options: dict) -> dict:
    """The options as JSON; a long value (an array, per-item keys) as a summary and SHA-256.

    Example:
        >>> from hardbatch._plan_format import jsonable_options
        >>> jsonable_options({"k": 5, "keys": list(range(200))})["keys"]["summary"]
        'list of 200 items'
    """
    out = {}
    for key, value in options.items():
        text = json.dumps(value, sort_keys=True, default=_jsonable)
        loaded = json.loads(text)
        out[key] = loaded if len(text) <= 512 else {
            "summary": f"{type(value).__name__} of {len(loaded)} "
                       f"{'characters' if isinstance(loaded, str) else 'items'}",
            "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return out


def _jsonable(v):
    """JSON for what ``json`` cannot write, the same in every process: arrays as lists, sets in
    sorted order (a set's own order changes with ``PYTHONHASHSEED``), other objects by
    :func:`~hardbatch._integrity.stable_repr` (a schedule's ``repr`` states its values)."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=lambda x: (type(x).__name__, repr(x)))
    return stable_repr(v)


def atomic_write(path, write) -> None:
    """``write(file)`` into a temporary file beside ``path``, flushed to disk, then renamed onto
    ``path``: readers see the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _body(meta: dict, keys, offsets, rows) -> dict:
    return {"meta": {k: v for k, v in meta.items() if k != "sha256"}, "keys": keys,
            "offsets": offsets, "rows": rows}


def _canonical(keys: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple:
    """The batches in the order the writer writes them (by epoch, step, rank), whatever the
    file's row order: the checksum holds for a file that another tool only reordered."""
    order = np.lexsort((keys[:, 1], keys[:, 2], keys[:, 0]))
    if np.array_equal(order, np.arange(len(order))):
        return keys, offsets, rows
    sizes = np.diff(offsets)[order]
    new = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    take = np.repeat(offsets[:-1][order] - new[:-1], sizes) + np.arange(new[-1])
    return keys[order], new, rows[take]


def write_table(path, meta: dict, batches: dict) -> None:
    """Write ``{(epoch, rank): batches}`` with ``meta`` (its checksum added) atomically."""
    pa, pq = pyarrow_modules()
    grid = [(e, r, s) for e, s, r in itertools.product(
        range(meta["epochs"]), range(meta["steps_per_epoch"]), range(meta["world_size"]))]
    flat = [np.asarray(batches[e, r][s], np.int64) for e, r, s in grid]
    keys = np.array(grid, np.int64).reshape(-1, 3)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in flat])]).astype(np.int64)
    rows = np.concatenate(flat) if flat else np.zeros(0, np.int64)
    meta = dict(meta, sha256=digest(_body(meta, keys, offsets, rows)))
    table = pa.table({**{c: pa.array(keys[:, i], pa.int32())
                         for i, c in enumerate(("epoch", "rank", "step"))},
                      "rows": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(rows))})
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    atomic_write(path, lambda f: pq.write_table(table, f))


class Plan:
    """A checked plan (:func:`read_plan`): its metadata as attributes (``plan.sampler``,
    ``plan.options``, ``plan.seed``, ``plan.epochs``, ``plan.world_size``, ``plan.batch_size``,
    ``plan.steps_per_epoch``, ``plan.num_rows``, ``plan.embeddings_sha256``, ...; all of them in
    ``plan.meta``), ``plan.short_batches`` (whether a batch holds fewer than ``batch_size``
    rows) and :meth:`batches`.

    Example:
        >>> import tempfile, numpy as np
        >>> from hardbatch.plan_files import write_plan
        >>> tmp = tempfile.TemporaryDirectory()
        >>> plan = write_plan(f"{tmp.name}/p.parquet", np.ones((40, 8)), "uniform", 16, epochs=2)
        >>> plan
        Plan('.../p.parquet', sampler='uniform', epochs=2, world_size=1, batch_size=16)
        >>> plan.steps_per_epoch, plan.num_rows, [len(b) for b in plan.batches(epoch=1, rank=0)]
        (3, 40, [16, 16, 8])
        >>> tmp.cleanup()
    """

    def __init__(self, path, meta: dict, keys: np.ndarray, offsets: np.ndarray,
                 rows: np.ndarray) -> None:
        self.path, self.meta = str(path), meta
        e, w, s = meta["epochs"], meta["world_size"], meta["steps_per_epoch"]
        order = np.lexsort((keys[:, 1], keys[:, 2], keys[:, 0]))  # by epoch, step, rank
        grid = np.array([(a, c, b) for a, b, c in itertools.product(range(e), range(s), range(w))],
                        np.int64).reshape(-1, 3)
        if keys.shape != grid.shape or not np.array_equal(keys[order], grid):
            raise _corrupt(path, f"it does not hold exactly one batch per (epoch, rank, step) "
                                 f"of epochs={e}, world_size={w}, steps_per_epoch={s}")
        sizes = np.diff(offsets)
        if ((sizes < 1) | (sizes > meta["batch_size"])).any():
            raise _corrupt(path, f"its batches hold {sizes.min()} to {sizes.max()} rows, not "
                                 f"1..batch_size={meta['batch_size']}")
        bad = np.flatnonzero((rows < 0) | (rows >= meta["num_rows"]))
        if len(bad):
            ep, r, st = keys[np.searchsorted(offsets, bad[0], side="right") - 1]
            raise ValueError(f"{path}: row id {rows[bad[0]]} (epoch {ep}, rank {r}, step {st}) "
                             f"is out of range for its num_rows={meta['num_rows']}; write the "
                             "plan again from the dataset's embeddings (write_plan, hardbatch "
                             "plan)")
        self._order, self._offsets, self._rows = order, offsets, rows
        self.short_batches = bool((sizes < meta["batch_size"]).any())  # any below batch_size

    def __getattr__(self, name):
        meta = self.__dict__.get("meta", {})
        if name in meta:
            return meta[name]
        raise AttributeError(f"'Plan' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return (f"Plan({self.path!r}, sampler={self.sampler!r}, epochs={self.epochs}, "
                f"world_size={self.world_size}, batch_size={self.batch_size})")

    def batches(self, epoch: int = 0, rank: int = 0) -> list[list[int]]:
        """Rank ``rank``'s batches of ``epoch`` (row ids), in step order."""
        epoch, rank = check_int(epoch, "epoch", 0), check_int(rank, "rank", 0)
        if epoch >= self.epochs:
            raise ValueError(f"{self.path}: epoch={epoch} is beyond the plan, which holds epochs "
                             f"0..{self.epochs - 1}; write the plan with epochs={epoch + 1} or "
                             "more (write_plan(epochs=...), hardbatch plan --epochs)")
        if rank >= self.world_size:
            raise ValueError(f"{self.path} holds ranks 0..{self.world_size - 1} (world_size="
                             f"{self.world_size}) but rank={rank} was asked for; write the plan "
                             "for the job's world size (hardbatch plan --world-size)")
        s, w, o = self.steps_per_epoch, self.world_size, self._offsets
        return [self._rows[o[i]:o[i + 1]].tolist()
                for i in self._order[(epoch * s + np.arange(s)) * w + rank]]


def _corrupt(path, why: str) -> ValueError:
    return ValueError(f"{path} is corrupted or not a whole plan file: {why}; write it again with "
                      "write_plan / hardbatch plan (or restore it from a copy)")


def read_plan(path) -> Plan:
    """The :class:`Plan` in the Parquet file ``path``, checked: a file that is not Parquet, not
    a plan, of another format version, corrupted (checksum) or with row ids outside its
    ``num_rows`` is a ``ValueError`` naming the file.

    Example:
        >>> import tempfile, numpy as np
        >>> from hardbatch.plan_files import read_plan, write_plan
        >>> tmp = tempfile.TemporaryDirectory()
        >>> _ = write_plan(f"{tmp.name}/plan.parquet", np.ones((40, 8)), "uniform", 16, seed=3)
        >>> plan = read_plan(f"{tmp.name}/plan.parquet")
        >>> plan.seed, plan.num_rows, [len(b) for b in plan.batches(epoch=0, rank=0)]
        (3, 40, [16, 16, 8])
        >>> tmp.cleanup()
    """
    pa, pq = pyarrow_modules()
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"plan file not found: {path}") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise _corrupt(path, f"it is not a readable Parquet file ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise ValueError(f"{path} is a Parquet file but not a hardbatch plan (no "
                         f"{META_KEY.decode()!r} metadata); write plans with write_plan or "
                         "hardbatch plan")
    try:
        meta = json.loads(raw)
        if meta.get("format") == FORMAT and isinstance(meta.get("version"), int) and \
                meta["version"] > VERSION:
            raise ValueError(f"{path} was written by a newer hardbatch ("
                             f"{meta.get('hardbatch_version', '?')}, plan format version "
                             f"{meta['version']}) than this one ({library_version()}, which "
                             f"reads version {VERSION}); upgrade hardbatch: pip install -U "
                             "hardbatch")
        if (meta.get("format"), meta.get("version")) != (FORMAT, VERSION):
            raise _corrupt(path, f"its metadata says format {meta.get('format')!r} version "
                                 f"{meta.get('version')!r}; this hardbatch reads {FORMAT!r} "
                                 f"version {VERSION}")
        if [k for k in META_FIELDS if k not in meta]:
            raise _corrupt(path, f"its metadata lacks {[k for k in META_FIELDS if k not in meta]}")
        columns = [table.column(c) for c in ("epoch", "rank", "step")]
        lists = table.column("rows").combine_chunks()  # large_list, or list from another writer
        if any(c.null_count for c in columns) or lists.null_count or not (
                pa.types.is_large_list(lists.type) or pa.types.is_list(lists.type)) or \
                not pa.types.is_integer(lists.type.value_type):
            raise _corrupt(path, "its columns hold nulls or 'rows' is not a list column of "
                                 "integers")
        keys = np.stack([c.to_numpy() for c in columns], 1).astype(np.int64)
        offsets = lists.offsets.to_numpy().astype(np.int64)
        rows = lists.flatten().to_numpy().astype(np.int64)
    except (pa.ArrowException, KeyError, TypeError, AttributeError, json.JSONDecodeError,
            UnicodeDecodeError) as exc:
        raise _corrupt(path, f"{type(exc).__name__}: {exc}") from None
    offsets -= offsets[0]
    if digest(_body(meta, *_canonical(keys, offsets, rows))) != meta["sha256"]:
        raise _corrupt(path, "the SHA-256 of its metadata and batches differs from the checksum "
                             "written with it (a byte changed after it was written)")
    return Plan(path, meta, keys, offsets, rows)


# -- inputs of the writers -------------------------------------------------------------------
def batch_row_ids(batch, epoch: int, step: int) -> np.ndarray:
    """One recorded batch as int64 row ids; ``ValueError`` for anything but a 1-D sequence of
    integers (an epoch passed without its outer list, float or bool ids), a warning for an id
    repeated within the batch (its copy becomes a false negative in an in-batch loss)."""
    a = np.asarray(batch.detach().cpu() if isinstance(batch, torch.Tensor) else batch)
    if a.ndim != 1 or (a.size and (a.dtype == bool or not np.issubdtype(a.dtype, np.integer))):
        raise ValueError(f"batches: epoch {epoch}, step {step} is {a.ndim}-D of {a.dtype}, not "
                         "a 1-D list of integer row ids; pass one list of batches per epoch, "
                         "e.g. [[[0, 3], [1, 2]]] for one epoch of two batches")
    a = a.astype(np.int64)
    if len(np.unique(a)) != len(a):
        warnings.warn(f"batches: epoch {epoch}, step {step} holds a row id more than once; "
                      "an in-batch loss then treats the copy as a negative", stacklevel=3)
    return a


def _texts(data, column) -> list[str]:
    if isinstance(data, (str, os.PathLike)):
        data = dataset_folder(data) if os.path.isdir(data) else \
            parquet_column(data, column or parquet_names(data)[0], "text").to_pylist()
    if isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        return list(data)
    from .integrations.sentence_transformers import column_texts
    return column_texts(data, column, "column=... (hardbatch plan --column)")


def load_embeddings(embeddings, *, column: str | None = None, model=None,
                    encode_batch_size: int = 64) -> np.ndarray:
    """Float32 ``[N, d]`` rows of an array or tensor, a ``.npy`` / ``.npz`` / ``.pt`` / ``.pth``
    file or a ``.parquet`` file's list ``column``; with ``model`` (a ``SentenceTransformer``, or
    a name or path to load one; imported lazily), the model's unit-norm embeddings of the texts
    in ``embeddings``: a list of strings, or a ``datasets.Dataset``, a folder it was saved to
    (``save_to_disk``) or a ``.parquet`` file, and its text ``column`` (default: a dataset's
    first column), ``encode_batch_size`` per encode batch.

    Example:
        >>> import tempfile, numpy as np
        >>> from hardbatch.plan_files import load_embeddings
        >>> tmp = tempfile.TemporaryDirectory()
        >>> np.save(f"{tmp.name}/emb.npy", np.ones((40, 8)))
        >>> load_embeddings(f"{tmp.name}/emb.npy").shape, load_embeddings(np.ones((40, 8))).dtype
        ((40, 8), dtype('float32'))
        >>> tmp.cleanup()
    """
    x, name = embeddings, "embeddings"
    if model is not None:
        texts = _texts(embeddings, column)
        if isinstance(model, (str, os.PathLike)):
            from sentence_transformers import SentenceTransformer
            model = SentenceTransformer(str(model))
        from .integrations.sentence_transformers import TextEmbeddingSource
        x = TextEmbeddingSource(model, texts, encode_batch_size, shard=False)()
    elif isinstance(embeddings, (str, os.PathLike)) and \
            Path(embeddings).suffix.lower() == ".parquet":
        name = f"column {column!r} of {embeddings}"
        try:  # one list of d numbers per row
            x = np.stack(parquet_column(embeddings, column, "embeddings").to_numpy(False))
        except (ValueError, TypeError) as exc:
            if str(exc).startswith(str(embeddings)):
                raise
            raise ValueError(f"{name} must hold one list of d numbers (an embedding) per row, "
                             f"without nulls ({exc})") from None
    elif isinstance(embeddings, (str, os.PathLike)) and os.path.isdir(embeddings):
        raise ValueError(f"embeddings={os.fspath(embeddings)!r} is a folder: a datasets folder "
                         "holds texts, which model= (hardbatch plan --model) encodes")
    elif isinstance(embeddings, (str, os.PathLike)):
        from .metrics.files import read_embeddings_file  # .npy / .npz / .pt, checked
        x = read_embeddings_file(embeddings)
    return embedding_tensor(x, name).cpu().numpy()
