"""Exact kNN (issue 46, item 3): the top-k selections of ``exact_neighbors`` against the bare
products of the same blocks, in the same run.

    python benchmarks/bench_exact_knn.py --json benchmarks/results/exact_knn_cpu.json

The CPU-scale run of the GPU check's ``knn`` section (``gpu_check.py`` calls :func:`measure`
at N = 1,000,000 on CUDA). Here: N = 100,000, d = 128, K = 100, one thread, the CPU's row
blocks (4M similarities: 41 rows), the first ``--rows`` rows searched (the time is linear in
the rows). Arms, for fp32 and bf16 (on the CPU the bf16 product is rounded to bf16 and widened,
so similarities tie everywhere): ``bare`` (the products of the same blocks alone, matmul
only), ``topk`` (one ``torch.topk`` per row: today's selection, the CPU's default) and
``grouped`` (group maxima: the CUDA default) at each ``--groups`` size (``auto``:
``group_size(N, K)``). Each arm's best of ``--repeat`` interleaved rounds; per arm the
seconds, the ratio to ``bare`` of the same precision, recall@K on ``--sample`` rows against
fp64 products, and the share of rows equal to ``topk``'s (``equal_rows``: same order;
``equal_sets``: same items).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from hardbatch._device import block_elements, check_precision, matmul_fp32
from hardbatch.neighbors.exact_search import exact_neighbors, group_size


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> tuple[float, float | None, object]:
    """Seconds of ``fn()`` with the device synchronised at both ends, the peak CUDA memory it
    added (GiB; None on the CPU) and its result."""
    _sync(device)
    base = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    seconds = time.perf_counter() - t0
    peak = None if base is None else (torch.cuda.max_memory_allocated(device) - base) / 2**30
    return seconds, peak, out


def _bare(emb: torch.Tensor, rows: torch.Tensor, block: int) -> None:
    for s in range(0, len(rows), block):
        matmul_fp32(emb[rows[s:s + block]], emb.T)


def measure(x: torch.Tensor, k: int, rows: torch.Tensor, block: int,
            precisions=("fp32", "bf16"), groups=(None,), sample: int = 500, repeat: int = 1,
            graph: bool = False) -> list[dict]:
    """The rows of the measurement (module docstring) on ``x``'s device: ``rows`` searched by
    blocks of ``block`` rows; ``graph``: also ``hb.knn_graph`` end to end (``rows`` must be
    all N), the path users call (its default selection, a copy to the host per block)."""
    device, n = x.device, x.shape[0]
    pick = torch.linspace(0, len(rows) - 1, min(sample, len(rows))).long()
    truth = exact_neighbors(x.double().cpu(), rows[pick].cpu(), k, selection="topk")
    out = []
    for precision in precisions:
        emb = x.to(check_precision(precision))
        arms = {"bare": lambda: _bare(emb, rows, block),
                "topk": lambda: exact_neighbors(emb, rows, k, block, selection="topk")}
        sizes = sorted({group_size(n, k) if g in (None, "auto") else int(g) for g in groups})
        for size in sizes:
            arms[f"grouped C={size}"] = (lambda size=size: exact_neighbors(
                emb, rows, k, block, selection="grouped", group=size))
        if graph:
            import hardbatch as hb

            arms["knn_graph"] = lambda: hb.knn_graph(x, k, method="exact", device=device,
                                                     precision=precision, progress=False)
        warm = rows[:block]  # kernels, handles and the allocator's blocks
        _bare(emb, warm, block)
        for size in sizes:
            exact_neighbors(emb, warm, k, block, selection="grouped", group=size)
        exact_neighbors(emb, warm, k, block, selection="topk")
        best, peaks, results = {}, {}, {}
        for _ in range(repeat):
            for name, fn in arms.items():
                seconds, peak, res = _timed(fn, device)
                if seconds < best.get(name, float("inf")):
                    best[name], peaks[name] = seconds, peak
                if name != "bare" and name not in results:
                    results[name] = res.to(device)
                del res
        ref = results["topk"]
        for name, seconds in best.items():
            row = {"what": f"exact kNN {precision}: {name}", "seconds": round(seconds, 3),
                   "vs_bare": round(seconds / best["bare"], 3), "n": n, "rows": len(rows),
                   "block_rows": block, "neighbors": k}
            if peaks[name] is not None:
                row["peak_gib"] = round(peaks[name], 3)
            if name in results:
                got = results[name]
                hits = (got[pick].cpu()[:, :, None] == truth[:, None, :]).any(2)
                row.update(recall_at_k=round(float(hits.float().mean()), 4),
                           equal_rows=round(float((got == ref).all(1).float().mean()), 6),
                           equal_sets=round(float((got.sort(1).values == ref.sort(1).values)
                                                  .all(1).float().mean()), 6))
            out.append(row)
        del results, ref
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--rows", type=int, default=2050, help="rows searched (a prefix)")
    parser.add_argument("--groups", nargs="+", default=["auto", "32"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--sample", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import gaussian_mixture, machine

    x = torch.from_numpy(gaussian_mixture(args.n, args.d))
    device = torch.device("cpu")
    block = max(1, block_elements(device) // args.n)
    rows = torch.arange(min(args.rows, args.n))
    result = {"command": " ".join(["python", *sys.argv]), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "load_average_1_5_15min": [round(v, 1) for v in os.getloadavg()],
              "config": vars(args) | {"block_rows": block, "data": "gaussian_mixture"},
              "rows": measure(x, args.k, rows, block, args.precisions, args.groups,
                              args.sample, args.repeat)}
    for row in result["rows"]:
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
