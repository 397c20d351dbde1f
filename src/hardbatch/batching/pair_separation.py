"""Pairs of items kept out of one batch: the skipped top ranks of B3 and copies of one key.

* :func:`separate_pairs`: moves one item of every pair of a sparse graph that shares a batch
  to another batch (within its block of batches first, so that a change in one block leaves
  the others' swaps alone); :func:`pairs_in_batches` counts such pairs.

The pairs are a sparse graph: :func:`hardbatch.batching.communities.rank_graph` (B3's skipped
ranks), :func:`hardbatch.keys.derive.same_key_graph` (items sharing a key).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from scipy.sparse import csr_matrix

__all__ = ["pairs_in_batches", "separate_pairs"]


@njit(cache=True)
def _partner_in(i, batch, indptr, indices, pos_of, kept, b, skip_item):
    for e in range(indptr[i], indptr[i + 1]):
        j = indices[e]
        if j != skip_item and pos_of[j] < kept and pos_of[j] // b == batch:
            return True
    return False


@njit(cache=True)
def _separate(order, kept, b, indptr, indices, near, x, block_at, first, batches):
    n = order.shape[0]
    nb = (kept + b - 1) // b
    pos_of = np.empty(n, np.int64)
    for p in range(n):
        pos_of[order[p]] = p
    moved, forced = 0, 0
    for p in range(kept):
        i = order[p]
        home = p // b
        if not _partner_in(i, home, indptr, indices, pos_of, kept, b, -1):
            continue
        blk = block_at[p]
        own = batches[first[blk]:first[blk + 1]]  # the batches holding places of its block
        at = np.searchsorted(own, home)
        tries = near.shape[1] + min(len(own), 64)  # its block: near items' batches, the next
        done = False
        for r in range(tries + (min(nb, 64) if len(own) < nb else 0)):  # then any batch
            if r < near.shape[1]:
                q = pos_of[near[i, r]]
                if q >= kept or block_at[q] != blk:
                    continue
                other = q // b
            elif r < tries:
                other = own[(at + 1 + r - near.shape[1]) % len(own)]
            else:
                other = (home + 1 + r - tries) % nb
            if other == home or _partner_in(i, other, indptr, indices, pos_of, kept, b, -1):
                continue
            best, best_sim = -1, -np.inf
            for q in range(other * b, min(kept, other * b + b)):
                u = order[q]
                if (r < tries and block_at[q] != blk) or \
                        _partner_in(u, home, indptr, indices, pos_of, kept, b, i):
                    continue
                sim = 0.0
                for d in range(x.shape[1]):
                    sim += x[u, d] * x[i, d]
                if sim > best_sim:
                    best, best_sim = q, sim
            if best >= 0:
                u = order[best]
                order[p], order[best] = u, i
                pos_of[u], pos_of[i] = p, best
                moved += 1
                done = True
                break
        if not done:
            forced += 1
    return moved, forced


def _block_batches(block_at: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(start of each block's run, the sorted batches holding a place of each block, by block)."""
    batch = np.arange(len(block_at)) // b
    width = batch.max(initial=0) + 1
    pairs = np.unique(block_at * width + batch)
    first = np.searchsorted(pairs // width, np.arange(int(block_at.max(initial=0)) + 2))
    return first.astype(np.int64), (pairs % width).astype(np.int64)


def separate_pairs(order, kept: int, batch_size: int, pairs: csr_matrix, embeddings,
                   near=None, blocks=None) -> tuple[np.ndarray, int, int]:
    """``order`` with no edge of ``pairs`` inside a batch where a swap can avoid it.

    An item whose partner (an edge of the symmetric sparse graph ``pairs``, e.g. the skipped
    top-p ranks of :func:`hardbatch.batching.communities.rank_graph`) sits in its batch swaps places
    with an item u of another batch: the batches of its ``near`` items first (e.g. its window
    neighbours, where it stays hard), then the following batches; u is the item of that batch
    most similar to it (``embeddings``, unit rows) among those with no partner in its batch,
    and it has no partner in u's batch, so a swap never creates a pair. ``blocks`` (int64
    ``[kept]``, a block id >= 0 per place of ``order[:kept]``; None: one block) keeps the swaps
    within the item's block (u in a place of its block; a place of another block only where
    none of its own can take it): the swaps of a block then depend on its places alone (and
    on pair checks across blocks). Deterministic.

    Returns:
        (the repaired order, swaps made, items whose pair could not be separated: forced).

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import pairs_in_batches, rank_graph, separate_pairs
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((40, 8)).astype(np.float32)
        >>> x /= np.linalg.norm(x, axis=1, keepdims=True)
        >>> nbrs = np.argsort(-(x @ x.T), axis=1)[:, 1:4]  # 3 nearest, self excluded
        >>> pairs = rank_graph(nbrs, 0, 1)  # every item and its nearest
        >>> order = np.argsort(nbrs[:, 0], kind="stable")  # nearest pairs close together
        >>> fixed, swaps, forced = separate_pairs(order.copy(), 40, 8, pairs, x, nbrs)
        >>> pairs_in_batches(fixed, 40, 8, pairs), forced, sorted(fixed) == list(range(40))
        (0, 0, True)
        >>> halves = np.arange(40) % 8 // 4  # the first and the last 4 places of every batch
        >>> fixed, _, forced = separate_pairs(order.copy(), 40, 8, pairs, x, nbrs, halves)
        >>> pairs_in_batches(fixed, 40, 8, pairs), sorted(fixed[halves == 0]) == sorted(
        ...     order[halves == 0])  # every swap within a block
        (0, True)
    """
    order = np.ascontiguousarray(order, np.int64)
    x = np.ascontiguousarray(torch.as_tensor(embeddings).detach().cpu().float().numpy())
    near = np.zeros((len(order), 0), np.int64) if near is None else \
        np.ascontiguousarray(near, np.int64)
    block_at = np.zeros(kept, np.int64) if blocks is None else np.asarray(blocks, np.int64)
    if block_at.shape != (kept,) or (kept and block_at.min() < 0):
        raise ValueError(f"blocks must hold a block id >= 0 for each of the kept={kept} "
                         f"places of order, got shape {block_at.shape}")
    first, batches = _block_batches(block_at, batch_size)
    moved, forced = _separate(order, kept, batch_size, pairs.indptr.astype(np.int64),
                              pairs.indices.astype(np.int64), near, x, block_at, first,
                              batches)
    return order, int(moved), int(forced)


def pairs_in_batches(order, kept: int, batch_size: int, pairs: csr_matrix) -> int:
    """Edges of the symmetric graph ``pairs`` whose two items share a batch of ``order``.

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import pairs_in_batches, rank_graph
        >>> pairs = rank_graph(np.array([[1], [0], [3], [2]]), 0, 1)  # 0-1 and 2-3
        >>> pairs_in_batches(np.array([0, 2, 1, 3]), 4, 2, pairs)  # batches {0, 2}, {1, 3}
        0
    """
    order = np.asarray(order, np.int64)
    batch = np.full(pairs.shape[0], -1, np.int64)
    batch[order[:kept]] = np.arange(kept) // batch_size
    g = pairs.tocoo()
    same = (batch[g.row] >= 0) & (batch[g.row] == batch[g.col]) & (g.row < g.col)
    return int(same.sum())
