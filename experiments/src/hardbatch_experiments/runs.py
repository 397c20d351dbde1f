"""Bookkeeping shared by the benchmark recipes (graphcl, simcse, simclr): one JSON per run,
written atomically; a finished JSON means "skip this run"; a per-run lock file keeps parallel
grid workers off each other's runs and is taken over when it is stale; a grid prints its
progress and a summary line, and exits non-zero while runs are missing.

Locks (``.NAME.json.lock`` beside the result) record the host, the PID and the start time of
the process that holds the run, and when it was taken. A lock is stale, and taken over, when

* it was written on this host and that PID is gone, or now belongs to a process started at
  another time (a PID reused after a restart) or after the lock was written;
* it was written on another host (a shared folder, a renamed container) and is older than
  :data:`REMOTE_LOCK_AGE_S` (24 hours: that host's processes cannot be checked from here);
* it is older than :data:`LOCK_MAX_AGE_S` (7 days, longer than any run) whatever its owner.

An old-style lock holding only a PID is stale unless that PID runs a process started before
the lock was written. A run skipped because a live process holds it is *missing* at the end of
the grid: the command lists it with its owner and exits with code 1, as for failed runs.

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
from dataclasses import dataclass, field
from pathlib import Path

from hardbatch.cli_types import positive_int
from hardbatch.registry import LOSS_ALIASES

__all__ = ["LOCK_MAX_AGE_S", "REMOTE_LOCK_AGE_S", "GridTally", "RecipeCommand",
           "add_grid_arguments", "add_run_arguments", "env_record", "finished", "lock_holder",
           "process_start_time", "reference_summary", "result_path", "run_exclusive",
           "run_grid", "seeds_of", "stored_paths", "try_lock", "write_json_atomic"]

#: A lock older than this is stale whoever holds it (no run of the recipes takes a week).
LOCK_MAX_AGE_S = 7 * 24 * 3600
#: A lock written on another host is stale after this (its process cannot be checked here).
REMOTE_LOCK_AGE_S = 24 * 3600


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


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to the clock tick), from Linux's
    ``/proc``; None where that is not available (or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _lock_record() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": process_start_time(pid),
            "created": time.time()}


def _read_lock(lock: Path) -> dict:
    """The lock's record; an old-style lock (a bare PID) gets its file time as ``created``."""
    text = lock.read_text().strip()
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        record = {"pid": int(text or 0), "host": None, "start": None}
    record.setdefault("created", lock.stat().st_mtime)
    return record


def lock_holder(lock: Path | str, now: float | None = None) -> str | None:
    """Who holds ``lock`` ("pid P on host H since T"), or None when it is stale or unreadable
    (see the module docstring for the rules)."""
    lock = Path(lock)
    try:
        rec = _read_lock(lock)
        pid, created = int(rec.get("pid") or 0), float(rec["created"])
    except (OSError, ValueError, TypeError):
        return None
    age = (time.time() if now is None else now) - created
    host = rec.get("host")
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(created))
    who = f"pid {pid} on host {host or 'this host'} since {since}"
    if age > LOCK_MAX_AGE_S:
        return None
    if not pid:  # created, not yet written: a process is taking it right now
        return "a process taking the lock right now" if age < 10.0 else None
    if host is not None and host != socket.gethostname():
        return who if age <= REMOTE_LOCK_AGE_S else None
    if pid == os.getpid() or not _pid_alive(pid):
        return None
    started = process_start_time(pid)
    if started is None:
        return who  # no /proc: a live PID is taken as the writer
    if rec.get("start") is not None:
        return who if abs(started - float(rec["start"])) < 2.0 else None
    return who if started <= created + 1.0 else None  # old-style lock: started before it


def try_lock(path: Path) -> Path | None:
    """Claim run ``path`` with ``.NAME.lock`` (host, pid, start time, creation time); None if
    a live process holds it. A stale lock is taken over. Delete the returned lock when done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.name}.lock")
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if lock_holder(lock) is not None:
                return None
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(_lock_record(), fh)
        return lock
    return None


def reference_summary(trace: dict, embedding: str, threshold: float) -> dict:
    """A run's ``reference_diagnostics``: the means over its logged steps of the batch hardness
    and near-duplicate rate measured in a reference embedding shared by every arm of the
    comparison (``trace["reference_hardness"]``, ``trace["reference_near_duplicate_rate"]``),
    with what that embedding is. Runs written before this field existed lack it: the reports
    show "not measured" there. (A false-negative rate from labels does not depend on the
    embedding: it is the run's ``mean_false_negative_rate``.)"""
    import numpy as np

    def mean(key: str) -> float | None:
        values = np.asarray(trace.get(key) or [], dtype=np.float64)
        values = values[~np.isnan(values)]
        return float(values.mean()) if values.size else None

    return {"embedding": embedding, "mean_hardness": mean("reference_hardness"),
            "mean_near_duplicate_rate": mean("reference_near_duplicate_rate"),
            "near_duplicate_threshold": threshold}


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
        holder = lock_holder(path.with_name(f".{path.name}.lock")) or "another process"
        print(f"{prefix} {path.name} is running elsewhere ({holder}), skipped", flush=True)
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


@dataclass
class GridTally:
    """What a grid command did: runs ``ran``, ``skipped`` (finished before), ``failed``, the
    result files still ``missing`` at its end (failed, or held by another live process), and
    its wall time. Tallies of several grids (datasets) add up with ``+``."""

    ran: int = 0
    skipped: int = 0
    failed: int = 0
    missing: list[Path] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def __add__(self, other: GridTally) -> GridTally:
        return GridTally(self.ran + other.ran, self.skipped + other.skipped,
                         self.failed + other.failed, self.missing + other.missing,
                         min(self.started, other.started))

    @property
    def exit_code(self) -> int:
        """0 when every run of the grid is finished, else 1."""
        return 1 if self.missing or self.failed else 0

    def summary(self, prefix: str) -> str:
        """The closing line: ``PREFIX done: R ran, S skipped (finished before), F failed, M
        missing, wall Ts``, then one line per missing run."""
        lines = [(f"{prefix} done: {self.ran} ran, {self.skipped} skipped (finished before), "
                  f"{self.failed} failed, {len(self.missing)} missing, wall "
                  f"{time.perf_counter() - self.started:.1f}s")]
        for path in self.missing:
            lock = path.with_name(f".{path.name}.lock")
            holder = lock_holder(lock) if lock.exists() else None
            lines.append(f"{prefix}   missing {path.name}"
                         + (f" (running elsewhere: {holder})" if holder else ""))
        return "\n".join(lines)


def run_grid(cells: list[tuple], path_of: Callable[..., Path], run: Callable[..., dict],
             summary: Callable[..., str], *, key: str, force: bool, prefix: str,
             reraise: tuple[type[BaseException], ...] = ()) -> GridTally:
    """Run every cell of a grid through :func:`run_exclusive`, printing ``[k/K]`` before each;
    returns the :class:`GridTally` (``missing``: the cells not finished at the end).

    A cell is a tuple such as ``(sampler, loss, seed)``: ``path_of(*cell)`` is its JSON,
    ``run(*cell, path)`` computes (and writes) its record, and ``summary(*cell, record)`` is
    the line printed after ``prefix`` once it ran.
    """
    tally = GridTally()
    for k, cell in enumerate(cells, 1):
        path = path_of(*cell)
        print(f"{prefix} [{k}/{len(cells)}] {path.name} ...", flush=True)
        record, failed = run_exclusive(path, lambda: run(*cell, path),  # noqa: B023 (called now)
                                       key=key, force=force, prefix=prefix, reraise=reraise)
        tally.failed += failed
        if record is not None:
            tally.ran += 1
            print(f"{prefix} {summary(*cell, record)}", flush=True)
    tally.missing = [path_of(*cell) for cell in cells if not finished(path_of(*cell), key)]
    return tally


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
        """Parse ``argv`` (default: the process's arguments) and run; returns the exit code
        (bad input: a one-line error and exit code 2, as ``hardbatch bench``)."""
        from hardbatch.cli import run_guarded

        return run_guarded(f"hardbatch bench {self.name}", self.run, self.parser().parse_args(argv))
