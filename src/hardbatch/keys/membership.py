"""Whether a batch already holds an item's keys: the keys of some items and the items free of them.

Keys are encoded as a CSR (:mod:`hardbatch.keys.encode`): item i holds the key ids
``idx[ptr[i]:ptr[i + 1]]``. Two forms of the one question "does this item share a key with the
batch?":

* whole arrays (NumPy): :func:`item_keys` (the keys some items hold) and :func:`free_of` (the
  candidates holding none of them), e.g. to top a batch up with items of another;
* batches grown one item at a time (numba kernels of :mod:`hardbatch.batching.walks`, walks and
  kNN batches): :func:`batch_keys` packs the CSR with a stamp per key id; a key is in batch
  ``sid`` when its stamp is ``sid``. :func:`mark_keys` stamps an item's keys,
  :func:`keys_free` / :func:`item_free` test an item, and :func:`first_free` fills a kNN batch.
  The walks inline the small kernels (``inline="always"``), so calling them from there costs
  nothing; numba's cache of a caller is keyed on the caller's file alone, so after editing a
  kernel here, delete the numba cache files (``*.nbi``, ``*.nbc``) of ``batching/__pycache__``.

:func:`single_key_csr`: one key id per item (``-1``: none) as that CSR.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["batch_keys", "first_free", "free_of", "item_free", "item_keys", "keys_free",
           "mark_keys", "single_key_csr"]


def single_key_csr(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One key id per item (``-1``: no key) as the CSR ``(ptr, idx)`` of each item's key ids.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.membership import single_key_csr
        >>> ptr, idx = single_key_csr(np.array([0, -1, 0, 1]))
        >>> ptr.tolist(), idx.tolist()
        ([0, 1, 1, 2, 3], [0, 0, 1])
    """
    ptr = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(ids >= 0, out=ptr[1:])
    return ptr, ids[ids >= 0]


def item_keys(ptr: np.ndarray, idx: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The keys held by ``items`` (concatenated, with repeats).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import item_keys
        >>> item_keys(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), np.array([2, 0])).tolist()
        [0, 1]
    """
    items = np.asarray(items, np.int64)
    lengths = ptr[items + 1] - ptr[items]
    if not lengths.sum():
        return np.empty(0, np.int64)
    starts = np.repeat(ptr[items] - np.cumsum(lengths) + lengths, lengths)
    return idx[starts + np.arange(int(lengths.sum()))]


def free_of(ptr: np.ndarray, idx: np.ndarray, candidates: np.ndarray,
            taken: np.ndarray) -> np.ndarray:
    """The ``candidates`` that hold none of the keys ``taken`` (order kept).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import free_of
        >>> ptr, idx = np.array([0, 1, 2, 2]), np.array([0, 0])
        >>> free_of(ptr, idx, np.array([1, 2]), np.array([0])).tolist()  # item 1 holds key 0
        [2]
    """
    candidates = np.asarray(candidates, np.int64)
    lengths = ptr[candidates + 1] - ptr[candidates]
    hit = np.isin(item_keys(ptr, idx, candidates), taken)
    owner = np.repeat(np.arange(len(candidates)), lengths)
    bad = np.zeros(len(candidates), bool)
    bad[owner[hit]] = True
    return candidates[~bad]


def batch_keys(num_items: int, key_ids: np.ndarray | None = None, key_sets=None) -> tuple:
    """The keys of N items as the kernels read them: ``(ptr, idx, stamp, fallbacks)``.

    ``key_sets``: the CSR ``(ptr, idx)`` of each item's key ids; else ``key_ids`` (int64 [N],
    ``-1``: an item whose key no other item holds); neither: no keys. ``stamp`` [number of key
    ids] holds the batch id that last took each key (``-1``: none yet); ``fallbacks`` [1] counts
    items a batch took though they conflict (only when nothing else was left).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.membership import batch_keys, item_free, mark_keys
        >>> keys = batch_keys(3, np.array([0, -1, 0]))
        >>> stamp = np.full(3, -1, np.int64)  # items in batch 7: none yet
        >>> mark_keys(0, 7, keys)  # item 0 joins batch 7 (its key 0 with it)
        >>> item_free(1, stamp, 7, keys), item_free(2, stamp, 7, keys)
        (True, False)
    """
    if key_sets is None:  # one key id per item (-1: none) as a CSR of its key ids
        ids = np.full(num_items, -1, np.int64) if key_ids is None else np.asarray(key_ids)
        key_sets = single_key_csr(ids)
    ptr, idx = (np.ascontiguousarray(a, np.int64) for a in key_sets)
    fallbacks = np.zeros(1, np.int64)
    return ptr, idx, np.full(int(idx.max(initial=0)) + 1, -1, np.int64), fallbacks


@njit(inline="always", cache=True)
def keys_free(v, sid, keys):
    """Whether no key of item ``v`` is in batch ``sid`` (``keys``: :func:`batch_keys`).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.membership import batch_keys, keys_free
        >>> keys_free(0, 7, batch_keys(2, np.array([0, 0])))
        True
    """
    for e in range(keys[0][v], keys[0][v + 1]):
        if keys[2][keys[1][e]] == sid:
            return False
    return True


@njit(inline="always", cache=True)
def item_free(v, stamp, sid, keys):
    """Whether item ``v`` may join batch ``sid``: not in it (``stamp[v] != sid``), nor any of
    its keys (``keys``: :func:`batch_keys`).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.membership import batch_keys, item_free
        >>> item_free(0, np.array([7, -1]), 7, batch_keys(2))  # item 0 is in batch 7
        False
    """
    if stamp[v] == sid:  # (an if: numba compiles `a and f()` into much slower code here)
        return False
    return keys_free(v, sid, keys)


@njit(inline="always", cache=True)
def mark_keys(v, sid, keys):
    """Mark the keys of item ``v`` as in batch ``sid`` (``keys``: :func:`batch_keys`).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.membership import batch_keys, mark_keys
        >>> keys = batch_keys(3, np.array([0, -1, 0]))
        >>> mark_keys(2, 5, keys)
        >>> keys[2].tolist()  # key 0 is in batch 5
        [5]
    """
    for e in range(keys[0][v], keys[0][v + 1]):
        keys[2][keys[1][e]] = sid


@njit(cache=True)
def first_free(anchor, candidates, count, keys, sid, out):
    """``out[0] = anchor``, then the first candidates sharing no key with ``out``, until
    ``count`` items (batch ``sid``; ``keys``: :func:`batch_keys`); returns how many were placed.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.membership import batch_keys, first_free
        >>> out = np.empty(3, np.int64)
        >>> keys = batch_keys(4, np.array([0, 0, -1, -1]))
        >>> first_free(0, np.array([1, 2, 3]), 3, keys, 0, out), out.tolist()  # 1 shares key 0
        (3, [0, 2, 3])
    """
    placed = 1
    out[0] = anchor
    mark_keys(anchor, sid, keys)
    for c in range(candidates.shape[0]):
        if placed == count:
            break
        v = candidates[c]
        if not keys_free(v, sid, keys):
            continue
        mark_keys(v, sid, keys)
        out[placed] = v
        placed += 1
    return placed
