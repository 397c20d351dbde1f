"""GCBS step 2: the pairs above a similarity threshold, plus each item's strongest pairs.

:class:`PairSearchLayout` finds the pairs (i, j), i != j, with ``x_i . y_j`` above the
threshold of :func:`hardbatch.batching.gcbs.similarity_threshold` (gcbs paper, eq. 5), cut into units
(row blocks for ``"exact"`` and ``"faiss"``, inverted lists for ``"ivf"``) that
:func:`hardbatch.batching.gcbs.sharded_gcbs_permutation` shares across ranks.

- ``"exact"``: blocked dense products, O(N^2 d) time, O(nnz) memory.
- ``"ivf"``: an inverted-file approximation (:mod:`hardbatch.neighbors.ivf`): spherical
  k-means puts the items in ``nlist`` (default sqrt(N)) lists, and each list is compared, by
  one dense product, with the ``nprobe`` lists whose centroids are nearest: about
  nprobe/nlist of the exact cost (N = 100k, d = 768: ~10 s instead of ~4 min on 2 cores;
  docs/benchmarks.md).
- ``"faiss"``: the same with a faiss ``IndexIVFFlat.range_search`` (``pip install faiss-cpu``);
  on CPU it scans each query separately and was 4-10x slower than ``"ivf"`` here, but it is
  the natural route to faiss-gpu.

``min_partners=k`` (:func:`strongest_partners`): a row with fewer than k pairs above the
threshold also keeps its k strongest pairs, found in the same similarity block (for
``"ivf"``: among the probed lists, an approximate kNN), so every item has an edge.

The method names and what ``method="auto"`` stands for at N items (:func:`resolve_method`,
:func:`resolve_build`) live here too: ``"partition"`` is the one method that is not a global
pair search (:class:`hardbatch.batching.gcbs.order.PartitionLayout`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from ... import _rng
from ..._device import Precision, block_elements, check_precision, matmul_fp32, resolve_device
from ..._logging import NO_BAR
from ..._validation import check_int
from ...neighbors.ivf import inverted_lists, probed_blocks
from .blocks import block_pairs

__all__ = ["AUTO_CELL_ITEMS", "AUTO_EXACT_MAX_ITEMS", "AUTO_IVF_MAX_ITEMS",
           "DEFAULT_MIN_PARTNERS", "METHODS", "PairSearchLayout", "check_min_partners",
           "check_search_args", "partition_count", "resolve_build", "resolve_method",
           "strongest_partners", "thresholded_pairs"]

# min_partners default: chosen on the exploration sets of docs/gcbs.md.
DEFAULT_MIN_PARTNERS = 16
METHODS = ("auto", "exact", "ivf", "faiss", "partition")
# method="auto": measured on the 2-core CPU (bench_gcbs.py --auto-scan; docs/gcbs.md): ivf was
# faster than exact from 5,000 items on and than partition up to 400,000; partition holds a
# third of the memory at 1.28M (docs/benchmarks.md).
AUTO_EXACT_MAX_ITEMS = 5_000
AUTO_IVF_MAX_ITEMS = 1_000_000
# method="auto" above AUTO_IVF_MAX_ITEMS: partition cells of ~2,500 items (issue 33: as hard
# batches as cells of 10,000 or harder on MNIST, MiniLM and the mixture, a quarter of the
# products; docs/gcbs.md)
AUTO_CELL_ITEMS = 2_500


def resolve_method(method: str, n: int) -> str:
    """The pair search ``method="auto"`` stands for at N items (others returned unchanged).

    ``"exact"`` up to ``AUTO_EXACT_MAX_ITEMS`` (5,000: under 0.4 s either way), ``"ivf"`` up
    to ``AUTO_IVF_MAX_ITEMS`` (1M; the fastest from 5,000 to 400,000 items on the 2-core CPU
    of docs/gcbs.md, with batches as hard as the exact ones), ``"partition"`` beyond (the
    pairs are held one cell at a time).

    Example:
        >>> from hardbatch.batching.gcbs import resolve_method
        >>> [resolve_method("auto", n) for n in (1_000, 100_000, 2_000_000)]
        ['exact', 'ivf', 'partition']
        >>> resolve_method("faiss", 1_000)
        'faiss'
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
    only). Shared with :func:`hardbatch.batching.gcbs.sharded_gcbs_permutation`.

    Example:
        >>> from hardbatch.batching.gcbs import resolve_build
        >>> resolve_build("auto", None, None, 2_000_000)  # partition cells of about 2,500 items
        ('partition', 16, 800)
        >>> resolve_build("exact", 0, None, 40)
        ('exact', 0, None)
    """
    if method == "auto" and partitions is None:
        partitions = -(-n // AUTO_CELL_ITEMS)
    method = resolve_method(method, n)
    if method == "partition":
        partitions = partition_count(n, partitions)
    return method, check_min_partners(min_partners, n), partitions


def partition_count(n: int, partitions: int | None) -> int:
    """Cells of ``method="partition"``: ``partitions`` checked, or ceil(N / 100,000).

    Example:
        >>> from hardbatch.batching.gcbs import partition_count
        >>> partition_count(2_000_000, None), partition_count(40, 4)
        (20, 4)
    """
    return -(-n // 100_000) if partitions is None else check_int(
        partitions, "partitions", low=1, high=n)


_EMPTY = (np.empty(0, np.int64), np.empty(0, np.int64))


def check_search_args(nlist, nprobe, n: int | None = None) -> tuple[int | None, int]:
    """``nlist`` (None: the method's default; at most the ``n`` items when given) and
    ``nprobe`` of the inverted-file searches.

    Example:
        >>> from hardbatch.batching.gcbs import check_search_args
        >>> check_search_args(None, 8)
        (None, 8)
        >>> check_search_args(16, 0)
        Traceback (most recent call last):
            ...
        ValueError: nprobe=0 ...
    """
    if nlist is not None:
        nlist = check_int(nlist, "nlist", low=1)
        if n is not None and nlist > n:
            raise ValueError(f"nlist={nlist} must be at most the N={n} items (inverted lists "
                             "of the 'ivf' / 'faiss' pair search); use nlist <= N or None "
                             "(default sqrt(N))")
    return nlist, check_int(nprobe, "nprobe", low=1)


def check_min_partners(min_partners: int | None, n: int) -> int:
    """``min_partners`` checked against N items; None: ``min(DEFAULT_MIN_PARTNERS, N - 1)``.

    Example:
        >>> from hardbatch.batching.gcbs import check_min_partners
        >>> check_min_partners(None, 40), check_min_partners(None, 5), check_min_partners(0, 40)
        (16, 4, 0)
        >>> check_min_partners(40, 40)
        Traceback (most recent call last):
            ...
        ValueError: min_partners=40 must lie in [0, N - 1] for N=40 items ...
    """
    if min_partners is None:
        return min(DEFAULT_MIN_PARTNERS, max(0, n - 1))
    min_partners = check_int(min_partners, "min_partners")
    if not 0 <= min_partners < max(1, n):
        raise ValueError(f"min_partners={min_partners} must lie in [0, N - 1] for N={n} items "
                         f"(each item's strongest pairs besides the threshold); use e.g. "
                         f"min_partners={min(DEFAULT_MIN_PARTNERS, max(0, n - 1))}, or 0 for "
                         "the paper's thresholded graph alone")
    return int(min_partners)


def strongest_partners(sims: torch.Tensor, hit_rows: torch.Tensor, k: int,
                       threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` strongest pairs that are not above ``threshold`` (``min_partners``).

    ``sims`` [R, C] holds similarities with self pairs at -inf, ``hit_rows`` the row of every
    pair above the threshold. A row with at least k such pairs already holds its k
    strongest; the others take their top k of ``sims`` (the ones above the threshold are
    skipped: they are pairs already). Returns (row, column) positions within ``sims``.

    Example:
        >>> import torch
        >>> from hardbatch.batching.gcbs import strongest_partners
        >>> inf = float("inf")
        >>> sims = torch.tensor([[-inf, 0.9, 0.2, 0.1], [0.9, -inf, 0.3, 0.0],
        ...                      [0.2, 0.3, -inf, 0.8], [0.1, 0.0, 0.8, -inf]])
        >>> hit_rows, hit_cols = torch.nonzero(sims > 0.85, as_tuple=True)  # (0, 1) and (1, 0)
        >>> rows, cols = strongest_partners(sims, hit_rows, k=2, threshold=0.85)
        >>> list(zip(rows.tolist(), cols.tolist()))
        [(0, 2), (1, 2), (2, 3), (2, 1), (3, 2), (3, 0)]
    """
    counts = torch.bincount(hit_rows, minlength=sims.shape[0])
    short = torch.nonzero(counts < k).squeeze(1)
    if short.numel() == 0:
        return short, short
    val, idx = sims[short].topk(min(k, sims.shape[1]), dim=1)
    keep = (val <= threshold) & (val > -torch.inf)
    return short.unsqueeze(1).expand_as(idx)[keep], idx[keep]


def _concat(rows: list, cols: list) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        return _EMPTY
    return (np.concatenate(rows).astype(np.int64, copy=False),
            np.concatenate(cols).astype(np.int64, copy=False))


class PairSearchLayout:
    """Step 2 of GCBS (pairs above the threshold), cut into units that ranks can share.

    Units are row blocks (``"exact"``, ``"faiss"``) or inverted lists
    (``"ivf"``); :meth:`pairs` returns the pairs found by units [start, end): those above
    ``threshold`` and each row's ``min_partners`` strongest (None: ``min(16, N - 1)``, as in
    :func:`gcbs_permutation`; searched among the compared columns, so approximately for
    ``"ivf"``). Used whole by :func:`thresholded_pairs` and in shards by
    :func:`hardbatch.batching.gcbs.sharded_gcbs_permutation`. ``block_bytes``: the largest
    similarity block so far (values and mask), for the build's memory log.

    Example:
        >>> import torch
        >>> from hardbatch.batching.gcbs import PairSearchLayout
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> u = torch.nn.functional.normalize(x, dim=1).numpy()  # unit rows, float32
        >>> layout = PairSearchLayout(u, u, 0.5, "ivf", nlist=4, nprobe=2, seed=0, device=None,
        ...                           precision="fp32", min_partners=0)  # pairs above cosine 0.5
        >>> layout.num_units  # inverted lists
        4
        >>> rows, cols = layout.pairs(0, layout.num_units)
        >>> len(rows), bool((rows % 4 == cols % 4).all())  # all 4 * 10 * 9 pairs inside clusters
        (360, True)
        >>> len(layout.pairs(0, 2)[0]) + len(layout.pairs(2, 4)[0])  # units shared by two ranks
        360
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, threshold: float, method: str, *,
                 nlist: int | None, nprobe: int, seed: int, device, precision: str,
                 min_partners: int | None = None) -> None:
        if method not in ("exact", "ivf", "faiss"):
            raise ValueError(f"method={method!r} must be 'exact', 'ivf', 'faiss' or "
                             "(in gcbs_permutation) 'auto' or 'partition'")
        nlist, nprobe = check_search_args(nlist, nprobe, x.shape[0])
        self.x, self.y, self.threshold, self.method = x, y, float(threshold), method
        self.seed, self.nprobe, self.block_bytes = seed, nprobe, 0
        self.min_partners = check_min_partners(min_partners, x.shape[0])
        self.device, self.dtype = resolve_device(device), check_precision(precision)
        n = x.shape[0]
        if method == "exact":
            # rows per block: CPU ~1M similarities (64+ rows; still cached when the compiled
            # selection reads them), CUDA ~256M
            cpu = self.device.type == "cpu"
            self.per = (min(n, max(64, block_elements(self.device) // (4 * n))) if cpu else
                        max(1, (4 * block_elements(self.device)) // n))
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

    def pairs(self, start: int, end: int, bar=NO_BAR) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (i, j), i != j, found by units [start, end); ``bar.update(1)`` per unit."""
        if end <= start:
            return _EMPTY
        if self.method == "exact":
            return self._exact(start, end, bar)
        if self.method == "ivf":
            return self._ivf_pairs(start, end, bar)
        return self._faiss_pairs(start, end, bar)

    def _hits(self, sims: torch.Tensor, self_col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions (row, column) in ``sims`` of the unit's pairs; ``self_col[i]``: the column
        of row i's own item (-1: none), never paired. On the CPU one compiled pass
        (:func:`~hardbatch.batching.gcbs.blocks.block_pairs`), elsewhere torch."""
        self.block_bytes = max(self.block_bytes, sims.numel() * 5)  # fp32 values + bool mask
        if sims.device.type == "cpu" and sims.dtype == torch.float32:
            r, c, tied = block_pairs(sims, self_col.numpy(), self.threshold, self.min_partners)
            r, c = torch.from_numpy(r), torch.from_numpy(c)
            if len(tied):  # partners tie at the boundary: torch.topk's choice, as below
                tied = torch.from_numpy(tied)
                sub, own = sims[tied], self_col[tied]
                sub[torch.nonzero(own >= 0).squeeze(1), own[own >= 0]] = -torch.inf
                r2, c2 = strongest_partners(sub, torch.nonzero(sub > self.threshold)[:, 0],
                                            self.min_partners, self.threshold)
                r, c = torch.cat([r, tied[r2]]), torch.cat([c, c2])
            return r, c
        mine = torch.nonzero(self_col >= 0).squeeze(1).to(sims.device)
        sims[mine, self_col.to(sims.device)[mine]] = -torch.inf
        r, c = torch.nonzero(sims > self.threshold, as_tuple=True)
        if self.min_partners:
            r2, c2 = strongest_partners(sims, r, self.min_partners, self.threshold)
            r, c = torch.cat([r, r2]), torch.cat([c, c2])
        return r, c

    def _exact(self, start: int, end: int, bar=NO_BAR):
        n = self.x.shape[0]
        xt, yt = self._tensors()
        rows, cols = [], []
        for s in range(start * self.per, min(n, end * self.per), self.per):
            e = min(n, s + self.per)
            sims = matmul_fp32(xt[s:e], yt.T)
            r, c = self._hits(sims, torch.arange(s, e))
            rows.append((r + s).cpu().numpy())
            cols.append(c.cpu().numpy())
            bar.update(1)
        return _concat(rows, cols)

    def _ivf_pairs(self, start: int, end: int, bar=NO_BAR):
        """Lists [start, end) of the inverted lists (:mod:`hardbatch.neighbors.ivf`), each
        compared with the lists it probes: about N * (nprobe / nlist) * N * d, not N^2 d."""
        if self._ivf is None:
            xt, yt = self._tensors()
            self._ivf = xt, yt, inverted_lists(xt, yt, self.nlist, self.nprobe, self.seed)
        xt, yt, lists = self._ivf
        rows, cols = [], []
        for r_ids, c_ids, self_col in probed_blocks(lists, start, end):
            bar.update(1)
            if r_ids.numel() == 0:
                continue
            sims = matmul_fp32(xt[r_ids], yt[c_ids].T)
            r, k = self._hits(sims, self_col)  # self pairs out before rows count
            rr, cc = r_ids[r], c_ids[k]
            keep = rr != cc
            rows.append(rr[keep].cpu().numpy())
            cols.append(cc[keep].cpu().numpy())
        return _concat(rows, cols)

    def _faiss_pairs(self, start: int, end: int, bar=NO_BAR):
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
        rows, cols = rows[keep], cols[keep]
        if self.min_partners:  # rows short of partners: their nearest lists' top k
            k = self.min_partners
            short = np.flatnonzero(np.bincount(rows - lo, minlength=hi - lo) < k) + lo
            sims, nn = self._faiss.search(x[short], k + 1) if len(short) else (
                np.empty((0, k + 1), np.float32), np.empty((0, k + 1), np.int64))
            nn = nn.astype(np.int64)
            ok = (nn >= 0) & (nn != short[:, None]) & (sims <= self.threshold)
            ok &= np.cumsum(nn != short[:, None], axis=1) <= k  # at most k, self skipped
            rows = np.concatenate([rows, np.broadcast_to(short[:, None], nn.shape)[ok]])
            cols = np.concatenate([cols, nn[ok]])
        bar.update(end - start)
        return rows, cols


def thresholded_pairs(x: np.ndarray, y: np.ndarray, threshold: float,
                      method: Literal["exact", "ivf", "faiss"] = "exact", *,
                      nlist: int | None = None, nprobe: int = 8, seed: int = 0,
                      device: str | torch.device | None = None,
                      precision: Precision = "fp32",
                      min_partners: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j), i != j, with ``x_i . y_j > threshold`` (ivf, faiss: approximately).

    With ``min_partners=k`` also each row i's k strongest pairs (largest ``x_i . y_j``).
    Memory: O(nnz) pairs plus one block of similarities on ``device``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> from hardbatch.batching.gcbs import thresholded_pairs
        >>> u = torch.nn.functional.normalize(x, dim=1).numpy()  # unit rows, float32
        >>> rows, cols = thresholded_pairs(u, u, 0.5)
        >>> len(rows), bool((rows % 4 == cols % 4).all())
        (360, True)
        >>> len(thresholded_pairs(u, u, 0.5, min_partners=12)[0])  # 9 inside + 3 across each
        480
    """
    layout = PairSearchLayout(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed,
                              device=device, precision=precision, min_partners=min_partners)
    return layout.pairs(0, layout.num_units)
