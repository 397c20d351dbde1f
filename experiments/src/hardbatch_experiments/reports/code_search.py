"""The tables of docs/results/code_search.md (fine-tuning MiniLM for code search, issue 32).

    python scripts/report_code_search.py [--results results/code_search] [--in-place | --out PAGE]

``results/code_search/pilots/*.json``: the 10-step timing pilots (``pilots/round1/``: the same,
first round); ``pilots/encoding__*.json``: the encoding pilot
(``python -m hardbatch_experiments.recipes.codesearch.pilot``); ``pilots/wave1/``: the first
wave of 150-step runs on the valid split, seed 0 (``scripts/codesearch_grid.sh`` with
``SEEDS=0 EVAL=valid``); ``confirm/``: the pre-registered confirmation on fresh seeds and the
test split; ``pilots/wave2/``: wave 2's pilot (issue 43: sentence-transformers' hardness
weighting, B3 as its authors run it), valid, seed 0. Every arm is compared with ``default`` (and the hard-batch arms with ``mined``) on
the seeds both finished: the mean per-seed difference with its 95% t-interval. ``epoch/``:
the full epoch (wave 2), compared with ``mined`` and, seed by seed, with the same arms' 150-step
runs in ``confirm/`` (:func:`length_table`). ``gpu/``: the
runs of ``scripts/gpu_evidence.sh`` (full fine-tuning, whole epochs, B = 64 and 256, on a GPU;
compared with ``default`` at the same batch size), ``gpu/timing/``: its timed steps.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from .page import md, mean, read_runs, report_main
from .paired import effect_text, paired_effect

NAME = {"default": "(a) default: sentence-transformers NO_DUPLICATES",
        "mined": "(b) default + 1 mined hard negative", "gcbs": "(c) GCBS batches",
        "knn": "(d) kNN batches", "proximity": "(e) proximity-graph batches",
        "cluster": "(f) cluster batches (TAS-B)", "community": "(g) community batches (B3)",
        "community+mined": "(h) community batches + mined negatives, texts kept apart",
        "uniform": "(i) hardbatch uniform (plumbing control)",
        "hardness": "(j) default + sentence-transformers' hardness weighting",
        "mined+hardness": "(k) mined + sentence-transformers' hardness weighting",
        "community+mined+hardness": "(l) community + mined + hardness weighting",
        "cluster+mined": "(m) cluster batches (TAS-B) + mined negatives",
        "zeroshot": "starting model, no training"}
METRICS = (("csn_mrr", "MRR (1,000 candidates)"), ("mrr@10", "MRR@10"), ("ndcg@10", "NDCG@10"),
           ("recall@1", "R@1"))


def arm_name(label: str) -> str:
    """The page's name of a run label: :data:`NAME` of the label, or of its arm (the part
    before ``@``) with the options after it (``hardness@ib10``: strength 10, in-batch mode)."""
    if label in NAME:
        return NAME[label]
    arm, _, options = label.partition("@")
    return f"{NAME[arm]} (@{options})" if arm in NAME else label


def _mining_key(r: dict) -> tuple | None:
    """What a run's mining computed, and where (its options and the device): runs with equal
    keys mined the same negatives."""
    m = r.get("mining")
    if not isinstance(m, dict) or not m.get("seconds"):
        return None
    return (tuple(m.get(k) for k in ("rows_in", "rows_out", "range_max", "relative_margin",
                                     "num_negatives", "sampling_strategy", "max_seq_length")),
            r.get("config", {}).get("device", "cpu"))


def least_mining(root: Path) -> dict[tuple, float]:
    """The least seconds measured for each mining computation (:func:`_mining_key`) among the
    code-search runs in ``root`` and its subfolders. The mining is computed once and cached;
    a run charges the cache's recorded seconds, which depend on the load of the machine when
    the cache was (re)built: the same computation was measured at 28 and at 110 minutes."""
    out: dict[tuple, float] = {}
    folders = [root, *sorted(p for p in Path(root).rglob("*") if p.is_dir())]
    for folder in folders:
        for r in read_runs(folder, lambda r: r.get("benchmark") == "codesearch"):
            key = _mining_key(r)
            if key is not None:
                out[key] = min(out.get(key, float("inf")), float(r["mining"]["seconds"]))
    return out


def _recharged(r: dict, mining: dict[tuple, float]) -> dict:
    """``r`` with its mining charged at the least seconds measured for the same computation
    (``time_s["mining"]`` and ``["charged_wall"]`` lowered by the difference)."""
    key = _mining_key(r)
    least = mining.get(key) if key is not None else None
    spent = r.get("time_s", {}).get("mining")
    if least is None or not spent or spent <= least:
        return r
    t = dict(r["time_s"], mining=least, charged_wall=r["time_s"]["charged_wall"] - spent + least)
    return dict(r, time_s=t)


def runs_by_arm(folder: Path, mining: dict[tuple, float] | None = None
                ) -> dict[str, dict[int, dict]]:
    """``{arm label: {seed: record}}`` of the code-search runs in ``folder``, in the order of
    their names (:func:`arm_name`: (a) to (m), then the starting model; other labels after,
    sorted). With ``mining`` (:func:`least_mining`), each run's mining is charged at the least
    seconds measured for the same computation."""
    by: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in read_runs(folder, lambda r: r.get("benchmark") == "codesearch"):
        by[r["label"]][r["seed"]] = _recharged(r, mining or {})
    return {a: by[a] for a in sorted(by, key=lambda a: (arm_name(a) == a, arm_name(a)))}


def metric_value(r: dict, split: str, key: str) -> float | None:
    """Metric ``key`` of run record ``r`` on ``split`` (None when the run did not score it)."""
    return r.get("metrics", {}).get(split, {}).get(key)


def paired_metric(arm: dict, base: dict, split: str, key: str):
    """The paired effect (:func:`~hardbatch_experiments.reports.paired.paired_effect`) of
    metric ``key`` on ``split`` between two arms' ``{seed: record}``, on the seeds both scored;
    None when they share none."""
    def values(recs: dict) -> dict:
        return {s: metric_value(r, split, key) for s, r in recs.items()
                if metric_value(r, split, key) is not None}
    return paired_effect(values(arm), values(base))


def _effect(arm: dict, base: dict, split: str, key: str, scale: float = 100.0) -> str:
    return effect_text(paired_metric(arm, base, split, key), 2, scale, signs=False,
                       missing="pending")


def arm_table(folder: Path, split: str,
              bases: tuple[str, ...] = ("default", "mined"),
              mining: dict[tuple, float] | None = None) -> str:
    """Per arm: seeds, the metrics (x 100, mean over seeds), MRR@10 against each arm of
    ``bases`` (paired over the seeds both finished, x 100; "pending" before a shared seed),
    steps, wall and CPU seconds per training step (medians per run) and the wall time with its
    parts (minutes; mining charged as :func:`runs_by_arm` says)."""
    by = runs_by_arm(folder, mining)
    if not by:
        return "(no runs yet)"
    rows = []
    for arm, rs in by.items():
        recs = list(rs.values())
        row = [arm_name(arm), ",".join(map(str, sorted(rs)))]
        for key, _ in METRICS:
            vals = [metric_value(r, split, key) for r in recs
                    if metric_value(r, split, key) is not None]
            row.append(f"{100 * sum(vals) / len(vals):.2f}" if vals else "—")
        for base in bases:
            row.append("—" if arm in (base, "zeroshot") else
                       _effect(rs, by.get(base, {}), split, "mrr@10"))
        t = [r["time_s"] for r in recs]
        row.append(str(recs[0]["steps"]))
        for key in ("seconds_per_step", "cpu_seconds_per_step"):
            vals = [r[key] for r in recs if r.get(key)]
            row.append(f"{sum(vals) / len(vals):.2f}" if vals else "—")
        row += [f"{sum(x[k] for x in t) / len(t) / 60:.1f}"
                for k in ("charged_wall", "mining", "encoding_refresh", "training", "evaluation")]
        rows.append(row)
    return md(["arm", "seeds", *(name for _, name in METRICS),
               *(f"MRR@10 vs {base}" for base in bases), "steps", "s/step", "CPU s/step",
               "wall (min, charged)", "mining",
               "encoding + refresh", "training", "evaluation"], rows)


#: Wave 2's new arms, as run labels (the pilot's strengths in them).
WAVE2_ARMS = ("hardness@ib10", "mined+hardness@all10", "community+mined+hardness@all10",
              "cluster+mined")
#: Wave 2's comparisons (docs/results/code_search.md, "Wave 2"): (arm, base arm, why). The arms
#: are run labels of the confirmation folder; the pre-registered ones first, then those that
#: answer the issue's question of whether the one-flag alternative gives what a sampler gives.
WAVE2_CONTRASTS = (
    *((arm, base, "pre-registered") for arm in WAVE2_ARMS
      for base in ("default", "mined", "community+mined")),
    ("hardness@ib10", "community", "the flag against a sampler, no mining"),
    ("hardness@ib10", "cluster", "the flag against a sampler, no mining"),
    ("community+mined+hardness@all10", "mined+hardness@all10",
     "a sampler on top of the flag, over mining"),
)


def contrast_table(folder: Path, split: str, contrasts=WAVE2_CONTRASTS,
                   mining: dict[tuple, float] | None = None) -> str:
    """One row per (arm, base): the paired MRR@10 effect (x 100) on the seeds both finished,
    and each arm's charged wall minutes per run (mean over its seeds; mining and encoding at
    their cost, mining as :func:`runs_by_arm` charges it); "pending" before a shared seed."""
    by = runs_by_arm(folder, mining)
    if not any(arm in by for arm, _, _ in contrasts):
        return "(no runs yet)"

    def minutes(label: str) -> str:
        return mean([r["time_s"]["charged_wall"] / 60 for r in by.get(label, {}).values()],
                    "{:.1f}")

    rows = [[arm_name(arm), arm_name(base), why,
             _effect(by.get(arm, {}), by.get(base, {}), split, "mrr@10"), minutes(arm),
             minutes(base)] for arm, base, why in contrasts]
    return md(["arm", "against", "why", f"MRR@10 ({split}) difference x 100",
               "arm: wall (min, charged)", "base: wall (min, charged)"], rows)


def length_table(short: Path, long: Path, split: str, arm: str = "community+mined",
                 base: str = "mined") -> str:
    """Training length: ``arm`` against ``base`` after the short runs (``short``: 150 steps, on
    all their seeds and on the long runs' seeds only) and after the long ones (``long``: one
    epoch), and each of the two arms' long run against its short run on the same seeds; MRR@10
    on ``split``, paired, x 100 ("pending" before a shared seed)."""
    s_by, l_by = runs_by_arm(short), runs_by_arm(long)
    if not (l_by.get(arm) or l_by.get(base)):
        return "(no runs yet)"
    seeds = sorted(set(l_by.get(arm, {})) & set(l_by.get(base, {})))

    def only(recs: dict) -> dict:
        return {k: v for k, v in recs.items() if k in seeds}

    def seeds_of(*arms: dict) -> str:
        return ",".join(map(str, sorted(set.intersection(*(set(a) for a in arms))))) or "—"

    a, b = arm_name(arm), arm_name(base)
    s_arm, s_base, l_arm, l_base = (s_by.get(arm, {}), s_by.get(base, {}), l_by.get(arm, {}),
                                    l_by.get(base, {}))
    rows = [[f"{a} vs {b}", "150 steps", seeds_of(s_arm, s_base),
             _effect(s_arm, s_base, split, "mrr@10")],
            [f"{a} vs {b}", "150 steps, the epoch's seeds", seeds_of(only(s_arm), only(s_base)),
             _effect(only(s_arm), only(s_base), split, "mrr@10")],
            [f"{a} vs {b}", "one epoch", seeds_of(l_arm, l_base),
             _effect(l_arm, l_base, split, "mrr@10")],
            *([f"{arm_name(x)}: one epoch vs 150 steps", "both", seeds_of(l_by.get(x, {}),
               s_by.get(x, {})), _effect(l_by.get(x, {}), s_by.get(x, {}), split, "mrr@10")]
              for x in (base, arm)),
            [f"{a} vs {b}: one epoch's effect minus 150 steps' (per seed)", "both",
             seeds_of(l_arm, l_base, s_arm, s_base), effect_text(
                 paired_effect(_gaps(l_arm, l_base, split), _gaps(s_arm, s_base, split)), 2,
                 100.0, signs=False, missing="pending")]]
    return md(["comparison", "training", "seeds", f"MRR@10 ({split}) difference x 100"], rows)


def _gaps(arm: dict, base: dict, split: str) -> dict[int, float]:
    """``{seed: arm's MRR@10 - base's}`` on ``split``, over the seeds both scored."""
    return {k: metric_value(arm[k], split, "mrr@10") - metric_value(base[k], split, "mrr@10")
            for k in set(arm) & set(base) if metric_value(arm[k], split, "mrr@10") is not None
            and metric_value(base[k], split, "mrr@10") is not None}


def package_table(folder: Path, split: str) -> str:
    """Per package of ``split`` (pairs, distinct queries): default's MRR@10 (x 100, mean over
    its seeds) and every other trained arm's MRR@10 against default on that package's queries
    (paired over the seeds both finished, x 100)."""
    by = {a: rs for a, rs in runs_by_arm(folder).items() if a != "zeroshot"}
    base = by.get("default", {})
    if not base:
        return "(no default runs yet)"
    first = next(iter(base.values()))["metrics"][split]["per_package"]
    arms = [a for a in by if a != "default"]

    def per_package(recs: dict, package: str) -> dict:
        return {s: {"metrics": {split: r["metrics"][split]["per_package"][package]}}
                for s, r in recs.items() if package in r["metrics"].get(split, {}).get(
                    "per_package", {})}

    rows = []
    for package in sorted(first, key=lambda p: (-first[p]["pairs"], p)):
        b = per_package(base, package)
        vals = [metric_value(r, split, "mrr@10") for r in b.values()]
        row = [package, first[package]["pairs"], first[package]["queries"],
               f"{100 * sum(vals) / len(vals):.2f}"]
        row += [_effect(per_package(by[a], package), b, split, "mrr@10") for a in arms]
        rows.append(row)
    return md(["package", "pairs", "queries", "default MRR@10",
               *(f"{a} vs default" for a in arms)], rows)


def timing_table(folder: Path) -> str:
    """The 10-step timing pilots: seconds per training step by code length and frozen layers,
    and the encoding pilot (the starting model over the training set)."""
    rows = []
    for r in read_runs(folder, lambda r: r.get("benchmark") == "codesearch"):
        c = r["config"]
        rows.append([r["arm"], c["max_seq_length_code"], c["freeze_layers"],
                     f"{r['seconds_per_step']:.1f}", f"{r['cpu_seconds_per_step']:.1f}",
                     c["threads"], f"{r['env']['load_average'][0]:.1f}"])
    for r in read_runs(folder, lambda r: r.get("pilot", "").startswith("encoding")):
        for part in ("queries", "codes"):
            p = r[part]
            rows.append([f"encode {p['texts']:,} {part}", p["max_length"], "—",
                         f"{p['seconds']:.0f} (all)", f"{p['cpu_seconds']:.0f} (all)",
                         r["threads"], f"{p['load_average'][0]:.1f}"])
    return md(["what", "code tokens", "frozen layers", "s/step (wall)", "CPU s/step",
               "threads", "load average"], rows) if rows else "(no pilots)"


#: Wave 2's pilot (issue 43): each arm's base, whose wave-1 run (valid, seed 0) it is read
#: against; the label's ``@...`` part names the configuration (``ib3``: in-batch hardness,
#: strength 3; ``all5``: all negatives, strength 5; ``authors``: B3's authors' settings).
PILOT2_BASE = {"hardness": "default", "mined+hardness": "mined", "community": "community",
               "community+mined": "community+mined"}


def pilot2_table(wave1: Path, wave2: Path, split: str = "valid",
                 mining: dict[tuple, float] | None = None) -> str:
    """Wave 2's pilot (one seed, so no interval): every run's MRR@10 (x 100) and its
    difference from its base arm on the same seed (wave 1's run, or for ``community+mined``
    hardbatch's own run of this wave), with the charged wall time. The choice it feeds is
    written on the page before the confirmation runs."""
    first, second = runs_by_arm(wave1, mining), runs_by_arm(wave2, mining)
    rows = []
    for label, rs in second.items():
        arm = label.split("@")[0]
        base_label = PILOT2_BASE.get(arm)
        base = second.get(base_label) if base_label in second and base_label != label else \
            first.get(base_label, {})
        for seed, r in sorted(rs.items()):
            value = metric_value(r, split, "mrr@10")
            b = base.get(seed) if base else None
            ref = metric_value(b, split, "mrr@10") if b else None
            rows.append([label, seed, f"{100 * value:.2f}" if value is not None else "—",
                         base_label or "—", f"{100 * ref:.2f}" if ref is not None else "—",
                         f"{100 * (value - ref):+.2f}" if None not in (value, ref) else "—",
                         f"{r['time_s']['charged_wall'] / 60:.1f}"])
    return md(["run", "seed", f"MRR@10 ({split})", "base arm", "base MRR@10", "difference",
               "wall (min, charged)"], rows) if rows else "(no runs yet)"


def _device(r: dict) -> str:
    return r.get("env", {}).get("cuda") or r.get("config", {}).get("device", "cpu")


def gpu_table(folder: Path, split: str = "test") -> str:
    """The runs of scripts/gpu_evidence.sh, per (arm, batch size): seeds, epochs, the metrics
    (x 100, mean over seeds), MRR@10 against default at the same batch size (paired, x 100),
    steps, seconds per step (median per run), peak GPU memory, wall minutes, the device."""
    groups: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in read_runs(folder, lambda r: r.get("benchmark") == "codesearch"):
        b = None if r["arm"] == "zeroshot" else r["config"]["batch_size"]
        groups[(r["label"], b)][r["seed"]] = r
    if not groups:
        return "(no GPU runs yet: `bash scripts/gpu_evidence.sh` on a CUDA machine)"
    rows = []
    for (label, b), rs in sorted(groups.items(), key=lambda g: (
            g[0][1] or 0, arm_name(g[0][0]) == g[0][0], arm_name(g[0][0]))):
        recs = list(rs.values())
        row = [arm_name(label), b or "—", ",".join(map(str, sorted(rs))),
               "—" if b is None else f"{recs[0]['config']['epochs'] or 1:g}"
               if not recs[0]["config"]["steps"] else f"{recs[0]['steps']} steps"]
        for key, _ in METRICS:
            row.append(mean([100 * v for r in recs
                             if (v := metric_value(r, split, key)) is not None], "{:.2f}"))
        row.append("—" if b is None or label == "default" else
                   _effect(rs, groups.get(("default", b), {}), split, "mrr@10"))
        row += [recs[0]["steps"], mean([r.get("seconds_per_step") for r in recs], "{:.3f}"),
                mean([(r.get("gpu") or {}).get("peak_memory_gib") for r in recs], "{:.1f}"),
                mean([r["time_s"]["wall"] / 60 for r in recs], "{:.1f}"),
                " / ".join(sorted({_device(r) for r in recs}))]
        rows.append(row)
    return md(["arm", "B", "seeds", "epochs", *(name for _, name in METRICS),
               "MRR@10 vs default (same B)", "steps", "s/step", "peak GPU GiB", "wall (min)",
               "device"], rows)


def gpu_step_table(folder: Path) -> str:
    """The timed steps of scripts/gpu_evidence.sh (``gpu/timing/``), per device, precision,
    batch size and arm: the median seconds of the timed steps (after the untimed warm-up), that
    cost over default's at the same batch size, and the peak GPU memory."""
    rows = {}
    for r in read_runs(folder, lambda r: r.get("benchmark") == "codesearch" and "timing" in r):
        step_s = r["trace"]["step_s"][r["timing"]["warmup_steps"]:]
        rows[(_device(r), r["config"]["precision"], r["config"]["batch_size"], r["label"])] = \
            (statistics.median(step_s) if step_s else None, len(step_s), r.get("gpu") or {})
    if not rows:
        return "(no GPU timings yet: `bash scripts/gpu_evidence.sh` on a CUDA machine)"
    out = []
    for (device, precision, b, label), (step, n, gpu) in sorted(rows.items()):
        base = rows.get((device, precision, b, "default"), (None,))[0]
        out.append([device, precision, b, arm_name(label), n,
                    "—" if step is None else f"{step:.4f}",
                    f"{step / base:.2f}x" if step and base else "—",
                    mean([gpu.get("peak_memory_gib")], "{:.1f}")])
    return md(["device", "precision", "B", "arm", "timed steps", "s/step (median)",
               "vs default", "peak GPU GiB"], out)


def tables(results: Path) -> dict[str, str]:
    """Every table of the page, by its block key."""
    mining = least_mining(results)
    return {"timing": timing_table(results / "pilots"),
            "wave1": arm_table(results / "pilots" / "wave1", "valid", mining=mining),
            "wave2": pilot2_table(results / "pilots" / "wave1", results / "pilots" / "wave2",
                                  mining=mining),
            "confirm": arm_table(results / "confirm", "test",
                                 ("default", "mined", "community+mined"), mining),
            "epoch": arm_table(results / "epoch", "test", ("mined",), mining),
            "epoch_length": length_table(results / "confirm", results / "epoch", "test"),
            "wave2_confirm": contrast_table(results / "confirm", "test", mining=mining),
            "packages": package_table(results / "confirm", "test"),
            "gpu": gpu_table(results / "gpu"),
            "gpu_steps": gpu_step_table(results / "gpu" / "timing")}


def figures(results: Path, fig_dir: Path) -> int:
    """The page has no figures yet."""
    return 0


def main(argv: list[str] | None = None) -> int:
    return report_main("code_search", tables, figures, argv)
