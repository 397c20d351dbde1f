"""Approximate nearest-neighbour indexes behind :func:`hardbatch.knn_graph` and the kNN sampler.

Methods of ``knn_graph(..., method=)`` (:data:`KNN_METHODS`):

- ``"exact"``: blocked dense products with torch
  (:class:`hardbatch.neighbors.knn_graph.KNNGraphLayout`), O(N^2 d); ``"faiss"`` the same with
  faiss ``IndexFlatIP``; ``"faiss-ivf"`` faiss ``IndexIVFFlat`` with a fixed ``nprobe``.
- ``"hnsw"``: an HNSW graph index (hnswlib; M = 16, ef_construction = 100), its search
  breadth ``ef`` tuned as below.
- ``"auto"`` (the default): ``"exact"`` up to :data:`AUTO_EXACT_MAX_ITEMS` items, on a GPU and
  in half precision; above, faiss ``IndexIVFFlat`` (nlist = 2 sqrt(N)) whose ``nprobe`` is
  *tuned*: the smallest of 1, 2, 3, 5, 8, 12, ... (x1.5) whose recall@K against the exact
  neighbours, measured on :data:`TUNE_ROWS` seeded rows, reaches ``RECALL_TARGET +
  RECALL_MARGIN`` (0.955, so that the recall of the whole graph is >= 0.95). If that needs
  ``nprobe > nlist / 16`` (data without cluster structure, where IVF is no faster than exact)
  or faiss is not installed (a warning says ``pip install 'hardbatch[ann]'``), ``"auto"`` runs
  ``"exact"``. The IVF was the fastest index at recall >= 0.95 in
  ``benchmarks/bench_knn_index.py`` (docs/benchmarks.md).

Determinism: on one machine the same inputs and seed give the same graph, for any thread
count: the IVF training sample and k-means seed come from ``seed``, each query is searched
alone (faiss parallelises over queries), and HNSW is built single-threaded (a multi-threaded
insertion order would change the graph) with ``random_seed=seed``, then searched in
parallel. Across machines (other SIMD kernels, BLAS, library versions) floating-point
near-ties may resolve otherwise; an index's k-means or graph then differs a little, and a few
approximate neighbours with it (as near-ties do for ``"exact"``). ``method="exact"`` is the
route whose only cross-machine differences are near-ties. Hence ``"auto"`` keeps to exact
under torch.distributed with several ranks (and :class:`hardbatch.KNNBatchSampler` with
``world_size > 1``), where every rank must plan the same batches; ``method="faiss-ivf"`` or
``"hnsw"`` opts in there, for ranks on identical machines.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .. import _rng
from .._logging import BuildLog, get_logger, progress_bar
from .._validation import check_int, embedding_tensor
from .exact_search import exact_neighbors

__all__ = ["AUTO_EXACT_MAX_ITEMS", "INDEX_KINDS", "KNN_METHODS", "NeighborIndex",
           "RECALL_MARGIN", "RECALL_TARGET", "import_index_library", "index_knn_graph",
           "resolve_knn_method"]

_LOG = get_logger("neighbors")

KNN_METHODS = ("auto", "exact", "faiss", "faiss-ivf", "hnsw")
INDEX_KINDS = ("ivf", "hnsw")
#: ``method="auto"`` is exact up to this many items (bench_knn_index.py --switch, K = 100: the
#: tuned IVF was slower than exact at 40k items and 2-5x faster at 100k, d = 128 and 384).
AUTO_EXACT_MAX_ITEMS = 50_000
RECALL_TARGET = 0.95
RECALL_MARGIN = 0.005  # the sample estimate must reach 0.955: its standard error is ~0.003
TUNE_ROWS = 512
_EXTRA = "pip install 'hardbatch[ann]'"
_WARNED: set[str] = set()


def import_index_library(kind: str):
    """The module behind index ``kind``: faiss (``"ivf"``) or hnswlib (``"hnsw"``);
    ``ImportError`` naming the extra to install when it is missing.

    Example:
        >>> from hardbatch.neighbors.index_search import import_index_library
        >>> import_index_library("ivf").__name__  # faiss installed
        'faiss'
    """
    name = "faiss" if kind == "ivf" else "hnswlib"
    try:
        return __import__(name)
    except ImportError as exc:
        method = "faiss-ivf' / 'auto" if kind == "ivf" else "hnsw"
        raise ImportError(f"method='{method}' needs {name}: {_EXTRA} (or pip install "
                          f"{'faiss-cpu' if kind == 'ivf' else 'hnswlib'}), or use "
                          "method='exact'") from exc


def resolve_knn_method(method: str, num_items: int, device: torch.device | None = None,
                       precision: str = "fp32") -> str:
    """What ``method`` runs at N items: a name of :data:`KNN_METHODS` but ``"auto"``, or
    ``"auto-ivf"`` (the tuned IVF of ``"auto"``; module docstring). ``"auto"`` stays exact
    under torch.distributed with several ranks: ranks on other machines could build other
    indexes, hence other graphs.

    ``ValueError`` for a name outside :data:`KNN_METHODS`.

    Example:
        >>> from hardbatch.neighbors.index_search import resolve_knn_method
        >>> resolve_knn_method("auto", 300), resolve_knn_method("hnsw", 300)
        ('exact', 'hnsw')
        >>> try:
        ...     resolve_knn_method("annoy", 300)
        ... except ValueError as err:
        ...     print(err)
        method='annoy' must be one of ['auto', 'exact', 'faiss', 'faiss-ivf', 'hnsw']
    """
    if not isinstance(method, str) or method not in KNN_METHODS:
        raise ValueError(f"method={method!r} must be one of {list(KNN_METHODS)}")
    if method != "auto":
        return method
    on_cpu = device is None or torch.device(device).type == "cpu"
    dist = torch.distributed
    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if num_items <= AUTO_EXACT_MAX_ITEMS or not on_cpu or precision != "fp32" or ranks > 1:
        return "exact"
    try:
        import_index_library("ivf")
    except ImportError:
        if "ivf" not in _WARNED:
            _WARNED.add("ivf")
            _LOG.warning("knn_graph(method='auto') runs the exact search at N=%d: the faster "
                         "approximate index needs faiss (%s)", num_items, _EXTRA)
        return "exact"
    return "auto-ivf"


def _recall(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean over rows of |approx row & exact row| / K."""
    rows, k = exact.shape
    if rows == 0 or k == 0:  # nothing to find: every row found all of it
        return 1.0
    # Offset each row's ids into its own range: one sorted membership test, O(R k log k)
    # memory-light (a broadcast comparison would hold R x k x k booleans).
    span = np.int64(max(int(approx.max(initial=0)), int(exact.max(initial=0))) + 2)
    offset = np.arange(rows, dtype=np.int64)[:, None] * span
    hits = np.isin(approx.astype(np.int64) + 1 + offset, exact.astype(np.int64) + 1 + offset)
    return float(hits.sum() / (rows * k))


class NeighborIndex:
    """An inner-product index over the rows of ``x``: faiss IVF (``kind="ivf"``) or HNSW (hnswlib).

    Args:
        x: [N, d] float rows (any array or tensor; NaN / inf refused).
        kind: ``"ivf"`` (``IndexIVFFlat``, ``nlist`` lists, trained on a seeded sample of 39
            rows per list) or ``"hnsw"`` (M = 16, ef_construction = 100,
            built single-threaded with ``random_seed=seed``: deterministic).
        seed: training sample, k-means and level draws.
        nlist: IVF lists (default ``max(1, min(N // 39, round(2 sqrt(N))))``).
        check_finite: refuse NaN / inf in ``x`` (a pass over it); ``False`` only for rows
            already checked (as in ``scipy.linalg``).

    :meth:`tune` sets the search breadth (``nprobe`` or ``ef``) from a measured recall,
    :meth:`search` finds the nearest rows of queries (-1 where the probed lists hold too few).

    Example:
        >>> import numpy as np
        >>> from hardbatch.neighbors.index_search import NeighborIndex
        >>> x = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
        >>> index = NeighborIndex(x, "ivf", seed=0, nlist=2)  # faiss; "hnsw" needs hnswlib
        >>> index.nlist, index.tune(5) >= 0.5, index.search(x[:2], 3).shape
        (2, True, (2, 3))
    """

    def __init__(self, x, kind: str = "ivf", seed: int = 0, nlist: int | None = None, *,
                 check_finite: bool = True) -> None:
        if kind not in INDEX_KINDS:
            raise ValueError(f"kind={kind!r} must be one of {list(INDEX_KINDS)}")
        lib = import_index_library(kind)
        self.x = embedding_tensor(x, finite=check_finite).cpu().numpy()
        n, d = self.x.shape
        self.kind, self.seed, self.num_items, self.dim = kind, int(seed), n, d
        if kind == "ivf":
            self.nlist = check_int(nlist, "nlist", low=1, high=n) if nlist is not None else \
                max(1, min(n // 39, round(2 * np.sqrt(n))))
            index = lib.IndexIVFFlat(lib.IndexFlatIP(d), d, self.nlist, lib.METRIC_INNER_PRODUCT)
            index.cp.seed = self.seed & 0x7FFFFFFF
            sample = _rng.permutation(n, _rng.derive_seed(self.seed, 0x1BF))[:39 * self.nlist]
            index.train(self.x[np.sort(sample)])
            index.add(self.x)
            self.breadth, self.max_breadth = 1, max(1, self.nlist // 16)
        else:
            index = lib.Index(space="ip", dim=d)
            index.init_index(max_elements=n, M=16, ef_construction=100,
                             random_seed=self.seed & 0x7FFFFFFF)
            index.add_items(self.x, np.arange(n), num_threads=1)  # one order: deterministic
            self.breadth, self.max_breadth = 16, max(16, n)
        self.index = index
        self.recall = float("nan")

    def search(self, queries, k: int) -> np.ndarray:
        """The ``k`` rows of largest inner product with each query, int64 [Q, k] (-1: none).

        ``ValueError`` when the queries' dimension is not the index's d.
        """
        q = embedding_tensor(queries, "queries").cpu().numpy()
        if q.shape[1] != self.dim:
            raise ValueError(f"queries have d={q.shape[1]} but the index was built on "
                             f"d={self.dim} rows; pass queries of the same dimension")
        return self._search(q, check_int(k, "k", low=1, high=self.num_items))

    def _search(self, q: np.ndarray, k: int) -> np.ndarray:
        if self.kind == "ivf":
            self.index.nprobe = int(self.breadth)
            return self.index.search(q, k)[1].astype(np.int64)
        self.index.set_ef(int(max(self.breadth, k)))
        return self.index.knn_query(q, k)[0].astype(np.int64)

    def neighbors_of(self, rows: np.ndarray, k: int, fill: bool = True) -> np.ndarray:
        """The ``k`` nearest other items of items ``rows`` [R, k]: the item itself (where the
        index returns it, else the last of k + 1) dropped. Rows the index leaves short (-1:
        their probed lists hold under k + 1 items) keep their -1 without ``fill``; with it they
        are searched again with 2x, 4x, ... the breadth, and exactly as a last resort."""
        rows = np.asarray(rows, np.int64)
        ids = self._search(self.x[rows], k + 1)
        own = ids == rows[:, None]
        own[~own.any(axis=1), k] = True
        out = ids[~own].reshape(len(rows), k)
        short = np.flatnonzero((out < 0).any(axis=1))
        if not fill or not len(short):
            return out
        breadth = self.breadth
        if self.kind == "ivf" and 2 * breadth <= self.max_breadth:
            self.breadth = 2 * breadth
            try:
                out[short] = self.neighbors_of(rows[short], k)
            finally:
                self.breadth = breadth
        else:
            out[short] = _exact_rows(self.x, rows[short], k)
        return out

    def tune(self, k: int, target: float = RECALL_TARGET + RECALL_MARGIN) -> float:
        """Smallest breadth (``nprobe`` from 1, ``ef`` from k + 1, x1.5 a step) whose recall@k
        on :data:`TUNE_ROWS` seeded rows reaches ``target``, or the largest allowed
        (``nlist / 16``; N); sets it and returns the recall measured there."""
        n = self.num_items
        rows = np.sort(_rng.permutation(n, _rng.derive_seed(self.seed, 0x7E5))[:TUNE_ROWS])
        truth = _exact_rows(self.x, rows, k)
        if self.kind == "ivf":  # lists enough to hold k + 1 items on average
            breadth = max(1, int(np.ceil((k + 1) * self.nlist / n)))
        else:
            breadth = max(self.breadth, k + 1)
        while True:
            self.breadth = min(breadth, self.max_breadth)
            self.recall = _recall(self.neighbors_of(rows, k, fill=False), truth)
            if self.recall >= target or self.breadth >= self.max_breadth:
                return self.recall
            breadth = int(np.ceil(breadth * 1.5))


def _exact_rows(x: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k other items of ``rows`` (:func:`hardbatch.neighbors.exact_search.exact_neighbors`)."""
    return exact_neighbors(torch.from_numpy(x), torch.from_numpy(np.asarray(rows, np.int64)),
                           k).numpy()


def index_knn_graph(embeddings, neighbors: int, method: str = "hnsw", *, seed: int = 0,
                    nlist: int | None = None, progress: bool | None = None,
                    check_finite: bool = True) -> torch.Tensor:
    """The kNN graph [N, K] from a tuned :class:`NeighborIndex` (``method`` ``"hnsw"`` or
    ``"auto-ivf"``; what :func:`hardbatch.knn_graph` runs for them). The embeddings are
    checked for NaN / inf once (not with ``check_finite=False``: rows already checked).

    ``"auto-ivf"`` falls back to the exact graph when the tuned ``nprobe`` would pass
    ``nlist / 16``. Logs one INFO record on ``hardbatch.neighbors.knn_graph`` (method ``"faiss-ivf"`` or
    ``"hnsw"``, the tuned breadth and the sample recall).

    Example:
        >>> import numpy as np
        >>> from hardbatch.neighbors.index_search import index_knn_graph
        >>> x = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
        >>> index_knn_graph(x, 5, "auto-ivf").shape  # faiss; "hnsw" needs hnswlib
        torch.Size([400, 5])
    """
    if method not in ("hnsw", "auto-ivf"):
        raise ValueError(f"method={method!r} must be 'hnsw' or 'auto-ivf'")
    kind = "hnsw" if method == "hnsw" else "ivf"
    with BuildLog(_LOG, "knn_graph", method="hnsw" if kind == "hnsw" else "faiss-ivf") as log:
        x = embedding_tensor(embeddings, finite=check_finite)
        n = x.shape[0]
        k = check_int(neighbors, "neighbors", low=1)
        if k >= n:
            raise ValueError(f"neighbors={neighbors} must be smaller than the number of items "
                             f"N={n}")
        index = NeighborIndex(x, kind, seed, nlist, check_finite=False)
        recall = index.tune(k)
        log.set(n=n, d=index.dim, neighbors=k, breadth=index.breadth, sample_recall=recall)
        if kind == "ivf" and recall < RECALL_TARGET + RECALL_MARGIN:
            log.set(method="exact")
            _LOG.log(logging.INFO, "knn_graph(method='auto'): IVF recall %.3f at nprobe=%d, "
                     "running the exact search", recall, index.breadth)
            return _exact_graph(index.x, k, progress)
        out = torch.empty((n, k), dtype=torch.int64)
        step = 16384
        bar = progress_bar(-(-n // step), f"kNN graph ({method})", progress)
        for s in range(0, n, step):
            e = min(n, s + step)
            out[s:e] = torch.from_numpy(index.neighbors_of(np.arange(s, e), k))
            bar.update(1)
        bar.close()
        log.hold(out.nbytes, index.x.nbytes, step * (k + 1) * 16)
        return out


def _exact_graph(x: np.ndarray, k: int, progress) -> torch.Tensor:
    n = x.shape[0]
    bar = progress_bar(-(-n // 4096), "kNN graph (exact)", progress)
    xt, out = torch.from_numpy(x), torch.empty((n, k), dtype=torch.int64)
    for s in range(0, n, 4096):
        e = min(n, s + 4096)
        out[s:e] = exact_neighbors(xt, torch.arange(s, e), k)
        bar.update(1)
    bar.close()
    return out
