"""GCBS permutation: time and batch hardness of each method, the default and a plain reference.

    python benchmarks/bench_gcbs.py --data minilm --n 20000 --dims 384 --repeat 3 \\
        --methods default reference exact ivf --json benchmarks/results/gcbs_minilm20k.json
    python benchmarks/bench_gcbs.py --data mixture --n 100000 --dims 768 --repeat 3 \\
        --methods default --json benchmarks/results/gcbs_mixture100k.json
    python benchmarks/bench_gcbs.py --auto-scan --json benchmarks/results/gcbs_auto.json
    python benchmarks/bench_gcbs.py --dims 768 384 --methods ivf exact --min-partners 0  # old rows

Methods: ``default`` is ``hb.gcbs_permutation(x, quantile)`` with every default (``method="auto"``,
``min_partners`` default); ``exact``, ``ivf``, ``faiss``, ``partition`` name the method (with
``--min-partners``, default: the library's); ``reference`` is a plain blocked exact dense
implementation written here: the quantile of about 20M sampled similarities (whole rows,
products, ``torch.cat``, ``kthvalue``), then blocks of 1024 rows: ``X[s:e] @ X.T``, self
pairs out, the pairs above the threshold, and the same reverse Cuthill-McKee
(:func:`hardbatch.batching.gcbs.rcm_order`); no partners.

Data: ``minilm``, the shared Wikipedia sentences embedded with all-MiniLM-L6-v2 (384-d, real;
cached after the first run; ``--dims`` other than 384 map them through a fixed random
Gaussian projection and re-normalise), or ``mixture``, ``_common.gaussian_mixture(n, d)``
(1000 components). Quality: the mean top-1 negative cosine of the batches of 256 cut from
each permutation (higher = harder batches). Times: wall clock, 2 threads, best of
``--repeat`` calls (all of them in ``<method>_all_s``, their process CPU time in
``<method>_cpu_s``: on this shared machine a busy core slows 2-thread torch code several-fold).

``--auto-scan`` measures where ``method="auto"`` switches: exact vs ivf at N = 2.5k..40k
(MNIST PCA-64 and MiniLM, d = 64 and 384) and ivf vs partition (cells of 10k items) at
N = 100k..400k on the mixture (d = 128, quantile 1 - 32/N so that the pairs stay O(N)),
default ``min_partners``. Each row records the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from _common import gaussian_mixture, machine, mnist_pca64, wiki_minilm
from bench_gcbs_tail import batch_stats

import hardbatch as hb
from hardbatch.batching.gcbs import AUTO_CELL_ITEMS, rcm_order


def batch_top1(x: np.ndarray, order: np.ndarray, b: int) -> float:
    """Mean over the full batches of ``order`` of the batch hardness (mean top-1 cosine)."""
    return float(batch_stats(x, order, b)[0].mean())


def plain_threshold(x: np.ndarray, quantile: float, seed: int = 0,
                    sample_size: int = 20_000_000, rows: int = 1024) -> float:
    """The ``quantile`` of the off-diagonal similarities of about ``sample_size`` entries
    (whole sampled rows, as GCBS Appendix F suggests): products, concatenation, kthvalue."""
    n = len(x)
    pick = np.sort(np.random.default_rng(seed).permutation(n)[:min(n, -(-sample_size // n))])
    xt = torch.from_numpy(x)
    values = []
    for s in range(0, len(pick), rows):
        r = torch.from_numpy(pick[s:s + rows])
        sims = xt[r] @ xt.T
        sims[torch.arange(len(r)), r] = -torch.inf  # self pairs: the smallest, skipped
        values.append(sims.reshape(-1))
    flat = torch.cat(values)
    count = flat.numel() - len(pick)
    k = int(np.clip(np.ceil(quantile * count), 1, count)) + len(pick)
    return float(flat.kthvalue(k).values)


def dense_reference(x: np.ndarray, quantile: float, seed: int = 0, rows: int = 1024,
                    threshold: float | None = None):
    """Plain blocked exact GCBS (module docstring): threshold, X @ X.T blocks, pairs, RCM."""
    n = len(x)
    threshold = plain_threshold(x, quantile, seed) if threshold is None else threshold
    xt = torch.from_numpy(x)
    pr, pc = [], []
    for s in range(0, n, rows):
        sims = xt[s:s + rows] @ xt.T
        e = s + sims.shape[0]
        sims[torch.arange(e - s), torch.arange(s, e)] = -torch.inf
        r, c = torch.nonzero(sims > threshold, as_tuple=True)
        pr.append((r + s).numpy())
        pc.append(c.numpy())
    return rcm_order(np.concatenate(pr), np.concatenate(pc), n, seed)


def build(x: np.ndarray, quantile: float, method: str, min_partners, nprobe: int,
          partitions=None) -> np.ndarray:
    if method == "reference":
        return dense_reference(x, quantile).numpy()
    if method == "default":
        return hb.gcbs_permutation(x, quantile).numpy()
    return hb.gcbs_permutation(x, quantile, method=method, min_partners=min_partners,
                               nprobe=nprobe, partitions=partitions).numpy()


def run(x: np.ndarray, b: int, quantile: float, methods, nprobe: int, min_partners,
        partitions=None, repeat: int = 1) -> dict:
    out = {"n": len(x), "d": x.shape[1], "quantile": quantile, "batch_size": b,
           "min_partners": min_partners, "auto_resolves_to": hb.batching.gcbs.resolve_method("auto",
                                                                                   len(x))}
    out["loadavg_1min_before"] = os.getloadavg()[0]
    out["uniform_top1"] = batch_top1(x, np.random.default_rng(0).permutation(len(x)), b)
    for method in methods:
        times, cpu = [], []
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            perm = build(x, quantile, method, min_partners, nprobe, partitions)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out[f"{method}_s"] = min(times)
        out[f"{method}_all_s"] = times
        out[f"{method}_cpu_s"] = cpu  # process CPU time (both threads) of each call
        out[f"{method}_top1"] = batch_top1(x, perm, b)
        print(method, x.shape, round(out[f"{method}_s"], 2), "s, top1",
              round(out[f"{method}_top1"], 4), flush=True)
    if "reference" in methods and "default" in methods:
        out["default_speedup_vs_reference"] = out["reference_s"] / out["default_s"]
        out["default_vs_reference_top1"] = out["default_top1"] / out["reference_top1"] - 1
    if "exact" in methods and "ivf" in methods:
        out["ivf_vs_exact_top1"] = out["ivf_top1"] / out["exact_top1"] - 1
    return out


def auto_scan(b: int, quantile: float, nprobe: int, parts=("mnist", "minilm", "mixture")):
    """Rows of the ``method="auto"`` thresholds (module docstring)."""
    rows = []
    warm = gaussian_mixture(3000, 64)  # first calls pay one-off costs: not in the rows
    for method in ("exact", "ivf", "partition"):
        hb.gcbs_permutation(warm, quantile, method=method, partitions=2)
    sets = {"mnist": lambda: mnist_pca64()[0], "minilm": lambda: wiki_minilm(limit=100_000)}
    for name in [p for p in parts if p in sets]:
        base = sets[name]()
        for n in (2500, 5000, 10_000, 20_000, 40_000):
            x = np.ascontiguousarray(base[:n])
            rows.append({"data": name, **run(x, b, quantile, ["exact", "ivf"], nprobe, None)})
    for n in ((100_000, 200_000, 400_000) if "mixture" in parts else ()):
        x = gaussian_mixture(n, 128)  # quantile 1 - 32/N: O(N) pairs (GCBS Appendix J)
        rows.append({"data": "mixture_d128", **run(x, b, 1 - 32 / n, ["ivf", "partition"],
                                                   nprobe, None,
                                                   partitions=-(-n // AUTO_CELL_ITEMS))})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", choices=["minilm", "mixture"], default="minilm")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dims", type=int, nargs="+", default=[768, 384])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--quantile", type=float, default=0.999)
    p.add_argument("--nprobe", type=int, default=8)
    p.add_argument("--min-partners", type=int, default=None,
                   help="for the named methods (default: the library's; 0: the paper's graph)")
    p.add_argument("--methods", nargs="+", default=["default", "ivf", "exact"],
                   choices=["default", "reference", "exact", "ivf", "faiss", "partition"])
    p.add_argument("--repeat", type=int, default=1, help="best of this many calls per method")
    p.add_argument("--auto-scan", nargs="*", default=None, choices=["mnist", "minilm", "mixture"],
                   help="measure the auto thresholds on these sets (none named: all)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    results = {"machine": machine(), "runs": []}
    if args.auto_scan is not None:
        results["runs"] = auto_scan(args.batch_size, args.quantile, args.nprobe,
                                    args.auto_scan or ("mnist", "minilm", "mixture"))
    for d in ([] if args.auto_scan is not None else args.dims):
        if args.data == "mixture":
            x = gaussian_mixture(args.n, d)
        else:
            base = wiki_minilm(args.data_dir, limit=100_000)  # --n 20000: its first 20k rows
            x = base[: args.n]
            if d != base.shape[1]:
                proj = np.random.default_rng(0).standard_normal((base.shape[1], d))
                x = x @ proj.astype(np.float32)
                x /= np.linalg.norm(x, axis=1, keepdims=True)
        results["runs"].append(run(np.ascontiguousarray(x, np.float32), args.batch_size,
                                   args.quantile, args.methods, args.nprobe,
                                   args.min_partners, repeat=args.repeat))
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
