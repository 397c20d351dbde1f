"""GCBS permutation at N=100k: exact (blocked dense) vs approximate (faiss IVF range search).

    python benchmarks/bench_gcbs.py [--n 100000] [--dims 768 384] [--batch-size 256]

Data: the 100k shared Wikipedia sentences embedded with all-MiniLM-L6-v2 (384-d, real;
cached after the first run). For d=768 the same embeddings are mapped by a fixed random
Gaussian projection to 768 dims and re-normalised (a Johnson-Lindenstrauss map: similarities
are kept up to small noise), since no 768-d encoder is available offline. Quality: the mean
top-1 negative cosine of the batches cut from each permutation (higher = harder batches).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from _common import machine, wiki_minilm

import hardbatch as hb


def batch_top1(x: np.ndarray, order: np.ndarray, b: int) -> float:
    xt = torch.from_numpy(x)
    vals = []
    for s in range(0, len(order) - b + 1, b):
        e = xt[torch.from_numpy(order[s:s + b])]
        sims = e @ e.T
        sims.fill_diagonal_(-torch.inf)
        vals.append(sims.max(dim=1).values.mean().item())
    return float(np.mean(vals))


def run(x: np.ndarray, b: int, quantile: float, methods, nprobe: int) -> dict:
    out = {"n": len(x), "d": x.shape[1], "quantile": quantile, "batch_size": b}
    out["uniform_top1"] = batch_top1(x, np.random.default_rng(0).permutation(len(x)), b)
    for method in methods:
        t0 = time.perf_counter()
        perm = hb.gcbs_permutation(x, quantile, method=method, nprobe=nprobe).numpy()
        out[f"{method}_s"] = time.perf_counter() - t0
        out[f"{method}_top1"] = batch_top1(x, perm, b)
        print(method, x.shape, round(out[f"{method}_s"], 1), "s, top1",
              round(out[f"{method}_top1"], 4), flush=True)
    if "exact" in methods and "ivf" in methods:
        out["ivf_vs_exact_top1"] = out["ivf_top1"] / out["exact_top1"] - 1
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dims", type=int, nargs="+", default=[768, 384])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--quantile", type=float, default=0.999)
    p.add_argument("--nprobe", type=int, default=8)
    p.add_argument("--methods", nargs="+", default=["ivf", "exact"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    base = wiki_minilm(args.data_dir)[: args.n]
    results = {"machine": machine(), "runs": []}
    for d in args.dims:
        if d == base.shape[1]:
            x = base
        else:
            proj = np.random.default_rng(0).standard_normal((base.shape[1], d)).astype(np.float32)
            x = base @ proj
            x /= np.linalg.norm(x, axis=1, keepdims=True)
        results["runs"].append(run(np.ascontiguousarray(x), args.batch_size, args.quantile,
                                   args.methods, args.nprobe))
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
