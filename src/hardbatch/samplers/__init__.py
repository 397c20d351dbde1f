"""Batch samplers: ``DataLoader(dataset, batch_sampler=sampler)`` yields ``list[int]`` batches.

Every sampler shares the contract of :mod:`hardbatch.samplers.base` (epoch length, seeds,
resume, ranks). Modules:

* ``base``: :class:`PlanSampler`, the plan, its rank split and its checkpoints;
* ``planner``: :class:`Planner`, the optional thread that plans steps ahead (``prefetch``);
* ``refresh``: :class:`RefreshPolicy`, rebuilding a sampler's structure from its embedding
  source every t steps or every epoch (lag, background and distributed builds), and
  :class:`RefreshingSampler`, a plan sampler with one;
* ``anchored``: :class:`AnchoredSampler`, the base of the two samplers below;
* ``duplicates``: ``duplicate_keys`` (items with equal keys never share a batch): encoding,
  feasibility checks and the repair of partitions;
* one module per sampler: ``uniform``, ``proximity``, ``knn``, ``gcbs``.
"""

from .anchored import AnchoredSampler
from .base import PlanSampler
from .gcbs import GCBSSampler
from .knn import KNNBatchSampler
from .planner import Planner
from .proximity import ProximityGraphSampler
from .refresh import RefreshingSampler, RefreshPolicy
from .uniform import UniformBatchSampler

__all__ = ["AnchoredSampler", "GCBSSampler", "KNNBatchSampler", "PlanSampler", "Planner",
           "ProximityGraphSampler", "RefreshPolicy", "RefreshingSampler",
           "UniformBatchSampler"]
