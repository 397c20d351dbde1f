"""GCBS step 2 (hardbatch.batching.gcbs.pairs): the pairs above the threshold, each item's
strongest partners, the units ranks share, and the method names."""

import numpy as np
import pytest
import torch
from gcbs_support import dense_pairs_reference
from support import unit_rows

from hardbatch.batching import gcbs
from hardbatch.batching.gcbs import similarity_threshold, thresholded_pairs


@pytest.mark.parametrize("k", [1, 5])
def test_min_partners_pairs_match_dense_reference(rng, k):
    x = unit_rows(rng, 400, 6)
    y = unit_rows(rng, 400, 6)
    for other in (x, y):
        rows, cols = thresholded_pairs(x, other, 0.9, min_partners=k)
        got = set(zip(rows.tolist(), cols.tolist()))
        want = set(zip(*np.nonzero(dense_pairs_reference(x, other, 0.9, k))))
        assert got == want and len(got) == len(rows)  # no pair twice
        assert np.bincount(rows, minlength=400).min() >= k  # every item has k partners


def test_strongest_partners_only_for_rows_short_of_pairs():
    sims = torch.tensor([[-torch.inf, 0.9, 0.8, 0.1, 0.0],  # two pairs above 0.5: enough
                         [0.9, -torch.inf, 0.3, 0.2, 0.4],  # one: adds its next strongest
                         [0.1, 0.2, -torch.inf, 0.3, -0.5]])  # none: its two strongest
    hit_rows = torch.nonzero(sims > 0.5, as_tuple=True)[0]
    r, c = gcbs.strongest_partners(sims, hit_rows, 2, 0.5)
    assert sorted(zip(r.tolist(), c.tolist())) == [(1, 4), (2, 1), (2, 3)]


def test_min_partners_leaves_no_item_alone_with_every_method(rng):
    pytest.importorskip("faiss")
    x = unit_rows(rng, 1500, 8)
    thr = similarity_threshold(x, x, 0.999)
    for method in ("exact", "ivf", "faiss"):
        rows, _ = thresholded_pairs(x, x, thr, method, nlist=12, nprobe=2, min_partners=4)
        assert np.bincount(rows, minlength=1500).min() >= 4, method
        assert (rows != _).all()
        plain = thresholded_pairs(x, x, thr, method, nlist=12, nprobe=2)
        assert set(zip(*plain)) <= set(zip(rows.tolist(), _.tolist())), method
    exact = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, thr, min_partners=4)]))
    everything = set(zip(*[a.tolist() for a in thresholded_pairs(
        x, x, thr, "ivf", nlist=12, nprobe=12, min_partners=4)]))
    assert everything == exact  # probing every list is exact, partners included


def test_pair_search_units_shard_with_partners(rng):
    x = unit_rows(rng, 800, 6)
    for method in ("exact", "ivf"):
        layout = gcbs.PairSearchLayout(x, x, 0.97, method, nlist=None, nprobe=3, seed=0,
                                   device=None, precision="fp32", min_partners=3)
        whole = set(zip(*[a.tolist() for a in layout.pairs(0, layout.num_units)]))
        cut = layout.num_units // 2
        parts = [layout.pairs(0, cut), layout.pairs(cut, layout.num_units)]
        assert whole == {p for r, c in parts for p in zip(r.tolist(), c.tolist())}


def test_exact_pairs_match_dense(rng):
    x = unit_rows(rng, 150, 5)
    rows, cols = thresholded_pairs(x, x, 0.8)
    s = x @ x.T
    np.fill_diagonal(s, -np.inf)
    ref = set(zip(*np.nonzero(s > 0.8)))
    assert set(zip(rows.tolist(), cols.tolist())) == ref


def test_thresholded_pairs_checks_the_inverted_lists(rng):
    x = unit_rows(rng, 60, 4)
    with pytest.raises(ValueError, match="nlist=-1 must be >= 1"):
        thresholded_pairs(x, x, 0.5, "ivf", nlist=-1)
    with pytest.raises(ValueError, match="nprobe=-2 must be >= 1"):
        thresholded_pairs(x, x, 0.5, "ivf", nprobe=-2)


def test_thresholded_pairs_checks_min_partners(rng):
    x = unit_rows(rng, 20, 4)
    with pytest.raises(ValueError, match="min_partners=20 must lie in"):
        thresholded_pairs(x, x, 0.5, min_partners=20)
    assert len(thresholded_pairs(x, x, 2.0, min_partners=19)[0]) == 20 * 19  # all pairs


def test_resolve_build_options():
    big = gcbs.AUTO_IVF_MAX_ITEMS + 1
    assert gcbs.resolve_build("auto", None, None, big) == (
        "partition", gcbs.DEFAULT_MIN_PARTNERS, -(-big // gcbs.AUTO_CELL_ITEMS))
    assert gcbs.resolve_build("partition", 0, None, 250_000) == ("partition", 0, 3)
    assert gcbs.resolve_build("exact", 3, 0, 10) == ("exact", 3, 0)  # unused: not checked
    with pytest.raises(ValueError, match="partitions=0 must be >= 1"):
        gcbs.resolve_build("partition", 3, 0, 10)
