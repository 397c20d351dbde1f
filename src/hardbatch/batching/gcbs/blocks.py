"""GCBS step 2 on one similarity block, compiled: the pairs above the threshold and each row's
strongest pairs, in one pass over the block (CPU).

:class:`hardbatch.batching.gcbs.pairs.PairSearchLayout` computes blocks of similarities
``x_i . y_j`` and keeps (i) the pairs above the threshold and (ii) for a row with fewer than k
of them, its k strongest pairs (``min_partners``). With torch that took a comparison mask,
``nonzero``, a copy of the short rows and a ``topk`` over them: several passes over blocks of
~16M floats, about twice the time of the product itself. :func:`block_pairs` reads each row
once: it counts and lists the pairs above the threshold and keeps the k + 1 largest values
below it in a small sorted buffer. It returns the same pairs as the torch version; where the
k-th and the (k + 1)-th strongest pair of a row tie, the row is handed back to the caller,
which selects it with ``torch.topk`` as before (so ties are broken the same way).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ..._sorted import insert_descending

__all__ = ["block_pairs"]


_CHUNK = 64  # values per chunk: a chunk whose maximum is below the row's bound is skipped


@njit(cache=True, nogil=True, fastmath={"nnan", "nsz", "reassoc", "contract"})
def _block_pairs(sims, self_col, threshold, k, rows, cols, tied, start, pos):
    """Pairs of rows ``start``.. of ``sims`` into ``rows/cols[pos:]``; returns (next row, pos).

    Stops before a row when fewer than ``C + k`` slots are left (the caller grows the arrays
    and resumes). Per row: every column above ``threshold`` (the self column skipped), and
    the k + 1 largest values below it in a sorted buffer, whose smallest is the bound a
    value must pass (whole chunks below it are skipped); the row's ``k - h`` strongest
    pairs are then taken from the buffer (h: its pairs above the threshold), unless the
    buffer ties at that boundary: ``tied[i] = 1`` and none are taken.
    """
    n_rows, n_cols = sims.shape
    top_v = np.empty(k + 1, np.float32)
    top_c = np.empty(k + 1, np.int64)
    for i in range(start, n_rows):
        if rows.shape[0] - pos < n_cols + k:
            return i, pos
        row = sims[i]
        me = self_col[i]
        first = pos
        nt = 0
        bound = threshold if k == 0 else np.float32(-np.inf)
        for j0 in range(0, n_cols, _CHUNK):
            j1 = min(n_cols, j0 + _CHUNK)
            m = row[j0]
            for j in range(j0 + 1, j1):
                m = max(m, row[j])
            if m <= bound:
                continue
            for j in range(j0, j1):
                v = row[j]
                if v <= bound or j == me:
                    continue
                if v > threshold:
                    rows[pos] = i
                    cols[pos] = j
                    pos += 1
                    continue
                insert_descending(top_v, top_c, min(nt, k), v, j)  # the k + 1 largest below
                nt = min(nt + 1, k + 1)
                if nt == k + 1:
                    bound = top_v[k]
        need = k - (pos - first)
        if need > 0:
            got = min(need, nt)
            if nt > need and top_v[need - 1] == top_v[need]:
                tied[i] = 1  # the caller selects this row's partners
                got = 0
            for t in range(got):
                rows[pos] = i
                cols[pos] = top_c[t]
                pos += 1
    return n_rows, pos


def block_pairs(sims: torch.Tensor, self_col: np.ndarray, threshold: float,
                k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of a CPU float32 block ``sims`` [R, C]: (row, column) positions.

    ``self_col[i]`` is the column of row i's own item (-1: none in the block); self pairs are
    never returned. Returns ``(rows, cols, tied)``: every pair above ``threshold``, and for a
    row with h < k of them its k - h strongest pairs below it (``min_partners``), except for
    the rows listed in ``tied`` (int64 positions), whose strongest pairs tie at the boundary:
    the caller selects those with ``torch.topk``.

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch.batching.gcbs.blocks import block_pairs
        >>> sims = torch.tensor([[1.0, 0.9, 0.2, 0.1], [0.9, 1.0, 0.3, 0.0],
        ...                      [0.2, 0.3, 1.0, 0.8], [0.1, 0.0, 0.8, 1.0]])
        >>> rows, cols, tied = block_pairs(sims, np.arange(4), threshold=0.85, k=2)
        >>> sorted(zip(rows.tolist(), cols.tolist())), tied.tolist()
        ([(0, 1), (0, 2), (1, 0), (1, 2), (2, 1), (2, 3), (3, 0), (3, 2)], [])
    """
    s = sims.numpy()
    self_col = np.ascontiguousarray(self_col, dtype=np.int64)
    n_rows, n_cols = s.shape
    rows = np.empty(n_rows * (k + 32) + n_cols + k, np.int64)
    cols = np.empty_like(rows)
    tied = np.zeros(n_rows, np.uint8)
    i, pos = 0, 0
    while True:
        i, pos = _block_pairs(s, self_col, np.float32(threshold), k, rows, cols, tied, i, pos)
        if i == n_rows:
            return rows[:pos], cols[:pos], np.flatnonzero(tied)
        rows = np.concatenate([rows[:pos], np.empty(len(rows), np.int64)])
        cols = np.concatenate([cols[:pos], np.empty(len(cols), np.int64)])
