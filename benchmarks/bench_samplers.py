"""Speed and memory of graph construction and walks (issue targets in docs/benchmarks.md).

    python benchmarks/bench_samplers.py            # all
    python benchmarks/bench_samplers.py --only graph60k walks imagenet

Real data: MNIST train (60k) in 64 PCA dims. ImageNet scale: 1.28M synthetic unit vectors
(d=128, a 1000-component Gaussian mixture) since no ImageNet embeddings are available here;
speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

import numpy as np
import torch
from _common import best_of, gaussian_mixture, machine, mnist_pca64, peak_rss_gb

import hardbatch as hb


def per_item_gather_reference(x: np.ndarray, m: int, k: int, seed: int = 0) -> torch.Tensor:
    """The authors' approach: every item gathers its own M candidates, then a batched matmul."""
    e = torch.from_numpy(x)
    n, d = e.shape
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(n, k, dtype=torch.int64)
    for s in range(0, n, 256):
        idx = torch.arange(s, min(n, s + 256))
        cand = torch.randint(0, n - 1, (len(idx), m), generator=gen)
        cand += (cand >= idx[:, None]).long()
        sims = torch.bmm(e[cand], e[idx].unsqueeze(2)).squeeze(2)
        out[idx] = torch.gather(cand, 1, sims.topk(k, dim=1).indices)
    return out


def python_rwr(graph: list[list[int]], start: int, alpha: float, b: int, rnd) -> list[int]:
    """BatchSampler Algorithm 3 with a Python loop per step."""
    s, seen, v = [], set(), start
    while len(s) < b:
        if v not in seen:
            seen.add(v)
            s.append(v)
        v = start if rnd.random() < alpha else graph[v][rnd.randrange(len(graph[v]))]
    return s


def bench_graph60k(x):
    hb.proximity_graph(x[:5000], 1000, 100)  # compile the numba kernels
    ours = best_of(lambda: hb.proximity_graph(x, 1000, 100, seed=0))
    ref = best_of(lambda: per_item_gather_reference(x, 1000, 100), repeat=1)
    knn = best_of(lambda: hb.knn_graph(x, 100), repeat=1)
    return {"proximity_graph_s": ours, "per_item_gather_bmm_s": ref, "knn_graph_s": knn}


def bench_walks(x):
    graph = hb.proximity_graph(x, 1000, 100, seed=0)
    n_batches = 1000
    hb.walk_batches(graph, 512, 2, restart=0.2)
    res = {}
    for walk in ("rwr", "rw", "bfs", "dfs"):
        t = best_of(lambda: hb.walk_batches(graph, 512, n_batches, walk=walk, restart=0.2))
        res[f"{walk}_ms_per_batch"] = 1000 * t / n_batches
    adj = graph.tolist()
    rnd = random.Random(0)
    t = best_of(lambda: [python_rwr(adj, rnd.randrange(len(adj)), 0.2, 512, rnd)
                         for _ in range(20)], repeat=1)
    res["python_loop_rwr_ms_per_batch"] = 1000 * t / 20
    sampler = hb.ProximityGraphSampler(x, 512, 1000, 100, restart=hb.LinearDecay(0.2, 0.05),
                                       epochs=1, refresh_every=100)
    t0 = time.perf_counter()
    n = sum(1 for _ in sampler)
    res["sampler_epoch_s_incl_graph"] = time.perf_counter() - t0
    res["sampler_batches"] = n
    return res


def _imagenet_child(n: int, d: int, m: int, k: int) -> dict:
    x = gaussian_mixture(n, d)
    hb.proximity_graph(x[:20000], m, k)  # compile
    base = peak_rss_gb()
    t0 = time.perf_counter()
    g = hb.proximity_graph(x, m, k, seed=0)
    seconds = time.perf_counter() - t0
    return {"n": n, "d": d, "seconds": seconds, "peak_extra_gb": peak_rss_gb() - base,
            "output_gb": g.numel() * 8 / 2**30, "embeddings_gb": x.nbytes / 2**30}


def bench_imagenet(n=1_281_167, d=128, m=1000, k=100):
    # A fresh process so that peak RSS measures this step alone.
    code = (f"import json,sys; sys.path.insert(0, 'benchmarks'); import bench_samplers as b; "
            f"print(json.dumps(b._imagenet_child({n}, {d}, {m}, {k})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="*", default=["graph60k", "walks", "imagenet"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    results = {"machine": machine()}
    x = None
    if {"graph60k", "walks"} & set(args.only):
        x, _ = mnist_pca64(args.data_dir)
    if "graph60k" in args.only:
        results["graph60k"] = bench_graph60k(x)
        print("graph60k", results["graph60k"], flush=True)
    if "walks" in args.only:
        results["walks"] = bench_walks(x)
        print("walks", results["walks"], flush=True)
    if "imagenet" in args.only:
        results["imagenet"] = bench_imagenet()
        print("imagenet", results["imagenet"], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
