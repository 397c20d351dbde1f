"""Spherical k-means (cosine): the coarse cells of the inverted lists and of the partitions.

One torch implementation, :func:`spherical_kmeans` (centroids from a seeded sample of at most
64 rows per centroid), and :func:`nearest_centroid` (each row's cell: the centroid of largest
inner product, by chunks of rows). Their callers: the inverted lists of
:mod:`hardbatch.neighbors.ivf` (GCBS ``method="ivf"``), the cells of GCBS ``method="partition"``
(:class:`hardbatch.batching.gcbs.order.PartitionLayout`) and the clusters of
:func:`hardbatch.batching.communities.spherical_clusters` through :func:`kmeans_labels`, which
runs either this k-means or faiss's (``faiss.Kmeans(spherical=True)``, another algorithm: its
own initialisation and sampling, so other labels; ``backend=``).

Arrays in, arrays out; no logging. Each caller keeps the chunk of rows of its assignment
(``chunk=``): a product's bits may depend on the row count, and every result stays the one
its caller computed before the k-means moved here.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from .. import _rng
from .._device import matmul_fp32
from .._validation import check_choice

__all__ = ["KMEANS_BACKENDS", "check_kmeans_backend", "kmeans_labels", "nearest_centroid",
           "spherical_kmeans"]

KMEANS_BACKENDS = ("auto", "faiss", "torch")


def spherical_kmeans(y: torch.Tensor, k: int, seed: int, iters: int = 10) -> torch.Tensor:
    """Spherical k-means centroids [k, d] (fp32) from a sample of at most 64k rows of ``y``.

    The sample is a seeded permutation's first ``min(N, 64 k)`` rows; its first k rows start
    the centroids; each of ``iters`` rounds assigns the sample to the centroid of largest inner
    product and normalises the sums (an empty cluster keeps its centroid).

    Example:
        >>> from hardbatch.neighbors.kmeans import spherical_kmeans
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> u = torch.nn.functional.normalize(x, dim=1).numpy()  # unit rows, float32
        >>> centroids = spherical_kmeans(torch.from_numpy(u), 4, seed=0)
        >>> centroids.shape, centroids.norm(dim=1).round(decimals=3).tolist()
        (torch.Size([4, 8]), [1.0, 1.0, 1.0, 1.0])
        >>> cell = (torch.from_numpy(u) @ centroids.T).argmax(1)
        >>> len(set(zip(cell.tolist(), (torch.arange(40) % 4).tolist())))  # one cell per cluster
        4
    """
    n = y.shape[0]
    pick = torch.from_numpy(_rng.permutation(n, _rng.derive_seed(seed, 0x1BF))[:min(n, 64 * k)])
    sample = y[pick.to(y.device)].float()
    cent = sample[:k].clone()
    for _ in range(iters):
        assign = (sample @ cent.T).argmax(dim=1)
        new = torch.zeros_like(cent).index_add_(0, assign, sample)
        empty = new.norm(dim=1) == 0
        new[empty] = cent[empty]
        cent = torch.nn.functional.normalize(new, dim=1)
    return cent


def nearest_centroid(x: torch.Tensor, centroids: torch.Tensor,
                     chunk: int = 65536) -> torch.Tensor:
    """Each row's cell: the index of the centroid of largest inner product, int64 [N] on
    ``x``'s device (ties: the lowest). ``x`` may be half precision (fp32 accumulation; the
    centroids are cast to its dtype); ``chunk`` rows per product bound the [chunk, k] block.

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.kmeans import nearest_centroid
        >>> centroids = torch.eye(3, 4)
        >>> nearest_centroid(torch.tensor([[0.1, 0.9, 0, 0], [1.0, 0, 0, 0.5]]), centroids).tolist()
        [1, 0]
    """
    cent_t = centroids.T.to(x.dtype)
    return torch.cat([matmul_fp32(x[s:s + chunk], cent_t).argmax(1)
                      for s in range(0, x.shape[0], chunk)])


def _faiss():
    try:
        return importlib.import_module("faiss")
    except ImportError:
        return None


def check_kmeans_backend(backend: str, name: str = "backend") -> str:
    """``backend`` checked: one of :data:`KMEANS_BACKENDS`, and ``"faiss"`` only with faiss
    installed (``ImportError`` naming the extra); messages call it ``name`` (the caller's
    parameter, e.g. ``ClusterBatchSampler``'s ``kmeans``).

    Example:
        >>> from hardbatch.neighbors.kmeans import check_kmeans_backend
        >>> check_kmeans_backend("torch")
        'torch'
    """
    check_choice(name, backend, KMEANS_BACKENDS)
    if backend == "faiss" and _faiss() is None:
        raise ImportError(f"{name}='faiss' needs faiss; pip install 'hardbatch[faiss]' or use "
                          f"{name}='torch'")
    return backend


def kmeans_labels(x: torch.Tensor, k: int, seed: int, iters: int = 10, backend: str = "auto",
                  one_thread: bool = False) -> np.ndarray:
    """Labels int64 [N] of one spherical k-means of the unit rows ``x`` with ``k <= N`` clusters.

    ``backend``: ``"torch"`` (:func:`spherical_kmeans`, then :func:`nearest_centroid` by
    chunks of ``2^22 / k`` rows), ``"faiss"`` (``faiss.Kmeans(spherical=True)``, at most 64
    rows per centroid, then a search of the trained index) or ``"auto"`` (faiss when installed,
    else torch). ``one_thread``: faiss in this thread only (small problems: OpenMP's threads
    cost 40x on a loaded 2-core CPU). Deterministic for a seed and backend; ``k == 1``: zeros.

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.kmeans import kmeans_labels
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> labels = kmeans_labels(torch.nn.functional.normalize(x, dim=1), 4, 0, backend="torch")
        >>> labels.shape, len(set(zip(labels.tolist(), (torch.arange(40) % 4).tolist())))
        ((40,), 4)
    """
    if k == 1:
        return np.zeros(x.shape[0], np.int64)
    faiss = _faiss() if backend != "torch" else None
    if faiss is not None:
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        threads = faiss.omp_get_max_threads()
        if one_thread:
            faiss.omp_set_num_threads(1)  # OpenMP: the calling thread's setting
        try:
            km = faiss.Kmeans(rows.shape[1], k, niter=iters, spherical=True,
                              seed=seed & 0x7FFFFFFF, max_points_per_centroid=64,
                              min_points_per_centroid=1, verbose=False)
            km.train(rows)
            return km.index.search(rows, 1)[1][:, 0].astype(np.int64)
        finally:
            faiss.omp_set_num_threads(threads)
    cent = spherical_kmeans(x, k, seed, iters)
    return nearest_centroid(x.float(), cent, max(1, (1 << 22) // k)).cpu().numpy().astype(
        np.int64)
