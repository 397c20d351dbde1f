"""The compiled row top-k of the proximity graph (``neighbors/_row_select.py``) vs ``torch.topk``.

``top_rows`` must give, for every row it does not flag, exactly ``torch.topk(row, k)``'s indices
in ``torch.topk``'s order (mapped through the row's pool), and flag every row whose order it
cannot promise: ties in the top k + 1 values (infinities included), or a NaN anywhere (the
caller re-selects flagged rows with ``torch.topk``). Checked on random rows of every path of the
kernel: sampled bound, its looser retry, every value kept (small M or K > M / 4).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hardbatch.neighbors._row_select import top_rows


def run_top_rows(sims: np.ndarray, k: int, g: int = 1, seed: int = 0):
    """``top_rows`` on ``sims`` with random pools and a shuffled destination table."""
    rows, m = sims.shape
    rng = np.random.default_rng(seed)
    pools = np.stack([rng.permutation(10 * m)[:m] for _ in range(-(-rows // g))]).astype(np.int32)
    dest = rng.permutation(rows).astype(np.int64)
    out = np.full((rows, k), -7, np.int64)
    tied = np.full(rows, 9, np.uint8)  # every entry is overwritten
    n_tied = top_rows(np.ascontiguousarray(sims), dest, pools, g, k, out, tied)
    return out, tied, n_tied, pools, dest


def torch_reference(sims: np.ndarray, k: int, g: int, pools: np.ndarray, dest: np.ndarray):
    """``torch.topk``'s neighbours of every row, at the rows' destinations."""
    top = torch.from_numpy(sims).topk(k, dim=1, sorted=True).indices.numpy()
    ids = np.take_along_axis(pools[np.arange(len(sims)) // g], top, axis=1)
    ref = np.empty_like(ids, dtype=np.int64)
    ref[dest] = ids
    return ref


def must_flag(sims: np.ndarray, k: int) -> np.ndarray:
    """Rows whose top k + 1 values hold two equal ones (infinities included), or holding a NaN."""
    srt = -np.sort(-np.where(np.isnan(sims), -np.inf, sims), axis=1)[:, :k + 1]
    tie = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    return tie | np.isnan(sims).any(axis=1)


def check_against_torch(sims: np.ndarray, k: int, g: int = 1, seed: int = 0) -> np.ndarray:
    out, tied, n_tied, pools, dest = run_top_rows(sims, k, g, seed)
    ref = torch_reference(sims, k, g, pools, dest)
    flagged = tied.astype(bool)
    assert set(np.unique(tied)) <= {0, 1} and n_tied == int(flagged.sum())
    np.testing.assert_array_equal(flagged, must_flag(sims, k))
    np.testing.assert_array_equal(out[dest[~flagged]], ref[dest[~flagged]])
    return flagged


@pytest.mark.parametrize("rows,m,k,g", [
    (300, 1000, 100, 50),  # the graph's default: sampled bound (M >= 256, 4K <= M)
    (200, 600, 50, 7),     # sampled, M not a multiple of g
    (100, 256, 64, 1),     # sampled, the smallest M that samples
    (200, 400, 150, 3),    # K > M / 4: every value kept
    (100, 100, 99, 1),     # K = M - 1
    (60, 17, 1, 4),        # tiny rows, K = 1
])
def test_random_rows_equal_torch_topk(rows, m, k, g):
    rng = np.random.default_rng(rows + m + k)
    for sims in (rng.standard_normal((rows, m)).astype(np.float32),
                 rng.random((rows, m), dtype=np.float32) ** 8,      # skewed: few large values
                 -np.abs(rng.standard_normal((rows, m))).astype(np.float32) * 1e30):
        assert not check_against_torch(sims, k, g).any()


def test_the_sampled_bound_retries_and_falls_back():
    """Rows whose strided sample over-estimates the k-th value (the sampled values are the
    row's largest): the bound keeps fewer than k values, the looser bound or every value is
    used, and the result is still torch.topk's."""
    m, k = 1024, 200
    rng = np.random.default_rng(3)
    sims = rng.standard_normal((50, m)).astype(np.float32)
    step = m // 64
    sims[:25, ::step] += 100.0  # the 64 sampled values dominate: the bound keeps ~rank values
    sims[25:, ::step] = np.linspace(50, 10, 64, dtype=np.float32)  # ordered samples
    assert not check_against_torch(sims, k).any()
    # the first bound (rank-th sample) keeps too few, the looser one (2 rank-th) enough
    k = 100
    sims = rng.standard_normal((20, m)).astype(np.float32)
    sims[:, ::step] = -9.0
    sims[:, :12 * step:step] = np.linspace(20, 10, 12, dtype=np.float32)
    assert not check_against_torch(sims, k).any()


@pytest.mark.parametrize("levels", [2, 5, 50])
def test_ties_are_flagged_and_others_exact(levels):
    """Quantised values: rows with ties in their top k + 1 are flagged (torch.topk re-selects
    them), every other row is torch.topk's."""
    rng = np.random.default_rng(levels)
    sims = (rng.integers(0, levels, (400, 500)) / levels).astype(np.float32)
    sims[::2] += rng.standard_normal((200, 500)).astype(np.float32) * 1e-3  # tie-free rows
    flagged = check_against_torch(sims, 40)
    assert flagged[1::2].all() and not flagged[::2].all()


def test_equal_rows_and_signed_zeros():
    sims = np.zeros((4, 300), np.float32)
    sims[1] = -0.0
    sims[2, 7] = 1.0  # one distinct value, then ties
    sims[3] = np.arange(300, dtype=np.float32)[::-1]  # distinct, decreasing
    flagged = check_against_torch(sims, 10)
    assert flagged.tolist() == [True, True, True, False]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_values(value):
    """Similarities that overflowed: a NaN anywhere flags its row (the caller's torch.topk
    decides: NaN counts as the largest there); infinities are ordered as torch.topk orders
    them (flagged only when tied in the top k + 1); finite rows are unaffected."""
    rng = np.random.default_rng(1)
    sims = rng.standard_normal((120, 800)).astype(np.float32)
    sims[5, 3] = value          # one value
    sims[6, 799] = value        # the last value
    sims[7, rng.permutation(800)[:20]] = value  # 20 equal ones
    sims[8, ::12] = value       # every sampled position
    flagged = check_against_torch(sims, 30)
    expect = {"nan": [5, 6, 7, 8], "inf": [7, 8], "-inf": []}[str(value)]
    assert np.flatnonzero(flagged).tolist() == expect


def test_rows_without_destination_are_skipped():
    rng = np.random.default_rng(2)
    sims = rng.standard_normal((6, 300)).astype(np.float32)
    pools = np.arange(300, dtype=np.int32)[None].repeat(6, 0)
    out = np.full((6, 5), -1, np.int64)
    tied = np.zeros(6, np.uint8)
    dest = np.array([0, -1, 2, -1, 4, 5])
    assert top_rows(sims, dest, pools, 1, 5, out, tied) == 0
    assert (out[[1, 3]] == -1).all()
    ref = torch.from_numpy(sims).topk(5, dim=1).indices.numpy()
    np.testing.assert_array_equal(out[[0, 2, 4, 5]], ref[[0, 2, 4, 5]])


def test_the_graph_reselects_non_finite_rows(monkeypatch):
    """Through the graph: the flagged rows of a block are re-selected by torch.topk, so a
    similarity that overflows to inf gives torch's neighbours (embeddings themselves must be
    finite: checked before)."""
    import hardbatch as hb
    from hardbatch.neighbors.knn_graph import candidate_pools

    rng = np.random.default_rng(4)
    x = rng.standard_normal((600, 8)).astype(np.float32)
    x[:3] *= np.float32(3e19)  # products of these rows with each other overflow to +-inf
    m, k = 300, 20
    g = hb.neighbors.proximity_pools.default_group_size(m, 600)
    members, pools = candidate_pools(600, m, g, seed=1)
    xt = torch.from_numpy(x)
    sims = torch.bmm(xt[torch.from_numpy(members).clamp(min=0)],
                     xt[torch.from_numpy(pools.astype(np.int64))].transpose(1, 2))
    assert not torch.isfinite(sims).all()  # the case is exercised
    ids = torch.gather(torch.from_numpy(pools.astype(np.int64)).unsqueeze(1)
                       .expand(-1, members.shape[1], -1), 2, sims.topk(k, dim=2).indices)
    ref = torch.empty((600, k), dtype=torch.int64)
    valid = torch.from_numpy(members) >= 0
    ref[torch.from_numpy(members)[valid]] = ids[valid]
    assert torch.equal(hb.proximity_graph(x, m, k, seed=1), ref)


@pytest.mark.parametrize("copies,precision", [(1, "fp32"), (3, "fp32"), (1, "bf16")])
def test_the_torch_path_of_other_devices_gives_the_same_graph(copies, precision):
    """The selection other devices run (gather by ``index_select``, ``torch.topk`` of every
    row), run here on the CPU, gives the compiled build's graph (ties: repeated rows)."""
    from hardbatch.neighbors.knn_graph import ProximityGraphLayout

    rng = np.random.default_rng(copies)
    x = np.repeat(rng.standard_normal((1500 // copies, 12)).astype(np.float32), copies, axis=0)
    layout = ProximityGraphLayout(x, 400, 30, 3, None, None, precision)
    compiled = layout.rows(0, layout.num_blocks)
    layout.compiled = False
    assert torch.equal(layout.rows(0, layout.num_blocks), compiled)
