"""hardbatch.keys.derive: keys computed from data.

References: connected components (BFS) for rows sharing values, a float64 union-find for
near-duplicates, brute-force pairs for the graph of items sharing a key."""

import itertools

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch.keys.derive import same_key_graph, shared_value_keys


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


def test_same_key_graph_joins_exactly_the_items_sharing_a_key():
    ids = np.random.default_rng(4).integers(-1, 6, 40)
    g = same_key_graph(ids)
    edges = {(int(i), int(j)) for i, j in zip(*g.nonzero())}
    assert edges == {(i, j) for i, j in itertools.permutations(range(40), 2)
                     if ids[i] == ids[j] >= 0}
    assert set(g.data.tolist()) <= {1} and g.has_sorted_indices
    assert same_key_graph(np.full(5, -1)).nnz == 0
