"""Duplicate keys: items with equal keys (copies of one text, one passage) never share a batch.

A sampler's ``duplicate_keys=`` is a length-N sequence of hashable keys (equal keys never
share a batch), or of key SETS (``set`` / ``frozenset`` per item, an int array ``[N, C]`` of C
key values per item, or a prebuilt :class:`DuplicateKeys`): then two items conflict when their
sets meet (:mod:`hardbatch.keys.conflicts`: no text of a row twice in a batch).
:func:`encode_keys` turns it once into the CSR of each item's shared key ids (keys no other
item holds are dropped). Samplers enforce "no key twice in a batch" where they build batches:

* walks and kNN batches (:mod:`hardbatch.batching.walks`) skip an item whose key is already in the
  batch (the walk moves on; the kNN batch takes the next neighbour); possible whenever the
  items hold at least B distinct keys (:func:`check_walk_keys`);
* partitions (uniform, GCBS) are repaired by :func:`separate_keys`: a clashing item swaps
  places with an item of the nearest batch (in the order) that lacks its key. Possible
  exactly when the Gale-Ryser condition of :func:`check_partition_keys` holds (then a
  swap-free construction is the fallback of the rare repair that gets stuck). Key sets:
  the count of every key must not exceed the batches, a trial repair runs at construction,
  and :func:`~hardbatch.keys.conflicts.greedy_partition` is the fallback.

:func:`shared_value_keys` derives keys from rows of several values (the texts of a row) so
that two rows sharing any value get the same key, as sentence-transformers'
``NoDuplicatesBatchSampler`` keeps any value from appearing twice in a batch;
:func:`near_duplicate_keys` derives keys from embeddings (groups of near-duplicates).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch
from numba import njit
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from .. import _rng
from .._logging import get_logger
from .._validation import as_embeddings, check_choice, check_real
from ..batching.gcbs import thresholded_pairs
from .conflicts import closed_neighbourhood_bound, free_of, greedy_independent, \
    greedy_partition, item_keys, key_sets, set_keys, shared_value_keys  # noqa: F401

__all__ = ["DuplicateKeys", "check_partition_keys", "check_walk_keys", "encode_keys",
           "near_duplicate_keys", "separate_keys", "shared_value_keys"]


class DuplicateKeys:
    """Encoded duplicate keys of N items: per item, the ids of its keys held by 2+ items.

    Attributes:
        ptr, idx: the CSR of the items' key ids (item i holds ``idx[ptr[i]:ptr[i + 1]]``).
        sets: whether items hold key sets (conflicts) rather than one key each.
        ids: int64 [N], one key per item: its key id (``-1``: no other item holds its key);
            with ``sets``, the first key id of each item.
        values: the original key of each id (for messages).
        counts: int64 [number of ids], items per key id (each >= 2).
        classes: single keys: distinct keys among the items (unique items count one each).

    Example:
        >>> from hardbatch.keys.duplicates import encode_keys
        >>> keys = encode_keys(["a", "b", "a", "c"], 4)
        >>> keys.ids.tolist(), keys.values, keys.classes, keys.any
        ([0, -1, 0, -1], ['a'], 3, True)
    """

    def __init__(self, ids: np.ndarray | None, values, ptr: np.ndarray | None = None,
                 idx: np.ndarray | None = None) -> None:
        self.sets = ids is None and bool(np.diff(ptr).max(initial=0) > 1)  # else: single keys
        if ids is not None:  # one key per item
            ptr = np.zeros(len(ids) + 1, np.int64)
            np.cumsum(ids >= 0, out=ptr[1:])
            idx = ids[ids >= 0]
        self.ptr, self.idx, self.values = ptr, np.ascontiguousarray(idx, np.int64), values
        lengths = np.diff(ptr)
        self.ids = ids if ids is not None else np.full(len(lengths), -1, np.int64)
        if ids is None and len(self.idx):  # the first key of each item
            self.ids[lengths > 0] = self.idx[ptr[:-1][lengths > 0]]
        self.counts = np.bincount(self.idx, minlength=len(values)).astype(np.int64)
        self.classes = len(lengths) - int((self.counts - 1).sum())
        owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        order = np.argsort(self.idx, kind="stable")
        self.members = np.ascontiguousarray(owner[order], np.int64)  # items grouped by key id
        self.has_key = (lengths > 0).astype(np.uint8)  # compact: scanned at every repair
        self.member_ptr = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    @property
    def any(self) -> bool:
        """Whether some key is held by two items or more."""
        return len(self.values) > 0

    def rows(self, key_id: int, most: int = 5) -> str:
        """The first ``most`` items holding ``key_id``, for messages."""
        items = self.members[self.member_ptr[key_id]:self.member_ptr[key_id + 1]]
        more = ", ..." if len(items) > most else ""
        return ", ".join(map(str, items[:most].tolist())) + more

    def compatible(self, candidates: np.ndarray, batch: np.ndarray) -> np.ndarray:
        """The ``candidates`` that share no key with the items of ``batch`` (order kept)."""
        return free_of(self.ptr, self.idx, candidates, item_keys(self.ptr, self.idx, batch))


_log = get_logger("keys")


def encode_keys(keys, num_items: int, name: str = "duplicate_keys") -> DuplicateKeys | None:
    """``keys`` (N hashable values) as :class:`DuplicateKeys`; None for ``keys=None``.

    ``keys``: N hashable keys; N sets / frozensets of hashable keys, or an int array
    ``[N, C]`` (C key values per item; items conflict when their sets meet); or a
    :class:`DuplicateKeys` of N items. ``ValueError`` naming ``name`` for a wrong length, a
    non-sequence or an unhashable key.

    Example:
        >>> from hardbatch.keys.duplicates import encode_keys
        >>> try:
        ...     encode_keys(["a", "b"], 3)
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        duplicate_keys has 2 keys but there are N=3 items
    """
    if keys is None:
        return None
    if isinstance(keys, DuplicateKeys):
        if len(keys.ptr) - 1 != num_items:
            raise ValueError(f"{name} encodes {len(keys.ptr) - 1} items but there are "
                             f"N={num_items} items; encode the keys of these items")
        return keys
    if isinstance(keys, (torch.Tensor, np.ndarray)) and keys.ndim == 2 and not (
            keys.is_floating_point() if isinstance(keys, torch.Tensor) else
            not np.issubdtype(keys.dtype, np.integer)):
        if keys.shape[0] != num_items:
            raise ValueError(f"{name} has {keys.shape[0]} rows of key values but there are "
                             f"N={num_items} items; pass one row per item, in dataset order")
        ptr, idx, kept = key_sets(np.asarray(keys.cpu() if isinstance(keys, torch.Tensor)
                                             else keys))
        return DuplicateKeys(None, kept.tolist(), ptr, idx)
    if isinstance(keys, (torch.Tensor, np.ndarray)):
        if keys.ndim != 1:
            raise ValueError(f"{name} must be a 1-D sequence of N={num_items} keys (or integer "
                             f"key values [N, C]: C keys per item), got shape "
                             f"{tuple(keys.shape)} and dtype {keys.dtype}")
        keys = keys.tolist()
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise ValueError(f"{name} must be a sequence of N={num_items} hashable keys (one per "
                         f"item, e.g. the texts), got {type(keys).__name__}")
    if len(keys) != num_items:
        raise ValueError(f"{name} has {len(keys)} keys but there are N={num_items} items; pass "
                         "one key per item, in dataset order")
    if num_items and isinstance(keys[0], (set, frozenset)):
        ptr, idx, names = set_keys(keys, name)
        return DuplicateKeys(None, names, ptr, idx)
    first: dict = {}
    raw = np.empty(num_items, np.int64)
    for i, key in enumerate(keys):
        try:
            raw[i] = first.setdefault(key, len(first))
        except TypeError:
            raise ValueError(f"{name}[{i}] = {key!r} is not hashable; use hashable keys such "
                             "as strings, numbers or tuples") from None
    counts = np.bincount(raw, minlength=len(first))
    shared = counts >= 2
    new_id = np.full(len(counts), -1, np.int64)
    new_id[shared] = np.arange(int(shared.sum()))
    values = [key for key, i in first.items() if shared[i]]
    return DuplicateKeys(new_id[raw], values)


def near_duplicate_keys(embeddings, threshold: float = 0.9, *,
                        method: str = "exact", nlist: int | None = None, nprobe: int = 8,
                        seed: int = 0, device=None) -> np.ndarray:
    """Keys that group near-duplicates: items joined by a chain of pairs with cosine above
    ``threshold`` get the same key (the connected components of the pair graph).

    Pass the result as ``duplicate_keys=`` to any sampler so that near-copies (paraphrases,
    re-crops, boilerplate with one word changed) never share a batch, best computed in a fixed,
    strong embedding. Grouping is transitive: a chain a~b~c joins a and c even when their own
    cosine is below the threshold, so a low threshold can join large groups (a sampler then
    raises its ``ValueError`` when no batch plan can keep them apart); the log reports the
    largest group. The threshold means what it means in
    :func:`hardbatch.metrics.batch_near_duplicate_rate` (default 0.9 there and here).

    Args:
        embeddings: ``[N, d]`` array or tensor (rows are L2-normalised here).
        threshold: cosine in ``[-1, 1)``; pairs with ``cos > threshold`` are near-duplicates.
        method, nlist, nprobe, seed, device: the pair search of
            :func:`hardbatch.batching.gcbs.thresholded_pairs` (``"exact"``: blocked dense
            products, O(N^2 d); ``"ivf"``: inverted lists, approximate, for large N).

    Returns:
        int64 ``[N]``: the smallest item index of each item's group (an item with no
        near-duplicate is its own key).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8))
        >>> x[7] = x[3] + 0.01  # a near-copy of item 3
        >>> keys = hb.near_duplicate_keys(x, threshold=0.99)
        >>> int(keys[7]), int((keys != np.arange(40)).sum())
        (3, 1)
    """
    x = as_embeddings(embeddings, "embeddings", normalize=True)
    t = check_real(threshold, "threshold", "a cosine in [-1, 1)")
    if not -1.0 <= t < 1.0:
        raise ValueError(f"threshold={threshold} must lie in [-1, 1): pairs with cosine above it "
                         "are near-duplicates (e.g. 0.9; no cosine exceeds 1)")
    check_choice("method", method, ("exact", "ivf", "faiss"))
    n = x.shape[0]
    rows, cols = thresholded_pairs(x, x, t, method, nlist=nlist, nprobe=nprobe, seed=seed,
                                   device=device)
    graph = coo_matrix((np.ones(len(rows), np.int8), (rows, cols)), shape=(n, n))
    _, labels = connected_components(graph, directed=True, connection="weak")
    first = np.full(labels.max() + 1, n, np.int64)
    np.minimum.at(first, labels, np.arange(n, dtype=np.int64))
    keys = first[labels]
    sizes = np.bincount(keys, minlength=n)
    grouped = int((sizes[keys] > 1).sum())
    _log.info("near_duplicate_keys: %d of %d items in %d groups of near-duplicates (cosine > "
                "%g), the largest %d items", grouped, n, int((sizes > 1).sum()), t,
                int(sizes.max()))
    return keys


def _name(keys: DuplicateKeys, key_id: int) -> str:
    return repr(keys.values[key_id])[:80]


def _worst(keys: DuplicateKeys) -> str:
    """The key held by the most items, with its items, for messages."""
    k = int(np.argmax(keys.counts))
    return f"key {_name(keys, k)} is held by {int(keys.counts[k])} items: {keys.rows(k)}"


def check_walk_keys(keys: DuplicateKeys, batch_size: int) -> None:
    """``ValueError`` unless the items hold at least ``batch_size`` distinct keys.

    Example:
        >>> from hardbatch.keys.duplicates import check_walk_keys, encode_keys
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
            f"batches of {batch_size} items ({_worst(keys)}); use batch_size <= {found}, "
            "keys that tell more items apart, or duplicate_keys=None")
    if keys.classes < batch_size:
        raise ValueError(
            f"duplicate_keys leave only {keys.classes} distinct keys for batches of "
            f"{batch_size} items with no key twice ({_worst(keys)}); use batch_size <= "
            f"{keys.classes}, keys that tell more items apart, or duplicate_keys=None")


def partition_capacities(num_items: int, batch_size: int, drop_last: bool) -> np.ndarray:
    """Sizes of an epoch's partition batches: B each, the last N mod B unless dropped.

    Example:
        >>> from hardbatch.keys.duplicates import partition_capacities
        >>> partition_capacities(40, 16, False).tolist(), partition_capacities(40, 16, True)
        ([16, 16, 8], array([16, 16]))
    """
    full, rest = divmod(num_items, batch_size)
    caps = [batch_size] * full + ([rest] if rest and not drop_last else [])
    return np.array(caps, np.int64)


def _after_drop(counts: np.ndarray, drop: int) -> np.ndarray:
    """Group sizes after dropping ``drop`` items, one at a time from the largest group."""
    heap = [-int(c) for c in counts]
    heapq.heapify(heap)
    for _ in range(drop):
        heapq.heapreplace(heap, heap[0] + 1)
    return -np.array(heap, np.int64)


def check_partition_keys(keys: DuplicateKeys, num_items: int, batch_size: int,
                         drop_last: bool) -> None:
    """``ValueError`` unless the epoch's partition can keep every key out of shared batches.

    Feasible iff (Gale-Ryser) for every t, the t largest batches hold at most
    ``sum_k min(c_k, t)`` items (c_k: items of key k, unique items counting 1); with
    ``drop_last`` the N mod B dropped items are taken from the largest groups first.

    Example:
        >>> from hardbatch.keys.duplicates import check_partition_keys, encode_keys
        >>> try:
        ...     check_partition_keys(encode_keys(["a"] * 4 + list("bcdefg"), 10), 10, 4, False)
        ... except ValueError as err:
        ...     print(str(err).split("; ")[1])
        use batch_size <= 2, or merge / drop the copies
    """
    caps = partition_capacities(num_items, batch_size, drop_last)
    nb = len(caps)
    counts = np.concatenate([keys.counts, np.ones(int((keys.ids < 0).sum()), np.int64)])
    if drop_last and not keys.sets:
        counts = _after_drop(counts, num_items - int(caps.sum()))
    if keys.any and counts.max() > nb:
        k = int(np.argmax(keys.counts))  # the largest group stays the largest after drops
        c = int(keys.counts[k])
        raise ValueError(
            f"duplicate_keys: key {_name(keys, k)} is held by {c} items but an epoch has only "
            f"{nb} batches of batch_size={batch_size}, so two of them (of items "
            f"{keys.rows(k)}) must share a batch; use batch_size <= {num_items // c}, or "
            "merge / drop the copies")
    if keys.sets:  # no exact condition for conflicts: a trial repair of a random order
        if keys.any:
            order = _rng.permutation(num_items, _rng.derive_seed(0, 0, 0xC0F))
            separate_keys(order, int(caps.sum()), batch_size, keys)
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

    Succeeds whenever :func:`check_partition_keys` passes; items keep their relative order
    within a batch; with ``kept < N`` the dropped items come from the largest groups first.
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
    the clashing batch lacks; if no such swap exists, :func:`_construct` rebuilds the batches.
    Unchanged (the same array) when no key is shared.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.duplicates import encode_keys, separate_keys
        >>> keys = encode_keys(["a", "a", "b", "c"], 4)
        >>> separate_keys(np.arange(4), 4, 2, keys).reshape(2, 2).tolist()  # items 0, 1 apart
        [[0, 2], [1, 3]]
    """
    if keys is None or not keys.any:
        return order
    out = np.array(order, np.int64)
    if _swap_repair(out, kept, batch_size, keys.ptr, keys.idx, keys.has_key, keys.members,
                    keys.member_ptr, keys.sets):
        return out
    if not keys.sets:
        return _construct(np.asarray(order, np.int64), kept, batch_size, keys)
    out = greedy_partition(order, kept, batch_size, keys.ptr, keys.idx)
    if out is None:
        raise ValueError(
            f"duplicate_keys: the items could not be put into batches of batch_size="
            f"{batch_size} with no two of them sharing a key ({_worst(keys)}); use a smaller "
            "batch_size, keys that tell more items apart, or duplicate_keys=None")
    return out
