"""Keys as users give them, turned into the one encoded form every sampler reads.

A sampler's ``duplicate_keys=`` is a length-N sequence of hashable keys (equal keys never share
a batch), or of key SETS (``set`` / ``frozenset`` per item, an int array ``[N, C]`` of C key
values per item, or a prebuilt :class:`DuplicateKeys`): then two items conflict when their sets
meet. That is sentence-transformers' ``NoDuplicatesBatchSampler`` rule for rows of several texts
(anchor, positive, negative_1 .. negative_k): no text may appear twice in a batch, so a row
whose negative is another row's anchor or positive never shares a batch with that row. It is a
pairwise relation, not an equivalence: rows a ~ b and b ~ c do not make a ~ c (merging them
into one key, as :func:`~hardbatch.keys.derive.shared_value_keys` does, puts every row of a
mined hard-negative dataset into one key). A single key is the one-element key set.

* :func:`value_key`, :func:`factorize`, :func:`factorize_columns`: texts (or any values) to int
  codes, one shared dictionary across columns (the integer "hashes" that sentence-transformers'
  ``NO_DUPLICATES_HASHED`` precomputes with xxhash, exact: equal codes iff equal values);
* :func:`key_sets` (key values ``[N, C]``) and :func:`set_keys` (N Python sets): the CSR of the
  keys held by two items or more (``ptr`` [N + 1], ``idx``, the kept values): keys held once
  cost nothing;
* :class:`DuplicateKeys` and :func:`encode_keys`: ``duplicate_keys=`` in any of its forms,
  encoded once (the CSR, the items of each key, the counts the feasibility checks read);
* :func:`compact_key_ids`: ``walk_batches``' ``key_ids`` checked and renumbered.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .membership import free_of, item_keys, single_key_csr

__all__ = ["KEYS_OFF", "DuplicateKeys", "compact_key_ids", "encode_keys", "factorize",
           "factorize_columns", "key_sets", "set_keys", "value_key"]

#: The last remedy of every infeasible-keys message (integrations where None means something
#: else drop it: :func:`hardbatch.integrations.sentence_transformers.texts_error`).
KEYS_OFF = ", or duplicate_keys=None"


def value_key(value):
    """The comparable form of one cell: strings, bytes and numbers (NumPy's too) as they are,
    anything else (None, lists, dicts, images) as the pair (type name, ``repr``), which never
    equals a string: ``None`` and ``"None"`` stay apart, ``np.int64(5)`` and ``5`` meet.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import value_key
        >>> value_key("a cat"), value_key([1, 2]), value_key(np.int64(5))
        ('a cat', ('list', '[1, 2]'), 5)
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (str, bytes, int, float)):
        return value
    return (type(value).__qualname__, repr(value))


def factorize(values: Sequence) -> tuple[np.ndarray, list]:
    """Int64 codes of ``values`` (equal values, equal codes; numbered by first occurrence) and
    the distinct values in code order.

    Example:
        >>> from hardbatch.keys import factorize
        >>> codes, uniques = factorize(["a", "b", "a", "c"])
        >>> codes.tolist(), uniques
        ([0, 1, 0, 2], ['a', 'b', 'c'])
    """
    first: dict = {}
    codes = np.fromiter((first.setdefault(value_key(v), len(first)) for v in values),
                        np.int64, count=len(values))
    return codes, [k[1] if isinstance(k, tuple) else k for k in first]  # shown: repr


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
        >>> from hardbatch.keys import factorize_columns
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
        >>> from hardbatch.keys import key_sets
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


def set_keys(keys: Sequence, name: str = "duplicate_keys") -> tuple[np.ndarray, np.ndarray,
                                                                       list]:
    """N sets of hashable keys as :func:`key_sets`' CSR ``(ptr, idx)`` and the kept keys.

    Example:
        >>> from hardbatch.keys import set_keys
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
        >>> from hardbatch.keys import encode_keys
        >>> keys = encode_keys(["a", "b", "a", "c"], 4)
        >>> keys.ids.tolist(), keys.values, keys.classes, keys.any
        ([0, -1, 0, -1], ['a'], 3, True)
    """

    def __init__(self, ids: np.ndarray | None, values, ptr: np.ndarray | None = None,
                 idx: np.ndarray | None = None) -> None:
        self.sets = ids is None and bool(np.diff(ptr).max(initial=0) > 1)  # else: single keys
        if ids is not None:  # one key per item
            ptr, idx = single_key_csr(ids)
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

    def name(self, key_id: int) -> str:
        """The original key of ``key_id``, shortened, for messages."""
        return repr(self.values[key_id])[:80]

    def worst(self) -> str:
        """The key held by the most items, with its items, for messages."""
        k = int(np.argmax(self.counts))
        return f"key {self.name(k)} is held by {int(self.counts[k])} items: {self.rows(k)}"


def encode_keys(keys, num_items: int, name: str = "duplicate_keys") -> DuplicateKeys | None:
    """``keys`` (N hashable values) as :class:`DuplicateKeys`; None for ``keys=None``.

    ``keys``: N hashable keys; N sets / frozensets of hashable keys, or an int array
    ``[N, C]`` (C key values per item; items conflict when their sets meet); or a
    :class:`DuplicateKeys` of N items. ``ValueError`` naming ``name`` for a wrong length, a
    non-sequence or an unhashable key.

    Example:
        >>> from hardbatch.keys import encode_keys
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
    keys = list(keys)  # by position (a pandas Series' labels need not be 0 .. N - 1)
    if any(isinstance(key, (set, frozenset)) for key in keys):  # key sets, wherever the
        ptr, idx, names = set_keys(keys, name)  # first set is (a plain key among them raises)
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


def compact_key_ids(key_ids, num_items: int, batch_size: int) -> np.ndarray:
    """Validated ``key_ids`` renumbered 0, 1, ... (-1 kept); ``ValueError`` for a wrong shape
    or dtype, or fewer than ``batch_size`` distinct keys (a batch could not be filled).

    Example:
        >>> from hardbatch.keys import compact_key_ids
        >>> compact_key_ids([7, -1, 7, 3], 4, 3).tolist()  # 3 distinct keys: 3, 7, and item 1
        [1, -1, 1, 0]
    """
    ids = np.asarray(key_ids.cpu() if isinstance(key_ids, torch.Tensor) else key_ids)
    if ids.shape != (num_items,) or not np.issubdtype(ids.dtype, np.integer) or (
            ids.size and ids.min() < -1):
        raise ValueError(f"key_ids must be {num_items} integers >= -1, one per item (-1: an "
                         f"item without copies), got shape {ids.shape} and dtype {ids.dtype}")
    keyed = ids >= 0
    values, inverse = np.unique(ids[keyed], return_inverse=True)
    out = np.full(num_items, -1, np.int64)
    out[keyed] = inverse
    classes = int((~keyed).sum()) + len(values)
    if classes < batch_size:
        raise ValueError(f"key_ids hold {classes} distinct keys, fewer than batch_size="
                         f"{batch_size}; use batch_size <= {classes}")
    return out
