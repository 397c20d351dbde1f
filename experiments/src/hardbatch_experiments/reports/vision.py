"""Build docs/results/vision.md (and figures) from the SimCLR run JSONs of `hardbatch bench simclr`.

    python scripts/report_vision.py [--results results/vision] [--out PAGE | --in-place]
    python -m hardbatch_experiments.reports.vision ...   (the same)

The page goes to ``--out`` (default ``out/reports/vision.md``); ``--in-place`` rewrites the
tracked ``docs/results/vision.md`` (as ``scripts/vision_grid.sh`` does).

Everything in the report comes from the JSON files (one per finished run); runs with the default
configuration (no ``tag``) enter the tables, tagged runs (overrides such as ``--epochs 1``) are
listed separately. Rows without a finished run are shown as missing. Loss names are read through
``hardbatch.registry.canonical_loss``: runs written as ``debiased`` / ``hard_negative`` and as
``dcl`` / ``hcl`` are one row.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from hardbatch.registry import canonical_loss

from . import vision_sweep
from .vision_plan import wall_seconds
from .paired import effect_text, paired_effect
from .common import (Progress, finite, fmt_mean_std, generated_line, link, n_seeds, page_path,
                     pyplot, read_json, report_parser, save_figure, write_page)

SAMPLER_NAME = {"uniform": "uniform", "knn": "kNN sampler", "proximity": "proximity graph (RWR)",
                "gcbs": "GCBS"}
LOSS_NAME = {"infonce": "InfoNCE", "dcl": "DebiasedInfoNCE", "hcl": "HardNegativeInfoNCE",
             "sscl": "SSCLLoss"}
MAIN_ROWS = [("uniform", "infonce"), ("proximity", "infonce"), ("uniform", "sscl"),
             ("knn", "infonce"), ("gcbs", "infonce")]
OTHER_ROWS = [("proximity", "sscl"), ("uniform", "dcl"), ("uniform", "hcl"),
              ("proximity", "dcl"), ("proximity", "hcl")]
PLANNED_SEEDS = 3

PAPERS = """## The papers' numbers (context, not comparable settings)

| paper | setting | baseline | with the method |
|---|---|---:|---:|
| BatchSampler (Yang et al., KDD 2023), Table 8 (App. B.1) | SimCLR, CIFAR-10, ResNet-50, 1000 epochs, linear eval | 92.13 (SimCLR) | 92.54 (+ BatchSampler) |
| GCBS (Sachidananda et al.), Table 4 | SimCLR, CIFAR-10, kNN accuracy | 87.5 (uniform) | 89.8 (GCBS) |
| SSCL (Dong et al.), Table 3 | CIFAR-10, ResNet-18, 200 epochs, linear eval | 82.35 (SimCLR) | 86.20 (SSCL) |

Ours are short CPU runs of a compact ConvNet (setup below): the absolute accuracies are far
below these, and only the differences between rows at equal steps are of interest.
"""

SETUP = """## Setup (what the numbers are)

- Command per run: `hardbatch bench simclr --dataset cifar10 --sampler S --loss L --seed-list K
  --out results/vision` (the same as `python -m hardbatch_experiments.recipes.simclr ...`); the grid:
  `nohup scripts/vision_grid.sh > results/vision/grid.log 2>&1 &` (resumable: finished JSONs are
  skipped, a killed run resumes from its per-epoch checkpoint). The exact command, machine, torch
  version and wall time of every run are in its JSON and in the per-run table below.
- Training (`hardbatch.train.Trainer`): SimCLR, two views per image made by batched tensor
  augmentations on the batch's device (per dataset, from the runs' `config.augment`: see
  "Augmentations and data per dataset" below); one forward pass over both views; projection head Linear-BN-ReLU-Linear to 128 d;
  temperature 0.5, batch 256, Adam lr 1e-3 (weight decay 1e-6), one torch thread.
- Default CPU setting: the compact `ConvNet` (4 stages conv3x3-BN-ReLU 32/64/128/256, max pools,
  global average pool, 256-d features), a fixed class-balanced subset of each dataset's training
  images (the same for every run; sizes below), 10 epochs = 400 steps for every row. `--train-size 0 --epochs
  14` (2,744 steps over all 50,000 images) is the "about one hour per run" setting; with CUDA the
  recipe picks ResNet-18 (CIFAR stem), bf16 autocast and channels_last.
- Samplers read an `EmbeddingBank` of the anchor view's projections from the training forward
  pass, filled once from the untrained network before training (`--bank-init encode`). kNN
  sampler and proximity graph (M 500, K 100, RWR alpha 0.2 -> 0.05 over training) rebuild every
  t = 100 steps; GCBS re-orders every epoch with quantile 1 - 2B/(N-1).
- Losses: InfoNCE (SimCLR / NT-Xent form), DebiasedInfoNCE (tau+ 0.1), HardNegativeInfoNCE
  (tau+ 0.1, beta 1), SSCLLoss (beta 1.0, tau+ 0.1, s 32 hardest, k 8 synthetic).
- Evaluation on the frozen 256-d encoder features (before the head): weighted kNN (k 200, t 0.1)
  every 2 epochs (and before training, step 0), train features = the training subset,
  queries = the dataset's test images (sizes below); linear probe (logistic regression, L-BFGS,
  standardised features) at the end.
- Diagnostics (labels are used for these only): false-negative rate = share of same-class pairs
  in a batch (uniform: about 0.1 for 10 balanced classes), hardness = mean top-1 in-batch cosine
  of the anchor projections, per step; ref. hardness = the same in one fixed reference
  embedding shared by every row of a seed (the untrained network's projections of the training
  images; `—`: not measured, runs written before it was recorded), so rows compare in one
  coordinate system; coverage = share of training images drawn in the last
  epoch; sampler share = time handing over batches (walks, graph rebuilds, GCBS orders) over
  step time (which includes the augmentations); images/s = training images (2 views each) per
  second of step time.
- Effects (Δ columns): paired by seed against uniform + InfoNCE. Seed k of every row builds its
  network after `seed_everything(k)` (the same initialisation) and trains and evaluates on the
  same fixed training subset and test images, so d_k = row_k - baseline_k is the unit; a Δ is
  the mean of d_k over the seeds both rows finished with its 95% t-interval,
  `+x.xx [lo, hi] (n = k, paired)`, then the sign count wins/losses/ties. "Beyond noise": the
  interval excludes 0 (needs 2 pairs). Rows that share no seed with the baseline state no
  effect ("no paired seeds").
- Wall time per run: `wall_time_s`; for a run resumed from its checkpoint (`resumed` in the JSON)
  the sum of its training and evaluation time over all sessions instead, since `wall_time_s`
  covers only the last session.
- The GPU path (device, channels_last, bf16/fp16 autocast, augmentations on the GPU) is written
  and tested on the CPU only (`device="cpu"`); it has not been benchmarked: no GPU was
  available for this work. On a GPU machine, `hardbatch bench simclr --dataset cifar10
  --sampler all --train-size 0 --max-steps 300 --tag gpu-speed --out results/vision` gives
  images/s and the sampler share of step time per sampler (ResNet-18, bf16, channels_last
  picked automatically); they land in the "runs with overrides" table below.
  `python benchmarks/bench_simclr.py --device cuda [--background]` times the same loop without
  evaluation (images/s, sampler share, slowest sampler call, peak GPU memory; see
  docs/benchmarks.md). Evaluation embeddings are computed in float32 (no autocast).
"""


def load(results: Path, progress: Progress | None = None) -> list[dict]:
    """The finished runs under ``results``, their loss names canonical (``debiased`` -> ``dcl``,
    ``hard_negative`` -> ``hcl``) and their file name under ``_file``."""
    runs = []
    for f, rec in read_json(results, progress):
        if isinstance(rec, dict) and "knn_accuracy" in rec and "sampler" in rec:
            rec["loss"] = canonical_loss(rec["loss"])
            rec["_file"] = f.name
            runs.append(rec)
        elif progress is not None:
            progress.skipped += 1
    return runs


def missing_runs(runs: list[dict]) -> int:
    """Planned runs (the table rows x PLANNED_SEEDS per dataset) without a finished JSON."""
    untagged = [r for r in runs if not r.get("tag")]
    datasets = sorted({r["dataset"] for r in untagged}) or ["cifar10"]
    return sum(max(0, PLANNED_SEEDS - len({r["seed"] for r in untagged if r["dataset"] == ds
                                           and (r["sampler"], r["loss"]) == row}))
               for ds in datasets for row in MAIN_ROWS + OTHER_ROWS)


def mean_cell(values, fmt: str = "{:.3f}") -> str:
    """The mean of the finite ``values`` formatted by ``fmt``; ``—`` for none."""
    values = finite(values)
    return fmt.format(statistics.fmean(values)) if values else "—"


def data_setup(runs: list[dict]) -> list[str]:
    """Per dataset: training / test sizes and the augmentation parameters, from the runs' config."""
    out = ["### Augmentations and data per dataset (from the runs' `config`)", ""]
    for ds in sorted({r["dataset"] for r in runs}):
        cfgs = {json.dumps({k: r["config"].get(k) for k in ("augment", "train_size", "test_size")},
                           sort_keys=True) for r in runs if r["dataset"] == ds}
        for c in sorted(cfgs):
            c = json.loads(c)
            a = c.get("augment") or {}
            out.append(
                f"- {ds}: {c.get('train_size')} training images (class-balanced subset), "
                f"{c.get('test_size')} test images; random resized crop scale "
                f"{a.get('scale')}, aspect {[round(x, 3) for x in a.get('ratio', [])]}, rotation "
                f"{a.get('rotation')} deg, shear {a.get('shear')} deg, flip {a.get('flip')}, "
                f"colour jitter {a.get('jitter')} (brightness / contrast / saturation / hue) "
                f"with p {a.get('jitter_p')}, grayscale {a.get('grayscale')}, padding "
                f"`{a.get('padding_mode')}`.")
    return out + [""]


def delta_cell(arm: dict, base: dict) -> str:
    """The paired difference ``arm - base`` by seed (both ``{seed: fraction}``), in points, with
    its 95% interval and sign count (:func:`.paired.effect_text`); ``—`` for a row without runs,
    "no paired seeds" when the row shares no seed with the baseline."""
    return effect_text(paired_effect(arm, base), 2, 100) if arm else "—"


def reference_hardness(r: dict) -> float | None:
    """A run's mean batch hardness in the shared reference embedding (None: not measured, runs
    written before ``reference_diagnostics`` existed)."""
    return (r.get("reference_diagnostics") or {}).get("mean_hardness")


def by_row(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The runs grouped by (sampler, loss)."""
    by = defaultdict(list)
    for r in runs:
        by[(r["sampler"], r["loss"])].append(r)
    return by


def table(runs: list[dict], rows: list[tuple[str, str]]) -> list[str]:
    """One table row per (sampler, loss) in ``rows``; Δ: the paired difference by seed against
    uniform + InfoNCE (:func:`delta_cell`)."""
    by = by_row(runs)
    base_runs = by[("uniform", "infonce")]
    out = ["| sampler | loss | seeds | kNN acc | Δ kNN vs uniform/InfoNCE (paired) | linear acc | "
           "Δ linear (paired) | false-neg rate | last-epoch FN rate | hardness | ref. hardness | "
           "coverage | images/s | sampler / step | wall / run |",
           "|---|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base_knn = {r["seed"]: r["knn_accuracy"] for r in base_runs}
    base_lin = {r["seed"]: r["linear_probe_accuracy"] for r in base_runs}
    for s, loss in rows:
        rs = sorted(by[(s, loss)], key=lambda r: r["seed"])
        knn = {r["seed"]: r["knn_accuracy"] for r in rs}
        lin = {r["seed"]: r["linear_probe_accuracy"] for r in rs}
        is_base = (s, loss) == ("uniform", "infonce")
        out.append(
            f"| {SAMPLER_NAME[s]} | {LOSS_NAME[loss]} | {len(rs)}/{PLANNED_SEEDS} | "
            f"{fmt_mean_std(knn.values(), scale=100)} | "
            f"{'(baseline)' if is_base else delta_cell(knn, base_knn)} | "
            f"{fmt_mean_std(lin.values(), scale=100)} | "
            f"{'(baseline)' if is_base else delta_cell(lin, base_lin)} | "
            f"{mean_cell([r['mean_false_negative_rate'] for r in rs])} | "
            f"{mean_cell([r['last_epoch_false_negative_rate'] for r in rs])} | "
            f"{mean_cell([r['mean_hardness'] for r in rs])} | "
            f"{mean_cell([reference_hardness(r) for r in rs])} | "
            f"{mean_cell([r['last_epoch_coverage'] for r in rs])} | "
            f"{mean_cell([r['images_per_second'] for r in rs], '{:.0f}')} | "
            f"{mean_cell([100 * r['sampler_share'] for r in rs], '{:.1f}%')} | "
            f"{mean_cell([wall_seconds(r) / 60 for r in rs], '{:.1f} min')} |")
    return out


def per_run(runs: list[dict]) -> list[str]:
    """One row per run: file, seed, steps, accuracies, speed, wall time, machine, command."""
    out = ["| file | seed | steps | kNN acc | linear acc | FN rate | images/s | wall | machine | "
           "finished | command |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in sorted(runs, key=lambda r: r["_file"]):
        env = r.get("env", {})
        machine = (f"{env.get('host', '?')} ({env.get('cpus', '?')} CPUs, torch "
                   f"{env.get('torch', '?')}{', ' + env['cuda'] if env.get('cuda') else ''})")
        resumed = " (resumed)" if r.get("resumed") else ""
        out.append(f"| {r['_file']} | {r['seed']} | {r['steps']} | {100 * r['knn_accuracy']:.2f} | "
                   f"{100 * r['linear_probe_accuracy']:.2f} | "
                   f"{r['mean_false_negative_rate']:.3f} | {r['images_per_second']:.0f} | "
                   f"{wall_seconds(r) / 60:.1f} min{resumed} | {machine} | "
                   f"{env.get('finished', '?')} | `{r.get('command', '')}` |")
    return out


def figure(runs: list[dict], path: Path, dataset: str) -> bool:
    """kNN accuracy over training per row and the false-negative rate per sampler (InfoNCE);
    False when nothing is drawn (no run, or no matplotlib / numpy)."""
    try:
        plt = pyplot()
        import numpy as np
    except ImportError:
        return False
    if not runs:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (s, loss), rs in sorted(by_row(runs).items()):
        steps = sorted({e["step"] for r in rs for e in r["evals"]})
        means = []
        for st in steps:
            vals = [e["knn_accuracy"] for r in rs for e in r["evals"] if e["step"] == st]
            means.append(100 * statistics.fmean(vals))
        ax1.plot(steps, means, marker="o",
                 label=f"{SAMPLER_NAME[s]} / {LOSS_NAME[loss]} ({n_seeds(len(rs))})")
    ax1.set_xlabel("training step")
    ax1.set_ylabel("kNN accuracy (%), mean over seeds")
    ax1.set_title(f"SimCLR {dataset}: kNN accuracy over training")
    ax1.legend(fontsize=7)
    by_sampler = defaultdict(list)
    for r in runs:
        if r["loss"] == "infonce":
            by_sampler[r["sampler"]].append(np.asarray(r["trace"]["false_negative_rate"], float))
    for s, traces in sorted(by_sampler.items()):
        n = min(len(t) for t in traces)
        mean = np.nanmean(np.stack([t[:n] for t in traces]), 0)
        w = 10
        smooth = np.convolve(mean, np.ones(w) / w, mode="valid") if n >= w else mean
        ax2.plot(np.arange(len(smooth)) + (w if n >= w else 1), smooth, label=SAMPLER_NAME[s])
    ax2.set_xlabel("training step")
    ax2.set_ylabel("false-negative rate (moving mean of 10 steps)")
    ax2.set_title("false negatives per batch (InfoNCE runs; BatchSampler Fig. 4)")
    ax2.legend(fontsize=8)
    save_figure(fig, path)
    return True


def demote(lines: list[str]) -> list[str]:
    """The earlier record's headings one level down (``#`` -> ``##``), below the sweep."""
    return ["#" + ln if ln.startswith("#") else ln for ln in lines]


def main(argv: list[str] | None = None) -> int:
    ap = report_parser("vision", __doc__)
    ap.add_argument("--sweep", default=None,
                    help="folder of the batch-size sweep's run JSONs (default RESULTS/sweep)")
    args = ap.parse_args(argv)
    results, out = Path(args.results), page_path(ap, args, "vision")
    progress = Progress("vision")
    progress.step(f"reading {results} ...")
    runs = load(results, progress)
    sweep_dir = Path(args.sweep) if args.sweep else results / "sweep"
    progress.step(f"batch-size sweep: reading {sweep_dir} ...")
    sweep_lines, sweep_runs, sweep_missing = vision_sweep.section(sweep_dir, out)
    lines = ["# SimCLR on CIFAR-10: hard batches across batch sizes (issue 21) and the earlier "
             "B = 256 record (issue 7)", "",
             generated_line("vision", results, f" ({sweep_runs} sweep runs, {len(runs)} earlier "
                                               "runs)"), ""]
    lines += sweep_lines
    earlier = ["# Earlier record (issue 7): samplers and losses at B = 256", "",
               "The earlier, exploratory grid, kept as a record. Accuracies in %, mean ± std over "
               "seeds; `k/3`: seeds finished of the 3 planned. `—`: no finished run yet. Δ: the "
               "paired difference by seed against uniform + InfoNCE in points, "
               "`+x.xx [lo, hi] (n = k, paired)`, signs wins/losses/ties; beyond noise = the 95% "
               "interval excludes 0 (Setup below).", ""]
    lines += earlier
    datasets = sorted({r["dataset"] for r in runs}) or ["cifar10"]
    untagged = [r for r in runs if not r.get("tag")]
    tagged = [r for r in runs if r.get("tag")]
    for ds in datasets:
        rs = [r for r in untagged if r["dataset"] == ds]
        steps = sorted({r["steps"] for r in rs})
        lines += [f"## {ds}: main rows (same {', '.join(map(str, steps)) or '?'} steps per run)",
                  ""] + table(rs, MAIN_ROWS) + ["", "### Other loss rows", ""]
        lines += table(rs, OTHER_ROWS) + [""]
        fig = out.parent / "figures" / f"vision_{ds}.png"
        progress.step(f"{ds}: {len(rs)} runs, drawing {fig} ...")
        if figure(rs, fig, ds):
            lines += [f"![kNN accuracy over training and false-negative rate per sampler]"
                      f"({link(fig, out)})", "",
                      "Left: kNN accuracy (k 200, t 0.1) on the test set over training, per row "
                      "(mean over finished seeds). Right: false-negative rate of the training "
                      "batches per sampler (InfoNCE runs), moving mean of 10 steps.", ""]
    lines += PAPERS.splitlines() + [""] + SETUP.splitlines() + [""] + data_setup(untagged)
    lines += ["## Every finished run", ""] + per_run(untagged)
    if tagged:
        lines += ["", "## Runs with overrides (tagged; not in the tables)", ""] + per_run(tagged)
    write_page(out, lines[:len(sweep_lines) + 4] + demote(lines[len(sweep_lines) + 4:]))
    print(f"[report vision] batch-size sweep: {sweep_runs} runs, {sweep_missing} planned runs "
          "missing")
    print(progress.summary(out, len(runs), missing_runs(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
