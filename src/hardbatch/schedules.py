"""Schedules for the restart probability alpha of the random walk with restart."""

from __future__ import annotations

from dataclasses import dataclass

from ._validation import check_int, check_real


@dataclass(frozen=True)
class LinearDecay:
    """Linear schedule from ``start`` to ``end`` over training progress (BatchSampler section 5.3).

    The paper's best setting decays alpha from 0.2 to 0.05. Progress is the
    share of planned batches drawn so far: the sampler supplies it from its
    ``epochs`` argument, or, if ``total_steps`` is set here, from its step
    count (batches yielded by this rank) over ``total_steps``.

    A sampler needs alpha < 1 throughout (see :func:`hardbatch.walk_batches`), so
    :class:`~hardbatch.ProximityGraphSampler` rejects ``start`` or ``end`` equal to 1.

    Example:
        >>> from hardbatch import LinearDecay
        >>> alpha = LinearDecay(0.2, 0.05)
        >>> [round(alpha(progress), 3) for progress in (0.0, 0.5, 1.0, 2.0)]
        [0.2, 0.125, 0.05, 0.05]
    """

    start: float = 0.2
    end: float = 0.05
    total_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = check_real(getattr(self, name), f"LinearDecay {name}", "a number in [0, 1]")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"LinearDecay {name}={value} must lie in [0, 1]")
        if self.total_steps is not None:
            check_int(self.total_steps, "LinearDecay total_steps", 1)

    def __call__(self, progress: float) -> float:
        """Alpha at ``progress`` in [0, 1] (clipped)."""
        p = min(1.0, max(0.0, float(progress)))
        return float(self.start + (self.end - self.start) * p)


@dataclass(frozen=True)
class EpochStepDecay:
    """Alpha lowered by ``step`` at every epoch, never below ``floor``: ``max(floor, start -
    step * epoch)``.

    The restart schedule of BatchSampler's released code (0.2 - 0.02 * epoch, floored at 0.05:
    alpha is 0.05 from epoch 8 on), where :class:`LinearDecay` is the paper's text (linear
    over the whole run). The sampler passes the epoch itself (``per_epoch``), so no
    ``epochs=`` or ``total_steps`` is needed.

    Example:
        >>> from hardbatch import EpochStepDecay
        >>> alpha = EpochStepDecay(start=0.2, step=0.02, floor=0.05)
        >>> [round(alpha.at_epoch(epoch), 2) for epoch in (0, 1, 7, 8, 20)]
        [0.2, 0.18, 0.06, 0.05, 0.05]
    """

    start: float = 0.2
    step: float = 0.02
    floor: float = 0.05
    per_epoch = True  # ProximityGraphSampler calls at_epoch(epoch) instead of (progress)

    def __post_init__(self) -> None:
        for name in ("start", "floor"):
            value = check_real(getattr(self, name), f"EpochStepDecay {name}", "a number in [0, 1)")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"EpochStepDecay {name}={value} must lie in [0, 1) (a restart "
                                 "probability of 1 never leaves the start item)")
        if not check_real(self.step, "EpochStepDecay step", "a number >= 0") >= 0.0:
            raise ValueError(f"EpochStepDecay step={self.step} must be >= 0 (the decrease per "
                             "epoch)")

    def at_epoch(self, epoch: int) -> float:
        """Alpha during epoch ``epoch`` (0-based)."""
        return float(max(self.floor, self.start - self.step * int(epoch)))
