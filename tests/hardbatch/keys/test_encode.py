"""hardbatch.keys.encode: every form of ``duplicate_keys`` (hashable keys, key sets, integer key
values, column texts) encodes the same keys, and bad input is a ``ValueError`` naming it.

References: brute-force pairwise conflicts of key values; single keys as one-element sets give
the batches of plain keys bit for bit."""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from sampler_support import KINDS, N, chain_sets, make

import hardbatch as hb
from hardbatch.keys.encode import (compact_key_ids, encode_keys, factorize, factorize_columns,
                                   key_sets)


def test_encode_keys_ids_values_and_counts():
    keys = ["a", "b", "a", "c", "b", "a", ("t", 1), ("t", 1)]
    enc = encode_keys(keys, len(keys))
    ids = enc.ids.tolist()
    assert ids[1] == -1 or ids.count(ids[1]) == 2
    assert ids[3] == -1  # "c" is held by one item only
    for i, j in itertools.combinations(range(len(keys)), 2):
        same = keys[i] == keys[j]
        assert (ids[i] == ids[j] and ids[i] >= 0) == same, (i, j)
    assert sorted(enc.values, key=str) == sorted(["a", "b", ("t", 1)], key=str)
    assert enc.counts.tolist() == [Counter(keys)[v] for v in enc.values]
    assert enc.classes == 4 and enc.any
    assert not encode_keys(list(range(5)), 5).any
    assert encode_keys(None, 5) is None
    assert encode_keys(np.array([3, 3, 4]), 3).ids.tolist() == [0, 0, -1]


@pytest.mark.parametrize("keys,match", [
    (["a", "b"], "duplicate_keys has 2 keys but there are N=3 items"),
    ([["a"], ["b"], ["a"]], r"duplicate_keys\[0\] = \['a'\] is not hashable"),
    ("abc", "must be a sequence of N=3 hashable keys"),
    (5, "must be a sequence"),
    (np.zeros((3, 2)), "must be a 1-D sequence"),
])
def test_bad_keys_are_value_errors(keys, match):
    with pytest.raises(ValueError, match=match):
        hb.UniformBatchSampler(3, 2, duplicate_keys=keys)


@pytest.mark.parametrize("sparse", [False, True])
def test_key_sets_equal_brute_force(sparse):
    r = np.random.default_rng(1)
    values = r.integers(0, 60, (50, 3))
    if sparse:  # 64-bit hashes, negative ones included
        values = values * 0x3E3779B97F4A7 - (1 << 60)
    ptr, idx, kept = key_sets(values)
    held = [set(idx[ptr[i]:ptr[i + 1]].tolist()) for i in range(50)]
    for i, j in itertools.combinations(range(50), 2):
        assert bool(held[i] & held[j]) == bool(set(values[i]) & set(values[j]))
    counts = np.bincount(idx, minlength=len(kept))
    for k, value in enumerate(kept.tolist()):
        assert counts[k] == sum(value in set(row) for row in values.tolist()) >= 2
    assert all(np.all(np.diff(idx[ptr[i]:ptr[i + 1]]) > 0) for i in range(50))


def test_factorize_columns_arrow_and_python_agree():
    datasets = pytest.importorskip("datasets")
    cols = {"a": ["x", "y", "x", "z"], "b": ["y", "w", "q", "x"]}
    data = datasets.Dataset.from_dict(cols).select([3, 0, 2, 1])  # an indices mapping
    arrow = data.with_format("arrow")
    fast, u1 = factorize_columns([arrow["a"], arrow["b"]])
    slow, u2 = factorize_columns([data["a"], data["b"]])
    assert np.array_equal(fast, slow) and u1 == u2
    assert [[u1[c] for c in row] for row in fast.tolist()] == [list(r) for r in
                                                              zip(data["a"], data["b"])]


def test_every_input_form_encodes_the_same_conflicts():
    rows = chain_sets(60)
    by_sets = encode_keys(rows, 60)
    names = sorted(set().union(*rows))
    width = max(len(s) for s in rows)
    codes = np.array([[names.index(t) for t in sorted(s)] + [names.index(sorted(s)[0])] *
                      (width - len(s)) for s in rows])
    def pairs(keys):  # the conflict relation (key numbering may differ)
        held = [set(keys.idx[keys.ptr[i]:keys.ptr[i + 1]].tolist()) for i in range(60)]
        return {(i, j) for i, j in itertools.combinations(range(60), 2) if held[i] & held[j]}

    expected = {(i, j) for i, j in itertools.combinations(range(60), 2) if rows[i] & rows[j]}
    for other in (by_sets, encode_keys(codes, 60), encode_keys(torch.from_numpy(codes), 60),
                  encode_keys(by_sets, 60)):
        assert pairs(other) == expected and sorted(other.counts) == sorted(by_sets.counts)
    with pytest.raises(ValueError, match="encodes 60 items but there are N=61"):
        encode_keys(by_sets, 61)
    with pytest.raises(ValueError, match=r"duplicate_keys\[1\] = 'b' is not a set"):
        encode_keys([{"a"}, "b"], 2)
    with pytest.raises(ValueError, match="2 rows of key values but there are N=3"):
        encode_keys(np.zeros((2, 2), np.int64), 3)


@pytest.mark.parametrize("kind", KINDS)
def test_one_key_sets_give_the_batches_of_plain_keys(kind, emb):
    keys = [f"k{i % 300}" if i < 600 else f"u{i}" for i in range(N)]
    plain = make(kind, emb, seed=2, duplicate_keys=keys)
    sets = make(kind, emb, seed=2, duplicate_keys=[frozenset([k]) for k in keys])
    assert not sets.duplicate_keys.sets  # one key per item: the single-key path
    assert [list(sets), list(sets)] == [list(plain), list(plain)]


def test_compact_key_ids_renumber_and_check():
    ids = compact_key_ids(torch.tensor([9, -1, 4, 9, 4, -1]), 6, 4)
    assert ids.dtype == np.int64 and ids.tolist() == [1, -1, 0, 1, 0, -1]
    with pytest.raises(ValueError, match="key_ids hold 4 distinct keys, fewer than batch_size=5"):
        compact_key_ids([9, -1, 4, 9, 4, -1], 6, 5)
    for bad in ([0, 1], [0, -2, 1], [0.5, 1.0, 2.0]):
        with pytest.raises(ValueError, match="key_ids must be 3 integers >= -1"):
            compact_key_ids(np.array(bad), 3, 1)


def test_mixed_plain_keys_and_key_sets_and_positional_series():
    """A plain key among key sets is a ValueError naming it, whichever comes first (before, a
    plain first key made every set one opaque key: no conflict found, silently); a pandas Series
    is read by position (before, a Series without label 0 raised KeyError)."""
    for keys, bad in ((["a", frozenset({"a"}), frozenset({"a", "b"})], 0),
                      ([frozenset({"a"}), "a", frozenset({"a", "b"})], 1)):
        with pytest.raises(ValueError, match=rf"duplicate_keys\[{bad}\] = 'a' is not a set"):
            encode_keys(keys, 3)
    pd = pytest.importorskip("pandas")
    texts = pd.DataFrame({"text": ["x", "b", "a", "b", "d"]}).iloc[1:]["text"]
    assert encode_keys(texts, 4).ids.tolist() == encode_keys(["b", "a", "b", "d"], 4).ids.tolist()


def test_factorize_codes_are_equal_exactly_for_equal_values():
    """None never meets the string "None" (nor a list its repr); NumPy scalars meet the equal
    Python numbers (before: None == "None" and np.int64(5) != 5)."""
    assert factorize([None, "None", [1, 2], "[1, 2]", None])[0].tolist() == [0, 1, 2, 3, 0]
    codes, uniques = factorize_columns([[5, 6], np.array([5, 7])])
    assert codes.tolist() == [[0, 0], [1, 2]] and uniques == [5, 6, 7]
    assert factorize([np.float32(0.5), 0.5, np.str_("a"), "a"])[0].tolist() == [0, 0, 1, 1]
