"""The experiments' ``hardbatch`` commands: ``demo``, ``bench graphcl|simcse|simclr|codesearch``,
``eval sts``.

Each ``add_*_parser(subparsers)`` is registered under the entry-point group
``hardbatch.commands`` (``pyproject.toml``), so :mod:`hardbatch.cli` adds the command to the
``hardbatch`` parser without importing this package itself. A command's ``func`` returns the
exit code; ``ValueError`` / missing files become a one-line error and exit code 2 there.

::

    hardbatch demo                     # every sampler on scikit-learn's digits, table + plots
    hardbatch demo code                # a GCBS batch next to a uniform one on code-search data
    hardbatch demo --sampler uniform,proximity --loss dcl --epochs 30 --out runs/demo
    hardbatch bench graphcl --dataset MUTAG --seeds 1
    hardbatch eval sts --model all-MiniLM-L6-v2
"""

from __future__ import annotations

import argparse

from hardbatch.cli_types import positive_float, positive_int, probability, temperature
from hardbatch.neighbors.knn_graph import check_graph_sizes
from hardbatch.registry import canonical_loss, loss_names, parse_names, sampler_names

from .demo import DemoConfig, run_demo, split_digits
from .recipes.codesearch import add_codesearch_parser
from .recipes.codesearch.demo import add_code_demo_arguments, run_code_demo
from .recipes.graphcl import add_graphcl_parser
from .recipes.simclr import add_simclr_parser
from .recipes.simcse import add_simcse_parser
from .sts import add_sts_parser

__all__ = ["add_bench_parser", "add_demo_parser", "add_eval_parser"]

_DEMO_DESCRIPTION = """\
Train a small MLP encoder on scikit-learn's bundled 8x8 digits (no download) with each batch
sampler, the same loss, epochs and seed, then print a side-by-side markdown table (kNN and
linear-probe accuracy, batch hardness, mean in-batch cosine, false-negative rate, coverage,
sampler time as a share of step time) and write into --out: similarity_histograms.png (cosine
similarity of in-batch pairs after training, BatchSampler Fig. 4 left),
false_negative_rate.png (over training, Fig. 4 right) and results.json."""

_DEMO_EPILOG = """\
samplers: uniform, knn (anchor + B-1 nearest), proximity (proximity graph + random walk with
restart, alpha decaying 0.2 -> 0.05; BatchSampler), gcbs (global contrastive batch sampling).
Graph samplers read an embedding bank fed by the training forward pass and rebuild their graph
every --refresh-every steps. losses: infonce, dcl, hcl, sscl (debiased / hard_negative: aliases
of dcl / hcl).
example: hardbatch demo --sampler uniform,proximity --epochs 20 --out /tmp/demo
variant: hardbatch demo code (no digits, no training): what a hard batch holds on the
code-search pairs, next to a uniform one; see hardbatch demo code --help"""


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``demo`` (every sampler on the digits, compared) on ``subparsers``."""
    d = DemoConfig()
    p = subparsers.add_parser(
        "demo", help="train on digits with every sampler and compare them (table + plots)",
        description=_DEMO_DESCRIPTION, epilog=_DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sampler", nargs="+", default=["all"], metavar="NAME",
                   help=f"one or several of {', '.join(sampler_names())} (space- or "
                        "comma-separated), or 'all' (default)")
    p.add_argument("--loss", default=d.loss,
                   help=f"contrastive loss: one of {', '.join(loss_names(aliases=True))} "
                        f"(default {d.loss})")
    p.add_argument("--epochs", type=positive_int, default=d.epochs,
                   help=f"training epochs per sampler (default {d.epochs})")
    p.add_argument("--batch-size", type=positive_int, default=d.batch_size, metavar="B",
                   help=f"batch size (default {d.batch_size})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--out", default=d.out, metavar="DIR",
                   help=f"output folder for plots and results.json (default ./{d.out})")
    p.add_argument("--temperature", type=temperature, default=d.temperature, metavar="T",
                   help=f"loss temperature (default {d.temperature})")
    p.add_argument("--lr", type=positive_float, default=d.lr,
                   help=f"Adam learning rate (default {d.lr})")
    p.add_argument("--candidates", type=positive_int, default=d.candidates, metavar="M",
                   help=f"proximity graph candidates per item (default {d.candidates})")
    p.add_argument("--neighbors", type=positive_int, default=d.neighbors, metavar="K",
                   help=f"proximity graph neighbours kept (default {d.neighbors})")
    p.add_argument("--restart", nargs=2, type=probability, default=None,
                   metavar=("START", "END"),
                   help=f"RWR restart probability, decayed linearly from START to END "
                        f"(default {d.restart_start} {d.restart_end})")
    p.add_argument("--refresh-every", type=positive_int, default=d.refresh_every,
                   metavar="STEPS",
                   help=f"steps between graph rebuilds of knn / proximity (default "
                        f"{d.refresh_every})")
    p.add_argument("--threads", type=positive_int, default=d.threads,
                   help=f"torch threads for training (default {d.threads}: fastest for this "
                        "tiny MLP)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--progress", action="store_true", help="show a progress bar per sampler")
    p.set_defaults(func=_run_demo)
    variants = p.add_subparsers(dest="variant", metavar="[code]", required=False,
                                title="variant (optional)")
    code = variants.add_parser(
        "code", help="what a hard batch holds on code-search data (no training, ~20 s)",
        description=_CODE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    code.add_argument("--batch-size", type=positive_int, default=64, metavar="B",
                      help="batch size (default 64)")
    code.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_code_demo_arguments(code)
    code.set_defaults(func=run_code_demo)
    return p


_CODE_DESCRIPTION = """\
Draw --pairs docstring -> function-code pairs from shared/data/code/train, embed their queries
with all-MiniLM-L6-v2 (offline weights), and print one epoch's batch hardness, packages per batch
and repeated queries for the uniform sampler and a hard one (GCBS by default), the queries of
the batch of median hardness of each side by side, and the measured effect of hard batches on fine-tuning
(docs/results/code_search.md, computed from its result files). No training; about 20 s on 2 idle
CPU cores.
example: hardbatch demo code --hard-sampler community --show 24"""


def _run_demo(args: argparse.Namespace) -> int:
    samplers = parse_names(",".join(args.sampler), "sampler")
    loss = canonical_loss(args.loss)
    d = DemoConfig()
    n_train = len(split_digits(args.seed, d.test_fraction)[0])
    if args.batch_size < 2 or args.batch_size >= n_train:
        raise ValueError(f"--batch-size {args.batch_size} must be between 2 and {n_train - 1} "
                         f"(the demo trains on {n_train} digits)")
    if "proximity" in samplers:
        check_graph_sizes(args.candidates, args.neighbors, n_train, flags=True)
    restart = args.restart or (d.restart_start, d.restart_end)
    cfg = DemoConfig(
        samplers=tuple(samplers), loss=loss, epochs=args.epochs, batch_size=args.batch_size,
        seed=args.seed, temperature=args.temperature, lr=args.lr, candidates=args.candidates,
        neighbors=args.neighbors, restart_start=restart[0], restart_end=restart[1],
        refresh_every=args.refresh_every, threads=args.threads, progress=args.progress,
        out=args.out, plots=not args.no_plots)
    run_demo(cfg)
    return 0


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bench`` with the recipes ``graphcl``, ``simcse``, ``simclr`` and ``codesearch``."""
    bench = subparsers.add_parser("bench", help="reproduce the papers' experiments on real data",
                                  description="Benchmarks on real data; one JSON per run, reruns "
                                              "skip finished runs.")
    recipes = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for add in (add_graphcl_parser, add_simcse_parser, add_simclr_parser, add_codesearch_parser):
        add(recipes)
    return bench


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``eval`` with ``sts`` (STS evaluation of sentence encoders)."""
    evaluate = subparsers.add_parser("eval", help="evaluate trained encoders on real benchmarks",
                                     description="Evaluate trained encoders (STS for sentence "
                                                 "encoders).")
    add_sts_parser(evaluate.add_subparsers(dest="evaluation", metavar="EVALUATION"))
    return evaluate
