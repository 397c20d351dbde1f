"""Build docs/results/graphs.md (and per-dataset figures) from the GraphCL run JSONs.

    python scripts/report_graphs.py [--results results/graphs] [--out PAGE | --in-place]
    python -m hardbatch_experiments.reports.graphs ...   (the same)

The page goes to ``--out`` (default ``out/reports/graphs.md``); ``--in-place`` rewrites the
tracked ``docs/results/graphs.md`` (as ``scripts/graph_grid.sh`` does).

Only runs with the paper's configuration (no ``tag``) enter the tables; runs with overrides
(``--epochs 1`` ...) are counted separately. Missing runs are listed as missing.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .common import (
    Progress,
    generated_line,
    md_row,
    md_rule,
    mean_std,
    n_seeds,
    page_path,
    report_parser,
    write_page,
)
from .graphs_figures import figures
from .graphs_paired import explore_lines, issue18_lines, record_choice
from .graphs_runs import (
    DATASETS,
    EXPECTED_SEEDS,
    LOSSES,
    PAPER,
    SAMPLERS,
    accs,
    cell,
    load,
    paper_gap,
    seed_accs,
    short,
)
from .paired import effect_text, paired_effect

ROW_NAME = {"uniform": "GraphCL (uniform)", "knn": "+ kNN sampler",
            "proximity": "+ BatchSampler (proximity, RWR)", "gcbs": "+ GCBS"}
LOSS_NAME = {"infonce": "InfoNCE", "dcl": "DCL (tau+ 0.1)", "hcl": "HCL (tau+ 0.1, beta 1)"}
EPOCHS = {"IMDB-BINARY": 100, "COLLAB": 20, "REDDIT-BINARY": 50, "PROTEINS": 20, "MUTAG": 20,
          "NCI1": 20}
PARTS = ("bank_init", "data", "augment", "forward_backward", "sampler", "metrics", "eval_embed",
         "eval_svm")

NOTES = """## Setup (what the numbers are)

- Command: `hardbatch bench graphcl --dataset NAME --sampler all --loss infonce --seeds 5
  --out results/graphs/` (same as `python -m hardbatch_experiments.recipes.graphcl ...`); the whole grid:
  `WORKERS=2 nohup scripts/graph_grid.sh > results/graphs/grid.log 2>&1 &` (resumable).
- Model as GraphCL's `unsupervised_TU` code: 3 GIN layers (hidden 32, `relu(GINConv) -> BN`),
  sum pooling of every layer concatenated (96-d, the evaluated embedding), projection head
  Linear-ReLU-Linear (96), Xavier init, Adam lr 0.01, temperature 0.2, hyper-parameters of the
  paper's Table 15 (B / epochs / t / M / K per dataset), restart LinearDecay(0.2 -> 0.05).
- Views: the anchor is the original graph and the positive one augmentation drawn per graph from
  {node dropping, edge removal, attribute masking, subgraph} (as GraphCL's released code,
  `aug=random4`); `--views aug+aug` augments both. The augmentations themselves follow the
  GraphCL *paper's* description at ratio 0.2 (drop 20% of the nodes, remove 20% of the edges,
  mask 20% of the nodes, keep an 80% subgraph grown from a random node), run on the whole
  collated batch at once (`hardbatch_experiments.recipes.graphcl.augment`). GraphCL's released
  `unsupervised_TU` code (published with the paper's GraphCL numbers) does something else:
  its node dropping keeps only the edges *among* 10% randomly chosen nodes (the view is those
  nodes), its edge perturbation removes 10% of the directed entries, its subgraph removes a
  start node and up to 20% of the nodes from its direct neighbourhood, its masking hits 10%;
  its anchor and evaluated graphs carry self-loops (GIN counts a node's own features twice).
  `--aug-style released` reproduces that code exactly (`augment_released`, tested against a
  transcription of it); those runs carry the tag `augreleased` (Variants below).
- Loss: hardbatch `InfoNCE(0.2, form="simcse")` (the positive is in the denominator; GraphCL's
  `loss_cal` leaves it out), `DebiasedInfoNCE` / `HardNegativeInfoNCE` (tau+ 0.1, beta 1).
- Samplers read an `EmbeddingBank` of the anchor readouts (detached, updated every step), seeded by
  one encoding pass of the untrained encoder (GraphCL's script also embeds before training);
  kNN / BatchSampler refresh every t steps, GCBS every epoch with quantile
  `1 - 2B/(N-1)` clipped to [0.5, 0.999] (about 2B kept pairs per row; recorded per run).
  With the paper's t, MUTAG (2 steps/epoch x 20 epochs = 40 steps < t = 50) builds its graph once,
  from the untrained encoder.
- Node features as in GraphCL's released code: one-hot node labels (MUTAG, PROTEINS, NCI1), a
  constant feature for IMDB-B / COLLAB / REDDIT-B. `--features degree` (one-hot degree, capped
  at 64) was our first default for those; its IMDB-B runs are kept under the tag `fdegree`
  (Variants below).
- Speed: augmentations are one compiled (numba) pass per batch, O(n + E); batches are collated
  with vectorised gathers from flat tensors (`--loader pyg` uses
  `torch_geometric.loader.DataLoader(dataset, batch_sampler=sampler)`, same batches);
  GIN aggregation is a sparse CSR product (2x less CPU than PyG's gather/scatter on COLLAB,
  identical outputs); the SVM uses a precomputed RBF Gram matrix (gamma = sklearn's `"scale"`
  value over all graphs) and an explicit inner-CV loop (same selection as GridSearchCV, checked
  in tests); `--svm-kernel rbf` is GraphCL's `SVC()` call. Runs finished before each change
  used the older (equivalent) code paths.
- Deviations to keep in mind: single CPU thread per run; evaluation once after the last epoch
  (GraphCL evaluates every 10 epochs); the SVM's outer/inner folds are seeded by the run seed;
  batches are reshuffled every epoch (the released script shuffles the dataset once).
""".splitlines() + [""]


def fmt_time(sec: float) -> str:
    if math.isnan(sec):
        return "—"
    if sec < 120:
        return f"{sec:.0f} s"
    if sec < 7200:
        return f"{sec / 60:.1f} min"
    return f"{sec / 3600:.2f} h"


def sampler_rows(source: dict, loss: str, samplers, datasets: list[str]) -> list[str]:
    """One table row per sampler (the paper's row under it for InfoNCE)."""
    rows = []
    for s in samplers:
        rows.append(md_row([ROW_NAME[s]] + [cell(source, (d, s, loss), EXPECTED_SEEDS[loss])
                                            for d in datasets]))
        if loss == "infonce" and s in PAPER:
            rows.append(md_row([f"*paper: {ROW_NAME[s]}*"] + [
                f"{PAPER[s][d]:.2f}" if d in PAPER[s] else "" for d in datasets]))
    return rows


def accuracy_tables(runs: dict, released: dict, datasets: list[str]) -> list[str]:
    """A table per loss (rows: samplers, columns: datasets), then the released-augmentation one."""
    head = [md_row(["row"] + [short(d) for d in datasets]), md_rule(len(datasets) + 1)]
    lines = []
    for loss in LOSSES:
        lines += [f"## {LOSS_NAME[loss]}", "", *head]
        lines += sampler_rows(runs, loss, SAMPLERS, datasets) + [""]
    if released:
        lines += ["## InfoNCE with GraphCL's released-code augmentations (`--aug-style released`)",
                  "", "Same protocol, but the views (and self-loops) of GraphCL's released "
                  "`unsupervised_TU` code instead of the paper's description (see Setup); "
                  "`(k/5)`: k seeds run. Paper rows as in the InfoNCE table.", "", *head]
        lines += sampler_rows(released, "infonce",
                              [s for s in SAMPLERS if any(k[1] == s for k in released)],
                              datasets) + [""]
    return lines


def low_c_runs(runs: dict) -> list[str]:
    """The note on runs whose SVM chose C <= 0.01 in most folds (empty if none)."""
    flat = []
    for (d, s, loss), recs in sorted(runs.items()):
        for seed, r in sorted(recs.items()):
            if r.get("chosen_C") and statistics.median(r["chosen_C"]) <= 0.01:
                rest = [100 * o["accuracy"] for k, o in recs.items() if k != seed]
                flat.append(f"{short(d)} / {s} / {LOSS_NAME[loss]} seed {seed}: "
                            f"{100 * r['accuracy']:.2f} "
                            f"(median C {statistics.median(r['chosen_C']):g}"
                            + (f"; the row's other seeds {', '.join(f'{v:.2f}' for v in rest)})"
                               if rest else ")"))
    if not flat:
        return []
    return ["Runs in the tables whose SVM chose C <= 0.01 in most folds, i.e. the inner "
            "CV found nothing better than an almost constant classifier on that run's "
            "embeddings (the same protocol as GraphCL's `SVC()` evaluation; not re-run "
            "or dropped): " + "; ".join(flat) + ". They are kept in the means.", ""]


def goals(runs: dict, released: dict, datasets: list[str]) -> list[str]:
    """The "Goals, as measured" section: paper gap, sampler effects paired by seed (seed k of
    every cell shares the encoder's initialisation, the augmentation seed and the SVM folds),
    released augmentations."""
    lines = ["## Goals, as measured", ""]
    gaps, outside = [], []
    for d in datasets:
        n_base = len(accs(runs, (d, "uniform", "infonce")))
        if n_base and d in PAPER["uniform"]:
            gap = paper_gap(runs, d)
            gaps.append(f"{short(d)} {gap:+.2f}{'' if n_base >= 5 else f' ({n_base}/5 seeds)'}")
            if abs(gap) > 1.5:
                outside.append(short(d))
    lines.append("- Baseline (uniform, InfoNCE) minus paper's GraphCL, points (goal: within ±1.5): "
                 + (", ".join(gaps) if gaps else "no runs yet") + "; "
                 + (f"outside the goal: {', '.join(outside)}" if outside else
                    "all within the goal") + ".")
    table = []
    for loss in LOSSES:
        prox_wins, knn_loses, both, with_knn, beyond = [], [], [], [], []
        for d in datasets:
            a_u, a_p, a_k = (seed_accs(runs, (d, s, loss)) for s in ("uniform", "proximity", "knn"))
            if not (a_u and a_p):
                continue
            both.append(d)
            effect = paired_effect(a_p, a_u)
            table.append(effect_row(LOSS_NAME[loss], short(d), effect))
            if effect is not None and effect.mean > 0:
                prox_wins.append(short(d))
            if effect is not None and effect.beyond_noise:
                beyond.append(short(d))
            if a_k:
                with_knn.append(d)
                vs_u, vs_p = paired_effect(a_k, a_u), paired_effect(a_k, a_p)
                if vs_u is not None and vs_p is not None and vs_u.mean < 0 and vs_p.mean < 0:
                    knn_loses.append(short(d))
        if both:
            goal = " (goal: >= 4 of 6)" if loss == "infonce" else ""
            lines.append(f"- {LOSS_NAME[loss]}: BatchSampler above uniform (mean paired "
                         f"difference > 0) on {len(prox_wins)} of {len(both)} "
                         f"({', '.join(prox_wins) or 'none'}){goal}; kNN sampler below both on "
                         f"{len(knn_loses)} of {len(with_knn)} ({', '.join(knn_loses) or 'none'}); "
                         "BatchSampler minus uniform beyond noise (95% interval excludes 0): "
                         f"{', '.join(beyond) or 'none'}.")
    rel = []
    for d in DATASETS:
        u = seed_accs(released, (d, "uniform", "infonce"))
        pr = seed_accs(released, (d, "proximity", "infonce"))
        if not u:
            continue
        mu, su = mean_std(list(u.values()))
        txt = (f"{short(d)}: uniform {mu:.2f} ± {su:.2f} ({n_seeds(len(u))}), "
               f"{paper_gap(released, d):+.2f} vs the paper's GraphCL (default augmentations: "
               f"{paper_gap(runs, d):+.2f})")
        if pr:
            mp, sp = mean_std(list(pr.values()))
            txt += (f"; BatchSampler {mp:.2f} ± {sp:.2f} ({n_seeds(len(pr))}), minus uniform "
                    f"{effect_text(paired_effect(pr, u))}")
        rel.append(txt)
    if rel:
        lines.append("- With GraphCL's released-code augmentations (`--aug-style released`, "
                     "InfoNCE): " + "; ".join(rel) + ".")
    if table:
        lines += ["", ("BatchSampler minus uniform, accuracy points, paired by seed: the mean "
                       "per-seed difference with its 95% t-interval over the seeds both "
                       "finished."), "",
                  md_row(["loss", "dataset", "BatchSampler − uniform", "signs (+/-/=)",
                          "beyond noise"]), md_rule(5), *table]
    return lines + [""]


def effect_row(loss: str, dataset: str, effect) -> str:
    """A row of the paired-effect table; "no paired seeds" (no effect) without a shared seed."""
    if effect is None:
        return md_row([loss, dataset, "no paired seeds", "—", "—"])
    noise = "—" if effect.n < 2 else "yes" if effect.beyond_noise else "no"
    return md_row([loss, dataset, effect.format(2), effect.signs(), noise])


def completeness(runs: dict, datasets: list[str]) -> tuple[list[str], int, int]:
    """The per-cell table of finished / missing seeds and run times; also (done, planned)."""
    lines = ["## Completeness and run times", "",
             "Wall time per run (training + evaluation, seconds, mean over finished seeds), "
             "and the share of it spent in the SVM evaluation.", "",
             "| dataset | loss | sampler | seeds done | missing seeds | wall/run | SVM share | "
             "steps |", md_rule(8)]
    missing_total, done_total, planned_total = 0, 0, 0
    grid_time = 0.0
    for d in datasets:
        for loss in LOSSES:
            for s in SAMPLERS:
                recs = runs.get((d, s, loss), {})
                exp = EXPECTED_SEEDS[loss]
                miss = [str(i) for i in range(exp) if i not in recs]
                planned_total += exp
                done_total += exp - len(miss)
                missing_total += len(miss)
                if recs:
                    wall = statistics.fmean(r["wall_time_s"] for r in recs.values())
                    svm = statistics.fmean(r["timings_s"]["eval_svm"] / r["wall_time_s"]
                                           for r in recs.values())
                    steps = next(iter(recs.values()))["steps"]
                    grid_time += sum(r["wall_time_s"] for r in recs.values())
                    lines.append(md_row([d, loss, s, f"{len(recs)}/{exp}", ",".join(miss) or "-",
                                         fmt_time(wall), f"{100 * svm:.0f}%", steps]))
                else:
                    lines.append(md_row([d, loss, s, f"0/{exp}", "all (missing)", "—", "—", "—"]))
    lines += ["", f"Finished {done_total} of {planned_total} planned runs "
              f"({missing_total} missing); wall time of the finished runs: "
              f"{fmt_time(grid_time)} in total."]
    return lines, done_total, planned_total


def extrapolate(r: dict, key_total: str, key_epochs: str, epochs: int) -> float:
    """A run's fixed cost plus its median per-epoch time (after the first epoch) x ``epochs``."""
    per_epoch = r[key_epochs][1:] or r[key_epochs]
    fixed = r[key_total] - sum(r[key_epochs])
    return fixed + statistics.median(per_epoch) * epochs


def timing(runs: dict, probes: dict, datasets: list[str]) -> list[str]:
    """Where the time of an InfoNCE run goes, and the InfoNCE grid extrapolated from it."""
    lines = ["", "### Where the time goes (InfoNCE runs; wall seconds per run, mean)", "",
             "Measured on a shared 2-core machine while other jobs ran (load average 4-9 on 2 "
             "cores), one torch thread per run, two grid workers plus other jobs in "
             "parallel: wall times are inflated by contention, CPU times are not (much).", "",
             md_row(["dataset", "source", *PARTS, "wall/run", "CPU/run"]),
             md_rule(len(PARTS) + 4)]
    est_rows = []
    for d in datasets:
        full = [r for s in SAMPLERS for r in runs.get((d, s, "infonce"), {}).values()]
        short_runs = [r for r in probes.get(d, []) if r.get("epoch_cpu_s")]
        src_recs = full or short_runs
        if not src_recs:
            lines.append(f"| {d} | not measured |" + " |" * (len(PARTS) + 2))
            continue
        src = (f"{len(full)} full runs" if full else
               f"{len(short_runs)} short run(s), {short_runs[0]['config']['epochs']} epochs")
        parts = {k: statistics.fmean(r["timings_s"][k] for r in src_recs) for k in PARTS}
        wall = statistics.fmean(r["wall_time_s"] for r in src_recs)
        cpus = [r["cpu_time_s"] for r in src_recs if "cpu_time_s" in r]
        cpu = statistics.fmean(cpus) if cpus else math.nan
        lines.append(md_row([d, src, *(f"{parts[k]:.1f}" for k in PARTS), fmt_time(wall),
                             fmt_time(cpu)]))
        ep = EPOCHS.get(d, 20)
        with_cpu = [r for r in full if r.get("epoch_cpu_s")]
        from_full = bool(with_cpu)
        with_cpu = with_cpu or short_runs
        if with_cpu:
            est_wall = statistics.fmean(extrapolate(r, "wall_time_s", "epoch_wall_s", ep)
                                        for r in with_cpu)
            est_cpu = statistics.fmean(extrapolate(r, "cpu_time_s", "epoch_cpu_s", ep)
                                       for r in with_cpu)
            epoch_cpu = statistics.fmean(statistics.median(r["epoch_cpu_s"][1:] or
                                                           r["epoch_cpu_s"]) for r in with_cpu)
            svm_cpu = statistics.fmean(r.get("eval_svm_cpu_s", math.nan) for r in with_cpu)
            est_rows.append((d, f"{len(with_cpu)} full runs" if from_full else
                             f"{len(with_cpu)} short recipe run(s) of "
                             f"{with_cpu[0]['config']['epochs']} epochs (tag e<k>), "
                             "extrapolated", epoch_cpu, svm_cpu, est_wall, est_cpu))
    lines += ["", "### Extrapolated InfoNCE grid (6 datasets x 4 samplers x 5 seeds)", "",
              "Per run: fixed cost (bank init, evaluation) + median per-epoch time (after the "
              "first epoch) x the paper's epochs; grid = 20 runs per dataset.", "",
              "| dataset | from | train CPU s/epoch | SVM eval CPU s | run wall (est.) | "
              "run CPU (est.) | 20 runs, CPU |", md_rule(7)]
    total_cpu = 0.0
    for d, src, epoch_cpu, svm_cpu, est_wall, est_cpu in est_rows:
        total_cpu += 20 * est_cpu
        lines.append(md_row([d, src, f"{epoch_cpu:.1f}", f"{svm_cpu:.1f}", fmt_time(est_wall),
                             fmt_time(est_cpu), fmt_time(20 * est_cpu)]))
    return lines + [
        "", f"Sum over the {len(est_rows)} datasets with CPU timings: {fmt_time(total_cpu)} "
        f"of single-thread CPU time, i.e. about {fmt_time(total_cpu / 2)} on 2 idle cores "
        "with two workers (goal: <= 4 h). Datasets without CPU timings are not in the sum.", ""]


def variants_section(runs: dict, variants: dict, probes: dict) -> list[str]:
    """Tagged runs beside the default setting's same seeds, and a line on the timing probes."""
    lines = []
    if variants:
        lines += ["## Variants (non-paper settings, same protocol otherwise)", "",
                  "Tags: `fdegree` = one-hot degree node features (capped at 64) instead of "
                  "GraphCL's constant feature for datasets without node labels; `augreleased` = "
                  "GraphCL's released-code augmentations and self-loops (`--aug-style "
                  "released`, see Setup); other tags name "
                  "their override (see `_tag` in `hardbatch_experiments.recipes.graphcl`). The "
                  "default-setting row of the same seeds is shown beside it.", "",
                  "| dataset | tag | sampler | loss | seeds | accuracy | default setting, "
                  "same seeds |", md_rule(7)]
        for (d, tag, s, loss), recs in sorted(variants.items()):
            m, sd = mean_std([100 * r["accuracy"] for r in recs.values()])
            base = runs.get((d, s, loss), {})
            same = [100 * base[k]["accuracy"] for k in recs if k in base]
            bm, bsd = mean_std(same)
            ref = f"{bm:.2f} ± {bsd:.2f} ({len(same)})" if same else "—"
            lines.append(md_row([d, tag, s, loss, ",".join(map(str, sorted(recs))),
                                 f"{m:.2f} ± {sd:.2f}", ref]))
        lines.append("")
    n_probe = sum(len(v) for v in probes.values())
    if n_probe:
        tags = sorted({r["tag"] for v in probes.values() for r in v})
        lines.append(f"({n_probe} further runs tagged {', '.join(f'`{t}`' for t in tags)} are "
                     "short timing probes (`--epochs k`): they enter only the run-time estimate "
                     "above, not the accuracy tables.)")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = report_parser("graphs", __doc__)
    ap.add_argument("--figures", default=None, help="default: <out dir>/figures")
    ap.add_argument("--explore", default=None, metavar="DIR",
                    help="print the exploration table of DIR (issue 18) instead of the page")
    ap.add_argument("--choose", action="store_true",
                    help="with --explore: record the rule's choice in "
                         "RESULTS/preregistration.json (once; an existing choice is kept)")
    args = ap.parse_args(argv)
    if args.explore:
        table, chosen = explore_lines(Path(args.explore))
        print("\n".join(table))
        print(f"rule's choice: {chosen['arm']} ({chosen['flags']}, S {chosen['score']:+.2f})"
              if chosen else "rule's choice: none yet (no complete configuration)")
        if args.choose and chosen:
            pre = record_choice(chosen, Path(args.results) / "preregistration.json")
            print(f"recorded: {pre['chosen']['flags']} at {pre['chosen']['written_at']}")
        return 0
    results, out = Path(args.results), page_path(ap, args, "graphs")
    fig_dir = Path(args.figures) if args.figures else out.parent / "figures"
    progress = Progress("graphs")
    progress.step(f"reading {results} ...")
    runs, variants, probes = load(results, progress)
    datasets = DATASETS + sorted({k[0] for k in runs} - set(DATASETS))
    released = {(d, s, loss): recs for (d, tag, s, loss), recs in variants.items()
                if tag == "augreleased"}
    lines = ["# GraphCL on TU datasets: does BatchSampler help? (issue 18)", "",
             generated_line("graphs", results), "", *issue18_lines(results),
             "# Exploratory record: samplers and losses (BatchSampler paper, Table 3)", "",
             "The earlier grid (5 seeds per cell for InfoNCE, 3 for DCL / HCL, "
             "`results/graphs/*.json`), kept as the exploratory record (not pre-registered). "
             "Its sampler effects (Goals, below) are paired by seed, like the comparison above.",
             "",
             "Accuracy: 10-fold stratified CV of an RBF SVM (C by inner 5-fold CV over "
             "1e-3..1e3) on frozen 96-d GIN readouts, mean ± std over seeds (std of the per-seed "
             "means). `(k/n)`: only k of the n planned seeds are finished. `—`: no run yet. "
             "Paper numbers: BatchSampler (KDD 2023) Table 3 / Table 10.", ""]
    lines += accuracy_tables(runs, released, datasets) + low_c_runs(runs) + NOTES
    lines += goals(runs, released, datasets)
    table, done, planned = completeness(runs, datasets)
    lines += table + timing(runs, probes, datasets) + variants_section(runs, variants, probes)
    progress.step(f"{done}/{planned} planned runs finished; drawing figures into {fig_dir} ...")
    fig_lines, n_figs = figures(runs, datasets, fig_dir, out)
    write_page(out, lines + fig_lines)
    print(progress.summary(out, done, planned - done) + f", {n_figs} figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
