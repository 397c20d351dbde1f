"""Hierarchical spherical k-means: a tree of k-means whose leaves are the clusters.

:func:`kmeans_tree` splits the items with one k-means of ``b`` centroids, shares the ``k``
leaves among the ``b`` children in proportion to their items (:func:`apportion`), and splits
each child again, ``levels`` levels deep; the branching of a node with ``k`` leaves to share
and ``L`` levels left is ``b = ceil(k^(1/L))`` (:func:`branching`). Every node runs the one
k-means of :func:`hardbatch.neighbors.kmeans.kmeans_labels` (trained on a sample of at most 64
rows per centroid, then every row of the node assigned to its nearest centroid), so an
iteration costs about ``N d (b_1 + b_2 + ...)`` multiply-adds instead of ``N d k``: at
N = 10M, k = N / 64 = 156,250 leaves, three levels (b = 54) cost 162 centroids per item, two
levels (b = 396) 791, one level 156,250.

``levels=2`` is :func:`hardbatch.batching.communities.spherical_clusters` above 256 clusters
(the same seeds and calls, so the same labels when the rows are normalised the same way);
``levels=1`` is one k-means. A leaf is the nearest centroid of its items at the last level
only: an item's earlier levels may not have chosen the globally nearest leaf (the price of the
tree). Arrays in, arrays out; one INFO record per build (``hardbatch.neighbors``) and a
progress bar over the items of the last level.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import _rng
from .._logging import BuildLog, get_logger, progress_bar
from .._memory import check_memory
from .._validation import check_int
from .kmeans import check_kmeans_backend, kmeans_labels, nearest_centroid, spherical_kmeans

__all__ = ["ASSIGN_ROWS", "apportion", "branching", "kmeans_tree", "kmeans_tree_bytes",
           "tree_levels"]

_LOG = get_logger("neighbors")
#: Rows assigned per call of the torch backend's assignment (whole chunks of it): the chunks'
#: int64 results a call keeps split the freed product blocks in glibc's heap, whose RSS then
#: grows by about a block per chunk (at N = 2M, k = 1000 in one call: +7.4 GB); per 2^18 rows
#: it stays under 1 GB and the labels are the same.
ASSIGN_ROWS = 1 << 18


def apportion(counts, k: int) -> np.ndarray:
    """``k`` leaves shared among nodes of ``counts`` items: about proportional (largest
    remainders), each node with items at least one and at most its count, an empty node none.
    Needs ``nonzero(counts) <= k <= sum(counts)``.

    Example:
        >>> import numpy as np
        >>> from hardbatch.neighbors.kmeans_tree import apportion
        >>> apportion(np.array([50, 30, 20, 0]), 7).tolist()  # quotas 3.5, 2.1, 1.4
        [4, 2, 1, 0]
    """
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    quota = counts * (k / total)
    share = np.minimum(counts, np.maximum(np.floor(quota), counts > 0)).astype(np.int64)
    rest = quota - share
    while share.sum() != k:  # a few rounds: at most one leaf per node each
        more = share.sum() < k
        room = (share < counts) if more else (share > 1)
        pick = np.flatnonzero(room)[np.argsort(-rest[room] if more else rest[room],
                                               kind="stable")]
        pick = pick[:abs(k - int(share.sum()))]
        share[pick] += 1 if more else -1
        rest[pick] -= 1 if more else -1
    return share


def branching(k: int, levels: int) -> int:
    """Children of a node sharing ``k`` leaves with ``levels`` levels left: the smallest ``b``
    with ``b^levels >= k`` (``ceil(sqrt(k))`` for two levels; ``k`` for one).

    Example:
        >>> from hardbatch.neighbors.kmeans_tree import branching
        >>> branching(156_250, 3), branching(156_250, 2), branching(300, 1)
        (54, 396, 300)
    """
    if levels <= 1 or k <= 1:
        return max(1, k)
    b = max(1, int(round(k ** (1.0 / levels))))
    while b ** levels < k:
        b += 1
    while b > 1 and (b - 1) ** levels >= k:
        b -= 1
    return b


def kmeans_tree_bytes(n: int, d: int, leaves: int, levels: int, normalized: bool) -> int:
    """Bytes :func:`kmeans_tree` adds at its peak beyond its input: the normalised copy of the
    rows (unless ``normalized``), the int64 labels, the first split's labels and order, a
    child's gathered rows (twice the mean, for uneven children) and faiss's search buffers.

    Example:
        >>> from hardbatch.neighbors.kmeans_tree import kmeans_tree_bytes
        >>> round(kmeans_tree_bytes(10_000_000, 128, 156_250, 3, True) / 2**30, 2)
        0.51
    """
    b = branching(leaves, levels)
    child = 0 if levels <= 1 else min(n, 2 * -(-n // b)) * d * 4
    return (0 if normalized else n * d * 4) + n * 8 * 3 + child + n * 12


def _small(n: int, k: int, d: int) -> bool:
    """One k-means iteration of at most 2^31 multiply-adds: faiss in the calling thread."""
    return min(n, 64 * k) * k * d < 2**31


def kmeans_tree(embeddings, leaves: int, *, levels: int = 2, seed: int = 0, iters: int = 10,
                backend: str = "auto", normalized: bool = False, progress: bool | None = None,
                memory_limit: int | None = None) -> np.ndarray:
    """Labels of a hierarchical spherical k-means of the rows of ``embeddings`` (cosine).

    Args:
        embeddings: ``[N, d]`` tensor or array.
        leaves: k, the clusters (leaves), ``1 <= k <= N``.
        levels: depth of the tree (1: one k-means of k centroids; 2: ``ceil(sqrt(k))`` coarse
            cells then each cell's share of the k; 3: branching about ``k^(1/3)``).
        seed: the k-means seeds (node seed s: its split ``derive_seed(s, 1)``, its child c
            ``derive_seed(s, 2, c)``, a last-level node's k-means s itself).
        iters: k-means iterations of every node.
        backend: ``"auto"``, ``"faiss"`` or ``"torch"`` (:func:`~hardbatch.neighbors.kmeans.
            kmeans_labels`).
        normalized: the rows are unit already (e.g. a sampler's normalised read): used as they
            are, no copy; else normalised into a copy (``F.normalize``, as
            :func:`~hardbatch.batching.communities.spherical_clusters`).
        progress: a bar over the items of the last level (None: when stderr is a terminal).
        memory_limit: bytes the build may add (None: the available memory); above it a
            ``ValueError`` before anything is allocated (:func:`kmeans_tree_bytes`).

    Returns:
        int64 ``[N]`` labels in ``[0, k)``; deterministic for a seed and backend; a leaf may
        end up empty (a k-means cluster that lost its items).

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.kmeans_tree import kmeans_tree
        >>> noise = torch.randn(400, 8, generator=torch.Generator().manual_seed(0))
        >>> x = torch.eye(8)[torch.arange(400) % 8] + 0.05 * noise  # 8 groups of 50
        >>> labels = kmeans_tree(x, 8, levels=3, backend="torch")  # branching 2, 2, 2
        >>> labels.shape, len(set(zip(labels.tolist(), (torch.arange(400) % 8).tolist())))
        ((400,), 8)
    """
    check_kmeans_backend(backend)
    levels = check_int(levels, "levels", low=1)
    x = torch.as_tensor(embeddings)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be [N, d], got shape {tuple(x.shape)}")
    n, d = x.shape
    k = check_int(leaves, "leaves", low=1, high=n)
    check_memory(kmeans_tree_bytes(n, d, k, levels, normalized), n=n, d=d,
                 what=f"kmeans_tree ({k} leaves, {levels} levels)", memory_limit=memory_limit,
                 reduce="normalized=True (unit rows used as they are, no copy) or more levels")
    with BuildLog(_LOG, "kmeans_tree", method=backend) as log:
        x = x.float() if normalized else torch.nn.functional.normalize(x.float(), dim=1)
        log.set(n=n, d=d, leaves=k, levels=levels, branching=branching(k, levels))
        labels = np.empty(n, np.int64)
        bar = progress_bar(n, "k-means tree", progress)
        _split(x, None, k, levels, seed, iters, backend, labels, 0, bar)
        bar.close()
        log.hold(kmeans_tree_bytes(n, d, k, levels, True), labels.nbytes)
        return labels


def _kmeans(x: torch.Tensor, k: int, seed: int, iters: int, backend: str,
            one_thread: bool) -> np.ndarray:
    """:func:`~hardbatch.neighbors.kmeans.kmeans_labels`; with ``backend="torch"`` its two
    steps, the assignment in slices of whole chunks (:data:`ASSIGN_ROWS`): the same labels."""
    if backend != "torch" or k == 1 or x.shape[0] <= ASSIGN_ROWS:
        return kmeans_labels(x, k, seed, iters, backend, one_thread)
    cent = spherical_kmeans(x, k, seed, iters)
    chunk = max(1, (1 << 22) // k)  # kmeans_labels' chunk
    step = chunk * max(1, ASSIGN_ROWS // chunk)
    out = np.empty(x.shape[0], np.int64)
    for s in range(0, x.shape[0], step):
        out[s:s + step] = nearest_centroid(x[s:s + step].float(), cent, chunk).cpu().numpy()
    return out


def _split(x: torch.Tensor, rows: np.ndarray | None, k: int, levels: int, seed: int,
           iters: int, backend: str, labels: np.ndarray, base: int, bar) -> None:
    """Label the items ``rows`` (None: all) of ``x`` with leaves ``base .. base + k - 1``."""
    sub = x if rows is None else x[torch.from_numpy(rows).to(x.device)]
    n = sub.shape[0]
    items = np.arange(n) if rows is None else rows
    if levels == 1 or k == 1:
        one = rows is not None or _small(n, k, sub.shape[1])
        labels[items] = base + _kmeans(sub, k, seed, iters, backend, one)
        bar.update(n)
        return
    b = branching(k, levels)
    coarse = _kmeans(sub, b, _rng.derive_seed(seed, 1), iters, backend,
                     _small(n, b, sub.shape[1]))
    counts = np.bincount(coarse, minlength=b)
    share = apportion(counts, k)
    members = np.argsort(coarse, kind="stable")
    del sub, coarse
    start = 0
    for child in range(b):
        mine = items[members[start:start + counts[child]]]
        start += counts[child]
        if len(mine):
            _split(x, mine, int(share[child]), levels - 1, _rng.derive_seed(seed, 2, child),
                   iters, backend, labels, base, bar)
            base += int(share[child])


def tree_levels(leaves: int, max_branching: int = 256) -> int:
    """The fewest levels whose branching stays at most ``max_branching`` (1 up to 256 leaves,
    2 up to 65,536, ...).

    Example:
        >>> from hardbatch.neighbors.kmeans_tree import tree_levels
        >>> tree_levels(200), tree_levels(2_000), tree_levels(156_250)
        (1, 2, 3)
    """
    return max(1, math.ceil(math.log(max(1, leaves)) / math.log(max_branching) - 1e-12))
