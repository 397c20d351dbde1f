"""The plain-language answer of the vision batch-size sweep (docs/results/vision.md, issue 21):
what the finished sweep says in words, from the paired effects of
:data:`.vision_plan.COMPARISONS` per batch size."""

from __future__ import annotations

from .paired import PairedEffect, effect_text
from .vision_plan import BATCHES, COMPARISONS

__all__ = ["noise_text", "plain_answer"]


def noise_text(e: PairedEffect | None) -> str:
    """A paired effect in points for the answer lines, with its noise verdict (n >= 2)."""
    return effect_text(e, 2, 100, signs=False, missing="no finished pair yet")


def _where(effects: dict, comparison: tuple, sign: int) -> list[int]:
    """Batch sizes at which ``comparison`` (one of COMPARISONS) moved kNN accuracy beyond noise
    in the direction ``sign`` (+1 or -1)."""
    idx = COMPARISONS.index(comparison)
    return [b for b in BATCHES if effects.get((idx, b)) is not None
            and effects[(idx, b)].beyond_noise and sign * effects[(idx, b)].mean > 0]


def _sizes(effects: dict, comparison: tuple, batches: list[int]) -> str:
    idx = COMPARISONS.index(comparison)
    return ", ".join(f"{b} (by {100 * effects[(idx, b)].mean:+.2f} points)" for b in batches)


def plain_answer(effects: dict, equal_steps: PairedEffect | None = None) -> str:
    """The answer in words once the sweep is complete: where proximity batches (with InfoNCE),
    SSCL's synthetic hard negatives (uniform batches) and proximity batches on top of SSCL moved
    kNN accuracy beyond noise, the equal-steps comparison (``equal_steps``: proximity + InfoNCE
    at B = 64 − uniform + InfoNCE at B = 256, or None), and the recommendation that follows.
    ``effects[(i, B)]`` is the paired effect of ``COMPARISONS[i]`` at batch size B."""
    sampler, loss, _, on_top = COMPARISONS
    tried = ", ".join(map(str, BATCHES))
    text = []
    for comparison, what in ((sampler, "hard (proximity-graph) batches with InfoNCE"),
                             (loss, "SSCL's synthetic hard negatives (uniform batches)"),
                             (on_top, "proximity batches on top of SSCL")):
        up, down = _where(effects, comparison, +1), _where(effects, comparison, -1)
        sentence = (f"{what} raised kNN accuracy beyond seed noise at B = "
                    f"{_sizes(effects, comparison, up)}" if up else
                    f"{what} did not raise kNN accuracy beyond seed noise at any batch size "
                    f"tried (B = {tried})")
        sentence = sentence[0].upper() + sentence[1:]
        text.append(sentence + (f"; they lowered it at B = {_sizes(effects, comparison, down)}"
                                if down else "") + ".")
    if equal_steps is not None and equal_steps.n >= 2:
        verdict = ("fell short of" if equal_steps.beyond_noise and equal_steps.mean < 0 else
                   "beat" if equal_steps.beyond_noise else "was within seed noise of")
        text.append(f"With the same number of updates, a proximity batch of 64 {verdict} a "
                    f"uniform batch of 256 ({noise_text(equal_steps)}).")
    helped = _where(effects, sampler, +1)
    sscl = _where(effects, loss, +1)
    if helped:
        advice = f"the proximity sampler at B <= {max(helped)}."
    elif sscl:
        advice = (f"uniform batches with SSCL (it helped at B = {', '.join(map(str, sscl))}); "
                  "proximity batches added nothing measurable in this setting.")
    else:
        advice = "uniform batches with InfoNCE at every batch size."
    return "In plain words. " + " ".join(text) + " Recommended: " + advice
