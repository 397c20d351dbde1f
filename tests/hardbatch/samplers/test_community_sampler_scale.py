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
