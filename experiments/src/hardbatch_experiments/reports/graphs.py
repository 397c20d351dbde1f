"""The tables and figures of docs/results/graphs.md (GraphCL on TU datasets) from the run JSONs.

    python scripts/report_graphs.py [--results results/graphs] [--in-place | --out PAGE]
    python scripts/report_graphs.py --explore results/graphs/explore [--choose]

``results/graphs/*.json``: the earlier grid (untagged runs; tagged ones are variants, tags
``e<k>`` timing probes); ``explore/`` and ``confirm/``: issue 18's exploration and confirmation;
``preregistration.json``: its rule and chosen configuration. ``--explore`` prints the
exploration table and the rule's choice (``--choose`` records it, once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from hardbatch.registry import sampler_names

from .page import md, mean, ms, pyplot, read_runs, report_main, save
from .paired import paired_effect, pooled_effect

DATASETS = ["IMDB-BINARY", "COLLAB", "REDDIT-BINARY", "PROTEINS", "MUTAG", "NCI1"]
SHORT = {"IMDB-BINARY": "IMDB-B", "REDDIT-BINARY": "REDDIT-B"}
SAMPLERS = sampler_names()
SEEDS = {"infonce": 5, "dcl": 3, "hcl": 3}  # the grid's losses and planned seeds
LOSS_NAME = {"infonce": "InfoNCE", "dcl": "DCL (tau+ 0.1)", "hcl": "HCL (tau+ 0.1, beta 1)",
             "released": "InfoNCE (released aug.)"}
ROW = {"uniform": "GraphCL (uniform)", "knn": "+ kNN sampler",
       "proximity": "+ BatchSampler (proximity, RWR)", "gcbs": "+ GCBS"}
SAMPLERS = tuple(s for s in SAMPLERS if s in ROW)  # the grid's (the registry holds more)
PAPER = {  # BatchSampler paper (KDD 2023), Table 3 / Table 10, GraphCL rows
    "uniform": [70.90, 70.62, 90.54, 74.39, 86.80, 77.87],
    "knn": [70.72, 70.59, 90.21, 74.17, 86.46, 77.27],
    "proximity": [71.90, 71.48, 90.88, 75.04, 87.78, 78.93]}
PARTS = ("bank_init", "data", "augment", "forward_backward", "sampler", "metrics", "eval_embed",
         "eval_svm")
EXPLORE = ("IMDB-BINARY", "PROTEINS")
TIE = 0.10  # points: configurations this close to the best count as tied (the rule)
DEFAULTS = {"sampler_space": "readout", "warmup_epochs": 0, "alpha_schedule": "linear",
            "epoch_mode": "steps"}


def short(d: str) -> str:
    return SHORT.get(d, d)


def acc(cell: dict) -> dict:
    """``{seed: accuracy in points}`` of a cell's ``{seed: run}``."""
    return {s: 100 * r["accuracy"] for s, r in cell.items()}


def effect(e) -> list:
    """The effect, sign count and noise columns of one paired effect (None: no shared seed)."""
    if e is None:
        return ["no paired seeds", "—", "—"]
    return [e.format(2), e.signs(), "—" if e.n < 2 else "yes" if e.beyond_noise else "no"]


def fmt_time(sec: float) -> str:
    return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.1f} min" if sec < 7200 else \
        f"{sec / 3600:.2f} h"


def load(folder: Path) -> tuple[dict, dict]:
    """``(cells, variants)``: ``cells[(dataset, arm, loss)][seed]`` where ``arm`` is the sampler,
    ``sampler:tag`` for the option tags of explore/ and confirm/; ``variants`` the earlier grid's
    tagged runs, keyed ``(dataset, tag, sampler, loss)`` (timing probes ``e<k>`` left out)."""
    cells, variants = defaultdict(dict), defaultdict(dict)
    for r in read_runs(folder, lambda r: "accuracy" in r):
        tag = r.get("tag") or ""
        if folder.name in ("explore", "confirm") or not tag:
            cells[(r["dataset"], r["sampler"] + (f":{tag}" if tag else ""), r["loss"])][
                r["seed"]] = r
        elif not (tag[0] == "e" and tag[1:].isdigit()):
            variants[(r["dataset"], tag, r["sampler"], r["loss"])][r["seed"]] = r
    return cells, variants


def flags(r: dict) -> str:
    o = {**DEFAULTS, **(r["config"].get("sampler_options") or {})}
    return " ".join(f"--{k.replace('_', '-')} {o[k]}" for k in DEFAULTS)


def scores(folder: Path) -> list[dict]:
    """Per exploration configuration: effects vs uniform per dataset, score S, flags, options
    away from the defaults, completeness; sorted by S."""
    cells, _ = load(folder)
    rows = []
    for arm in sorted({a for (_, a, _) in cells if a != "uniform"}):
        eff = {d: paired_effect(acc(cells.get((d, arm, "infonce"), {})),
                                acc(cells.get((d, "uniform", "infonce"), {}))) for d in EXPLORE}
        run = next(iter(next(cells[(d, arm, "infonce")] for d in EXPLORE
                             if cells.get((d, arm, "infonce"))).values()))
        o = {**DEFAULTS, **(run["config"].get("sampler_options") or {})}
        done = [e for e in eff.values() if e]
        rows.append({"arm": arm, "effects": eff, "flags": flags(run),
                     "away": sum(o[k] != v for k, v in DEFAULTS.items()),
                     "score": statistics.fmean(e.mean for e in done) if len(done) == 2 else None,
                     "complete": sum(e.n for e in done) == 5 * len(EXPLORE)})
    return sorted(rows, key=lambda r: -(r["score"] if r["score"] is not None else -1e9))


def choose(rows: list[dict]) -> dict | None:
    """The pre-registered rule: the highest S among complete configurations; within TIE points
    of the best, the fewest options away from the defaults, then the higher S."""
    ok = [r for r in rows if r["complete"] and r["score"] is not None]
    if not ok:
        return None
    best = max(r["score"] for r in ok)
    return min([r for r in ok if r["score"] >= best - TIE - 1e-12],
               key=lambda r: (r["away"], -r["score"]))


def explore_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        effs = [r["effects"][d] for d in EXPLORE]
        out.append([f"`{r['arm'].partition(':')[2] or 'default'}`", f"`{r['flags']}`",
                    *(e.format(2) if e else "—" for e in effs),
                    " · ".join(e.signs() if e else "—" for e in effs),
                    f"{r['score']:+.2f}" if r["score"] is not None else "—"])
    return md(["configuration (proximity)", "flags",
               *(f"{short(d)}: proximity - uniform" for d in EXPLORE), "signs (+/-/=)",
               "score S"], out)


def record_choice(chosen: dict, prereg: Path) -> dict:
    """Write ``chosen`` into the pre-registration file, once (an existing choice is kept)."""
    pre = json.loads(prereg.read_text())
    if not pre.get("chosen"):
        pre["chosen"] = {
            "arm": chosen["arm"], "flags": chosen["flags"], "score": chosen["score"],
            "effects": {d: chosen["effects"][d].format(2) for d in EXPLORE},
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "reason": (f"highest score S = {chosen['score']:+.2f} points (mean of the per-dataset"
                       " paired differences vs uniform over seeds 100-104) among the complete "
                       f"configurations; tie margin {TIE} points, fewest options away from the "
                       "defaults first")}
        prereg.write_text(json.dumps(pre, indent=1) + "\n")
    return pre


def confirm_table(results: Path) -> str:
    """Per dataset: uniform and the chosen configuration (mean, seeds), their paired effect;
    then the effect pooled over datasets."""
    arm = json.loads((results / "preregistration.json").read_text())["chosen"]["arm"]
    cells, _ = load(results / "confirm")
    rows, effs = [], {}
    for d in DATASETS:
        u, c = acc(cells.get((d, "uniform", "infonce"), {})), acc(cells.get((d, arm, "infonce"),
                                                                             {}))
        effs[d] = paired_effect(c, u)
        rows.append([short(d), *(f"{statistics.fmean(x.values()):.2f} ({len(x)})" if x else "—"
                                 for x in (u, c)), *effect(effs[d])])
    rows.append(["pooled: mean of the per-dataset differences, t-interval over datasets",
                 "", "", *effect(pooled_effect(effs))])
    return md(["dataset", "uniform (mean, seeds)", "chosen (mean, seeds)",
               "chosen - uniform, points", "signs (+/-/=)", "beyond noise"], rows)


def times_table(results: Path) -> str:
    rows = []
    for stage, folder in (("exploration", "explore"), ("confirmation", "confirm")):
        cells, _ = load(results / folder)
        for d in DATASETS:
            for (dd, arm, _), cell in sorted(cells.items()):
                if dd == d:
                    walls = [r["wall_time_s"] for r in cell.values()]
                    rows.append([stage, short(d), f"`{arm}`", len(cell),
                                 f"{statistics.fmean(walls):.0f}",
                                 f"{min(walls):.0f}-{max(walls):.0f}",
                                 mean([r.get("cpu_time_s") for r in cell.values()], "{:.0f}")])
    return md(["stage", "dataset", "arm", "runs", "wall mean", "wall min-max", "CPU mean"], rows)


def accuracy_table(cells: dict, loss: str, seeds: int, samplers=SAMPLERS) -> str:
    """Rows: samplers (the paper's row under each, InfoNCE only); columns: datasets; mean ± std
    over seeds, ``(k/n)`` when seeds are missing."""
    rows = []
    for s in samplers:
        row = [ROW[s]]
        for d in DATASETS:
            a = acc(cells.get((d, s, loss), {})).values()
            row.append("—" if not a else ms(a) + (f" ({len(a)}/{seeds})" if len(a) < seeds
                                                    else ""))
        rows.append(row)
        if loss == "infonce" and s in PAPER:
            rows.append([f"*paper: {ROW[s]}*", *(f"{v:.2f}" for v in PAPER[s])])
    return md(["row", *map(short, DATASETS)], rows)


def record_effects(cells: dict, released: dict) -> str:
    """BatchSampler − uniform and kNN − both, paired by seed, per loss and dataset; the
    released augmentations' BatchSampler − uniform last."""
    rows = []
    for loss, src in [(k, cells) for k in SEEDS] + [("released", released)]:
        key = "infonce" if loss == "released" else loss
        for d in DATASETS:
            u, p, k = (acc(src.get((d, s, key), {})) for s in ("uniform", "proximity", "knn"))
            if u and p:
                knn = [paired_effect(k, u), paired_effect(k, p)] if k else [None, None]
                rows.append([LOSS_NAME[loss], short(d), *effect(paired_effect(p, u)),
                             *(e.format(2) if e else "—" for e in knn)])
    return md(["loss", "dataset", "BatchSampler − uniform", "signs (+/-/=)", "beyond noise",
               "kNN − uniform", "kNN − BatchSampler"], rows)


def paper_gap(cells: dict, released: dict) -> str:
    rows = []
    for i, d in enumerate(DATASETS):
        row = [short(d), f"{PAPER['uniform'][i]:.2f}"]
        for src in (cells, released):
            a = acc(src.get((d, "uniform", "infonce"), {})).values()
            row += [f"{statistics.fmean(a):.2f} ({len(a)})",
                    f"{statistics.fmean(a) - PAPER['uniform'][i]:+.2f}"] if a else ["—", "—"]
        rows.append(row)
    return md(["dataset", "paper: GraphCL", "uniform InfoNCE (seeds)", "minus paper",
               "released aug.: uniform (seeds)", "minus paper"], rows)


def completeness(cells: dict) -> str:
    rows, total, done, planned = [], 0.0, 0, 0
    for d in DATASETS:
        for loss, n in SEEDS.items():
            for s in SAMPLERS:
                recs = cells.get((d, s, loss), {})
                planned, done = planned + n, done + len(recs)
                miss = ",".join(str(i) for i in range(n) if i not in recs) or "-"
                if not recs:
                    rows.append([d, loss, s, f"0/{n}", miss, "—", "—", "—"])
                    continue
                walls = [r["wall_time_s"] for r in recs.values()]
                total += sum(walls)
                svm = statistics.fmean(r["timings_s"]["eval_svm"] / r["wall_time_s"]
                                       for r in recs.values())
                rows.append([d, loss, s, f"{len(recs)}/{n}", miss,
                             fmt_time(statistics.fmean(walls)), f"{100 * svm:.0f}%",
                             next(iter(recs.values()))["steps"]])
    rows.append(["all", "", "", f"{done}/{planned}", "", fmt_time(total) + " in total", "", ""])
    return md(["dataset", "loss", "sampler", "seeds done", "missing seeds", "wall/run",
               "SVM share", "steps"], rows)


def time_parts(cells: dict) -> str:
    rows = []
    for d in DATASETS:
        recs = [r for s in SAMPLERS for r in cells.get((d, s, "infonce"), {}).values()]
        if recs:
            rows.append([d, len(recs),
                         *(f"{statistics.fmean(r['timings_s'][k] for r in recs):.1f}"
                           for k in PARTS),
                         *(fmt_time(statistics.fmean(v)) if v else "—" for v in (
                             [r["wall_time_s"] for r in recs],
                             [r["cpu_time_s"] for r in recs if "cpu_time_s" in r]))])
    return md(["dataset", "runs", *PARTS, "wall/run", "CPU/run"], rows)


def variants_table(cells: dict, variants: dict) -> str:
    rows = []
    for (d, tag, s, loss), recs in sorted(variants.items()):
        base = cells.get((d, s, loss), {})
        same = [100 * base[k]["accuracy"] for k in recs if k in base]
        rows.append([d, tag, s, loss, ",".join(map(str, sorted(recs))),
                     ms(acc(recs).values()), f"{ms(same)} ({len(same)})" if same else "—"])
    return md(["dataset", "tag", "sampler", "loss", "seeds", "accuracy",
               "default setting, same seeds"], rows)


def tables(results: Path) -> dict[str, str]:
    """Every table of the page, by its block key."""
    cells, variants = load(results)
    released = {(d, s, loss): recs for (d, tag, s, loss), recs in variants.items()
                if tag == "augreleased"}
    return {
        "confirm": confirm_table(results), "explore": explore_table(scores(results / "explore")),
        "times": times_table(results),
        **{f"accuracy-{loss}": accuracy_table(cells, loss, n) for loss, n in SEEDS.items()},
        "accuracy-released": accuracy_table(released, "infonce", 5, [
            s for s in SAMPLERS if any(k[1] == s for k in released)]),
        "paper-gap": paper_gap(cells, released), "record-effects": record_effects(cells, released),
        "completeness": completeness(cells), "time-parts": time_parts(cells),
        "variants": variants_table(cells, variants)}


def figures(results: Path, fig_dir: Path) -> int:
    """Per dataset: false-negative rate and hardness over training per sampler (InfoNCE, mean
    over seeds, trailing mean over one epoch), and the reference hardness where recorded."""
    import numpy as np

    plt, cells, n = pyplot(), load(results)[0], 0
    for d in DATASETS:
        runs = {s: list(cells[(d, s, "infonce")].values()) for s in SAMPLERS
                if cells.get((d, s, "infonce"))}
        keys = ["false_negative_rate", "hardness"] + (["reference_hardness"] if any(
            "reference_hardness" in r["trace"] for rs in runs.values() for r in rs) else [])
        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6))
        for s, rs in runs.items():
            steps = min(len(r["trace"]["step"]) for r in rs)
            window = max(1, rs[0]["trace"]["epoch"].count(0))
            for ax, key in zip(axes, keys):
                have = [r["trace"][key][:steps] for r in rs if key in r["trace"]]
                if have and steps:
                    y = np.nanmean(np.array(have, float), 0)
                    y = [y[max(0, i - window + 1):i + 1].mean() for i in range(len(y))]
                    ax.plot(rs[0]["trace"]["step"][:steps], y, lw=1.2,
                            label=f"{s} ({len(have)} seeds)")
        for ax, title in zip(axes, ("false-negative rate per batch", "hardness (mean top-1 "
                                    "negative cosine)", "hardness in the reference (untrained "
                                    "encoder)")):
            ax.set_title(f"{d}: {title}", fontsize=10)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        n += save(fig, fig_dir / f"graphcl_{d}.png")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--explore", default=None)
    ap.add_argument("--choose", action="store_true")
    ap.add_argument("--results", default="results/graphs")
    args, rest = ap.parse_known_args(argv)
    if not args.explore:
        return report_main("graphs", tables, figures, rest + ["--results", args.results])
    rows = scores(Path(args.explore))
    print(explore_table(rows))
    chosen = choose(rows)
    print(f"rule's choice: {chosen['arm']} ({chosen['flags']}, S {chosen['score']:+.2f})"
          if chosen else "rule's choice: none yet (no complete configuration)")
    if args.choose and chosen:
        pre = record_choice(chosen, Path(args.results) / "preregistration.json")
        print(f"recorded: {pre['chosen']['flags']} at {pre['chosen']['written_at']}")
    return 0
