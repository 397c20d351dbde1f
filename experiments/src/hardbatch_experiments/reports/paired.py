"""Paired comparisons of experiment arms: the mean per-seed difference and its 95% t-interval.

Shared by the evidence pages (graphs, text, vision). Two arms are compared only on the seeds
both finished; seed k of both arms shares initialisation, data order and evaluation split, so
the per-seed differences d_k = arm_k - baseline_k are the unit of evidence. The effect is
their mean with the t-interval ``mean ± t_{0.975, n-1} * sd / sqrt(n)``; "beyond noise" means
the interval excludes 0. No effect is ever computed from unpaired means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from scipy.stats import t as student_t

__all__ = ["PairedEffect", "effect_text", "paired_effect", "pooled_effect", "t_interval"]


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of ``values`` with the two-sided t-interval at ``level`` (n - 1 df).

    One value: (value, nan, nan), no interval. Empty ``values``: ValueError.
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("values is empty: a t-interval needs at least one paired difference")
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"values must be finite; got {vals}")
    n = len(vals)
    mean = sum(vals) / n
    if n == 1:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class PairedEffect:
    """Mean paired difference ``mean`` with its 95% interval [lo, hi] over ``n`` pairs.

    ``wins`` / ``losses`` / ``ties``: pairs where the arm is above / below / equal to its
    baseline (the sign count). ``keys``: the paired seeds (or datasets, when pooled).
    """

    mean: float
    lo: float
    hi: float
    n: int
    wins: int
    losses: int
    ties: int
    keys: tuple = ()

    @property
    def beyond_noise(self) -> bool:
        """True when the 95% interval excludes 0 (needs n >= 2)."""
        return self.n >= 2 and (self.lo > 0 or self.hi < 0)

    def format(self, digits: int = 2, scale: float = 1.0) -> str:
        """``+x.xx [lo, hi] (n = k, paired)``, values multiplied by ``scale``."""
        f = f"{{:+.{digits}f}}"
        if self.n < 2:
            return f"{f.format(self.mean * scale)} (n = {self.n}, paired; no interval)"
        return (f"{f.format(self.mean * scale)} [{f.format(self.lo * scale)}, "
                f"{f.format(self.hi * scale)}] (n = {self.n}, paired)")

    def signs(self) -> str:
        """The sign count ``wins/losses/ties``, e.g. ``7/3/0``."""
        return f"{self.wins}/{self.losses}/{self.ties}"


def _effect(diffs: Sequence[float], keys: tuple) -> PairedEffect:
    mean, lo, hi = t_interval(diffs)
    return PairedEffect(mean, lo, hi, len(diffs), sum(d > 0 for d in diffs),
                        sum(d < 0 for d in diffs), sum(d == 0 for d in diffs), keys)


def paired_effect(arm: Mapping, baseline: Mapping) -> PairedEffect | None:
    """Effect of ``arm`` over ``baseline``, both ``{seed: value}``, on the seeds both have.

    None when they share no seed. Values that are not finite are an error (a failed run must
    be fixed or removed, not averaged).
    """
    keys = tuple(sorted(set(arm) & set(baseline)))
    if not keys:
        return None
    return _effect([float(arm[k]) - float(baseline[k]) for k in keys], keys)


def pooled_effect(effects: Mapping) -> PairedEffect | None:
    """Mean of per-group (e.g. per-dataset) paired effects, with the t-interval over groups.

    ``effects``: ``{group: PairedEffect or None}``; groups without an effect are left out and
    ``n`` counts the groups used. None when no group has one.
    """
    keys = tuple(k for k in effects if effects[k] is not None)
    if not keys:
        return None
    return _effect([effects[k].mean for k in keys], keys)


def effect_text(effect: PairedEffect | None, digits: int = 2, scale: float = 1.0, *,
                signs: bool = True, missing: str = "no paired seeds",
                direction: bool = False) -> str:
    """One paired effect as the pages state it: ``+x.xx [lo, hi] (n = k, paired), signs w/l/t``
    (without the sign count for ``signs=False``) and, with two or more pairs, ``beyond noise``
    (the interval excludes 0) or ``within noise``; ``direction=True`` adds ``better`` / ``worse``
    after ``beyond noise`` (the sign of the mean). ``missing`` for None (the arms share no seed,
    so no effect is stated)."""
    if effect is None:
        return missing
    noise = ("" if effect.n < 2 else ", beyond noise" if effect.beyond_noise else
             ", within noise")
    if direction and effect.n >= 2 and effect.beyond_noise:
        noise += ", better" if effect.mean > 0 else ", worse"
    count = f", signs {effect.signs()}" if signs else ""
    return f"{effect.format(digits, scale)}{count}{noise}"
