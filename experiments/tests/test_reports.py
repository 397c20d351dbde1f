"""The results-page generators (hardbatch_experiments.reports): the aggregation rules they
state."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from scipy.stats import t as student_t

from hardbatch_experiments.reports import graphs, text, text_runs, vision


def _t_interval(diffs):
    """An independent 95% t-interval (scipy's quantile) of paired differences."""
    m, n = statistics.fmean(diffs), len(diffs)
    half = student_t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return m, m - half, m + half


def _vision_run(sampler, loss, seed, knn, **extra):
    rec = {"sampler": sampler, "loss": loss, "seed": seed, "knn_accuracy": knn,
           "linear_probe_accuracy": knn + 0.1, "mean_false_negative_rate": 0.1,
           "last_epoch_false_negative_rate": 0.1, "mean_hardness": 0.5,
           "last_epoch_coverage": 1.0, "images_per_second": 100.0, "sampler_share": 0.01,
           "wall_time_s": 60.0}
    rec.update(extra)
    return rec


def test_vision_deltas_are_paired_by_seed():
    runs = [_vision_run("uniform", "infonce", s, a) for s, a in ((0, 0.50), (1, 0.60), (2, 0.70))]
    runs.append(_vision_run("uniform", "dcl", 0, 0.55))
    runs += [_vision_run("proximity", "infonce", s, a) for s, a in ((0, 0.52), (1, 0.63),
                                                                     (2, 0.72))]
    runs.append(_vision_run("knn", "infonce", 7, 0.90))  # no seed in common with the baseline
    rows = vision.table(runs, [("uniform", "dcl"), ("proximity", "infonce"),
                               ("knn", "infonce")])
    partial, full, disjoint = (rows[i].split(" | ") for i in (2, 3, 4))
    # 0.55 - seed 0's 0.50, not the baseline mean 0.60
    assert partial[4] == "+5.00 (n = 1, paired; no interval), signs 1/0/0"
    # per-seed differences 2, 3, 2 points: mean 2.33, sd 0.577, t(0.975, 2) = 4.303 -> ± 1.43
    m, lo, hi = _t_interval([2.0, 3.0, 2.0])
    assert (round(m, 2), round(lo, 2), round(hi, 2)) == (2.33, 0.90, 3.77)
    assert full[4] == "+2.33 [+0.90, +3.77] (n = 3, paired), signs 3/0/0, beyond noise"
    assert full[6] == "+2.33 [+0.90, +3.77] (n = 3, paired), signs 3/0/0, beyond noise"  # linear
    assert disjoint[4] == disjoint[6] == "no paired seeds"


def test_vision_wall_time_of_a_resumed_run():
    assert vision.wall_seconds({"wall_time_s": 10.0}) == 10.0
    assert vision.wall_seconds({"wall_time_s": 10.0, "resumed": True, "train_time_s": 30.0,
                                "eval_time_s": 5.0}) == 35.0


def test_vision_old_and_new_loss_names_are_one_row(tmp_path):
    """Finished runs carry ``debiased`` / ``hard_negative``, new ones ``dcl`` / ``hcl``."""
    recs = [_vision_run("uniform", loss, seed, knn) for loss, seed, knn in (
        ("infonce", 0, 0.50), ("infonce", 1, 0.60), ("debiased", 0, 0.55), ("dcl", 1, 0.66),
        ("hard_negative", 0, 0.56), ("hcl", 1, 0.66))]
    for i, r in enumerate(recs):
        (tmp_path / f"run{i}.json").write_text(json.dumps(r))
    runs = vision.load(tmp_path)
    assert sorted({r["loss"] for r in runs}) == ["dcl", "hcl", "infonce"]
    rows = vision.table(runs, [("uniform", "dcl"), ("uniform", "hcl")])
    dcl, hcl = rows[2].split(" | "), rows[3].split(" | ")
    assert dcl[:3] == ["| uniform", "DebiasedInfoNCE", "2/3"]  # seed 0 (debiased) + seed 1 (dcl)
    # seed 0: 0.55 - 0.50, seed 1: 0.66 - 0.60 -> 5 and 6 points; t(0.975, 1) = 12.706 -> ± 6.35
    m, lo, hi = _t_interval([5.0, 6.0])
    assert (round(m, 2), round(lo, 2), round(hi, 2)) == (5.5, -0.85, 11.85)
    assert dcl[4] == "+5.50 [-0.85, +11.85] (n = 2, paired), signs 2/0/0, within noise"
    assert hcl[:3] == ["| uniform", "HardNegativeInfoNCE", "2/3"]


@pytest.mark.parametrize("tag, base", [
    ("n5120_steps80_hc5d607", "n5120_steps80"),
    ("n5120_steps80_stslimit50_h0a1b2c", "n5120_steps80_stslimit50"),
    ("n5120_steps80", "n5120_steps80"),
    ("n5120_steps80_hx", "n5120_steps80_hx"),  # not an options hash
    (None, ""),
])
def test_text_tag_base(tag, base):
    assert text_runs.r_base(tag) == base


def test_text_paper_deltas_are_computed_from_the_table():
    names = [row[0] for row in text.PAPER]
    assert "supervised" in names[3] and "GCBS" in names[4]
    d6 = statistics.mean(text.PAPER[4][1]) - statistics.mean(text.PAPER[3][1])
    assert round(d6, 2) == 0.78 and round(text.PAPER[4][3] - text.PAPER[3][3], 2) == 0.62


def _text_run(sampler, loss, seed, avg, temperature=0.05, neighbors=500, train_loss=1e-4):
    cfg = {"model": "m", "num_sentences": 640, "steps": 10, "batch_size": 64, "lr": 3e-5,
           "temperature": temperature, "scale": 1 / temperature, "max_seq_length_train": 32,
           "max_seq_length_eval": 256, "optimizer": "AdamW", "threads": 1,
           "tau_plus": 0.1 if loss in ("dcl", "hcl") else None,
           "beta": 1.0 if loss == "hcl" else None,
           "candidates": 320 if sampler == "proximity" else None,
           "neighbors": neighbors if sampler == "proximity" else None,
           "restart": 0.7 if sampler == "proximity" else None, "quantile": None}
    tag = "n640_steps10" + ("" if temperature == 0.05 and neighbors == 500 else
                            f"_h{hash((temperature, neighbors)) % 16**6:06x}")
    return {"benchmark": "simcse", "sampler": sampler, "loss": loss, "seed": seed, "tag": tag,
            "config": cfg, "avg": avg, "sts": {"STS12": avg},
            "diagnostics": {"mean_hardness": 0.3, "mean_mean_negative_similarity": 0.03,
                            "mean_near_duplicate_rate": 0.0, "mean_identical_text_rate": 0.0},
            "train_loss": train_loss, "trace": {"grad_norm": [1e-14]}, "sampler_time_s": 1.0,
            "steps_per_s": 0.1, "wall_time_s": 60.0, "train_time_s": 50.0, "eval_time_s": 10.0,
            "env": {"finished": f"2026-11-23 00:0{seed}", "host": "h", "cpus": 2, "torch": "x"},
            "command": "c"}


def test_text_rows_per_loss_setting_and_same_loss_deltas(tmp_path):
    runs = [_text_run("default", "mnrl", s, 80.0 + s) for s in (0, 1)]
    runs += [_text_run("proximity", "infonce", s, a) for s, a in ((0, 80.5), (1, 81.7))]
    runs += [_text_run("default", "dcl", 0, 79.0, temperature=0.5),
             _text_run("proximity", "dcl", 0, 79.3, temperature=0.5),
             _text_run("proximity", "dcl", 0, 78.0, train_loss=1e-15),  # on the floor: stuck
             _text_run("proximity", "infonce", 0, 81.0, neighbors=20)]  # a sampler ablation
    # More t 0.5 runs than main-configuration ones: the main table still uses t 0.05's MNRL.
    runs += [_text_run("knn", "dcl", s, 79.5, temperature=0.5) for s in range(5)]
    for i, r in enumerate(runs):
        (tmp_path / f"run{i}.json").write_text(json.dumps(r))
    out = tmp_path / "text.md"
    assert text.main(["--results", str(tmp_path), "--out", str(out), "--figure",
                      str(tmp_path / "f.png")]) == 0
    page = out.read_text()
    results = page.split("## Results")[1].split("Published numbers")[0]
    rows = [ln for ln in results.splitlines() if ln.startswith("| proximity graph")]
    dcl_hot = [ln for ln in rows if "DCL (t 0.5, tau+ 0.1)" in ln]
    assert len(dcl_hot) == 1  # its own row, not mixed with the t = 0.05 DCL run
    # vs default + DCL at t 0.5, same seed; then vs default + MNRL seed 0 (80.0)
    assert dcl_hot[0].rstrip(" |").endswith("+0.30 (n = 1, paired; no interval), signs 1/0/0")
    assert "| -0.70 (n = 1, paired; no interval), signs 0/1/0 |" in dcl_hot[0]
    infonce = [ln for ln in rows if "| InfoNCE | 2 |" in ln]
    # per-seed differences 0.5 and 0.7: mean 0.6, sd 0.141, t(0.975, 1) = 12.706 -> ± 1.27
    m, lo, hi = _t_interval([0.5, 0.7])
    assert (round(m, 2), round(lo, 2), round(hi, 2)) == (0.6, -0.67, 1.87)
    effect = "+0.60 [-0.67, +1.87] (n = 2, paired), signs 2/0/0, within noise"
    assert len(infonce) == 1 and f"| {effect} | {effect} |" in infonce[0]
    reading = page.split("## Reading")[1]
    assert f"+ InfoNCE: Δ Avg vs default + MNRL {effect}." in reading
    assert "standard error" not in page
    assert "neighbors 20" in page  # the K = 20 run is an ablation, not an InfoNCE seed
    assert "1 run(s) never trained: proximity + DCL (t 0.05, tau+ 0.1)" in page


# --------------------------------------------------------------------------- issue 17.16, 22.5
def test_reports_write_out_by_default_and_tracked_pages_only_when_asked(tmp_path, monkeypatch,
                                                                        capsys):
    """The default page is out/reports/NAME.md; docs/results/NAME.md only with --in-place;
    progress on stderr and a summary line (runs, skipped files, missing runs, wall time)."""
    monkeypatch.chdir(tmp_path)
    res = tmp_path / "res"
    res.mkdir()
    runs = [_vision_run("uniform", "infonce", s, 0.5 + s / 100) for s in (0, 1)]
    runs[1]["reference_diagnostics"] = {"mean_hardness": 0.25}
    for i, r in enumerate(runs):
        trace = {"step": [1, 2], "false_negative_rate": [0.1, 0.1]}
        (res / f"run{i}.json").write_text(json.dumps({
            **r, "dataset": "cifar10", "steps": 2, "config": {}, "trace": trace,
            "evals": [{"step": 2, "knn_accuracy": r["knn_accuracy"]}]}))
    (res / "broken.json").write_text("{not json")
    tracked = tmp_path / "docs" / "results" / "vision.md"
    assert vision.main(["--results", str(res)]) == 0
    out, err = capsys.readouterr()
    page = tmp_path / "out" / "reports" / "vision.md"
    assert page.is_file() and not tracked.exists()
    assert "[report vision] reading" in err
    summary = out.strip().splitlines()[-1]
    assert summary.startswith(f"wrote {page.relative_to(tmp_path)}: 2 runs from 3 files, "
                              "1 files skipped (unreadable or not runs), ")
    assert f"{len(vision.MAIN_ROWS + vision.OTHER_ROWS) * 3 - 2} planned runs missing" in summary
    row = next(ln for ln in page.read_text().splitlines() if ln.startswith("| uniform | Info"))
    assert "| 0.250 |" in row  # ref. hardness: the one run that measured it (the other: none)
    assert vision.main(["--results", str(res), "--in-place"]) == 0
    assert tracked.is_file()
    with pytest.raises(SystemExit) as exc:
        vision.main(["--results", str(res), "--in-place", "--out", "elsewhere.md"])
    assert exc.value.code == 2 and "--in-place writes docs/results/vision.md" in \
        capsys.readouterr().err


def test_vision_reference_hardness_column_reads_old_runs_as_not_measured():
    old = _vision_run("uniform", "infonce", 0, 0.5)
    new = _vision_run("proximity", "infonce", 0, 0.5,
                      reference_diagnostics={"mean_hardness": 0.61, "embedding": "x"})
    rows = vision.table([old, new], [("uniform", "infonce"), ("proximity", "infonce")])
    header = [c.strip() for c in rows[0].split("|")]
    col = header.index("ref. hardness")
    assert [c.strip() for c in rows[2].split("|")][col] == "—"
    assert [c.strip() for c in rows[3].split("|")][col] == "0.610"


def test_graphs_goals_state_paired_effects_only():
    """BatchSampler minus uniform by seed; a cell without a shared seed states no effect."""
    def cell(accs):
        return {seed: {"accuracy": a} for seed, a in accs.items()}

    runs = {("MUTAG", "uniform", "infonce"): cell({0: 0.80, 1: 0.82, 2: 0.84}),
            ("MUTAG", "proximity", "infonce"): cell({0: 0.81, 1: 0.84, 2: 0.85}),
            ("NCI1", "uniform", "infonce"): cell({0: 0.78, 1: 0.79}),
            ("NCI1", "proximity", "infonce"): cell({5: 0.95})}  # disjoint seeds: no effect
    lines = graphs.goals(runs, {}, ["MUTAG", "NCI1"])
    # differences 1, 2, 1 points: mean 1.33, sd 0.577, t(0.975, 2) = 4.303 -> ± 1.43
    m, lo, hi = _t_interval([1.0, 2.0, 1.0])
    assert (round(m, 2), round(lo, 2), round(hi, 2)) == (1.33, -0.10, 2.77)
    assert "| InfoNCE | MUTAG | +1.33 [-0.10, +2.77] (n = 3, paired) | 3/0/0 | no |" in lines
    assert "| InfoNCE | NCI1 | no paired seeds | — | — |" in lines
    bullet = next(ln for ln in lines if ln.startswith("- InfoNCE:"))
    assert "on 1 of 2 (MUTAG)" in bullet
    assert "beyond noise (95% interval excludes 0): none" in bullet
    assert not any("standard error" in ln for ln in lines)
