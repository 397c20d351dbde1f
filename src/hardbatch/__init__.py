"""hardbatch: hard-negative mini-batches for contrastive learning.

Samplers that put hard but true negatives together (proximity graph with
random walks, kNN, GCBS), and the contrastive losses that exploit them.
"""

from .data import IndexedDataset, indexed_batch
from .embeddings import EmbeddingBank
from .batching.gcbs import gcbs_permutation
from .gradcache import GradCache
from .neighbors.knn_graph import knn_graph, proximity_graph
from .losses import (
    DebiasedInfoNCE,
    HardNegativeInfoNCE,
    InfoNCE,
    SSCLLoss,
    debiased_floor_stats,
    debiased_info_nce,
    guided_mask,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)
from .plan_files import PlanBatchSampler, read_plan, write_plan
from .samplers import (
    ClusterBatchSampler,
    CommunityBatchSampler,
    CommunityCells,
    GCBSSampler,
    KNNBatchSampler,
    ProximityGraphSampler,
    SingleSourceBatchSampler,
    UniformBatchSampler,
)
from .keys.derive import near_duplicate_keys
from .schedules import EpochStepDecay, LinearDecay
from .batching.walks import walk_batches
from . import registry  # noqa: F401  (names and factories: hb.registry.make_sampler)

__version__ = "0.1.0"

__all__ = [
    "ClusterBatchSampler",
    "CommunityBatchSampler",
    "CommunityCells",
    "DebiasedInfoNCE",
    "EmbeddingBank",
    "GCBSSampler",
    "GradCache",
    "HardNegativeInfoNCE",
    "IndexedDataset",
    "InfoNCE",
    "KNNBatchSampler",
    "EpochStepDecay",
    "LinearDecay",
    "PlanBatchSampler",
    "ProximityGraphSampler",
    "SSCLLoss",
    "SingleSourceBatchSampler",
    "UniformBatchSampler",
    "debiased_floor_stats",
    "debiased_info_nce",
    "gcbs_permutation",
    "guided_mask",
    "hard_negative_info_nce",
    "indexed_batch",
    "info_nce",
    "knn_graph",
    "near_duplicate_keys",
    "proximity_graph",
    "read_plan",
    "sscl_loss",
    "walk_batches",
    "write_plan",
]
