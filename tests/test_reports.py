"""The results-page generators (scripts/report_*.py): the aggregation rules they state."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _vision_run(sampler, loss, seed, knn, **extra):
    rec = {"sampler": sampler, "loss": loss, "seed": seed, "knn_accuracy": knn,
           "linear_probe_accuracy": knn + 0.1, "mean_false_negative_rate": 0.1,
           "last_epoch_false_negative_rate": 0.1, "mean_hardness": 0.5,
           "last_epoch_coverage": 1.0, "images_per_second": 100.0, "sampler_share": 0.01,
           "wall_time_s": 60.0}
    rec.update(extra)
    return rec


def test_vision_partial_row_is_compared_with_the_same_seeds():
    rv = _load("report_vision")
    runs = [_vision_run("uniform", "infonce", s, a) for s, a in ((0, 0.50), (1, 0.60), (2, 0.70))]
    runs.append(_vision_run("uniform", "debiased", 0, 0.55))
    runs += [_vision_run("proximity", "infonce", s, a) for s, a in ((0, 0.52), (1, 0.62),
                                                                     (2, 0.72))]
    rows = rv.table(runs, [("uniform", "debiased"), ("proximity", "infonce")])
    partial, full = rows[2].split(" | "), rows[3].split(" | ")
    assert partial[4] == "+5.00 (1 seed) vs same seeds"  # 0.55 - seed 0's 0.50, not the mean 0.60
    assert full[4].startswith("+2.00 ± ") and "same seeds" not in full[4]


def test_vision_wall_time_of_a_resumed_run():
    rv = _load("report_vision")
    assert rv._wall({"wall_time_s": 10.0}) == 10.0
    assert rv._wall({"wall_time_s": 10.0, "resumed": True, "train_time_s": 30.0,
                     "eval_time_s": 5.0}) == 35.0


@pytest.mark.parametrize("tag, base", [
    ("n5120_steps80_hc5d607", "n5120_steps80"),
    ("n5120_steps80_stslimit50_h0a1b2c", "n5120_steps80_stslimit50"),
    ("n5120_steps80", "n5120_steps80"),
    ("n5120_steps80_hx", "n5120_steps80_hx"),  # not an options hash
    (None, ""),
])
def test_text_tag_base(tag, base):
    assert _load("report_text").r_base(tag) == base


def test_text_paper_deltas_are_computed_from_the_table():
    rt = _load("report_text")
    import statistics

    names = [row[0] for row in rt.PAPER]
    assert "supervised" in names[3] and "GCBS" in names[4]
    d6 = statistics.mean(rt.PAPER[4][1]) - statistics.mean(rt.PAPER[3][1])
    assert round(d6, 2) == 0.78 and round(rt.PAPER[4][3] - rt.PAPER[3][3], 2) == 0.62
