"""How long the training loop waits for the sampler: foreground vs background build vs planner thread.

    python benchmarks/bench_planning.py --modes foreground background prefetch \
        --json benchmarks/results/planning.json
    python benchmarks/bench_planning.py --modes gcbs gcbs-background --items 20000 \
        --batch-size 256 --step-ms 60 --gcbs-lag 75 --steps 250 \
        --json benchmarks/results/planning_gcbs.json

A simulated training loop over MNIST train (60k, 64 PCA dims, real data): each step "trains" for
``--step-ms`` milliseconds of sleep (a GPU-bound step: the CPU is free meanwhile) and writes the
batch's embeddings, moved by a little noise, into an EmbeddingBank that the
ProximityGraphSampler rebuilds its graph from every ``--refresh-every`` steps. Measured: the time
the loop spends inside ``next(batches)`` per step (graph builds, snapshots and walks it waits for),
separately for the first batch (the first graph), the refresh steps (snapshot of the bank) and
all other steps.

Modes: ``foreground`` (refresh_lag=0: the step that needs a new graph builds it),
``background`` (background=True, refresh_lag=L: builds in a worker thread, walks on request),
``prefetch`` (background=True, refresh_lag=L, prefetch=P: walks planned ahead in a planner
thread too). ``background`` and ``prefetch`` must give identical batches (checked).
GCBSSampler (quantile 1 - 2B/N): ``gcbs`` (each epoch's order built at its start) and
``gcbs-background`` (built in a worker thread from a snapshot ``--gcbs-lag`` steps before the
end of the previous epoch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from _common import machine, mnist_pca64

import hardbatch as hb


def simulate(x: np.ndarray, mode: str, args) -> tuple[dict, list[list[int]]]:
    n, d = x.shape
    bank = hb.EmbeddingBank(n, d)
    bank.update(torch.arange(n), torch.from_numpy(x))
    if mode.startswith("gcbs"):
        kw = dict(background=True, refresh_lag=args.gcbs_lag) if mode == "gcbs-background" \
            else dict(refresh_lag=0)
        sampler = hb.GCBSSampler(bank, args.batch_size, quantile=1 - 2 * args.batch_size / n,
                                 seed=0, **kw)
    else:
        kw = {"foreground": dict(refresh_lag=0),
              "background": dict(background=True, refresh_lag=args.lag),
              "prefetch": dict(background=True, refresh_lag=args.lag,
                               prefetch=args.prefetch)}[mode]
        sampler = hb.ProximityGraphSampler(bank, args.batch_size, args.candidates,
                                           args.neighbors, refresh_every=args.refresh_every,
                                           seed=0, **kw)
    gen = torch.Generator().manual_seed(0)
    waits, batches = [], []

    def epochs():
        for epoch in range(10**6):
            sampler.set_epoch(epoch)
            yield from sampler

    it = epochs()
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch = next(it)
        waits.append(time.perf_counter() - t0)
        batches.append(batch)
        time.sleep(args.step_ms / 1000)  # the (GPU-bound) training step
        idx = torch.tensor(batch)
        moved = torch.from_numpy(x[batch]) + 0.05 * torch.randn(len(batch), d, generator=gen)
        bank.update(idx, moved)
    it.close()
    w = np.array(waits) * 1000
    refresh = np.zeros(len(w), bool)
    if mode.startswith("gcbs"):  # a new order at every epoch start
        refresh[len(sampler)::len(sampler)] = True
    else:
        refresh[args.refresh_every::args.refresh_every] = True
    other = ~refresh
    other[0] = False
    return {"mode": mode, **kw, "steps": args.steps,
            "refreshes": getattr(sampler, "refreshes", None),
            "first_batch_ms": float(w[0]),  # the first graph: nothing to overlap it with
            "refresh_step_wait_ms_mean": float(w[refresh].mean()),
            "refresh_step_wait_ms_max": float(w[refresh].max()),
            "other_step_wait_ms_mean": float(w[other].mean()),
            "other_step_wait_ms_p99": float(np.percentile(w[other], 99)),
            "other_step_wait_ms_max": float(w[other].max()),
            "wait_s_total_after_first": float(w[1:].sum() / 1000),
            "wait_share_of_step_after_first": float(w[1:].mean() / (w[1:].mean() + args.step_ms)),
            "last_build_s": sampler.last_refresh_seconds}, batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-ms", type=float, default=30.0)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--candidates", type=int, default=1000)
    p.add_argument("--neighbors", type=int, default=100)
    p.add_argument("--refresh-every", type=int, default=100)
    p.add_argument("--lag", type=int, default=50)
    p.add_argument("--prefetch", type=int, default=16)
    p.add_argument("--gcbs-lag", type=int, default=100,
                   help="GCBS: steps before an epoch's end at which the next order is snapshotted")
    p.add_argument("--modes", nargs="+",
                   default=["foreground", "background", "prefetch", "gcbs", "gcbs-background"])
    p.add_argument("--items", type=int, default=0, help="use the first N items (0: all 60k)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    x, _ = mnist_pca64()
    if args.items:
        x = np.ascontiguousarray(x[:args.items])
    hb.proximity_graph(x[:5000], args.candidates, args.neighbors)  # compile the numba kernels
    rows, plans = [], {}
    for mode in args.modes:
        row, plans[mode] = simulate(x, mode, args)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    same = {"prefetch_batches_equal_background": ("prefetch", "background")}
    out = {"machine": machine(), "config": vars(args), "rows": rows,
           **{key: plans[a] == plans[b] for key, (a, b) in same.items()
              if a in plans and b in plans}}
    print(json.dumps(out, indent=1))
    if out.get("prefetch_batches_equal_background") is False:
        raise SystemExit("prefetch changed the batches: a bug")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
