"""hardbatch.exact_knn.exact_neighbors against a NumPy brute force (random data: no ties)."""

import numpy as np
import torch

from hardbatch.exact_knn import exact_neighbors


def _reference(x: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    sims = x[rows] @ x.T
    sims[np.arange(len(rows)), rows] = -np.inf
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def test_exact_neighbors_matches_brute_force_in_any_block_size():
    x = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    rows = np.random.default_rng(1).permutation(300)[:77]
    want = _reference(x.astype(np.float64), rows, 9)
    xt = torch.from_numpy(x)
    for block in (1, 10, 77, 1000):
        got = exact_neighbors(xt, torch.from_numpy(rows), 9, block_rows=block)
        np.testing.assert_array_equal(got.numpy(), want)
    # a contiguous range of rows (what the graph builders pass), blocks not dividing it
    got = exact_neighbors(xt, torch.arange(40, 90), 9, block_rows=16)
    np.testing.assert_array_equal(got.numpy(), _reference(x.astype(np.float64),
                                                          np.arange(40, 90), 9))


def test_exact_neighbors_never_returns_the_row_itself():
    x = torch.ones(20, 4)  # every similarity ties: the row itself must still be left out
    got = exact_neighbors(x, torch.arange(20), 19, block_rows=7)
    for i, row in enumerate(got.tolist()):
        assert i not in row and sorted(row) == [j for j in range(20) if j != i]
