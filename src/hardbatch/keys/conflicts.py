"""Conflict keys: each item holds a SET of keys, and two items conflict when their sets meet.

This is sentence-transformers' ``NoDuplicatesBatchSampler`` rule for rows of several texts
(anchor, positive, negative_1 .. negative_k): no text may appear twice in a batch, so a row
whose negative is another row's anchor or positive never shares a batch with that row. It is a
pairwise relation, not an equivalence: rows a ~ b and b ~ c do not make a ~ c (merging them
into one key, as :func:`~hardbatch.keys.duplicates.shared_value_keys` does, puts every row of
a mined hard-negative dataset into one key). Single keys are the special case of one key per
item.

Pure functions over arrays (the samplers' side lives in :mod:`hardbatch.keys.duplicates`):

* :func:`factorize` / :func:`factorize_columns`: texts (or any values) to int codes, one
  shared dictionary across columns (the integer "hashes" that sentence-transformers'
  ``NO_DUPLICATES_HASHED`` precomputes with xxhash, exact: equal codes iff equal values);
* :func:`key_sets`: per-item key values ``[N, C]`` to the CSR of the keys held by two items or
  more (``ptr`` [N + 1], ``idx``, the kept values): keys held once cost nothing;
* :func:`item_keys`, :func:`free_of`: the keys of some items, and which candidates share none;
* :func:`closed_neighbourhood_bound`, :func:`greedy_independent`: when a batch of B pairwise
  conflict-free items always exists / can be found;
* :func:`greedy_partition`: a partition into batches without conflicts when swaps get stuck.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["closed_neighbourhood_bound", "factorize", "factorize_columns", "free_of",
           "greedy_independent", "greedy_partition", "item_keys", "key_sets", "set_keys",
           "shared_value_keys", "value_key"]


def value_key(value):
    """The comparable form of one cell: strings, bytes and numbers as they are, anything else
    (lists, dicts, images) by its ``repr``.

    Example:
        >>> from hardbatch.keys.conflicts import value_key
        >>> value_key("a cat"), value_key([1, 2])
        ('a cat', '[1, 2]')
    """
    return value if isinstance(value, (str, bytes, int, float)) else repr(value)


def factorize(values: Sequence) -> tuple[np.ndarray, list]:
    """Int64 codes of ``values`` (equal values, equal codes; numbered by first occurrence) and
    the distinct values in code order.

    Example:
        >>> from hardbatch.keys.conflicts import factorize
        >>> codes, uniques = factorize(["a", "b", "a", "c"])
        >>> codes.tolist(), uniques
        ([0, 1, 0, 2], ['a', 'b', 'c'])
    """
    first: dict = {}
    codes = np.fromiter((first.setdefault(value_key(v), len(first)) for v in values),
                        np.int64, count=len(values))
    return codes, list(first)


def _arrow_strings(column):
    """``column`` as one pyarrow string array, or None when it is not one."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - datasets brings pyarrow
        return None
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.Array) and (pa.types.is_string(column.type)
                                         or pa.types.is_large_string(column.type)):
        return column.cast(pa.large_string())
    return None


def factorize_columns(columns: Sequence[Sequence]) -> tuple[np.ndarray, list]:
    """Codes ``[N, C]`` of C columns of N values with ONE dictionary (a text in two columns
    gets one code), and the distinct values. pyarrow string columns (a ``datasets.Dataset``'s
    ``.data.column(name)``) are encoded in C++ (``dictionary_encode``), other sequences in
    Python; both number the values by first occurrence in column-major order.

    Example:
        >>> from hardbatch.keys.conflicts import factorize_columns
        >>> codes, uniques = factorize_columns([["a", "b"], ["b", "c"]])
        >>> codes.tolist(), uniques
        ([[0, 1], [1, 2]], ['a', 'b', 'c'])
    """
    columns = list(columns)
    if not columns:
        raise ValueError("factorize_columns needs at least one column")
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError(f"columns have different lengths {[len(c) for c in columns]}; every "
                         "column needs one value per row")
    arrow = [_arrow_strings(c) for c in columns]
    if all(a is not None for a in arrow) and not any(a.null_count for a in arrow):
        import pyarrow as pa

        encoded = pa.concat_arrays(arrow).dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        return codes.reshape(len(columns), n).T.copy(), encoded.dictionary.to_pylist()
    codes, uniques = factorize([v for c in columns for v in c])
    return codes.reshape(len(columns), n).T.copy(), uniques


def key_sets(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR of each item's keys held by two items or more.

    Args:
        values: int ``[N, C]``: the key values of item i are row i (repeats within a row count
            once), e.g. :func:`factorize_columns` codes or 64-bit hashes of the texts.

    Returns:
        ``(ptr, idx, kept)``: item i holds keys ``idx[ptr[i]:ptr[i + 1]]`` (ids 0 .. K - 1,
        increasing), ``kept`` [K] the value of each key id. Keys held by one item are left out.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.conflicts import key_sets
        >>> ptr, idx, kept = key_sets(np.array([[5, 6], [7, 5], [8, 8], [6, 9]]))
        >>> ptr.tolist(), idx.tolist(), kept.tolist()  # 5: items 0, 1; 6: items 0, 3
        ([0, 2, 3, 3, 4], [0, 1, 0, 1], [5, 6])
    """
    v = np.asarray(values)
    if v.ndim != 2 or not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"key values must be an integer array [N, C] (C keys per item), got "
                         f"shape {v.shape} and dtype {v.dtype}")
    n = v.shape[0]
    if v.size and (v.min() < 0 or v.max() >= 4 * v.size + 16):  # sparse values: densify
        uniq, inverse = np.unique(v, return_inverse=True)
        v = inverse.reshape(v.shape)
    else:
        uniq = None
    s = np.sort(v, axis=1)
    first = np.ones(s.shape, bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    counts = np.bincount(s[first], minlength=int(s.max()) + 1 if s.size else 0)
    shared = counts >= 2
    new_id = np.cumsum(shared) - 1
    mask = first & shared[s] if s.size else first
    idx = new_id[s[mask]].astype(np.int64)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(mask.sum(axis=1), out=ptr[1:])
    kept = np.flatnonzero(shared)
    return ptr, idx, (kept if uniq is None else uniq[kept]).astype(np.int64)


def item_keys(ptr: np.ndarray, idx: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The keys held by ``items`` (concatenated, with repeats).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.conflicts import item_keys
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
        >>> from hardbatch.keys.conflicts import free_of
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


def closed_neighbourhood_bound(ptr: np.ndarray, idx: np.ndarray, counts: np.ndarray,
                               batch_size: int) -> int:
    """An upper bound on the items that B - 1 batch items can block: the sum of the B - 1
    largest ``1 + sum_k (c_k - 1)`` over an item's keys k. Below N, a walk or kNN batch that
    skips conflicting items always finds a free one.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.conflicts import closed_neighbourhood_bound
        >>> ptr, idx = np.array([0, 1, 2, 2, 2]), np.array([0, 0])  # items 0, 1 share key 0
        >>> closed_neighbourhood_bound(ptr, idx, np.array([2]), 3)
        4
    """
    n = len(ptr) - 1
    owner = np.repeat(np.arange(n), np.diff(ptr))
    weight = np.ones(n, np.int64)
    np.add.at(weight, owner, counts[idx] - 1)
    top = np.partition(weight, n - (batch_size - 1))[n - (batch_size - 1):] \
        if 0 < batch_size - 1 <= n else weight
    return int(top.sum()) if batch_size > 1 else 0


def greedy_independent(ptr: np.ndarray, idx: np.ndarray, counts: np.ndarray,
                       limit: int) -> np.ndarray:
    """Up to ``limit`` pairwise conflict-free items, found greedily (fewest conflicts first).

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.conflicts import greedy_independent
        >>> ptr, idx = np.array([0, 1, 2, 3]), np.array([0, 0, 0])  # all three share key 0
        >>> len(greedy_independent(ptr, idx, np.array([3]), 5))
        1
    """
    n = len(ptr) - 1
    owner = np.repeat(np.arange(n), np.diff(ptr))
    weight = np.zeros(n, np.int64)
    np.add.at(weight, owner, counts[idx] - 1)
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


def greedy_partition(order: np.ndarray, kept: int, batch_size: int, ptr: np.ndarray,
                     idx: np.ndarray) -> np.ndarray | None:
    """``order`` rearranged so that its batches (``order[:kept]`` cut every ``batch_size``)
    hold no conflict, or None when this greedy fails: items with the most conflicting keys
    first, each into the batch with the most room among those free of its keys; items
    without keys fill the room left, in order. ``order[kept:]`` (dropped) stays as it is.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys.conflicts import greedy_partition
        >>> ptr, idx = np.array([0, 1, 2, 2, 2]), np.array([0, 0])  # items 0, 1 conflict
        >>> greedy_partition(np.arange(4), 4, 2, ptr, idx).reshape(2, 2).tolist()
        [[0, 2], [1, 3]]
    """
    order = np.asarray(order, np.int64)
    head = order[:kept]
    nb = -(-kept // batch_size)
    room = [batch_size] * (kept // batch_size) + ([kept % batch_size] if kept % batch_size
                                                   else [])
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


def set_keys(keys: Sequence, name: str = "duplicate_keys") -> tuple[np.ndarray, np.ndarray,
                                                                       list]:
    """N sets of hashable keys as :func:`key_sets`' CSR ``(ptr, idx)`` and the kept keys.

    Example:
        >>> from hardbatch.keys.conflicts import set_keys
        >>> ptr, idx, kept = set_keys([{"a", "b"}, {"c"}, {"b", "d"}])
        >>> ptr.tolist(), idx.tolist(), kept
        ([0, 1, 1, 2], [0, 0], ['b'])
    """
    first: dict = {}
    owner, raw = [], []
    for i, group in enumerate(keys):
        if not isinstance(group, (set, frozenset)):
            raise ValueError(f"{name}[{i}] = {group!r} is not a set; pass one set of keys "
                             "per item (or one hashable key per item)")
        try:
            raw += [first.setdefault(key, len(first)) for key in group]
        except TypeError:
            raise ValueError(f"{name}[{i}] holds an unhashable key; use hashable keys such as "
                             "strings, numbers or tuples") from None
        owner += [i] * len(group)
    sizes = np.bincount(np.array(owner, np.int64), minlength=len(keys))
    width = max(1, int(sizes.max()) if len(sizes) else 1)
    # one row of values per item, padded with values of its own (held once: dropped)
    values = len(first) + np.arange(len(keys) * width, dtype=np.int64).reshape(-1, width)
    slot = np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    values[np.array(owner, np.int64), slot] = raw
    ptr, idx, kept = key_sets(values)
    names = list(first)
    return ptr, idx, [names[k] for k in kept.tolist()]


def shared_value_keys(rows: Iterable[Sequence]) -> list[int]:
    """Keys for rows of values: rows sharing any value (transitively) get the same key (the
    equivalence rule; for "no value twice in a batch" use key sets, :func:`key_sets`).

    ``rows``: for each item, its values (e.g. the texts of all columns of a row). Returns one
    int per row, the smallest row index of its group (union-find over equal values).

    Example:
        >>> from hardbatch.keys.conflicts import shared_value_keys
        >>> shared_value_keys([("a", "b"), ("c", "d"), ("b", "e"), ("e", "f")])
        [0, 1, 0, 0]
    """
    parent: list[int] = []
    owner: dict = {}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, values in enumerate(rows):
        parent.append(i)
        for value in values:
            j = owner.setdefault(value, i)
            if j != i:
                a, b = root(i), root(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(parent))]
