"""The k-means tree (hardbatch.neighbors.kmeans_tree): a brute-force reference of the tree, the
leaves shared out by size, the two-level tree of spherical_clusters, determinism, and the memory
check that fails before anything is allocated."""

import numpy as np
import pytest
import torch

from hardbatch import _memory, _rng
from hardbatch.batching.communities import spherical_clusters
from hardbatch.neighbors import kmeans_tree as tree_module
from hardbatch.neighbors.kmeans import kmeans_labels, spherical_kmeans
from hardbatch.neighbors.kmeans_tree import apportion, branching, kmeans_tree, tree_levels


def unit(n: int, d: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1).float()


def reference_tree(x: np.ndarray, k: int, levels: int, seed: int) -> np.ndarray:
    """The tree written out with brute-force float64 assignments: every node's centroids from
    the one k-means (torch backend: spherical_kmeans, 10 iterations), each item to the centroid
    of largest inner product among its node's."""
    labels = np.empty(len(x), np.int64)

    def nearest(rows: np.ndarray, k: int, s: int) -> np.ndarray:
        if k == 1:
            return np.zeros(len(rows), np.int64)
        cent = spherical_kmeans(torch.from_numpy(x[rows]), k, s, 10).double().numpy()
        return np.argmax(x[rows].astype(np.float64) @ cent.T, axis=1)

    def node(rows: np.ndarray, k: int, levels: int, s: int, base: int) -> None:
        if levels == 1 or k == 1:
            labels[rows] = base + nearest(rows, k, s)
            return
        b = branching(k, levels)
        coarse = nearest(rows, b, _rng.derive_seed(s, 1))
        share = apportion(np.bincount(coarse, minlength=b), k)
        for c in range(b):
            mine = rows[coarse == c]  # in item order
            if len(mine):
                node(mine, int(share[c]), levels - 1, _rng.derive_seed(s, 2, c), base)
                base += int(share[c])

    node(np.arange(len(x)), k, levels, seed, 0)
    return labels


@pytest.mark.parametrize("k,levels", [(12, 1), (40, 2), (60, 3)])
def test_tree_matches_a_brute_force_reference(k, levels):
    x = unit(1500, 12, 0)
    labels = kmeans_tree(x, k, levels=levels, seed=3, backend="torch", normalized=True)
    assert labels.shape == (1500,) and labels.min() >= 0 and labels.max() < k
    assert np.bincount(labels, minlength=k).sum() == 1500
    ref = reference_tree(x.numpy(), k, levels, 3)
    assert (labels != ref).sum() <= 2  # float32 products vs float64: a near-tie at most
    assert len(np.unique(labels)) >= 0.9 * k  # a leaf may empty, few do


def test_leaves_shared_by_size():
    counts = np.array([500, 300, 150, 45, 5, 0])
    share = apportion(counts, 40)
    assert share.sum() == 40 and share[-1] == 0 and (share[:-1] >= 1).all()
    assert (share <= counts).all() and np.abs(share - counts * 40 / 1000).max() < 1 + 1e-9
    assert apportion(np.array([3, 1]), 4).tolist() == [3, 1]  # at most its count
    assert [branching(k, 3) for k in (1, 8, 9, 156_250)] == [1, 2, 3, 54]
    assert [tree_levels(k) for k in (1, 256, 257, 65_536, 65_537)] == [1, 1, 2, 2, 3]


@pytest.fixture
def one_thread():
    """torch on one thread (its CPU index_add_ waits ~0.1 s a call for a busy second core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_two_levels_are_spherical_clusters(backend, one_thread):
    if backend == "faiss":
        pytest.importorskip("faiss")
    x = unit(6000, 16, 1)
    assert np.array_equal(kmeans_tree(x, 300, levels=2, seed=5, backend=backend),
                          spherical_clusters(x, 300, seed=5, backend=backend))
    assert np.array_equal(kmeans_tree(x, 50, levels=1, seed=5, backend=backend),
                          spherical_clusters(x, 50, seed=5, backend=backend))


def test_assignment_in_slices_gives_the_same_labels(monkeypatch):
    x = unit(20000, 8, 3)
    whole = kmeans_labels(x, 600, 4, 2, "torch")  # chunks of 2^22 // 600 = 6990 rows
    monkeypatch.setattr(tree_module, "ASSIGN_ROWS", 1000)  # three slices of one chunk each
    assert np.array_equal(kmeans_tree(x, 600, levels=1, seed=4, iters=2, backend="torch",
                                      normalized=True), whole)


def test_same_seed_same_tree():
    x = unit(3000, 8, 2)
    a = kmeans_tree(x, 100, levels=3, seed=7, backend="torch")
    assert np.array_equal(a, kmeans_tree(x.numpy(), 100, levels=3, seed=7, backend="torch"))
    assert not np.array_equal(a, kmeans_tree(x, 100, levels=3, seed=8, backend="torch"))


def test_memory_check_fails_before_it_allocates(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("k-means ran")

    monkeypatch.setattr(tree_module, "kmeans_labels", never)
    x = unit(2000, 16, 0)
    with pytest.raises(ValueError, match=r"N=2000, d=16 needs about .* GiB .* normalized=True"):
        kmeans_tree(x, 50, memory_limit=1000)
    monkeypatch.setattr(_memory, "available_bytes", lambda: 1000)  # the machine's memory
    with pytest.raises(ValueError, match="N=2000, d=16"):
        kmeans_tree(x, 50)
