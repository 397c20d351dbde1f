"""Global Contrastive Batch Sampling (GCBS; Sachidananda et al.), reference implementation.

GCBS chooses a permutation of the items so that batches cut sequentially
from it hold pairs with large similarity (gcbs paper, sections 4-5):

1. estimate the ``quantile`` (e.g. 0.999) of the off-diagonal similarities
   ``S = X Y^T`` from a sample of rows (no N x N matrix is formed;
   :mod:`hardbatch.batching.gcbs.threshold`);
2. sparsify: keep the pairs with ``S_ij`` above that value (eq. 5;
   :mod:`hardbatch.batching.gcbs.pairs`);
3. symmetrise the pattern and run reverse Cuthill-McKee
   (``scipy.sparse.csgraph.reverse_cuthill_mckee``), the bandwidth heuristic
   of section 5.2; disconnected components are ordered one after the other
   and items without any strong pair end up together (:mod:`hardbatch.batching.gcbs.order`);
4. batch the permuted order sequentially (the sampler,
   :class:`hardbatch.samplers.GCBSSampler`).

This package's ``__init__`` composes them: :func:`gcbs_setup` (checked inputs and step 1),
:func:`gcbs_permutation` (steps 1-3) and :func:`sharded_gcbs_permutation` (the same, its pair
search shared by the ranks of a torch.distributed group); it re-exports every public name of the
step modules.

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
:mod:`hardbatch.batching.gcbs.pairs` (blocked dense; inverted lists compared by dense products; a
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
:func:`sharded_gcbs_permutation` can share them across ranks;
the reordering (step 3) runs on the CPU of every rank.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
import torch

from ..._device import Precision
from ..._logging import BuildLog, get_logger, progress_bar
from ..._validation import as_embeddings, check_int
from ...distributed import all_gather_rows, broadcast_from_first, get_rank_world, rank_share
from .order import PartitionLayout, default_interleave, interleave_chunks, rcm_order
from .pairs import (AUTO_CELL_ITEMS, AUTO_EXACT_MAX_ITEMS, AUTO_IVF_MAX_ITEMS,
                    DEFAULT_MIN_PARTNERS, METHODS, PairSearchLayout, check_min_partners,
                    check_search_args, partition_count, resolve_build, resolve_method,
                    strongest_partners, thresholded_pairs)
from .threshold import QUANTILE_SAMPLE, similarity_threshold

__all__ = ["AUTO_CELL_ITEMS", "AUTO_EXACT_MAX_ITEMS", "AUTO_IVF_MAX_ITEMS",
           "DEFAULT_MIN_PARTNERS", "METHODS", "QUANTILE_SAMPLE", "GCBSSetup", "PairSearchLayout",
           "PartitionLayout", "check_min_partners", "check_search_args", "default_interleave",
           "gcbs_permutation", "gcbs_setup", "interleave_chunks", "resolve_build",
           "partition_count", "rcm_order", "resolve_method", "sharded_gcbs_permutation",
           "similarity_threshold", "strongest_partners", "thresholded_pairs"]

_LOG = get_logger("batching.gcbs")


class GCBSSetup(NamedTuple):
    """What :func:`gcbs_setup` returns: unit rows X, Y [N, d] (Y is X when unpaired), the
    similarity threshold, and the checked ``nlist`` / ``nprobe``.

    Example:
        >>> from hardbatch.batching.gcbs import GCBSSetup, gcbs_setup
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> setup = gcbs_setup(x, None, 0.769, "auto", 0, None, 8, None, "fp32")
        >>> isinstance(setup, GCBSSetup), setup.y is setup.x, setup.nlist, setup.nprobe
        (True, True, None, 8)
    """

    x: np.ndarray
    y: np.ndarray
    threshold: float | None
    nlist: int | None
    nprobe: int


def gcbs_setup(embeddings, paired, quantile: float, method: str, seed: int, nlist, nprobe,
               device, precision: Precision) -> GCBSSetup:
    """Checked GCBS inputs and the similarity threshold (GCBS steps 1-2, before the pair search).

    Shared by :func:`gcbs_permutation` and :func:`sharded_gcbs_permutation`.
    The threshold is None for a single item (its order is ``[0]``).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> from hardbatch.batching.gcbs import gcbs_setup
        >>> x, y, threshold, nlist, nprobe = gcbs_setup(
        ...     x, None, quantile=0.769, method="auto", seed=0, nlist=None, nprobe=8, device=None,
        ...     precision="fp32")
        >>> x.shape, x.dtype, round(threshold, 1)  # unit rows; the threshold of step 1
        ((40, 8), dtype('float32'), 0.6)
    """
    resolve_method(method, 1)  # checks the name
    x = as_embeddings(embeddings, "embeddings", normalize=True)
    nlist, nprobe = check_search_args(nlist, nprobe, x.shape[0])
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
            1,000,000, ``"partition"`` in cells of ~2,500 beyond; docs/gcbs.md),
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
        nlist, nprobe: inverted lists (default sqrt(N) for ``"ivf"``, ``min(N / 39,
            4 sqrt(N))`` for ``"faiss"``; at most N) and lists probed per list (positive
            integers; ``nprobe >= nlist`` probes every list).
        partitions: cells of ``"partition"`` (default ceil(N / 100,000); with
            ``method="auto"``: ceil(N / 2,500)).
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

    Logs one INFO record on the ``hardbatch.batching.gcbs`` logger (N, d, method, seconds, peak
    extra memory, pairs). Memory: the embeddings (on ``device``), the quantile sample
    (80 MB), one block, and O(nnz) pairs, about (1 - quantile) * N^2 + k N (N = 1M,
    q = 0.999: 10^9 pairs, 16 GB of int64 indices: raise the quantile at that scale,
    Appendix J).

    Example:
        >>> import hardbatch as hb
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> order = hb.gcbs_permutation(x, quantile=0.769, min_partners=4)
        >>> order.shape, sorted(order.tolist()) == list(range(40))
        (torch.Size([40]), True)
        >>> [len(set((batch % 4).tolist())) for batch in order.view(4, 10)]  # clusters per batch
        [1, 1, 1, 1]
        >>> order = hb.gcbs_permutation(x, quantile=0.769, min_partners=4, interleave=5)
        >>> [len(set((batch % 4).tolist())) for batch in order.view(4, 10)]  # two chunks of 5
        [2, 2, 2, 2]
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
        log.hold(2 * min(n * n, QUANTILE_SAMPLE + n) * 4)  # the sample's blocks + concatenation
        if method == "partition":
            cells = PartitionLayout(x, y, threshold, partitions, seed, device, precision, k)
            bar = progress_bar(len(cells.chain), "gcbs cells", progress)
            order = cells.order(0, len(cells.chain), bar, log)
            bar.close()
            return torch.from_numpy(interleave_chunks(order, interleave))
        search = PairSearchLayout(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed,
                                  device=device, precision=precision, min_partners=k)
        bar = progress_bar(search.num_units, f"gcbs {method} pairs", progress)
        rows, cols = search.pairs(0, search.num_units, bar)
        bar.close()
        log.hold(search.block_bytes, 2 * (rows.nbytes + cols.nbytes))  # lists + concatenation
        log.set(pairs=len(rows))
        order = rcm_order(rows, cols, n, seed, log)
        return torch.from_numpy(interleave_chunks(order, interleave)) if interleave else order


def sharded_gcbs_permutation(embeddings: torch.Tensor | np.ndarray, quantile: float = 0.999,
                             paired: torch.Tensor | np.ndarray | None = None, *,
                             method: Literal["auto", "exact", "ivf", "faiss",
                                             "partition"] = "auto",
                             min_partners: int | None = None, seed: int = 0,
                             nlist: int | None = None, nprobe: int = 8,
                             partitions: int | None = None,
                             device: str | torch.device | None = None,
                             precision: Precision = "fp32", interleave: int = 0,
                             group=None) -> torch.Tensor:
    """:func:`gcbs_permutation` with the pair search (GCBS eq. 5) shared by the ranks of the
    process ``group`` (None: the default group; one process: the plain build).

    The same arguments and the same order as the single-process function on every rank
    (``method="auto"`` resolves by N on every rank alike): the threshold is estimated on every
    rank (same seeded sample), each rank searches its share of the units (row blocks or
    inverted lists), the pairs are all-gathered and every rank runs the same reverse
    Cuthill-McKee (for ``"ivf"`` on CUDA, k-means with atomic adds may differ in the last bits
    between ranks; the order is still the same on every rank).

    ``method="partition"``: rank 0's cells and chain are broadcast (k-means on CUDA may differ
    in the last bits between ranks), every rank orders a contiguous range of the chain of about
    equal cost (sum of squared cell sizes), and the ranges are all-gathered in chain order.

    Example:
        >>> import torch
        >>> from hardbatch.batching.gcbs import gcbs_permutation, sharded_gcbs_permutation
        >>> x = torch.randn(40, 8)
        >>> order = sharded_gcbs_permutation(x, quantile=0.9, seed=0)
        >>> len(order), torch.equal(order, gcbs_permutation(x, quantile=0.9, seed=0))
        (40, True)
    """
    x, y, threshold, nlist, nprobe = gcbs_setup(embeddings, paired, quantile, method, seed, nlist,
                                                nprobe, device, precision)
    n = x.shape[0]
    if threshold is None:
        return torch.zeros(1, dtype=torch.int64)
    method, k, partitions = resolve_build(method, min_partners, partitions, n)
    interleave = check_int(interleave, "interleave", low=0)
    if method == "partition":
        cells = PartitionLayout(x, y, threshold, partitions, seed, device, precision, k)
        cell, chain = broadcast_from_first(
            [cells.cell, torch.tensor(cells.chain, dtype=torch.int64)], group)
        cells.adopt(cell, chain)
        mine = torch.from_numpy(cells.order(*cells.shard(*get_rank_world(group))))
        order = all_gather_rows(mine, group).numpy()
    else:
        search = PairSearchLayout(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed,
                                  device=device, precision=precision, min_partners=k)
        rows, cols = search.pairs(*rank_share(search.num_units, group))
        pairs = all_gather_rows(torch.from_numpy(np.stack([rows, cols], axis=1)), group).numpy()
        order = np.asarray(rcm_order(pairs[:, 0], pairs[:, 1], n, seed))
    return torch.from_numpy(interleave_chunks(order, interleave))
