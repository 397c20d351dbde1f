"""B3's communities built cell by cell: the build of millions of items on one machine.

A global build (:func:`hardbatch.batching.communities.community_labels` over
:func:`hardbatch.knn_graph` of every item) holds an ``[N, skip + window]`` kNN table, a graph of
about ``2 N window`` edges and METIS's copy of it at once, and its exact kNN graph costs
``N^2 d``: at N = 10M, d = 128 that is 1.3e16 multiply-adds and some 30 GB. Here instead:

1. :func:`coarse_cells`: the items split into cells of about ``cell_items`` items by a
   spherical k-means tree (:func:`hardbatch.neighbors.kmeans_tree.kmeans_tree`, torch
   backend: the same cells with or without faiss);
2. :func:`local_communities`: in every cell, on its items alone, the exact kNN graph
   (:func:`hardbatch.neighbors.exact_search.exact_neighbors`: ``n_cell^2 d``), then B3's
   partition step (:func:`~hardbatch.batching.communities.community_labels`: the rank window's
   edges, METIS) into the cell's share of the parts (shared out by cell size), optionally in
   sub-cells of about ``cell_batches`` batches (:func:`~hardbatch.batching.communities.
   community_cells`). Cell ``c`` is exactly the global procedure run on the cell's items alone
   with seed ``derive_seed(seed, c)``. Two cells at a time: a cell's partition step runs in a
   second thread (METIS releases the GIL; its runs are one at a time anyway, as its console
   output is caught per run) while the next cell's kNN graph runs with torch's threads; memory
   beyond the input and the ``[N]`` outputs is that of the cells in flight
   (:func:`local_communities_bytes`).

What the cell-local graph loses: an item's window is filled from its cell, so where a
global neighbour lies in another cell, a farther item of its own cell takes its rank (items
near a cell boundary), and no community crosses a cell. ``benchmarks/bench_scale.py`` measures
the share of the items' global top ``skip + window`` neighbours inside their cells and the batch
hardness against the global build (docs/benchmarks.md, "Ten million items").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch

from .. import _rng
from .._device import BLOCK_ELEMENTS_CPU, block_elements
from .._logging import BuildLog, get_logger, progress_bar
from .._memory import check_memory
from .._validation import check_int
from ..neighbors.exact_search import exact_neighbors
from ..neighbors.kmeans_tree import apportion, kmeans_tree, tree_levels
from .communities import community_cells, community_labels

__all__ = ["AUTO_CELLS_ABOVE", "CELL_ITEMS", "FLAT_CELLS", "LocalCommunities",
           "cell_neighbors", "coarse_cells", "global_communities_bytes", "local_communities",
           "local_communities_bytes"]

_LOG = get_logger("batching")

#: Items per cell of the cell-local build by default (docs/benchmarks.md, "Ten million items":
#: against cells of 10,000, as hard on the 100k MiniLM embeddings (batch hardness 0.391 vs
#: 0.392), harder on the mixture at 500k and 1M, and up to twice as fast).
CELL_ITEMS = 5_000
#: :func:`coarse_cells` runs one k-means up to this many cells, a k-means tree beyond.
FLAT_CELLS = 4096
#: ``CommunityBatchSampler(cell_items=None)`` builds cell by cell above this many items (its
#: global build at 1M took minutes and holds a graph of ``2 N window`` edges: at 10M some 30 GB).
AUTO_CELLS_ABOVE = 2_000_000


class LocalCommunities(NamedTuple):
    """What :func:`local_communities` returns.

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.local_communities import LocalCommunities
        >>> out = LocalCommunities(np.zeros(3, np.int64), np.zeros((3, 2), np.int32), None, {})
        >>> out.labels.shape, out.subcells is None
        ((3,), True)
    """

    labels: np.ndarray  #: int64 [N] community labels in [0, parts)
    neighbors: np.ndarray  #: [N, keep] each item's first ``keep`` cell-local ranks (item ids)
    subcells: np.ndarray | None  #: int64 [N] sub-cell ids (``cell_batches``), else None
    seconds: dict  #: seconds per component: "knn", "partition" (graph and METIS)


def coarse_cells(embeddings, cell_items: int, *, seed: int = 0, normalized: bool = False,
                 progress: bool | None = None) -> np.ndarray:
    """Cells of about ``cell_items`` items: ``ceil(N / cell_items)`` spherical k-means
    clusters (torch backend), one k-means up to :data:`FLAT_CELLS` cells (an assignment of
    ``N`` rows to 4,096 centroids costs about 1e12 multiply-adds at N = 10M, d = 128), a
    k-means tree of :func:`~hardbatch.neighbors.kmeans_tree.tree_levels` levels beyond. A
    tree's first levels split clusters that a flat k-means keeps whole (on the 1M mixture of
    docs/benchmarks.md: 51% of the items' global neighbours in their cell with a tree of 400
    cells, 94% with one k-means of 200). int64 ``[N]`` cell ids (k-means cells are uneven).

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch.batching.local_communities import coarse_cells
        >>> noise = torch.randn(400, 8, generator=torch.Generator().manual_seed(2))
        >>> x = torch.eye(8)[torch.arange(400) % 4] + 0.05 * noise  # 4 groups of 100
        >>> cells = coarse_cells(x, 100)  # ceil(400 / 100) = 4 cells
        >>> groups = np.arange(400) % 4
        >>> np.bincount(cells).tolist(), len(set(zip(cells.tolist(), groups.tolist())))
        ([100, 100, 100, 100], 4)
    """
    n = torch.as_tensor(embeddings).shape[0]
    k = max(1, min(n, -(-n // check_int(cell_items, "cell_items", low=1))))
    levels = 1 if k <= FLAT_CELLS else tree_levels(k, FLAT_CELLS)
    return kmeans_tree(embeddings, k, levels=levels, seed=seed, backend="torch",
                       normalized=normalized, progress=progress)


def cell_neighbors(x: torch.Tensor, k: int) -> np.ndarray:
    """Exact kNN table ``[n, k]`` (local ids, self excluded, by decreasing inner product) of
    the rows ``x`` of one cell; a cell of ``n <= k`` items pads each row with the item itself
    (dropped by :func:`~hardbatch.batching.communities.rank_graph`). Rows per product as
    :func:`hardbatch.knn_graph`'s exact blocks (about 4M similarities on the CPU, 64M on CUDA).

    Example:
        >>> import torch
        >>> from hardbatch.batching.local_communities import cell_neighbors
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> cell_neighbors(x, 3).tolist()  # two neighbours each, then the item itself
        [[1, 2, 0], [0, 2, 1], [1, 0, 2]]
    """
    n = x.shape[0]
    out = np.repeat(np.arange(n, dtype=np.int64)[:, None], k, axis=1)
    if n > 1:
        kc = min(k, n - 1)
        rows = max(1, block_elements(x.device) // n)
        out[:, :kc] = exact_neighbors(x, torch.arange(n, device=x.device), kc,
                                      rows).cpu().numpy()
    return out


def local_communities_bytes(n: int, d: int, largest_cell: int, *, ranks: int, keep: int,
                            window: int, workers: int) -> int:
    """Bytes :func:`local_communities` adds beyond its input: the outputs (int64 labels, the
    neighbour table in int32 up to 2^31 items), the cells' order, and per cell in flight (at
    most ``workers``, counted at the largest cell's size): its rows, a block of about 4M
    similarities, its kNN table, its graph of ``2 n window`` edges through scipy (about 60
    bytes an edge) and METIS's copy (about 80 bytes an edge).

    Example:
        >>> from hardbatch.batching.local_communities import local_communities_bytes
        >>> round(local_communities_bytes(10**7, 128, 30_000, ranks=23, keep=19, window=20,
        ...                               workers=2) / 2**30, 2)
        1.28
    """
    width = 4 if n < 2**31 else 8
    cell = largest_cell * (d * 4 + ranks * 8 * 2 + 2 * window * 140) + 4 * BLOCK_ELEMENTS_CPU * 2
    return n * (8 + 8 + keep * width) + workers * cell


def global_communities_bytes(n: int, d: int, *, ranks: int, window: int,
                             index: bool) -> int:
    """Bytes the global build (one kNN graph of every item, one METIS run) adds beyond its
    input, by the same accounting as :func:`local_communities_bytes`: the int64 ``[N, ranks]``
    kNN table, an index's copy of the rows (``index``: faiss IVF), the graph of ``2 N window``
    edges through scipy and METIS's copy, the labels.

    Example:
        >>> from hardbatch.batching.local_communities import global_communities_bytes
        >>> round(global_communities_bytes(10**7, 128, ranks=23, window=20, index=True) / 2**30)
        59
    """
    return n * (ranks * 8 + (d * 4 if index else 0) + 2 * window * 140 + 8)


def local_communities(embeddings, cells, parts: int, *, skip: int, window: int,
                      partitioner: str = "metis", seed: int = 0, imbalance: float = 1.03,
                      edges: str = "union", keep: int | None = None, cell_batches: int = 0,
                      batch_size: int | None = None, workers: int = 2,
                      progress: bool | None = None,
                      memory_limit: int | None = None) -> LocalCommunities:
    """B3's communities of unit rows, cell by cell (module docstring).

    Args:
        embeddings: ``[N, d]`` unit rows (tensor or array; float32 used as is).
        cells: int64 ``[N]`` cell ids (e.g. :func:`coarse_cells`).
        parts: communities in all, shared out among the non-empty cells by size (at least one
            each; :func:`~hardbatch.neighbors.kmeans_tree.apportion`); cell c's labels follow
            those of the cells before it.
        skip, window, partitioner, imbalance, edges: as in
            :func:`~hardbatch.batching.communities.community_labels`.
        seed: cell c's partition step runs with ``derive_seed(seed, c)``, its sub-cells
            (``cell_batches``) with ``derive_seed(seed, 0xCE11, c)``.
        keep: ranks of each item's cell-local table returned (default ``skip + window``).
        cell_batches, batch_size: sub-cells of about ``cell_batches`` batches of
            ``batch_size`` within each cell (:func:`~hardbatch.batching.communities.
            community_cells`), METIS once per sub-cell; 0: once per cell.
        workers: cells held at once: the kNN graph of one cell in the calling thread (with
            torch's threads) while a second thread runs the partition step (METIS, which
            releases the GIL) of the cells before it; 1: one cell after the other.
        progress: a bar over the cells (None: when stderr is a terminal).
        memory_limit: bytes the build may add (None: the available memory); above it a
            ``ValueError`` before anything is allocated (:func:`local_communities_bytes`).

    Returns:
        :class:`LocalCommunities` (labels, neighbours: item ids, int32 below 2^31 items, a
        row padded with the item itself where its cell holds fewer than ``keep + 1`` items;
        sub-cells with ``cell_batches``; component seconds: the kNN graphs' in the calling
        thread, the partition steps' in the second). Deterministic for a seed, whatever
        ``workers``.

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch.batching.local_communities import local_communities
        >>> x = torch.nn.functional.normalize(torch.randn(400, 8, generator=torch.Generator()
        ...                                   .manual_seed(0)), dim=1)
        >>> cells = (x[:, 0] > 0).long().numpy()  # two cells
        >>> out = local_communities(x, cells, 8, skip=2, window=6)
        >>> sorted(set(out.labels.tolist())) == list(range(8)), out.neighbors.shape
        (True, (400, 8))
        >>> all(len(set(cells[out.labels == c])) == 1 for c in range(8))  # parts within cells
        True
    """
    x = torch.as_tensor(embeddings).float()
    n, d = x.shape
    cells = np.asarray(cells, np.int64)
    if cells.shape != (n,) or (n and cells.min() < 0):
        raise ValueError(f"cells must hold one cell id >= 0 per item ({n}), got shape "
                         f"{cells.shape}")
    ranks = check_int(skip, "skip", low=0) + check_int(window, "window", low=1)
    keep = ranks if keep is None else check_int(keep, "keep", low=0, high=ranks)
    workers = check_int(workers, "workers", low=1)
    if cell_batches:
        batch_size = check_int(batch_size, "batch_size", low=1)
    counts = np.bincount(cells, minlength=1)
    nonempty = np.flatnonzero(counts)
    parts = check_int(parts, "parts", low=1, high=n)
    if parts < len(nonempty):
        raise ValueError(f"parts={parts} must be >= {len(nonempty)}, the non-empty cells (each "
                         "gets at least one community); pass more parts or fewer, larger cells")
    check_memory(local_communities_bytes(n, d, int(counts.max(initial=0)), ranks=ranks,
                                         keep=keep, window=window, workers=workers),
                 n=n, d=d, what=f"the cell-local community build ({len(nonempty)} cells)",
                 memory_limit=memory_limit,
                 reduce="smaller cells (coarse_cells(cell_items=...)), fewer workers or a smaller "
                        "window")
    share = apportion(counts, parts)
    first = np.concatenate([[0], np.cumsum(share)])
    members = np.argsort(cells, kind="stable")  # each cell's items in item order
    start = np.concatenate([[0], np.cumsum(counts)])
    labels = np.empty(n, np.int64)
    neighbors = np.empty((n, keep), np.int32 if n < 2**31 else np.int64)
    subcells = np.empty(n, np.int64) if cell_batches else None
    seconds = {"knn": 0.0, "partition": 0.0}
    lock = threading.Lock()

    def knn(c: int) -> tuple:  # in the calling thread, with its torch threads
        t0 = time.perf_counter()
        items = members[start[c]:start[c + 1]]
        xc = x[torch.from_numpy(items).to(x.device)]
        nbrs = cell_neighbors(xc, ranks)
        seconds["knn"] += time.perf_counter() - t0
        return c, items, xc, nbrs

    def partition(c: int, items: np.ndarray, xc: torch.Tensor, nbrs: np.ndarray) -> None:
        t0 = time.perf_counter()
        sub = community_cells(xc, batch_size, seed=_rng.derive_seed(seed, 0xCE11, c),
                              cell_batches=cell_batches, max_cells=int(share[c])
                              ) if cell_batches else None
        labels[items] = first[c] + community_labels(
            nbrs, int(share[c]), skip=skip, window=window, partitioner=partitioner,
            seed=_rng.derive_seed(seed, c), embeddings=xc, imbalance=imbalance, edges=edges,
            cells=sub)
        neighbors[items] = items[nbrs[:, :keep]]
        if sub is not None:
            subcells[items] = sub + (start[c] if len(items) else 0)
        with lock:
            seconds["partition"] += time.perf_counter() - t0

    with BuildLog(_LOG, "local_communities", method=partitioner) as log:
        log.set(n=n, d=d, cells=len(nonempty), largest_cell=int(counts.max(initial=0)),
                parts=parts, workers=workers)
        bar = progress_bar(len(nonempty), "communities by cell", progress)
        by_size = nonempty[np.argsort(-counts[nonempty], kind="stable")]  # largest first
        if workers == 1:
            for c in by_size.tolist():
                partition(*knn(int(c)))
                bar.update(1)
        else:  # cell i's partition step in a second thread while cell i + 1's kNN graph runs
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending: deque = deque()
                for c in by_size.tolist():
                    pending.append(pool.submit(partition, *knn(int(c))))
                    while len(pending) >= workers:  # at most `workers` cells held at once
                        pending.popleft().result()
                        bar.update(1)
                while pending:
                    pending.popleft().result()
                    bar.update(1)
        bar.close()
        if subcells is not None:  # dense ids, in the order of (cell, sub-cell)
            subcells = np.unique(subcells, return_inverse=True)[1].reshape(n).astype(np.int64)
        log.set(knn_s=round(seconds["knn"], 3), partition_s=round(seconds["partition"], 3))
        log.hold(labels.nbytes, neighbors.nbytes, members.nbytes)
        return LocalCommunities(labels, neighbors, subcells, seconds)
