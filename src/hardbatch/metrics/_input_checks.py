"""Input checks shared by the metrics: batches, plans, embedding tables and labels.

Bad input raises ``ValueError`` naming the parameter and the fix.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .._validation import check_matrix_shape, l2_normalize_rows
from .files import load_reference

__all__ = ["ArrayLike", "BatchLike", "as_batch", "as_batches", "check_num_items",
           "embedding_table", "labels_array", "reference_table", "unit_rows"]

BatchLike = Sequence[int] | np.ndarray | Tensor
ArrayLike = Tensor | np.ndarray | Sequence | str | os.PathLike


def check_num_items(num_items, name: str = "num_items") -> int:
    if isinstance(num_items, bool) or not isinstance(num_items, numbers.Integral):
        raise ValueError(  # noqa: TRY004 - the package's contract: ValueError naming the fix
            f"{name} must be an integer (the number of items N), got {num_items!r}")
    if int(num_items) < 1:
        raise ValueError(f"{name}={num_items} must be >= 1 (the number of items N)")
    return int(num_items)


def as_batch(batch, num_items: int | None, name: str = "batch") -> np.ndarray:
    """A batch as an int64 [B] array of ids in ``[0, num_items)``."""
    if isinstance(batch, Tensor):
        batch = batch.detach().cpu().numpy()
    try:
        arr = np.asarray(batch)
    except Exception as exc:  # ragged or exotic input
        raise ValueError(f"{name} must be a 1-D sequence of integer item ids") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of integer item ids, got shape "
                         f"{tuple(arr.shape)}; pass one batch (for a list of batches use "
                         "draw_counts / coverage / plan_stats / loss_gap)")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; pass at least one item id")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer item ids, got dtype {arr.dtype}; "
                         "convert it with .astype(int) / .long()")
    arr = arr.astype(np.int64, copy=False)
    if num_items is not None:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= num_items:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds item id {bad}, outside [0, {num_items}); ids index "
                             f"the rows of embeddings / labels (N={num_items})")
    return arr


def as_batches(batches, num_items: int | None, name: str = "batches") -> list[np.ndarray]:
    """A plan as a list of int64 batches; a sampler or generator is consumed once."""
    if isinstance(batches, (Tensor, np.ndarray)):
        if batches.ndim == 1:
            raise ValueError(f"{name} must be a sequence of batches, got a 1-D array; wrap a "
                             f"single batch as [{name}]")
        seq = list(batches)
    elif isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
        raise ValueError(f"{name} must be an iterable of batches (lists/arrays of item ids), "  # noqa: TRY004
                         f"got {type(batches).__name__}")
    else:
        seq = list(batches)
    if not seq:
        raise ValueError(f"{name} is empty; pass at least one batch")
    if isinstance(seq[0], numbers.Integral) and not isinstance(seq[0], bool):
        raise ValueError(f"{name} must be a sequence of batches, got a flat list of ids; "  # noqa: TRY004
                         f"wrap a single batch as [{name}]")
    return [as_batch(b, num_items, f"{name}[{k}]") for k, b in enumerate(seq)]


def embedding_table(embeddings, name: str = "embeddings"):
    """(table, N, d) with shape and dtype checked; no copy of the whole table (a file path is
    read with :func:`~hardbatch.metrics.files.read_embeddings_file`)."""
    if isinstance(embeddings, (str, os.PathLike)):
        table = load_reference(embeddings, name=name)
        return table, int(table.shape[0]), int(table.shape[1])
    if isinstance(embeddings, Tensor):
        table = embeddings.detach()
        is_float = table.is_floating_point() or not (
            table.is_complex() or table.dtype == torch.bool)
    else:
        try:
            table = np.asarray(embeddings)
        except Exception as exc:
            raise ValueError(f"{name} must be a tensor or array of shape [N, d]") from exc
        is_float = np.issubdtype(table.dtype, np.floating) or (
            np.issubdtype(table.dtype, np.integer) and table.dtype != bool)
    check_matrix_shape(tuple(table.shape), name)
    if not is_float:
        raise ValueError(f"{name} must hold real numbers, got dtype {table.dtype}")
    return table, int(table.shape[0]), int(table.shape[1])


def reference_table(reference, num_items: int):
    """A ``reference=`` argument (array, tensor or file) as an ``[N, d]`` table of ``num_items``
    rows (see :func:`~hardbatch.metrics.files.load_reference`); tensors are used as they are."""
    if isinstance(reference, Tensor):
        table, n, _ = embedding_table(reference, "reference")
        if n != num_items:
            raise ValueError(f"reference has {n} rows but embeddings has {num_items}; a "
                             "reference holds one row per item, in the items' order")
        return table
    return load_reference(reference, num_items)


def unit_rows(table, ids: np.ndarray, name: str = "embeddings") -> Tensor:
    """Rows ``ids`` of ``table`` as L2-normalised float64 [B, d]; NaN/inf rejected."""
    if isinstance(table, Tensor):
        rows = table[torch.from_numpy(ids).to(table.device)].to("cpu", torch.float64)
    else:
        rows = torch.from_numpy(np.asarray(table[ids], dtype=np.float64))
    finite = torch.isfinite(rows).all(dim=1)
    if not bool(finite.all()):
        bad = int(ids[int(torch.nonzero(~finite)[0, 0])])
        raise ValueError(f"{name} row {bad} contains NaN or inf; check the encoder output (a "
                         "diverged loss, fp16 overflow) before computing diagnostics")
    return l2_normalize_rows(rows)


def labels_array(labels, num_items: int | None = None, name: str = "labels") -> np.ndarray:
    """Labels as a 1-D array (object labels: int codes, equal for equal labels); with
    ``num_items``, one label per embedding row is required."""
    if isinstance(labels, Tensor):
        labels = labels.detach().cpu().numpy()
    try:
        arr = np.asarray(labels)
    except Exception as exc:
        raise ValueError(f"{name} must be a 1-D sequence with one label per item") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D [N] (one label per item), got shape "
                         f"{tuple(arr.shape)}; for one-hot labels pass labels.argmax(1)")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; pass one label per item")
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf at position "
                         f"{int(np.flatnonzero(~np.isfinite(arr))[0])}; every item needs a label")
    if num_items is not None and arr.shape[0] != num_items:
        raise ValueError(f"labels has {arr.shape[0]} entries but embeddings has {num_items} rows; "
                         "pass one label per item")
    if arr.dtype == object:  # Python objects (mixed types sort in no order): equal-value codes
        values = arr.tolist()
        if any(v is None for v in values):
            raise ValueError(f"{name} contains None at position {values.index(None)}; every "
                             "item needs a label")
        from ..keys.encode import factorize

        arr = factorize(values)[0]
    return arr
