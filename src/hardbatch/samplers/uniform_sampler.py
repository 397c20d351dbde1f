"""Uniform sampling without replacement: the baseline every other sampler is compared with."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import _rng
from .._validation import num_items_of
from .base import PlanSampler
from ..keys.repair import separate_keys
from .options import PlanOptions, take_options

if TYPE_CHECKING:
    from typing_extensions import Unpack


class UniformBatchSampler(PlanSampler):
    """Uniform sampling without replacement: a fresh random permutation each epoch, cut into batches.

    Args:
        n_or_dataset: number of items N or a sized dataset.
        batch_size: B (per rank).
        **options: the plan's shared options (:mod:`hardbatch.samplers.options`):
            ``drop_last`` (the permutation's last ``drop_count`` items are left out),
            ``seed`` (the permutation depends on seed and epoch only), ``rank``,
            ``world_size``, ``global_batch`` and ``duplicate_keys`` (a clashing item swaps
            places with an item of the nearest batch of the permutation that lacks its key,
            so still a function of seed and epoch).

    Example:
        >>> import hardbatch as hb
        >>> batches = list(hb.UniformBatchSampler(40, 16))
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([16, 16, 8], True)
    """

    Options = PlanOptions

    def __init__(self, n_or_dataset, batch_size: int, **options: Unpack[PlanOptions]) -> None:
        super().__init__(num_items_of(n_or_dataset), batch_size,
                         **take_options(type(self), options))

    def _begin_epoch(self, fresh: bool) -> None:
        order = _rng.permutation(self.num_items, _rng.derive_seed(self.seed, self.epoch, 1))
        kept = self.num_items - self.drop_count  # the permutation's tail is dropped
        self._order = separate_keys(order, kept, self.plan_batch_size, self.duplicate_keys)

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        index %= self.batches_per_epoch
        return self._order[index * self.plan_batch_size:(index + 1) * self.plan_batch_size]

    @property
    def drop_count(self) -> int:
        """Items an epoch leaves out (the tail of its random permutation): with ``drop_last``
        ``N - batches_per_epoch * B'`` (N mod B', and with W > 1 ranks the full batches that
        would not fill a last step), else 0.

        Example:
            >>> import hardbatch as hb
            >>> [hb.UniformBatchSampler(40, 8, drop_last=True, world_size=3, rank=r).drop_count
            ...  for r in range(3)]
            [16, 16, 16]
        """
        if not self.drop_last:
            return 0
        return self.num_items - self.batches_per_epoch * self.plan_batch_size

    @property
    def coverage(self) -> float:
        """Share of the items an epoch serves: 1.0, ``1 - drop_count / N`` with drop_last."""
        return 1.0 - self.drop_count / self.num_items
