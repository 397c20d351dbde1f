"""The results-page table generators (hardbatch_experiments.reports): the block filling, the
command line, and the aggregation rules the tables state (paired by seed, one row per loss
setting, the exploration's selection rule)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

pytest.importorskip("scipy")
from scipy.stats import t as student_t

from hardbatch_experiments.reports import graphs, text, vision
from hardbatch_experiments.reports.page import fill, report_main, tables_of


def _t_interval(diffs):
    """An independent 95% t-interval (scipy's quantile) of paired differences."""
    m, n = statistics.fmean(diffs), len(diffs)
    half = student_t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return m, m - half, m + half


def _write(folder, name, rec):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(rec))


def test_fill_rewrites_blocks_and_keeps_the_written_text():
    page = "Hand.\n<!-- table: a -->\nold\n<!-- /table -->\nMore hand.\n"
    out = fill(page, {"a": "| x |\n|---|\n| 1 |"})
    assert out == "Hand.\n<!-- table: a -->\n| x |\n|---|\n| 1 |\n<!-- /table -->\nMore hand.\n"
    assert tables_of(out) == {"a": "| x |\n|---|\n| 1 |\n"}
    assert fill(out, {"a": "| x |\n|---|\n| 1 |"}) == out  # idempotent
    with pytest.raises(ValueError, match="without a block"):
        fill(page, {"a": "t", "b": "t"})
    with pytest.raises(ValueError, match="blocks without a table"):
        fill(page, {})


def test_report_writes_out_by_default_and_the_tracked_page_only_in_place(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.chdir(tmp_path)
    tracked = tmp_path / "docs" / "results" / "demo.md"
    tracked.parent.mkdir(parents=True)
    tracked.write_text("# Demo\n<!-- table: t -->\n<!-- /table -->\n")
    drawn = []

    def build(results):
        return {"t": f"| {results} |"}

    def draw(results, fig_dir):
        drawn.append(fig_dir)
        return 1

    assert report_main("demo", build, draw, ["--results", "res"]) == 0
    assert "| res |" in (tmp_path / "out" / "reports" / "demo.md").read_text()
    assert "| res |" not in tracked.read_text() and drawn == [Path("out/reports/figures")]
    assert report_main("demo", build, draw, ["--in-place", "--no-figures"]) == 0
    assert "| results/demo |" in tracked.read_text() and len(drawn) == 1
    with pytest.raises(SystemExit) as exc:
        report_main("demo", build, draw, ["--in-place", "--out", "elsewhere.md"])
    assert exc.value.code == 2 and "--in-place writes" in capsys.readouterr().err


def _vision_run(sampler, loss, seed, knn, **extra):
    return {"sampler": sampler, "loss": loss, "seed": seed, "knn_accuracy": knn,
            "linear_probe_accuracy": knn + 0.1, "mean_false_negative_rate": 0.1,
            "last_epoch_false_negative_rate": 0.1, "mean_hardness": 0.5,
            "last_epoch_coverage": 1.0, "images_per_second": 100.0, "sampler_share": 0.01,
            "wall_time_s": 60.0, "dataset": "cifar10", **extra}


def _cells(table: str, row: int) -> list[str]:
    return [c.strip() for c in table.splitlines()[row].split("|")[1:-1]]


def test_vision_record_deltas_are_paired_by_seed():
    runs = [_vision_run("uniform", "infonce", s, a) for s, a in ((0, 0.50), (1, 0.60), (2, 0.70))]
    runs.append(_vision_run("uniform", "dcl", 0, 0.55))
    runs += [_vision_run("proximity", "infonce", s, a) for s, a in ((0, 0.52), (1, 0.63),
                                                                     (2, 0.72))]
    runs.append(_vision_run("knn", "infonce", 7, 0.90))  # no seed in common with the baseline
    table = vision.record_table(runs, [("uniform", "dcl"), ("proximity", "infonce"),
                                       ("knn", "infonce")])
    partial, full, disjoint = (_cells(table, i) for i in (2, 3, 4))
    assert partial[4] == "+5.00 (n = 1, paired; no interval), signs 1/0/0"  # vs seed 0 only
    m, lo, hi = _t_interval([2.0, 3.0, 2.0])  # per-seed differences in points
    assert (round(m, 2), round(lo, 2), round(hi, 2)) == (2.33, 0.90, 3.77)
    assert full[4] == full[6] == "+2.33 [+0.90, +3.77] (n = 3, paired), signs 3/0/0, beyond noise"
    assert disjoint[4] == disjoint[6] == "no paired seeds"
    assert _cells(table, 3)[10] == "—"  # reference hardness not measured


def test_vision_old_and_new_loss_names_are_one_row(tmp_path):
    for i, (loss, seed, knn) in enumerate((("infonce", 0, 0.50), ("infonce", 1, 0.60),
                                           ("debiased", 0, 0.55), ("dcl", 1, 0.66))):
        _write(tmp_path, f"run{i}.json", _vision_run("uniform", loss, seed, knn))
    runs = vision.record_runs(tmp_path)
    assert sorted({r["loss"] for r in runs}) == ["dcl", "infonce"]
    dcl = _cells(vision.record_table(runs, [("uniform", "dcl")]), 2)
    assert dcl[:3] == ["uniform", "DebiasedInfoNCE", "2/3"]
    m, lo, hi = _t_interval([5.0, 6.0])
    assert dcl[4] == (f"+{m:.2f} [{lo:+.2f}, {hi:+.2f}] (n = 2, paired), signs 2/0/0, "
                      "within noise")


def test_vision_wall_time_of_a_resumed_run():
    assert vision.wall_seconds({"wall_time_s": 10.0}) == 10.0
    assert vision.wall_seconds({"wall_time_s": 10.0, "resumed": True, "train_time_s": 30.0,
                                "eval_time_s": 5.0}) == 35.0


@pytest.mark.parametrize("tag, base", [("n5120_steps80_hc5d607", "n5120_steps80"),
                                       ("n5120_steps80", "n5120_steps80"),
                                       ("n5120_steps80_hx", "n5120_steps80_hx"), (None, "")])
def test_text_tag_base(tag, base):
    assert text.r_base(tag) == base


def _text_run(sampler, loss, seed, avg, temperature=0.05, neighbors=500):
    cfg = {"num_sentences": 640, "steps": 10, "batch_size": 64, "lr": 3e-5,
           "temperature": temperature, "max_seq_length_train": 32,
           "tau_plus": 0.1 if loss in ("dcl", "hcl") else None, "beta": None,
           "candidates": 320 if sampler == "proximity" else None,
           "neighbors": neighbors if sampler == "proximity" else None,
           "restart": 0.7 if sampler == "proximity" else None}
    tag = "n640_steps10" + ("" if temperature == 0.05 and neighbors == 500 else
                            f"_h{int(temperature * 10)}{neighbors:05d}")
    return {"benchmark": "simcse", "sampler": sampler, "loss": loss, "seed": seed, "tag": tag,
            "config": cfg, "avg": avg, "sts": {t: avg for t in text.TASKS},
            "diagnostics": {"mean_hardness": 0.3}}


def test_text_rows_per_loss_setting_and_same_loss_deltas(tmp_path):
    runs = [_text_run("default", "mnrl", s, 80.0 + s) for s in (0, 1)]
    runs += [_text_run("proximity", "infonce", s, a) for s, a in ((0, 80.5), (1, 81.7))]
    runs += [_text_run("default", "dcl", 0, 79.0, temperature=0.5),
             _text_run("proximity", "dcl", 0, 79.3, temperature=0.5),
             _text_run("proximity", "infonce", 0, 81.0, neighbors=20)]  # a sampler ablation
    # more t 0.5 runs than main-configuration ones: the main rows still use t 0.05's MNRL
    runs += [_text_run("knn", "dcl", s, 79.5, temperature=0.5) for s in range(5)]
    for i, r in enumerate(runs):
        _write(tmp_path, f"run{i}.json", r)
    _write(tmp_path, "zero_shot__m.json", {"tasks": {t: {"spearman": 79.0} for t in text.TASKS}})
    g = text.Saturated(tmp_path)
    table = text.results_table(g)
    dcl = [ln for ln in table.splitlines() if "proximity" in ln and "DCL (t 0.5, tau+ 0.1)" in ln]
    assert len(dcl) == 1  # its own row
    # vs default + MNRL seed 0 (80.0), then vs default + DCL at t 0.5 of the same seed
    assert "| -0.70 (n = 1, paired; no interval), signs 0/1/0 | +0.30 (n = 1, paired; no " \
           "interval), signs 1/0/0 |" in dcl[0]
    m, lo, hi = _t_interval([0.5, 0.7])
    effect = f"+{m:.2f} [{lo:+.2f}, {hi:+.2f}] (n = 2, paired), signs 2/0/0, within noise"
    infonce = [ln for ln in table.splitlines() if "| InfoNCE | 2 |" in ln]
    assert len(infonce) == 1 and f"| {effect} | {effect} |" in infonce[0]
    assert "neighbors 20" in text.ablations_table(g)


def _graph_run(folder, dataset, sampler, seed, acc, tag="", options=None):
    rec = {"dataset": dataset, "sampler": sampler, "loss": "infonce", "seed": seed, "tag": tag,
           "accuracy": acc, "config": {} if options is None else {"sampler_options": options},
           "wall_time_s": 10.0}
    _write(folder, f"{dataset}__{sampler}__seed{seed}{'__' + tag if tag else ''}.json", rec)


def _explore(folder, gains: dict):
    """Uniform at 0.70 (+ seed noise); each tagged configuration at uniform + its gain."""
    for d in graphs.EXPLORE:
        for seed in range(100, 105):
            base = 0.70 + 0.001 * seed % 0.01
            _graph_run(folder, d, "uniform", seed, base)
            for tag, (gain, opts) in gains.items():
                _graph_run(folder, d, "proximity", seed, base + gain / 100 + 0.0005 * (seed % 2),
                           tag, opts)


def test_graphs_rule_prefers_fewer_options_within_the_tie_margin_and_records_once(tmp_path):
    opts = dict(graphs.DEFAULTS)
    explore = tmp_path / "explore"
    _explore(explore, {"": (0.30, opts),
                       "sproj-w2": (0.36, {**opts, "sampler_space": "projection",
                                           "warmup_epochs": 2})})
    chosen = graphs.choose(graphs.scores(explore))
    assert chosen["arm"] == "proximity" and chosen["away"] == 0  # within 0.10 of the best
    _graph_run(explore, "PROTEINS", "proximity", 100, 0.99, "w9", {**opts, "warmup_epochs": 9})
    rows = graphs.scores(explore)
    assert [r["complete"] for r in rows if r["arm"] == "proximity:w9"] == [False]
    assert graphs.choose(rows)["arm"] == "proximity"  # incomplete: not eligible
    prereg = tmp_path / "preregistration.json"
    prereg.write_text(json.dumps({"rule": "r", "chosen": None}))
    assert graphs.main(["--results", str(tmp_path), "--explore", str(explore), "--choose"]) == 0
    first = json.loads(prereg.read_text())["chosen"]
    assert first["arm"] == "proximity" and "--warmup-epochs 0" in first["flags"]
    _explore(explore, {"sproj": (5.0, {**opts, "sampler_space": "projection"})})
    graphs.record_choice(graphs.choose(graphs.scores(explore)), prereg)
    assert json.loads(prereg.read_text())["chosen"] == first  # recorded once


def test_graphs_record_effects_are_paired_by_seed():
    def cell(accs):
        return {seed: {"accuracy": a} for seed, a in accs.items()}

    cells = {("MUTAG", "uniform", "infonce"): cell({0: 0.80, 1: 0.82, 2: 0.84}),
             ("MUTAG", "proximity", "infonce"): cell({0: 0.81, 1: 0.84, 2: 0.85}),
             ("NCI1", "uniform", "infonce"): cell({0: 0.78, 1: 0.79}),
             ("NCI1", "proximity", "infonce"): cell({5: 0.95})}  # disjoint seeds: no effect
    table = graphs.record_effects(cells, {})
    m, lo, hi = _t_interval([1.0, 2.0, 1.0])
    assert (f"| InfoNCE | MUTAG | +{m:.2f} [{lo:+.2f}, {hi:+.2f}] (n = 3, paired) | 3/0/0 | no "
            "| — | — |") in table
    assert "| InfoNCE | NCI1 | no paired seeds | — | — | — | — |" in table


def _codesearch_run(label, seed, mrr10, mrr):
    times = {"charged_wall": 600.0, "mining": 60.0, "encoding_refresh": 0.0, "training": 480.0,
             "evaluation": 60.0}
    return {"benchmark": "codesearch", "label": label, "arm": label, "seed": seed, "steps": 150,
            "seconds_per_step": 3.0, "cpu_seconds_per_step": 2.5, "time_s": times,
            "metrics": {"test": {"csn_mrr": mrr, "mrr@10": mrr10, "ndcg@10": mrr10,
                                 "recall@1": mrr10 / 2}}}


def test_code_search_table_pairs_by_seed_against_default_and_mined(tmp_path):
    from hardbatch_experiments.reports import code_search

    folder = tmp_path / "confirm"
    base = {0: 0.50, 1: 0.52, 2: 0.55}
    gains = {0: 0.010, 1: 0.030, 2: 0.020}
    for s in base:
        _write(folder, f"d{s}.json", _codesearch_run("default", s, base[s], 0.7))
        _write(folder, f"g{s}.json", _codesearch_run("gcbs", s, base[s] + gains[s], 0.7))
    _write(folder, "g3.json", _codesearch_run("gcbs", 3, 0.9, 0.7))  # unpaired: left out
    _write(folder, "m0.json", _codesearch_run("mined", 0, 0.505, 0.7))
    table = code_search.arm_table(folder, "test")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert list(rows) == [code_search.NAME[a] for a in ("default", "mined", "gcbs")]
    m, lo, hi = _t_interval([100 * g for g in gains.values()])
    gcbs = rows[code_search.NAME["gcbs"]]
    assert f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}] (n = 3, paired)" in gcbs
    assert "+0.50 (n = 1, paired; no interval)" in gcbs  # against mined: seed 0 only
    assert " | 0,1,2,3 | " in gcbs and " | 150 | 3.00 | 2.50 | 10.0 | 1.0 | 0.0 | 8.0 | 1.0 |" in gcbs
    assert code_search.arm_table(tmp_path / "none", "test") == "(no runs yet)"


def test_code_search_names_wave_two_labels_and_compares_with_the_given_bases(tmp_path):
    from hardbatch_experiments.reports import code_search

    assert code_search.arm_name("cluster+mined") == code_search.NAME["cluster+mined"]
    assert code_search.arm_name("hardness@ib10") == code_search.NAME["hardness"] + " (@ib10)"
    assert code_search.arm_name("something-else@x") == "something-else@x"
    folder = tmp_path / "epoch"
    base = {1: 0.50, 2: 0.52}
    for s in base:
        _write(folder, f"m{s}.json", _codesearch_run("mined", s, base[s], 0.7))
        _write(folder, f"c{s}.json", _codesearch_run("community+mined", s, base[s] + 0.01, 0.7))
    _write(folder, "h1.json", _codesearch_run("mined+hardness@all10", 1, 0.49, 0.7))
    table = code_search.arm_table(folder, "test", ("mined", "community+mined"))
    header, _, *lines = table.splitlines()
    assert "MRR@10 vs mined | MRR@10 vs community+mined | steps" in header
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines}
    assert list(rows) == [code_search.NAME["mined"], code_search.NAME["community+mined"],
                          code_search.arm_name("mined+hardness@all10")]
    m, lo, hi = _t_interval([1.0, 1.0])
    assert f" | {m:+.2f} [{lo:+.2f}, {hi:+.2f}] (n = 2, paired)" in rows[
        code_search.NAME["community+mined"]]
    hard = rows[code_search.arm_name("mined+hardness@all10")]
    assert "-1.00 (n = 1, paired; no interval)" in hard  # against mined, seed 1
    assert "-2.00 (n = 1, paired; no interval)" in hard  # against community+mined, seed 1


def test_code_search_contrast_table_pairs_each_arm_with_its_base(tmp_path):
    from hardbatch_experiments.reports import code_search

    folder = tmp_path / "confirm"
    assert code_search.contrast_table(folder, "test") == "(no runs yet)"
    base = {1: 0.50, 2: 0.52, 3: 0.55}
    for s in base:
        _write(folder, f"d{s}.json", _codesearch_run("default", s, base[s], 0.7))
        _write(folder, f"j{s}.json", _codesearch_run("hardness@ib10", s, base[s] + 0.01 + 0.001 * s,
                                                         0.7))
    contrasts = (("hardness@ib10", "default", "why 1"), ("hardness@ib10", "mined", "why 2"))
    header, _, first, second = code_search.contrast_table(folder, "test", contrasts).splitlines()
    assert header.startswith("| arm | against | why | MRR@10 (test) difference x 100 |")
    m, lo, hi = _t_interval([1.1, 1.2, 1.3])
    assert first == (f"| {code_search.arm_name('hardness@ib10')} | {code_search.NAME['default']} "
                     f"| why 1 | {m:+.2f} [{lo:+.2f}, {hi:+.2f}] (n = 3, paired), beyond noise "
                     "| 10.0 | 10.0 |")
    assert "| why 2 | pending | 10.0 | — |" in second  # no mined run: no effect, no cost


def test_code_search_length_table_compares_the_effect_at_both_lengths(tmp_path):
    from hardbatch_experiments.reports import code_search

    short, long = tmp_path / "confirm", tmp_path / "epoch"
    assert code_search.length_table(short, long, "test") == "(no runs yet)"
    for s in (1, 2, 3, 4):  # 150 steps: community+mined leads by 1, 2, 3, 4 points
        _write(short, f"m{s}.json", _codesearch_run("mined", s, 0.50, 0.7))
        _write(short, f"c{s}.json", _codesearch_run("community+mined", s, 0.50 + 0.01 * s, 0.7))
    for s, lead in ((1, 0.02), (2, 0.02), (3, 0.05)):  # one epoch: +3 points on every seed
        _write(long, f"m{s}.json", _codesearch_run("mined", s, 0.53, 0.7))
        _write(long, f"c{s}.json", _codesearch_run("community+mined", s, 0.53 + lead, 0.7))
    _write(long, "m4.json", _codesearch_run("mined", 4, 0.53, 0.7))  # no pair: not counted
    rows = code_search.length_table(short, long, "test").splitlines()
    assert rows[0] == "| comparison | training | seeds | MRR@10 (test) difference x 100 |"

    def cell(line: str) -> list[str]:
        return [c.strip() for c in line.strip("| ").split(" | ")][1:]

    def text(values) -> str:
        m, lo, hi = _t_interval(values)
        noise = "beyond" if lo > 0 or hi < 0 else "within"
        return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}] (n = {len(values)}, paired), {noise} noise"

    assert cell(rows[2]) == ["150 steps", "1,2,3,4", text([1.0, 2.0, 3.0, 4.0])]
    assert cell(rows[3]) == ["150 steps, the epoch's seeds", "1,2,3", text([1.0, 2.0, 3.0])]
    assert cell(rows[4]) == ["one epoch", "1,2,3", text([2.0, 2.0, 5.0])]
    assert cell(rows[5]) == ["both", "1,2,3,4", text([3.0] * 4)]  # mined: epoch vs 150 steps
    assert cell(rows[6]) == ["both", "1,2,3", text([4.0, 3.0, 5.0])]
    assert cell(rows[7]) == ["both", "1,2,3", text([1.0, 0.0, 2.0])]  # change of the effect
    assert "one epoch's effect minus 150 steps'" in rows[7]


def test_code_search_charges_one_mining_computation_at_its_least_measured_cost(tmp_path):
    from hardbatch_experiments.reports import code_search

    def mined_run(label, seconds, device="cpu"):
        r = _codesearch_run(label, 1, 0.5, 0.7)
        r["time_s"] = dict(r["time_s"], mining=seconds, charged_wall=540.0 + seconds)
        r["mining"] = {"rows_in": 100, "rows_out": 90, "range_max": 50, "relative_margin": 0.05,
                       "num_negatives": 1, "sampling_strategy": "top", "max_seq_length": 128,
                       "seconds": seconds, "cached": True}
        r["config"] = {"device": device}
        return r

    _write(tmp_path / "a", "m.json", mined_run("mined", 60.0))
    _write(tmp_path / "b", "k.json", mined_run("mined+hardness@all10", 240.0))
    _write(tmp_path / "gpu", "g.json", mined_run("mined", 6.0, device="cuda"))
    least = code_search.least_mining(tmp_path)
    assert sorted(least.values()) == [6.0, 60.0]  # the GPU's mining is another measurement
    (run,) = code_search.runs_by_arm(tmp_path / "b", least)["mined+hardness@all10"].values()
    assert run["time_s"]["mining"] == 60.0 and run["time_s"]["charged_wall"] == 600.0
    (raw,) = code_search.runs_by_arm(tmp_path / "b")["mined+hardness@all10"].values()
    assert raw["time_s"]["charged_wall"] == 780.0  # without the map: as recorded
