"""Input checks shared by the public API: clear ``ValueError`` messages naming the parameter and the fix."""

from __future__ import annotations

import numbers

import numpy as np
import torch


def check_int(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int within ``[low, high]``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value} must be <= {high}")
    return value


def check_real(value, name: str, expected: str = "a number") -> float:
    """``value`` as a float: a Python or NumPy real scalar or a 0-d tensor/array, never a bool."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


def check_matrix_shape(shape: tuple, name: str) -> None:
    """``ValueError`` unless ``shape`` is a non-empty 2-D [N, d]."""
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D [N, d], got shape {tuple(shape)}; "
                         "reshape it to one row per item")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(shape)}); pass at least one item "
                         "with at least one feature")


def to_numpy_2d(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        x = x.cpu().numpy()
    elif not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise ValueError(f"{name} must be a tensor or array of shape [N, d]") from exc
    check_matrix_shape(x.shape, name)
    return x


def as_embeddings(x, name: str = "embeddings", normalize: bool = False) -> np.ndarray:
    """Validated float32 C-contiguous [N, d] copy-free view where possible.

    Raises ``ValueError`` for wrong rank, empty data, non-numeric dtype and NaN/inf.
    With ``normalize=True`` rows are L2-normalised (zero rows stay zero).
    """
    x = to_numpy_2d(x, name)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"{name} must hold numbers, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    finite = np.isfinite(x)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise ValueError(f"{name} contains NaN or inf (first at row {row}); check the encoder "
                         "output (e.g. a diverged loss or fp16 overflow) before sampling")
    if normalize:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = x / np.maximum(norms, 1e-12)
    return x


def to_numpy_index_table(x, name: str) -> np.ndarray:
    """Validated int64 C-contiguous [N, K] index table."""
    x = to_numpy_2d(x, name)
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{name} must hold integer item ids, got dtype {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.int64)


def num_items_of(n_or_dataset, name: str = "n_or_dataset") -> int:
    """Number of items from an int or a sized dataset."""
    if isinstance(n_or_dataset, numbers.Integral) and not isinstance(n_or_dataset, bool):
        n = int(n_or_dataset)
    elif hasattr(n_or_dataset, "__len__"):
        n = len(n_or_dataset)
    else:
        raise ValueError(f"{name} must be the number of items or a sized dataset, "
                         f"got {type(n_or_dataset).__name__}")
    if n <= 0:
        raise ValueError(f"{name} has no items (N={n}); pass a non-empty dataset")
    return n
