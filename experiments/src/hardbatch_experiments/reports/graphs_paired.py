"""Issue 18 on the graphs page: the exploration (choice of one proximity configuration by a
rule written down first), its pre-registration, and the confirmatory paired comparison.

Folders (beside the earlier grid's ``results/graphs``): ``results/graphs/explore`` (IMDB-B and
PROTEINS, seeds 100-104) and ``results/graphs/confirm`` (six datasets, seeds 0-9);
``results/graphs/preregistration.json`` holds the rule (written before the exploration's
results were read) and, once chosen, the configuration. Every effect is the mean per-seed
difference with its 95% t-interval (:mod:`.paired`); partial results are shown as they are,
with the seeds done.

    python scripts/report_graphs.py --explore results/graphs/explore           # the table
    python scripts/report_graphs.py --explore results/graphs/explore --choose  # + record it
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from .common import md_row, md_rule, read_json
from .graphs_runs import DATASETS, short
from .paired import paired_effect, pooled_effect

__all__ = ["EXPLORE_DATASETS", "PREREG", "choose", "confirm_lines", "explore_lines",
           "flags_of", "load_arms", "options_away", "verdict_lines"]

PREREG = Path("results/graphs/preregistration.json")
EXPLORE_DATASETS = ("IMDB-BINARY", "PROTEINS")
CONFIRM_SEEDS = 10
TIE = 0.10  # points: configurations this close to the best count as tied (the rule)
_DEFAULTS = {"sampler_space": "readout", "warmup_epochs": 0, "alpha_schedule": "linear",
             "epoch_mode": "steps"}


def load_arms(folder: Path) -> dict:
    """``{(dataset, arm): {seed: record}}`` of the InfoNCE runs in ``folder``; ``arm`` is
    ``"uniform"`` or ``"proximity"`` + its tag (``"proximity"`` alone for the defaults)."""
    arms: dict = defaultdict(dict)
    if not folder.is_dir():
        return arms
    for _, rec in read_json(folder):
        if not isinstance(rec, dict) or "accuracy" not in rec or rec.get("loss") != "infonce":
            continue
        arm = rec["sampler"] + (f":{rec['tag']}" if rec.get("tag") else "")
        arms[(rec["dataset"], arm)][rec["seed"]] = rec
    return arms


def _options(rec: dict) -> dict:
    return {**_DEFAULTS, **(rec["config"].get("sampler_options") or {})}


def flags_of(rec: dict) -> str:
    """The command-line flags that reproduce a run's sampler options."""
    o = _options(rec)
    return (f"--sampler-space {o['sampler_space']} --warmup-epochs {o['warmup_epochs']} "
            f"--alpha-schedule {o['alpha_schedule']} --epoch-mode {o['epoch_mode']}")


def options_away(rec: dict) -> int:
    """How many of the four options differ from the recipe's defaults."""
    o = _options(rec)
    return sum(o[k] != v for k, v in _DEFAULTS.items())


def _acc(recs: dict) -> dict:
    return {seed: 100 * r["accuracy"] for seed, r in recs.items()}


def _scores(arms: dict) -> list[dict]:
    """Per proximity configuration: its per-dataset effects vs uniform and the score S."""
    rows = []
    for arm in sorted({a for (_, a) in arms if a != "uniform"}):
        eff = {d: paired_effect(_acc(arms.get((d, arm), {})), _acc(arms.get((d, "uniform"), {})))
               for d in EXPLORE_DATASETS}
        done = [e for e in eff.values() if e is not None]
        pairs = sum(e.n for e in done)
        example = next(iter(next(arms[(d, arm)] for d in EXPLORE_DATASETS
                                 if arms.get((d, arm))).values()))
        score = statistics.fmean(e.mean for e in done) if len(done) == len(eff) else None
        rows.append({"arm": arm, "effects": eff, "pairs": pairs, "score": score,
                     "flags": flags_of(example), "away": options_away(example),
                     "complete": pairs == 5 * len(EXPLORE_DATASETS)})
    return rows


def choose(rows: list[dict]) -> dict | None:
    """The pre-registered rule: the highest score S among complete configurations; within
    :data:`TIE` points of the best, the fewest options away from the defaults, then the
    higher S. None while no configuration is complete."""
    ok = [r for r in rows if r["complete"] and r["score"] is not None]
    if not ok:
        return None
    best = max(r["score"] for r in ok)
    tied = [r for r in ok if r["score"] >= best - TIE - 1e-12]
    return min(tied, key=lambda r: (r["away"], -r["score"]))


def explore_lines(folder: Path) -> tuple[list[str], dict | None]:
    """The exploration table (one row per configuration) and the configuration the rule picks
    (None while incomplete)."""
    arms = load_arms(folder)
    rows = sorted(_scores(arms), key=lambda r: -(r["score"] if r["score"] is not None
                                                  else -1e9))
    base = {d: len(arms.get((d, "uniform"), {})) for d in EXPLORE_DATASETS}
    lines = [md_row(["configuration (proximity)", "flags",
                     *(f"{short(d)}: proximity - uniform" for d in EXPLORE_DATASETS),
                     "signs (+/-/=)", "score S"]), md_rule(5 + len(EXPLORE_DATASETS) - 1)]
    for r in rows:
        effs = [r["effects"][d] for d in EXPLORE_DATASETS]
        signs = " · ".join(e.signs() if e else "—" for e in effs)
        lines.append(md_row([f"`{r['arm'].split(':', 1)[-1] if ':' in r['arm'] else 'default'}`",
                             f"`{r['flags']}`",
                             *(e.format(2) if e else "—" for e in effs), signs,
                             f"{r['score']:+.2f}" if r["score"] is not None else "—"]))
    chosen = choose(rows)
    scored = [r for r in rows if r["score"] is not None]
    beyond = [f"{r['arm'].split(':', 1)[-1] if ':' in r['arm'] else 'default'} on {short(d)} "
              f"({e.mean:+.2f})" for r in rows for d, e in r["effects"].items()
              if e and e.beyond_noise]
    note = (f"Uniform runs: {', '.join(f'{short(d)} {n}/5' for d, n in base.items())}. "
            f"Configurations with S > 0: {sum(r['score'] > 0 for r in scored)} of "
            f"{len(scored)}; per-dataset differences beyond noise: "
            f"{', '.join(beyond) or 'none'}. "
            f"{sum(r['complete'] for r in rows)} of {len(rows)} configurations complete.")
    return lines + ["", note], chosen


def record_choice(chosen: dict, prereg: Path = PREREG) -> dict:
    """Write ``chosen`` into the pre-registration file, once (an existing choice is kept)."""
    pre = json.loads(prereg.read_text())
    if pre.get("chosen"):
        return pre
    eff = chosen["effects"]
    pre["chosen"] = {
        "arm": chosen["arm"], "flags": chosen["flags"], "score": chosen["score"],
        "effects": {d: eff[d].format(2) for d in EXPLORE_DATASETS},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reason": (f"highest score S = {chosen['score']:+.2f} points (mean of the per-dataset "
                   "paired differences vs uniform over seeds 100-104) among the complete "
                   f"configurations; tie margin {TIE} points, fewest options away from the "
                   "defaults first")}
    prereg.write_text(json.dumps(pre, indent=1) + "\n")
    return pre


def _confirm_effects(arms: dict, arm: str) -> dict:
    return {d: paired_effect(_acc(arms.get((d, arm), {})), _acc(arms.get((d, "uniform"), {})))
            for d in DATASETS}


def confirm_lines(folder: Path, pre: dict | None) -> tuple[list[str], dict]:
    """The confirmatory table (per dataset: the paired effect, signs, seeds) and its summary:
    ``{"pooled": PairedEffect | None, "pairs": int, "min_seeds": int, "arm": str | None}``."""
    chosen = (pre or {}).get("chosen")
    if not chosen:
        return ["Not started: no configuration chosen yet."], {"pooled": None, "pairs": 0,
                                                              "min_seeds": 0, "arm": None}
    arms = load_arms(folder)
    effects = _confirm_effects(arms, chosen["arm"])
    lines = [md_row(["dataset", "uniform (mean, seeds)", "chosen (mean, seeds)",
                     "chosen - uniform, points", "signs (+/-/=)", "beyond noise"]),
             md_rule(6)]
    for d in DATASETS:
        u, c, e = _acc(arms.get((d, "uniform"), {})), _acc(arms.get((d, chosen["arm"]), {})), \
            effects[d]
        lines.append(md_row([
            short(d), f"{statistics.fmean(u.values()):.2f} ({len(u)})" if u else "—",
            f"{statistics.fmean(c.values()):.2f} ({len(c)})" if c else "—",
            e.format(2) if e else "—", e.signs() if e else "—",
            ("yes" if e.beyond_noise else "no") if e and e.n >= 2 else "—"]))
    pooled = pooled_effect(effects)
    lines += ["", "Pooled over datasets (mean of the per-dataset differences, t-interval over "
              "datasets): " + (f"{pooled.format(2)}, datasets above / below: "
                               f"{pooled.signs()}" if pooled else "no pairs yet") + "."]
    done = [e.n for e in effects.values() if e]
    return lines, {"pooled": pooled, "pairs": sum(done), "arm": chosen["arm"],
                   "min_seeds": min(done) if len(done) == len(DATASETS) else 0,
                   "effects": effects}


def verdict_lines(summary: dict) -> list[str]:
    """The plain-language verdict at the top of the page."""
    pooled, k = summary["pooled"], summary["min_seeds"]
    if summary["arm"] is None:
        return ["**Verdict: pending** (exploration running; no configuration chosen yet)."]
    if pooled is None:
        return ["**Verdict: pending: 0 of 10 seeds** (confirmation not started)."]
    beyond = [short(d) for d, e in summary["effects"].items() if e and e.beyond_noise]
    per = (f"; per dataset beyond noise: {', '.join(beyond)}" if beyond else
           "; no single dataset beyond noise")
    if k < CONFIRM_SEEDS:
        head = (f"**Verdict: pending: {k} of {CONFIRM_SEEDS} seeds** (seeds complete on every "
                f"dataset; {summary['pairs']} pairs so far).")
        if pooled.n < 2:
            return [head + " Too few datasets with pairs for a pooled interval yet."]
        return [head + f" So far, pooled over {pooled.n} datasets: {pooled.format(2)} accuracy "
                f"points{per}."]
    if pooled.beyond_noise:
        word = "helps" if pooled.mean > 0 else "hurts"
        text = (f"the pre-registered BatchSampler configuration {word} GraphCL on average "
                f"({pooled.format(2)} accuracy points, pooled over datasets)")
    else:
        text = ("no effect of the pre-registered BatchSampler configuration on GraphCL "
                f"beyond noise: pooled difference {pooled.format(2)} accuracy points, "
                "an interval that includes 0")
    helps = pooled.beyond_noise and pooled.mean > 0
    plain = (f"In plain words: BatchSampler batches did better than uniform batches on "
             f"{pooled.wins} of {pooled.n} datasets and worse on {pooled.losses}; on average they "
             f"changed the accuracy by {pooled.mean:+.2f} points (95% interval {pooled.lo:+.2f} "
             f"to {pooled.hi:+.2f}). " + (
                 "Use the pre-registered configuration for GraphCL." if helps else
                 "For GraphCL, use uniform batches."))
    return [f"**Verdict ({summary['pairs']} pairs, {k} seeds on every dataset):** {text}{per}.",
            "", plain]


def times_lines(explore: Path, confirm: Path, pre: dict | None) -> list[str]:
    """Per-run commands and measured wall times (mean, min-max) per dataset and arm."""
    flags = ((pre or {}).get("chosen") or {}).get("flags", "<chosen flags>")
    lines = ["One run = one (dataset, sampler, seed); the confirmatory pair of seed S on "
             "dataset D is", "", "```bash",
             f"hardbatch bench graphcl --dataset D --sampler uniform,proximity --loss infonce "
             f"--seed-list S --threads 1 --out results/graphs/confirm {flags}", "```", "",
             "Wall time per run (seconds; single torch thread; measured while other jobs "
             "shared the 2 cores, so inflated by contention):", "",
             md_row(["stage", "dataset", "arm", "runs", "wall mean", "wall min-max",
                     "CPU mean"]), md_rule(7)]
    for stage, folder in (("exploration", explore), ("confirmation", confirm)):
        arms = load_arms(folder)
        for d in DATASETS:
            for arm in sorted({a for (dd, a) in arms if dd == d}):
                recs = list(arms[(d, arm)].values())
                walls = [r["wall_time_s"] for r in recs]
                cpu = [r["cpu_time_s"] for r in recs if "cpu_time_s" in r]
                lines.append(md_row([stage, short(d), f"`{arm}`", len(recs),
                                     f"{statistics.fmean(walls):.0f}",
                                     f"{min(walls):.0f}-{max(walls):.0f}",
                                     f"{statistics.fmean(cpu):.0f}" if cpu else "—"]))
    return lines + [""]


def issue18_lines(results: Path) -> list[str]:
    """The page's top: verdict, confirmatory result, pre-registration, exploration, times."""
    prereg = results / "preregistration.json"
    pre = json.loads(prereg.read_text()) if prereg.exists() else None
    explore, confirm = results / "explore", results / "confirm"
    c_lines, summary = confirm_lines(confirm, pre)
    x_lines, picked = explore_lines(explore)
    chosen = (pre or {}).get("chosen")
    lines = [*verdict_lines(summary), "",
             "Question (issue 18): does BatchSampler's proximity-graph sampler improve GraphCL "
             "(InfoNCE) over uniform batches by more than seed noise? Answered by a paired, "
             "pre-registered comparison: one sampler configuration chosen on exploration seeds "
             "and datasets, then uniform vs that configuration on six TU datasets, seeds 0-9, "
             "seed k of both arms sharing the initial weights, the augmentation generator's "
             "seed and the SVM's CV folds. Effects are `mean [95% t-interval] (n, paired)` of "
             "the per-seed accuracy differences (points); beyond noise = the interval "
             "excludes 0.", "",
             "## Confirmatory comparison: uniform vs the pre-registered configuration", "",
             (f"Configuration: `{chosen['flags']}` (proximity sampler, tag "
              f"`{chosen['arm'].split(':', 1)[-1]}`); runs in `results/graphs/confirm/`."
              if chosen else "No configuration chosen yet."), "", *c_lines, "",
             "## Pre-registration", ""]
    if pre:
        lines += [f"Rule, written {pre['rule_written_at']} (before any exploration result "
                  f"was read): {pre['rule']}", ""]
        lines += ([f"Chosen {chosen['written_at']}, before any confirmatory run: "
                   f"`{chosen['flags']}`; reason: {chosen['reason']}; exploration effects "
                   + ", ".join(f"{short(d)} {v}" for d, v in chosen["effects"].items()) + "."]
                  if chosen else ["Not chosen yet (exploration incomplete)."]) + [""]
    lines += ["## Exploration: IMDB-B and PROTEINS, seeds 100-104", "",
              "Each proximity configuration against the uniform run of the same seed "
              "(`results/graphs/explore/`, `scripts/graph_explore.sh`); score S = mean of the "
              "two per-dataset differences. Sorted by S. Options: `--sampler-space` (the "
              "embedding the graph is built from: readout h, projection z, or the readout "
              "minus the bank's mean row at each refresh), `--warmup-epochs` (uniform epochs "
              "first, then the bank is re-encoded by the current model), `--alpha-schedule "
              "per-epoch` (max(0.05, 0.2 - 0.02 epoch), the authors' code), `--epoch-mode "
              "coverage` (walk until every graph is covered, the run capped at the uniform "
              "step budget). Exploration intervals are over 5 seeds and 12 configurations were "
              "compared: the best of them is optimistically biased, hence the confirmation.",
              "", *x_lines, ""]
    if picked is not None and not chosen:
        lines += [f"The rule picks `{picked['flags']}` (not yet recorded: "
                  "`python scripts/report_graphs.py --explore results/graphs/explore "
                  "--choose`).", ""]
    lines += ["## Per-run commands and times", "", *times_lines(explore, confirm, pre),
              "## Protocol notes", "", *PROTOCOL]
    return lines


PROTOCOL = [
    "- Pairing. Seed k fixes, in both arms: the initial weights (`torch.manual_seed(k)` before "
    "the model is built), the augmentation generator's seed (k + 7919; its draws depend on the "
    "batches' composition, so once the batches differ the two arms see the same stream "
    "seeding, not the same views), the SVM's outer and inner CV folds (`random_state=k`) and "
    "the uniform sampler's permutations (a function of seed and epoch). Test: a proximity run "
    "whose whole training is warm-up reproduces the uniform run bit for bit "
    "(`tests/hardbatch_experiments/test_graphcl_sampling.py`).",
    "- The uniform arm ignores the four sampler options (its runs carry no option tag), so one "
    "uniform run per seed is the baseline of every configuration.",
    "- The earlier grid's uniform runs (seeds 0-4 under `results/graphs/`) are not reused: most "
    "were computed before the GIN aggregation became a CSR product, and today's code does not "
    "reproduce them bit for bit (MUTAG seed 0: 87.75 now, 87.78 stored; same protocol, other "
    "floating-point rounding). Every confirmatory pair is computed by one code version.",
    "- Centred readout: the bank stores the training-mode readout h; each graph build reads "
    "the N bank rows minus their mean row (the mean of the embeddings written over roughly the "
    "last epoch), then L2-normalises as usual. Projection: the bank stores z = head(h) "
    "(detached), the vectors the loss compares; its initial encoding is head(readout) of the "
    "untrained encoder.",
    "- Warm-up w: epochs 0 .. w-1 draw the uniform arm's batches; at epoch w the bank is "
    "re-encoded by the current model (eval mode, as the initial encoding) and the proximity "
    "sampler starts (its restart schedule counts the warm-up epochs).",
    "- Coverage epochs: an epoch walks from not-yet-covered graphs until every graph was in a "
    "batch; the run stops after epochs x ceil(N/B) batches, the uniform run's count; graph "
    "refreshes every t batches drawn. Recorded per run: `epoch_steps`, `epoch_coverage`.",
    "",
]
