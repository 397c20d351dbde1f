"""CommunityBatchSampler at scale (issue 46): the cell-local build (``cells.items``; automatic
above AUTO_CELLS_ABOVE items) and ``cells.batches``, one constructor option ``cells=``
(``CommunityCells``); the same plan for
the same seed, the options in the sampler's state, and a build that would not fit memory
failing before it allocates (ClusterBatchSampler's: test_cluster_sampler_scale.py)."""

import logging

import numpy as np
import pytest

import hardbatch as hb
from hardbatch import _memory
from hardbatch.samplers import community_sampler as community_module

B = 32
CELLS_400 = hb.CommunityCells(items=400)


def batches(sampler) -> list[list[int]]:
    return [list(map(int, b)) for b in sampler]


def test_cell_local_build_is_a_deterministic_partition(emb, caplog):
    with caplog.at_level(logging.INFO, logger="hardbatch.samplers"):
        sampler = hb.CommunityBatchSampler(emb, B, cells=CELLS_400, seed=3)
        plan = batches(sampler)
    assert "cell-local, cells of ~400 items" in caplog.text
    assert sampler.cell_items_used == 400 and sampler.cell_labels is None
    assert sorted(i for b in plan for i in b) == list(range(1000))
    assert plan == batches(hb.CommunityBatchSampler(emb, B, cells=CELLS_400, seed=3))
    assert plan != batches(hb.CommunityBatchSampler(emb, B, cells=CELLS_400, seed=4))
    labels, pairs, near = sampler.groups
    assert len(np.unique(labels)) == sampler.parts and near.shape == (1000, 16)
    assert sampler.forced_pairs <= 2  # the skipped (cell-local) ranks kept apart


def test_global_build_by_default_at_this_size(emb):
    sampler = hb.CommunityBatchSampler(emb, B, seed=3)
    assert sampler.cells.items is None and sampler.cell_items_used == 0
    global_build = hb.CommunityBatchSampler(emb, B, seed=3, cells=hb.CommunityCells(items=0))
    assert batches(sampler) == batches(global_build)


def test_cells_chosen_automatically_above_the_threshold(emb, monkeypatch):
    monkeypatch.setattr(community_module, "AUTO_CELLS_ABOVE", 900)
    monkeypatch.setattr(community_module, "CELL_ITEMS", 400)
    auto = hb.CommunityBatchSampler(emb, B, seed=3)
    assert auto.cell_items_used == 400
    assert batches(auto) == batches(hb.CommunityBatchSampler(emb, B, seed=3, cells=CELLS_400))


def test_cell_batches_are_a_constructor_option(emb):
    sampler = hb.CommunityBatchSampler(emb, B, seed=2, cells=hb.CommunityCells(batches=2))
    batches(sampler)
    labels = sampler.cell_labels
    assert labels is not None and len(np.unique(labels)) == round(1000 / (2 * B))
    local = hb.CommunityBatchSampler(emb, B, seed=2, cells=hb.CommunityCells(batches=2,
                                                                             items=400))
    assert sorted(i for b in batches(local) for i in b) == list(range(1000))
    assert len(np.unique(local.cell_labels)) >= 12  # 3 cells of ~333 items: ~5 sub-cells each


@pytest.mark.parametrize("cells,match", [
    (lambda: hb.CommunityCells(batches=-1), r"cells=CommunityCells\(batches=-1\).*"
                                            r"use e\.g\. cells=CommunityCells\(batches=2\)"),
    (lambda: hb.CommunityCells(items=-5), r"cells=CommunityCells\(items=-5\).*or None"),
    (lambda: hb.CommunityCells(items=2.5), r"cells=CommunityCells\(items=2\.5\)"),
    (lambda: hb.CommunityBatchSampler(np.eye(40, 8), 8, cells=2),
     r"cells=2 must be None or a CommunityCells: e\.g\. cells=CommunityCells\(batches=2\)"),
])
def test_a_bad_cells_value_names_cells_and_the_fix(cells, match):
    with pytest.raises(ValueError, match=match):
        cells()


@pytest.mark.parametrize("kw,conflict", [
    (dict(batching="trim", communities_per_batch=1), "batching='trim'"),
    (dict(partitioner="kmeans"), "partitioner='kmeans'"),
    (dict(partitioner="kmeans", batching="trim", communities_per_batch=1),
     "partitioner='kmeans' and batching='trim'"),
])
def test_cell_batches_that_would_be_ignored_are_refused(kw, conflict):
    with pytest.raises(ValueError, match=rf"cells=CommunityCells\(batches=2\) runs METIS once "
                                         rf"per k-means cell, .* with {conflict} it would be "
                                         rf"ignored; pass cells=CommunityCells\(items=None\) "
                                         rf"\(batches=0\), or partitioner='metis', "
                                         rf"batching='fill'"):
        hb.CommunityBatchSampler(np.eye(40, 8), 8, skip=1, window=6,
                                 cells=hb.CommunityCells(batches=2), **kw)
    hb.CommunityBatchSampler(np.eye(40, 8), 8, skip=1, window=6, **kw)  # without: accepted


def test_communities_larger_than_the_cells_are_refused_at_construction(emb, monkeypatch):
    # 1000 items in cells of 50: 20 cells, but batches of 64 make round(1000 / 64) = 16
    # communities of 64 items (before: "parts=16 must be >= 20" at the first epoch)
    with pytest.raises(ValueError, match=r"cells.items=50 cuts the N=1000 items into 20 cells "
                                         r".* but batch_size=64 with communities_per_batch=1 "
                                         r"makes 16 communities \(of about 64 items, more than "
                                         r"a cell holds\); use cells=CommunityCells\(items=63\) "
                                         r"or larger, a larger communities_per_batch or a "
                                         r"smaller batch_size"):
        hb.CommunityBatchSampler(emb, 64, 1, cells=hb.CommunityCells(items=50))
    fitting = hb.CommunityBatchSampler(emb, 64, 1, cells=hb.CommunityCells(items=63))
    assert sorted(i for b in batches(fitting) for i in b) == list(range(1000))  # the fix works
    monkeypatch.setattr(community_module, "AUTO_CELLS_ABOVE", 900)
    monkeypatch.setattr(community_module, "CELL_ITEMS", 50)
    with pytest.raises(ValueError, match=r"cells.items=None \(automatic: 50 above 900 items\) "
                                         r"cuts the N=1000 items into 20 cells"):
        hb.CommunityBatchSampler(emb, 64, 1)
    with pytest.raises(ValueError, match=r"20 cells .* makes 15 communities \(of about 64"):
        hb.CommunityBatchSampler.authors(emb, 64, skip=3, window=10)  # trim: 1000 // 64 parts


def test_scale_options_are_in_the_state(emb):
    sampler = hb.CommunityBatchSampler(emb, B, cells=hb.CommunityCells(batches=2, items=400))
    state = sampler.state_dict()
    assert state["cells"] == "CommunityCells(batches=2, items=400)"
    with pytest.raises(ValueError, match=r"cells='CommunityCells\(batches=2, items=400\)'"):
        hb.CommunityBatchSampler(emb, B, cells=hb.CommunityCells(batches=2)).load_state_dict(
            state)


def test_community_build_that_does_not_fit_fails_before_it_allocates(emb, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the build allocated")

    monkeypatch.setattr(community_module, "knn_graph", never)
    monkeypatch.setattr(community_module, "coarse_cells", never)
    monkeypatch.setattr(_memory, "available_bytes", lambda: 100_000)
    with pytest.raises(ValueError, match=r"global build at N=1000, d=16 needs about .*"
                                         r"cells=CommunityCells\(items=5000\)"):
        list(hb.CommunityBatchSampler(emb, B))
    with pytest.raises(ValueError, match=r"cell-local build at N=1000, d=16 .*smaller "
                                         r"cells=CommunityCells\(items=\.\.\.\)"):
        list(hb.CommunityBatchSampler(emb, B, cells=CELLS_400))
