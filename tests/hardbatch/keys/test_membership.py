"""hardbatch.keys.membership: the keys some items hold, the candidates free of them, and the
kernels that walks and kNN batches use to skip an item whose key is already in the batch.

References: a greedy float64 / float32 kNN batch over candidates free of the batch's keys; walks
with every item keyed apart equal walks without keys."""

import numpy as np
import torch
from keys_support import copies_keys, with_copies
from sampler_support import N, chain_sets, near_conflicts

import hardbatch as hb
from hardbatch.keys.encode import encode_keys
from hardbatch.keys.membership import (
    batch_keys,
    first_free,
    free_of,
    item_free,
    item_keys,
    keys_free,
    mark_keys,
)


def test_item_keys_and_free_of():
    sets = [frozenset(s) for s in ({"a", "b"}, {"b"}, {"c", "a"}, {"d"}, {"c"})]
    keys = encode_keys(sets, 5)
    held = item_keys(keys.ptr, keys.idx, np.array([0]))
    assert sorted(keys.values[k] for k in held) == ["a", "b"]
    free = free_of(keys.ptr, keys.idx, np.arange(5), item_keys(keys.ptr, keys.idx, [0]))
    assert free.tolist() == [3, 4] and keys.compatible(np.arange(5), [4]).tolist() == [0, 1, 3]


def test_walk_kernel_with_every_item_keyed_apart_equals_no_keys(emb):
    graph = hb.knn_graph(emb, 10)
    for walk in ("rwr", "rw", "bfs", "dfs"):
        plain = hb.walk_batches(graph, 32, 6, walk=walk, seed=3)
        keyed = hb.walk_batches(graph, 32, 6, walk=walk, seed=3,
                                key_ids=torch.arange(N) * 7 - 1)  # all distinct (one -1)
        assert torch.equal(plain, keyed), walk


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


def test_batch_kernels_agree_with_free_of():
    """``first_free`` takes exactly the candidates that ``free_of`` leaves after the keys of those
    taken before; ``item_free`` also refuses an item already in the batch."""
    sets = chain_sets(n=200, k=3, seed=2)
    keys = encode_keys(sets, 200)
    walk = batch_keys(200, key_sets=(keys.ptr, keys.idx))
    candidates = np.random.default_rng(1).permutation(np.arange(1, 200))
    out = np.empty(30, np.int64)
    placed = first_free(0, candidates, 30, walk, 4, out)
    expected = [0]
    for c in candidates.tolist():
        if len(expected) == 30:
            break
        if free_of(keys.ptr, keys.idx, [c], item_keys(keys.ptr, keys.idx, expected)).size:
            expected.append(c)
    assert out[:placed].tolist() == expected
    stamp = np.full(200, -1, np.int64)
    stamp[expected] = 4
    taken = item_keys(keys.ptr, keys.idx, expected)
    for v in range(200):
        free = free_of(keys.ptr, keys.idx, [v], taken).size > 0
        assert keys_free(v, 4, walk) == free
        assert item_free(v, stamp, 4, walk) == (free and v not in expected)
    mark_keys(expected[0], 5, walk)
    assert not keys_free(expected[0], 5, walk)
