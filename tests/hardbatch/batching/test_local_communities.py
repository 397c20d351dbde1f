"""B3's communities cell by cell (hardbatch.batching.local_communities): each cell equals the
global procedure (hb.knn_graph exact + community_labels) run on its items alone, whatever the
threads; short cells are padded; sub-cells; the memory check fails before anything runs."""

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch import _rng
from hardbatch.batching import local_communities as local_module
from hardbatch.batching.communities import community_cells, community_labels
from hardbatch.batching.local_communities import cell_neighbors, coarse_cells, \
    local_communities
from hardbatch.neighbors.kmeans_tree import apportion

SKIP, WINDOW = 2, 8


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    rows = torch.randn(1200, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return torch.nn.functional.normalize(rows, dim=1).float()


def per_cell_reference(x: torch.Tensor, cells: np.ndarray, parts: int, seed: int,
                       cell_batches: int = 0, batch_size: int = 32):
    """The global build run separately on every cell: labels offset by the cells before it,
    and each item's kNN row as item ids."""
    counts = np.bincount(cells)
    share = apportion(counts, parts)
    labels = np.empty(len(x), np.int64)
    rows = np.empty((len(x), SKIP + WINDOW), np.int64)
    offset = 0
    for c in np.flatnonzero(counts):
        items = np.flatnonzero(cells == c)
        xc = x[torch.from_numpy(items)]
        nbrs = hb.knn_graph(xc, SKIP + WINDOW, method="exact").numpy()
        sub = community_cells(xc, batch_size, seed=_rng.derive_seed(seed, 0xCE11, int(c)),
                              cell_batches=cell_batches) if cell_batches else None
        labels[items] = offset + community_labels(
            nbrs, int(share[c]), skip=SKIP, window=WINDOW, seed=_rng.derive_seed(seed, int(c)),
            cells=sub)
        rows[items] = items[nbrs]
        offset += int(share[c])
    return labels, rows


@pytest.mark.parametrize("workers", [1, 2])
def test_each_cell_is_the_global_build_on_its_items(x, workers):
    cells = coarse_cells(x, 300, seed=1, normalized=True)  # 4 k-means cells
    assert len(np.unique(cells)) == 4
    out = local_communities(x, cells, 60, skip=SKIP, window=WINDOW, seed=9, workers=workers)
    labels, rows = per_cell_reference(x, cells, 60, 9)
    assert np.array_equal(out.labels, labels)
    assert np.array_equal(out.neighbors, rows) and out.neighbors.dtype == np.int32
    assert out.subcells is None and set(out.seconds) == {"knn", "partition"}
    assert sorted(set(out.labels.tolist())) == list(range(60))
    for c in range(4):  # no community crosses a cell
        assert len(set(cells[out.labels == c].tolist())) == 1


def test_sub_cells_and_kept_ranks(x):
    cells = (x[:, 0] > 0.3).long().numpy() + 2 * (x[:, 1] > 0).long().numpy()
    out = local_communities(x, cells, 75, skip=SKIP, window=WINDOW, seed=4, keep=5,
                            cell_batches=2, batch_size=32)
    labels, rows = per_cell_reference(x, cells, 75, 4, cell_batches=2)
    assert np.array_equal(out.labels, labels) and np.array_equal(out.neighbors, rows[:, :5])
    assert out.subcells is not None and out.subcells.max() + 1 == len(np.unique(out.subcells))
    for s in np.unique(out.subcells):  # sub-cells nest in cells and hold whole communities
        assert len(set(cells[out.subcells == s].tolist())) == 1
    for c in np.unique(out.labels):
        assert len(set(out.subcells[out.labels == c].tolist())) == 1


def test_a_cell_is_never_cut_into_more_sub_cells_than_its_communities():
    """Cells of 6 items, B = 4, one batch per sub-cell: round(6 / 4) = 2 sub-cells, but 30 items
    in 8 parts give some cells one community; before, such a cell raised at the first epoch
    (found on data seeds 0, 1 and 5). Now its sub-cells are capped at its communities."""
    x = np.random.default_rng(0).standard_normal((30, 8)).astype(np.float32)
    cells = np.arange(30) // 6
    out = local_communities(x, cells, 8, skip=1, window=3, cell_batches=1, batch_size=4)
    assert sorted(set(out.labels.tolist())) == list(range(8))
    share = apportion(np.bincount(cells), 8)
    for c in range(5):  # a cell's sub-cells never outnumber its communities
        assert len(set(out.subcells[cells == c].tolist())) <= share[c]
    for seed in (0, 1, 5):
        x = np.random.default_rng(seed).standard_normal((30, 8)).astype(np.float32)
        sampler = hb.CommunityBatchSampler(x, 4, 1, skip=1, window=3,
                                           cells=hb.CommunityCells(batches=1, items=6))
        assert sorted(i for batch in sampler for i in batch) == list(range(30))


def test_short_cells_are_padded_with_the_item_itself():
    x = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator()
                                                  .manual_seed(1)), dim=1)
    table = cell_neighbors(x, 8)
    assert table.shape == (6, 8) and (table[:, 5:] == np.arange(6)[:, None]).all()
    assert all(sorted(table[i, :5].tolist()) == [j for j in range(6) if j != i] for i in range(6))
    cells = np.array([0, 0, 0, 0, 0, 1])  # a cell of one item: its own community
    out = local_communities(x, cells, 2, skip=1, window=3)
    assert out.labels[5] == 1 and (out.labels[:5] == 0).all() and (out.neighbors[5] == 5).all()


def test_memory_check_fails_before_anything_runs(x, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a kNN graph was computed")

    monkeypatch.setattr(local_module, "exact_neighbors", never)
    cells = np.arange(1200) % 3
    with pytest.raises(ValueError, match=r"N=1200, d=16 needs about .* GiB .*cell_items="):
        local_communities(x, cells, 40, skip=SKIP, window=WINDOW, memory_limit=10_000)
    with pytest.raises(ValueError, match="cells must hold one cell id"):
        local_communities(x, cells[:5], 40, skip=SKIP, window=WINDOW)
    with pytest.raises(ValueError, match="parts"):
        local_communities(x, cells, 2, skip=SKIP, window=WINDOW)  # fewer parts than cells
