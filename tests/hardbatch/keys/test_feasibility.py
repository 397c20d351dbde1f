"""hardbatch.keys.feasibility: a request is refused exactly when no plan can meet it, with an
error naming the key and the fix.

References: a plain-Python max-flow for the feasibility of separating keys in a partition."""

from collections import Counter

import numpy as np
import pytest
from keys_support import clashes
from sampler_support import B, N, conflicts, make

import hardbatch as hb
from hardbatch.keys.encode import encode_keys
from hardbatch.keys.feasibility import check_partition_keys
from hardbatch.keys.repair import partition_capacities, separate_keys


def max_flow_feasible(counts, caps) -> bool:
    """Reference: can groups of sizes ``counts`` fill batches of sizes ``caps`` exactly, one item
    per group per batch, dropping items only if sum(counts) > sum(caps)? (Ford-Fulkerson.)"""
    g, nb = len(counts), len(caps)
    size = g + nb + 2
    cap = [[0] * size for _ in range(size)]
    src, sink = g + nb, g + nb + 1
    for k, c in enumerate(counts):
        cap[src][k] = c
        for b in range(nb):
            cap[k][g + b] = 1
    for b, c in enumerate(caps):
        cap[g + b][sink] = c
    flow = 0
    while True:
        prev, todo = {src: None}, [src]
        while todo and sink not in prev:
            u = todo.pop()
            for v in range(size):
                if v not in prev and cap[u][v] > 0:
                    prev[v] = u
                    todo.append(v)
        if sink not in prev:
            return flow == sum(caps)
        v = sink
        while prev[v] is not None:
            u = prev[v]
            cap[u][v] -= 1
            cap[v][u] += 1
            v = u
        flow += 1


@pytest.mark.parametrize("drop_last", [False, True])
def test_partition_check_matches_max_flow_and_separation_succeeds(drop_last):
    r = np.random.default_rng(5)
    seen = Counter()
    for _ in range(300):
        n = int(r.integers(3, 14))
        b = int(r.integers(1, n + 1))
        keys = r.integers(0, int(r.integers(1, n + 1)), n).tolist()
        enc = encode_keys(keys, n)
        caps = partition_capacities(n, b, drop_last)
        counts = list(Counter(keys).values())
        feasible = max_flow_feasible(counts, caps.tolist())
        try:
            check_partition_keys(enc, n, b, drop_last)
            passed = True
        except ValueError as err:
            passed = False
            assert "duplicate_keys" in str(err) and "batch_size" in str(err)
        assert passed == feasible, (keys, b, drop_last)
        seen[feasible] += 1
        if feasible:
            kept = int(caps.sum())
            order = r.permutation(n)
            out = separate_keys(order, kept, b, enc)
            assert sorted(out.tolist()) == list(range(n))
            batches = [out[s:s + b].tolist() for s in range(0, kept, b)]
            assert [len(x) for x in batches] == caps.tolist()
            assert clashes(batches, keys) == 0
    assert seen[True] > 50 and seen[False] > 50


def test_impossible_requests_name_the_key_and_the_fix(emb):
    keys = ["same"] * 20 + [f"t{i}" for i in range(N - 20)]
    with pytest.raises(ValueError, match="key 'same' is held by 20 items but an epoch has only "
                                         "16 batches of batch_size=64.*batch_size <= 50"):
        hb.UniformBatchSampler(N, B, duplicate_keys=keys)
    with pytest.raises(ValueError, match="key 'same' is held by 20 items"):
        make("gcbs", emb, duplicate_keys=keys)
    few = [i % 50 for i in range(N)]  # 50 distinct keys, batches of 64
    for kind in ("knn", "proximity"):
        with pytest.raises(ValueError, match="only 50 distinct keys for batches of 64 .*use "
                                             "batch_size <= 50"):
            make(kind, emb, duplicate_keys=few)
    assert all(len(b) == 50 for b in make("proximity", emb, batch_size=50, duplicate_keys=few))


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


def test_ranks_serving_fewer_full_batches_check_the_plan_they_serve():
    # N = 40, B = 8, drop_last, W = 3: 5 full batches but whole steps serve 3, and 16 items
    # are left out. A key of 19 items fits (16 dropped from it, 3 left for 3 batches); one of
    # 20 does not, although 20 items in 5 batches would be rejected for another reason and
    # 19 - 16 = 3 <= 3 is exactly the limit
    def keys(c):
        return encode_keys(["k"] * c + [f"u{i}" for i in range(40 - c)], 40)

    check_partition_keys(keys(19), 40, 8, True, batches=3)
    with pytest.raises(ValueError, match="held by 20 items but an epoch has only 3 batches"):
        check_partition_keys(keys(20), 40, 8, True, batches=3)
    with pytest.raises(ValueError, match="batches=6 must be"):
        check_partition_keys(keys(2), 40, 8, True, batches=6)
    ranks = [hb.UniformBatchSampler(40, 8, drop_last=True, world_size=3, rank=r,
                                    duplicate_keys=["k"] * 19 + [f"u{i}" for i in range(21)])
             for r in range(3)]
    served = [b for r in ranks for b in r]
    assert len(served) == 3 and all(sum(i < 19 for i in b) <= 1 for b in served)
    with pytest.raises(ValueError, match="held by 20 items"):
        hb.UniformBatchSampler(40, 8, drop_last=True, world_size=3, rank=0,
                               duplicate_keys=["k"] * 20 + [f"u{i}" for i in range(20)])


@pytest.mark.parametrize("kind", ["knn", "proximity"])
def test_a_walk_or_knn_batch_that_must_take_a_shared_key_warns(kind):
    """Key sets where item 0 meets every item but one: the construction check finds a key-free
    batch (it exists), but a batch anchored at item 0 cannot be completed without a shared key.
    Before, such batches were served silently (found by review); now every epoch that serves
    one warns, naming the anchor, and no warning comes where none is served."""
    import itertools
    import warnings

    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    keys = [frozenset("abcd"), frozenset("a"), frozenset("b"), frozenset("c"), frozenset("d"),
            frozenset()]
    sampler = (hb.KNNBatchSampler(x, 4, refresh_every=None, duplicate_keys=keys)
               if kind == "knn" else
               hb.ProximityGraphSampler(x, 4, 4, 3, refresh_every=None, duplicate_keys=keys))
    served = 0
    for epoch in range(4):
        sampler.set_epoch(epoch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = list(sampler)
        shared = [b for b in batches if any(keys[i] & keys[j]
                                            for i, j in itertools.combinations(b, 2))]
        messages = [str(w.message) for w in caught if "duplicate_keys" in str(w.message)]
        assert len(messages) == (1 if shared else 0), (epoch, shared, messages)
        if shared:
            served += 1
            assert "holds items that share a key" in messages[0] and "smaller batch_size" in \
                messages[0]
    assert served  # the case occurs
