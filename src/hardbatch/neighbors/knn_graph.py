"""Neighbour graphs over item embeddings: the proximity graph (BatchSampler eq. 3) and the exact kNN graph.

Both return an int64 neighbour table [N, K] whose row ``i`` lists the K chosen neighbours of item
``i`` by decreasing inner product, never ``i`` itself. Nothing of size N x N (or N x M x d) is ever
materialised: work runs over bounded blocks of rows.

The proximity graph (candidate pools shared by small groups of items, their balanced design
and the block layout of its build) lives in :mod:`hardbatch.neighbors.proximity_graph` and
:mod:`hardbatch.neighbors.proximity_pools`; their public names are re-exported here.

Devices, precision, shards
--------------------------
``device=`` runs the products and top-k selections on any torch device (``"cuda"``: one bounded
block of ~64M similarities at a time, ~4M on CPU, whose gathered candidate embeddings are bounded
by the same number of floats); the candidate pools are always drawn on the CPU by the same seeded
kernel, so every device sees the same candidates. ``precision="bf16" | "fp16"`` stores the
embeddings in half precision and multiplies them with fp32 accumulation (on CUDA the product is
returned in fp32 via ``out_dtype``; elsewhere the half result is widened), halving memory traffic;
neighbours may then differ from the fp32 graph in near-ties. Work is cut into blocks of whole
groups (rows for :func:`knn_graph`); the sharded builds (:func:`sharded_knn_graph`,
:func:`~hardbatch.neighbors.proximity_graph.sharded_proximity_graph`) hand each rank of a
torch.distributed group a contiguous range of blocks and all-gather the rows, which reproduces
the single-process graph exactly. The
embeddings may be a tensor on any device: they are checked there and never leave it (a CUDA tensor
is not copied to the host, only the neighbour table is).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from .. import _rng
from .._device import Precision, block_elements, check_precision, resolve_device
from .._logging import NO_BAR, BuildLog, get_logger, progress_bar
from .._validation import check_int, embedding_tensor
from ..distributed import all_gather_rows, rank_share
from .exact_search import exact_neighbors
from .index_search import index_knn_graph, resolve_knn_method
from .proximity_graph import ProximityGraphLayout, proximity_graph, sharded_proximity_graph
from .proximity_pools import (candidate_pools, check_graph_sizes, check_group_size,
                              default_group_size, pool_design, pool_members)

__all__ = ["KNNGraphLayout", "ProximityGraphLayout", "candidate_pools", "check_graph_sizes",
           "check_group_size", "default_group_size", "knn_graph", "pool_design",
           "pool_members", "proximity_graph", "sharded_knn_graph", "sharded_proximity_graph"]

_LOG = get_logger("neighbors")


_KNN_METHODS = ("exact", "faiss", "faiss-ivf")


class KNNGraphLayout:
    """Validated inputs and row blocks of one kNN-graph build (see
    :class:`ProximityGraphLayout`): :func:`knn_graph` runs all blocks, :func:`sharded_knn_graph`
    one contiguous range per rank.

    Example:
        >>> from hardbatch.neighbors.knn_graph import KNNGraphLayout
        >>> layout = KNNGraphLayout(np.eye(40, 8) + 0.1, 5, "exact", None, "fp32", None, 16, 0)
        >>> layout.rows(0, layout.num_blocks).shape
        torch.Size([40, 5])
    """

    def __init__(self, embeddings, neighbors: int, method: str, device, precision: str,
                 nlist: int | None, nprobe: int, seed: int) -> None:
        x = embedding_tensor(embeddings)
        self.neighbors = check_int(neighbors, "neighbors", low=1)
        n = x.shape[0]
        if self.neighbors >= n:
            raise ValueError(f"neighbors={neighbors} must be smaller than the number of items N={n}")
        if method not in _KNN_METHODS:
            raise ValueError(f"method={method!r} must be one of {list(_KNN_METHODS)}")
        self.x, self.num_items, self.method = x, n, method
        self.device = resolve_device(device)
        self.dtype = check_precision(precision)
        self.nlist, self.nprobe, self.seed = nlist, check_int(nprobe, "nprobe", low=1), seed
        self.rows_per_block = max(1, block_elements(self.device) // n)
        if method != "exact":
            self.rows_per_block = max(self.rows_per_block, 16384)
        self.num_blocks = -(-n // self.rows_per_block)
        self._index = None
        self.block_bytes = 0  # largest block so far: similarities, top-k values and indices

    def rows(self, block_start: int, block_end: int, bar=NO_BAR) -> torch.Tensor:
        """Neighbour rows [end - start, K] (CPU int64) of the items of row blocks [start, end);
        ``bar.update(1)`` after each block."""
        start = min(self.num_items, block_start * self.rows_per_block)
        end = min(self.num_items, block_end * self.rows_per_block)
        out = torch.empty((end - start, self.neighbors), dtype=torch.int64)
        if self.method != "exact":
            return self._faiss_rows(start, end, out, bar)
        emb = self.x.to(self.device, self.dtype)
        for s in range(start, end, self.rows_per_block):
            e = min(end, s + self.rows_per_block)
            rows = torch.arange(s, e, device=self.device)
            out[s - start:e - start] = exact_neighbors(emb, rows, self.neighbors, e - s).cpu()
            sims_bytes = (e - s) * self.num_items * 4  # float32 similarities
            self.block_bytes = max(self.block_bytes, sims_bytes + (e - s) * self.neighbors * 12)
            bar.update(1)
        return out

    def _faiss_rows(self, start: int, end: int, out: torch.Tensor, bar=NO_BAR) -> torch.Tensor:
        try:
            import faiss
        except ImportError as exc:
            raise ImportError(f"method={self.method!r} needs faiss: pip install faiss-cpu "
                              "(or faiss-gpu), or use method='exact'") from exc
        x, n, k = self.x.cpu().numpy(), self.num_items, self.neighbors
        if self._index is None:
            d = x.shape[1]
            if self.method == "faiss":
                index = faiss.IndexFlatIP(d)
            else:
                nlist = int(self.nlist or max(1, min(n // 39, 4 * np.sqrt(n))))
                index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist,
                                           faiss.METRIC_INNER_PRODUCT)
                index.cp.seed = int(self.seed) & 0x7FFFFFFF
                sample = _rng.permutation(n, _rng.derive_seed(self.seed, 0x1BF))[:64 * nlist]
                index.train(x[np.sort(sample)])
                index.nprobe = min(self.nprobe, nlist)
            if self.device.type == "cuda" and hasattr(faiss, "StandardGpuResources"):
                self._res = faiss.StandardGpuResources()
                index = faiss.index_cpu_to_gpu(self._res, self.device.index or 0, index)
            index.add(x)
            self._index = index
        for s in range(start, end, 65536):  # bounded result buffers
            e = min(end, s + 65536)
            _, ids = self._index.search(x[s:e], k + 1)
            own = ids == np.arange(s, e)[:, None]
            # Drop the item itself (wherever it appears) or else the last of the K + 1.
            own[~own.any(axis=1), k] = True
            out[s - start:e - start] = torch.from_numpy(ids[~own].reshape(e - s, k))
            self.block_bytes = max(self.block_bytes, x.nbytes + (e - s) * (k + 1) * 13)
            bar.update(-(-(e - s) // self.rows_per_block))
        return out


def knn_graph(embeddings: torch.Tensor | np.ndarray, neighbors: int = 100, *,
              method: Literal["auto", "exact", "faiss", "faiss-ivf", "hnsw"] = "auto",
              device: str | torch.device | None = None, precision: Precision = "fp32",
              nlist: int | None = None, nprobe: int = 16, seed: int = 0,
              progress: bool | None = None) -> torch.Tensor:
    """K-nearest-neighbour graph by inner product, excluding self (the paper's "kNN graph").

    Args:
        embeddings: [N, d] float tensor or array.
        neighbors: K, ``1 <= K < N``.
        method: ``"auto"`` (default: exact up to 50,000 items, on a GPU and in half precision,
            else a faiss IVF with nprobe tuned to recall@K >= 0.95 on sampled rows), ``"exact"``
            (blocked torch products, O(N^2 d)), ``"faiss"`` (``IndexFlatIP``, exact),
            ``"faiss-ivf"`` (``IndexIVFFlat``, fixed nprobe; GPU with faiss-gpu and a CUDA
            ``device``) or ``"hnsw"`` (hnswlib, tuned ef); see :mod:`hardbatch.neighbors.index_search`.
        device, precision, progress: as in :func:`proximity_graph` (precision: ``"exact"``).
        nlist, nprobe, seed: IVF lists (default min(N/39, 4 sqrt(N)); "auto": 2 sqrt(N)),
            lists probed ("faiss-ivf"; "auto" tunes it), the seed of index training, HNSW levels.

    Returns int64 CPU tensor [N, K], row i by decreasing similarity to i (ties and approximate
    methods may differ). Logs one INFO record on ``hardbatch.neighbors.knn_graph`` (N, d, method run, seconds,
    peak extra memory). Memory: O(N*K) output, the embeddings, 4M (CPU) / 64M (CUDA) similarities.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8), dim=1)
        >>> graph = hb.knn_graph(x, 5)
        >>> bool((graph[:, 0] == (x @ x.T).fill_diagonal_(-2).argmax(dim=1)).all())
        True
    """
    x = embedding_tensor(embeddings)
    method = resolve_knn_method(method, x.shape[0], resolve_device(device), precision)
    if method in ("hnsw", "auto-ivf"):
        return index_knn_graph(x, neighbors, method, seed=seed, nlist=nlist, progress=progress,
                               check_finite=False)  # x is checked above
    with BuildLog(_LOG, "knn_graph", method=method) as log:
        layout = KNNGraphLayout(x, neighbors, method, device, precision, nlist, nprobe, seed)
        log.set(n=layout.num_items, d=layout.x.shape[1], neighbors=layout.neighbors)
        bar = progress_bar(layout.num_blocks, f"kNN graph ({method})", progress)
        out = layout.rows(0, layout.num_blocks, bar)
        bar.close()
        log.hold(out.nbytes, layout.block_bytes)
        return out


def sharded_knn_graph(embeddings: torch.Tensor | np.ndarray, neighbors: int = 100, *,
                      method: Literal["exact", "faiss", "faiss-ivf"] = "exact",
                      device: str | torch.device | None = None, precision: Precision = "fp32",
                      nlist: int | None = None, nprobe: int = 16, seed: int = 0,
                      group=None) -> torch.Tensor:
    """:func:`knn_graph`, its rows built in contiguous row blocks shared by the ranks of the
    process ``group`` (None: the default group; one process: the plain build) and
    all-gathered: every rank returns the same [N, K] graph as one process would.

    Every rank must call it with the same embeddings and arguments. ``method`` is a build of
    :class:`KNNGraphLayout` (default ``"exact"``: the route whose only cross-machine
    differences are near-ties, :mod:`hardbatch.neighbors.index_search`).

    Example:
        >>> import torch
        >>> from hardbatch import knn_graph
        >>> from hardbatch.neighbors.knn_graph import sharded_knn_graph
        >>> x = torch.randn(40, 8)
        >>> torch.equal(sharded_knn_graph(x, 5), knn_graph(x, 5))  # one process: the same
        True
    """
    layout = KNNGraphLayout(embeddings, neighbors, method, device, precision, nlist, nprobe,
                            seed)
    start, end = rank_share(layout.num_blocks, group)
    return all_gather_rows(layout.rows(start, end), group)
