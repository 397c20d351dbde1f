"""Candidate pools of the proximity graph (BatchSampler eq. 3): which items each item compares with.

:func:`hardbatch.neighbors.proximity_graph.proximity_graph` builds the graph from these pools;
every public name here is re-exported by :mod:`hardbatch.neighbors.knn_graph`.

Candidate pools
---------------
The paper draws, for every item, M candidates uniformly from the other items and keeps the K with
the largest inner product. Done literally, every item gathers M rows of the embedding matrix: N*M*d
reads (15 GB for MNIST's 60k items at M=1000, d=64; 650 GB at ImageNet scale), which is what makes
the authors' gather + bmm slow. We let items share candidate pools in small random groups of
``group_size`` items (default: the largest divisor of M up to ``min(64, M // 16)``, far below M):
one gather of M rows then serves g items and becomes a small dense matrix product, cutting memory
traffic g-fold.

Naive sharing changes the graph's statistics: if a popular item lands in a group's pool, all g
members see it at once, so the spread of in-degrees grows by a factor ~(1 + (g - 1) K / M) in its
sampling part (+23% in-degree standard deviation on MNIST at g=32, M=1000, K=100). We therefore
build the pools from a *balanced design* that restores the first two moments of the independent
scheme:

* items are put in random order and cut into groups (blocks) of g; in round r = 1..M/g, group a
  receives block a + t_r (mod number of groups), with distinct random offsets t_r != 0. Every item
  thus enters exactly one pool per round, no pool repeats an item and no pool holds its own
  members;
* under independent per-item draws, the number of items that have item j among their candidates is
  ~Poisson(M): mean M, variance M. With sharing it is g times the number of pools containing j, so
  that number needs variance M/g^2, while the cyclic deal gives 0. Each dealt slot is therefore
  replaced by a uniform draw with probability p, p(2 - p) = 1/g (about 1/(2g)), which adds exactly
  that variance: the design matches the mean and the variance of the independent scheme, and with
  them the mean and the spread of in-degrees;
* uniform draws that repeat an item of the pool or hit a group member are re-drawn, so every item
  gets exactly M distinct candidates other than itself, uniform marginally by symmetry.

With ``group_size=1`` this reduces to the independent scheme. The test-suite checks in-degree
spread and mean neighbour similarity against a literal per-item implementation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import _rng
from .._rng import mix64, next_u64, rand_below
from .._validation import check_int

__all__ = ["candidate_pools", "check_graph_sizes", "check_group_size", "default_group_size",
           "pool_design", "pool_members"]


def default_group_size(candidates: int, num_items: int) -> int:
    """Items sharing one candidate pool: the largest divisor of M up to ``min(64, M // 16)``.

    A divisor of M avoids a partial last round of the pool design.

    Example:
        >>> from hardbatch.neighbors.knn_graph import default_group_size
        >>> default_group_size(1000, 60000), default_group_size(500, 60000)
        (50, 25)
    """
    cap = int(max(1, min(64, candidates // 16, num_items - candidates)))
    return max(g for g in range(1, cap + 1) if candidates % g == 0 or g == 1)


def check_group_size(group_size, candidates: int, num_items: int) -> int | None:
    """``group_size`` of :func:`proximity_graph` checked (None: the default, chosen later).

    Example:
        >>> from hardbatch.neighbors.knn_graph import check_group_size
        >>> check_group_size(None, 20, 40), check_group_size(4, 20, 40)
        (None, 4)
    """
    if group_size is None:
        return None
    return check_int(group_size, "group_size", low=1, high=max(1, num_items - candidates))


@njit(inline="always", cache=True)
def _taken(c, members, row) -> bool:
    """Whether item ``c`` is one of ``members`` or already in the pool ``row`` (one pass)."""
    hit = False
    for t in range(members.shape[0]):
        hit |= members[t] == c
    for t in range(row.shape[0]):
        hit |= row[t] == c
    return hit


@njit(cache=True, nogil=True)
def _balanced_pools(order, m, g, p_uniform, seed, pools, offsets_out):
    """Fill ``pools`` [G, m]: group a = block a of ``order``; pool a = blocks a + t_r (mod G).

    The offsets t_1..t_R are distinct and nonzero, so every item enters
    exactly one pool per round and no pool repeats an item or holds a member
    of its own group. Each slot is then replaced by a uniform draw with
    probability ``p_uniform``; draws that repeat an item of the pool or hit a
    group member are re-drawn. ``offsets_out`` [R] receives t_r; returns the flat
    positions ``a*m + slot`` of the slots filled by a uniform draw.

    One stream of draws, in this order: the offsets, one draw per dealt slot (group,
    round, slot), then the re-draws. The stream is counter-based (draw i is a function
    of i), so the dealt slots' draws are computed where they are needed.
    """
    n = order.shape[0]
    n_groups = pools.shape[0]
    state = np.empty(1, np.uint64)
    state[0] = seed
    n_rounds = (m + g - 1) // g
    offsets = np.arange(1, n_groups)
    for i in range(n_rounds):  # partial Fisher-Yates: R distinct offsets
        j = i + rand_below(state, n_groups - 1 - i)
        tmp = offsets[i]
        offsets[i] = offsets[j]
        offsets[j] = tmp
    offsets_out[:] = offsets[:n_rounds]
    s0, step = state[0], np.zeros(1, np.uint64)
    next_u64(step)
    step = step[0]  # draw i (1-based) of the stream: mix64(s0 + i * step)
    draws = np.uint64(0)
    below = np.uint64(np.ceil(p_uniform * 9007199254740992.0))  # as rand_unit(...) < p
    short = np.zeros(n_groups, np.int64)  # slots of each pool left to a uniform draw
    for a in range(n_groups):
        for r in range(n_rounds):
            src = a + offsets[r]  # the partner group (a + t_r) mod G
            src = (src - n_groups if src >= n_groups else src) * g
            base = r * g
            width = min(g, m - base)
            valid = max(0, min(width, n - src))  # the padded last group deals fewer
            if p_uniform > 0.0:
                first = s0 + draws * step
                lost = 0
                for j in range(valid):  # independent draws: a vectorised loop
                    dealt = (mix64(first + np.uint64(j + 1) * step) >> np.uint64(11)) >= below
                    pools[a, base + j] = order[src + j] if dealt else -1
                    lost += not dealt
                short[a] += lost
                draws += np.uint64(valid)
            else:
                pools[a, base:base + valid] = order[src:src + valid]
            pools[a, base + valid:base + width] = -1
            short[a] += width - valid
    state[0] = s0 + draws * step
    redrawn = np.empty(short.sum(), np.int64)
    n_redrawn = 0
    stamp = np.full(n, -1, np.int64)
    for a in range(n_groups):
        if short[a] == 0:
            continue
        members, row = order[a * g:min(n, a * g + g)], pools[a]
        stamped = short[a] > 32  # many draws: mark the group's items; few: scan them per draw
        if stamped:
            for j in range(members.shape[0]):
                stamp[members[j]] = a
            for j in range(m):
                if row[j] >= 0:
                    stamp[row[j]] = a
        for j in range(m):
            if row[j] >= 0:
                continue
            redrawn[n_redrawn] = a * m + j
            n_redrawn += 1
            v = -1
            for _ in range(64):
                c = rand_below(state, n)
                if not (stamp[c] == a if stamped else _taken(c, members, row)):
                    v = c
                    break
            if v < 0:
                off = rand_below(state, n)
                for i in range(n):
                    c = (off + i) % n
                    if not (stamp[c] == a if stamped else _taken(c, members, row)):
                        v = c
                        break
            row[j] = v
            stamp[v] = a
    return redrawn


def _uniform_share(n: int, m: int, g: int) -> float:
    """Probability that a dealt slot becomes a uniform draw (module docstring).

    Per round, the number of pools holding item j changes by -Bernoulli(p)
    (its dealt slot replaced) and +~Poisson(p) (uniform hits): variance
    p(2 - p). The target is the independent scheme's M(1 - M/N)/g^2 over
    M/g rounds, less the variance a partial last round (M % g slots) adds.
    """
    width = (m % g) / g
    target = m * (1.0 - m / n) / (g * g) - width * (1.0 - width)
    ratio = min(1.0, max(0.0, target / (m / g)))
    return float(1.0 - np.sqrt(1.0 - ratio))


def pool_members(num_items: int, candidates: int, group_size: int, seed: int = 0) -> np.ndarray:
    """The groups of :func:`pool_design`: the items in a seeded random order, cut into groups
    of ``group_size`` (int64 [G, g]; -1 pads the last group; g = 1 when there are too few
    groups for M/g distinct offsets). Cheap next to the pools drawn from them.

    Example:
        >>> from hardbatch.neighbors.knn_graph import pool_members
        >>> pool_members(40, 20, 4, seed=0).shape, pool_members(40, 35, 20, seed=0).shape
        ((10, 4), (40, 1))
    """
    n, g = num_items, group_size
    n_groups = -(-n // g)
    if -(-candidates // g) > n_groups - 1:
        g = 1  # too few groups for distinct offsets: independent pools
        n_groups = n
    members = np.full(n_groups * g, -1, np.int64)
    members[:n] = _rng.permutation(n, _rng.derive_seed(seed, 0x6709))
    return members.reshape(n_groups, g)


def pool_design(num_items: int, candidates: int, group_size: int, seed: int = 0, *,
                members: np.ndarray | None = None) -> dict:
    """:func:`candidate_pools` with the design behind them (the block layout of the build).

    ``members``: the groups of :func:`pool_members` for the same arguments, if already made.
    Returns a dict: ``members`` [G, g] and ``pools`` [G, M] as :func:`candidate_pools`;
    ``offsets`` int64 [R], the group offsets t_r of the rounds (slot ``r*g + j`` of pool a
    was dealt item ``members[(a + t_r) % G, j]``); ``redrawn`` int64, the flat positions
    ``a*M + slot`` of the slots filled by a uniform draw instead, in increasing order.

    Example:
        >>> from hardbatch.neighbors.knn_graph import pool_design
        >>> d = pool_design(40, 20, 4, seed=0)
        >>> a, t = 3, d["offsets"][0]  # round 0 of group 3: the members of group 3 + t
        >>> dealt = d["members"][(a + t) % 10]
        >>> kept = [s for s in range(4) if a * 20 + s not in set(d["redrawn"].tolist())]
        >>> bool((d["pools"][a, kept] == dealt[kept]).all())
        True
    """
    n = num_items
    if members is None:
        members = pool_members(n, candidates, group_size, seed)
    n_groups, g = members.shape
    order = members.reshape(-1)[:n]  # the padding is at the end
    pools = np.empty((n_groups, candidates), np.int32 if n < 2**31 else np.int64)
    offsets = np.empty(-(-candidates // g), np.int64)
    redrawn = _balanced_pools(order, candidates, g, _uniform_share(n, candidates, g),
                              np.uint64(_rng.derive_seed(seed, 0x9001)), pools, offsets)
    return {"members": members, "pools": pools, "offsets": offsets, "redrawn": redrawn}


def candidate_pools(num_items: int, candidates: int, group_size: int,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pools of the proximity graph (balanced design, see the module docstring).

    Returns:
        members: int64 [G, g], the items of each group (-1 pads the last group);
        pools: int32 (int64 if N >= 2**31) [G, M], the group's M distinct
        candidates, none of them a member of the group.

    Example:
        >>> from hardbatch.neighbors.knn_graph import candidate_pools
        >>> members, pools = candidate_pools(40, 20, 4, seed=0)
        >>> members.shape, pools.shape, bool((pools[0][:, None] != members[0]).all())
        ((10, 4), (10, 20), True)
    """
    design = pool_design(num_items, candidates, group_size, seed)
    return design["members"], design["pools"]


def check_graph_sizes(candidates: int, neighbors: int, num_items: int, *,
                      flags: bool = False) -> None:
    """The proximity graph's size rule K < M < N, as one ``ValueError`` naming the fix.

    ``flags=True`` names the command-line options (``--candidates``) instead of the
    keyword arguments. Every sampler, command and recipe checks the rule here.

    Example:
        >>> from hardbatch.neighbors.knn_graph import check_graph_sizes
        >>> try:
        ...     check_graph_sizes(20, 30, 40)
        ... except ValueError as err:
        ...     print(str(err).split("; ")[0])
        neighbors=30 must be smaller than candidates=20
    """
    m, k, n = candidates, neighbors, num_items
    if k >= m:
        if flags:
            raise ValueError(f"--neighbors {k} must be smaller than --candidates {m}; use "
                             f"e.g. --neighbors {max(1, m // 5)} or raise --candidates")
        raise ValueError(f"neighbors={k} must be smaller than candidates={m}; raise candidates "
                         "or lower neighbors")
    if m >= n:
        fewer = min(n - 1, max(k + 1, n // 2))  # candidates between neighbors and N
        if flags:
            fix = (f"use e.g. --candidates {fewer}" if k + 1 < n else
                   f"lower --neighbors below N - 1 = {n - 1} and --candidates between them")
            raise ValueError(f"--candidates {m} must be smaller than the number of items N={n}; "
                             f"{fix} (the paper uses 500 for small data sets, 1000 for large "
                             "ones)")
        fix = (f"lower candidates (e.g. {fewer})" if k + 1 < n else
               f"lower neighbors below N - 1 = {n - 1} and candidates between neighbors and N "
               "(or use a kNN graph)")
        raise ValueError(f"candidates={m} must be smaller than the number of items N={n}; {fix}")
