"""``hardbatch bench graphcl``: the options, and the grid of (dataset, sampler, loss, seed)
runs (finished runs are skipped; a per-run lock keeps parallel workers apart)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from hardbatch.cli_types import positive_float, positive_int, temperature
from hardbatch.registry import parse_names

from ... import runs
from .run import (
    CLI_DEFAULTS,
    DEFAULTS,
    aug_style,
    canonical_dataset,
    hyper_for,
    result_path,
    run_one,
    run_tag,
)
from .sampling import ALPHA_SCHEDULES, EPOCH_MODES, SAMPLER_SPACES, check_options

__all__ = ["COMMAND", "add_graphcl_parser", "build_parser", "main", "run_graphcl"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, action="append",
                   help="TU dataset name (raw folder DIR/tu/NAME or DIR/NAME); repeatable")
    p.add_argument("--data-dir", default=None,
                   help="data folder (default: $HARDBATCH_DATA, else ../shared/data)")
    p.add_argument("--cache-dir", default=None,
                   help="writable cache for parsed datasets (default ~/.cache/hardbatch/tu)")
    runs.add_run_arguments(p, seeds=5)
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="default: the paper's per dataset")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--refresh-every", type=positive_int, default=None, help="t (steps)")
    p.add_argument("--candidates", type=positive_int, default=None, help="M")
    p.add_argument("--neighbors", type=positive_int, default=None, help="K")
    p.add_argument("--temperature", type=temperature, default=CLI_DEFAULTS["temperature"])
    p.add_argument("--lr", type=positive_float, default=CLI_DEFAULTS["lr"])
    p.add_argument("--tau-plus", type=float, default=CLI_DEFAULTS["tau_plus"])
    p.add_argument("--beta", type=float, default=CLI_DEFAULTS["beta"])
    p.add_argument("--aug-ratio", type=float, default=CLI_DEFAULTS["aug_ratio"])
    p.add_argument("--views", choices=("orig+aug", "aug+aug"), default="orig+aug")
    p.add_argument("--aug-style", choices=("paper", "released"), default="paper",
                   help="paper: the GraphCL paper's augmentations at --aug-ratio (default); "
                        "released: GraphCL's released unsupervised_TU code (10%% drops, its "
                        "subgraph and self-loops; see augment_released)")
    p.add_argument("--features", choices=("auto", "labels", "degree", "constant"), default="auto")
    p.add_argument("--degree-cap", type=int, default=CLI_DEFAULTS["degree_cap"])
    p.add_argument("--bank-init", choices=("encode", "random"), default="encode")
    p.add_argument("--sampler-space", choices=SAMPLER_SPACES, default="readout",
                   help="what the bank (and so the sampler's graph) holds: the readout h "
                        "(default), the projection z the loss sees, or the readout centred by "
                        "the bank's mean row at every refresh")
    p.add_argument("--warmup-epochs", type=int, default=0,
                   help="uniform batches for this many epochs, then the bank is re-encoded "
                        "by the current model and the hard sampler takes over (default 0)")
    p.add_argument("--alpha-schedule", choices=ALPHA_SCHEDULES, default="linear",
                   help="proximity restart: linear 0.2 -> 0.05 over the run (default) or "
                        "per-epoch max(0.05, 0.2 - 0.02 * epoch) (the authors' code)")
    p.add_argument("--epoch-mode", choices=EPOCH_MODES, default="steps",
                   help="proximity epochs: ceil(N/B) walks (default) or walks until every "
                        "graph is covered, the run capped at the uniform step budget")
    p.add_argument("--loader", choices=("fast", "pyg"), default="fast",
                   help="fast: vectorised collate from flat tensors; pyg: "
                        "torch_geometric.loader.DataLoader(dataset, batch_sampler=sampler)")
    p.add_argument("--svm-kernel", choices=("precomputed", "rbf"), default="precomputed",
                   help="precomputed: RBF Gram matrix computed once (fast); rbf: SVC() as GraphCL")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads per run (default 1)")
    p.add_argument("--log-every", type=positive_int, default=1, help="steps between trace entries")
    runs.add_grid_arguments(p, out="results/graphs")
    p.add_argument("--verbose", action="store_true", help="print the loss every epoch")


def run_graphcl(args) -> int:
    """Run every (dataset, sampler, loss, seed) of ``args``; returns a process exit code."""
    from ...tu import load_tu

    torch.set_num_threads(max(1, int(args.threads)))
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    samplers = parse_names(args.sampler, "sampler")
    losses = parse_names(args.loss, "loss")
    seeds = runs.seeds_of(args)
    if aug_style(args) == "released" and (args.views != "orig+aug"
                                           or args.aug_ratio != CLI_DEFAULTS["aug_ratio"]):
        raise ValueError("--aug-style released reproduces the released code's fixed ratios and "
                         "its original + augmented views: drop --aug-ratio and --views aug+aug, "
                         "or use --aug-style paper")
    out = Path(args.out)
    tally = runs.GridTally()
    for raw_name in args.dataset:
        name = canonical_dataset(raw_name)
        hyper = hyper_for(name)
        if name not in DEFAULTS:
            print(f"[graphcl] {name}: not in the paper's Table 15; using B {hyper.batch_size}, "
                  f"{hyper.epochs} epochs, t {hyper.refresh_every}, M {hyper.candidates}, "
                  f"K {hyper.neighbors} (override with --batch-size / --epochs / "
                  "--refresh-every / --candidates / --neighbors)", flush=True)
        check_options(args, samplers, args.epochs or hyper.epochs)
        tags = {s: run_tag(args, hyper, s) for s in samplers}
        todo = [(s, l, seed) for l in losses for s in samplers for seed in seeds
                if args.force or not runs.finished(result_path(out, name, s, l, seed, tags[s]))]
        total = len(samplers) * len(losses) * len(seeds)
        print(f"[graphcl] {name}: {total - len(todo)}/{total} runs done, {len(todo)} to run "
              f"-> {out}", flush=True)
        tally.skipped += total - len(todo)
        if args.dry_run or not todo:
            continue
        t0 = time.perf_counter()
        dataset = load_tu(name, args.data_dir, cache_dir=args.cache_dir, features=args.features,
                          degree_cap=args.degree_cap)
        print(f"[graphcl] loaded {name}: {len(dataset)} graphs, {dataset.num_features} "
              f"{dataset.feature_kind} features, {dataset.num_classes} classes "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)
        tally += runs.run_grid(
            todo, lambda s, l, seed: result_path(out, name, s, l, seed, tags[s]),  # noqa: B023
            lambda s, l, seed, path: run_one(args, dataset, s, l, seed, path),  # noqa: B023
            lambda s, l, seed, rec: _summary(name, s, l, seed, rec),  # noqa: B023 (called now)
            key="accuracy", force=args.force, prefix="[graphcl]")
    print(tally.summary("[graphcl]"), flush=True)
    return 0 if args.dry_run else tally.exit_code


def _summary(name: str, sampler: str, loss: str, seed: int, rec: dict) -> str:
    tm = rec["timings_s"]
    return (f"{name} {sampler} {loss} seed {seed}: acc {100 * rec['accuracy']:.2f} "
            f"wall {rec['wall_time_s']:.1f}s (fwd/bwd {tm['forward_backward']:.1f}, "
            f"aug {tm['augment']:.1f}, data {tm['data']:.1f}, sampler {tm['sampler']:.1f}, "
            f"metrics {tm['metrics']:.1f}, svm {tm['eval_svm']:.1f}) "
            f"fnr {rec['mean_false_negative_rate']:.3f} hard {rec['mean_hardness']:.3f}")


COMMAND = runs.RecipeCommand(
    "graphcl", help="GraphCL on TU datasets with every sampler and loss",
    description="GraphCL on TU datasets with hardbatch samplers (BatchSampler paper, Table 3)",
    add_arguments=_add_arguments, run=run_graphcl)
build_parser, add_graphcl_parser, main = COMMAND.parser, COMMAND.register, COMMAND.main
