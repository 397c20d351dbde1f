"""The tables and figures of docs/results/vision.md (SimCLR) from the run JSONs.

    python scripts/report_vision.py [--results results/vision] [--in-place | --out PAGE]

``results/vision/sweep/``: the batch-size sweep of issue 21 (``scripts/vision_sweep.sh``; with
``reference/`` and ``timing/``); the *main* budget is the largest ``config.images``, the
equal-steps view holds B = 64 runs at a quarter of it; a run with ``config.guide`` is the
guided arm. ``results/vision/*.json``: the earlier B = 256 record (issue 7). Loss names are
read through ``hardbatch.registry.canonical_loss`` (``debiased`` and ``dcl`` are one row).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from hardbatch.registry import canonical_loss

from .page import md, mean, ms, pyplot, read_runs, report_main, save
from .paired import effect_text, paired_effect, pooled_effect

BATCHES = (32, 64, 128, 256)
ARMS = (("uniform", "infonce"), ("proximity", "infonce"), ("uniform", "sscl"),
        ("proximity", "sscl"))
GUIDED = ("proximity+guided", "infonce")
NAME = {ARMS[0]: "uniform + InfoNCE", ARMS[1]: "proximity + InfoNCE", ARMS[2]: "uniform + SSCL",
        ARMS[3]: "proximity + SSCL", GUIDED: "proximity + InfoNCE + guided mask"}
#: (arm, baseline): the paired comparisons at one batch size
COMPARISONS = ((ARMS[1], ARMS[0]), (ARMS[2], ARMS[0]), (ARMS[3], ARMS[0]), (ARMS[3], ARMS[2]))
SEEDS = (0, 1, 2)  # every cell; seeds 3 and 4 too for the primary comparison's two arms


def planned(arm: tuple) -> int:
    return 5 if arm in ARMS[:2] else len(SEEDS)


SAMPLER = {"uniform": "uniform", "knn": "kNN sampler", "proximity": "proximity graph (RWR)",
           "gcbs": "GCBS"}
LOSS = {"infonce": "InfoNCE", "dcl": "DebiasedInfoNCE", "hcl": "HardNegativeInfoNCE",
        "sscl": "SSCLLoss"}
MAIN_ROWS = [("uniform", "infonce"), ("proximity", "infonce"), ("uniform", "sscl"),
             ("knn", "infonce"), ("gcbs", "infonce")]
OTHER_ROWS = [("proximity", "sscl"), ("uniform", "dcl"), ("uniform", "hcl"),
              ("proximity", "dcl"), ("proximity", "hcl")]


def wall_seconds(r: dict) -> float:
    """Seconds a run took; a resumed run's ``wall_time_s`` covers only its last session."""
    if r.get("resumed") and r.get("train_time_s") is not None:
        return r["train_time_s"] + r.get("eval_time_s", 0.0)
    return r["wall_time_s"]


def values(cell: dict, key: str = "knn_accuracy") -> dict:
    return {s: r[key] for s, r in cell.items() if r.get(key) is not None}


def cell_text(e, signs: bool = True, scale: float = 100, digits: int = 2) -> str:
    """A paired effect in a sweep table: bold when beyond noise, then the sign count."""
    if e is None:
        return "—"
    text = f"**{e.format(digits, scale)}**" if e.beyond_noise else e.format(digits, scale)
    return text + (f" ({e.signs()})" if signs and e.n >= 2 else "")


def acc_cell(cell: dict, n: int, key: str = "knn_accuracy") -> str:
    v = list(values(cell, key).values())
    return f"{ms(v, 2, 100)} ({len(v)}/{n})" if v else "—"


def sweep_runs(folder: Path) -> list[dict]:
    return read_runs(folder, lambda r: r.get("knn_accuracy") is not None
                     and (r.get("config") or {}).get("images"))


class Sweep:
    """``main[(B, sampler, loss)][seed]`` at the main budget, ``equal[(sampler, loss)][seed]``
    (B = 64 at a quarter of it), ``runs``, ``timing``, ``reference``."""

    def __init__(self, folder: Path) -> None:
        self.runs, self.timing = sweep_runs(folder), sweep_runs(folder / "timing")
        self.reference = sweep_runs(folder / "reference")
        budget = max(r["config"]["images"] for r in self.runs)
        self.main, self.equal = defaultdict(dict), defaultdict(dict)
        for r in self.runs:
            c = r["config"]
            arm = (r["sampler"] + ("+guided" if c.get("guide") else ""), r["loss"])
            if c["images"] == budget:
                self.main[(c["batch_size"], *arm)][r["seed"]] = r
            elif c["batch_size"] == 64 and c["images"] * 4 == budget and not c.get("guide"):
                self.equal[arm][r["seed"]] = r

    def effect(self, b: int, arm: tuple, base: tuple, key: str = "knn_accuracy"):
        return paired_effect(values(self.main.get((b, *arm), {}), key),
                             values(self.main.get((b, *base), {}), key))


def accuracy_table(s: Sweep, key: str) -> str:
    rows = []
    for b in BATCHES:
        cells = [s.main.get((b, *arm), {}) for arm in ARMS]
        runs = [r for c in cells for r in c.values()]
        rows.append([b, "/".join(map(str, sorted({r["steps"] for r in runs}))),
                     "/".join(f"{x:.2g}" for x in sorted({r["config"]["lr"] for r in runs})),
                     *(acc_cell(c, planned(arm), key) for c, arm in zip(cells, ARMS))])
    return md(["B", "steps", "lr", *(NAME[a] for a in ARMS)], rows)


def effects_table(s: Sweep, key: str) -> str:
    """Rows B, columns the COMPARISONS; then the mean over B and the change from B = 32 to 256."""
    rows = [[b, *(cell_text(s.effect(b, a, base, key)) for a, base in COMPARISONS)]
            for b in BATCHES]
    pooled, change = ["mean over B (t-interval over the B values)"], [
        "effect at B = 32 − effect at B = 256 (paired by seed)"]
    for a, base in COMPARISONS:
        pooled.append(cell_text(pooled_effect({b: s.effect(b, a, base, key) for b in BATCHES})))
        diff = []
        for b in (32, 256):
            x, y = values(s.main.get((b, *a), {}), key), values(s.main.get((b, *base), {}), key)
            diff.append({k: x[k] - y[k] for k in sorted(set(x) & set(y))})
        change.append(cell_text(paired_effect(*diff)))
    return md(["B", *(f"{NAME[a]} − {NAME[b]}" for a, b in COMPARISONS)], rows + [pooled, change])


def equal_steps_table(s: Sweep) -> str:
    big, base64 = s.main.get((256, *ARMS[0]), {}), values(s.equal.get(ARMS[0], {}))
    rows = []
    for arm in ARMS:
        cell = s.equal.get(arm, {})
        rows.append([NAME[arm], "/".join(map(str, sorted({r["steps"] for r in cell.values()}))),
                     acc_cell(cell, 3), cell_text(paired_effect(values(cell), values(big))),
                     "(baseline)" if arm == ARMS[0] else
                     cell_text(paired_effect(values(cell), base64))])
    rows.append(["(uniform + InfoNCE at B = 256)",
                 "/".join(map(str, sorted({r["steps"] for r in big.values()}))),
                 acc_cell(big, 3), "(baseline)", ""])
    return md(["arm at B = 64", "steps", "kNN acc (B = 64)", "− uniform + InfoNCE at B = 256",
               "− uniform + InfoNCE at B = 64 (same steps)"], rows)


def ref(r: dict, key: str = "mean_hardness"):
    return (r.get("reference_diagnostics") or {}).get(key)


def guided_table(s: Sweep) -> str:
    rows = []
    for b in (32, 64):
        cell = s.main.get((b, *GUIDED), {})
        rows.append([b, acc_cell(cell, 3), *(cell_text(s.effect(b, GUIDED, base))
                                             for base in (ARMS[1], ARMS[0])),
                     mean([ref(r) for r in cell.values()]),
                     mean([r.get("mean_false_negative_rate") for r in cell.values()])])
    return md(["B", "kNN acc (guided)", "− proximity + InfoNCE", "− uniform + InfoNCE",
               "ref. hardness", "false-neg rate"], rows)


def margin_table(folder: Path) -> str:
    rows = []
    for m in json.loads((folder / "guide_margin.json").read_text())["margins"]:
        b = m["proximity_batches"]
        rows.append([m["margin"], f"{b['dropped_share']:.4f}",
                     *("—" if b[k] is None else f"{b[k]:.3f}" for k in ("precision", "recall"))])
    return md(["margin", "dropped share of in-batch pairs", "precision", "recall"], rows)


def diagnostics_table(s: Sweep) -> str:
    rows = []
    for b in BATCHES:
        for arm in ARMS:
            cell = s.main.get((b, *arm), {})
            base = s.main.get((b, "uniform", arm[1]), {})
            delta = "(uniform)" if arm[0] == "uniform" else cell_text(paired_effect(
                {k: ref(r) for k, r in cell.items() if ref(r) is not None},
                {k: ref(r) for k, r in base.items() if ref(r) is not None}), False, 1, 3)
            rs = list(cell.values())
            rows.append([b, NAME[arm], len(rs), mean([ref(r) for r in rs]), delta,
                         mean([ref(r, "mean_near_duplicate_rate") for r in rs], "{:.4f}"),
                         mean([r.get("mean_false_negative_rate") for r in rs]),
                         mean([r.get("mean_hardness") for r in rs])])
    return md(["B", "arm", "seeds", "ref. hardness", "paired Δ ref. hardness vs uniform, same "
               "loss", "ref. near-dup rate", "false-neg rate", "own-embedding hardness"], rows)


def pairing_table(s: Sweep) -> str:
    by_seed = defaultdict(list)
    for r in s.runs:
        by_seed[r["seed"]].append(r)
    rows = []
    for seed, rs in sorted(by_seed.items()):
        aug = defaultdict(set)
        for r in rs:
            aug[(r["config"]["batch_size"], r["config"]["images"])].add(
                r["pairing"].get("augment_generator_end"))
        p = [r["pairing"] for r in rs]
        rows.append([seed, len(rs), f"{len({x['initial_weights'] for x in p})} distinct",
                     f"{len({(x['train_ids'], x['test_ids']) for x in p})} distinct",
                     ", ".join(f"B {b} ({i} img): {len(v)}" for (b, i), v in sorted(aug.items()))])
    return md(["seed", "runs", "initial weights", "train / test ids",
               "augmentation streams per B (1 = same in every arm)"], rows)


def timing_table(s: Sweep, images: int = 81920) -> str:
    """Shortened timing runs and their CPU time projected to a full run (``images`` training
    images, 3 evaluations): their CPU / wall ratio splits the wall times into CPU time."""
    rows = []
    for r in sorted(s.timing, key=lambda r: (r["config"]["batch_size"], r["sampler"])):
        share, per_eval = r["cpu_time_s"] / r["wall_time_s"], r["eval_time_s"] / len(r["evals"])
        cpu = share * (r["train_time_s"] * images / r["images_seen"] + per_eval * 3)
        rows.append([r["config"]["batch_size"], NAME[(r["sampler"], r["loss"])], r["steps"],
                     f"{1000 * r['train_time_s'] / r['images_seen']:.1f}", f"{per_eval:.0f}",
                     f"{share:.2f}", f"{cpu / 60:.1f}"])
    return md(["B", "arm", "steps", "wall s / 1k train images", "wall s / evaluation",
               "CPU / wall", "projected CPU min per full run"], rows)


def sweep_times(s: Sweep) -> str:
    groups = defaultdict(list)
    for cell in list(s.main.values()) + list(s.equal.values()):
        for r in cell.values():
            groups[(r["config"]["batch_size"], r["config"]["images"])].append(r)
    return md(["B", "images", "runs", "wall / run", "CPU / run"], [
        [b, i, len(rs), f"{statistics.fmean(wall_seconds(r) for r in rs) / 60:.1f} min",
         mean([r.get("cpu_time_s", float("nan")) / 60 for r in rs], "{:.1f} min")]
        for (b, i), rs in sorted(groups.items())])


def machine(r: dict) -> str:
    e = r.get("env", {})
    return (f"{e.get('host', '?')} ({e.get('cpus', '?')} CPUs, torch {e.get('torch', '?')}"
            f"{', ' + e['cuda'] if e.get('cuda') else ''})")


def wall(r: dict) -> str:
    return f"{wall_seconds(r) / 60:.1f} min{' (resumed)' if r.get('resumed') else ''}"


def sweep_run_table(s: Sweep) -> str:
    rows = [[r["_file"], r["config"]["batch_size"], r["config"]["images"], r["steps"],
             f"{r['config']['lr']:.3g}", r["seed"], f"{100 * r['knn_accuracy']:.2f}",
             f"{100 * r['linear_probe_accuracy']:.2f}", wall(r), machine(r),
             r.get("env", {}).get("finished", "?"), f"`{r.get('command', '')}`"]
            for r in sorted(s.runs + s.reference, key=lambda r: r["_file"])]
    return md(["file", "B", "images", "steps", "lr", "seed", "kNN", "linear", "wall", "machine",
               "finished", "command"], rows)


# --- the earlier B = 256 record (issue 7) --------------------------------------------------

def record_runs(results: Path) -> list[dict]:
    runs = read_runs(results, lambda r: "knn_accuracy" in r and "sampler" in r
                     and not r.get("tag"))
    for r in runs:
        r["loss"] = canonical_loss(r["loss"])
    return runs


def record_table(runs: list[dict], rows: list[tuple]) -> str:
    """One row per (sampler, loss): accuracies, Δ vs uniform + InfoNCE paired by seed, batch
    diagnostics, speed."""
    by = defaultdict(list)
    for r in runs:
        by[(r["sampler"], r["loss"])].append(r)
    base = by[("uniform", "infonce")]
    out = []
    for s, loss in rows:
        rs = sorted(by[(s, loss)], key=lambda r: r["seed"])
        row = [SAMPLER[s], LOSS[loss], f"{len(rs)}/3"]
        for key in ("knn_accuracy", "linear_probe_accuracy"):
            arm = {r["seed"]: r[key] for r in rs}
            row += [ms(arm.values(), 2, 100), "(baseline)" if (s, loss) == ("uniform", "infonce")
                    else effect_text(paired_effect(arm, {r["seed"]: r[key] for r in base}), 2, 100)
                    if arm else "—"]
        row += [mean([r[k] for r in rs]) for k in ("mean_false_negative_rate",
                                                   "last_epoch_false_negative_rate",
                                                   "mean_hardness")]
        row += [mean([ref(r) for r in rs]), mean([r["last_epoch_coverage"] for r in rs]),
                mean([r["images_per_second"] for r in rs], "{:.0f}"),
                mean([100 * r["sampler_share"] for r in rs], "{:.1f}%"),
                mean([wall_seconds(r) / 60 for r in rs], "{:.1f} min")]
        out.append(row)
    return md(["sampler", "loss", "seeds", "kNN acc", "Δ kNN vs uniform/InfoNCE (paired)",
               "linear acc", "Δ linear (paired)", "false-neg rate", "last-epoch FN rate",
               "hardness", "ref. hardness", "coverage", "images/s", "sampler / step",
               "wall / run"], out)


def record_run_table(runs: list[dict]) -> str:
    return md(["file", "seed", "steps", "kNN acc", "linear acc", "FN rate", "images/s", "wall",
               "machine", "finished", "command"], [
        [r["_file"], r["seed"], r["steps"], f"{100 * r['knn_accuracy']:.2f}",
         f"{100 * r['linear_probe_accuracy']:.2f}", f"{r['mean_false_negative_rate']:.3f}",
         f"{r['images_per_second']:.0f}", wall(r), machine(r),
         r.get("env", {}).get("finished", "?"), f"`{r.get('command', '')}`"]
        for r in sorted(runs, key=lambda r: r["_file"])])


def tables(results: Path) -> dict[str, str]:
    """Every table of the page, by its block key."""
    s, runs = Sweep(results / "sweep"), record_runs(results)
    out = {"sweep-knn": accuracy_table(s, "knn_accuracy"),
           "sweep-knn-effects": effects_table(s, "knn_accuracy"),
           "sweep-linear": accuracy_table(s, "linear_probe_accuracy"),
           "sweep-linear-effects": effects_table(s, "linear_probe_accuracy"),
           "equal-steps": equal_steps_table(s), "guided": guided_table(s),
           "margin": margin_table(results / "sweep"), "sweep-diagnostics": diagnostics_table(s),
           "pairing": pairing_table(s), "timing": timing_table(s), "sweep-times": sweep_times(s),
           "sweep-runs": sweep_run_table(s), "record-runs": record_run_table(runs)}
    for ds in sorted({r["dataset"] for r in runs}):
        rs = [r for r in runs if r["dataset"] == ds]
        out[f"record-{ds}"] = record_table(rs, MAIN_ROWS)
        out[f"record-{ds}-other"] = record_table(rs, OTHER_ROWS)
    return out


def figures(results: Path, fig_dir: Path) -> int:
    """The sweep (kNN accuracy and paired effects vs B) and, per dataset of the earlier record,
    kNN accuracy over training per row and the false-negative rate per sampler (InfoNCE)."""
    import numpy as np

    plt, s = pyplot(), Sweep(results / "sweep")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, arm in enumerate(ARMS):
        pts = [(b * (1 + 0.03 * (k - 1.5)), [100 * v for v in values(s.main[(b, *arm)]).values()])
               for b in BATCHES if s.main.get((b, *arm))]
        for x, ys in pts:
            ax1.scatter([x] * len(ys), ys, s=8, alpha=0.4, color=f"C{k}")
        ax1.plot([x for x, _ in pts], [statistics.fmean(ys) for _, ys in pts], marker="o",
                 color=f"C{k}", label=NAME[arm])
    for i, (arm, base) in enumerate(COMPARISONS):
        es = [(b * (1 + 0.04 * (i - 1.5)), e) for b in BATCHES if (e := s.effect(b, arm, base))]
        ax2.errorbar([x for x, _ in es], [100 * e.mean for _, e in es], yerr=[
            [100 * (e.mean - e.lo) if e.n >= 2 else 0.0 for _, e in es],
            [100 * (e.hi - e.mean) if e.n >= 2 else 0.0 for _, e in es]], marker="s", capsize=3,
            color=f"C{4 + i}", label=f"{NAME[arm]} − {NAME[base]}")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(BATCHES, [str(b) for b in BATCHES])
        ax.set_xlabel("batch size B (same images seen; lr = 1e-3 sqrt(B/256))")
    ax2.axhline(0, color="grey", lw=0.8)
    ax1.set(ylabel="kNN accuracy (%)", title="SimCLR CIFAR-10: kNN accuracy vs batch size")
    ax2.set(ylabel="paired Δ kNN accuracy (points), 95% CI",
            title="effect vs batch size (paired by seed)")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=7)
    n = save(fig, fig_dir / "vision_batch_sweep.png")
    runs = record_runs(results)
    for ds in sorted({r["dataset"] for r in runs}):
        rs = [r for r in runs if r["dataset"] == ds]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        by = defaultdict(list)
        for r in rs:
            by[(r["sampler"], r["loss"])].append(r)
        for (smp, loss), row in sorted(by.items()):
            steps = sorted({e["step"] for r in row for e in r["evals"]})
            ax1.plot(steps, [100 * statistics.fmean(e["knn_accuracy"] for r in row
                                                    for e in r["evals"] if e["step"] == st)
                             for st in steps], marker="o",
                     label=f"{SAMPLER[smp]} / {LOSS[loss]} ({len(row)} seed"
                           f"{'s' if len(row) != 1 else ''})")
        for smp in sorted({r["sampler"] for r in rs if r["loss"] == "infonce"}):
            tr = [r["trace"]["false_negative_rate"] for r in rs
                  if r["sampler"] == smp and r["loss"] == "infonce"]
            m = np.nanmean(np.array([t[:min(map(len, tr))] for t in tr], float), 0)
            w = 10 if len(m) >= 10 else 1
            ax2.plot(np.arange(len(m) - w + 1) + w, np.convolve(m, np.ones(w) / w, "valid"),
                     label=SAMPLER[smp])
        ax1.set(xlabel="training step", ylabel="kNN accuracy (%), mean over seeds",
                title=f"SimCLR {ds}: kNN accuracy over training")
        ax2.set(xlabel="training step", ylabel="false-negative rate (moving mean of 10 steps)",
                title="false negatives per batch (InfoNCE runs; BatchSampler Fig. 4)")
        ax1.legend(fontsize=7)
        ax2.legend(fontsize=8)
        n += save(fig, fig_dir / f"vision_{ds}.png")
    return n


def main(argv: list[str] | None = None) -> int:
    return report_main("vision", tables, figures, argv)
