"""Graph walks that collect a mini-batch of B distinct items (BatchSampler paper, section 4.2).

A graph is a neighbour table ``neighbors`` of shape [N, K] (int64): row ``v`` lists the
out-neighbours of item ``v``; ``-1`` entries, allowed only at the end of a row, mean "no
neighbour". Rows produced by :func:`hardbatch.proximity_graph` and :func:`hardbatch.knn_graph`
are full and sorted by decreasing similarity.

Walks (``walk=``):

- ``"rwr"``: random walk with restart (paper Algorithm 3). From start node ``u``, each step
  teleports back to ``u`` with probability ``restart`` (alpha) or moves to a uniformly chosen
  neighbour; every newly visited node joins the batch.
- ``"rw"``: plain random walk (``restart = 0``).
- ``"bfs"`` / ``"dfs"``: breadth-first (all neighbours of the start in row order, then
  theirs) / depth-first (a random unvisited neighbour as deep as possible, then back).

Termination on any graph. A walk can run out of new nodes (the start's reachable set holds
fewer than B items, a dead end, a tiny component). It then continues from a fresh start node
not yet in the batch:

- BFS / DFS: as soon as the queue / stack is empty;
- RW: at a node without neighbours;
- RWR / RW: after ``patience`` consecutive steps that add no new item
  (default ``max(100, 10 * K)``), a breadth-first search from the walk's
  root (the start node for RWR, the current node for RW) checks whether any
  item outside the batch is still reachable. If none is, the walk jumps; if
  one is, the walk goes on with doubled patience, up to 1024 times the
  initial patience, after which it jumps anyway. Walks therefore follow
  Algorithm 3 exactly unless their reachable set is exhausted (or an item
  takes over ~10^5 idle steps to reach).

Duplicate keys (``key_ids``, or key sets ``key_sets``; samplers' ``duplicate_keys``): an item
holding a key already in the batch is never added; walks pass through it (an idle step) and
fresh starts skip it, so the argument below holds with "items" read as "keys" (B distinct keys
are required). With key sets, a fresh start that finds every item left in conflict takes one
anyway (``WalkState.fallbacks``; ruled out by the samplers' check unless keys are dense). The
key tests and marks are the kernels of :mod:`hardbatch.keys.membership`, inlined here.

Each fresh start adds one item, so a batch needs at most B starts and every
call terminates. Start nodes are taken from a per-epoch random order of the
items, skipping items already seen this epoch (``seen``); once every item has
been seen, starts are uniform among items not in the batch.

All randomness comes from :mod:`hardbatch._rng` streams seeded per batch, so a
batch depends only on (graph, seed, batch index, epoch state), not on the
machine or thread count. The kernels are compiled with numba; there is no
Python loop per step.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from numba import njit

from .. import _rng
from .._rng import rand_below, rand_unit
from .._validation import check_int, check_real, to_numpy_index_table
from ..keys.encode import compact_key_ids
from ..keys.membership import batch_keys, first_free, item_free, mark_keys

WalkKind = Literal["rwr", "rw", "bfs", "dfs"]
WALKS: dict[str, int] = {"rwr": 0, "rw": 1, "bfs": 2, "dfs": 3}

__all__ = ["WALKS", "WalkState", "walk_batches"]


def check_restart(value, name: str = "restart",
                  expected: str = "a number in [0, 1)") -> float:
    """The RWR restart probability alpha as a float in [0, 1); ``ValueError`` otherwise.

    alpha = 1 is excluded: every step then teleports back to the start node, the
    walk never reaches a neighbour, and a batch is filled only by fresh-start jumps
    after ``patience`` idle steps each (uniform batches, thousands of times slower).
    """
    alpha = check_real(value, name, expected)
    if not 0.0 <= alpha < 1.0:
        hint = ("; at restart=1 the walk never leaves its start node, so batches would be "
                "random jumps: for batches of an anchor's immediate neighbours use "
                "KNNBatchSampler") if alpha >= 1.0 else ""
        raise ValueError(f"{name}={alpha} must lie in [0, 1){hint}")
    return alpha


@njit(cache=True, nogil=True)
def _row_degrees(neighbors: np.ndarray) -> np.ndarray:
    """Valid entries per row; -1 if a row has a valid entry after a -1 or an id out of range."""
    n, k = neighbors.shape
    deg = np.empty(n, np.int64)
    for v in range(n):
        d = 0
        bad = False
        for j in range(k):
            w = neighbors[v, j]
            if w < 0:
                if w != -1:
                    bad = True
                break
            if w >= n:
                bad = True
                break
            d += 1
        for j in range(d + 1, k):
            if neighbors[v, j] != -1:
                bad = True
        deg[v] = -1 if bad else d
    return deg


@njit(inline="always", cache=True)
def _take(v, b, count, out, stamp, sid, seen, keys):
    """Put item ``v`` at ``out[b, count]`` and mark it (and its keys) as in batch ``sid``."""
    out[b, count] = v
    stamp[v] = sid
    seen[v] = 1
    mark_keys(v, sid, keys)


@njit(inline="always", cache=True)
def _fresh_start(seen, start_order, ptr, stamp, stamp_id, state, keys):
    """Next start node: first not-yet-seen item in the epoch order, else a random one not in
    the batch (items whose key is in the batch are passed over, and stay in the order)."""
    n = start_order.shape[0]
    p = ptr[0]
    while p < n and seen[start_order[p]] != 0:
        p += 1
    ptr[0] = p
    while p < n:
        v = start_order[p]
        if seen[v] == 0 and item_free(v, stamp, stamp_id, keys):
            return v
        p += 1
    for _ in range(64):
        v = rand_below(state, n)
        if item_free(v, stamp, stamp_id, keys):
            return v
    off = rand_below(state, n)
    for i in range(n):
        v = (off + i) % n
        if item_free(v, stamp, stamp_id, keys):
            return v
    for i in range(n):  # every item left conflicts with the batch (dense key sets only)
        v = (off + i) % n
        if stamp[v] != stamp_id:
            keys[3][0] += 1
            return v
    return -1  # unreachable: a batch holds fewer items than N


@njit(cache=True)
def _reachable_new(neighbors, deg, root, stamp, sid, mark, mark_id, queue, keys):
    """True if some item that may join the batch is reachable from ``root`` (through items
    in the batch or blocked by their key, which the walk passes through)."""
    head = 0
    tail = 1
    queue[0] = root
    mark[root] = mark_id
    while head < tail:
        v = queue[head]
        head += 1
        for j in range(deg[v]):
            w = neighbors[v, j]
            if item_free(w, stamp, sid, keys):
                return True
            if mark[w] != mark_id:
                mark[w] = mark_id
                queue[tail] = w
                tail += 1
    return False


@njit(cache=True)
def _walk_many(neighbors, deg, batch_size, kind, restarts, seeds, patience,
               seen, start_order, ptr, stamp, stamp_base, first, mark, mark_next, out,
               keys):
    """Fill ``out[b]`` (b < len(seeds)) with one walk batch each; updates ``seen`` and ``ptr``.

    ``first[b] >= 0`` fixes the start node of batch b; -1 draws it. ``keys``: see
    :func:`hardbatch.keys.membership.batch_keys`; an item holding a key already in the batch
    is never added (the walk passes through it) unless no other item is left (``fallbacks``
    counts those).
    """
    state = np.empty(1, np.uint64)
    queue = np.empty(0, np.int64)
    stack_node = np.empty(batch_size, np.int64)
    stack_pos = np.empty(batch_size, np.int64)
    stack_off = np.empty(batch_size, np.int64)
    for b in range(seeds.shape[0]):
        state[0] = seeds[b]
        sid = stamp_base + b
        alpha = restarts[b]
        count = 0
        u = first[b] if first[b] >= 0 else _fresh_start(seen, start_order, ptr, stamp, sid,
                                                         state, keys)
        _take(u, b, count, out, stamp, sid, seen, keys)
        count += 1
        if kind <= 1:  # rwr / rw
            v = u
            idle = 0
            cur_patience = patience
            while count < batch_size:
                jump = False
                if kind == 0 and rand_unit(state) < alpha:
                    v = u
                elif deg[v] == 0:
                    if kind == 0 and v != u:
                        v = u
                    else:
                        jump = True
                else:
                    v = neighbors[v, rand_below(state, deg[v])]
                if not jump and item_free(v, stamp, sid, keys):
                    _take(v, b, count, out, stamp, sid, seen, keys)
                    count += 1
                    idle = 0
                    continue
                idle += 1
                if not jump and idle > cur_patience:
                    if cur_patience < 1024 * patience:
                        if queue.shape[0] == 0:
                            queue = np.empty(neighbors.shape[0], np.int64)
                        mark_next[0] += 1
                        root = u if kind == 0 else v
                        if _reachable_new(neighbors, deg, root, stamp, sid, mark, mark_next[0],
                                          queue, keys):
                            cur_patience *= 2
                            idle = 0
                            continue
                    jump = True
                if jump:
                    cur_patience = patience
                    u = _fresh_start(seen, start_order, ptr, stamp, sid, state, keys)
                    _take(u, b, count, out, stamp, sid, seen, keys)
                    count += 1
                    v = u
                    idle = 0
        elif kind == 2:  # bfs: the batch itself is the queue
            head = 0
            while count < batch_size:
                if head < count:
                    v = out[b, head]
                    head += 1
                    for j in range(deg[v]):
                        w = neighbors[v, j]
                        if item_free(w, stamp, sid, keys):
                            _take(w, b, count, out, stamp, sid, seen, keys)
                            count += 1
                            if count == batch_size:
                                break
                else:
                    w = _fresh_start(seen, start_order, ptr, stamp, sid, state, keys)
                    _take(w, b, count, out, stamp, sid, seen, keys)
                    count += 1
        else:  # dfs
            sp = 0
            stack_node[0] = u
            stack_pos[0] = 0
            stack_off[0] = rand_below(state, deg[u]) if deg[u] > 0 else 0
            sp = 1
            while count < batch_size:
                if sp == 0:
                    w = _fresh_start(seen, start_order, ptr, stamp, sid, state, keys)
                else:
                    top = sp - 1
                    v = stack_node[top]
                    d = deg[v]
                    w = -1
                    while stack_pos[top] < d:
                        cand = neighbors[v, (stack_off[top] + stack_pos[top]) % d]
                        stack_pos[top] += 1
                        if item_free(cand, stamp, sid, keys):
                            w = cand
                            break
                    if w < 0:
                        sp -= 1
                        continue
                _take(w, b, count, out, stamp, sid, seen, keys)
                count += 1
                stack_node[sp] = w
                stack_pos[sp] = 0
                stack_off[sp] = rand_below(state, deg[w]) if deg[w] > 0 else 0
                sp += 1


class WalkState:
    """Per-epoch bookkeeping shared by consecutive walk batches.

    Holds the epoch's random start order, the pointer into it, the ``seen``
    mask (coverage), the items' keys (``key_ids``: int64 [N], -1 for an item whose key no
    other item holds; or ``key_sets``: the CSR ``(ptr, idx)`` of each item's key ids; None: no
    keys) and scratch space. ``coverage`` is the share of items seen this epoch.

    Example:
        >>> from hardbatch.batching.walks import WalkState
        >>> state = WalkState(40, seed=0, epoch=0)
        >>> start = state.next_start(seed=1)  # an item not seen yet this epoch
        >>> state.seen[start] = 1
        >>> 0 <= start < 40, state.coverage
        (True, 0.025)
    """

    def __init__(self, num_items: int, seed: int, epoch: int,
                 key_ids: np.ndarray | None = None, key_sets=None) -> None:
        self.num_items = num_items
        self.start_order = _rng.permutation(num_items, _rng.derive_seed(seed, epoch, 0x57A27))
        self.ptr = np.zeros(1, np.int64)
        self.seen = np.zeros(num_items, np.uint8)
        self._stamp = np.full(num_items, -1, np.int64)
        self._stamp_next = 0
        self._mark = np.full(num_items, -1, np.int64)
        self._mark_next = np.zeros(1, np.int64)
        self.keys = batch_keys(num_items, key_ids, key_sets)
        self.fallbacks = self.keys[3]  # items taken though they conflict (dense keys)

    @property
    def coverage(self) -> float:
        return float(self.seen.mean()) if self.num_items else 0.0

    def state_dict(self) -> dict:
        """The pointer and the packed ``seen`` mask (an int and a uint8 tensor)."""
        return {"ptr": int(self.ptr[0]), "seen": torch.from_numpy(np.packbits(self.seen))}

    def load_state_dict(self, state: dict) -> None:
        self.ptr[0] = int(state["ptr"])
        self.seen[:] = np.unpackbits(np.asarray(state["seen"], np.uint8))[: self.num_items]

    def _sid(self) -> int:
        sid = self._stamp_next
        self._stamp_next += 1
        return sid

    def next_start(self, seed: int) -> int:
        """A start node (anchor): the next unseen item of the epoch order, else a random item."""
        return int(_fresh_start(self.seen, self.start_order, self.ptr, self._stamp, self._sid(),
                               _rng.new_state(seed), self.keys))

    def key_free(self, anchor: int, candidates: np.ndarray, count: int) -> np.ndarray:
        """``anchor``, then the first ``candidates`` whose keys are not yet taken, up to
        ``count`` items (fewer if the candidates run out; given all N - 1 other items, the
        nearest conflicting ones complete the batch, counted in ``fallbacks``)."""
        out = np.empty(count, np.int64)
        placed = first_free(anchor, np.ascontiguousarray(candidates, np.int64), count,
                            self.keys, self._sid(), out)
        if placed < count and len(candidates) >= self.num_items - 1:  # the rest all conflict
            rest = candidates[~np.isin(candidates, out[:placed])][:count - placed]
            out[placed:placed + len(rest)], placed = rest, placed + len(rest)
            self.fallbacks[0] += 1
        return out[:placed]

    def walk(self, neighbors: np.ndarray, deg: np.ndarray, batch_size: int, kind: int,
             restarts: np.ndarray, seeds: np.ndarray, patience: int,
             starts: np.ndarray | None = None) -> np.ndarray:
        """Run ``len(seeds)`` walks; returns int64 [len(seeds), batch_size]."""
        out = np.empty((len(seeds), batch_size), np.int64)
        first = np.full(len(seeds), -1, np.int64) if starts is None else np.ascontiguousarray(
            starts, np.int64)
        _walk_many(neighbors, deg, batch_size, kind, np.ascontiguousarray(restarts, np.float64),
                   np.ascontiguousarray(seeds, np.uint64), patience, self.seen, self.start_order,
                   self.ptr, self._stamp, self._stamp_next, first, self._mark, self._mark_next,
                   out, self.keys)
        self._stamp_next += len(seeds)
        return out


def prepare_graph(neighbors, num_items: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate a neighbour table; returns (int64 C-contiguous table, row degrees)."""
    table = to_numpy_index_table(neighbors, "neighbors")
    if num_items is not None and table.shape[0] != num_items:
        raise ValueError(
            f"neighbors has {table.shape[0]} rows but there are {num_items} items; "
            "build the graph from the same embeddings the sampler uses")
    deg = _row_degrees(table)
    bad = np.flatnonzero(deg < 0)
    if bad.size:
        raise ValueError(
            f"neighbors row {int(bad[0])} is malformed: entries must be item ids in "
            f"[0, {table.shape[0]}) with -1 padding only at the end of a row")
    return table, deg


def default_patience(num_neighbors: int) -> int:
    return max(100, 10 * num_neighbors)


def walk_batches(neighbors: torch.Tensor | np.ndarray, batch_size: int, num_batches: int = 1, *,
                 walk: WalkKind = "rwr", restart: float = 0.2, seed: int = 0,
                 patience: int | None = None, starts=None, key_ids=None) -> torch.Tensor:
    """Collect ``num_batches`` batches of ``batch_size`` distinct items by walking a graph.

    Args:
        neighbors: int64 [N, K] neighbour table (``-1`` padding at row ends allowed).
        batch_size: B, items per batch (``B <= N``).
        num_batches: how many batches; start nodes avoid items already drawn
            by earlier batches of the same call (one epoch's worth of walks).
        walk: ``"rwr"``, ``"rw"``, ``"bfs"`` or ``"dfs"`` (see module docstring).
        restart: restart probability alpha in [0, 1) for ``"rwr"`` (a real number).
        seed: stream seed; the same inputs and seed give the same batches.
        patience: steps without a new item before an RWR/RW walk restarts elsewhere.
        starts: optional int [num_batches] start node of each batch (default: drawn
            from items not yet drawn by this call).
        key_ids: optional int [N] duplicate-key id of each item (-1: an item without
            copies); no batch holds two items with the same id (the walk passes over an
            item whose key is in the batch). Needs at least ``batch_size`` distinct keys
            (items with -1 count one each). Samplers take hashable ``duplicate_keys``.

    Returns:
        int64 tensor [num_batches, batch_size]; each row holds distinct ids.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> graph = hb.knn_graph(torch.randn(40, 8), 5)
        >>> batches = hb.walk_batches(graph, 8, 5, seed=0)
        >>> batches.shape, all(len(set(b.tolist())) == 8 for b in batches)
        (torch.Size([5, 8]), True)
    """
    table, deg = prepare_graph(neighbors)
    n = table.shape[0]
    batch_size = check_int(batch_size, "batch_size", low=1)
    num_batches = check_int(num_batches, "num_batches", low=1)
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} is larger than the number of items N={n}; "
                         "use batch_size <= N")
    if walk not in WALKS:
        raise ValueError(f"walk={walk!r} is not one of {sorted(WALKS)}")
    restart = check_restart(restart)
    patience = default_patience(table.shape[1]) if patience is None else check_int(
        patience, "patience", low=1)
    if starts is not None:
        starts = np.asarray(starts.cpu() if isinstance(starts, torch.Tensor) else starts)
        if starts.shape != (num_batches,) or not np.issubdtype(starts.dtype, np.integer):
            raise ValueError(f"starts must be {num_batches} integer item ids, one per batch")
        if starts.size and (starts.min() < 0 or starts.max() >= n):
            raise ValueError(f"starts must be item ids in [0, {n})")
    state = WalkState(n, seed, 0, None if key_ids is None else
                      compact_key_ids(key_ids, n, batch_size))
    seeds = np.array([_rng.derive_seed(seed, 0, i) for i in range(num_batches)], np.uint64)
    out = state.walk(table, deg, batch_size, WALKS[walk], np.full(num_batches, restart), seeds,
                     patience, starts)
    return torch.from_numpy(out)
