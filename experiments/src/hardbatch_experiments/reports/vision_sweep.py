"""The batch-size sweep section of docs/results/vision.md (issue 21), from the run JSONs of
``scripts/vision_sweep.sh`` (``results/vision/sweep/*.json``).

A sweep run is a ``hardbatch bench simclr`` run with an image budget (``config.images``). The
*main* budget is the largest one among the runs; main runs are compared across arms at the same
batch size B; the *equal-steps* view holds B = 64 runs at a quarter of the budget (the step count
of B = 256) next to the B = 256 main runs. Every effect is a paired comparison by seed through
:mod:`.paired` (``+x.xx [lo, hi] (n = k, paired)``, points of accuracy); a partial grid renders
what is finished and says what is missing.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from .common import fmt_mean_std, link, md_row, md_rule, pyplot, read_json, save_figure
from .paired import paired_effect, pooled_effect
from .vision_plan import (
    ARM_NAME,
    ARMS,
    BATCHES,
    COMPARISONS,
    EQUAL_STEPS_BATCH,
    GUIDED,
    GUIDED_BATCHES,
    PLANNED_SEEDS,
    PROTOCOL,
    budget_lines,
    mean_text,
    planned_seeds,
    wall_seconds,
)
from .vision_answer import comparison_line, noise_text, plain_answer

__all__ = ["answer", "classify", "effects_table", "equal_steps_table", "guided_table",
           "load_sweep", "margin_lines", "missing", "plain_answer", "planned_runs", "section"]


def load_sweep(results: Path) -> list[dict]:
    """Finished sweep runs (JSON with ``knn_accuracy`` and ``config.images``) under ``results``,
    each with ``_file`` (its name); other files are ignored."""
    out = []
    if not Path(results).is_dir():
        return out
    for f, rec in read_json(Path(results)):
        if (isinstance(rec, dict) and rec.get("knn_accuracy") is not None
                and (rec.get("config") or {}).get("images")):
            rec["_file"] = f.name
            out.append(rec)
    return out


def classify(runs: list[dict]) -> tuple[dict, dict, list[dict], int | None]:
    """``(main, equal, other, budget)``: ``main[(B, sampler, loss)] = {seed: run}`` at the main
    budget (the largest ``config.images``), ``equal[(sampler, loss)] = {seed: run}`` for B = 64
    at a quarter of it, ``other`` the rest. A run with a guide (``config.guide``) is sampler
    ``"proximity+guided"`` (the guided arm, ``GUIDED``)."""
    budget = max((r["config"]["images"] for r in runs), default=None)
    main, equal, other = defaultdict(dict), defaultdict(dict), []
    for r in runs:
        images, b = r["config"]["images"], r["config"]["batch_size"]
        if r["config"].get("guide"):
            if images == budget and (f"{r['sampler']}+guided", r["loss"]) == GUIDED:
                main[(b, *GUIDED)][r["seed"]] = r
            else:
                other.append(r)
        elif images == budget:
            main[(b, r["sampler"], r["loss"])][r["seed"]] = r
        elif b == EQUAL_STEPS_BATCH and budget and images * 4 == budget:
            equal[(r["sampler"], r["loss"])][r["seed"]] = r
        else:
            other.append(r)
    return main, equal, other, budget


def _plan() -> list[tuple[str, tuple, tuple[int, ...]]]:
    """The planned cells: ``(table, key, seeds)`` with table ``"main"`` (4 B x 4 arms, seeds
    3-4 too for the primary comparison's two arms; the guided arm at GUIDED_BATCHES) or
    ``"equal"`` (the 4 equal-steps arms)."""
    return ([("main", (b, *arm), planned_seeds(arm)) for b in BATCHES for arm in ARMS]
            + [("main", (b, *GUIDED), PLANNED_SEEDS) for b in GUIDED_BATCHES]
            + [("equal", arm, PLANNED_SEEDS) for arm in ARMS])


def planned_runs() -> int:
    """Runs the sweep plans (:func:`_plan`)."""
    return sum(len(seeds) for _, _, seeds in _plan())


def missing(main: dict, equal: dict) -> int:
    """Planned runs (:func:`_plan`) not finished."""
    tables = {"main": main, "equal": equal}
    return sum(len(set(seeds) - set(tables[t].get(key, {}))) for t, key, seeds in _plan())


def _values(cell: dict, key: str = "knn_accuracy") -> dict:
    return {s: r[key] for s, r in cell.items() if r.get(key) is not None}


def _effect_text(effect, with_signs: bool = True, scale: float = 100, digits: int = 2) -> str:
    if effect is None:
        return "—"
    text = effect.format(digits, scale)
    if effect.beyond_noise:
        text = f"**{text}**"
    return text + (f" ({effect.signs()})" if with_signs and effect.n >= 2 else "")


def accuracy_table(main: dict, key: str = "knn_accuracy") -> list[str]:
    """Rows B, columns the arms: mean ± std over seeds (points) and the seeds finished."""
    out = [md_row(["B", "steps", "lr"] + [ARM_NAME[a] for a in ARMS]), md_rule(3 + len(ARMS))]
    for b in BATCHES:
        cells, steps, lrs = [], set(), set()
        for arm in ARMS:
            cell = main.get((b, *arm), {})
            steps |= {r["steps"] for r in cell.values()}
            lrs |= {r["config"]["lr"] for r in cell.values()}
            vals = list(_values(cell, key).values())
            cells.append(f"{fmt_mean_std(vals, scale=100)} ({len(vals)}/"
                         f"{len(planned_seeds(arm))})"
                         if vals else "—")
        out.append(md_row([b, "/".join(map(str, sorted(steps))) or "—",
                           "/".join(f"{x:.2g}" for x in sorted(lrs)) or "—"] + cells))
    return out


def effects_table(main: dict, key: str = "knn_accuracy") -> tuple[list[str], dict]:
    """Rows B, columns the COMPARISONS: the paired effect (points) with its 95% interval and
    the sign count (bold: beyond noise); also returns ``{(comparison index, B): effect}``."""
    header = ["B"] + [f"{ARM_NAME[a]} − {ARM_NAME[base]}" for a, base in COMPARISONS]
    out, effects = [md_row(header), md_rule(len(header))], {}
    for b in BATCHES:
        row = [b]
        for i, (arm, base) in enumerate(COMPARISONS):
            effect = paired_effect(_values(main.get((b, *arm), {}), key),
                                   _values(main.get((b, *base), {}), key))
            effects[(i, b)] = effect
            row.append(_effect_text(effect))
        out.append(md_row(row))
    pooled, change = ["mean over B (t-interval over the B values)"], [
        f"effect at B = {BATCHES[0]} − effect at B = {BATCHES[-1]} (paired by seed)"]
    for i, (arm, base) in enumerate(COMPARISONS):
        pooled.append(_effect_text(pooled_effect({b: effects[(i, b)] for b in BATCHES})))
        per_seed = {b: _per_seed_diff(main.get((b, *arm), {}), main.get((b, *base), {}), key)
                    for b in (BATCHES[0], BATCHES[-1])}
        change.append(_effect_text(paired_effect(*per_seed.values())))
    return out + [md_row(pooled), md_row(change)], effects


def _per_seed_diff(arm: dict, base: dict, key: str) -> dict:
    """``{seed: arm - baseline}`` on the seeds both finished."""
    a, b = _values(arm, key), _values(base, key)
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def equal_steps_table(main: dict, equal: dict) -> list[str]:
    """The equal-steps view: each arm at B = 64 (B = 256's step count) against uniform + InfoNCE
    at B = 256 and against uniform + InfoNCE at B = 64 with the same steps (paired by seed)."""
    base256 = _values(main.get((256, "uniform", "infonce"), {}))
    base64 = _values(equal.get(("uniform", "infonce"), {}))
    out = [md_row(["arm at B = 64", "steps", "kNN acc (B = 64)", "− uniform + InfoNCE at B = 256",
                   "− uniform + InfoNCE at B = 64 (same steps)"]), md_rule(5)]
    for arm in ARMS:
        cell = equal.get(arm, {})
        vals = _values(cell)
        steps = "/".join(map(str, sorted({r["steps"] for r in cell.values()}))) or "—"
        vs64 = "(baseline)" if arm == ("uniform", "infonce") else _effect_text(
            paired_effect(vals, base64))
        out.append(md_row([ARM_NAME[arm], steps,
                           f"{fmt_mean_std(list(vals.values()), scale=100)} "
                           f"({len(vals)}/{len(PLANNED_SEEDS)})" if vals else "—",
                           _effect_text(paired_effect(vals, base256)), vs64]))
    b256 = main.get((256, "uniform", "infonce"), {})
    out.append(md_row(["(uniform + InfoNCE at B = 256)",
                       "/".join(map(str, sorted({r["steps"] for r in b256.values()}))) or "—",
                       f"{fmt_mean_std(list(base256.values()), scale=100)} "
                       f"({len(base256)}/{len(PLANNED_SEEDS)})" if base256 else "—",
                       "(baseline)", ""]))
    return out


def guided_table(main: dict) -> list[str]:
    """The guided arm per B in GUIDED_BATCHES: kNN accuracy, paired effects against proximity +
    InfoNCE (what the mask adds) and uniform + InfoNCE, and the reference-embedding hardness and
    false-negative rate of its batches."""
    out = [md_row(["B", "kNN acc (guided)", "− proximity + InfoNCE", "− uniform + InfoNCE",
                   "ref. hardness", "false-neg rate"]), md_rule(6)]
    for b in GUIDED_BATCHES:
        cell = main.get((b, *GUIDED), {})
        vals = _values(cell)
        rs = list(cell.values())
        out.append(md_row([
            b, f"{fmt_mean_std(list(vals.values()), scale=100)} ({len(vals)}/"
               f"{len(PLANNED_SEEDS)})" if vals else "—",
            _effect_text(paired_effect(vals, _values(main.get((b, "proximity", "infonce"), {})))),
            _effect_text(paired_effect(vals, _values(main.get((b, "uniform", "infonce"), {})))),
            mean_text([(r.get("reference_diagnostics") or {}).get("mean_hardness") for r in rs]),
            mean_text([r.get("mean_false_negative_rate") for r in rs])]))
    return out


def margin_lines(path: Path) -> list[str]:
    """The guided arm's margin selection (``scripts/vision_guide_margin.py``'s JSON) as a
    table: per margin, the share of in-batch pairs the mask drops and their same-class share."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    out = [f"Margin selection (`{rec['command']}`; rule: {rec['rule']}; chosen: "
           f"{rec['chosen_margin']}). Pairs of the proximity batches the guided mask drops, and "
           "which share of them are same-class pairs (precision) or of the same-class pairs "
           "it drops (recall):", "",
           md_row(["margin", "dropped share of in-batch pairs", "precision", "recall"]),
           md_rule(4)]
    for r in rec["margins"]:
        b = r["proximity_batches"]
        out.append(md_row([r["margin"], f"{b['dropped_share']:.4f}",
                           "—" if b["precision"] is None else f"{b['precision']:.3f}",
                           "—" if b["recall"] is None else f"{b['recall']:.3f}"]))
    return out + [""]


def diagnostics_table(main: dict) -> list[str]:
    """Per B and arm: hardness in the fixed reference embedding, near-duplicate rate there,
    the label false-negative rate, and the hardness in the run's own embedding (means over the
    seeds' per-step means)."""
    out = [md_row(["B", "arm", "seeds", "ref. hardness", "paired Δ ref. hardness vs uniform, "
                   "same loss", "ref. near-dup rate", "false-neg rate", "own-embedding hardness"]),
           md_rule(8)]

    def ref(r, k="mean_hardness"):
        return (r.get("reference_diagnostics") or {}).get(k)

    for b in BATCHES:
        for arm in ARMS:
            cell = main.get((b, *arm), {})
            if not cell:
                continue
            base = main.get((b, "uniform", arm[1]), {})
            delta = "(uniform)" if arm[0] == "uniform" else _effect_text(paired_effect(
                {s: ref(r) for s, r in cell.items() if ref(r) is not None},
                {s: ref(r) for s, r in base.items() if ref(r) is not None}),
                with_signs=False, scale=1, digits=3)
            rs = list(cell.values())
            near_dup = [ref(r, "mean_near_duplicate_rate") for r in rs]
            out.append(md_row([b, ARM_NAME[arm], len(rs), mean_text([ref(r) for r in rs]), delta,
                               mean_text(near_dup, "{:.4f}"),
                               mean_text([r.get("mean_false_negative_rate") for r in rs]),
                               mean_text([r.get("mean_hardness") for r in rs])]))
    return out


def pairing_table(runs: list[dict]) -> list[str]:
    """Per seed: how many distinct initial-weight / subset fingerprints its runs have (1 = paired)
    and, per B, how many augmentation-stream fingerprints (1 = paired)."""
    by_seed = defaultdict(list)
    for r in runs:
        if r.get("pairing"):
            by_seed[r["seed"]].append(r)
    out = [md_row(["seed", "runs", "initial weights", "train / test ids",
                   "augmentation streams per B (1 = same in every arm)"]), md_rule(5)]
    for seed, rs in sorted(by_seed.items()):
        init = len({r["pairing"]["initial_weights"] for r in rs})
        ids = len({(r["pairing"]["train_ids"], r["pairing"]["test_ids"]) for r in rs})
        aug = defaultdict(set)
        for r in rs:
            aug[(r["config"]["batch_size"], r["config"]["images"])].add(
                r["pairing"].get("augment_generator_end"))
        per_b = ", ".join(f"B {b} ({i} img): {len(v)}" for (b, i), v in sorted(aug.items()))
        out.append(md_row([seed, len(rs), f"{init} distinct", f"{ids} distinct", per_b]))
    return out


def answer(effects: dict, main: dict, equal: dict) -> list[str]:
    """The plain-language answer at the top: 'pending' while the planned runs are incomplete,
    and what the finished pairs say so far."""
    left = missing(main, equal)
    planned = planned_runs()
    head = ("**Answer: pending** — " if left else "**Answer** — ") + (
        f"{planned - left} of {planned} planned sweep runs finished." if left
        else f"all {planned} planned sweep runs finished.")
    lines = [head]
    for idx, (arm, base) in enumerate(COMPARISONS):
        if idx == 2:  # proximity + SSCL − uniform + InfoNCE: the sum of the two effects
            continue
        lines.append(comparison_line(effects, (arm, base)))
    guided = []
    for b in GUIDED_BATCHES:
        e = paired_effect(_values(main.get((b, *GUIDED), {})),
                          _values(main.get((b, "proximity", "infonce"), {})))
        guided.append(f"B = {b}: {noise_text(e)}")
    lines.append(f"- Guided false-negative masks ({ARM_NAME[GUIDED]} − proximity + InfoNCE): "
                 + "; ".join(guided) + ".")
    big = _values(main.get((256, "uniform", "infonce"), {}))
    steps = {}
    for arm in (("proximity", "infonce"), ("uniform", "infonce")):
        steps[arm] = paired_effect(_values(equal.get(arm, {})), big)
        lines.append(f"- Equal steps (both with B = 256's step count): {ARM_NAME[arm]} at B = 64 "
                     f"− uniform + InfoNCE at B = 256: {noise_text(steps[arm])}.")
    if not left:
        lines += ["", plain_answer(effects, steps[("proximity", "infonce")])]
    return lines


def figure(main: dict, effects: dict, path: Path) -> bool:
    """Left: kNN accuracy vs B per arm (mean over seeds, each seed a dot). Right: the paired
    effects vs B with their 95% intervals. False when nothing is drawn."""
    if not main:
        return False
    try:
        plt = pyplot()
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, arm in enumerate(ARMS):
        xs, ys = [], []
        for b in BATCHES:
            vals = list(_values(main.get((b, *arm), {})).values())
            if vals:
                xs.append(b * (1 + 0.03 * (k - 1.5)))
                ys.append(100 * statistics.fmean(vals))
                ax1.scatter([xs[-1]] * len(vals), [100 * v for v in vals], s=8, alpha=0.4,
                            color=f"C{k}")
        if xs:
            ax1.plot(xs, ys, marker="o", color=f"C{k}", label=ARM_NAME[arm])
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(BATCHES, [str(b) for b in BATCHES])
        ax.set_xlabel("batch size B (same images seen; lr = 1e-3 sqrt(B/256))")
    ax1.set_ylabel("kNN accuracy (%)")
    ax1.set_title("SimCLR CIFAR-10: kNN accuracy vs batch size")
    ax1.legend(fontsize=8)
    for i, (arm, base) in enumerate(COMPARISONS):
        xs, ys, lo, hi = [], [], [], []
        for b in BATCHES:
            e = effects.get((i, b))
            if e is not None:
                xs.append(b * (1 + 0.04 * (i - 1.5)))
                ys.append(100 * e.mean)
                lo.append(100 * (e.mean - e.lo) if e.n >= 2 else 0.0)
                hi.append(100 * (e.hi - e.mean) if e.n >= 2 else 0.0)
        if xs:
            ax2.errorbar(xs, ys, yerr=[lo, hi], marker="s", capsize=3, color=f"C{4 + i}",
                         label=f"{ARM_NAME[arm]} − {ARM_NAME[base]}")
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set_ylabel("paired Δ kNN accuracy (points), 95% CI")
    ax2.set_title("effect vs batch size (paired by seed)")
    ax2.legend(fontsize=7)
    save_figure(fig, path)
    return True


def per_run(runs: list[dict]) -> list[str]:
    """One row per sweep run: file, B, images, steps, lr, seed, accuracies, wall, machine, time,
    command."""
    out = [md_row(["file", "B", "images", "steps", "lr", "seed", "kNN", "linear", "wall",
                   "machine", "finished", "command"]), md_rule(12)]
    for r in sorted(runs, key=lambda r: r["_file"]):
        env, c = r.get("env", {}), r["config"]
        out.append(md_row([
            r["_file"], c["batch_size"], c["images"], r["steps"], f"{c['lr']:.3g}", r["seed"],
            f"{100 * r['knn_accuracy']:.2f}", f"{100 * r['linear_probe_accuracy']:.2f}",
            f"{wall_seconds(r) / 60:.1f} min{' (resumed)' if r.get('resumed') else ''}",
            f"{env.get('host', '?')} ({env.get('cpus', '?')} CPUs, torch {env.get('torch', '?')})",
            env.get("finished", "?"), f"`{r.get('command', '')}`"]))
    return out


def section(results: Path, page: Path) -> tuple[list[str], int, int]:
    """The sweep section's lines (answer first), the number of sweep runs and of planned runs
    missing. ``results``: the sweep folder (with ``reference/`` and ``timing/`` inside)."""
    results = Path(results)
    runs = load_sweep(results)
    timing = load_sweep(results / "timing")
    reference = load_sweep(results / "reference")
    main, equal, other, budget = classify(runs)
    eff_lines, effects = effects_table(main)
    lines = ["## Batch-size sweep (issue 21): do hard batches help a small batch?", ""]
    lines += answer(effects, main, equal) + [""]
    lines += ["Accuracies in % (mean ± std over seeds, `k/n`: k of the n planned seeds "
              "finished); every effect is the mean per-seed paired difference in points with its 95% t-interval, `+x.xx [lo, hi] "
              "(n = k, paired)`, then the sign count wins/losses/ties; **bold**: the interval "
              "excludes 0 (beyond noise). Runs: `scripts/vision_sweep.sh` (resumable; "
              f"`{results}`).", ""]
    lines += PROTOCOL.splitlines() + [""]
    lines += [f"### kNN accuracy per B and arm (main budget: {budget or '—'} images per run)", ""]
    lines += accuracy_table(main) + [""]
    lines += ["### Paired effects on kNN accuracy at the same B (points)", ""] + eff_lines + [""]
    lin_lines, _ = effects_table(main, "linear_probe_accuracy")
    lines += ["### Linear probe: accuracy and paired effects at the same B", ""]
    lines += accuracy_table(main, "linear_probe_accuracy") + [""] + lin_lines + [""]
    fig = page.parent / "figures" / "vision_batch_sweep.png"
    if figure(main, effects, fig):
        lines += [f"![kNN accuracy and paired effects vs batch size]({link(fig, page)})", "",
                  "Left: kNN accuracy vs B per arm (line: mean over seeds; dots: seeds). Right: "
                  "paired effects vs B with 95% intervals (no bar: one seed).", ""]
    lines += ["### Equal steps: can a hard batch of 64 match a uniform batch of 256?", "",
              "B = 64 runs with B = 256's step count (a quarter of the images) against "
              "uniform + InfoNCE at B = 256 (the main runs), paired by seed (same initial "
              "weights and data; the augmentation draws differ with B).", ""]
    lines += equal_steps_table(main, equal) + [""]
    lines += ["### Guided false-negative masks (proximity + InfoNCE + guided mask)", "",
              "The proximity arm with the reference encoder as guide (margin in the protocol), "
              "paired by seed with the unguided arms at the same B.", ""]
    lines += guided_table(main) + [""] + margin_lines(results / "guide_margin.json")
    lines += ["### Batch diagnostics in one fixed reference embedding", ""]
    if reference:
        r = reference[0]
        lines += [f"Reference encoder: `{r['_file']}` (uniform + InfoNCE, B "
                  f"{r['config']['batch_size']}, seed {r['seed']}, {r['steps']} steps; its kNN "
                  f"accuracy {100 * r['knn_accuracy']:.2f}); every run below measures its "
                  "batches in that encoder's projections of the training images "
                  "(`reference_diagnostics.file` in the run JSONs). Hardness = mean top-1 "
                  "in-batch cosine; near-dup rate = share of in-batch pairs with cosine above "
                  "the near-duplicate threshold; false-neg rate = share of same-class in-batch "
                  "pairs (labels); own-embedding hardness = the same top-1 cosine in the run's "
                  "current projections (not comparable across arms).", ""]
    lines += diagnostics_table(main) + [""]
    lines += ["### Pairing check (fingerprints stored by every run)", ""] + pairing_table(runs)
    lines += [""] + budget_lines(runs, main, equal, timing, budget)
    lines += ["### Every sweep run", ""] + per_run(runs + reference) + [""]
    if other:
        lines += ["Other budgets (not in the tables): " + ", ".join(r["_file"] for r in other), ""]
    return lines, len(runs), missing(main, equal)
