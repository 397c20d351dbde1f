"""CommunityBatchSampler at scale (issue 46): the cell-local build (``cell_items``; automatic
above AUTO_CELLS_ABOVE items) and ``cell_batches`` as a constructor option; the same plan for
the same seed, the options in the sampler's state, and a build that would not fit memory
failing before it allocates (ClusterBatchSampler's: test_cluster_sampler_scale.py)."""

import logging

import numpy as np
import pytest

import hardbatch as hb
from hardbatch import _memory
from hardbatch.samplers import community_sampler as community_module

B = 32


def batches(sampler) -> list[list[int]]:
    return [list(map(int, b)) for b in sampler]


def test_cell_local_build_is_a_deterministic_partition(emb, caplog):
    with caplog.at_level(logging.INFO, logger="hardbatch.samplers"):
        sampler = hb.CommunityBatchSampler(emb, B, cell_items=400, seed=3)
        plan = batches(sampler)
    assert "cell-local, cells of ~400 items" in caplog.text
    assert sampler.cell_items_used == 400 and sampler.cells is None
    assert sorted(i for b in plan for i in b) == list(range(1000))
    assert plan == batches(hb.CommunityBatchSampler(emb, B, cell_items=400, seed=3))
    assert plan != batches(hb.CommunityBatchSampler(emb, B, cell_items=400, seed=4))
    labels, pairs, near = sampler.groups
    assert len(np.unique(labels)) == sampler.parts and near.shape == (1000, 16)
    assert sampler.forced_pairs <= 2  # the skipped (cell-local) ranks kept apart


def test_global_build_by_default_at_this_size(emb):
    sampler = hb.CommunityBatchSampler(emb, B, seed=3)
    assert sampler.cell_items is None and sampler.cell_items_used == 0
    assert batches(sampler) == batches(hb.CommunityBatchSampler(emb, B, seed=3, cell_items=0))


def test_cells_chosen_automatically_above_the_threshold(emb, monkeypatch):
    monkeypatch.setattr(community_module, "AUTO_CELLS_ABOVE", 900)
    monkeypatch.setattr(community_module, "CELL_ITEMS", 400)
    auto = hb.CommunityBatchSampler(emb, B, seed=3)
    assert auto.cell_items_used == 400
    assert batches(auto) == batches(hb.CommunityBatchSampler(emb, B, seed=3, cell_items=400))


def test_cell_batches_is_a_constructor_option(emb):
    sampler = hb.CommunityBatchSampler(emb, B, seed=2, cell_batches=2)
    plan = batches(sampler)
    assert sampler.cells is not None and len(np.unique(sampler.cells)) == round(1000 / (2 * B))
    attribute = hb.CommunityBatchSampler(emb, B, seed=2)
    attribute.cell_batches = 2  # what tests and benchmarks set before it was an option
    assert batches(attribute) == plan
    local = hb.CommunityBatchSampler(emb, B, seed=2, cell_batches=2, cell_items=400)
    assert sorted(i for b in batches(local) for i in b) == list(range(1000))
    assert len(np.unique(local.cells)) >= 12  # 3 cells of ~333 items: ~5 sub-cells each
    with pytest.raises(ValueError, match="cell_batches"):
        hb.CommunityBatchSampler(emb, B, cell_batches=-1)
    with pytest.raises(ValueError, match="cell_items"):
        hb.CommunityBatchSampler(emb, B, cell_items=-5)


def test_scale_options_are_in_the_state(emb):
    sampler = hb.CommunityBatchSampler(emb, B, cell_items=400, cell_batches=2)
    state = sampler.state_dict()
    assert state["cell_items"] == 400 and state["cell_batches"] == 2
    with pytest.raises(ValueError, match="cell_items=400"):
        hb.CommunityBatchSampler(emb, B, cell_batches=2).load_state_dict(state)


def test_community_build_that_does_not_fit_fails_before_it_allocates(emb, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the build allocated")

    monkeypatch.setattr(community_module, "knn_graph", never)
    monkeypatch.setattr(community_module, "coarse_cells", never)
    monkeypatch.setattr(_memory, "available_bytes", lambda: 100_000)
    with pytest.raises(ValueError, match=r"global build at N=1000, d=16 needs about .*"
                                         r"cell_items= \(e\.g\. 10000"):
        list(hb.CommunityBatchSampler(emb, B))
    with pytest.raises(ValueError, match=r"cell-local build at N=1000, d=16 .*smaller "
                                         r"cell_items="):
        list(hb.CommunityBatchSampler(emb, B, cell_items=400))
