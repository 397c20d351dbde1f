#!/usr/bin/env python3
"""What the other ranks see when one rank stalls or dies in a collective (docs/training.md,
"Under DDP"). Run with torchrun, two gloo processes on the CPU:

    torchrun --standalone --nproc_per_node=2 scripts/distributed_stall.py stall --timeout 10
    torchrun --standalone --nproc_per_node=2 scripts/distributed_stall.py kill --timeout 10

Rank 1 either sleeps for 3 x the timeout before its all-reduce (``stall``) or kills itself
(``kill``); rank 0 calls the all-reduce at once and prints how long it waited and what it
raised. Measured on the 2-core development machine (torch 2.13.0+cpu): ``stall`` -> rank 0
raises a RuntimeError ("Timed out waiting 10000ms") after 10.0 s, the process group's timeout;
``kill`` -> rank 0 raises at once (0.0 s, "Connection closed by peer") and torchrun stops the
job.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("stall", "kill"))
    ap.add_argument("--timeout", type=float, default=10.0, help="process-group timeout (s)")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    if rank == 1:
        if args.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3 * args.timeout)
    t0 = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1))
        print(f"rank {rank}: all_reduce returned after {time.perf_counter() - t0:.1f}s",
              flush=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0][:120]
        print(f"rank {rank}: RuntimeError after {time.perf_counter() - t0:.1f}s: {first}",
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
