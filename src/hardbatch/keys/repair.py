"""Making a partition key-free: no key twice in any batch of an epoch's order.

Partitions (uniform, GCBS, cluster, community batches) cut an order of the items into batches
of B (:func:`partition_capacities`); :func:`separate_keys` repairs the order so that no two items
of a batch share a key:

* swaps (the numba kernel ``_swap_repair``): a clashing item swaps places with an item of the
  nearest batch (in the order) that lacks its key and whose key the clashing batch lacks;
* when the swaps get stuck: Ryser's construction for single keys (``_construct``: each key's
  items into the batches with the most room left; it succeeds whenever the Gale-Ryser check of
  :func:`~hardbatch.keys.feasibility.check_partition_keys` passes), :func:`greedy_partition`
  for key sets (items with the most keys first, each into the roomiest batch free of them);
* key sets, when the greedy fails too (it succeeds or fails with the order): the batches of
  :func:`trial_partition`, the repair of one fixed order that the construction check proved,
  rearranged by the epoch's order. So every epoch of a sampler that passed its construction
  check succeeds (with ``drop_last``, the greedy over the epoch's kept items in a fixed order
  is tried first, to keep the epoch's choice of dropped items).

Whether a request can be met at all is :mod:`hardbatch.keys.feasibility`'s question.
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

from .. import _rng
from .encode import KEYS_OFF, DuplicateKeys

__all__ = ["greedy_partition", "partition_capacities", "separate_keys", "trial_partition"]


def partition_capacities(num_items: int, batch_size: int, drop_last: bool) -> np.ndarray:
    """Sizes of an epoch's partition batches: B each, the last N mod B unless dropped.

    Example:
        >>> from hardbatch.keys import partition_capacities
        >>> partition_capacities(40, 16, False).tolist(), partition_capacities(40, 16, True)
        ([16, 16, 8], array([16, 16]))
    """
    full, rest = divmod(num_items, batch_size)
    caps = [batch_size] * full + ([rest] if rest and not drop_last else [])
    return np.array(caps, np.int64)


@njit(cache=True, inline="always")
def _has_key(k, batch, members, member_ptr, pos_of, kept, batch_size):
    for m in range(member_ptr[k], member_ptr[k + 1]):
        p = pos_of[members[m]]
        if p < kept and p // batch_size == batch:
            return True
    return False


@njit(cache=True, inline="always")
def _meets(i, batch, key_ptr, key_idx, members, member_ptr, pos_of, kept, batch_size):
    """Whether an item of ``batch`` holds one of item i's keys."""
    for e in range(key_ptr[i], key_ptr[i + 1]):
        if _has_key(key_idx[e], batch, members, member_ptr, pos_of, kept, batch_size):
            return True
    return False


@njit(cache=True)
def _swap_repair(order, kept, batch_size, key_ptr, key_idx, has_key, members, member_ptr,
                 resume):
    """Swap clashing items into the nearest batch without their keys; False if stuck.

    ``resume`` (key sets): while the clashes of one batch b are repaired, the scan of another
    batch resumes after its last swap from b (the items moved there clash with b), so a
    batch's repair is linear, not quadratic, in its clashes."""
    nb = (kept + batch_size - 1) // batch_size
    front = np.zeros((2, nb), np.int64)  # per side: where the scan of a batch resumes
    owner = np.full((2, nb), -1, np.int64)  # the batch b whose repair set ``front``
    pos_of = np.empty(has_key.shape[0], np.int64)  # read for items with a key only
    keyed = np.empty(members.shape[0], np.int64)  # positions of items with a key, in order
    count = 0
    for p in range(order.shape[0]):
        if has_key[order[p]]:
            pos_of[order[p]] = p
            if p < kept:
                keyed[count] = p
                count += 1
    for t in range(count):
        p = keyed[t]
        i = order[p]  # a swap may have put an item without a key here
        b = p // batch_size
        clash = False
        for e in range(key_ptr[i], key_ptr[i + 1]):
            k = key_idx[e]
            for m in range(member_ptr[k], member_ptr[k + 1]):
                q = pos_of[members[m]]
                if q < p and q // batch_size == b:
                    clash = True
                    break
            if clash:
                break
        if not clash:
            continue
        done = False
        for dist in range(1, nb):
            for side in range(2):
                b2 = b + dist if side == 0 else b - dist
                if b2 < 0 or b2 >= nb:
                    continue
                if _meets(i, b2, key_ptr, key_idx, members, member_ptr, pos_of, kept, batch_size):
                    continue
                lo, hi = b2 * batch_size, min(kept, (b2 + 1) * batch_size)
                first = front[side, b2] if resume and owner[side, b2] == b else 0
                for step in range(first, hi - lo):  # from the end nearest batch b
                    q = lo + step if b2 > b else hi - 1 - step
                    j = order[q]
                    if _meets(j, b, key_ptr, key_idx, members, member_ptr, pos_of, kept,
                              batch_size):
                        continue
                    front[side, b2], owner[side, b2] = step + 1, b
                    order[p], order[q] = j, i
                    pos_of[i] = q
                    if has_key[j]:
                        pos_of[j] = p
                    done = True
                    break
                if done:
                    break
            if done:
                break
        if not done:
            return False
    return True


def _construct(order: np.ndarray, kept: int, batch_size: int, keys: DuplicateKeys) -> np.ndarray:
    """Ryser's construction: each key's items into the batches with the most room left.

    Succeeds whenever :func:`~hardbatch.keys.feasibility.check_partition_keys` passes; items
    keep their relative order within a batch; with ``kept < N`` the dropped items come from the
    largest groups first.
    """
    caps = partition_capacities(kept, batch_size, False)
    groups: dict[int, list[int]] = {}
    for pos, item in enumerate(order.tolist()):
        k = int(keys.ids[item])
        groups.setdefault(k if k >= 0 else -1 - item, []).append(pos)
    sizes = {g: len(p) for g, p in groups.items()}
    heap = [(-s, g) for g, s in sizes.items()]
    heapq.heapify(heap)
    for _ in range(len(order) - kept):  # drop from the largest groups (the latest positions)
        s, g = heapq.heappop(heap)
        groups[g].pop()
        heapq.heappush(heap, (s + 1, g))
    room = caps.copy()
    slot = np.full(len(order), -1, np.int64)  # batch of each position
    for g in sorted(groups, key=lambda g: (-len(groups[g]), groups[g][0] if groups[g] else 0)):
        positions = groups[g]
        if len(positions) < 2:
            break  # single items fill the room left, in order
        targets = np.argsort(-room, kind="stable")[:len(positions)]
        if len(targets) < len(positions) or room[targets[-1]] <= 0:
            raise ValueError("duplicate_keys could not be separated into batches of "
                             f"batch_size={batch_size}; use a smaller batch_size")
        slot[positions] = np.sort(targets)
        room[targets] -= 1
    singles = sorted(p[0] for p in groups.values() if len(p) == 1)
    slot[singles] = np.repeat(np.arange(len(room)), room)
    placed = np.flatnonzero(slot >= 0)
    ranked = placed[np.lexsort((placed, slot[placed]))]  # by batch, then original position
    rest = np.setdiff1d(np.arange(len(order)), placed, assume_unique=True)
    return np.concatenate([order[ranked], order[rest]])


def separate_keys(order: np.ndarray, kept: int, batch_size: int,
                  keys: DuplicateKeys | None) -> np.ndarray:
    """``order`` (a permutation of the N items) with no key twice in any of its batches.

    Batches are ``order[:kept]`` cut every ``batch_size``; ``order[kept:]`` are dropped
    items. Deterministic: a clashing item (the later one in the order) swaps places with
    the nearest item of the nearest batch, forward first, that lacks its key and whose key
    the clashing batch lacks; if no such swap exists, :func:`_construct` rebuilds the batches
    (single keys) or :func:`greedy_partition` does (key sets). Unchanged (the same array) when
    no key is shared.

    Key sets: the greedy succeeds or fails depending on ``order``. When it fails, the epoch
    takes the batches of :func:`trial_partition` (the repair of a fixed order, which
    :func:`~hardbatch.keys.feasibility.check_partition_keys` runs at a sampler's
    construction), full batches ranked by their first item in ``order``, items by their
    place in it; with ``kept < N`` the greedy over the kept items sorted by id is tried
    before. So for the ``(N, kept, batch_size)`` that the construction check passed, no
    order raises; an order the swaps or the greedy repair is served as before.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import encode_keys, separate_keys
        >>> keys = encode_keys(["a", "a", "b", "c"], 4)
        >>> separate_keys(np.arange(4), 4, 2, keys).reshape(2, 2).tolist()  # items 0, 1 apart
        [[0, 2], [1, 3]]
    """
    if keys is None or not keys.any:
        return order
    out = _repaired(order, kept, batch_size, keys)
    if out is None:  # key sets: the greedy failed on this order
        out = _fallback(np.asarray(order, np.int64), kept, batch_size, keys)
    if out is None:
        raise unseparable(batch_size, keys)
    return out


def unseparable(batch_size: int, keys: DuplicateKeys) -> ValueError:
    """The error of key sets that no repair could put into batches of ``batch_size``."""
    return ValueError(
        f"duplicate_keys: the items could not be put into batches of batch_size="
        f"{batch_size} with no two of them sharing a key ({keys.worst()}); use a smaller "
        f"batch_size, keys that tell more items apart{KEYS_OFF}")


def _repaired(order: np.ndarray, kept: int, batch_size: int,
              keys: DuplicateKeys) -> np.ndarray | None:
    """The swaps, then the construction (single keys) or the greedy (key sets: None if it
    fails)."""
    out = np.array(order, np.int64)
    if _swap_repair(out, kept, batch_size, keys.ptr, keys.idx, keys.has_key, keys.members,
                    keys.member_ptr, keys.sets):
        return out
    if not keys.sets:
        return _construct(np.asarray(order, np.int64), kept, batch_size, keys)
    return greedy_partition(order, kept, batch_size, keys.ptr, keys.idx)


def trial_partition(num_items: int, kept: int, batch_size: int,
                    keys: DuplicateKeys) -> np.ndarray | None:
    """The repair (swaps, then :func:`greedy_partition`) of one fixed random order of the
    ``num_items`` items, or None when it fails: the construction check of key sets, and the
    batches an epoch falls back to when its own order cannot be repaired.

    Example:
        >>> from hardbatch.keys import encode_keys, trial_partition
        >>> keys = encode_keys([{"a", "b"}, {"b"}, {"a"}], 3)  # 0 meets 1 and 2
        >>> sorted(trial_partition(3, 3, 2, keys)[:2].tolist())  # batches {1, 2} and {0}
        [1, 2]
    """
    order = _rng.permutation(num_items, _rng.derive_seed(0, 0, 0xC0F))
    if not keys.any:
        return order
    done = keys.__dict__.setdefault("_trial_partitions", {})  # computed once per shape: the
    if (num_items, kept, batch_size) not in done:  # construction check, then every fallback
        done[num_items, kept, batch_size] = _repaired(order, kept, batch_size, keys)
    out = done[num_items, kept, batch_size]
    return None if out is None else out.copy()


def _fallback(order: np.ndarray, kept: int, batch_size: int,
              keys: DuplicateKeys) -> np.ndarray | None:
    """Key sets whose greedy failed on ``order``: with ``kept < N`` the greedy over the kept
    items sorted by id (so by (-degree, id)), else :func:`trial_partition`; either's batches
    rearranged by ``order``."""
    if kept < len(order):
        head = np.concatenate([np.sort(order[:kept]), order[kept:]])
        out = greedy_partition(head, kept, batch_size, keys.ptr, keys.idx)
        if out is not None:
            return _arranged(out, order, kept, batch_size)
    out = trial_partition(len(order), kept, batch_size, keys)
    return None if out is None else _arranged(out, order, kept, batch_size)


def _arranged(parts: np.ndarray, order: np.ndarray, kept: int, batch_size: int) -> np.ndarray:
    """The batches of ``parts`` (``parts[:kept]`` cut every ``batch_size``) in ``order``'s
    order: full batches by their first item's place in ``order`` (a short one stays last),
    items by place; then the dropped items ``parts[kept:]``, by place."""
    place = np.empty(len(order), np.int64)
    place[order] = np.arange(len(order))
    caps = partition_capacities(kept, batch_size, False)
    batch = np.repeat(np.arange(len(caps)), caps)
    first = np.full(len(caps), len(order), np.int64)
    np.minimum.at(first, batch, place[parts[:kept]])
    first[caps < batch_size] = len(order)  # the short last batch stays last
    rank = np.empty(len(caps), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(caps))
    head = parts[:kept][np.lexsort((place[parts[:kept]], rank[batch]))]
    tail = parts[kept:][np.argsort(place[parts[kept:]], kind="stable")]
    return np.concatenate([head, tail])


def greedy_partition(order: np.ndarray, kept: int, batch_size: int, ptr: np.ndarray,
                     idx: np.ndarray) -> np.ndarray | None:
    """``order`` rearranged so that its batches (``order[:kept]`` cut every ``batch_size``)
    hold no conflict, or None when this greedy fails: items with the most conflicting keys
    first, each into the batch with the most room among those free of its keys; items
    without keys fill the room left, in order. ``order[kept:]`` (dropped) stays as it is.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import greedy_partition
        >>> ptr, idx = np.array([0, 1, 2, 2, 2]), np.array([0, 0])  # items 0, 1 conflict
        >>> greedy_partition(np.arange(4), 4, 2, ptr, idx).reshape(2, 2).tolist()
        [[0, 2], [1, 3]]
    """
    order = np.asarray(order, np.int64)
    head = order[:kept]
    nb = -(-kept // batch_size)
    room = partition_capacities(kept, batch_size, False).tolist()
    holds: list[set] = [set() for _ in range(nb)]
    degree = ptr[head + 1] - ptr[head]
    slot = np.full(kept, -1, np.int64)
    heap = [(-r, b) for b, r in enumerate(room)]
    heapq.heapify(heap)
    for pos in np.argsort(-degree, kind="stable").tolist():
        if degree[pos] == 0:
            break
        keys = set(idx[ptr[head[pos]]:ptr[head[pos] + 1]].tolist())
        skipped = []
        while heap and (room[heap[0][1]] == 0 or holds[heap[0][1]] & keys):
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        _, b = heapq.heappop(heap)
        slot[pos], room[b] = b, room[b] - 1
        holds[b] |= keys
        for entry in skipped + [(-room[b], b)]:
            if room[entry[1]] > 0:
                heapq.heappush(heap, (-room[entry[1]], entry[1]))
    rest = np.flatnonzero(slot < 0)
    slot[rest] = np.repeat(np.arange(nb), room)
    ranked = np.lexsort((np.arange(kept), slot))
    return np.concatenate([head[ranked], order[kept:]])
