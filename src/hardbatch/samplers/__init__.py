"""Batch samplers: ``DataLoader(dataset, batch_sampler=sampler)`` yields ``list[int]`` batches.

Every sampler shares the contract of :mod:`hardbatch.samplers.base` (epoch length, seeds,
resume, ranks). Public: the six samplers of :mod:`hardbatch.registry`, the single-source
composite, and the extension points: :class:`PlanSampler` (a plan of batches),
:class:`WalkSampler` and :class:`PartitionSampler` (batches drawn from a structure rebuilt
from embeddings by a :class:`Builder` they inject into their refresh policy), and the community
sampler's ``cells=`` option, :class:`CommunityCells`. Modules:

* ``options``: the options every sampler shares, declared once (names, types, defaults);
* ``base``: :class:`PlanSampler`, the plan, its rank split and its checkpoints;
* ``prefetch``: the optional thread that plans steps ahead (``prefetch``);
* ``refresh``: the :class:`Builder` protocol and the refresh policy, which rebuilds a sampler's
  structure from its embedding source with the sampler's builder every t steps or every epoch
  (lag, background and distributed builds), timing and logging every build;
* ``embedding_sampler``: :class:`EmbeddingSampler`, what the two kinds share (the source and
  its refresh policy); ``walk_sampler``: :class:`WalkSampler`, batches grown from start items
  (proximity graph, kNN); ``partition_sampler``: :class:`PartitionSampler`, an epoch cut into
  batches (GCBS, cluster, community);
* ``single_source_sampler``: :class:`SingleSourceBatchSampler`, a composite drawing each
  batch from one of several sources (by size, temperature or weights) with any sampler inside;
* one module per sampler, named after it: ``uniform_sampler``, ``proximity_sampler``,
  ``knn_sampler``, ``gcbs_sampler``, ``cluster_sampler`` (TAS-B), ``community_sampler`` (B3);
  an embedding sampler's builder beside it (``ProximityGraphBuilder``, ``SnapshotBuilder``,
  ``GCBSOrderBuilder``, ``ClusterBuilder``, ``CommunityBuilder``).

What the samplers compute with lives beside them, as pure functions: neighbour search in
:mod:`hardbatch.neighbors`, batch construction (walks, GCBS, communities) in
:mod:`hardbatch.batching`, duplicate keys and key sets in :mod:`hardbatch.keys`.

Inheritance: ``torch.utils.data.Sampler`` > ``PlanSampler`` > ``UniformBatchSampler`` |
``EmbeddingSampler`` > (``WalkSampler`` > ``ProximityGraphSampler`` | ``KNNBatchSampler``) |
(``PartitionSampler`` > ``GCBSSampler`` | ``ClusterBatchSampler`` | ``CommunityBatchSampler``).
"""

from .base import PlanSampler
from .cluster_sampler import ClusterBatchSampler
from .community_sampler import CommunityBatchSampler, CommunityCells
from .embedding_sampler import EmbeddingSampler
from .gcbs_sampler import GCBSSampler
from .knn_sampler import KNNBatchSampler
from .partition_sampler import PartitionSampler
from .proximity_sampler import ProximityGraphSampler
from .refresh import Builder
from .single_source_sampler import SingleSourceBatchSampler
from .uniform_sampler import UniformBatchSampler
from .walk_sampler import WalkSampler

__all__ = ["Builder", "ClusterBatchSampler", "CommunityBatchSampler", "CommunityCells",
           "EmbeddingSampler",
           "GCBSSampler", "KNNBatchSampler", "PartitionSampler", "PlanSampler",
           "ProximityGraphSampler", "SingleSourceBatchSampler", "UniformBatchSampler",
           "WalkSampler"]
