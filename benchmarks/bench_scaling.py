"""Scaling curves N = 10k ... 1.28M: time and peak memory of every component, with references.

    python benchmarks/bench_scaling.py --json benchmarks/results/scaling.json
    python benchmarks/bench_scaling.py --sizes 10000 100000 --components proximity walks
    python benchmarks/bench_scaling.py --device cuda --precision bf16   # on a GPU machine

Components (each row: component, method, N, d, seconds, peak RSS delta, and for GPUs the
peak CUDA memory):

- ``proximity``: :func:`hardbatch.proximity_graph` (M=1000, K=100, d=128) and, up to
  ``--reference-max`` items, the straightforward reference in the same run: every item
  gathers its own M candidates, then a batched product (the authors' approach).
- ``knn``: exact kNN graph (K=100; blocked torch products, and faiss ``IndexFlatIP``) up
  to ``--exact-max`` items; faiss ``IndexIVFFlat`` (``method="faiss-ivf"``) at every N.
- ``gcbs``: GCBS permutation, ``method="ivf"`` at every N and the exact dense blocked
  version up to ``--exact-max``; quantile 1 - 32/N (about 32 strong pairs per item, so
  the pair list stays O(N), GCBS Appendix J) and the batch hardness (mean top-1 cosine
  inside batches of 256) of each.
- ``gcbs`` with ``--gcbs-methods partition``: coarse k-means cells of about
  ``--cell-size`` items, exact pairs + RCM within each cell, cells chained (for N >= 1M).
- ``walks``: RWR batches (B=512, alpha=0.2) on the proximity graph of that N, ms per batch.

Data: synthetic unit vectors, a 1000-component Gaussian mixture (speed does not depend on
the values; no ImageNet embeddings here). Peak memory: resident-set size sampled every
10 ms during the call, minus the RSS before it (the embeddings themselves are not counted).
Results are appended to the JSON after every measurement, so a partial run keeps its rows.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import threading
import time

import numpy as np
import torch
from _common import gaussian_mixture, machine
from bench_gcbs import batch_top1
from bench_samplers import per_item_gather_reference

import hardbatch as hb

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def measure(fn, device: torch.device):
    """(result, seconds, peak RSS delta GB, peak CUDA GB or None) of one call of ``fn``."""
    gc.collect()
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.wait(0.01):
            peak[0] = max(peak[0], _rss_bytes())

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    done.set()
    thread.join()
    peak[0] = max(peak[0], _rss_bytes())
    cuda_gb = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return out, seconds, (peak[0] - base) / 2**30, cuda_gb


class Recorder:
    def __init__(self, path: str | None, meta: dict) -> None:
        self.path, self.rows = path, []
        self.meta = meta

    def add(self, **row) -> None:
        row = {k: (round(v, 4) if isinstance(v, float) and k != "quantile" else v)
               for k, v in row.items()}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        if self.path:
            with open(self.path, "w") as f:
                json.dump({**self.meta, "rows": self.rows}, f, indent=1)


def run_size(n: int, args, rec: Recorder, device: torch.device) -> None:
    d, m, k = args.dim, 1000, 100
    x = gaussian_mixture(n, d, seed=0)
    common = {"n": n, "d": d, "device": str(device), "precision": args.precision}
    graph = None
    if "proximity" in args.components:
        graph, s, mem, cmem = measure(lambda: hb.proximity_graph(
            x, m, k, seed=0, device=device, precision=args.precision), device)
        rec.add(component="proximity_graph", method="ours (shared pools, blocked)", M=m, K=k,
                seconds=s, peak_rss_gb=mem, peak_cuda_gb=cmem, **common)
        if n <= args.reference_max:
            _, s, mem, _ = measure(lambda: per_item_gather_reference(x, m, k), torch.device("cpu"))
            rec.add(component="proximity_graph", method="reference: per-item gather + bmm",
                    M=m, K=k, seconds=s, peak_rss_gb=mem, n=n, d=d, device="cpu",
                    precision="fp32")
    if "walks" in args.components:
        if graph is None:
            graph = hb.proximity_graph(x, m, k, seed=0, device=device)
        hb.walk_batches(graph, 512, 2, restart=0.2)  # compile
        nb = 500
        _, s, mem, _ = measure(lambda: hb.walk_batches(graph, 512, nb, restart=0.2),
                               torch.device("cpu"))
        rec.add(component="walks", method="RWR B=512 alpha=0.2 (numba)", n=n, d=d, K=k,
                ms_per_batch=1000 * s / nb, seconds=s, peak_rss_gb=mem, device="cpu")
    graph = None
    if "knn" in args.components:
        methods = ["faiss-ivf"] + (["exact", "faiss"] if n <= args.exact_max else [])
        for method in methods:
            try:
                _, s, mem, cmem = measure(lambda method=method: hb.knn_graph(
                    x, k, method=method, device=device,
                    precision=args.precision if method == "exact" else "fp32"), device)
            except ImportError as exc:
                print("skip", method, exc)
                continue
            rec.add(component="knn_graph", method=method, K=k, seconds=s, peak_rss_gb=mem,
                    peak_cuda_gb=cmem, **common)
    if "gcbs" in args.components:
        q = 1.0 - 32.0 / n
        methods = [m for m in args.gcbs_methods if m != "exact" or n <= args.exact_max]
        parts = -(-n // args.cell_size)
        for method in methods:
            perm, s, mem, cmem = measure(lambda method=method: hb.gcbs_permutation(
                x, q, method=method, partitions=parts, device=device,
                precision=args.precision, min_partners=args.min_partners), device)
            top1 = batch_top1(x, perm.numpy(), 256) if n <= 400_000 else None
            extra = {"partitions": parts} if method == "partition" else {}
            rec.add(component="gcbs", method=method, quantile=q, seconds=s, peak_rss_gb=mem,
                    min_partners=args.min_partners,
                    peak_cuda_gb=cmem, batch_top1=top1, **extra, **common)
        if n <= 400_000:
            rec.add(component="gcbs", method="uniform batches (hardness only)", n=n, d=d,
                    batch_top1=batch_top1(x, np.random.default_rng(0).permutation(n), 256))
    gc.collect()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", nargs="*", type=int, default=[10_000, 100_000, 320_000, 1_281_167])
    p.add_argument("--components", nargs="*", default=["proximity", "walks", "knn", "gcbs"])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--reference-max", type=int, default=100_000,
                   help="largest N for the per-item gather + bmm reference")
    p.add_argument("--exact-max", type=int, default=100_000,
                   help="largest N for the O(N^2 d) exact kNN graph and exact GCBS")
    p.add_argument("--gcbs-methods", nargs="*", default=["ivf", "exact"],
                   help="GCBS methods: ivf, exact, faiss, partition")
    p.add_argument("--min-partners", type=int, default=None,
                   help="GCBS min_partners (default: the library's, 16; the rows recorded "
                        "before issue 22 had none: 0)")
    p.add_argument("--cell-size", type=int, default=100_000,
                   help="items per cell of GCBS method='partition' (partitions = N / this)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="write the results here (after every row)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    meta = {"machine": machine(), "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python benchmarks/bench_scaling.py " + " ".join(argv or
                                                                         os.sys.argv[1:])}
    rec = Recorder(args.json, meta)
    hb.proximity_graph(gaussian_mixture(5000, args.dim), 1000, 100)  # compile the kernels
    for n in sorted(args.sizes):
        run_size(n, args, rec, device)
    return rec.rows


if __name__ == "__main__":
    main()
