"""Helpers shared by the test modules (``from support import unit_rows, REPO``)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"


def shared_data_root() -> Path | None:
    env = os.environ.get("HARDBATCH_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def run_torchrun(worker: Path, *args: str, nproc: int = 2, timeout: int) -> str:
    """Run ``worker`` on ``nproc`` local processes (``torchrun --standalone``), one thread each,
    with tests/ importable (a worker ends with :func:`end_torchrun_worker`); assert that every
    process exited 0 and return their stdout and stderr together."""
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone", f"--nproc_per_node={nproc}", str(worker), *args]
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def end_torchrun_worker() -> None:
    """The last call of a torchrun worker whose checks all passed: destroy the process group
    while the interpreter is fully alive, then leave without its finalisation. Gloo's worker
    threads can still hold work objects (a DDP reducer keeps the group alive past
    destroy_process_group), and destroying them during interpreter teardown aborts the process
    ("terminate called without an active exception", exit -6; pytorch/pytorch#179291): a rare
    failure of a run whose checks all passed."""
    import gc

    import torch.distributed as dist

    gc.collect()  # DDP models and trainers held in reference cycles
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
