"""The graphs page's issue-18 sections: the exploration's selection rule, the one-time record
of the choice, and the confirmatory paired table from partial results."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("scipy")

from hardbatch_experiments.reports import graphs, graphs_paired
from hardbatch_experiments.reports.paired import paired_effect, pooled_effect


def _write(folder, dataset, sampler, seed, acc, tag="", options=None):
    folder.mkdir(parents=True, exist_ok=True)
    config = {} if options is None else {"sampler_options": options}
    rec = {"dataset": dataset, "sampler": sampler, "loss": "infonce", "seed": seed,
           "tag": tag, "accuracy": acc, "config": config, "wall_time_s": 10.0 + seed,
           "cpu_time_s": 9.0}
    name = f"{dataset}__{sampler}__infonce__seed{seed}" + (f"__{tag}" if tag else "") + ".json"
    (folder / name).write_text(json.dumps(rec))


OPTS = {"sampler_space": "readout", "warmup_epochs": 0, "alpha_schedule": "linear",
        "epoch_mode": "steps"}


def _explore(folder, gains: dict):
    """Uniform at 0.70 (+ seed noise); each config tag at uniform + its gain (points)."""
    for d in graphs_paired.EXPLORE_DATASETS:
        for seed in range(100, 105):
            base = 0.70 + 0.001 * seed % 0.01
            _write(folder, d, "uniform", seed, base)
            for tag, (gain, opts) in gains.items():
                _write(folder, d, "proximity", seed, base + gain / 100 + 0.0005 * (seed % 2),
                       tag, opts)


def test_rule_prefers_fewer_options_within_the_tie_margin(tmp_path):
    explore = tmp_path / "explore"
    _explore(explore, {
        "": (0.30, OPTS),
        "sproj-w2": (0.36, {**OPTS, "sampler_space": "projection", "warmup_epochs": 2}),
        "scentred": (0.10, {**OPTS, "sampler_space": "centred-readout"}),
    })
    lines, chosen = graphs_paired.explore_lines(explore)
    # sproj-w2 is best (+0.36 + 0.0005*mean...), the default is within 0.10 with 0 options
    assert chosen["arm"] == "proximity" and chosen["away"] == 0
    assert chosen["flags"] == ("--sampler-space readout --warmup-epochs 0 --alpha-schedule "
                               "linear --epoch-mode steps")
    assert "3 of 3 configurations complete" in lines[-1]
    _explore(explore, {"sproj-w2": (0.60, {**OPTS, "sampler_space": "projection",
                                           "warmup_epochs": 2})})
    _, chosen = graphs_paired.explore_lines(explore)
    assert chosen["arm"] == "proximity:sproj-w2"
    assert chosen["score"] == pytest.approx(0.60 + 0.05 * 2 / 5, abs=1e-6)


def test_incomplete_configurations_are_not_eligible(tmp_path):
    explore = tmp_path / "explore"
    _explore(explore, {"": (0.2, OPTS)})
    _write(explore, "PROTEINS", "proximity", 100, 0.99, "w2", {**OPTS, "warmup_epochs": 2})
    lines, chosen = graphs_paired.explore_lines(explore)
    assert chosen["arm"] == "proximity"
    assert "1 of 2 configurations complete" in lines[-1]


def test_choice_is_recorded_once_and_confirmation_renders_partial_pairs(tmp_path):
    results = tmp_path / "graphs"
    explore, confirm = results / "explore", results / "confirm"
    _explore(explore, {"w2": (0.5, {**OPTS, "warmup_epochs": 2})})
    (results / "preregistration.json").write_text(json.dumps(
        {"rule_written_at": "T0", "rule": "the rule", "chosen": None}))
    assert graphs.main(["--results", str(results), "--explore", str(explore),
                        "--choose"]) == 0
    pre = json.loads((results / "preregistration.json").read_text())
    assert pre["chosen"]["arm"] == "proximity:w2" and "--warmup-epochs 2" in pre["chosen"]["flags"]
    first = pre["chosen"]["written_at"]
    _explore(explore, {"sproj": (5.0, {**OPTS, "sampler_space": "projection"})})
    graphs_paired.record_choice(graphs_paired.explore_lines(explore)[1],
                                results / "preregistration.json")
    pre = json.loads((results / "preregistration.json").read_text())
    assert pre["chosen"]["arm"] == "proximity:w2" and pre["chosen"]["written_at"] == first

    # confirmation: 3 seeds on MUTAG, 2 on PROTEINS, none elsewhere
    values = {("MUTAG", 0): (0.80, 0.82), ("MUTAG", 1): (0.81, 0.80), ("MUTAG", 2): (0.79, 0.83),
              ("PROTEINS", 0): (0.74, 0.75), ("PROTEINS", 1): (0.75, 0.75)}
    for (d, seed), (u, c) in values.items():
        _write(confirm, d, "uniform", seed, u)
        _write(confirm, d, "proximity", seed, c, "w2", {**OPTS, "warmup_epochs": 2})
    lines, summary = graphs_paired.confirm_lines(confirm, pre)
    mutag = paired_effect({s: 100 * c for (d, s), (u, c) in values.items() if d == "MUTAG"},
                          {s: 100 * u for (d, s), (u, c) in values.items() if d == "MUTAG"})
    row = next(line for line in lines if line.startswith("| MUTAG"))
    assert mutag.format(2) in row and "2/1/0" in row
    prot = paired_effect({0: 75.0, 1: 75.0}, {0: 74.0, 1: 75.0})
    assert summary["pooled"] == pooled_effect({"PROTEINS": prot, "MUTAG": mutag})  # page order
    assert summary["pairs"] == 5 and summary["min_seeds"] == 0
    verdict = graphs_paired.verdict_lines(summary)[0]
    assert verdict.startswith("**Verdict: pending: 0 of 10 seeds** (seeds complete on every "
                              "dataset; 5 pairs so far). So far, pooled over 2 datasets: ")
    page = tmp_path / "page.md"
    assert graphs.main(["--results", str(results), "--out", str(page)]) == 0
    text = page.read_text()
    assert "--warmup-epochs 2" in text and "## Confirmatory comparison" in text
    assert text.index("## Confirmatory comparison") < text.index("# Exploratory record")


def test_verdict_when_complete():
    seeds = range(10)
    sign = {"MUTAG": 1, "NCI1": -1}  # each beyond noise, opposite signs: pooled includes 0
    flat = {d: paired_effect({s: 70.0 + sign[d] * 0.1 * (1 + s % 3) for s in seeds},
                             {s: 70.0 for s in seeds}) for d in sign}
    summary = {"pooled": pooled_effect(flat), "pairs": 20, "min_seeds": 10, "arm": "p",
               "effects": flat}
    text = graphs_paired.verdict_lines(summary)[0]
    assert text.startswith("**Verdict (20 pairs, 10 seeds on every dataset):** no effect")
    assert "per dataset beyond noise: MUTAG, NCI1" in text
    plain = graphs_paired.verdict_lines(summary)[-1]
    # MUTAG +0.2 on average, NCI1 -0.2: one dataset each way, mean 0
    assert plain.startswith("In plain words: BatchSampler batches did better than uniform "
                            "batches on 1 of 2 datasets and worse on 1; on average they changed "
                            "the accuracy by +0.00 points") and plain.endswith("use uniform batches.")
    up = {d: paired_effect({s: 71.0 + 0.1 * (s % 3) + 0.2 * (d == "NCI1") for s in seeds},
                           {s: 70.0 for s in seeds}) for d in ("MUTAG", "NCI1", "PROTEINS")}
    summary.update(pooled=pooled_effect(up), effects=up)
    assert "configuration helps GraphCL" in graphs_paired.verdict_lines(summary)[0]
    assert graphs_paired.verdict_lines(summary)[-1].endswith(
        "Use the pre-registered configuration for GraphCL.")
    assert graphs_paired.verdict_lines({"pooled": None, "pairs": 0, "min_seeds": 0,
                                        "arm": None})[0].startswith("**Verdict: pending**")
