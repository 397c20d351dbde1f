"""B3 (Thirukovalluru et al., NeurIPS 2025): batches of K communities of a kNN rank graph."""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import torch

from .. import _rng
from .._device import resolve_device
from .._logging import get_logger
from .._memory import check_memory
from .._validation import check_choice, check_int
from ..batching.communities import CELL_BATCHES, EDGES, PARTITIONERS, cell_order, community_cells, \
    community_labels, group_order, pairs_in_batches, rank_graph, require_metis, separate_pairs, \
    trimmed_order
from ..embeddings import EmbeddingSource
from ..neighbors.index_search import KNN_METHODS
from ..neighbors.knn_graph import knn_graph
from ..batching.local_communities import AUTO_CELLS_ABOVE, CELL_ITEMS, coarse_cells, \
    global_communities_bytes, local_communities, local_communities_bytes
from ..batching.metis_partition import check_imbalance
from .embedding_sampler import built
from .options import CommunityOptions, take_options
from .partition_sampler import PartitionSampler, fixed_source, load_order, save_order, \
    served_order
from .refresh import PlanShape
from ..keys.derive import same_key_graph

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["CommunityBatchSampler", "CommunityBuilder", "CommunityCells"]

NEAR_CANDIDATES = 16  # window neighbours whose batches a separated item tries first
LOCAL_WORKERS = 2  # cells built at once by the cell-local build (threads)
_LOG = get_logger("samplers")
BATCHINGS = ("fill", "trim")  # ours; B3's authors'


@dataclass(frozen=True)
class CommunityCells:
    """Where :class:`CommunityBatchSampler` runs METIS: its ``cells=`` option.

    Args:
        batches: 0 (default: one METIS run over the graph, or over each cell of ``items``) or
            the batches per k-means cell of the local build (e.g. ``CELL_BATCHES`` = 2: one
            METIS run per cell of about two batches, stable under noise); METIS and
            ``batching="fill"`` only.
        items: items per cell of the cell-local build (scale); 0: the global build; None
            (default): 0 up to ``AUTO_CELLS_ABOVE`` (2,000,000) items, ``CELL_ITEMS`` (5,000)
            above.

    Example:
        >>> from hardbatch.samplers import CommunityCells
        >>> CommunityCells(batches=2)
        CommunityCells(batches=2, items=None)
        >>> CommunityCells(items=-5)
        Traceback (most recent call last):
            ...
        ValueError: cells=CommunityCells(items=-5): items must be an integer >= 0 or None; use ...
    """

    batches: int = 0
    items: int | None = None

    def __post_init__(self) -> None:
        for name, value, example in (("batches", self.batches, CELL_BATCHES),
                                     ("items", self.items, CELL_ITEMS)):
            if value is None and name == "items":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                allowed = "an integer >= 0" + (" or None" if name == "items" else "")
                raise ValueError(f"cells=CommunityCells({name}={value!r}): {name} must be "
                                 f"{allowed}; use e.g. cells=CommunityCells({name}={example})")
            object.__setattr__(self, name, int(value))


class CommunityBuilder:
    """The :class:`~hardbatch.samplers.refresh.Builder` of :class:`CommunityBatchSampler`: the
    communities of the kNN rank graph (once for fixed embeddings; globally or cell by cell) and
    each epoch's order of them, the skipped ranks and keys kept apart.

    Args:
        plan: the sampler's :class:`~hardbatch.samplers.refresh.PlanShape` (N, B', drop,
            seed, keys).
        communities_per_batch: K.
        skip, window, partitioner, knn_method, imbalance, edges, batching, cells: as for the
            sampler (checked there).
        device: where the kNN graphs are computed.
        fixed: the source is a fixed table: its communities are built once.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.community_sampler import CommunityBuilder
        >>> from hardbatch.samplers.refresh import PlanShape
        >>> builder = CommunityBuilder(PlanShape(40, 8, 5, 0, 0, None), 2, skip=1, window=6,
        ...                            device=torch.device("cpu"))
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8), dim=1)
        >>> order = builder.build(x, 0, None)
        >>> sorted(order.tolist()) == list(range(40)), builder.parts, builder.exact_build
        (True, 10, False)
    """

    exact_build = False

    @property
    def cheaper_build(self) -> str:
        """The cost advice's cheaper options, for the build in use: smaller cells, or for the
        global build an approximate kNN graph (unless in use) and cells."""
        if self.cell_items_used:
            return f"smaller cells (cells=CommunityCells(items={self.cell_items_used // 2}))"
        cells = f"cells=CommunityCells(items={CELL_ITEMS}) (kNN graph and METIS cell by cell)"
        return cells if self.knn_method == "faiss-ivf" else \
            f"knn_method='faiss-ivf' (an approximate kNN graph) or {cells}"

    def __init__(self, plan: PlanShape, communities_per_batch: int, *, skip: int = 3,
                 window: int = 20, partitioner: str = "metis", knn_method: str | None = None,
                 imbalance: float = 1.03, edges: str = "union", batching: str = "fill",
                 cells: CommunityCells = CommunityCells(), device: torch.device,
                 fixed: bool = False) -> None:
        n, b, k = plan.num_items, plan.batch_size, communities_per_batch
        self.plan, self.communities_per_batch = plan, k
        self.skip, self.window, self.partitioner = skip, window, partitioner
        self.knn_method, self.imbalance, self.edges = knn_method, imbalance, edges
        self.batching, self.cells, self.device, self.fixed = batching, cells, device, fixed
        #: the communities (parts) of a build ("trim": one per chunk served, drop_last's left out)
        self.parts = (n - plan.drop) // (b // k) if batching == "trim" else \
            min(n, max(1, round(n * k / b)))
        #: the cell size of the builds (0: global): ``cells.items``, or its automatic value
        self.cell_items_used = (0 if n <= AUTO_CELLS_ABOVE else CELL_ITEMS) \
            if cells.items is None else cells.items
        self.groups: tuple | None = None  # (labels, skipped pairs, near items) of the last build
        #: the last build's k-means cell of each item (``cells.batches``; METIS, "fill"), or None
        self.cell_labels: np.ndarray | None = None
        self.separated = 0  # swaps of the last built epoch
        self.forced_pairs = 0  # skipped-rank pairs sharing a batch in the last built epoch

    def communities(self, x: torch.Tensor, epoch: int) -> tuple:
        """(community labels, skipped-rank pairs, window neighbours) of the unit rows ``x``;
        built once for fixed embeddings, globally or cell by cell (:attr:`cell_items_used`).
        With METIS, ``batching="fill"`` and ``cells.batches`` the communities are found within
        k-means cells (:func:`hardbatch.batching.communities.community_cells`, kept in
        :attr:`cell_labels`); the authors' ``"trim"`` runs METIS once over the whole graph (or
        once per cell of ``cells.items``)."""
        if self.fixed and self.groups is not None:
            return self.groups
        plan = self.plan
        seed = _rng.derive_seed(plan.seed, 0xB3) if self.fixed else \
            _rng.derive_seed(plan.seed, epoch, 0xB3)
        local = self.partitioner == "metis" and self.batching == "fill" and self.cells.batches
        n, d, ranks = x.shape[0], x.shape[1], self.skip + self.window
        keep = min(ranks, self.skip + NEAR_CANDIDATES)
        if self.cell_items_used:
            check_memory(local_communities_bytes(  # cells up to 4x the mean; + near, pairs
                n, d, min(n, 4 * self.cell_items_used), ranks=ranks, keep=keep,
                window=self.window, workers=LOCAL_WORKERS) + n * (keep * 8 + self.skip * 40),
                n=n, d=d, what="CommunityBatchSampler's cell-local build",
                reduce="smaller cells=CommunityCells(items=...) (or a smaller window=)")
            xd = x.to(self.device)  # where the kNN graphs are computed
            cells = coarse_cells(xd, self.cell_items_used, seed=_rng.derive_seed(seed, 0xCE12),
                                 normalized=True)
            out = local_communities(xd, cells, self.parts, skip=self.skip, window=self.window,
                                    partitioner=self.partitioner, seed=seed,
                                    imbalance=self.imbalance, edges=self.edges, keep=keep,
                                    cell_batches=self.cells.batches if local else 0,
                                    batch_size=plan.batch_size, workers=LOCAL_WORKERS)
            labels, nbrs, self.cell_labels = out.labels, out.neighbors, out.subcells
        else:
            check_memory(global_communities_bytes(n, d, ranks=ranks, window=self.window,
                                                  index=self.knn_method != "exact" and n > 50_000),
                         n=n, d=d, what="CommunityBatchSampler's global build",
                         reduce=f"cells=CommunityCells(items={CELL_ITEMS}) (kNN graph and METIS "
                                "cell by cell) or a smaller window=")
            method = {} if self.knn_method is None else {"method": self.knn_method}
            try:
                nbrs = knn_graph(x, ranks, device=self.device, seed=seed & 0x7FFFFFFF,
                                 **method).numpy()
            except ImportError as exc:  # the sampler's parameter is knn_method=, not method=
                raise ImportError(str(exc).replace("method=", "knn_method=")) from exc
            self.cell_labels = community_cells(x, plan.batch_size, seed=_rng.derive_seed(
                seed, 0xCE11), cell_batches=self.cells.batches) if local else None
            labels = community_labels(nbrs, self.parts, skip=self.skip, window=self.window,
                                      partitioner=self.partitioner, seed=seed, embeddings=x,
                                      imbalance=self.imbalance, edges=self.edges,
                                      cells=self.cell_labels)
        _LOG.info("CommunityBatchSampler build: N=%d d=%d %s", n, d,
                  f"cell-local, cells of ~{self.cell_items_used} items"
                  if self.cell_items_used else "global")
        pairs = rank_graph(nbrs[:, :self.skip], 0, self.skip)
        near = np.ascontiguousarray(nbrs[:, self.skip:self.skip + NEAR_CANDIDATES], np.int64)
        self.groups = (labels, pairs, near)
        return self.groups

    def build(self, x: torch.Tensor, epoch: int, group) -> np.ndarray:
        """Epoch ``epoch``'s item order (batch i: slice i), from the unit rows ``x``."""
        labels, pairs, near = self.communities(x, epoch)
        plan = self.plan
        b, drop = plan.batch_size, plan.drop
        kept = plan.num_items - drop
        keys, seed = plan.keys, _rng.derive_seed(plan.seed, epoch, 0xB4)
        keyed = keys is not None and keys.any
        blocks = None
        if self.batching == "trim":  # B3's authors': no separation; the drop: random items
            order = trimmed_order(labels, b // self.communities_per_batch, seed=seed, drop=drop)
            apart = same_key_graph(keys.ids) if keyed else None
        else:
            if self.cell_labels is not None:  # pieces cut within cells: noise moves its own
                order, blocks = cell_order(labels, self.cell_labels, b, self.communities_per_batch,
                                           seed=seed, drop=drop)
            else:
                order = group_order(labels, b, 1, drop=drop, seed=seed)
            apart = (pairs + same_key_graph(keys.ids)).tocsr() if keyed else pairs
        if apart is not None and apart.nnz:  # copies kept apart in the same pass
            order, self.separated, _ = separate_pairs(order, kept, b, apart, x, near, blocks)
        order = served_order(order, plan)
        self.forced_pairs = pairs_in_batches(order, kept, b, pairs)
        return order

    save_structure = staticmethod(save_order)
    load_structure = staticmethod(load_order)


class CommunityBatchSampler(PartitionSampler):
    """B3, "Breaking the Batch Barrier" (Thirukovalluru et al., NeurIPS 2025): each batch is
    ``communities_per_batch`` (K) communities of about B / K items of a sparse kNN rank graph;
    an epoch is a partition of the items.

    Build: the ``skip + window`` nearest neighbours of every item (:func:`hardbatch.knn_graph`,
    ``method=knn_method``); ranks ``skip + 1 .. skip + window`` (strong negatives) symmetrised
    into a sparse graph and cut by METIS into ``round(N K / B')`` balanced communities of about
    B' / K items (:func:`hardbatch.batching.communities.community_labels`) in one METIS run over the
    whole graph (B3's; the configuration measured in docs/results/code_search.md). Opt-in,
    ``cells=CommunityCells(batches=c)``, c >= 1: one METIS run per cell instead, the items
    first split into spherical k-means cells of about c batches
    (:func:`hardbatch.batching.communities.community_cells`), a cell's communities on the edges
    within it (stable under noise, below; not yet measured in training). The top ``skip`` ranks
    (likely positives or near-duplicates: false negatives) are left out of the graph. Each
    epoch (:func:`hardbatch.batching.communities.cell_order`): in every cell the communities in a random order, their items shuffled, cut into pieces of B' / K
    (a community's whole pieces first; one that runs out mid-piece is continued by the next);
    a batch is K pieces drawn at random, so about K communities of unrelated cells; the short
    last batch last. Then no pair of the skipped ranks shares a batch
    (:func:`hardbatch.batching.communities.separate_pairs`: one item of the pair swaps with the most
    similar item of a piece of its cell in a batch holding its window neighbours, where it
    stays hard), except pairs no swap can separate (``forced_pairs`` counts what is left;
    ``separated`` the swaps). Every item once per epoch; deterministic given ``seed``, the
    epoch and the embeddings.

    Scale (``cells=CommunityCells(items=...)``): the global build holds a kNN table, a graph
    of about ``2 N window`` edges and METIS's copy of it (some 30 GB at N = 10M) and its kNN
    graph costs up to ``N^2 d``. With ``cells.items`` > 0 it runs cell by cell instead
    (:mod:`hardbatch.batching.local_communities`): a spherical k-means tree cuts the items into
    cells of about ``cells.items`` items, and in each cell, on its items alone, the exact kNN
    graph, the rank window's edges and METIS into the cell's share of the communities (with
    ``cells.batches``: per sub-cell of it), two cells at a time; memory beyond the embeddings is
    the ``[N]`` outputs, each item's first ``skip + 16`` cell-local ranks (int32) and the cells
    in flight. An item's window then comes from its cell (a neighbour in another cell is
    replaced by a farther one of its own) and no community crosses a cell: docs/benchmarks.md
    ("Ten million items") measures what that loses. ``cells.items`` None (default) builds
    globally up to ``AUTO_CELLS_ABOVE`` (2,000,000) items and in cells of ``CELL_ITEMS``
    (5,000) above; the path that ran is logged (``hardbatch.samplers``, INFO) and kept in
    :attr:`cell_items_used`. Before a build allocates, its memory is estimated; a build that
    would not fit the available memory raises a ``ValueError`` naming N, d, the estimate and
    the option that reduces it.

    Reproducibility across machines: METIS is chaotic in its graph (one edge more or less
    moves every part of its run), and tiny noise in the embeddings (two machines' matrix
    kernels differ by about 1e-6 relative) swaps two kNN ranks tied at a window's end here and
    there, so no build is bit-stable. With ``cells.batches`` >= 1 the cells keep such a change
    in its cell: it moves the
    batches that hold that cell's pieces (about 2 K of them), not the plan. Measured on 20,000
    MiniLM embeddings (B = 64; ``benchmarks/bench_plan_stability.py``): 96% of the batches stay
    identical at 1e-6 and 93% at 1e-5 (one METIS run over the whole graph: 0% and 0%); at 1e-5
    a k-means cell may move too, which moves more. The default ``cells.batches = 0`` (one
    METIS run) and the authors' ``batching="trim"`` (one run, one trimming over all parts)
    keep no batch under such noise. To get the same batches on every machine, write the plan
    once and replay it (:func:`hardbatch.write_plan`, :class:`hardbatch.PlanBatchSampler`).

    B3's authors' code (github.com/raghavlite/B3, ``data_processing/spectral_clustering4_ibn.py``)
    builds it otherwise; :meth:`authors` (the settings :attr:`AUTHORS`) follows it: ``edges=
    "mutual"`` (i and j joined only when each lists the other), their rank window (positions
    30 .. 129 of a teacher's ranking that starts with the item itself: ``skip=29, window=100``;
    ``skip=69`` for their 70 .. 169), and ``batching="trim"``: ``N // (B / K)`` parts (K = 1:
    one part per batch), trimmed and filled to exactly B / K items
    (:func:`hardbatch.batching.communities.trimmed_order`), in random order each epoch, the ``N mod
    (B / K)`` items left over in the short last batch (the authors pad it to B with copies of
    other items instead: the plan here is a partition; with ``drop_last``, ``(N - drop_count) //
    (B / K)`` parts and the ``drop_count`` items left out a random choice per epoch, made
    before the trimming) and no separation of the top ranks (they
    do none; ``forced_pairs`` then counts those sharing a batch). Ours (the defaults): the union
    (every item joined to its whole window), a short window after three top ranks kept apart,
    and K communities a batch (docs/samplers.md, "B3's authors' settings and ours", says why).

    Refresh and cost: fixed embeddings (an array or tensor, e.g. computed once by a teacher
    model, as B3 does) build the graph and communities once; each epoch then shuffles and
    separates (O(N skip)). An :class:`~hardbatch.EmbeddingBank` (fed by the training loop) or a
    callable (re-encodes the whole corpus at each call) is read and rebuilt at the start of
    every epoch (``refresh_lag`` / ``background`` as for GCBS; not every t steps). A build is
    a kNN graph of ``skip + window`` neighbours (exact: O(N^2 d); see ``knn_method``), a
    k-means of the cells and METIS runs on about ``2 N window`` edges in all.

    Args:
        embeddings: [N, d] tensor / array (fixed), an :class:`~hardbatch.EmbeddingBank`, or a
            callable returning one (cosine: rows are L2-normalised).
        batch_size: B.
        communities_per_batch: K (default 4): communities of about B' / K items; at most B'.
        skip: p, the nearest ranks left out and kept apart (default 3; 0: none).
        window: m, the ranks after them that make the graph (default 20); ``skip + window``
            must be below N.
        partitioner: ``"metis"`` (default, B3's: ``pip install 'hardbatch[metis]'``) or
            ``"kmeans"`` (no extra: spherical k-means clusters of the embeddings, not balanced
            and blind to the graph; the skipped ranks are still kept apart).
        knn_method: the ``method`` of :func:`hardbatch.knn_graph` for the global build, passed
            through (None: its default; ``"exact"`` costs O(N^2 d), ``"faiss-ivf"`` /
            ``"hnsw"`` are approximate); checked at construction. Builds in cells (``cells``)
            compute each cell's graph themselves and do not use it.
        imbalance: METIS's balance tolerance in [1, 2] (default 1.03: no community above 1.03
            times its cell's average; above 2 METIS leaves communities empty and prints errors).
        edges: ``"union"`` (default: i and j joined when either lists the other) or ``"mutual"``
            (when both do: B3's authors').
        batching: ``"fill"`` (default: ``round(N K / B')`` communities, a community that runs
            out mid-batch continued by the next, the top ranks kept apart) or ``"trim"`` (B3's
            authors': ``N // (B' / K)`` parts cut to exactly B' / K items, ``(N -
            drop_count) // (B' / K)`` with ``drop_last``; K must divide B').
        cells: where METIS runs: None (default: ``CommunityCells()``, one run over the graph,
            cells of 5,000 items above 2,000,000) or a :class:`CommunityCells`:
            ``CommunityCells(batches=2)`` one run per k-means cell of about two batches
            (stable under noise, above; METIS and ``"fill"`` only),
            ``CommunityCells(items=5_000)`` the cell-local build (scale, above; ``items=0``:
            always the global build); both may be given.
        **options: the shared options (:mod:`hardbatch.samplers.options`) but ``prefetch``,
            ``normalize`` (rows are always L2-normalised), ``distributed``, ``process_group``,
            ``precision`` and ``progress``. Here: ``device`` is where the kNN graph is computed
            (default: the CPU); ``refresh_lag`` / ``background`` read the source
            ``refresh_lag`` steps before an epoch ends and build for the next epoch (in a worker
            thread with ``background``), as for GCBS; ``drop_last`` leaves out ``drop_count``
            items (N mod B, and with W ranks the full batches that would not fill a last step;
            a random choice per epoch; with ``cells.batches`` the order's last batches, cut
            from random pieces and the cells' leftovers) so every batch is full and served;
            ``duplicate_keys``: kept apart by the pair separation, then (what it could not
            separate) repaired as for GCBS.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> sampler = hb.CommunityBatchSampler(x, 8, 2, skip=1, window=6)
        >>> batches = list(sampler)
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([8, 8, 8, 8, 8], True)
        >>> sampler.parts, sampler.forced_pairs
        (10, 0)
        >>> x = np.random.default_rng(0).standard_normal((205, 8)).astype(np.float32)
        >>> authors = hb.CommunityBatchSampler.authors(x, 10)  # B3's authors' settings
        >>> authors.parts, [len(b) for b in authors][-2:]  # 20 parts of 10, then 5 left over
        (20, [10, 5])
    """

    #: B3's authors' settings (see above); :meth:`authors` applies them.
    AUTHORS = MappingProxyType({"edges": "mutual", "batching": "trim", "skip": 29,
                                "window": 100, "communities_per_batch": 1})

    _settings = PartitionSampler._settings + (
        "communities_per_batch", "skip", "window", "partitioner", "knn_method", "imbalance",
        "edges", "batching", "cells")

    Options = CommunityOptions

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 communities_per_batch: int = 4, *, skip: int = 3, window: int = 20,
                 partitioner: str = "metis", knn_method: str | None = None,
                 imbalance: float = 1.03, edges: str = "union", batching: str = "fill",
                 cells: CommunityCells | None = None, **options: Unpack[CommunityOptions]) -> None:
        shared = take_options(type(self), options, normalize=True, distributed=False)
        device = shared.pop("device")
        super().__init__(embeddings, batch_size, **shared)
        n = self.num_items
        k = self.check_per_batch(communities_per_batch, "communities_per_batch")
        self.communities_per_batch = k
        self.skip = check_int(skip, "skip", low=0)
        self.window = check_int(window, "window", low=1)
        if self.skip >= n - 1:
            raise ValueError(f"skip={skip} leaves out every neighbour of an item (N={n} items "
                             f"have {n - 1}); use skip <= {max(0, n - 2)}")
        if self.skip + self.window >= n:
            raise ValueError(f"window={window} with skip={skip} needs skip + window = "
                             f"{self.skip + self.window} neighbours per item but N={n} items "
                             f"have {n - 1}; use window <= {max(0, n - 1 - self.skip)}")
        check_choice("partitioner", partitioner, PARTITIONERS)
        if knn_method is not None:
            check_choice("knn_method", knn_method, KNN_METHODS)
        if partitioner == "metis":
            require_metis()  # ImportError now, naming the extra, not at the first epoch
        self.partitioner, self.knn_method = partitioner, knn_method
        # METIS's working range: [1, 2]; partitioner="kmeans" has no balance tolerance
        self.imbalance = check_imbalance(imbalance) if partitioner == "metis" else imbalance
        if partitioner != "metis" and imbalance != 1.03:
            warnings.warn(f"imbalance={imbalance} is METIS's balance tolerance; partitioner="
                          f"{partitioner!r} has none and ignores it (drop imbalance)",
                          stacklevel=2)
        check_choice("edges", edges, EDGES)
        check_choice("batching", batching, BATCHINGS)
        self.edges, self.batching = edges, batching
        b = self.plan_batch_size
        if batching == "trim" and (b % k or n < b // k):
            raise ValueError(f"batching='trim' cuts parts of exactly batch_size / "
                             f"communities_per_batch = {b} / {k} items and N={n}: use a "
                             f"communities_per_batch that divides {b} (1: one part per batch, "
                             f"as B3's authors) and N >= {b // k}")
        if cells is None:
            cells = CommunityCells()
        elif not isinstance(cells, CommunityCells):
            raise ValueError(f"cells={cells!r} must be None or a CommunityCells: e.g. "
                             "cells=CommunityCells(batches=2) (one METIS run per k-means cell "
                             "of about two batches) or cells=CommunityCells(items=5_000) (the "
                             "cell-local build)")
        ignored = [f"{name}={value!r}" for name, value, wanted in (
            ("partitioner", partitioner, "metis"), ("batching", batching, "fill"))
            if value != wanted]
        if cells.batches and ignored:
            raise ValueError(f"cells=CommunityCells(batches={cells.batches}) runs METIS once per "
                             f"k-means cell, which only partitioner='metis' with batching='fill' "
                             f"does: with {' and '.join(ignored)} it would be ignored; pass "
                             f"cells=CommunityCells(items={cells.items!r}) (batches=0), or "
                             "partitioner='metis', batching='fill'")
        self.cells = cells
        self.refresh_policy.builder = CommunityBuilder(
            self._plan_shape(self.drop_count), k, skip=self.skip, window=self.window,
            partitioner=partitioner, knn_method=knn_method, imbalance=self.imbalance,
            edges=edges, batching=batching, cells=cells, device=resolve_device(device),
            fixed=fixed_source(embeddings))
        self._check_cell_parts()
        if knn_method is not None and self.cell_items_used:  # a likely misuse: say so
            why = "cells.items" if cells.items else f"automatic above {AUTO_CELLS_ABOVE:,} items"
            warnings.warn(f"knn_method={knn_method!r} is not used: the communities are built in "
                          f"cells of {self.cell_items_used} items ({why}), each cell's kNN "
                          "graph exact; drop knn_method, or pass cells=CommunityCells(items=0) "
                          "for the global build that uses it", UserWarning, stacklevel=2)

    def _check_cell_parts(self) -> None:
        """``ValueError`` unless the cell-local build has a community for each of its cells
        (communities of B' / K items larger than a cell would leave a cell without one)."""
        n, used, parts = self.num_items, self.cell_items_used, self.parts
        cells = min(n, -(-n // used)) if used else 0  # coarse_cells' k-means cells
        if parts >= cells:
            return
        size = "world_size * batch_size" if self.global_batch else "batch_size"
        b, k, given = self.plan_batch_size, self.communities_per_batch, self.cells.items
        items = f"cells.items={used}" if given else \
            f"cells.items=None (automatic: {used} above {AUTO_CELLS_ABOVE:,} items)"
        raise ValueError(f"{items} cuts the N={n} items into {cells} cells of the cell-local "
                         f"build, each needing a community, but {size}={b} with "
                         f"communities_per_batch={k} makes {parts} communities (of about "
                         f"{b // k} items, more than a cell holds); use cells=CommunityCells("
                         f"items={-(-n // parts)}) or larger, a larger communities_per_batch or "
                         f"a smaller {size}")

    parts = built("parts", "The communities (parts) of a build.")
    cell_items_used = built("cell_items_used", "The cell size of the builds (0: global): "
                                               "``cells.items``, or its automatic value.")
    groups = built("groups", "(labels, skipped pairs, near items) of the last build, or None.")
    cell_labels = built("cell_labels", "The last build's k-means cell of each item "
                                       "(``cells.batches``; METIS and ``\"fill\"``), or None.")
    separated = built("separated", "Swaps of the last built epoch.")
    forced_pairs = built("forced_pairs", "Skipped-rank pairs sharing a batch in the last built "
                                         "epoch.")

    @classmethod
    def authors(cls, embeddings: EmbeddingSource, batch_size: int,
                **options) -> CommunityBatchSampler:
        """B3 with its authors' settings (:attr:`AUTHORS`); ``options`` override them (e.g.
        ``skip=69`` for their window 70 .. 169) or add others (``seed``, ``drop_last``, ...)."""
        return cls(embeddings, batch_size, **{**cls.AUTHORS, **options})
