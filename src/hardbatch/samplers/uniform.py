"""Uniform sampling without replacement: the baseline every other sampler is compared with."""

from __future__ import annotations

import numpy as np

from .. import _rng
from .._validation import num_items_of
from .base import PlanSampler


class UniformBatchSampler(PlanSampler):
    """Uniform sampling without replacement: a fresh random permutation each epoch, cut into batches.

    Args:
        n_or_dataset: number of items N or a sized dataset.
        batch_size: B.
        drop_last: drop the last short batch.
        seed: base seed; the permutation depends on (seed, epoch) only.
        rank, world_size: distributed split (defaults from torch.distributed).
    """

    def __init__(self, n_or_dataset, batch_size: int, *, drop_last: bool = False, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__(num_items_of(n_or_dataset), batch_size, drop_last=drop_last, seed=seed,
                         rank=rank, world_size=world_size)

    def _begin_epoch(self, fresh: bool) -> None:
        self._order = _rng.permutation(self.num_items, _rng.derive_seed(self.seed, self.epoch, 1))

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        index %= self.batches_per_epoch
        return self._order[index * self.batch_size:(index + 1) * self.batch_size]

    @property
    def coverage(self) -> float:
        return 1.0
