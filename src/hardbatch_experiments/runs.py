"""Bookkeeping shared by the benchmark recipes (graphcl, simcse, simclr): one JSON per run,
written atomically; a finished JSON means "skip this run"; a per-run lock file keeps parallel
grid workers off each other's runs and is taken over when its process is gone.

Result files name the run's parts with canonical names (``...__proximity__dcl__seed0.json``);
a run finished under a loss alias's name before the registry made names canonical
(``...__proximity__debiased__seed0.json``) counts as finished too (:func:`stored_paths`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hardbatch.cli_types import positive_int
from hardbatch.registry import LOSS_ALIASES

__all__ = ["RecipeCommand", "add_grid_arguments", "add_run_arguments", "env_record",
           "finished", "result_path", "run_exclusive", "run_grid", "seeds_of", "stored_paths",
           "try_lock", "write_json_atomic"]


def result_path(out: Path | str, *parts: str, seed: int, tag: str = "") -> Path:
    """``OUT/part1__part2__...__seedS[__tag].json``."""
    suffix = f"__{tag}" if tag else ""
    return Path(out) / ("__".join(parts) + f"__seed{seed}{suffix}.json")


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write ``obj`` to ``path`` through a temporary file + ``os.replace`` (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def stored_paths(path: Path | str) -> list[Path]:
    """``path`` and the names the same run may be stored under: each part of the name before
    ``seedS`` that is a canonical loss name (``dcl``) replaced by one of its aliases
    (``debiased``), as SimCLR runs were named before the registry."""
    path = Path(path)
    parts = path.name.split("__")
    seed_at = next((i for i, p in enumerate(parts) if p.startswith("seed")), len(parts))
    out = [path]
    for alias, canonical in LOSS_ALIASES.items():
        if canonical in parts[:seed_at]:
            named = [alias if i < seed_at and p == canonical else p for i, p in enumerate(parts)]
            out.append(path.with_name("__".join(named)))
    return out


def _holds(path: Path, key: str) -> bool:
    try:
        with open(path) as fh:
            return key in json.load(fh)
    except (OSError, ValueError, TypeError):
        return False


def finished(path: Path | str, key: str = "accuracy") -> bool:
    """True when ``path``, or one of its :func:`stored_paths`, holds a JSON object with ``key``
    (a completed run)."""
    return any(_holds(p, key) for p in stored_paths(path))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def try_lock(path: Path) -> Path | None:
    """Claim run ``path`` with ``.NAME.lock`` (holding our pid); None if a live process has it.
    A lock whose process is gone (killed run) is taken over. Delete the returned lock when done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.name}.lock")
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _pid_alive(pid):
                return None
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return lock
    return None


def env_record() -> dict:
    """Where and when a run happened (torch/python versions, host, CPU count, finish time)."""
    import torch

    return {"torch": torch.__version__, "python": platform.python_version(),
            "host": socket.gethostname(), "cpus": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def run_exclusive(path: Path, run: Callable[[], dict], *, key: str = "accuracy",
                  force: bool = False, prefix: str = "[run]",
                  reraise: tuple[type[BaseException], ...] = ()) -> tuple[dict | None, bool]:
    """Run one grid cell unless it is finished or another live process holds it.

    ``run()`` computes the record (and writes ``path``). Returns ``(record, False)`` after a
    run, ``(None, False)`` when skipped (finished, or locked by a live process) and
    ``(None, True)`` when ``run`` raised: the error is printed and the grid goes on, except for
    exception types in ``reraise`` (user errors such as a bad data path), which propagate.
    The lock is released in every case.
    """
    path = Path(path)
    if not force and finished(path, key):  # another process finished it meanwhile
        return None, False
    lock = try_lock(path)
    if lock is None:  # a live process is running it (parallel grid workers)
        print(f"{prefix} {path.name} is running elsewhere, skipped", flush=True)
        return None, False
    try:
        return run(), False
    except reraise:
        raise
    except Exception as exc:  # noqa: BLE001 (one failed run must not stop a grid)
        print(f"{prefix} FAILED {path.name}: {type(exc).__name__}: {exc}", flush=True)
        return None, True
    finally:
        lock.unlink(missing_ok=True)


def run_grid(cells: list[tuple], path_of: Callable[..., Path], run: Callable[..., dict],
             summary: Callable[..., str], *, key: str, force: bool, prefix: str,
             reraise: tuple[type[BaseException], ...] = ()) -> int:
    """Run every cell of a grid through :func:`run_exclusive`; returns how many failed.

    A cell is a tuple such as ``(sampler, loss, seed)``: ``path_of(*cell)`` is its JSON,
    ``run(*cell, path)`` computes (and writes) its record, and ``summary(*cell, record)`` is
    the line printed after ``prefix`` once it ran.
    """
    failures = 0
    for cell in cells:
        path = path_of(*cell)
        record, failed = run_exclusive(path, lambda: run(*cell, path),  # noqa: B023 (called now)
                                       key=key, force=force, prefix=prefix, reraise=reraise)
        failures += failed
        if record is not None:
            print(f"{prefix} {summary(*cell, record)}", flush=True)
    return failures


def add_run_arguments(p: argparse.ArgumentParser, *, seeds: int, sampler: str = "all",
                      loss: str = "infonce", extra_sampler: str = "", extra_loss: str = "") -> None:
    """The options naming a recipe's runs: ``--sampler`` / ``--loss`` (names of
    :mod:`hardbatch.registry`, aliases accepted, comma-separated, or ``all``: the recipe parses
    them with :func:`hardbatch.registry.parse_names`), ``--seeds`` / ``--seed-list``
    (:func:`seeds_of`). ``extra_sampler`` / ``extra_loss`` name what a recipe accepts besides."""
    p.add_argument("--sampler", default=sampler,
                   help=f"{extra_sampler}sampler name(s) of hardbatch.registry, comma-separated, "
                        f"or 'all' (default: {sampler})")
    p.add_argument("--loss", default=loss,
                   help=f"{extra_loss}loss name(s) of hardbatch.registry (debiased / "
                        f"hard_negative: aliases of dcl / hcl), comma-separated, or 'all' "
                        f"(default: {loss})")
    p.add_argument("--seeds", type=positive_int, default=seeds,
                   help=f"run seeds 0..SEEDS-1 (default {seeds})")
    p.add_argument("--seed-list", default=None, help="explicit comma-separated seeds")


def add_grid_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """The options every recipe shares: ``--out`` (default ``out``), ``--force``, ``--dry-run``."""
    p.add_argument("--out", default=out, help="folder for the per-run JSON files")
    p.add_argument("--force", action="store_true", help="rerun even if the JSON exists")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their status only")


def seeds_of(args: argparse.Namespace) -> list[int]:
    """The run seeds: ``--seed-list`` (comma-separated) if given, else ``0 .. --seeds - 1``."""
    if not args.seed_list:
        return list(range(args.seeds))
    try:
        seeds = [int(s) for s in args.seed_list.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seed-list {args.seed_list!r} must be comma-separated integers >= 0, "
                         "e.g. 0,1,2")
    return list(dict.fromkeys(seeds))


@dataclass(frozen=True)
class RecipeCommand:
    """A recipe's ``hardbatch bench NAME`` command.

    ``add_arguments(parser)`` adds the recipe's options; ``run(args)`` runs its grid and returns
    the exit code. :meth:`register` adds the command to ``hardbatch bench``, :meth:`parser` /
    :meth:`main` give it a standalone parser and entry point.
    """

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    def parser(self) -> argparse.ArgumentParser:
        """A standalone parser with the recipe's options."""
        p = argparse.ArgumentParser(prog=f"hardbatch bench {self.name}",
                                    description=self.description)
        self.add_arguments(p)
        return p

    def register(self, subparsers) -> argparse.ArgumentParser:
        """Add the command to an ``argparse`` subparsers object (``set_defaults(func=run)``)."""
        p = subparsers.add_parser(self.name, help=self.help, description=self.description)
        self.add_arguments(p)
        p.set_defaults(func=self.run)
        return p

    def main(self, argv: list[str] | None = None) -> int:
        """Parse ``argv`` (default: the process's arguments) and run; returns the exit code."""
        return self.run(self.parser().parse_args(argv))
