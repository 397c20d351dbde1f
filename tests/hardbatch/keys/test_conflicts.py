"""Key sets (conflicts): items conflict when their key sets meet, and no batch of any sampler
holds two conflicting items (issue 31: no text of a row twice in a batch, pairwise, as
sentence-transformers' NoDuplicatesBatchSampler; not an equivalence class).

References: brute-force pairwise conflicts; single keys as one-element sets give the batches of
plain keys bit for bit; a greedy kNN batch over non-conflicting candidates."""

import itertools

import numpy as np
import pytest
import torch
from sampler_support import B, KINDS, N, chain_sets, conflicts, make, near_conflicts

import hardbatch as hb
from hardbatch.keys.conflicts import (
    factorize_columns,
    free_of,
    greedy_partition,
    item_keys,
    key_sets,
)
from hardbatch.keys.duplicates import encode_keys, separate_keys


# -- pure functions ------------------------------------------------------------------------

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


def test_item_keys_and_free_of():
    sets = [frozenset(s) for s in ({"a", "b"}, {"b"}, {"c", "a"}, {"d"}, {"c"})]
    keys = encode_keys(sets, 5)
    held = item_keys(keys.ptr, keys.idx, np.array([0]))
    assert sorted(keys.values[k] for k in held) == ["a", "b"]
    free = free_of(keys.ptr, keys.idx, np.arange(5), item_keys(keys.ptr, keys.idx, [0]))
    assert free.tolist() == [3, 4] and keys.compatible(np.arange(5), [4]).tolist() == [0, 1, 3]


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


# -- samplers ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_one_key_sets_give_the_batches_of_plain_keys(kind, emb):
    keys = [f"k{i % 300}" if i < 600 else f"u{i}" for i in range(N)]
    plain = make(kind, emb, seed=2, duplicate_keys=keys)
    sets = make(kind, emb, seed=2, duplicate_keys=[frozenset([k]) for k in keys])
    assert not sets.duplicate_keys.sets  # one key per item: the single-key path
    assert [list(sets), list(sets)] == [list(plain), list(plain)]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_with_conflicts_from_a_saved_state(kind, emb, tmp_path):
    sets = chain_sets(seed=3)
    x = near_conflicts(emb, sets)
    reference = list(make(kind, x, seed=3, duplicate_keys=sets))
    for consumed in (0, 3):  # a prefetching loader ran two batches ahead
        run = make(kind, x, seed=3, duplicate_keys=sets)
        batches = iter(run)
        head = [next(batches) for _ in range(consumed + 2)]
        torch.save(run.state_dict(consumed=consumed), tmp_path / "state.pt")
        resumed = make(kind, x, seed=3, duplicate_keys=sets)
        resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
        assert head[:consumed] + list(resumed) == reference, consumed


def test_knn_takes_the_next_neighbour_free_of_conflicts(emb):
    sets = chain_sets(k=3, seed=6)
    x = near_conflicts(emb, sets)
    s = hb.KNNBatchSampler(x, 40, refresh_every=None, duplicate_keys=sets, seed=2)
    z = torch.nn.functional.normalize(torch.from_numpy(x), dim=1)  # the sampler's float32
    for batch in list(s)[:10]:
        anchor = batch[0]
        sims = z @ z[anchor]
        sims[anchor] = -torch.inf
        expected, taken = [anchor], set(sets[anchor])
        for j in sims.topk(N - 1).indices.tolist():
            if len(expected) == 40:
                break
            if not taken & sets[j]:
                expected.append(int(j))
                taken |= sets[j]
        assert batch == expected


def test_stuck_swaps_fall_back_to_a_greedy_partition():
    # a star: item 0 conflicts with 1..5 (key "hub" held by 0 and the key "s{i}" pairs)
    sets = [frozenset({"x", "y"}), frozenset({"x"}), frozenset({"y"}), frozenset({"z"}),
            frozenset({"z", "w"}), frozenset({"w"})]
    keys = encode_keys(sets, 6)
    out = greedy_partition(np.arange(6), 6, 2, keys.ptr, keys.idx)
    assert sorted(out.tolist()) == list(range(6)) and conflicts(out.reshape(3, 2), sets) == 0
    order = separate_keys(np.array([0, 1, 2, 3, 4, 5]), 6, 3, keys)
    assert conflicts(order.reshape(2, 3), sets) == 0


def test_impossible_conflicts_fail_at_construction_naming_items_and_fix(emb):
    sets = [frozenset({"shared", f"t{i}"}) if i < 20 else frozenset({f"t{i}"})
            for i in range(N)]
    with pytest.raises(ValueError, match="key 'shared' is held by 20 items but an epoch has "
                                         r"only 16 batches.*0, 1, 2, 3, 4, \.\.\..*"
                                         "batch_size <= 50"):
        hb.UniformBatchSampler(N, B, duplicate_keys=sets)
    dense = [frozenset({f"g{i % 50}", f"h{i // 2}"}) for i in range(N)]  # 50 cliques of 20
    for kind in ("knn", "proximity"):
        with pytest.raises(ValueError, match=r"only (\d+) items that pairwise share no key "
                                             r"were found.*g\d+.*batch_size <= \1,") as err:
            make(kind, emb, duplicate_keys=dense)
    found = int(str(err.value).split("only ")[1].split()[0])
    assert 40 <= found <= 50  # one item per g clique at most
    s = make("knn", emb, batch_size=found, duplicate_keys=dense)
    assert all(len(b) == found for b in s) and conflicts(list(s), dense) == 0
