"""How a GraphCL run feeds its hard sampler (issue 18): the embedding space the sampler reads,
a uniform warm-up, the restart schedule and what an epoch is.

Four options, each applying only to the samplers that read the bank (``uniform`` ignores them,
so one uniform run is the baseline of every configuration of the same seed):

``--sampler-space``
    ``readout`` (default): the bank stores the anchor view's 96-d training-mode readout h;
    ``projection``: it stores the projection z = head(h), the vectors the loss compares;
    ``centred-readout``: it stores h, and every graph build reads the bank's N rows minus
    their mean over the N items (:func:`centred`): the raw sum readout is dominated by one
    shared direction (cosines near 1 on the constant-feature datasets), which the mean
    removes. The mean is taken at each refresh over the rows then in the bank, i.e. over the
    embeddings of roughly the last epoch.
``--warmup-epochs w``
    epochs 0 .. w-1 use the uniform sampler of the same seed (the same batches as the uniform
    arm); at epoch w the bank is re-encoded from the current model (:func:`encode_space`,
    eval mode, as the initial encoding) and the hard sampler takes over (the authors'
    ``random_epochs``).
``--alpha-schedule``
    ``linear`` (default): :class:`hardbatch.LinearDecay` (0.2 -> 0.05 over the run's batches);
    ``per-epoch``: :class:`hardbatch.EpochStepDecay`, alpha = max(0.05, 0.2 - 0.02 * epoch)
    (the authors' code; ``epoch`` counts every epoch of the run, warm-up ones included).
``--epoch-mode``
    ``steps`` (default): an epoch is ceil(N/B) batches (the library's plan, ~64% of the items
    covered by walks); ``coverage``: :class:`CoverageProximitySampler`, an epoch walks until
    every item was in one of its batches, and the run stops after the uniform run's number of
    batches (epochs * ceil(N/B)), so every arm trains the same number of steps.
"""

from __future__ import annotations

import numpy as np
import torch

from hardbatch import EpochStepDecay, LinearDecay, ProximityGraphSampler
from hardbatch.batching.walks import check_restart

__all__ = ["ALPHA_SCHEDULES", "EPOCH_MODES", "SAMPLER_SPACES", "CoverageProximitySampler",
           "centred", "check_options", "encode_space", "epoch_coverage",
           "option_tag", "restart_schedule", "sampler_options"]

SAMPLER_SPACES = ("readout", "projection", "centred-readout")
ALPHA_SCHEDULES = ("linear", "per-epoch")
EPOCH_MODES = ("steps", "coverage")
#: option -> (default, samplers it applies to; None: every sampler but uniform)
_APPLIES = {"sampler_space": ("readout", None), "warmup_epochs": (0, None),
            "alpha_schedule": ("linear", ("proximity",)),
            "epoch_mode": ("steps", ("proximity",))}
_FLAGS = {"sampler_space": "--sampler-space", "warmup_epochs": "--warmup-epochs",
          "alpha_schedule": "--alpha-schedule", "epoch_mode": "--epoch-mode"}


def _applies(key: str, sampler: str) -> bool:
    only = _APPLIES[key][1]
    return sampler != "uniform" and (only is None or sampler in only)


def sampler_options(args, sampler: str) -> dict:
    """The four options as they apply to ``sampler`` (uniform: every one at its default)."""
    return {key: (getattr(args, key, default) if _applies(key, sampler) else default)
            for key, (default, _) in _APPLIES.items()}


def check_options(args, samplers: list[str], epochs: int | None = None) -> None:
    """``ValueError`` for an option set away from its default that a chosen non-uniform sampler
    does not use, or a warm-up of more than ``epochs`` epochs."""
    warm = int(getattr(args, "warmup_epochs", 0))
    if warm < 0:
        raise ValueError(f"--warmup-epochs {warm} must be >= 0")
    if epochs is not None and warm > epochs:
        raise ValueError(f"--warmup-epochs {warm} must be at most the run's {epochs} epochs")
    for key, (default, _) in _APPLIES.items():
        if getattr(args, key, default) == default:
            continue
        wrong = [s for s in samplers if s != "uniform" and not _applies(key, s)]
        if wrong:
            raise ValueError(f"{_FLAGS[key]} {getattr(args, key)} applies to the proximity "
                             f"sampler only, not {', '.join(wrong)}: run those without it")


def option_tag(options: dict) -> list[str]:
    """Run-tag parts naming the options away from their defaults (none: ``[]``)."""
    parts = []
    if options["sampler_space"] != "readout":
        parts.append({"projection": "sproj", "centred-readout": "scentred"}[
            options["sampler_space"]])
    if options["warmup_epochs"]:
        parts.append(f"w{options['warmup_epochs']}")
    if options["alpha_schedule"] != "linear":
        parts.append("aepoch")
    if options["epoch_mode"] != "steps":
        parts.append("cover")
    return parts


def centred(x: torch.Tensor) -> torch.Tensor:
    """``x`` [N, d] minus its mean row."""
    return x - x.mean(dim=0, keepdim=True)


@torch.no_grad()
def encode_space(model, readout: torch.Tensor, space: str) -> torch.Tensor:
    """What the bank stores for readouts ``readout`` [N, 96]: the readout itself, or its
    projection (``space="projection"``)."""
    return model.proj_head(readout) if space == "projection" else readout


class CoverageProximitySampler(ProximityGraphSampler):
    """The proximity sampler with the authors' epochs: walks until every item is covered.

    An epoch's batches are walks from items not yet seen this epoch (as the library's walks)
    until every item appeared in one of them; ``budget`` caps the batches of all its epochs
    together (the uniform run's step budget). Graph refreshes count the batches actually
    drawn (every ``refresh_every`` of them, as in steps mode); a linear restart schedule
    reads the progress as batches drawn / ``budget``. Single process only.
    """

    def __init__(self, *args, budget: int, **kwargs) -> None:
        if int(budget) < 1:
            raise ValueError(f"budget={budget} must be >= 1")
        self.budget = int(budget)  # read by batches_per_epoch during the base's checks
        self.offset = 0  # batches drawn in earlier epochs
        super().__init__(*args, **kwargs)
        if self.world_size != 1 or self.global_batch:
            raise ValueError("CoverageProximitySampler is single-process: world_size must be 1")

    @property
    def batches_per_epoch(self) -> int:
        """Upper bound of an epoch: the batches left in the budget (an epoch ends earlier)."""
        return max(1, self.budget - self.offset)

    def _step_batches(self, step: int):
        return [self._generate(step, self.offset + step)]

    def restart_at(self, epoch: int, index: int) -> float:
        """Alpha for batch ``index`` of ``epoch``: per epoch, or by batches drawn / budget."""
        r = self.restart
        if isinstance(r, float):
            return r
        if getattr(r, "per_epoch", False):
            value = r.at_epoch(epoch)
        else:
            value = float(r((self.offset + index) / self.budget))
        return check_restart(value, "restart")

    def __iter__(self):
        if self.offset >= self.budget:
            return
        inner = super().__iter__()
        done = 0
        try:
            for batch in inner:
                yield batch
                done += 1
                if self.coverage >= 1.0 or self.offset + done >= self.budget:
                    break
        finally:
            inner.close()
            self.offset += done


def restart_schedule(options: dict):
    """The restart schedule object of ``options`` and its description for the run record."""
    if options["alpha_schedule"] == "per-epoch":
        sched = EpochStepDecay(0.2, 0.02, 0.05)
        return sched, {"schedule": "per-epoch", "start": sched.start, "step": sched.step,
                       "floor": sched.floor}
    return LinearDecay(0.2, 0.05), {"schedule": "LinearDecay", "start": 0.2, "end": 0.05}


def epoch_coverage(sampler) -> float:
    """Share of items in a batch of the epoch just drawn (1.0 for partitions)."""
    return float(getattr(sampler, "coverage", np.nan))
