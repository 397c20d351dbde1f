"""The inverted-file search (hardbatch.neighbors.ivf): lists, probed blocks, recall, and the exact
search it becomes when every list is probed (a dense NumPy reference)."""

import numpy as np
import pytest
import torch
from support import unit_rows

from hardbatch.batching.gcbs import thresholded_pairs
from hardbatch.neighbors.ivf import inverted_lists, probed_blocks


def ivf_top_k(x, y, k, nlist, nprobe, seed=0):
    """Each row's k largest ``x_i . y_j`` (j != i) among the columns its list probes."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    out = np.full((len(x), k), -1, np.int64)
    for rows, cols, self_col in probed_blocks(inverted_lists(xt, yt, nlist, nprobe, seed), 0,
                                              nlist):
        if len(rows) == 0:
            continue
        sims = (x[rows.numpy()].astype(np.float64) @ y[cols.numpy()].T.astype(np.float64))
        mine = self_col.numpy() >= 0
        sims[np.flatnonzero(mine), self_col.numpy()[mine]] = -np.inf
        out[rows.numpy()] = cols.numpy()[np.argsort(-sims, axis=1, kind="stable")[:, :k]]
    return out


@pytest.mark.parametrize("paired", [False, True])
def test_probing_every_list_is_the_exact_search(rng, paired):
    x = unit_rows(rng, 500, 8)
    y = unit_rows(rng, 500, 8) if paired else x
    s = x.astype(np.float64) @ y.T.astype(np.float64)
    np.fill_diagonal(s, -np.inf)
    exact = np.argsort(-s, axis=1, kind="stable")[:, :10]
    got = ivf_top_k(x, y, 10, nlist=7, nprobe=7)
    assert (np.sort(got, axis=1) == np.sort(exact, axis=1)).all()
    fewer = ivf_top_k(x, y, 10, nlist=7, nprobe=2)  # approximate, but mostly right
    hits = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(fewer, exact)])
    assert 0.3 < hits < 1


def test_lists_cover_every_item_once_and_blocks_locate_the_rows(rng):
    x = unit_rows(rng, 300, 6)
    y = unit_rows(rng, 300, 6)
    for cols_of in (x, y):
        lists = inverted_lists(torch.from_numpy(x), torch.from_numpy(cols_of), 9, 3, seed=1)
        assert lists.probe.shape == (9, 3) and (lists.probe[:, 0] == torch.arange(9)).all()
        assert sorted(lists.col_order.tolist()) == list(range(300)) == sorted(
            lists.row_order.tolist())
        assert lists.col_start[-1] == lists.row_start[-1] == 300
        seen = []
        for c, (rows, cols, self_col) in enumerate(probed_blocks(lists, 0, 9)):
            seen += rows.tolist()
            probed = [lists.col_order[lists.col_start[p]:lists.col_start[p + 1]]
                      for p in lists.probe[c].tolist()]
            assert torch.equal(cols, torch.cat(probed))
            for r, s in zip(rows.tolist(), self_col.tolist()):  # the row's own column, or -1
                assert (s == -1 and r not in cols.tolist()) or cols[s] == r
        assert sorted(seen) == list(range(300))


def test_ivf_pairs_are_a_subset_with_high_recall(rng):
    x = unit_rows(rng, 2000, 8)
    exact = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, 0.9)]))
    approx = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, 0.9, "ivf", nprobe=8)]))
    assert approx <= exact and len(approx) > 0.8 * len(exact)
    everything = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, 0.9, "ivf", nlist=10,
                                                                   nprobe=10)]))
    assert everything == exact  # probing every list is exact
