"""The ``hardbatch`` command line: the built-in ``inspect`` and ``plan`` plus the commands of
plugins.

::

    hardbatch inspect emb.npy --labels labels.npy     # built in (hardbatch.inspect_cli)
    hardbatch plan emb.npy --sampler knn --batch-size 64 --out plan.parquet  # (plan_cli)
    hardbatch demo                                    # plugin commands, e.g. hardbatch_experiments:
    hardbatch bench graphcl|simcse|simclr ...         #   demo, bench, eval
    hardbatch eval sts --model all-MiniLM-L6-v2

A plugin is a function ``add(subparsers)`` registered under the entry-point group
``hardbatch.commands`` (in a package's ``pyproject.toml``); it adds its sub-parser and sets
``func`` (``args -> exit code``) on it, as :func:`hardbatch.inspect_cli.add_inspect_parser`
does. The library itself never imports a plugin's package. Bad options or inputs exit with
code 2 and a one-line message on stderr, never a traceback: :func:`run_guarded` turns the
library's ``ValueError`` (which names the parameter and the fix), a missing or misplaced file,
a missing optional extra (``ImportError``, naming it) and a diverged run
(``FloatingPointError``) into that line, for every command and for the
standalone entry points of plugins; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from . import __version__
from .inspect_cli import add_inspect_parser
from .plan_cli import add_plan_parser

__all__ = ["COMMAND_GROUP", "USER_ERRORS", "build_parser", "main", "run_guarded"]

#: Entry-point group of the plugin commands.
COMMAND_GROUP = "hardbatch.commands"

#: What a command reports in one line (exit code 2) instead of a traceback: bad values
#: (the library's ValueError names the parameter and the fix), file problems, a missing optional
#: extra (ImportError naming it), and a run that diverged (FloatingPointError: lower the
#: learning rate or raise the temperature).
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               PermissionError, FileExistsError, FloatingPointError, ImportError)


def run_guarded(prog: str, func, args) -> int:
    """``func(args)`` as a command's exit code: :data:`USER_ERRORS` become ``prog: error:
    MESSAGE`` on stderr and exit code 2, Ctrl-C exit code 130; other exceptions propagate.

    Example:
        >>> from hardbatch.cli import run_guarded
        >>> def command(args):
        ...     raise ValueError("batch_size=0 must be >= 1")
        >>> run_guarded("hardbatch demo", command, None)  # 'hardbatch demo: error: ...' on stderr
        2
        >>> run_guarded("hardbatch demo", lambda args: None, None)
        0
    """
    try:
        return int(func(args) or 0)
    except USER_ERRORS as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _add_plugin_commands(subparsers) -> None:
    for entry in entry_points(group=COMMAND_GROUP):
        try:
            add = entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the others
            print(f"hardbatch: command {entry.name!r} ({entry.value}) is unavailable: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        try:
            add(subparsers)
        except Exception as exc:  # noqa: BLE001 - e.g. a name clash with another command
            print(f"hardbatch: command {entry.name!r} ({entry.value}) is unavailable: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The ``hardbatch`` parser: ``inspect`` and every command of the ``hardbatch.commands``
    entry points.

    Example:
        >>> from hardbatch.cli import build_parser
        >>> args = build_parser().parse_args(["inspect", "emb.npy", "--sampler", "uniform,gcbs"])
        >>> args.command, args.embeddings, args.sampler, args.func.__name__
        ('inspect', 'emb.npy', 'uniform,gcbs', 'run_inspect')
    """
    parser = argparse.ArgumentParser(
        prog="hardbatch",
        description="Hard-negative mini-batches for contrastive learning: samplers, losses, "
                    "diagnostics.",
        epilog="run 'hardbatch COMMAND --help' for a command's options")
    parser.add_argument("--version", action="version", version=f"hardbatch {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_inspect_parser(subparsers)
    add_plan_parser(subparsers)
    _add_plugin_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hardbatch`` console script; returns the exit code.

    Example:
        >>> from hardbatch.cli import main
        >>> main(["inspect", "missing.npy"])  # 'hardbatch inspect: error: ...' on stderr
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return run_guarded(f"hardbatch {args.command}", args.func, args)


if __name__ == "__main__":
    sys.exit(main())
