"""``hardbatch plan``: write a sampler's batch plan, every epoch and rank, to a Parquet file
(:func:`hardbatch.plan_files.write_plan`; the format: :mod:`hardbatch.plan_files`).

``hardbatch.cli`` wires it in with :func:`add_plan_parser`. Bad options or inputs exit with code
2 and a one-line message on stderr (``hardbatch.cli.run_guarded``), as does a missing pyarrow.
"""

from __future__ import annotations

import argparse
import json
import sys

from .cli_types import positive_int
from .plan_files import write_plan
from .registry import sampler_names

__all__ = ["add_plan_parser", "parse_option", "run_plan"]

DESCRIPTION = """\
Write the batches of a hardbatch sampler over fixed embeddings, for every epoch and rank, to a
Parquet plan file that any trainer can replay (hardbatch.PlanBatchSampler, or read the 'rows'
column per (epoch, rank, step)). The file records the sampler, its options, seed, epochs, world
size, batch size, hardbatch version, row count and the SHA-256 of the embeddings."""

EPILOG = """\
EMBEDDINGS: .npy, .npz, .pt/.pth ([N, d]), or .parquet with --column naming a list column of
embeddings. With --model (a sentence-transformers model name or path): a .parquet file or a
datasets folder (save_to_disk) whose text --column (default: the first) the model encodes.
--option KEY=VALUE (repeatable) passes a sampler option; VALUE is read as JSON when it parses
(10, 0.5, null, true, "text"), else as text.
example: hardbatch plan emb.npy --sampler knn --batch-size 64 --epochs 3 --world-size 8 \\
             --option refresh_every=null --out plan.parquet"""


def parse_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``, VALUE parsed as JSON when it parses, else text.

    Example:
        >>> from hardbatch.plan_cli import parse_option
        >>> parse_option("candidates=50"), parse_option("refresh_every=null")
        (('candidates', 50), ('refresh_every', None))
        >>> parse_option("method=exact"), parse_option("restart=0.7")
        (('method', 'exact'), ('restart', 0.7))
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. candidates=50), got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``plan`` sub-command, its options and ``func=run_plan``, to ``subparsers``
    (``hardbatch.cli.build_parser`` does).

    Example:
        >>> from hardbatch.cli import build_parser
        >>> args = build_parser().parse_args(["plan", "emb.npy", "--sampler", "knn",
        ...                                   "--batch-size", "8", "--option", "refresh_every=null"])
        >>> args.command, args.sampler, args.batch_size, args.epochs, args.option, args.out
        ('plan', 'knn', 8, 1, [('refresh_every', None)], 'plan.parquet')
    """
    parser = subparsers.add_parser(
        "plan", help="write a sampler's batches (every epoch and rank) to a Parquet plan file",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("embeddings", metavar="EMBEDDINGS",
                        help="[N, d] embeddings (.npy/.npz/.pt, .parquet with --column), or with "
                             "--model the texts (.parquet or a datasets folder)")
    parser.add_argument("--sampler", required=True, metavar="NAME",
                        help=f"a sampler of the registry: {', '.join(sampler_names())}")
    parser.add_argument("--batch-size", type=positive_int, required=True, metavar="B")
    parser.add_argument("--epochs", type=positive_int, default=1, metavar="E",
                        help="epochs to plan (default 1)")
    parser.add_argument("--world-size", type=positive_int, default=1, metavar="W",
                        help="ranks of the training job (default 1); every rank is written")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    parser.add_argument("--option", type=parse_option, action="append", default=[],
                        metavar="KEY=VALUE", help="a sampler option (repeatable)")
    parser.add_argument("--column", default=None, metavar="NAME",
                        help="the Parquet column of embeddings, or the text column with --model")
    parser.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                        help="a sentence-transformers model that encodes the text --column")
    parser.add_argument("--encode-batch-size", type=positive_int, default=64, metavar="B",
                        help="batch size of the model's encoding (default 64)")
    parser.add_argument("--out", default="plan.parquet", metavar="FILE",
                        help="the plan file to write (default plan.parquet)")
    parser.set_defaults(func=run_plan)
    return parser


def run_plan(args: argparse.Namespace) -> int:
    """Run ``hardbatch plan`` with parsed ``args``: writes the plan, prints one line; returns 0
    (2, with a message on stderr, when pyarrow or sentence-transformers is missing).

    Example:
        >>> import argparse, contextlib, io, tempfile, numpy as np
        >>> from hardbatch.plan_cli import add_plan_parser
        >>> tmp = tempfile.TemporaryDirectory()
        >>> np.save(f"{tmp.name}/emb.npy", np.ones((40, 8), dtype="float32"))
        >>> parser = argparse.ArgumentParser()
        >>> _ = add_plan_parser(parser.add_subparsers())
        >>> args = parser.parse_args(["plan", f"{tmp.name}/emb.npy", "--sampler", "uniform",
        ...                           "--batch-size", "8", "--out", f"{tmp.name}/plan.parquet"])
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:
        ...     code = args.func(args)
        >>> code, out.getvalue().split(":")[0].endswith("plan.parquet")
        (0, True)
        >>> tmp.cleanup()
    """
    options = dict(args.option)
    try:
        plan = write_plan(args.out, args.embeddings, args.sampler, args.batch_size,
                          options=options, epochs=args.epochs, world_size=args.world_size,
                          seed=args.seed, column=args.column, model=args.model,
                          encode_batch_size=args.encode_batch_size)
    except ImportError as exc:
        print(f"hardbatch plan: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: sampler {plan.sampler}, {plan.epochs} epoch(s) x {plan.world_size} "
          f"rank(s) x {plan.steps_per_epoch} steps of up to {plan.batch_size} rows, "
          f"{plan.num_rows} rows, embeddings sha256 {plan.embeddings_sha256[:16]}...")
    return 0
