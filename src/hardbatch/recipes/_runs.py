"""Bookkeeping shared by the benchmark recipes (graphcl, simcse, simclr): one JSON per run,
written atomically; a finished JSON means "skip this run"; a per-run lock file keeps parallel
grid workers off each other's runs and is taken over when its process is gone."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_grid_arguments", "env_record", "expand_choices", "finished", "result_path",
           "run_exclusive", "seeds_of", "try_lock", "write_json_atomic"]


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


def finished(path: Path, key: str = "accuracy") -> bool:
    """True when ``path`` holds a JSON object with ``key`` (a completed run)."""
    try:
        with open(path) as fh:
            return key in json.load(fh)
    except (OSError, ValueError, TypeError):
        return False


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


def add_grid_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """The options every recipe shares: ``--out`` (default ``out``), ``--force``, ``--dry-run``."""
    p.add_argument("--out", default=out, help="folder for the per-run JSON files")
    p.add_argument("--force", action="store_true", help="rerun even if the JSON exists")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their status only")


def expand_choices(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """``"all"`` or a comma-separated subset of ``allowed`` -> the names, in order, no repeats."""
    if value == "all":
        return list(allowed)
    items = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"--{what}: {bad or value!r} not in {', '.join(allowed)} (or 'all')")
    return list(dict.fromkeys(items))


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
