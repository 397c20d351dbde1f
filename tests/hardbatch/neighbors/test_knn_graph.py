import numpy as np
import pytest
import torch
from support import unit_rows

import hardbatch as hb
from hardbatch.neighbors.knn_graph import candidate_pools


def dense_topk_reference(x, members, pools, k):
    """Plain NumPy: for each member, the k candidates of its pool with the largest inner product."""
    n = x.shape[0]
    out = np.full((n, k), -1, np.int64)
    for grp, pool in zip(members, pools):
        for item in grp:
            if item < 0:
                continue
            sims = np.array([float(np.dot(x[item], x[c])) for c in pool])
            order = np.argsort(-sims, kind="stable")[:k]
            out[item] = np.asarray(pool)[order]
    return out


@pytest.mark.parametrize("group_size", [1, 3, 8])
def test_proximity_graph_matches_dense_reference(rng, group_size):
    x = unit_rows(rng, 300, 16)
    m, k = 60, 7
    graph = hb.proximity_graph(x, candidates=m, neighbors=k, seed=5, group_size=group_size)
    members, pools = candidate_pools(300, m, group_size, seed=5)
    ref = dense_topk_reference(x, members, pools.astype(np.int64), k)
    assert graph.dtype == torch.int64 and graph.shape == (300, k)
    np.testing.assert_array_equal(graph.numpy(), ref)


@pytest.mark.parametrize("n,m,g", [(500, 100, 8), (130, 100, 30), (1000, 999, 1), (64, 40, 24)])
def test_candidate_pools_are_valid(n, m, g):
    members, pools = candidate_pools(n, m, g, seed=3)
    flat = members.reshape(-1)
    assert sorted(flat[flat >= 0].tolist()) == list(range(n))
    for grp, pool in zip(members, pools):
        assert len(set(pool.tolist())) == m  # M distinct
        assert not set(pool.tolist()) & set(grp[grp >= 0].tolist())  # never a group member
        assert pool.min() >= 0 and pool.max() < n


def test_candidate_counts_match_independent_scheme_moments():
    # Under independent draws, #items having j as candidate is ~Poisson(M): mean M, variance M.
    n, m, g = 4000, 400, 16
    members, pools = candidate_pools(n, m, g, seed=11)
    sizes = (members >= 0).sum(axis=1)
    counts = np.bincount(pools.astype(np.int64).reshape(-1), weights=np.repeat(sizes, m),
                         minlength=n)
    assert abs(counts.mean() - m) / m < 0.01
    assert 0.85 < counts.var() / m < 1.15


def independent_graph(x, m, k, seed):
    """Literal scheme: every item draws its own M candidates among the others."""
    n = x.shape[0]
    r = np.random.default_rng(seed)
    out = np.empty((n, k), np.int64)
    sims_out = np.empty((n, k), np.float32)
    for s in range(0, n, 512):
        idx = np.arange(s, min(n, s + 512))
        cand = np.stack([r.choice(n - 1, m, replace=False) for _ in idx])
        cand = cand + (cand >= idx[:, None])  # skip self
        sims = np.einsum("bd,bmd->bm", x[idx], x[cand])
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        out[idx] = np.take_along_axis(cand, top, 1)
        sims_out[idx] = np.take_along_axis(sims, top, 1)
    return out, sims_out


@pytest.mark.slow
def test_shared_pools_statistically_equivalent_on_real_data(mnist_pca):
    x = mnist_pca[0][:20000]
    m, k = 1000, 100
    stds_ind, sims_ind, stds_hb, sims_hb = [], [], [], []
    for seed in range(2):
        g_ind, s_ind = independent_graph(x, m, k, seed)
        stds_ind.append(np.bincount(g_ind.reshape(-1), minlength=len(x)).std())
        sims_ind.append(s_ind.mean())
        g = hb.proximity_graph(x, m, k, seed=seed).numpy()  # default group size 32
        stds_hb.append(np.bincount(g.reshape(-1), minlength=len(x)).std())
        sims_hb.append(np.einsum("nd,nkd->nk", x, x[g]).mean())
    assert abs(np.mean(stds_hb) / np.mean(stds_ind) - 1) < 0.04
    assert abs(np.mean(sims_hb) / np.mean(sims_ind) - 1) < 0.01


def test_proximity_graph_rows_sorted_and_valid(rng):
    x = unit_rows(rng, 400, 8)
    g = hb.proximity_graph(torch.from_numpy(x), 50, 10, seed=1).numpy()
    for i, row in enumerate(g):
        assert i not in row and len(set(row.tolist())) == 10
        sims = x[row] @ x[i]
        assert np.all(np.diff(sims) <= 1e-6)


def test_proximity_graph_deterministic(rng):
    x = unit_rows(rng, 500, 8)
    a = hb.proximity_graph(x, 100, 10, seed=7)
    b = hb.proximity_graph(x.copy(), 100, 10, seed=7)
    c = hb.proximity_graph(x, 100, 10, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)


def gather_topk_reference(x, members, pools, k):
    """The build before issue 33: per-group gather, batched product, ``torch.topk``."""
    xt = torch.from_numpy(x)
    out = torch.empty((x.shape[0], k), dtype=torch.int64)
    pools = torch.from_numpy(pools.astype(np.int64))
    members = torch.from_numpy(members)
    cand = xt[pools]  # [G, M, d]
    sims = torch.bmm(xt[members.clamp(min=0)], cand.transpose(1, 2))
    ids = torch.gather(pools.unsqueeze(1).expand(-1, members.shape[1], -1), 2,
                       sims.topk(k, dim=2, sorted=True).indices)
    valid = members >= 0
    out[members[valid]] = ids[valid]
    return out


@pytest.mark.parametrize("n,d,m,k,group_size,copies", [
    (2000, 8, 600, 50, None, 1),    # sampled bound (M >= 256, 4K <= M)
    (2000, 8, 600, 50, 7, 4),       # exact ties (each row 4 times), M % g != 0
    (1200, 6, 400, 150, None, 3),   # K > M / 4: every value is sorted
    (600, 4, 300, 299, 1, 2),       # K = M - 1, independent pools
])
def test_proximity_graph_equals_gather_and_torch_topk(rng, monkeypatch, n, d, m, k, group_size,
                                                      copies):
    """The compiled selection gives torch.topk's neighbours in torch.topk's order, ties included,
    whatever the number of worker threads."""
    x = np.repeat(unit_rows(rng, n // copies, d), copies, axis=0)
    g = group_size or hb.neighbors.proximity_pools.default_group_size(m, n)
    members, pools = candidate_pools(n, m, g, seed=2)
    ref = gather_topk_reference(x, members, pools, k)
    threads = torch.get_num_threads()
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            graph = hb.proximity_graph(x, m, k, seed=2, group_size=group_size)
            assert torch.get_num_threads() == t
            assert torch.equal(graph, ref)
    finally:
        torch.set_num_threads(threads)


def test_proximity_graph_half_precision_close_to_fp32(rng):
    x = unit_rows(rng, 1500, 16)
    fp32 = hb.proximity_graph(x, 400, 20, seed=0).numpy()
    bf16 = hb.proximity_graph(x, 400, 20, seed=0, precision="bf16").numpy()
    same = np.mean([len(set(a) & set(b)) / 20 for a, b in zip(fp32, bf16)])
    assert same > 0.9


def test_candidates_control_similarity(rng):
    # Proposition 1: larger M -> more similar neighbours; M close to N -> kNN graph.
    x = unit_rows(rng, 2000, 8)
    mean_sim = []
    for m in (20, 200, 1999 - 32):
        g = hb.proximity_graph(x, m, 10, seed=0).numpy()
        mean_sim.append(np.einsum("nd,nkd->nk", x, x[g]).mean())
    knn = hb.knn_graph(x, 10).numpy()
    knn_sim = np.einsum("nd,nkd->nk", x, x[knn]).mean()
    assert mean_sim[0] < mean_sim[1] < mean_sim[2] <= knn_sim + 1e-6


def test_knn_graph_matches_dense_argsort(rng):
    x = unit_rows(rng, 257, 12)
    g = hb.knn_graph(x, 9).numpy()
    sims = x.astype(np.float64) @ x.T.astype(np.float64)
    np.fill_diagonal(sims, -np.inf)
    ref = np.argsort(-sims, axis=1)[:, :9]
    np.testing.assert_array_equal(g, ref)


@pytest.mark.parametrize("kwargs,match", [
    (dict(candidates=10, neighbors=10), "neighbors=10 must be smaller than candidates"),
    (dict(candidates=10, neighbors=20), "neighbors=20 must be smaller than candidates"),
    (dict(candidates=100, neighbors=5), "candidates=100 must be smaller than the number of items"),
    (dict(candidates=0, neighbors=5), "candidates=0 must be >= 1"),
    (dict(candidates=10, neighbors=2.5), "neighbors must be an integer"),
])
def test_proximity_graph_bad_parameters(rng, kwargs, match):
    with pytest.raises(ValueError, match=match):
        hb.proximity_graph(unit_rows(rng, 100, 4), **kwargs)


@pytest.mark.parametrize("bad,match", [
    (np.zeros(10, np.float32), "2-D"),
    (np.zeros((4, 5, 6), np.float32), "2-D"),
    (np.zeros((0, 4), np.float32), "empty"),
    (np.zeros((5, 0), np.float32), "empty"),
    (np.array([["a", "b"], ["c", "d"]]), "numbers"),
])
def test_graph_bad_shapes(bad, match):
    with pytest.raises(ValueError, match=match):
        hb.proximity_graph(bad, 2, 1)
    with pytest.raises(ValueError, match=match):
        hb.knn_graph(bad, 1)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_graph_rejects_non_finite(rng, value):
    x = unit_rows(rng, 50, 4)
    x[17, 2] = value
    with pytest.raises(ValueError, match="NaN or inf .*row 17"):
        hb.proximity_graph(x, 20, 5)
    with pytest.raises(ValueError, match="NaN or inf"):
        hb.knn_graph(torch.from_numpy(x), 5)


def test_knn_graph_bad_k(rng):
    with pytest.raises(ValueError, match="neighbors=10 must be smaller than the number of items"):
        hb.knn_graph(unit_rows(rng, 10, 3), 10)


@pytest.mark.parametrize("d,group_size", [(40, 2), (40, None), (6, 8)])
def test_blocks_bound_gathered_candidates_and_do_not_change_the_graph(rng, monkeypatch, d,
                                                                        group_size):
    import hardbatch._device as hbdevice
    import hardbatch.neighbors.knn_graph as hbgraph
    from hardbatch._device import shard_range
    from hardbatch.neighbors.knn_graph import ProximityGraphLayout

    x = unit_rows(rng, 400, d)
    m, k = 60, 7
    members, pools = candidate_pools(400, m, group_size or hbgraph.default_group_size(m, 400), 5)
    ref = dense_topk_reference(x, members, pools.astype(np.int64), k)
    for elements in (1 << 22, 6000, 2000, 1):
        monkeypatch.setattr(hbdevice, "BLOCK_ELEMENTS_CPU", elements)
        layout = ProximityGraphLayout(x, m, k, 5, group_size, None, "fp32")
        if layout.per_block > 1:  # similarities and gathered candidate floats both bounded
            assert layout.per_block * layout.g * m <= elements
            assert layout.per_block * m * d <= elements
        np.testing.assert_array_equal(hb.proximity_graph(x, m, k, seed=5,
                                                         group_size=group_size).numpy(), ref)
        # the sharded build (sharded_proximity_graph) cuts the same blocks into rank ranges
        for world in (2, 3):
            rows = torch.cat([layout.rows(*shard_range(layout.num_blocks, r, world))
                              for r in range(world)])
            np.testing.assert_array_equal(layout.assemble(rows).numpy(), ref)


def test_wide_embeddings_are_gathered_in_small_blocks():
    from hardbatch.neighbors.knn_graph import ProximityGraphLayout

    # N=3000, M=1000, d=128, g=1: the candidates of one block were 1.9 GB of floats.
    x = np.zeros((3000, 128), np.float32)
    x[:, 0] = 1
    layout = ProximityGraphLayout(x, 1000, 10, 0, 1, None, "fp32")
    assert layout.per_block * 1000 * 128 * 4 <= 16 * 2**20  # at most 4M floats (16 MiB)


def test_graph_layouts_read_a_tensor_in_place(rng):
    """A float32 tensor is checked where it lives and used without a copy (a CUDA tensor never
    visits the host); other inputs give the same graphs as their float32 array."""
    from hardbatch.neighbors.knn_graph import KNNGraphLayout, ProximityGraphLayout
    x = torch.from_numpy(unit_rows(rng, 200, 8))
    layout = ProximityGraphLayout(x, 40, 5, 0, None, None, "fp32")
    assert layout.x.data_ptr() == x.data_ptr()
    assert KNNGraphLayout(x, 5, "exact", None, "fp32", None, 16, 0).x.data_ptr() == x.data_ptr()
    for other in (x.double(), x.numpy(), x.numpy().astype(np.float64)):
        assert torch.equal(hb.proximity_graph(other, 40, 5, seed=1),
                           hb.proximity_graph(x, 40, 5, seed=1))
        assert torch.equal(hb.knn_graph(other, 5), hb.knn_graph(x, 5))
