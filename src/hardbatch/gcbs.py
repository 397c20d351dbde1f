"""Global Contrastive Batch Sampling (GCBS; Sachidananda et al.), reference implementation.

GCBS chooses a permutation of the items so that batches cut sequentially
from it hold pairs with large similarity (gcbs paper, sections 4-5):

1. estimate the ``quantile`` (e.g. 0.999) of the off-diagonal similarities
   ``S = X Y^T`` from a sample of rows (no N x N matrix is formed);
2. sparsify: keep the pairs with ``S_ij`` above that value (eq. 5);
3. symmetrise the pattern and run reverse Cuthill-McKee
   (``scipy.sparse.csgraph.reverse_cuthill_mckee``), the bandwidth heuristic
   of section 5.2; disconnected components are ordered one after the other
   and items without any strong pair end up together;
4. batch the permuted order sequentially.

For unpaired (self-supervised) data ``Y = X``; for paired data ``(X, Y)``
(queries and documents, captions and images) pass ``paired=Y``: the cross
similarity ``X Y^T`` is thresholded, as in the paper. Rows are L2-normalised
(cosine similarity).

Step 2 is exact by default (``method="exact"``: blocked dense products,
O(N^2 d) time, O(nnz) memory). ``method="ivf"`` is an inverted-file
approximation: spherical k-means puts the items in ``nlist`` (default sqrt(N))
lists, and each list is compared, by one dense product, with the ``nprobe``
lists whose centroids are nearest: about nprobe/nlist of the exact cost
(N=100k, d=768: ~10 s instead of ~4 min on 2 cores, batches within 2% of the
exact version's hardness; docs/benchmarks.md). ``method="faiss"`` does the
same with a faiss ``IndexIVFFlat.range_search`` (``pip install faiss-cpu``);
on CPU it scans each query separately and was 4-10x slower than ``"ivf"``
here, but it is the natural route to faiss-gpu.

``method="partition"`` (for millions of items) replaces the global step 2-3
by coarse spherical k-means cells: exact pairs and reverse Cuthill-McKee
within each cell, cells chained by centroid similarity, pairs across cells
dropped (about N^2 d / P work for P cells; ``partitions=1`` is ``"exact"``).

``device=`` runs the threshold estimate and the products of steps 1-2 on any
torch device (``"cuda"``), ``precision="bf16" | "fp16"`` multiplies half
-precision embeddings with fp32 accumulation (pairs within a rounding error
of the threshold may flip). Step 2 is cut into units (row blocks for
``"exact"`` and ``"faiss"``, inverted lists for ``"ivf"``) so that
:func:`hardbatch.distributed.gcbs_permutation` can share them across ranks;
the reordering (step 3) runs on the CPU of every rank.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import reverse_cuthill_mckee

from . import _rng
from ._validation import as_embeddings, check_int
from ._device import (BLOCK_ELEMENTS_CPU, Precision, block_elements, check_precision,
                      matmul_fp32, resolve_device)

__all__ = ["GCBSSetup", "PairSearchPlan", "PartitionPlan", "gcbs_permutation", "gcbs_setup",
           "partition_count", "rcm_order", "similarity_threshold", "thresholded_pairs"]

_QUANTILE_SAMPLE = 20_000_000


def similarity_threshold(x: np.ndarray, y: np.ndarray, quantile: float, seed: int = 0,
                         sample_size: int = _QUANTILE_SAMPLE, *,
                         device: str | torch.device | None = None,
                         precision: Precision = "fp32") -> float:
    """Estimate the ``quantile`` of the off-diagonal entries of ``x @ y.T`` from sampled rows.

    Rows are drawn without replacement until about ``sample_size`` entries are
    covered (all rows when N is small, then the value is exact). ``device`` and
    ``precision`` as in :func:`gcbs_permutation`. Memory: the sampled
    similarities (``sample_size`` floats, 80 MB) on ``device``.
    """
    n = x.shape[0]
    dev, dtype = resolve_device(device), check_precision(precision)
    rows_needed = min(n, max(1, -(-sample_size // max(1, n - 1))))
    rows = np.sort(_rng.permutation(n, _rng.derive_seed(seed, 0x0A17))[:rows_needed])
    xt = torch.from_numpy(x).to(dev, dtype)
    yt = xt if y is x else torch.from_numpy(y).to(dev, dtype)
    values = []
    per = max(1, BLOCK_ELEMENTS_CPU // n)
    for s in range(0, len(rows), per):
        r = torch.from_numpy(rows[s:s + per]).to(dev)
        sims = matmul_fp32(xt[r], yt.T)
        sims[torch.arange(len(r), device=dev), r] = -torch.inf  # self pairs: smallest, skipped
        values.append(sims.reshape(-1))
    flat = torch.cat(values)
    count = flat.numel() - len(rows)
    k = int(np.clip(np.ceil(quantile * count), 1, count)) + len(rows)
    return float(flat.kthvalue(k).values)


def _kmeans(y: torch.Tensor, k: int, seed: int, iters: int = 10) -> torch.Tensor:
    """Spherical k-means centroids [k, d] (fp32) from a sample of at most 64k rows of ``y``."""
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


_EMPTY = (np.empty(0, np.int64), np.empty(0, np.int64))


def check_search_args(nlist, nprobe) -> tuple[int | None, int]:
    """``nlist`` (None: the method's default) and ``nprobe`` of the inverted-file searches."""
    if nlist is not None:
        nlist = check_int(nlist, "nlist", low=1)
    return nlist, check_int(nprobe, "nprobe", low=1)


def _concat(rows: list, cols: list) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        return _EMPTY
    return (np.concatenate(rows).astype(np.int64, copy=False),
            np.concatenate(cols).astype(np.int64, copy=False))


class PairSearchPlan:
    """Step 2 of GCBS (pairs above the threshold), cut into units that ranks can share.

    Units are row blocks (``"exact"``, ``"faiss"``) or inverted lists
    (``"ivf"``); :meth:`pairs` returns the pairs found by units [start, end).
    Used whole by :func:`thresholded_pairs` and in shards by
    :func:`hardbatch.distributed.gcbs_permutation`.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, threshold: float, method: str, *,
                 nlist: int | None, nprobe: int, seed: int, device, precision: str) -> None:
        if method not in ("exact", "ivf", "faiss"):
            raise ValueError(f"method={method!r} must be 'exact', 'ivf', 'faiss' or "
                             "(in gcbs_permutation) 'partition'")
        nlist, nprobe = check_search_args(nlist, nprobe)
        self.x, self.y, self.threshold, self.method = x, y, float(threshold), method
        self.seed, self.nprobe = seed, nprobe
        self.device, self.dtype = resolve_device(device), check_precision(precision)
        n = x.shape[0]
        if method == "exact":
            self.per = max(1, (4 * block_elements(self.device)) // n)
            self.num_units = -(-n // self.per)
        elif method == "faiss":
            self.per = 65536
            self.num_units = -(-n // self.per)
            self.nlist = nlist or int(max(1, min(n // 39, 4 * np.sqrt(n))))
        else:
            self.nlist = int(nlist or max(1, round(np.sqrt(n))))
            self.num_units = self.nlist
        self._ivf = None
        self._faiss = None

    def _tensors(self):
        xt = torch.from_numpy(self.x).to(self.device, self.dtype)
        yt = xt if self.y is self.x else torch.from_numpy(self.y).to(self.device, self.dtype)
        return xt, yt

    def pairs(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (i, j), i != j, above the threshold found by units [start, end)."""
        if end <= start:
            return _EMPTY
        if self.method == "exact":
            return self._exact(start, end)
        if self.method == "ivf":
            return self._ivf_pairs(start, end)
        return self._faiss_pairs(start, end)

    def _exact(self, start: int, end: int):
        n = self.x.shape[0]
        xt, yt = self._tensors()
        rows, cols = [], []
        for s in range(start * self.per, min(n, end * self.per), self.per):
            e = min(n, s + self.per)
            sims = matmul_fp32(xt[s:e], yt.T)
            sims[torch.arange(e - s, device=self.device),
                 torch.arange(s, e, device=self.device)] = -torch.inf
            r, c = torch.nonzero(sims > self.threshold, as_tuple=True)
            rows.append((r + s).cpu().numpy())
            cols.append(c.cpu().numpy())
        return _concat(rows, cols)

    def _ivf_setup(self):
        """Spherical k-means lists of the columns; each list probes its ``nprobe`` nearest lists."""
        n, nlist = self.x.shape[0], self.nlist
        nprobe = int(min(max(1, self.nprobe), nlist))
        xt, yt = self._tensors()
        cent = _kmeans(yt, nlist, self.seed)

        def assign(t):
            return torch.cat([matmul_fp32(t[s:s + 65536], cent.T.to(t.dtype)).argmax(1)
                              for s in range(0, n, 65536)])

        col_list = assign(yt)
        row_list = col_list if self.x is self.y else assign(xt)
        probe = (cent @ cent.T).topk(nprobe, dim=1).indices.cpu()

        def lists(labels):
            order = torch.argsort(labels, stable=True)
            start = torch.zeros(nlist + 1, dtype=torch.int64)
            start[1:] = torch.bincount(labels, minlength=nlist).cumsum(0).cpu()
            return order, start

        self._ivf = (xt, yt, probe, lists(col_list), lists(row_list))

    def _ivf_pairs(self, start: int, end: int):
        """Cost about N * (nprobe / nlist) * N * d instead of N^2 d (module docstring)."""
        if self._ivf is None:
            self._ivf_setup()
        xt, yt, probe, (col_order, col_start), (row_order, row_start) = self._ivf
        rows, cols = [], []
        for c in range(start, end):
            r_ids = row_order[row_start[c]:row_start[c + 1]]
            if r_ids.numel() == 0:
                continue
            c_ids = torch.cat([col_order[col_start[p]:col_start[p + 1]]
                               for p in probe[c].tolist()])
            sims = matmul_fp32(xt[r_ids], yt[c_ids].T)
            r, k = torch.nonzero(sims > self.threshold, as_tuple=True)
            rr, cc = r_ids[r], c_ids[k]
            keep = rr != cc
            rows.append(rr[keep].cpu().numpy())
            cols.append(cc[keep].cpu().numpy())
        return _concat(rows, cols)

    def _faiss_pairs(self, start: int, end: int):
        try:
            import faiss
        except ImportError as exc:
            raise ImportError("method='faiss' needs faiss: pip install faiss-cpu "
                              "(or use method='ivf')") from exc
        x, y = self.x, self.y
        n, d = y.shape
        if self._faiss is None:
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, self.nlist, faiss.METRIC_INNER_PRODUCT)
            sample = _rng.permutation(n, _rng.derive_seed(self.seed, 0x1BF))[:64 * self.nlist]
            index.cp.seed = int(self.seed) & 0x7FFFFFFF
            index.train(y[np.sort(sample)])
            index.add(y)
            index.nprobe = min(self.nprobe, self.nlist)
            self._faiss = index
        lo, hi = start * self.per, min(n, end * self.per)
        lims, _, ids = self._faiss.range_search(x[lo:hi], self.threshold)
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(lims.astype(np.int64)))
        cols = ids.astype(np.int64)
        keep = rows != cols
        return rows[keep], cols[keep]


def thresholded_pairs(x: np.ndarray, y: np.ndarray, threshold: float,
                      method: Literal["exact", "ivf", "faiss"] = "exact", *,
                      nlist: int | None = None, nprobe: int = 8, seed: int = 0,
                      device: str | torch.device | None = None,
                      precision: Precision = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j), i != j, with ``x_i . y_j > threshold`` (``"ivf"``, ``"faiss"``: approximately).

    Memory: O(nnz) pairs plus one block of similarities on ``device``.
    """
    plan = PairSearchPlan(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed,
                     device=device, precision=precision)
    return plan.pairs(0, plan.num_units)


class GCBSSetup(NamedTuple):
    """What :func:`gcbs_setup` returns: unit rows X, Y [N, d] (Y is X when unpaired), the
    similarity threshold, and the checked ``nlist`` / ``nprobe``."""

    x: np.ndarray
    y: np.ndarray
    threshold: float | None
    nlist: int | None
    nprobe: int


def gcbs_setup(embeddings, paired, quantile: float, method: str, seed: int, nlist, nprobe,
               device, precision: Precision) -> GCBSSetup:
    """Checked GCBS inputs and the similarity threshold (GCBS steps 1-2, before the pair search).

    Shared by :func:`gcbs_permutation` and :func:`hardbatch.distributed.gcbs_permutation`.
    The threshold is None for a single item (its order is ``[0]``).
    """
    if method not in ("exact", "ivf", "faiss", "partition"):
        raise ValueError(f"method={method!r} must be 'exact', 'ivf', 'faiss' or 'partition'")
    nlist, nprobe = check_search_args(nlist, nprobe)
    x = as_embeddings(embeddings, "embeddings", normalize=True)
    if paired is None:
        y = x
    else:
        y = as_embeddings(paired, "paired", normalize=True)
        if y.shape != x.shape:
            raise ValueError(f"paired has shape {y.shape} but embeddings has shape {x.shape}; "
                             "paired data needs one row of Y per row of X with the same dimension")
    quantile = float(quantile)
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile={quantile} must lie strictly between 0 and 1 (paper: 0.999)")
    threshold = None if x.shape[0] == 1 else similarity_threshold(
        x, y, quantile, seed, device=device, precision=precision)
    return GCBSSetup(x, y, threshold, nlist, nprobe)


def rcm_order(rows: np.ndarray, cols: np.ndarray, n: int, seed: int) -> torch.Tensor:
    """Step 3: symmetrised pattern, seeded random relabelling, reverse Cuthill-McKee."""
    # Random relabelling: RCM breaks ties (start node, equal degrees) by label.
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.empty(n, np.int64)
    inverse[relabel] = np.arange(n)
    r, c = inverse[rows], inverse[cols]
    adj = sp.coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(n, n)).tocsr()
    adj = (adj + adj.T).tocsr()
    order = reverse_cuthill_mckee(adj, symmetric_mode=True)
    return torch.from_numpy(relabel[np.asarray(order, np.int64)])


class PartitionPlan:
    """Partitioned GCBS: coarse k-means cells, exact pairs + RCM within each, cells chained.

    Items are put in the cell of their nearest centroid (spherical k-means on
    ``y``, :func:`_kmeans`); cells are visited along a greedy nearest-centroid
    chain from cell 0, so consecutive cells are similar; within a cell the
    pairs above the global ``threshold`` are found exactly and ordered by
    reverse Cuthill-McKee (:func:`rcm_order`). Pairs across cells are dropped.
    Cost about N^2 d / P for P balanced cells, memory O(N*d + nnz of one cell).
    With ``partitions=1`` this is exactly the ``"exact"`` method.

    The cells are independent: :meth:`order` returns the order of the items of
    chain positions [start, end), so ranks can share them
    (:func:`hardbatch.distributed.gcbs_permutation`); :meth:`shard` cuts the
    chain into contiguous ranges of about equal cost (sum of squared cell sizes).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, threshold: float, partitions: int,
                 seed: int, device, precision: str) -> None:
        self.x, self.y, self.threshold, self.seed = x, y, threshold, seed
        self.device, self.precision = device, precision
        n = x.shape[0]
        if partitions == 1:
            cell = torch.zeros(n, dtype=torch.int64)
            sim = torch.ones(1, 1)
        else:
            dev = resolve_device(device)
            cent = _kmeans(torch.from_numpy(y).to(dev), partitions, seed)
            cell = self.assign(x, cent)
            sim = (cent @ cent.T).cpu()
        chain, left = [0], set(range(1, partitions))
        while left:  # greedy chain: next, the most similar cell not yet visited
            nxt = max(left, key=lambda c: float(sim[chain[-1], c]))
            chain.append(nxt)
            left.remove(nxt)
        self.adopt(cell, torch.tensor(chain, dtype=torch.int64))

    def adopt(self, cell: torch.Tensor, chain: torch.Tensor) -> None:
        """Use these cells [N] and this chain [P] (e.g. rank 0's, broadcast to every rank)."""
        partitions = len(chain)
        self.cell, self.chain = cell.cpu(), [int(c) for c in chain.tolist()]
        self.members = torch.argsort(self.cell, stable=True).numpy()
        self.start = np.zeros(partitions + 1, np.int64)
        self.start[1:] = np.cumsum(np.bincount(self.cell.numpy(), minlength=partitions))

    @staticmethod
    def assign(x: np.ndarray, cent: torch.Tensor) -> torch.Tensor:
        """Cell (nearest centroid) of every row of ``x``, int64 [N] on the CPU."""
        xt = torch.from_numpy(x).to(cent.device)
        return torch.cat([(xt[s:s + 65536] @ cent.T).argmax(1)
                          for s in range(0, x.shape[0], 65536)]).cpu()

    def shard(self, rank: int, world: int) -> tuple[int, int]:
        """Chain positions [start, end) of ``rank``: contiguous, about equal sum of size^2."""
        sizes = np.array([self.start[c + 1] - self.start[c] for c in self.chain], np.float64)
        cost = np.concatenate([[0.0], np.cumsum(sizes ** 2)])
        cuts = np.searchsorted(cost, cost[-1] * np.arange(world + 1) / world, side="left")
        cuts[0], cuts[-1] = 0, len(self.chain)
        cuts = np.maximum.accumulate(cuts)
        return int(cuts[rank]), int(cuts[rank + 1])

    def order(self, start: int, end: int) -> np.ndarray:
        """Items of chain positions [start, end), each cell in its RCM order, int64."""
        out = [np.empty(0, np.int64)]
        for c in self.chain[start:end]:
            idx = self.members[self.start[c]:self.start[c + 1]]
            if len(idx) <= 1:
                out.append(idx)
                continue
            xs = np.ascontiguousarray(self.x[idx])
            ys = xs if self.y is self.x else np.ascontiguousarray(self.y[idx])
            rows, cols = thresholded_pairs(xs, ys, self.threshold, "exact", device=self.device,
                                           precision=self.precision)
            seed = self.seed if len(self.chain) == 1 else _rng.derive_seed(self.seed, c)
            out.append(idx[rcm_order(rows, cols, len(idx), seed).numpy()])
        return np.concatenate(out).astype(np.int64, copy=False)


def partition_count(n: int, partitions: int | None) -> int:
    """Cells of ``method="partition"``: ``partitions`` checked, or ceil(N / 100,000)."""
    return -(-n // 100_000) if partitions is None else check_int(
        partitions, "partitions", low=1, high=n)


def gcbs_permutation(embeddings: torch.Tensor | np.ndarray, quantile: float = 0.999,
                     paired: torch.Tensor | np.ndarray | None = None, *,
                     method: Literal["exact", "ivf", "faiss", "partition"] = "exact",
                     seed: int = 0, nlist: int | None = None, nprobe: int = 8,
                     partitions: int | None = None,
                     device: str | torch.device | None = None,
                     precision: Precision = "fp32") -> torch.Tensor:
    """GCBS item order: batches cut sequentially from it group strongly similar pairs.

    Args:
        embeddings: X, [N, d].
        quantile: similarities above this quantile of the off-diagonal entries
            of ``X Y^T`` become edges (paper: 0.999; Appendix J scales it so
            about ``2B`` entries per row survive).
        paired: Y, [N, d] paired with X row by row, or None for ``Y = X``.
        method: ``"exact"`` (blocked dense), ``"ivf"`` (clustered, approximate),
            ``"faiss"`` (faiss IVF range search, approximate) or ``"partition"``
            (for N in the millions: coarse k-means cells, exact pairs and reverse
            Cuthill-McKee within each cell, cells chained by centroid similarity;
            pairs across cells are dropped).
        seed: seeds the quantile sample and the random relabelling that breaks
            ties in reverse Cuthill-McKee (so epochs with equal embeddings differ).
        nlist, nprobe: inverted lists (default sqrt(N)) and lists probed per list
            (positive integers; ``nprobe >= nlist`` probes every list).
        partitions: cells of ``"partition"`` (default ceil(N / 100,000)).
        device: where the products run (``"cuda"``: threshold, pairs; the ordering
            stays on the CPU).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` products (fp32 accumulation).

    Returns:
        int64 tensor [N], a permutation of ``range(N)``.

    Memory: the embeddings (on ``device``), the quantile sample (80 MB), one
    block, and O(nnz) pairs, about (1 - quantile) * N^2 (N = 1M, q = 0.999:
    10^9 pairs, 16 GB of int64 indices: raise the quantile at that scale,
    Appendix J).
    """
    x, y, threshold, nlist, nprobe = gcbs_setup(embeddings, paired, quantile, method, seed, nlist,
                                                nprobe, device, precision)
    n = x.shape[0]
    if threshold is None:
        return torch.zeros(1, dtype=torch.int64)
    if method == "partition":
        plan = PartitionPlan(x, y, threshold, partition_count(n, partitions), seed, device,
                              precision)
        return torch.from_numpy(plan.order(0, len(plan.chain)))
    rows, cols = thresholded_pairs(x, y, threshold, method, nlist=nlist, nprobe=nprobe,
                                   seed=seed, device=device, precision=precision)
    return rcm_order(rows, cols, n, seed)
