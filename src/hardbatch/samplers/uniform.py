"""Uniform sampling without replacement: the baseline every other sampler is compared with."""

from __future__ import annotations

import numpy as np

from .. import _rng
from .._validation import num_items_of
from .base import PlanSampler
from .duplicates import separate_keys


class UniformBatchSampler(PlanSampler):
    """Uniform sampling without replacement: a fresh random permutation each epoch, cut into batches.

    Args:
        n_or_dataset: number of items N or a sized dataset.
        batch_size: B (per rank).
        drop_last: drop the last short batch.
        seed: base seed; the permutation depends on (seed, epoch) only.
        rank, world_size: distributed split (defaults from torch.distributed).
        global_batch: each step is one batch of ``world_size * batch_size`` items, rank r
            taking slice r (see :class:`~hardbatch.samplers.PlanSampler`).
        duplicate_keys: N hashable keys (e.g. the texts); items with equal keys never share a
            batch: a clashing item swaps places with an item of the nearest batch of the
            permutation that lacks its key (deterministic, so still a function of seed and
            epoch). No key shared: the same batches as without keys.

    Example:
        >>> import hardbatch as hb
        >>> batches = list(hb.UniformBatchSampler(40, 16))
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([16, 16, 8], True)
    """

    def __init__(self, n_or_dataset, batch_size: int, *, drop_last: bool = False, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 global_batch: bool = False, duplicate_keys=None) -> None:
        super().__init__(num_items_of(n_or_dataset), batch_size, drop_last=drop_last, seed=seed,
                         rank=rank, world_size=world_size, global_batch=global_batch,
                         duplicate_keys=duplicate_keys)

    def _begin_epoch(self, fresh: bool) -> None:
        order = _rng.permutation(self.num_items, _rng.derive_seed(self.seed, self.epoch, 1))
        kept = self.batches_per_epoch * self.plan_batch_size if self.drop_last else len(order)
        self._order = separate_keys(order, kept, self.plan_batch_size, self.duplicate_keys)

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        index %= self.batches_per_epoch
        return self._order[index * self.plan_batch_size:(index + 1) * self.plan_batch_size]

    @property
    def coverage(self) -> float:
        return 1.0
