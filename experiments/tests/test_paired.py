"""The shared paired-difference helper against hand-computed t-intervals."""

import math

import pytest

from hardbatch_experiments.reports.paired import (
    effect_text,
    paired_effect,
    pooled_effect,
    t_interval,
)

T_975_DF2 = 4.302652729911275  # two-sided 95% Student t quantile, 2 df (tables)
T_975_DF4 = 2.7764451051977987


def test_t_interval_matches_hand_formula():
    mean, lo, hi = t_interval([1.0, 2.0, 3.0])  # sd 1
    half = T_975_DF2 / math.sqrt(3)
    assert mean == pytest.approx(2.0)
    assert (lo, hi) == pytest.approx((2.0 - half, 2.0 + half))


def test_paired_effect_pairs_on_common_seeds_only():
    arm = {0: 0.72, 1: 0.71, 2: 0.74, 3: 0.71, 4: 0.73, 9: 0.99}
    base = {0: 0.70, 1: 0.70, 2: 0.71, 3: 0.70, 4: 0.72, 7: 0.10}
    eff = paired_effect(arm, base)
    diffs = [0.02, 0.01, 0.03, 0.01, 0.01]
    m = sum(diffs) / 5
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / 4)
    assert eff.keys == (0, 1, 2, 3, 4) and eff.n == 5
    assert eff.mean == pytest.approx(m)
    assert eff.hi - eff.mean == pytest.approx(T_975_DF4 * sd / math.sqrt(5))
    assert (eff.wins, eff.losses, eff.ties) == (5, 0, 0)
    assert eff.beyond_noise
    assert eff.format(scale=100) == "+1.60 [+0.49, +2.71] (n = 5, paired)"


def test_interval_straddling_zero_is_not_beyond_noise():
    eff = paired_effect({0: 1.0, 1: 0.0, 2: 0.5, 3: 0.2}, {0: 0.0, 1: 1.0, 2: 0.4, 3: 0.2})
    assert eff.lo < 0 < eff.hi and not eff.beyond_noise
    assert eff.signs() == "2/1/1"


def test_single_pair_has_no_interval_and_no_seed_gives_none():
    eff = paired_effect({3: 2.0}, {3: 1.5})
    assert eff.n == 1 and math.isnan(eff.lo) and not eff.beyond_noise
    assert "no interval" in eff.format()
    assert paired_effect({0: 1.0}, {1: 1.0}) is None


def test_pooled_effect_is_t_interval_over_group_means():
    a = paired_effect({0: 2.0, 1: 4.0}, {0: 1.0, 1: 1.0})  # mean 2
    b = paired_effect({0: 1.0, 1: 1.0}, {0: 0.0, 1: 0.0})  # mean 1
    c = paired_effect({0: 3.0}, {0: 0.0})                  # mean 3
    pooled = pooled_effect({"A": a, "B": b, "C": c, "D": None})
    assert pooled.keys == ("A", "B", "C") and pooled.n == 3
    assert (pooled.mean, pooled.lo, pooled.hi) == pytest.approx(
        (2.0, 2.0 - T_975_DF2 / math.sqrt(3), 2.0 + T_975_DF2 / math.sqrt(3)))
    assert pooled_effect({"A": None}) is None


def test_bad_values_are_errors():
    with pytest.raises(ValueError, match="empty"):
        t_interval([])
    with pytest.raises(ValueError, match="finite"):
        paired_effect({0: float("nan")}, {0: 1.0})


def test_effect_text_states_interval_signs_and_noise():
    eff = paired_effect({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 0.0, 2: 0.0})  # d = 1, 2, 3
    half = T_975_DF2 / math.sqrt(3)  # sd 1: 2 ± 2.48
    assert (round(2 - half, 2), round(2 + half, 2)) == (-0.48, 4.48)
    assert effect_text(eff) == "+2.00 [-0.48, +4.48] (n = 3, paired), signs 3/0/0, within noise"
    assert effect_text(eff, 1, 10) == ("+20.0 [-4.8, +44.8] (n = 3, paired), signs 3/0/0, "
                                       "within noise")
    one = paired_effect({0: 0.5}, {0: 0.25})
    assert effect_text(one) == "+0.25 (n = 1, paired; no interval), signs 1/0/0"
    assert effect_text(paired_effect({0: 1.0}, {1: 1.0})) == "no paired seeds"
    assert effect_text(eff, signs=False) == "+2.00 [-0.48, +4.48] (n = 3, paired), within noise"
    assert effect_text(None, missing="no finished pair yet") == "no finished pair yet"


def test_effect_text_direction_only_beyond_noise():
    worse = paired_effect({0: 0.0, 1: 0.1, 2: 0.2}, {0: 1.0, 1: 1.2, 2: 1.3})  # d = -1, -1.1, -1.1
    assert worse.beyond_noise and worse.mean < 0
    assert effect_text(worse, signs=False, direction=True).endswith(", beyond noise, worse")
    better = paired_effect({0: 1.0, 1: 1.2, 2: 1.3}, {0: 0.0, 1: 0.1, 2: 0.2})
    assert effect_text(better, signs=False, direction=True).endswith(", beyond noise, better")
    noisy = paired_effect({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 0.0, 2: 0.0})
    assert effect_text(noisy, direction=True).endswith(", within noise")
