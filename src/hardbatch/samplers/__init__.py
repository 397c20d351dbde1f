"""Batch samplers: ``DataLoader(dataset, batch_sampler=sampler)`` yields ``list[int]`` batches.

Every sampler shares the contract of :mod:`hardbatch.samplers.base` (epoch length, seeds,
resume, ranks). Public: the four samplers and the two extension points, :class:`PlanSampler`
(a plan of batches) and :class:`EmbeddingSampler` (batches drawn from a structure rebuilt from
embeddings, by way of the :class:`Builder` protocol). Modules:

* ``base``: :class:`PlanSampler`, the plan, its rank split and its checkpoints;
* ``prefetch``: the optional thread that plans steps ahead (``prefetch``);
* ``refresh``: the :class:`Builder` protocol and the refresh policy, which rebuilds a sampler's
  structure from its embedding source every t steps or every epoch (lag, background and
  distributed builds);
* ``embedding_sampler``: :class:`EmbeddingSampler`, the base of the three samplers below;
* ``duplicates``: ``duplicate_keys`` (items with equal keys never share a batch): encoding,
  feasibility checks and the repair of partitions; ``conflicts``: key sets (items conflict
  when their sets meet: no text of a row twice in a batch), as pure array functions;
* ``single_source``: :class:`SingleSourceBatchSampler`, a composite drawing each batch from
  one of several sources (by size, temperature or weights) with any sampler inside;
* one module per sampler: ``uniform``, ``proximity``, ``knn``, ``gcbs_sampler``, ``cluster``
  (TAS-B), ``community`` (B3).

Inheritance: ``torch.utils.data.Sampler`` > ``PlanSampler`` > ``UniformBatchSampler`` |
``EmbeddingSampler`` > ``ProximityGraphSampler`` | ``KNNBatchSampler`` | ``GCBSSampler`` |
``ClusterBatchSampler`` | ``CommunityBatchSampler``.
"""

from .base import PlanSampler
from .cluster import ClusterBatchSampler
from .community import CommunityBatchSampler
from .embedding_sampler import EmbeddingSampler
from .gcbs_sampler import GCBSSampler
from .knn import KNNBatchSampler
from .proximity import ProximityGraphSampler
from .refresh import Builder
from .single_source import SingleSourceBatchSampler
from .uniform import UniformBatchSampler

__all__ = ["Builder", "ClusterBatchSampler", "CommunityBatchSampler", "EmbeddingSampler",
           "GCBSSampler", "KNNBatchSampler", "PlanSampler",
           "ProximityGraphSampler", "SingleSourceBatchSampler", "UniformBatchSampler"]
