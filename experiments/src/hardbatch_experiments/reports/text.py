"""The tables and figure of docs/results/text.md (SimCSE on STS) from the run JSONs.

    python scripts/report_text.py [--results results/text] [--in-place | --out PAGE]

``results/text/{start,pilot,reinit}/``: the re-initialised-MiniLM setting (issue 19: probes,
pilots, the confirmatory grid of ``scripts/text_confirm.sh``); ``results/text/*.json``: the
saturated-model record (``hardbatch bench simcse`` runs, plan-only runs, the zero-shot
evaluation, ``debias_floor.json``). A saturated run's row is its sampler and loss key (the
loss and the training options that make another row); runs of the main tag's size with other
sampler options are ablations.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from hardbatch.registry import sampler_names

from .page import md, pyplot, read_runs, report_main, save
from .page import ms as fmt
from .paired import effect_text, paired_effect

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark"]
SAMPLERS = ("default", *sampler_names())  # default: sentence-transformers' own sampler
ARMS = (*SAMPLERS, "proximity+guided")
ARM = {"default": "default (sentence-transformers NoDuplicates)",
       "uniform": "uniform (hardbatch)", "knn": "kNN sampler", "proximity": "proximity graph + RWR",
       "gcbs": "GCBS (library defaults)",
       "proximity+guided": "proximity + guided false-negative masks"}
ROW = {**ARM, "proximity": "proximity graph + RWR (BatchSampler)", "gcbs": "GCBS"}
SIDE = (("proximity", "uniform"), ("gcbs", "uniform"), ("gcbs", "proximity"),
        ("proximity+guided", "proximity"), ("knn", "gcbs"), ("knn", "proximity"))
LOSS_NAME = {"mnrl": "MNRL", "infonce": "InfoNCE", "dcl": "DCL", "hcl": "HCL"}
SAMPLER_OPTIONS = {"proximity": ("candidates", "neighbors", "restart"), "gcbs": ("quantile",)}
LOSS_OPTIONS = ("temperature", "tau_plus", "beta", "lr", "batch_size", "max_seq_length_train")
STEPS = 1500  # the pre-registered steps of the confirmatory grid


# --- the re-initialised MiniLM (issue 19) -------------------------------------------------

def arm_of(r: dict) -> str:
    """A run's arm: its sampler, ``+guided`` with guided masks, other input dropout / steps."""
    c = r["config"]
    return (r["sampler"] + ("+guided" if c.get("guide_margin") is not None else "")
            + (f"+input dropout {c['input_dropout']:g}" if c.get("input_dropout") else "")
            + (f", {c['steps']} steps" if c.get("steps", STEPS) != STEPS else ""))


def by_arm(folder: Path) -> dict[str, dict[int, dict]]:
    by = defaultdict(dict)
    for r in read_runs(folder, lambda r: r.get("benchmark") == "simcse-reinit"):
        by[arm_of(r)][r["seed"]] = r
    return {a: by[a] for a in [a for a in ARMS if a in by] + sorted(set(by) - set(ARMS))}


def value(r: dict, key: str) -> float:
    return r["avg"] if key == "avg" else r["retrieval"][key]


def paired(arm: dict, base: dict, key: str = "avg"):
    return paired_effect({s: value(r, key) for s, r in arm.items()},
                         {s: value(r, key) for s, r in base.items()})


def starts(results: Path, kind: str = "simcse-start") -> list[dict]:
    return read_runs(results / "start", lambda r: r.get("benchmark") == kind)


def arm_table(results: Path, folder: str) -> str:
    """Per arm: means over seeds, STS vs the starting model and each metric vs default."""
    start = {r["seed"]: r["sts"]["avg"] for r in starts(results)
             if r["reinit_layers"] == 1 and r.get("sts") and not r.get("input_dropout")}
    by = by_arm(results / folder)
    rows = []
    for arm, rs in by.items():
        row = [ARM.get(arm, arm), ",".join(map(str, sorted(rs)))]
        row += [f"{statistics.mean(value(r, k) for r in rs.values()) * f:.2f}"
                for k, f in (("avg", 1), ("mrr@10", 100), ("recall@1", 100))]
        row.append(f"{statistics.mean(r['diagnostics']['mean_hardness'] for r in rs.values()):.3f}")
        moved = paired_effect({s: r["avg"] for s, r in rs.items()}, start)
        row.append(moved.format(2) if moved else "pending")
        for k, f in (("avg", 1), ("mrr@10", 100), ("recall@1", 100)):
            e = paired(rs, by.get("default", {}), k)
            row.append("baseline" if arm == "default" else e.format(2, f) if e else "pending")
        rows.append(row)
    return md(["arm", "seeds", "STS avg", "STS-B MRR@10", "STS-B R@1", "hardness",
               "STS avg vs start", "STS avg vs default", "MRR@10 vs default",
               "R@1 vs default"], rows)


def side_table(results: Path) -> str:
    """Arm against arm (not pre-registered), STS avg."""
    by = by_arm(results / "reinit")
    rows = [[ARM[a], ARM[b], effect_text(paired(by.get(a, {}), by.get(b, {})))]
            for a, b in SIDE]
    return md(["arm", "against", "STS avg difference"], rows)


def loss_table(results: Path, folder: str) -> str:
    """How fast the SimCSE loss falls in each arm's own batches (means over its runs)."""
    rows = []
    for arm, rs in by_arm(results / folder).items():
        chunk = next(iter(rs.values()))["loss_curve_chunk"]
        curve = [statistics.mean(v) for v in zip(*(r["loss_curve"] for r in rs.values()))]
        rows.append([arm, f"{curve[0]:.3g}", f"{curve[1]:.3g}",
                     f"{statistics.mean(curve[len(curve) // 2:]):.2g}"])
    return md(["arm", f"loss, steps 1-{chunk}", f"steps {chunk + 1}-{2 * chunk}",
               "mean over the second half"], rows)


def reinit_runs(results: Path, folder: str) -> str:
    rows = []
    for rs in by_arm(results / folder).values():
        for r in rs.values():
            c = r["loss_curve"]
            rows.append([f"`{r['_file']}`", r["seed"], f"{r['avg']:.2f}",
                         f"{100 * r['retrieval']['mrr@10']:.2f}", f"{c[0]:.3f} -> {c[-1]:.3f}",
                         *(f"{r[k] / 60:.1f}" for k in ("train_time_s", "refresh_time_s",
                                                        "eval_time_s", "wall_time_s")),
                         r["env"]["finished"], f"`{r['command']}`"])
    rows.sort(key=lambda row: row[-2])
    return md(["file", "seed", "STS avg", "MRR@10", "loss first -> last", "train (min)",
               "refresh (min)", "eval (min)", "wall (min)", "finished", "command"], rows)


def start_table(results: Path) -> str:
    rows = []
    for r in sorted(starts(results), key=lambda r: (r.get("input_dropout", 0.0),
                                                     r["reinit_layers"], r["seed"])):
        sts = r.get("sts") or {}
        rows.append([r["reinit_layers"], r["seed"], f"{r.get('input_dropout', 0.0):g}",
                     f"{r['step0_loss_mean']:.4g}", f"{sts['avg']:.2f}" if sts else "—",
                     f"{sts['tasks']['STSBenchmark']:.2f}" if sts else "—"])
    return md(["L", "seed", "input dropout", "step-0 loss", "STS avg (6 tasks)", "STS-B"], rows)


def cost_table(results: Path) -> str:
    rows = [[r["reinit_layers"], f"{r['step_cpu_s_median']:.3f}", f"{r['step_s_median']:.3f}",
             f"{r['encode_cpu_s_per_1k']:.2f}", f"{r['encode_s_per_1k']:.2f}",
             f"{r['cache_build_cpu_s_per_1k']:.1f}", f"{r['cache_mb_per_1k']:.1f}"]
            for r in json.loads((results / "start" / "cost.json").read_text())["rows"]]
    return md(["L", "step CPU (s)", "step wall (s)", "re-encode CPU (s / 1k sentences)",
               "re-encode wall (s / 1k)", "cache build CPU (s / 1k)",
               "cache (MB / 1k sentences)"], rows)


def hardness_table(results: Path) -> str:
    rows = []
    for h in starts(results, "simcse-hardness"):
        for r in h["rows"]:
            ref, above = r.get("hardness_reference"), r.get("reference_pairs_above")
            rows.append([r["sampler"], r["neighbors"] or "—", f"{r['hardness']:.3f}",
                         "—" if ref is None else f"{ref:.3f}",
                         " / ".join(f"{above[t]:.5f}" for t in ("0.5", "0.7", "0.9"))
                         if above else "—"])
    return md(["sampler", "K", "hardness (starting model)", "hardness (full MiniLM)",
               "in-batch pairs with full-MiniLM cosine > 0.5 / 0.7 / 0.9"], rows)


# --- the saturated-model record ----------------------------------------------------------

def r_base(tag: str | None) -> str:
    """A run tag without its options hash (``n5120_steps80_hc5d607`` -> ``n5120_steps80``)."""
    return re.sub(r"_h[0-9a-f]{6}$", "", tag or "")


def loss_key(r: dict) -> tuple:
    return (r["loss"],) + tuple(r["config"].get(k) for k in LOSS_OPTIONS)


def sampler_opts(r: dict) -> tuple:
    return tuple((k, r["config"].get(k)) for k in SAMPLER_OPTIONS.get(r["sampler"], ()))


def loss_label(key: tuple, cfg: dict) -> str:
    """``DCL (t 0.05, tau+ 0.1)``: the loss with its temperature / tau+ / beta where it has them
    and any other training option that differs from the main configuration ``cfg``."""
    o = dict(zip(LOSS_OPTIONS, key[1:]))
    parts = [f"t {o['temperature']:g}"] if key[0] in ("dcl", "hcl") or \
        o["temperature"] != cfg.get("temperature") else []
    parts += [f"{n} {o[k]:g}" for k, n in (("tau_plus", "tau+"), ("beta", "beta"))
              if o[k] is not None]
    parts += [f"{k} {o[k]:g}" for k in LOSS_OPTIONS[3:] if o[k] != cfg.get(k)]
    return LOSS_NAME[key[0]] + (f" ({', '.join(parts)})" if parts else "")


class Saturated:
    """The saturated record's runs: ``cells[(sampler, loss key)][seed]`` (the results table),
    ``ablations`` (other sampler options), ``base`` (default + MNRL, every Δ's reference),
    ``order`` (the table's rows), ``cfg`` (the main configuration), ``zero`` / ``za`` (the
    zero-shot evaluation and its 6-task average)."""

    def __init__(self, results: Path) -> None:
        recs = read_runs(results, lambda r: True)
        self.runs = [r for r in recs if r.get("benchmark") == "simcse" and "avg" in r]
        self.plans = [r for r in recs if r.get("benchmark") == "simcse-plan"]
        self.zero = next(r for r in recs if r["_file"].startswith("zero_shot")
                         and "tasks" in r and not r.get("limit"))
        self.za = statistics.mean(self.zero["tasks"][t]["spearman"] for t in TASKS)
        groups = defaultdict(list)
        for r in self.runs:
            groups[r["tag"]].append(r)
        self.tag = max(groups, key=lambda t: (r_base(t) == t, len(groups[t]),
                                              groups[t][0]["config"]["num_sentences"]))
        sel = groups[self.tag]
        self.cfg = sel[0]["config"]
        grid = {r["sampler"]: sampler_opts(r) for r in sel}
        self.cells, self.ablations = defaultdict(dict), []
        for r in self.runs:
            if r_base(r["tag"]) != r_base(self.tag):
                continue
            if sampler_opts(r) == grid.get(r["sampler"], sampler_opts(r)):
                self.cells[(r["sampler"], loss_key(r))][r["seed"]] = r
            else:
                self.ablations.append(r)
        self.base_key = next(loss_key(r) for r in sel if (r["sampler"], r["loss"]) ==
                             ("default", "mnrl"))
        self.base = self.cells[("default", self.base_key)]
        keys = sorted({k for _, k in self.cells}, key=lambda k: (list(LOSS_NAME).index(k[0]),
                                                                 str(k[1:])))
        self.order = [(s, k) for k in keys for s in SAMPLERS if (s, k) in self.cells]

    def label(self, key: tuple) -> str:
        return loss_label(key, self.cfg)


def avgs(seeds: dict) -> dict:
    return {k: r["avg"] for k, r in seeds.items()}


def results_table(g: Saturated) -> str:
    """Per row: STS per task, the average, Δ vs default + MNRL, Δ vs the default sampler with
    the same loss (InfoNCE: default + MNRL, the same loss), and the average vs zero-shot."""
    rows = [["zero-shot all-MiniLM-L6-v2", "—", "—",
             *(f"{g.zero['tasks'][t]['spearman']:.2f}" for t in TASKS), f"{g.za:.2f}", "", "",
             ""]]
    for s, k in g.order:
        seeds = g.cells[(s, k)]
        same = g.cells.get(("default", k)) or (
            g.cells.get(("default", ("mnrl",) + k[1:]), {}) if k[0] == "infonce" else {})
        d = "" if seeds is g.base else effect_text(paired_effect(avgs(seeds), avgs(g.base)))
        d_same = "" if s == "default" or not same else effect_text(
            paired_effect(avgs(seeds), avgs(same)))
        rows.append([ROW[s], g.label(k), len(seeds),
                     *(fmt([seeds[j]["sts"].get(t) for j in sorted(seeds)]) for t in TASKS),
                     fmt([seeds[j]["avg"] for j in sorted(seeds)]), d, d_same,
                     paired_effect(avgs(seeds), {j: g.za for j in seeds}).format(2)])
    return md(["row", "loss", "n", *(t.replace("STSBenchmark", "STS-B") for t in TASKS), "Avg",
               "Δ", "Δ same loss", "Avg − zero-shot"], rows)


def ablations_table(g: Saturated) -> str:
    groups = defaultdict(list)
    for r in g.ablations:
        groups[(r["sampler"], loss_key(r), r["tag"])].append(r)
    rows = []
    for (s, k, _), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        rows.append([ROW[s], g.label(k), ", ".join(
            f"{o} {rs[0]['config'][o]}" for o in SAMPLER_OPTIONS.get(s, ())
            if rs[0]["config"].get(o) is not None) or "—", len(rs),
            *(fmt([r["sts"].get(t) for r in rs]) for t in TASKS), fmt([r["avg"] for r in rs]),
            effect_text(paired_effect({r["seed"]: r["avg"] for r in rs}, avgs(g.base))),
            fmt([r["diagnostics"]["mean_hardness"] for r in rs], 3)])
    return md(["sampler", "loss", "options", "n", *(t.replace("STSBenchmark", "STS-B")
                                                    for t in TASKS), "Avg", "Δ", "hardness"],
              rows)


def diagnostics_table(g: Saturated) -> str:
    rows = []
    for s, k in g.order:
        rs = list(g.cells[(s, k)].values())
        dg = [r["diagnostics"] for r in rs]
        rows.append([ROW[s], g.label(k), *(fmt([d[f"mean_{m}"] for d in dg], n) for m, n in (
            ("hardness", 3), ("mean_negative_similarity", 3), ("near_duplicate_rate", 6),
            ("identical_text_rate", 6))), fmt([r["train_loss"] for r in rs], 6),
            fmt([r.get("debias_floor_fraction") for r in rs]),
            fmt([r["sampler_time_s"] for r in rs], 1)])
    return md(["row", "loss", "hardness", "mean negative cos", "near-duplicate rate (cos > 0.9)",
               "identical-text rate", "train loss", "floor", "sampler s"], rows)


def floor_table(results: Path) -> str:
    groups = defaultdict(list)
    for r in json.loads((results / "debias_floor.json").read_text())["rows"]:
        groups[(r["temperature"], r["tau_plus"], r["beta"], r["sampler"])].append(r)
    return md(["t", "tau+", "beta", "sampler", "rows on the floor", "median tau+ bound",
               "positive cos", "negative cos (max)"], [
        [f"{t:g}", f"{tp:g}", f"{b:g}", s,
         f"{100 * statistics.mean(r['floor_fraction'] for r in rs):.0f}%",
         f"{statistics.median(r['tau_plus_max'] for r in rs):.1e}",
         f"{statistics.mean(r['pos_cos'] for r in rs):.3f}",
         f"{statistics.mean(r['neg_cos'] for r in rs):.3f} "
         f"({max(r['neg_cos_max'] for r in rs):.3f})"]
        for (t, tp, b, s), rs in sorted(groups.items())])


def plans_table(g: Saturated) -> str:
    groups = defaultdict(list)
    for r in g.plans:
        if r_base(r["tag"]) == r_base(g.tag):
            opts = ", ".join(f"{k} {v}" for k, v in r["sampler_options"].items()) or "—"
            groups[(r["sampler"], opts, r["tag"])].append(r["plan_diagnostics"])
    rows = []
    for s, opts, tag in sorted(groups, key=lambda k: (SAMPLERS.index(k[0]), k[2] != g.tag, k[1])):
        ds = groups[(s, opts, tag)]
        rows.append([s, opts, len(ds), fmt([d["mean_hardness"] for d in ds], 3),
                     fmt([d["mean_mean_negative_similarity"] for d in ds], 3),
                     *(fmt([d["mean_pairs_above"][t] for d in ds], 5)
                       for t in ("0.5", "0.7", "0.8", "0.9"))])
    return md(["sampler", "options", "seeds", "hardness", "mean negative cos", "pairs > 0.5",
               "pairs > 0.7", "pairs > 0.8", "pairs > 0.9"], rows)


def runs_table(g: Saturated) -> str:
    def machine(e):
        return f"{e['host']}, {e['cpus']} CPUs, torch {e['torch']}"

    rows = [[f"`{r['_file']}`", r["seed"], f"{r['avg']:.2f}",
             *(f"{r[k] / 60:.1f}" for k in ("wall_time_s", "train_time_s")),
             f"{r['steps_per_s']:.3f}", f"{r['eval_time_s'] / 60:.1f}", r["env"]["finished"],
             machine(r["env"]), f"`{r['command']}`"]
            for r in sorted(g.runs, key=lambda r: r["env"]["finished"])]
    z = g.zero
    rows.append([f"`{z['_file']}`", "—", f"{z['avg']:.2f}", f"{z['eval_time_s'] / 60:.1f}", "—",
                 "—", f"{z['eval_time_s'] / 60:.1f}", z["env"]["finished"], machine(z["env"]),
                 f"`{z['command']}`"])
    return md(["file", "seed", "Avg", "wall (min)", "train (min)", "steps/s", "eval (min)",
               "finished", "machine", "command"], rows)


def tables(results: Path) -> dict[str, str]:
    """Every table of the page, by its block key."""
    g = Saturated(results)
    return {"reinit": arm_table(results, "reinit"), "side": side_table(results),
            "start": start_table(results), "cost": cost_table(results),
            "hardness-k": hardness_table(results), "pilot": arm_table(results, "pilot"),
            "pilot-loss": loss_table(results, "pilot"), "pilot-runs": reinit_runs(results, "pilot"),
            "reinit-loss": loss_table(results, "reinit"),
            "reinit-runs": reinit_runs(results, "reinit"), "saturated": results_table(g),
            "saturated-ablations": ablations_table(g),
            "saturated-diagnostics": diagnostics_table(g), "debias-floor": floor_table(results),
            "plans": plans_table(g), "saturated-runs": runs_table(g)}


def figures(results: Path, fig_dir: Path) -> int:
    """STS average against batch hardness per saturated run."""
    g, plt = Saturated(results), pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for s, k in g.order:
        rs = list(g.cells[(s, k)].values())
        ax.scatter([r["diagnostics"]["mean_hardness"] for r in rs], [r["avg"] for r in rs],
                   label=f"{s} / {g.label(k)}", s=30)
    ax.axhline(g.za, color="gray", ls="--", lw=1, label="zero-shot")
    ax.set_xlabel("batch hardness (mean top-1 negative cosine, starting model)")
    ax.set_ylabel("STS Avg (6 tasks, Spearman x100)")
    ax.legend(fontsize=7)
    return save(fig, fig_dir / "text_sts_vs_hardness.png")


def main(argv: list[str] | None = None) -> int:
    return report_main("text", tables, figures, argv)
