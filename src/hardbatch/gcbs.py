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
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import reverse_cuthill_mckee

from . import _rng
from ._validation import as_embeddings

__all__ = ["gcbs_permutation", "similarity_threshold", "thresholded_pairs"]

_BLOCK_ELEMENTS = 1 << 22
_QUANTILE_SAMPLE = 20_000_000


def similarity_threshold(x: np.ndarray, y: np.ndarray, quantile: float, seed: int = 0,
                         sample_size: int = _QUANTILE_SAMPLE) -> float:
    """Estimate the ``quantile`` of the off-diagonal entries of ``x @ y.T`` from sampled rows.

    Rows are drawn without replacement until about ``sample_size`` entries are
    covered (all rows when N is small, then the value is exact).
    """
    n = x.shape[0]
    rows_needed = min(n, max(1, -(-sample_size // max(1, n - 1))))
    rows = np.sort(_rng.permutation(n, _rng.derive_seed(seed, 0x0A17))[:rows_needed])
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    values = []
    per = max(1, _BLOCK_ELEMENTS // n)
    for s in range(0, len(rows), per):
        r = torch.from_numpy(rows[s:s + per])
        sims = xt[r] @ yt.T
        sims[torch.arange(len(r)), r] = -torch.inf  # self pairs: the smallest values, skipped
        values.append(sims.reshape(-1))
    flat = torch.cat(values)
    count = flat.numel() - len(rows)
    k = int(np.clip(np.ceil(quantile * count), 1, count)) + len(rows)
    return float(flat.kthvalue(k).values)


def _exact_pairs(x: np.ndarray, y: np.ndarray, threshold: float):
    n = x.shape[0]
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    rows, cols = [], []
    per = max(1, (4 * _BLOCK_ELEMENTS) // n)
    for s in range(0, n, per):
        e = min(n, s + per)
        sims = xt[s:e] @ yt.T
        sims[torch.arange(e - s), torch.arange(s, e)] = -torch.inf
        r, c = torch.nonzero(sims > threshold, as_tuple=True)
        rows.append((r + s).numpy().astype(np.int64))
        cols.append(c.numpy().astype(np.int64))
    return np.concatenate(rows), np.concatenate(cols)


def _kmeans(y: torch.Tensor, k: int, seed: int, iters: int = 10) -> torch.Tensor:
    """Spherical k-means centroids [k, d] from a sample of at most 64k rows of ``y``."""
    n = y.shape[0]
    sample = y[torch.from_numpy(_rng.permutation(n, _rng.derive_seed(seed, 0x1BF))[:min(n, 64 * k)])]
    cent = sample[:k].clone()
    for _ in range(iters):
        assign = (sample @ cent.T).argmax(dim=1)
        new = torch.zeros_like(cent).index_add_(0, assign, sample)
        empty = new.norm(dim=1) == 0
        new[empty] = cent[empty]
        cent = torch.nn.functional.normalize(new, dim=1)
    return cent


def _ivf_pairs(x: np.ndarray, y: np.ndarray, threshold: float, nlist: int | None,
               nprobe: int, seed: int):
    """Pairs above ``threshold`` among the ``nprobe`` nearest clusters (inverted-file probing).

    The columns (``y``) are clustered by spherical k-means into ``nlist`` lists;
    the rows of a list are compared, by one dense product, with the items of
    the ``nprobe`` lists whose centroids are most similar to theirs. Cost about
    N * (nprobe / nlist) * N * d instead of N^2 d.
    """
    n = x.shape[0]
    nlist = int(nlist or max(1, round(np.sqrt(n))))
    nprobe = int(min(max(1, nprobe), nlist))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    cent = _kmeans(yt, nlist, seed)
    col_list = torch.cat([(yt[s:s + 65536] @ cent.T).argmax(1) for s in range(0, n, 65536)])
    row_list = col_list if x is y else torch.cat(
        [(xt[s:s + 65536] @ cent.T).argmax(1) for s in range(0, n, 65536)])
    probe = (cent @ cent.T).topk(nprobe, dim=1).indices
    col_order = torch.argsort(col_list, stable=True)
    col_start = torch.zeros(nlist + 1, dtype=torch.int64)
    col_start[1:] = torch.bincount(col_list, minlength=nlist).cumsum(0)
    row_order = torch.argsort(row_list, stable=True)
    row_start = torch.zeros(nlist + 1, dtype=torch.int64)
    row_start[1:] = torch.bincount(row_list, minlength=nlist).cumsum(0)
    rows, cols = [], []
    for c in range(nlist):
        r_ids = row_order[row_start[c]:row_start[c + 1]]
        if r_ids.numel() == 0:
            continue
        c_ids = torch.cat([col_order[col_start[p]:col_start[p + 1]] for p in probe[c].tolist()])
        sims = xt[r_ids] @ yt[c_ids].T
        r, k = torch.nonzero(sims > threshold, as_tuple=True)
        rr, cc = r_ids[r], c_ids[k]
        keep = rr != cc
        rows.append(rr[keep].numpy())
        cols.append(cc[keep].numpy())
    return np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64)


def _faiss_pairs(x: np.ndarray, y: np.ndarray, threshold: float, nlist: int | None,
                 nprobe: int, seed: int):
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("method='faiss' needs faiss: pip install faiss-cpu "
                          "(or use method='ivf')") from exc
    n, d = y.shape
    nlist = nlist or int(max(1, min(n // 39, 4 * np.sqrt(n))))
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    train = y[np.sort(_rng.permutation(n, _rng.derive_seed(seed, 0x1BF))[:min(n, 64 * nlist)])]
    index.cp.seed = int(seed) & 0x7FFFFFFF
    index.train(train)
    index.add(y)
    index.nprobe = min(nprobe, nlist)
    lims, _, ids = index.range_search(x, threshold)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(lims.astype(np.int64)))
    cols = ids.astype(np.int64)
    keep = rows != cols
    return rows[keep], cols[keep]


def thresholded_pairs(x: np.ndarray, y: np.ndarray, threshold: float,
                      method: Literal["exact", "ivf", "faiss"] = "exact", *,
                      nlist: int | None = None,
                      nprobe: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j), i != j, with ``x_i . y_j > threshold`` (``"ivf"``, ``"faiss"``: approximately)."""
    if method == "exact":
        return _exact_pairs(x, y, threshold)
    if method == "ivf":
        return _ivf_pairs(x, y, threshold, nlist, nprobe, seed)
    if method == "faiss":
        return _faiss_pairs(x, y, threshold, nlist, nprobe, seed)
    raise ValueError(f"method={method!r} must be 'exact', 'ivf' or 'faiss'")


def gcbs_permutation(embeddings: torch.Tensor | np.ndarray, quantile: float = 0.999,
                     paired: torch.Tensor | np.ndarray | None = None, *,
                     method: Literal["exact", "ivf", "faiss"] = "exact", seed: int = 0,
                     nlist: int | None = None, nprobe: int = 8) -> torch.Tensor:
    """GCBS item order: batches cut sequentially from it group strongly similar pairs.

    Args:
        embeddings: X, [N, d].
        quantile: similarities above this quantile of the off-diagonal entries
            of ``X Y^T`` become edges (paper: 0.999; Appendix J scales it so
            about ``2B`` entries per row survive).
        paired: Y, [N, d] paired with X row by row, or None for ``Y = X``.
        method: ``"exact"`` (blocked dense), ``"ivf"`` (clustered, approximate) or
            ``"faiss"`` (faiss IVF range search, approximate).
        seed: seeds the quantile sample and the random relabelling that breaks
            ties in reverse Cuthill-McKee (so epochs with equal embeddings differ).
        nlist, nprobe: inverted lists (default sqrt(N)) and lists probed per list.

    Returns:
        int64 tensor [N], a permutation of ``range(N)``.
    """
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
    n = x.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=torch.int64)
    threshold = similarity_threshold(x, y, quantile, seed)
    rows, cols = thresholded_pairs(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed)
    # Random relabelling: RCM breaks ties (start node, equal degrees) by label.
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.empty(n, np.int64)
    inverse[relabel] = np.arange(n)
    r, c = inverse[rows], inverse[cols]
    adj = sp.coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(n, n)).tocsr()
    adj = (adj + adj.T).tocsr()
    order = reverse_cuthill_mckee(adj, symmetric_mode=True)
    return torch.from_numpy(relabel[np.asarray(order, np.int64)])
