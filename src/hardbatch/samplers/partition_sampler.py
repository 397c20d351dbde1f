"""Partition samplers: each epoch is an order of the items, cut into batches.

:class:`PartitionSampler` is the base of GCBS, the cluster (TAS-B) and the community (B3)
samplers: the structure (an epoch's order), built by the sampler's builder, is rebuilt for
every epoch (``refresh_lag`` steps before it with a lag) and batch i is ``draw(order, i,
...)``, a part of the partition. The helpers below serve the orders that are cut into
consecutive slices.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .._validation import check_int
from .embedding_sampler import EmbeddingSampler

__all__ = ["PartitionSampler", "fixed_source", "load_order", "save_order"]


def fixed_source(embeddings) -> bool:
    """Whether a source is a fixed table (an array or tensor: its groups are built once).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers.partition_sampler import fixed_source
        >>> fixed_source(np.ones((40, 8))), fixed_source(hb.EmbeddingBank(40, 8))
        (True, False)
    """
    return isinstance(embeddings, (np.ndarray, torch.Tensor))


def save_order(order: np.ndarray) -> dict:
    """An epoch's item order as a checkpoint payload (a tensor).

    Example:
        >>> import numpy as np
        >>> from hardbatch.samplers.partition_sampler import load_order, save_order
        >>> load_order(save_order(np.arange(4))).tolist(), load_order({})
        ([0, 1, 2, 3], None)
    """
    return {"order": torch.from_numpy(np.array(order, np.int64))}


def load_order(state: dict) -> np.ndarray | None:
    """The order saved by :func:`save_order`, or None.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.partition_sampler import load_order
        >>> load_order({"order": torch.arange(3)}).tolist()
        [0, 1, 2]
    """
    return np.asarray(state["order"], np.int64) if "order" in state else None


class PartitionSampler(EmbeddingSampler):
    """An embedding sampler whose epoch is a partition of the items, rebuilt every epoch
    (arguments: as :class:`~hardbatch.samplers.EmbeddingSampler`).

    Subclasses inject the :class:`~hardbatch.samplers.refresh.Builder` of their epoch's
    structure into the refresh policy in their constructor (``self.refresh_policy.builder =
    ...``; :func:`save_order` / :func:`load_order` checkpoint an order) and, unless batch i
    is slice i of an order (:meth:`slice_batch`, the default), implement ``draw`` (plan
    batch i of the epoch).

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch.samplers import PartitionSampler
        >>> from hardbatch.samplers.partition_sampler import load_order, save_order
        >>> class OrderBuilder:  # the items in the order of x[:, 0]
        ...     exact_build, cheaper_build = False, "a smaller N"
        ...     def build(self, x, epoch, group):
        ...         return torch.argsort(x[:, 0]).numpy()
        ...     save_structure, load_structure = staticmethod(save_order), staticmethod(load_order)
        >>> class ByFirstFeature(PartitionSampler):  # batches of items sorted by x[:, 0]
        ...     def __init__(self, embeddings, batch_size, **options):
        ...         super().__init__(embeddings, batch_size, **options)
        ...         self.refresh_policy.builder = OrderBuilder()
        >>> sampler = ByFirstFeature(np.random.default_rng(0).random((40, 8)), 16)
        >>> [len(b) for b in sampler], sampler.coverage
        ([16, 16, 8], 1.0)
    """

    _per_epoch = True
    _lag_meaning = ("steps before the end of an epoch at which the next epoch's order is "
                    "snapshotted")
    batches_partition = True

    def _schedule(self, every: int | None, lag: int) -> int:
        every = len(self)
        if lag > every:
            raise ValueError(f"refresh_lag={lag} must be at most the {every} steps of an epoch")
        return every

    @property
    def coverage(self) -> float:
        """Share of items drawn so far this epoch: 1.0 (an epoch is a partition)."""
        return 1.0

    @property
    def drop_count(self) -> int:
        """Items an epoch leaves out (N mod B' with ``drop_last``, else 0).

        Example:
            >>> import numpy as np
            >>> import hardbatch as hb
            >>> x = np.random.default_rng(0).standard_normal((40, 8))
            >>> hb.ClusterBatchSampler(x, 16, drop_last=True, kmeans="torch").drop_count
            8
        """
        return self.num_items % self.plan_batch_size if self.drop_last else 0

    def check_per_batch(self, value, name: str) -> int:
        """``value`` of option ``name`` (groups per batch) checked: an int in [1, B'].

        Example:
            >>> import numpy as np
            >>> import hardbatch as hb
            >>> sampler = hb.ClusterBatchSampler(np.eye(40, 8), 8, kmeans="torch")
            >>> sampler.check_per_batch(2, "clusters_per_batch")
            2
            >>> sampler.check_per_batch(9, "clusters_per_batch")
            Traceback (most recent call last):
                ...
            ValueError: clusters_per_batch=9 must be at most the batch_size 8 (each group ...
        """
        value, b = check_int(value, name, low=1), self.plan_batch_size
        if value > b:
            size = "world_size * batch_size" if self.global_batch else "batch_size"
            raise ValueError(f"{name}={value} must be at most the {size} {b} (each group gives "
                             f"a batch at least one item); use {name} <= {b}")
        return value

    def slice_batch(self, order: np.ndarray, index: int) -> np.ndarray:
        """Plan batch ``index`` of an epoch's order: its slice ``index`` (padding batches of the
        last step, ``index >= batches_per_epoch``, repeat the epoch's first batches).

        Example:
            >>> import numpy as np
            >>> import hardbatch as hb
            >>> sampler = hb.ClusterBatchSampler(np.eye(40, 8), 16, kmeans="torch")
            >>> [len(sampler.slice_batch(np.arange(40), i)) for i in range(4)]
            [16, 16, 8, 16]
        """
        size, index = self.plan_batch_size, index % self.batches_per_epoch
        return order[index * size:(index + 1) * size]

    def draw(self, order: np.ndarray, index: int, seed: int, start: int | None) -> np.ndarray:
        """Plan batch ``index``: by default :meth:`slice_batch` (slice ``index`` of the epoch's
        order)."""
        return self.slice_batch(order, index)

    # -- the plan (PlanSampler's hooks) ------------------------------------
    def _begin_epoch(self, fresh: bool) -> None:
        # the loaded structure mid-epoch, else the next one or a build
        t0 = time.perf_counter()
        self.refresh_policy.use(self.epoch, rebuild=fresh)
        self.sampler_seconds += time.perf_counter() - t0

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        policy = self.refresh_policy
        return self.draw(policy.use(policy.due(global_step)), index, 0, None)

    def _generator_state(self, mid_epoch: bool) -> dict:
        # An epoch's structure does not outlive its epoch.
        return self.refresh_policy.state_dict(current=mid_epoch)
