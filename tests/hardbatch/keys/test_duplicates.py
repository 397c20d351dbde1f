"""duplicate_keys: items with equal keys never share a batch, for every sampler (issue 22).

References: a plain-Python max-flow for the feasibility of separating keys in a partition,
connected components for rows sharing values, a greedy float64 kNN batch.
"""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from sampler_support import (
    B,
    KINDS,
    N,
    PARTITIONS,
    chain_sets,
    conflicts,
    make,
    near_conflicts,
)

import hardbatch as hb
from hardbatch.keys.duplicates import (
    check_partition_keys,
    encode_keys,
    partition_capacities,
    separate_keys,
    shared_value_keys,
)


def copies_keys(n=N, groups=150, size=3, seed=0):
    """Keys of ``n`` items where ``groups`` keys are held by ``size`` items each."""
    r = np.random.default_rng(seed)
    keys = [f"item{i}" for i in range(n)]
    members = r.permutation(n)[:groups * size].reshape(groups, size)
    for g, row in enumerate(members):
        for i in row:
            keys[i] = f"copy{g}"
    return keys


def with_copies(emb, keys):
    """Embeddings where items sharing a key are (near) copies: nearest neighbours."""
    x = emb.copy()
    first = {}
    for i, k in enumerate(keys):
        j = first.setdefault(k, i)
        x[i] = emb[j] + 1e-4 * np.cos(i + np.arange(emb.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clashes(batches, keys) -> int:
    return sum(len(b) - len({keys[i] for i in b}) for b in batches)


# -- encoding ------------------------------------------------------------------------------

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


def components(rows):
    """Reference: connected components of the graph 'rows share a value' (BFS)."""
    n = len(rows)
    label = [-1] * n
    for s in range(n):
        if label[s] >= 0:
            continue
        label[s], todo = s, [s]
        while todo:
            i = todo.pop()
            for j in range(n):
                if label[j] < 0 and set(rows[i]) & set(rows[j]):
                    label[j] = s
                    todo.append(j)
    return label


def test_shared_value_keys_are_the_components_of_shared_values():
    r = np.random.default_rng(3)
    for _ in range(20):
        rows = [tuple(r.integers(0, 25, 2).tolist()) for _ in range(30)]
        assert shared_value_keys(rows) == components(rows)


# -- feasibility of a partition: Gale-Ryser against a max-flow reference ---------------------

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


def test_a_clash_swaps_with_the_nearest_item_of_the_nearest_batch():
    keys = ["a", "a", "x", "y", "z", "w"]  # batches [0 1] [2 3] [4 5]: 1 clashes with 0
    enc = encode_keys(keys, 6)
    order = np.arange(6)
    assert separate_keys(order, 6, 2, enc).tolist() == [0, 2, 1, 3, 4, 5]
    # the nearest batch holds the key too: the next one
    keys = ["a", "a", "a", "y", "z", "w"]
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)).tolist() == [0, 4, 2, 3, 1, 5]
    # backwards when the clash is in the last batch, from the end nearest to it
    keys = ["x", "y", "z", "w", "a", "a"]
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)).tolist() == [0, 1, 2, 5, 4, 3]
    # no key shared within a batch: the same order back
    keys = ["a", "x", "a", "y", "a", "z"]
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)) is not None
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)).tolist() == order.tolist()


def test_stuck_swaps_fall_back_to_a_construction():
    # batches of 3 over [5 1 2 | 6 4 0 | 3]: no single swap separates key 1 (items 1, 2, 5)
    keys = [3, 1, 1, 2, 3, 1, 2]
    out = separate_keys(np.array([5, 1, 2, 6, 4, 0, 3]), 7, 3, encode_keys(keys, 7))
    batches = [out[:3].tolist(), out[3:6].tolist(), out[6:].tolist()]
    assert sorted(out.tolist()) == list(range(7)) and clashes(batches, keys) == 0


# -- samplers ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("sets", [False, True])
def test_every_sampler_keeps_copies_apart_and_the_contract(kind, emb, drop_last, sets):
    """Single keys (copies of one text) and key sets (mined rows: a row conflicts with the
    rows holding one of its texts, issue 31)."""
    keys = chain_sets() if sets else copies_keys()
    x = near_conflicts(emb, keys) if sets else with_copies(emb, keys)
    count = conflicts if sets else clashes
    without = list(make(kind, x, refresh_every=None, drop_last=drop_last, seed=1))
    if kind != "community":  # B3 skips each item's nearest ranks
        assert count(without, keys) > 0  # copies / conflicting rows meet without keys
    s = make(kind, x, refresh_every=None, drop_last=drop_last, seed=1, duplicate_keys=keys)
    assert s.duplicate_keys.sets == sets
    for _ in range(2):  # two epochs
        batches = list(s)
        assert len(batches) == (N // B if drop_last else math.ceil(N / B))
        assert count(batches, keys) == 0
        assert all(len(set(b)) == len(b) for b in batches)
        assert getattr(getattr(s, "walk_state", None), "fallbacks", [0])[0] == 0
        if kind in PARTITIONS:
            drawn = sorted(itertools.chain.from_iterable(batches))
            assert len(set(drawn)) == len(drawn) == (N - N % B if drop_last else N)
        else:
            assert all(len(b) == B for b in batches)


@pytest.mark.parametrize("kind", KINDS)
def test_keys_without_copies_give_the_same_batches(kind, emb):
    plain = make(kind, emb, seed=2)
    keyed = make(kind, emb, seed=2, duplicate_keys=[f"t{i}" for i in range(N)])
    assert [list(keyed), list(keyed)] == [list(plain), list(plain)]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_and_prefetch_with_keys(kind, emb):
    keys = copies_keys(seed=4)
    x = with_copies(emb, keys)
    reference = list(make(kind, x, seed=3, duplicate_keys=keys))
    s = make(kind, x, seed=3, duplicate_keys=keys)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    fresh = make(kind, x, seed=3, duplicate_keys=keys)
    fresh.load_state_dict(s.state_dict(consumed=3))
    assert head[:3] + list(fresh) == reference
    if kind not in PARTITIONS:
        assert list(make(kind, x, seed=3, duplicate_keys=keys, prefetch=2)) == reference


def test_knn_batches_take_the_next_neighbour_against_a_greedy_reference(emb):
    keys = copies_keys(groups=200, size=2, seed=6)
    x = with_copies(emb, keys)
    s = hb.KNNBatchSampler(x, 40, refresh_every=None, duplicate_keys=keys, seed=2)
    z = x.astype(np.float64)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    for batch in list(s)[:10]:
        anchor = batch[0]
        sims = z @ z[anchor]
        sims[anchor] = -np.inf
        expected, taken = [anchor], {keys[anchor]}
        for j in np.argsort(-sims, kind="stable"):
            if len(expected) == 40:
                break
            if keys[j] not in taken:
                expected.append(int(j))
                taken.add(keys[j])
        assert batch == expected


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


@pytest.mark.parametrize("sets", [False, True])
def test_global_batches_never_share_a_key_across_ranks(emb, sets):
    keys = chain_sets(seed=8) if sets else copies_keys(seed=8)
    x = near_conflicts(emb, keys) if sets else with_copies(emb, keys)
    for kind in ("uniform", "knn", "proximity", "gcbs"):
        ranks = [list(make(kind, x, batch_size=32, seed=5, rank=r, world_size=2,
                           global_batch=True, duplicate_keys=keys)) for r in range(2)]
        steps = [a + b for a, b in zip(*ranks)]
        assert (conflicts if sets else clashes)(steps, keys) == 0, kind


def test_walk_kernel_with_every_item_keyed_apart_equals_no_keys(emb):
    graph = hb.knn_graph(emb, 10)
    for walk in ("rwr", "rw", "bfs", "dfs"):
        plain = hb.walk_batches(graph, 32, 6, walk=walk, seed=3)
        keyed = hb.walk_batches(graph, 32, 6, walk=walk, seed=3,
                                key_ids=torch.arange(N) * 7 - 1)  # all distinct (one -1)
        assert torch.equal(plain, keyed), walk


def test_docs_examples_run():
    """The duplicate_keys, near_duplicate_keys and global_batch examples of docs/samplers.md
    (run as written)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "samplers.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
              if "duplicate_keys=" in b or "global_batch=True" in b]
    assert len(blocks) == 4  # duplicate keys, key sets, near-duplicates, global batches
    for block in blocks:
        exec(compile(block, "docs/samplers.md", "exec"), {})


# ------------------------------------------------------------------ near-duplicate keys
def near_duplicate_reference(x: np.ndarray, threshold: float) -> list[int]:
    """Plain Python, float64: union-find over the pairs with cosine > threshold; each item's
    key is the smallest index of its group."""
    u = x.astype(np.float64)
    u = u / np.linalg.norm(u, axis=1, keepdims=True)
    parent = list(range(len(u)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(u)):
        for j in range(i + 1, len(u)):
            if float(u[i] @ u[j]) > threshold:
                a, b = root(i), root(j)
                parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(u))]


def planted_near_duplicates(n=120, d=16, seed=0):
    """Random rows plus near-copies: chains 3 ~ 40 ~ 41 and groups {5, 60}, {7, 90, 91}."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, d)).astype(np.float32)
    for src, dst in ((3, 40), (40, 41), (5, 60), (7, 90), (7, 91)):
        x[dst] = x[src] + 0.05 * r.standard_normal(d).astype(np.float32)
    return x


@pytest.mark.parametrize("threshold", [0.99, 0.95, 0.9, 0.5, 0.2])
def test_near_duplicate_keys_equal_a_float64_union_find(threshold):
    x = planted_near_duplicates()
    keys = hb.near_duplicate_keys(x, threshold)
    assert keys.dtype == np.int64 and keys.shape == (len(x),)
    assert keys.tolist() == near_duplicate_reference(x, threshold)


def test_near_duplicate_keys_join_chains_and_groups():
    x = planted_near_duplicates()
    keys = hb.near_duplicate_keys(torch.from_numpy(x), 0.95)
    assert keys[40] == keys[41] == 3 and keys[60] == 5 and keys[90] == keys[91] == 7
    assert sum(k != i for i, k in enumerate(keys)) == 5  # nothing else is grouped


def test_near_duplicate_keys_ivf_finds_the_planted_groups():
    x = planted_near_duplicates(n=600, d=32, seed=1)
    exact = hb.near_duplicate_keys(x, 0.95)
    ivf = hb.near_duplicate_keys(x, 0.95, method="ivf", nlist=8, nprobe=8)  # probes every list
    assert ivf.tolist() == exact.tolist()


@pytest.mark.parametrize("kind", ["uniform", "gcbs", "proximity", "knn"])
def test_near_duplicate_keys_keep_near_copies_out_of_one_batch(kind):
    x = planted_near_duplicates(n=240, d=16, seed=2)
    keys = hb.near_duplicate_keys(x, 0.95)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    make_sampler = {"uniform": lambda: hb.UniformBatchSampler(len(x), 16, seed=0,
                                                               duplicate_keys=keys),
                    "gcbs": lambda: hb.GCBSSampler(x, 16, duplicate_keys=keys),
                    "proximity": lambda: hb.ProximityGraphSampler(
                        x, 16, candidates=60, neighbors=8, duplicate_keys=keys),
                    "knn": lambda: hb.KNNBatchSampler(x, 16, refresh_every=None,
                                                      duplicate_keys=keys)}[kind]
    for batch in make_sampler():
        b = np.asarray(batch)
        sims = u[b] @ u[b].T
        np.fill_diagonal(sims, -1)
        assert sims.max() <= 0.95 and len(set(keys[b].tolist())) == len(b)


@pytest.mark.parametrize("bad, match", [
    (dict(threshold=1.0), "threshold=1.0 must lie in"),
    (dict(threshold=float("nan")), "threshold"),
    (dict(method="annoy"), "method"),
])
def test_near_duplicate_keys_reject_bad_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        hb.near_duplicate_keys(planted_near_duplicates(), **{"threshold": 0.9, **bad})


def test_near_duplicate_keys_reject_bad_embeddings():
    x = planted_near_duplicates()
    x[4, 2] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        hb.near_duplicate_keys(x)
    with pytest.raises(ValueError, match="embeddings"):
        hb.near_duplicate_keys(np.zeros(5, np.float32))
