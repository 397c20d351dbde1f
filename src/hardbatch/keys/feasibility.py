"""Whether a request can be met: the checks a sampler runs at construction, with clear errors.

Each error names the key held by the most items (and some of its items) and the fix: a
smaller ``batch_size``, keys that tell more items apart, merged copies, or
``duplicate_keys=None``.

* :func:`check_walk_keys`: walks and kNN batches (grown one item at a time, skipping items
  whose key is in the batch) need B items that pairwise share no key: single keys, at least B
  distinct keys; key sets, :func:`closed_neighbourhood_bound` (when B - 1 items can never block
  every other item) or else :func:`greedy_independent` (B such items, found greedily);
* :func:`check_partition_keys`: partitions (an epoch's order cut into batches of
  :func:`~hardbatch.keys.repair.partition_capacities`) can keep single keys apart exactly when
  the Gale-Ryser condition holds; for key sets, no key may be held by more items than there
  are batches, and :func:`~hardbatch.keys.repair.trial_partition` (the repair of one fixed
  order) must succeed: it is what an epoch falls back to, so every epoch then succeeds.
"""

from __future__ import annotations

import heapq

import numpy as np

from .encode import KEYS_OFF, DuplicateKeys
from .repair import partition_capacities, trial_partition, unseparable
from .._validation import check_int

__all__ = ["check_partition_keys", "check_walk_keys", "closed_neighbourhood_bound",
           "greedy_independent"]


def check_walk_keys(keys: DuplicateKeys, batch_size: int) -> None:
    """``ValueError`` unless walks and kNN batches of ``batch_size`` items pairwise sharing no
    key can be grown (single keys: at least ``batch_size`` distinct keys, then every batch can).

    Key sets: proven for every batch when the ``batch_size - 1`` largest closed neighbourhoods
    leave an item free (:func:`closed_neighbourhood_bound`); else this checks that one such
    batch exists, and a batch whose anchor meets too many items may still have to take an
    item that shares a key (the samplers warn when one does).

    Example:
        >>> from hardbatch.keys import check_walk_keys, encode_keys
        >>> check_walk_keys(encode_keys(["a", "a", "b"], 3), 2)  # 2 distinct keys: fine
    """
    if keys.sets:  # key sets: a batch of B items pairwise free of conflicts must exist
        n = len(keys.ptr) - 1
        if not keys.any or closed_neighbourhood_bound(keys.ptr, keys.idx, keys.counts,
                                                      batch_size) < n:
            return  # B - 1 items can never block all the others: a free item always exists
        found = len(greedy_independent(keys.ptr, keys.idx, keys.counts, n))
        if found >= batch_size:
            return
        raise ValueError(
            f"duplicate_keys: only {found} items that pairwise share no key were found for "
            f"batches of {batch_size} items ({keys.worst()}); use batch_size <= {found}, "
            f"keys that tell more items apart{KEYS_OFF}")
    if keys.classes < batch_size:
        raise ValueError(
            f"duplicate_keys leave only {keys.classes} distinct keys for batches of "
            f"{batch_size} items with no key twice ({keys.worst()}); use batch_size <= "
            f"{keys.classes}, keys that tell more items apart{KEYS_OFF}")


def _after_drop(counts: np.ndarray, drop: int) -> np.ndarray:
    """Group sizes after dropping ``drop`` items, one at a time from the largest group."""
    heap = [-int(c) for c in counts]
    heapq.heapify(heap)
    for _ in range(drop):
        heapq.heapreplace(heap, heap[0] + 1)
    return -np.array(heap, np.int64)


def check_partition_keys(keys: DuplicateKeys, num_items: int, batch_size: int,
                         drop_last: bool, batches: int | None = None) -> None:
    """``ValueError`` unless the epoch's partition can keep every key out of shared batches.

    Feasible iff (Gale-Ryser) for every t, the t largest batches hold at most
    ``sum_k min(c_k, t)`` items (c_k: items of key k, unique items counting 1); with
    ``drop_last`` the N mod B dropped items are taken from the largest groups first.
    ``batches`` (with ``drop_last``): the full batches the plan serves, when fewer than
    floor(N / B) (a sampler split over W ranks serves whole steps of W batches); the other
    items count as dropped. Key sets have no exact condition: the check is that
    :func:`~hardbatch.keys.repair.trial_partition` succeeds, and since an epoch whose order
    the repairs cannot fix falls back to those batches, a sampler that passes this check
    never raises in a later epoch.

    Example:
        >>> from hardbatch.keys import check_partition_keys, encode_keys
        >>> try:
        ...     check_partition_keys(encode_keys(["a"] * 4 + list("bcdefg"), 10), 10, 4, False)
        ... except ValueError as err:
        ...     print(str(err).split("; ")[1])
        use batch_size <= 2, or merge / drop the copies
    """
    caps = partition_capacities(num_items, batch_size, drop_last)
    if drop_last and batches is not None:
        caps = caps[:check_int(batches, "batches", low=0, high=len(caps))]
    nb = len(caps)
    counts = np.concatenate([keys.counts, np.ones(int((keys.ids < 0).sum()), np.int64)])
    if drop_last and not keys.sets:
        counts = _after_drop(counts, num_items - int(caps.sum()))
    if keys.any and counts.max() > nb:
        k = int(np.argmax(keys.counts))  # the largest group stays the largest after drops
        c = int(keys.counts[k])
        raise ValueError(
            f"duplicate_keys: key {keys.name(k)} is held by {c} items but an epoch has only "
            f"{nb} batches of batch_size={batch_size}, so two of them (of items "
            f"{keys.rows(k)}) must share a batch; use batch_size <= {num_items // c}, or "
            "merge / drop the copies")
    if keys.sets:  # no exact condition for conflicts: the trial repair of a fixed order,
        # the partition an epoch falls back to when its own order defeats the repairs
        if keys.any and trial_partition(num_items, int(caps.sum()), batch_size, keys) is None:
            raise unseparable(batch_size, keys)
        return
    # reach[t - 1] = sum_k min(c_k, t) = sum_{j <= t} #{k : c_k >= j}
    at_least = np.bincount(counts, minlength=nb + 1)[::-1].cumsum()[::-1]
    reach = np.cumsum(at_least[1:nb + 1])
    need = np.cumsum(np.sort(caps)[::-1])
    bad = np.flatnonzero(need > reach)
    if bad.size:
        t = int(bad[0]) + 1
        raise ValueError(
            f"duplicate_keys: {t} batches of batch_size={batch_size} need {int(need[t - 1])} "
            f"items but the keys allow only {int(reach[t - 1])} (too many copies of too few "
            "keys); use a smaller batch_size or merge / drop the copies")


def _conflicts(ptr: np.ndarray, idx: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per item, the other items holding one of its keys, with repeats: ``sum_k (c_k - 1)``."""
    n = len(ptr) - 1
    weight = np.zeros(n, np.int64)
    np.add.at(weight, np.repeat(np.arange(n), np.diff(ptr)), counts[idx] - 1)
    return weight


def closed_neighbourhood_bound(ptr: np.ndarray, idx: np.ndarray, counts: np.ndarray,
                               batch_size: int) -> int:
    """An upper bound on the items that B - 1 batch items can block: the sum of the B - 1
    largest ``1 + sum_k (c_k - 1)`` over an item's keys k. Below N, a walk or kNN batch that
    skips conflicting items always finds a free one.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import closed_neighbourhood_bound
        >>> ptr, idx = np.array([0, 1, 2, 2, 2]), np.array([0, 0])  # items 0, 1 share key 0
        >>> closed_neighbourhood_bound(ptr, idx, np.array([2]), 3)
        4
    """
    n = len(ptr) - 1
    weight = 1 + _conflicts(ptr, idx, counts)
    top = np.partition(weight, n - (batch_size - 1))[n - (batch_size - 1):] \
        if 0 < batch_size - 1 <= n else weight
    return int(top.sum()) if batch_size > 1 else 0


def greedy_independent(ptr: np.ndarray, idx: np.ndarray, counts: np.ndarray,
                       limit: int) -> np.ndarray:
    """Up to ``limit`` pairwise conflict-free items, found greedily (fewest conflicts first).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import greedy_independent
        >>> ptr, idx = np.array([0, 1, 2, 3]), np.array([0, 0, 0])  # all three share key 0
        >>> len(greedy_independent(ptr, idx, np.array([3]), 5))
        1
    """
    weight = _conflicts(ptr, idx, counts)
    taken = np.zeros(len(counts), bool)
    out = []
    for i in np.argsort(weight, kind="stable").tolist():
        keys = idx[ptr[i]:ptr[i + 1]]
        if not taken[keys].any():
            taken[keys] = True
            out.append(i)
            if len(out) == limit:
                break
    return np.array(out, np.int64)
