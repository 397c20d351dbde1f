"""Topic-aware sampling (TAS-B): batches drawn from few spherical k-means clusters.

:class:`ClusterBuilder` clusters the embeddings and orders an epoch (and checkpoints the
order); the sampler cuts the order into batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .. import _rng
from .._device import resolve_device
from .._validation import check_int
from .._memory import check_memory
from ..batching.communities import group_order, groups_per_batch, spherical_clusters
from ..embeddings import EmbeddingSource
from ..neighbors.kmeans import check_kmeans_backend
from ..neighbors.kmeans_tree import kmeans_tree, kmeans_tree_bytes, tree_levels
from .embedding_sampler import built
from .options import ClusterOptions, take_options
from .partition_sampler import PartitionSampler, fixed_source, load_order, save_order, \
    served_order
from .refresh import PlanShape

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ClusterBatchSampler", "ClusterBuilder"]


class ClusterBuilder:
    """The :class:`~hardbatch.samplers.refresh.Builder` of :class:`ClusterBatchSampler`: the
    spherical k-means clusters of the embeddings (once for fixed ones) and each epoch's order
    of them (:func:`hardbatch.batching.communities.group_order`, keys separated).

    Args:
        plan: the sampler's :class:`~hardbatch.samplers.refresh.PlanShape` (N, B', drop,
            seed, keys).
        clusters, clusters_per_batch: k and c.
        iters, kmeans, levels: the k-means iterations, backend and tree levels (None: one
            k-means up to 256 clusters, two levels above).
        device: where the torch k-means runs (None: the rows' device).
        fixed: the source is a fixed table: its clusters are built once.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.cluster_sampler import ClusterBuilder
        >>> from hardbatch.samplers.refresh import PlanShape
        >>> builder = ClusterBuilder(PlanShape(40, 8, 5, 0, 0, None), 5, 1, kmeans="torch")
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8), dim=1)
        >>> order = builder.build(x, 0, None)
        >>> sorted(order.tolist()) == list(range(40)), len(builder.labels), builder.exact_build
        (True, 40, False)
    """

    exact_build = False

    @property
    def cheaper_build(self) -> str:
        """The cost advice's cheaper options (the tree only when it is not in use)."""
        fewer = f"iters= below {self.iters}"
        return fewer if self.levels is not None else \
            f"kmeans_levels=3 (a k-means tree: fewer centroids per item) or {fewer}"

    def __init__(self, plan: PlanShape, clusters: int, clusters_per_batch: int, *,
                 iters: int = 10, kmeans: str = "auto", levels: int | None = None,
                 device: torch.device | None = None, fixed: bool = False) -> None:
        self.plan, self.clusters, self.clusters_per_batch = plan, clusters, clusters_per_batch
        self.iters, self.kmeans, self.levels = iters, kmeans, levels
        self.device, self.fixed = device, fixed
        self.labels: np.ndarray | None = None  # the clusters of the last build
        self.fill_batches = 0  # batches of the last built epoch holding more than c clusters

    def cluster(self, x: torch.Tensor, epoch: int) -> np.ndarray:
        """Cluster labels of the rows ``x``; fixed embeddings are clustered once."""
        if self.fixed and self.labels is not None:
            return self.labels
        if self.device is not None:
            x = x.to(self.device)
        seed = _rng.derive_seed(self.plan.seed, 0xC1) if self.fixed else \
            _rng.derive_seed(self.plan.seed, epoch, 0xC1)
        n, d, k, levels = x.shape[0], x.shape[1], self.clusters, self.levels
        tree = levels is not None
        check_memory(kmeans_tree_bytes(n, d, k, levels or min(2, tree_levels(k)),
                                       normalized=tree) + n * 8 * 4,  # + the epoch's order
                     n=n, d=d, what="ClusterBatchSampler's k-means",
                     reduce="kmeans_levels=3 (a k-means tree over the normalised rows, no copy)")
        if tree:
            self.labels = kmeans_tree(x, k, levels=levels, seed=seed, iters=self.iters,
                                      backend=self.kmeans, normalized=True)
        else:
            self.labels = spherical_clusters(x, k, seed=seed, iters=self.iters,
                                             backend=self.kmeans)
        return self.labels

    def build(self, x: torch.Tensor, epoch: int, group) -> np.ndarray:
        """Epoch ``epoch``'s item order (batch i: slice i), from the unit rows ``x``."""
        labels, plan = self.cluster(x, epoch), self.plan
        b, drop = plan.batch_size, plan.drop
        order = group_order(labels, b, self.clusters_per_batch, drop=drop,
                            seed=_rng.derive_seed(plan.seed, epoch, 0xC2))
        order = served_order(order, plan)
        self.fill_batches = int((groups_per_batch(order, labels, b) >
                                 self.clusters_per_batch).sum())
        return order

    save_structure = staticmethod(save_order)
    load_structure = staticmethod(load_order)


class ClusterBatchSampler(PartitionSampler):
    """TAS-B (Hofstätter et al., SIGIR 2021): each batch drawn from ``clusters_per_batch``
    spherical k-means clusters of the embeddings; an epoch is a partition of the items.

    Build (:func:`hardbatch.batching.communities.spherical_clusters`): spherical k-means with
    ``clusters`` centroids (faiss ``Kmeans(spherical=True)`` when installed, else
    :func:`hardbatch.neighbors.kmeans.spherical_kmeans`; two levels above 256 clusters). Each epoch
    (:func:`hardbatch.batching.communities.group_order`): the clusters in a random order, their items
    shuffled, split into c = ``clusters_per_batch`` lanes; slot j of a batch (B / c items) comes
    from lane j, whole slots of a cluster first. A cluster that runs out mid-batch is continued
    by the next cluster of its lane (the fill): only the batches cut from the clusters'
    leftovers hold more than c clusters, at most one extra per cluster end (``fill_batches``
    counts them; with the default ``clusters`` = N / B and uneven k-means clusters that is
    about half the batches, with fewer, larger clusters few). The full batches are visited in
    random order, the short last one (N mod B items) last. Every item once per epoch;
    deterministic given ``seed``, the epoch and the embeddings.

    Refresh and cost: fixed embeddings (an array or tensor, e.g. computed once by a teacher
    model) are clustered once, at the first epoch; each epoch then only re-shuffles (O(N)). An
    :class:`~hardbatch.EmbeddingBank` (fed by the training loop, no extra encoding) or a
    callable (re-encodes the whole corpus at each call) is read and re-clustered at the start
    of every epoch (``refresh_lag`` / ``background`` as for GCBS; not every t steps). One
    clustering of N rows in d dims costs about ``iters * d * N * sqrt(clusters)`` (two levels)
    multiply-adds plus an ``N x clusters`` assignment for up to 256 clusters.

    Scale (``kmeans_levels``): a tree of k-means (:func:`hardbatch.neighbors.kmeans_tree.
    kmeans_tree`) with that many levels, branching about ``clusters^(1/levels)``: 3 levels cost
    ``N d (3 clusters^(1/3))`` per iteration (at N = 10M, B = 64: 162 centroids per item instead
    of 791 with two levels) and use the sampler's normalised rows without a copy; the clusters
    are those of a deeper tree (an item's cluster is the nearest centroid of its last level
    only). None (default): the build above (``spherical_clusters``), the same at every N. Before
    the build allocates, its memory is estimated; one that would not fit raises a
    ``ValueError`` naming N, d, the estimate and ``kmeans_levels``.

    Args:
        embeddings: [N, d] tensor / array (fixed), an :class:`~hardbatch.EmbeddingBank`, or a
            callable returning one (cosine: rows are L2-normalised).
        batch_size: B.
        clusters: k (default None: ``ceil(N / B')``, B' the plan's batch size; the value used
            is ``num_clusters``); at most N.
        clusters_per_batch: c, clusters a batch draws from (default 1); at most B'.
        iters: k-means iterations (default 10).
        kmeans: ``"auto"`` (faiss when installed), ``"faiss"`` or ``"torch"``.
        kmeans_levels: None (default: one k-means up to 256 clusters, two levels above) or the
            levels of a k-means tree (scale, above; 1: one k-means).
        **options: the shared options (:mod:`hardbatch.samplers.options`) but ``prefetch``,
            ``normalize`` (rows are always L2-normalised), ``distributed``, ``process_group``,
            ``precision`` and ``progress``. Here: ``device`` is where the torch k-means runs
            (default: the source's device); ``refresh_lag`` / ``background`` read the source
            ``refresh_lag`` steps before an epoch ends and cluster for the next epoch (in a
            worker thread with ``background``), as for GCBS; ``drop_last`` leaves out
            ``drop_count`` items (N mod B, and with W ranks the full batches that would not
            fill a last step; a random choice per epoch) so every batch is full and served;
            ``duplicate_keys``: a clashing item swaps with the nearest batch lacking its key,
            as for GCBS (this may add a cluster to a batch).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> sampler = hb.ClusterBatchSampler(x, 8, kmeans="torch")
        >>> batches = list(sampler)
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([8, 8, 8, 8, 8], True)
        >>> sampler.num_clusters, sampler.fill_batches <= sampler.num_clusters
        (5, True)
    """

    _settings = PartitionSampler._settings + ("clusters", "clusters_per_batch", "iters",
                                              "kmeans", "kmeans_levels")
    Options = ClusterOptions

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 clusters: int | None = None, *, clusters_per_batch: int = 1, iters: int = 10,
                 kmeans: str = "auto", kmeans_levels: int | None = None,
                 **options: Unpack[ClusterOptions]) -> None:
        shared = take_options(type(self), options, normalize=True, distributed=False)
        device = shared.pop("device")
        super().__init__(embeddings, batch_size, **shared)
        n, b = self.num_items, self.plan_batch_size
        self.clusters_per_batch = self.check_per_batch(clusters_per_batch, "clusters_per_batch")
        self.clusters = None if clusters is None else check_int(clusters, "clusters", low=1)
        self.num_clusters = -(-n // b) if clusters is None else self.clusters  # k
        if self.num_clusters > n:
            raise ValueError(f"clusters={clusters} must be at most the N={n} items; use "
                             f"clusters <= {n} or None (default ceil(N / B) = {-(-n // b)})")
        check_kmeans_backend(kmeans, "kmeans")  # faiss's ImportError now, not at an epoch
        self.kmeans, self.iters = kmeans, check_int(iters, "iters", low=1)
        self.kmeans_levels = None if kmeans_levels is None else check_int(
            kmeans_levels, "kmeans_levels", low=1)
        self.refresh_policy.builder = ClusterBuilder(
            self._plan_shape(self.drop_count), self.num_clusters, self.clusters_per_batch,
            iters=self.iters, kmeans=kmeans, levels=self.kmeans_levels,
            device=None if device is None else resolve_device(device),
            fixed=fixed_source(embeddings))

    labels = built("labels", "The clusters of the last build (None before it).")
    fill_batches = built("fill_batches", "Batches of the last built epoch holding more than "
                                         "``clusters_per_batch`` clusters.")
