"""Spherical k-means (hardbatch.neighbors.kmeans) against a NumPy reference: Lloyd's rounds on
the same seeded sample, nearest centroids by argmax of the similarities."""

import numpy as np
import pytest
import torch
from support import unit_rows

from hardbatch import _rng
from hardbatch.neighbors.kmeans import (check_kmeans_backend, kmeans_labels, nearest_centroid,
                                        spherical_kmeans)


def clusters(rng, k=6, size=50, d=12, spread=0.1):
    centers = unit_rows(rng, k, d)
    x = np.repeat(centers, size, axis=0) + spread * rng.standard_normal((k * size, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def kmeans_reference(y, k, seed, iters=10):
    """Spherical Lloyd in float64 on the sample spherical_kmeans documents (its seeded
    permutation's first min(N, 64 k) rows; the first k start the centroids)."""
    pick = _rng.permutation(len(y), _rng.derive_seed(seed, 0x1BF))[:min(len(y), 64 * k)]
    sample = y[pick].astype(np.float64)
    cent = sample[:k].copy()
    for _ in range(iters):
        assign = np.argmax(sample @ cent.T, axis=1)
        new = np.zeros_like(cent)
        np.add.at(new, assign, sample)
        norm = np.linalg.norm(new, axis=1)
        new[norm == 0] = cent[norm == 0]
        cent = new / np.linalg.norm(new, axis=1, keepdims=True)
    return cent


@pytest.mark.parametrize("seed", [0, 3])
def test_centroids_match_numpy_lloyd(rng, seed):
    x = clusters(rng)
    got = spherical_kmeans(torch.from_numpy(x), 6, seed).numpy()
    want = kmeans_reference(x, 6, seed)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 65536])
def test_assignments_are_the_argmax_of_centroid_similarity(rng, chunk):
    x = unit_rows(rng, 400, 10)
    cent = spherical_kmeans(torch.from_numpy(x), 8, seed=2)
    got = nearest_centroid(torch.from_numpy(x), cent, chunk)
    want = np.argmax(x.astype(np.float64) @ cent.numpy().T.astype(np.float64), axis=1)
    assert got.dtype == torch.int64 and (got.numpy() == want).all()


def test_torch_labels_are_the_nearest_centroids(rng):
    x = torch.from_numpy(clusters(rng))
    labels = kmeans_labels(x, 6, seed=1, backend="torch")
    assert (labels == nearest_centroid(x, spherical_kmeans(x, 6, 1)).numpy()).all()
    truth = np.repeat(np.arange(6), 50)
    assert len(set(zip(labels.tolist(), truth.tolist()))) == 6  # one label per cluster
    assert (kmeans_labels(x, 1, seed=1) == 0).all()


def test_faiss_labels_find_the_clusters(rng):
    pytest.importorskip("faiss")
    x = torch.from_numpy(clusters(rng))
    labels = kmeans_labels(x, 6, seed=1, backend="faiss", one_thread=True)
    truth = np.repeat(np.arange(6), 50)
    assert labels.dtype == np.int64 and len(set(zip(labels.tolist(), truth.tolist()))) == 6


def test_backend_names_are_checked():
    assert check_kmeans_backend("auto") == "auto"
    with pytest.raises(ValueError, match="backend"):
        check_kmeans_backend("sklearn")
