"""The plain-language answer of the vision batch-size sweep (docs/results/vision.md, issue 21):
what the finished sweep says in words, from the paired effects of
:data:`.vision_plan.COMPARISONS` per batch size."""

from __future__ import annotations

from .paired import PairedEffect, effect_text, pooled_effect
from .vision_plan import ARM_NAME, BATCHES, COMPARISONS

__all__ = ["comparison_line", "noise_text", "plain_answer"]


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


def comparison_line(effects: dict, comparison: tuple) -> str:
    """One bullet of the (pending or final) answer: where ``comparison`` (one of COMPARISONS)
    helps or hurts beyond noise, where it is within noise, where one seed only is finished."""
    idx = COMPARISONS.index(comparison)
    null = [b for b in BATCHES if effects.get((idx, b)) is not None and effects[(idx, b)].n >= 2
            and not effects[(idx, b)].beyond_noise]
    few = [b for b in BATCHES if effects.get((idx, b)) is not None and effects[(idx, b)].n < 2]
    parts = [f"{verb} at B = " + ", ".join(f"{b} ({effects[(idx, b)].format(2, 100)})"
                                          for b in sizes)
             for verb, sizes in (("helps beyond noise", _where(effects, comparison, +1)),
                                 ("hurts beyond noise", _where(effects, comparison, -1)),
                                 ("is within seed noise", null)) if sizes]
    if few:
        parts.append(f"has one seed only at B = {', '.join(map(str, few))}")
    arm, base = comparison
    return (f"- {ARM_NAME[arm]} − {ARM_NAME[base]} (kNN accuracy, paired by seed) "
            + ("; ".join(parts) if parts else "has no finished pair yet") + ".")


def _pooled(effects: dict, comparison: tuple) -> PairedEffect | None:
    """The comparison's mean effect over the batch sizes, t-interval over the B values."""
    idx = COMPARISONS.index(comparison)
    return pooled_effect({b: effects.get((idx, b)) for b in BATCHES})


def _isolated(effects: dict, comparison: tuple) -> bool:
    """One B alone beyond noise while the pooled effect over B is within noise: read as chance
    (the main table holds 4 comparisons x 4 B intervals; at 95%, about one of 16 excludes 0 by
    chance alone). Rule fixed before seeds 3 and 4 of the primary comparison ran."""
    moved = _where(effects, comparison, +1) + _where(effects, comparison, -1)
    pooled = _pooled(effects, comparison)
    return len(moved) == 1 and pooled is not None and pooled.n >= 2 and not pooled.beyond_noise


def plain_answer(effects: dict, equal_steps: PairedEffect | None = None) -> str:
    """The answer in words once the sweep is complete: where proximity batches (with InfoNCE),
    SSCL's synthetic hard negatives (uniform batches) and proximity batches on top of SSCL moved
    kNN accuracy beyond noise, each with its mean over B (:func:`_pooled`), the equal-steps
    comparison (``equal_steps``: proximity + InfoNCE at B = 64 − uniform + InfoNCE at B = 256,
    or None), and the recommendation that follows; a lone per-B effect (:func:`_isolated`) is
    flagged as likely chance and recommends nothing. ``effects[(i, B)]`` is the paired effect of
    ``COMPARISONS[i]`` at batch size B."""
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
        sentence += f"; they lowered it at B = {_sizes(effects, comparison, down)}" if down else ""
        pooled = _pooled(effects, comparison)
        if pooled is not None:
            sentence += f" (mean over the {pooled.n} batch sizes: {noise_text(pooled)})"
        if _isolated(effects, comparison):
            sentence += ("; a single B beyond noise with the mean over B within noise is read "
                         "as chance (16 per-B intervals at 95%)")
        text.append(sentence + ".")
    if equal_steps is not None and equal_steps.n >= 2:
        verdict = ("fell short of" if equal_steps.beyond_noise and equal_steps.mean < 0 else
                   "beat" if equal_steps.beyond_noise else "was within seed noise of")
        text.append(f"With the same number of updates, a proximity batch of 64 {verdict} a "
                    f"uniform batch of 256 ({noise_text(equal_steps)}).")
    helped = [] if _isolated(effects, sampler) else _where(effects, sampler, +1)
    sscl = [] if _isolated(effects, loss) else _where(effects, loss, +1)
    pooled = _pooled(effects, loss)
    if helped:
        advice = f"the proximity sampler at B <= {max(helped)}."
    elif sscl or (pooled is not None and pooled.beyond_noise and pooled.mean > 0):
        advice = ("uniform batches with SSCL at every batch size tried (beyond noise at B = "
                  f"{', '.join(map(str, sscl)) or 'none alone'}; mean over B "
                  f"{100 * pooled.mean:+.2f} points); proximity batches added nothing "
                  "measurable in this setting.")
    else:
        advice = "uniform batches with InfoNCE at every batch size."
    return "In plain words. " + " ".join(text) + " Recommended: " + advice
