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

Step 2 keeps, besides, each item's ``min_partners`` strongest pairs (its nearest
neighbours, under ``X Y^T``) even when they fall below the threshold: with the global
quantile alone many items get no edge and RCM puts them at the end of the order, so the
epoch ended in random batches (docs/gcbs.md: 54% of the batches of MNIST, N = 10k, B = 256,
no harder than uniform ones). ``min_partners=0`` is the paper's graph.

For unpaired (self-supervised) data ``Y = X``; for paired data ``(X, Y)``
(queries and documents, captions and images) pass ``paired=Y``: the cross
similarity ``X Y^T`` is thresholded, as in the paper. Rows are L2-normalised
(cosine similarity).

``method="auto"`` (the default) picks ``"exact"`` up to ``AUTO_EXACT_MAX_ITEMS`` items,
``"ivf"`` up to ``AUTO_IVF_MAX_ITEMS`` and ``"partition"`` beyond (thresholds measured on a
2-core CPU, docs/gcbs.md). ``"exact"``, ``"ivf"`` and ``"faiss"`` are the pair searches of
:mod:`hardbatch.pair_search` (blocked dense; inverted lists compared by dense products; a
faiss range search).

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
from ._device import BLOCK_ELEMENTS_CPU, Precision, check_precision, matmul_fp32, resolve_device
from ._logging import NO_BAR, BuildLog, get_logger, progress_bar
from ._validation import as_embeddings, check_int
from .pair_search import (DEFAULT_MIN_PARTNERS, PairSearchPlan, check_min_partners,
                          check_search_args, spherical_kmeans, strongest_partners,
                          thresholded_pairs)

# PairSearchPlan, thresholded_pairs, check_* and strongest_partners live in pair_search.py and
# are re-exported here (hardbatch.distributed and older code import them from hardbatch.gcbs).
__all__ = ["AUTO_CELL_ITEMS", "AUTO_EXACT_MAX_ITEMS", "AUTO_IVF_MAX_ITEMS",
           "DEFAULT_MIN_PARTNERS", "METHODS", "GCBSSetup", "PairSearchPlan", "PartitionPlan",
           "check_min_partners", "check_search_args", "default_interleave", "gcbs_permutation",
           "gcbs_setup", "interleave_chunks", "resolve_build",
           "partition_count", "rcm_order", "resolve_method", "similarity_threshold",
           "strongest_partners", "thresholded_pairs"]

_QUANTILE_SAMPLE = 20_000_000
METHODS = ("auto", "exact", "ivf", "faiss", "partition")
# method="auto": measured on the 2-core CPU (bench_gcbs.py --auto-scan; docs/gcbs.md): ivf was
# faster than exact from 5,000 items on and than partition up to 400,000; partition holds a
# third of the memory at 1.28M (docs/benchmarks.md).
AUTO_EXACT_MAX_ITEMS = 5_000
AUTO_IVF_MAX_ITEMS = 1_000_000
AUTO_CELL_ITEMS = 10_000  # method="auto" above AUTO_IVF_MAX_ITEMS: partition cells of ~10k
_LOG = get_logger("gcbs")


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
    total = sum(v.numel() for v in values)
    count = total - len(rows)
    k = int(np.clip(np.ceil(quantile * count), 1, count)) + len(rows)
    top = total - k + 1  # the value sought is the top-th largest sampled similarity
    if total >= 1 << 20 and top <= total // 64:
        # Select among the values above a bound that about 4 * top of them pass (from every
        # 16th value): the same value as a selection over all of them, several times faster
        # (a full kthvalue over 20M floats took 0.4 s of a 1 s build at N = 20k).
        every = torch.cat([v[::16] for v in values])
        keep = min(every.numel(), 4 * top // 16 + 64)
        bound = every.kthvalue(every.numel() - keep + 1).values
        above = torch.cat([v[v >= bound] for v in values])
        if above.numel() >= top:
            return _threshold(above, above.kthvalue(above.numel() - top + 1).values)
    values = torch.cat(values)
    return _threshold(values, values.kthvalue(k).values)


def _threshold(values: torch.Tensor, value: torch.Tensor) -> float:
    """The threshold for the quantile's ``value``: halfway between it and the next sampled
    similarity above it by more than a gap (``value + gap`` when none is), so that pairs equal
    to the quantile's value stay below it, as in the paper (``sims > value``). The gap, 1e-5,
    is far above the rounding differences of float32 products between BLAS kernels and
    blockings (about 1e-7 for unit rows): every sampled pair lies at least half a gap from the
    threshold, and ``sims > threshold`` decides it the same way whatever product computed it
    (another block, kernel or machine). Where the sample is the whole matrix (N up to 3,162 at
    the default sample size) the pairs are machine-independent."""
    gap = 1e-5 * max(1.0, abs(float(value)))
    higher = values[values > value + gap]
    high = float(value) + gap if not higher.numel() else float(higher.min())
    return float(np.float32((float(value) + high) / 2))


def resolve_method(method: str, n: int) -> str:
    """The pair search ``method="auto"`` stands for at N items (others returned unchanged).

    ``"exact"`` up to ``AUTO_EXACT_MAX_ITEMS`` (5,000: under 0.4 s either way), ``"ivf"`` up
    to ``AUTO_IVF_MAX_ITEMS`` (1M; the fastest from 5,000 to 400,000 items on the 2-core CPU
    of docs/gcbs.md, with batches as hard as the exact ones), ``"partition"`` beyond (the
    pairs are held one cell at a time).
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be 'auto', 'exact', 'ivf', 'faiss' or "
                         "'partition'")
    if method != "auto":
        return method
    return "exact" if n <= AUTO_EXACT_MAX_ITEMS else (
        "ivf" if n <= AUTO_IVF_MAX_ITEMS else "partition")


def resolve_build(method: str, min_partners: int | None, partitions: int | None,
                  n: int) -> tuple[str, int, int | None]:
    """(method, min_partners, partitions) of a build of N items, defaults resolved and checked.

    ``"auto"`` becomes a method (:func:`resolve_method`); its ``"partition"`` uses cells of
    ``AUTO_CELL_ITEMS`` items unless ``partitions`` is given (checked for ``"partition"``
    only). Meant to be shared with :func:`hardbatch.distributed.gcbs_permutation`.
    """
    if method == "auto" and partitions is None:
        partitions = -(-n // AUTO_CELL_ITEMS)
    method = resolve_method(method, n)
    if method == "partition":
        partitions = partition_count(n, partitions)
    return method, check_min_partners(min_partners, n), partitions


def default_interleave(batch_size: int) -> int:
    """Chunk length for batches of B items: B / 8 (8 chunks per batch), at least 8; 0 below 16.

    Chosen on the exploration sets of docs/gcbs.md (B = 256): the shortest chunk costing at
    most 3% of the batch hardness of the uninterleaved order (32).
    """
    b = check_int(batch_size, "batch_size", low=1)
    return 0 if b < 16 else max(8, b // 8)


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
    resolve_method(method, 1)  # checks the name
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


def rcm_order(rows: np.ndarray, cols: np.ndarray, n: int, seed: int,
              log: BuildLog | None = None) -> torch.Tensor:
    """Step 3: symmetrised pattern, seeded random relabelling, reverse Cuthill-McKee.

    ``log``: the build's :class:`~hardbatch._logging.BuildLog`, told the bytes held here.
    """
    # Random relabelling: RCM breaks ties (start node, equal degrees) by label.
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.empty(n, np.int64)
    inverse[relabel] = np.arange(n)
    r, c = inverse[rows], inverse[cols]
    adj = sp.coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(n, n)).tocsr()
    sym = (adj + adj.T).tocsr()
    if log is not None:
        log.hold(rows.nbytes, cols.nbytes, r.nbytes, c.nbytes,
                 *(a.nbytes for m in (adj, sym) for a in (m.data, m.indices, m.indptr)))
    order = reverse_cuthill_mckee(sym, symmetric_mode=True)
    return torch.from_numpy(relabel[np.asarray(order, np.int64)])


class PartitionPlan:
    """Partitioned GCBS: coarse k-means cells, exact pairs + RCM within each, cells chained.

    Items are put in the cell of their nearest centroid (spherical k-means on ``y``,
    :func:`~hardbatch.pair_search.spherical_kmeans`); cells are visited along a greedy
    nearest-centroid chain from cell 0, so consecutive cells are similar; within a cell the
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
                 seed: int, device, precision: str, min_partners: int | None = None) -> None:
        self.x, self.y, self.threshold, self.seed = x, y, threshold, seed
        self.device, self.precision = device, precision
        self.min_partners = check_min_partners(min_partners, x.shape[0])
        n = x.shape[0]
        if partitions == 1:
            cell = torch.zeros(n, dtype=torch.int64)
            sim = torch.ones(1, 1)
        else:
            dev = resolve_device(device)
            cent = spherical_kmeans(torch.from_numpy(y).to(dev), partitions, seed)
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

    def order(self, start: int, end: int, bar=NO_BAR, log: BuildLog | None = None) -> np.ndarray:
        """Items of chain positions [start, end), each cell in its RCM order, int64.

        Within a cell, ``min_partners`` are the strongest pairs inside the cell.
        ``bar.update(1)`` per cell; ``log`` is told the bytes held per cell.
        """
        out = [np.empty(0, np.int64)]
        for c in self.chain[start:end]:
            idx = self.members[self.start[c]:self.start[c + 1]]
            bar.update(1)
            if len(idx) <= 1:
                out.append(idx)
                continue
            xs = np.ascontiguousarray(self.x[idx])
            ys = xs if self.y is self.x else np.ascontiguousarray(self.y[idx])
            plan = PairSearchPlan(xs, ys, self.threshold, "exact", nlist=None, nprobe=1,
                                  seed=0, device=self.device, precision=self.precision,
                                  min_partners=min(self.min_partners, len(idx) - 1))
            rows, cols = plan.pairs(0, plan.num_units)
            if log is not None:
                log.hold(plan.block_bytes + xs.nbytes + ys.nbytes, rows.nbytes, cols.nbytes)
            seed = self.seed if len(self.chain) == 1 else _rng.derive_seed(self.seed, c)
            out.append(idx[rcm_order(rows, cols, len(idx), seed, log).numpy()])
        return np.concatenate(out).astype(np.int64, copy=False)


def interleave_chunks(order: np.ndarray | torch.Tensor, chunk: int) -> np.ndarray:
    """Cut ``order`` into chunks of ``chunk`` consecutive items and deal the chunks apart.

    Chunk j of the result is chunk ``(j * s) mod C`` of ``order`` (C chunks, s the integer
    nearest to C / golden ratio that is coprime with C): consecutive chunks come from far
    apart in ``order`` (a low-discrepancy sequence), so any batch of ``B >= 2 * chunk``
    consecutive items holds about ``B / chunk`` chunks from different regions. Each item
    keeps the neighbours it has inside its chunk (the batch stays hard) while the chunks of
    a dense region (near-duplicates) spread over many batches (docs/gcbs.md). ``chunk=0``
    or ``chunk >= N`` returns ``order`` unchanged. Returns int64 [N].
    """
    order = np.asarray(order, np.int64)
    chunk = check_int(chunk, "interleave", low=0)
    n = len(order)
    if chunk == 0 or chunk >= n:
        return order
    count = -(-n // chunk)
    step = max(1, round(count / 1.618033988749895))
    while np.gcd(step, count) != 1:
        step += 1
    starts = (np.arange(count) * step % count) * chunk
    lengths = np.minimum(chunk, n - starts)
    idx = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    return order[idx]


def partition_count(n: int, partitions: int | None) -> int:
    """Cells of ``method="partition"``: ``partitions`` checked, or ceil(N / 100,000)."""
    return -(-n // 100_000) if partitions is None else check_int(
        partitions, "partitions", low=1, high=n)


def gcbs_permutation(embeddings: torch.Tensor | np.ndarray, quantile: float = 0.999,
                     paired: torch.Tensor | np.ndarray | None = None, *,
                     method: Literal["auto", "exact", "ivf", "faiss", "partition"] = "auto",
                     min_partners: int | None = None, seed: int = 0,
                     nlist: int | None = None, nprobe: int = 8, partitions: int | None = None,
                     device: str | torch.device | None = None, precision: Precision = "fp32",
                     interleave: int = 0, progress: bool | None = None) -> torch.Tensor:
    """GCBS item order: batches cut sequentially from it group strongly similar pairs.

    Args:
        embeddings: X, [N, d].
        quantile: similarities above this quantile of the off-diagonal entries
            of ``X Y^T`` become edges (paper: 0.999; Appendix J scales it so
            about ``2B`` entries per row survive).
        paired: Y, [N, d] paired with X row by row, or None for ``Y = X``.
        method: ``"auto"`` (default: ``"exact"`` up to 5,000 items, ``"ivf"`` up to
            1,000,000, ``"partition"`` in cells of ~10,000 beyond; docs/gcbs.md),
            ``"exact"`` (blocked dense),
            ``"ivf"`` (clustered, approximate), ``"faiss"`` (faiss IVF range search,
            approximate) or ``"partition"`` (for N in the millions: coarse k-means cells,
            exact pairs and reverse Cuthill-McKee within each cell, cells chained by
            centroid similarity; pairs across cells are dropped).
        min_partners: k, each item also keeps its k strongest pairs (its k nearest
            neighbours by ``x_i . y_j``) when fewer than k of its pairs pass the threshold,
            so no item is left without an edge and the epoch has no random tail
            (docs/gcbs.md). Default None: ``min(16, N - 1)``; 0: the paper's graph.
        seed: seeds the quantile sample and the random relabelling that breaks
            ties in reverse Cuthill-McKee (so epochs with equal embeddings differ).
        nlist, nprobe: inverted lists (default sqrt(N)) and lists probed per list
            (positive integers; ``nprobe >= nlist`` probes every list).
        partitions: cells of ``"partition"`` (default ceil(N / 100,000); with
            ``method="auto"``: ceil(N / 10,000)).
        device: where the products run (``"cuda"``: threshold, pairs; the ordering
            stays on the CPU).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` products (fp32 accumulation).
        interleave: c > 0 deals chunks of c consecutive items of the order apart
            (:func:`interleave_chunks`), so that a batch of B items holds B / c chunks from
            different regions instead of one dense region (no batches of near-duplicates;
            docs/gcbs.md: c = B / 8). Default 0: the GCBS order itself.
        progress: a tqdm bar over the pair search's blocks (True), none (False), or
            (None) when stderr is a terminal; shown once a build runs past 2 s.

    Returns:
        int64 tensor [N], a permutation of ``range(N)``.

    Logs one INFO record on the ``hardbatch.gcbs`` logger (N, d, method, seconds, peak
    extra memory, pairs). Memory: the embeddings (on ``device``), the quantile sample
    (80 MB), one block, and O(nnz) pairs, about (1 - quantile) * N^2 + k N (N = 1M,
    q = 0.999: 10^9 pairs, 16 GB of int64 indices: raise the quantile at that scale,
    Appendix J).
    """
    with BuildLog(_LOG, "gcbs_permutation", method=method) as log:
        x, y, threshold, nlist, nprobe = gcbs_setup(embeddings, paired, quantile, method, seed,
                                                    nlist, nprobe, device, precision)
        n, d = x.shape
        method, k, partitions = resolve_build(method, min_partners, partitions, n)
        interleave = check_int(interleave, "interleave", low=0)
        log.set(n=n, d=d, method=method, quantile=quantile, min_partners=k)
        if threshold is None:
            return torch.zeros(1, dtype=torch.int64)
        log.hold(2 * min(n * n, _QUANTILE_SAMPLE + n) * 4)  # the sample's blocks + concatenation
        if method == "partition":
            plan = PartitionPlan(x, y, threshold, partitions, seed, device, precision, k)
            bar = progress_bar(len(plan.chain), "gcbs cells", progress)
            order = plan.order(0, len(plan.chain), bar, log)
            bar.close()
            return torch.from_numpy(interleave_chunks(order, interleave))
        plan = PairSearchPlan(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed,
                              device=device, precision=precision, min_partners=k)
        bar = progress_bar(plan.num_units, f"gcbs {method} pairs", progress)
        rows, cols = plan.pairs(0, plan.num_units, bar)
        bar.close()
        log.hold(plan.block_bytes, 2 * (rows.nbytes + cols.nbytes))  # lists + concatenation
        log.set(pairs=len(rows))
        order = rcm_order(rows, cols, n, seed, log)
        return torch.from_numpy(interleave_chunks(order, interleave)) if interleave else order
