"""Keys: items that must never share a batch (copies of one text, rows sharing a text).

Each item holds a set of keys; two items conflict when their sets meet (a duplicate key is the
one-element set). A sampler's ``duplicate_keys=`` is encoded once and enforced where batches are
built: walks and kNN batches skip an item whose key is already in the batch; partitions are
repaired by swaps. One module per question:

* :mod:`~hardbatch.keys.encode`: user input (hashable keys, key sets, column texts) to the one
  encoded form, :class:`DuplicateKeys`;
* :mod:`~hardbatch.keys.membership`: whether a batch already holds an item's keys (NumPy, and
  the numba kernels of the walks and kNN batches);
* :mod:`~hardbatch.keys.feasibility`: whether a request can be met, with errors naming the key
  and the fix;
* :mod:`~hardbatch.keys.repair`: making a partition key-free (swaps, then a construction;
  key sets: a fixed trial partition when the order defeats the greedy);
* :mod:`~hardbatch.keys.derive`: keys computed from data (shared values, near-duplicates in an
  embedding, the graph of items sharing a key).
"""

from .derive import near_duplicate_keys, same_key_graph, shared_value_keys
from .encode import (
    DuplicateKeys,
    compact_key_ids,
    encode_keys,
    factorize,
    factorize_columns,
    key_sets,
    set_keys,
    value_key,
)
from .feasibility import (
    check_partition_keys,
    check_walk_keys,
    closed_neighbourhood_bound,
    greedy_independent,
)
from .membership import free_of, item_keys
from .repair import greedy_partition, partition_capacities, separate_keys, trial_partition

__all__ = [
    "DuplicateKeys",
    "check_partition_keys",
    "check_walk_keys",
    "closed_neighbourhood_bound",
    "compact_key_ids",
    "encode_keys",
    "factorize",
    "factorize_columns",
    "free_of",
    "greedy_independent",
    "greedy_partition",
    "item_keys",
    "key_sets",
    "near_duplicate_keys",
    "partition_capacities",
    "same_key_graph",
    "separate_keys",
    "set_keys",
    "shared_value_keys",
    "trial_partition",
    "value_key",
]
