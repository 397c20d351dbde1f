"""hardbatch.neighbors.exact_search.exact_neighbors against a NumPy brute force, and its two selections
("topk", "grouped") against each other: on random data (no ties) and on quantised data whose
products are exact and tie everywhere (the grouped selection's redo path)."""

import numpy as np
import pytest
import torch

from hardbatch.neighbors.exact_search import exact_neighbors, group_size, grouped_topk


def _reference(x: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """By decreasing similarity, then increasing index (a stable sort)."""
    sims = x[rows] @ x.T
    sims[np.arange(len(rows)), rows] = -np.inf
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def _quantised(n: int, d: int, levels: int, seed: int) -> np.ndarray:
    """Small integers: every product is exact in float32, and many tie."""
    return np.random.default_rng(seed).integers(-levels, levels + 1, (n, d)).astype(np.float32)


@pytest.mark.parametrize("selection", ["topk", "grouped"])
def test_exact_neighbors_matches_brute_force_in_any_block_size(selection):
    x = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    rows = np.random.default_rng(1).permutation(300)[:77]
    want = _reference(x.astype(np.float64), rows, 9)
    xt = torch.from_numpy(x)
    for block in (1, 10, 77, 1000):
        got = exact_neighbors(xt, torch.from_numpy(rows), 9, block_rows=block,
                              selection=selection)
        np.testing.assert_array_equal(got.numpy(), want)
    # a contiguous range of rows (what the graph builders pass), blocks not dividing it
    got = exact_neighbors(xt, torch.arange(40, 90), 9, block_rows=16, selection=selection)
    np.testing.assert_array_equal(got.numpy(), _reference(x.astype(np.float64),
                                                          np.arange(40, 90), 9))


@pytest.mark.parametrize("selection", ["topk", "grouped"])
def test_exact_neighbors_never_returns_the_row_itself(selection):
    x = torch.ones(20, 4)  # every similarity ties: the row itself must still be left out
    got = exact_neighbors(x, torch.arange(20), 19, block_rows=7, selection=selection)
    for i, row in enumerate(got.tolist()):
        assert i not in row and sorted(row) == [j for j in range(20) if j != i]
    if selection == "grouped":  # ties: increasing index
        assert got.tolist() == [[j for j in range(20) if j != i] for i in range(20)]


def test_grouped_equals_topk_on_random_data():
    """No equal similarities: the two selections give the same table, bit for bit, for any
    group size (dividing N or not, one column, more than N)."""
    x = torch.nn.functional.normalize(torch.randn(2000, 32, generator=torch.Generator()
                                                  .manual_seed(3)), dim=1)
    rows = torch.arange(0, 2000, 7)
    want = exact_neighbors(x, rows, 50, block_rows=64, selection="topk")
    assert torch.equal(exact_neighbors(x, rows, 50, block_rows=64), want)  # "auto" on the CPU
    for group in (None, 1, 3, 16, 64, 100, 5000):
        got = exact_neighbors(x, rows, 50, block_rows=64, selection="grouped", group=group)
        assert torch.equal(got, want), group


@pytest.mark.parametrize("levels,d,k", [(1, 3, 10), (2, 4, 40), (3, 2, 5), (8, 6, 99)])
def test_grouped_breaks_ties_by_index_like_a_stable_sort(levels, d, k):
    """Quantised rows: equal similarities everywhere, at the k-th place and at the k-th group
    maximum. The grouped selection is exactly the stable order (decreasing similarity, then
    increasing index); torch.topk's order among equal similarities is its own (a heap on the
    CPU), so against it: the same similarity at every place, and the same indices wherever a
    row has no tie inside its top k or at its k-th place."""
    x = _quantised(600, d, levels, seed=levels)
    rows = np.random.default_rng(d).permutation(600)[:200]
    sims = x.astype(np.float64)[rows] @ x.T
    sims[np.arange(len(rows)), rows] = -np.inf
    want = _reference(x.astype(np.float64), rows, k)
    xt, rt = torch.from_numpy(x), torch.from_numpy(rows)
    old = exact_neighbors(xt, rt, k, block_rows=64, selection="topk").numpy()
    for group in (None, 1, 7, 128, 1000):
        for block in (13, 1000):
            got = exact_neighbors(xt, rt, k, block_rows=block, selection="grouped", group=group)
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{group}, {block}")
    values = np.take_along_axis(sims, want, 1)
    np.testing.assert_array_equal(np.take_along_axis(sims, old, 1), values)
    kth = values[:, -1:]
    untied = ((sims == kth).sum(1) == 1) & (np.diff(values, axis=1) != 0).all(1)
    np.testing.assert_array_equal(old[untied], want[untied])
    assert (~untied).sum() > len(rows) // 2  # the data does tie


def test_grouped_topk_flags_only_the_rows_it_cannot_certify():
    """Without ties nothing is redone; with a duplicated column at a row's k-th place the
    group maxima tie and that row is flagged (and exact_neighbors' redo answers it)."""
    gen = torch.Generator().manual_seed(0)
    sims = torch.randn(8, 1000, generator=gen)
    idx, redo = grouped_topk(sims, 10, 16)
    assert not redo.any()
    assert torch.equal(idx, sims.topk(10, dim=1).indices)
    kth = sims[0].topk(10).values[-1]
    far = int((sims[0] < kth - 1).nonzero()[-1])  # a column far below: now tied at the k-th
    sims[0, far] = kth
    idx, redo = grouped_topk(sims, 10, 16)
    assert redo.tolist() == [True] + [False] * 7


def test_group_size_and_arguments():
    assert group_size(1_000_000, 100) == 64 and group_size(100_000, 100) == 16
    assert group_size(20, 19) == 1
    x, rows = torch.randn(30, 4), torch.arange(5)
    with pytest.raises(ValueError, match="selection="):
        exact_neighbors(x, rows, 3, selection="heap")
    with pytest.raises(ValueError, match="group=0"):
        exact_neighbors(x, rows, 3, selection="grouped", group=0)
