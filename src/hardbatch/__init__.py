"""hardbatch: hard-negative mini-batches for contrastive learning.

Samplers that put hard but true negatives together (proximity graph with
random walks, kNN, GCBS), and the contrastive losses that exploit them.
"""

from .embeddings import EmbeddingBank
from .gcbs import gcbs_permutation
from .graph import knn_graph, proximity_graph
from .samplers import GCBSSampler, KNNBatchSampler, ProximityGraphSampler, UniformBatchSampler
from .schedules import LinearDecay
from .walks import walk_batches

__version__ = "0.1.0"

__all__ = [
    "EmbeddingBank",
    "GCBSSampler",
    "KNNBatchSampler",
    "LinearDecay",
    "ProximityGraphSampler",
    "UniformBatchSampler",
    "gcbs_permutation",
    "knn_graph",
    "proximity_graph",
    "walk_batches",
]
