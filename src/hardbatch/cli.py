"""The ``hardbatch`` command line.

::

    hardbatch demo                     # every sampler on scikit-learn's digits, table + plots
    hardbatch demo --sampler uniform,proximity --loss debiased --epochs 30 --out runs/demo
    hardbatch inspect emb.npy --labels labels.npy

Subcommands register themselves on the ``argparse`` subparsers in :func:`build_parser`
(``bench graphcl``, ``bench simcse``, ``eval sts``). Bad options or inputs exit with code 2
and a one-line message on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__

__all__ = ["build_parser", "main"]

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
every --refresh-every steps.
example: hardbatch demo --sampler uniform,proximity --epochs 20 --out /tmp/demo"""


class CLIError(Exception):
    """A user-facing problem: printed on stderr, exit code 2."""


def _integer_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _integer_at_least(text, 1, "a positive integer")


def _nonnegative_int(text: str) -> int:
    return _integer_at_least(text, 0, "an integer >= 0")


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _add_demo_parser(subparsers) -> argparse.ArgumentParser:
    from .demo import LOSSES, SAMPLERS, DemoConfig

    d = DemoConfig()
    p = subparsers.add_parser(
        "demo", help="train on digits with every sampler and compare them (table + plots)",
        description=_DEMO_DESCRIPTION, epilog=_DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sampler", nargs="+", default=["all"], metavar="NAME",
                   help=f"one or several of {', '.join(SAMPLERS)} (space- or comma-separated), "
                        "or 'all' (default)")
    p.add_argument("--loss", choices=LOSSES, default=d.loss,
                   help=f"contrastive loss (default {d.loss})")
    p.add_argument("--epochs", type=_positive_int, default=d.epochs,
                   help=f"training epochs per sampler (default {d.epochs})")
    p.add_argument("--batch-size", type=_positive_int, default=d.batch_size, metavar="B",
                   help=f"batch size (default {d.batch_size})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--out", default=d.out, metavar="DIR",
                   help=f"output folder for plots and results.json (default ./{d.out})")
    p.add_argument("--temperature", type=_positive_float, default=d.temperature, metavar="T",
                   help=f"loss temperature (default {d.temperature})")
    p.add_argument("--lr", type=_positive_float, default=d.lr,
                   help=f"Adam learning rate (default {d.lr})")
    p.add_argument("--candidates", type=_positive_int, default=d.candidates, metavar="M",
                   help=f"proximity graph candidates per item (default {d.candidates})")
    p.add_argument("--neighbors", type=_positive_int, default=d.neighbors, metavar="K",
                   help=f"proximity graph neighbours kept (default {d.neighbors})")
    p.add_argument("--restart", nargs=2, type=_probability, default=None,
                   metavar=("START", "END"),
                   help=f"RWR restart probability, decayed linearly from START to END "
                        f"(default {d.restart_start} {d.restart_end})")
    p.add_argument("--refresh-every", type=_positive_int, default=d.refresh_every, metavar="STEPS",
                   help=f"steps between graph rebuilds of knn / proximity (default {d.refresh_every})")
    p.add_argument("--threads", type=_positive_int, default=d.threads,
                   help=f"torch threads for training (default {d.threads}: fastest for this tiny MLP)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--progress", action="store_true", help="show a progress bar per sampler")
    p.set_defaults(func=_run_demo)
    return p


def _sampler_names(values: list[str]) -> tuple[str, ...]:
    from .demo import SAMPLERS

    names: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name == "all":
                names.extend(SAMPLERS)
            elif name in SAMPLERS:
                names.append(name)
            else:
                raise CLIError(f"unknown sampler {name!r}; choose from {', '.join(SAMPLERS)} "
                               "or 'all'")
    if not names:
        raise CLIError(f"--sampler needs at least one of {', '.join(SAMPLERS)} or 'all'")
    return tuple(dict.fromkeys(names))  # keep order, drop repeats


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo, split_digits

    samplers = _sampler_names(args.sampler)
    d = DemoConfig()
    n_train = len(split_digits(args.seed, d.test_fraction)[0])
    if args.batch_size < 2 or args.batch_size >= n_train:
        raise CLIError(f"--batch-size {args.batch_size} must be between 2 and {n_train - 1} "
                       f"(the demo trains on {n_train} digits)")
    if "proximity" in samplers:
        if args.neighbors >= args.candidates:
            raise CLIError(f"--neighbors {args.neighbors} must be smaller than --candidates "
                           f"{args.candidates}")
        if args.candidates >= n_train:
            raise CLIError(f"--candidates {args.candidates} must be smaller than the "
                           f"{n_train} training digits")
    restart = args.restart or (d.restart_start, d.restart_end)
    cfg = DemoConfig(
        samplers=samplers, loss=args.loss, epochs=args.epochs, batch_size=args.batch_size,
        seed=args.seed, temperature=args.temperature, lr=args.lr, candidates=args.candidates,
        neighbors=args.neighbors, restart_start=restart[0], restart_end=restart[1],
        refresh_every=args.refresh_every, threads=args.threads, progress=args.progress,
        out=args.out, plots=not args.no_plots)
    run_demo(cfg)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``hardbatch`` parser with all subcommands."""
    parser = argparse.ArgumentParser(
        prog="hardbatch",
        description="Hard-negative mini-batches for contrastive learning: samplers, losses, "
                    "diagnostics.",
        epilog="run 'hardbatch COMMAND --help' for a command's options")
    parser.add_argument("--version", action="version", version=f"hardbatch {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo_parser(subparsers)
    from .inspect_cli import add_inspect_parser

    add_inspect_parser(subparsers)
    bench = subparsers.add_parser("bench", help="reproduce the papers' experiments on real data",
                                  description="Benchmarks on real data; one JSON per run, reruns "
                                              "skip finished runs.")
    bench_sub = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    from .recipes.graphcl import add_graphcl_parser

    add_graphcl_parser(bench_sub)
    from .recipes.simcse import add_simcse_parser

    add_simcse_parser(bench_sub)
    from .recipes.simclr import add_simclr_parser

    add_simclr_parser(bench_sub)
    evaluate = subparsers.add_parser("eval", help="evaluate trained encoders on real benchmarks",
                                     description="Evaluate trained encoders (STS for sentence "
                                                 "encoders).")
    eval_sub = evaluate.add_subparsers(dest="evaluation", metavar="EVALUATION")
    from .text_eval import add_sts_parser

    add_sts_parser(eval_sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hardbatch`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    name = args.command
    try:
        return int(args.func(args) or 0)
    except CLIError as exc:
        print(f"hardbatch {name}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
            PermissionError, FileExistsError) as exc:
        print(f"hardbatch {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hardbatch {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
