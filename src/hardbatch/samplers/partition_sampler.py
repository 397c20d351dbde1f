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
from ..keys.repair import separate_keys
from .embedding_sampler import EmbeddingSampler
from .refresh import PlanShape

__all__ = ["PartitionSampler", "fixed_source", "load_order", "save_order", "served_order"]


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


def served_order(order: np.ndarray, plan: PlanShape) -> np.ndarray:
    """The items an epoch serves, in batch order: ``order`` (the N items, the ``plan.drop``
    that ``drop_last`` leaves out last, e.g. chosen by
    :func:`~hardbatch.batching.communities.dropped_last`) with no key twice in a batch
    (:func:`~hardbatch.keys.separate_keys`), cut to its first ``N - drop``.

    Example:
        >>> import numpy as np
        >>> from hardbatch.samplers.partition_sampler import served_order
        >>> from hardbatch.samplers.refresh import PlanShape
        >>> served_order(np.arange(10)[::-1], PlanShape(10, 4, 2, 2, 0, None)).tolist()
        [9, 8, 7, 6, 5, 4, 3, 2]
    """
    kept = plan.num_items - plan.drop
    return separate_keys(order, kept, plan.batch_size, plan.keys)[:kept]


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
        """Share of the items an epoch serves: 1.0 (an epoch is a partition), ``1 -
        drop_count / N`` with ``drop_last``."""
        return 1.0 - self.drop_count / self.num_items

    @property
    def drop_count(self) -> int:
        """Items an epoch leaves out, a seeded random choice per epoch: with ``drop_last``
        ``N - batches_per_epoch * B'`` (the short last batch's N mod B' items, and with W > 1
        ranks the full batches that would not fill a last step of W), else 0.

        Example:
            >>> import numpy as np
            >>> import hardbatch as hb
            >>> x = np.random.default_rng(0).standard_normal((40, 8))
            >>> hb.ClusterBatchSampler(x, 16, drop_last=True, kmeans="torch").drop_count
            8
            >>> three = hb.ClusterBatchSampler(x, 8, drop_last=True, world_size=3, rank=0,
            ...                                kmeans="torch")  # 5 full batches, 3 served
            >>> three.drop_count, three.coverage
            (16, 0.6)
        """
        if not self.drop_last:
            return 0
        return self.num_items - self.batches_per_epoch * self.plan_batch_size

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
