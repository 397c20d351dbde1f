"""Retrieval samplers (issue 31): build time and peak memory of TAS-B's cluster sampler and B3's
community sampler, and the batches of every sampler side by side on real text embeddings.

    python benchmarks/bench_retrieval_samplers.py --wiki 20000 \
        --json benchmarks/results/retrieval_samplers.json
    python benchmarks/bench_retrieval_samplers.py --table benchmarks/results/retrieval_samplers.json

Real data: all-MiniLM-L6-v2 embeddings (384-d) of the shared Wikipedia sentences
(``_common.wiki_minilm``, cached; ``--wiki N`` of them). Scale: ``gaussian_mixture`` (d = 128,
1000 components), ``--big N`` items. Each build runs in a child process of its own, so its peak
resident memory (``ru_maxrss``, the embeddings included) is its own; a child that runs past
``--limit`` seconds is stopped and reported as such. Batch quality (one epoch of each sampler,
B = ``--batch``) is measured in the MiniLM embedding itself, the one fixed reference: hardness
(mean top-1 in-batch cosine), the share of in-batch pairs with cosine > 0.9 (near-duplicates:
the false negatives of unlabelled text) and the share of the items' 3 nearest neighbours that
share their batch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import torch
from _common import gaussian_mixture, machine, peak_rss_gb, wiki_minilm

import hardbatch as hb
from hardbatch.metrics import plan_stats

EXACT_KNN_MAX = 50_000  # above: the community sampler's kNN graph with faiss IVF


def knn_method(n: int) -> str:
    return "exact" if n <= EXACT_KNN_MAX else "faiss-ivf"


def options(name: str, n: int) -> dict:
    """The benchmark's options of sampler ``name`` over N fixed embeddings (built once)."""
    return {"knn": {"refresh_every": None},
            "proximity": {"candidates": 1000, "neighbors": 100, "refresh_every": None},
            "community": {"knn_method": knn_method(n)}}.get(name, {})


def data(kind: str, n: int) -> np.ndarray:
    return wiki_minilm(limit=n) if kind == "wiki" else gaussian_mixture(n, 128, seed=0)


def timed_parts(module, names: tuple[str, ...], seconds: dict) -> None:
    """Wrap ``module``'s functions ``names`` to add their wall time to ``seconds``."""
    for name in names:
        def wrapper(*args, _f=getattr(module, name), _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kw)
            finally:
                seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - t0
        setattr(module, name, wrapper)


def child(name: str, kind: str, n: int, b: int) -> dict:
    """One sampler's build and first epoch over fixed embeddings (run in a child process)."""
    x = data(kind, n)
    loaded = peak_rss_gb()
    parts: dict = {}
    timed_parts(sys.modules["hardbatch.samplers.community_sampler"],
                ("knn_graph", "community_labels", "separate_pairs"), parts)
    timed_parts(sys.modules["hardbatch.samplers.cluster_sampler"], ("spherical_clusters",), parts)
    t0 = time.perf_counter()
    sampler = hb.registry.make_sampler(name, x, b, **options(name, n))
    batches = list(sampler)
    out = {"epoch_s": time.perf_counter() - t0, "build_s": sampler.last_refresh_seconds,
           "peak_rss_gb": peak_rss_gb(), "data_rss_gb": loaded, "batches": len(batches),
           "parts_s": parts, **options(name, n)}
    for key in ("num_clusters", "fill_batches", "parts", "separated", "forced_pairs"):
        if hasattr(sampler, key):
            out[key] = int(getattr(sampler, key))
    return out


def run_child(name: str, kind: str, n: int, b: int, limit: float) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--data", kind, "--n", str(n),
           "--batch", str(b)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return {"skipped": f"stopped after {limit:.0f} s"}
    except subprocess.CalledProcessError as err:
        return {"failed": err.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def quality(x: np.ndarray, b: int) -> dict:
    """One epoch of every registered sampler, measured in ``x`` (the fixed reference)."""
    near = hb.knn_graph(torch.from_numpy(x), 3).numpy()
    rows = {}
    for name in hb.registry.sampler_names():
        t0 = time.perf_counter()
        sampler = hb.registry.make_sampler(name, x, b, seed=0, **options(name, len(x)))
        batches = list(sampler)
        seconds = time.perf_counter() - t0
        stats = plan_stats(x, batches, reference=x, near_duplicate=0.9)
        batch_of = np.full(len(x), -1)
        for k, batch in enumerate(batches):
            batch_of[batch] = k
        rows[name] = {"hardness": stats["reference_hardness"],
                      "mean_negative_similarity": stats["reference_mean_negative_similarity"],
                      "near_duplicate_pairs": stats["reference_near_duplicate_rate"],
                      "top3_together": float((batch_of[near] == batch_of[:, None]).mean()),
                      "coverage": stats["coverage"], "epoch_s": seconds}
        print(name, json.dumps(rows[name]), flush=True)
    return rows


def markdown(results: dict) -> str:
    b, wiki, big = results["batch"], results["wiki_n"], results["big_n"]
    lines = [f"Builds (fixed embeddings, B = {b}; the first epoch: build and plan; peak RSS of "
             "the process, embeddings included):", "",
             "| data | sampler | build (s) | epoch (s) | parts (s) | peak RSS (GB) | "
             "embeddings loaded (GB) | notes |", "|---|---|---|---|---|---|---|---|"]
    for data_name, rows in (("wiki MiniLM " + f"{wiki:,}", results["builds_wiki"]),
                            (f"mixture {big:,} x 128", results["builds_big"])):
        for name, r in rows.items():
            if "epoch_s" not in r:
                lines.append(f"| {data_name} | {name} | - | - | - | - | - | "
                             f"{r.get('skipped') or r.get('failed')} |")
                continue
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["parts_s"].items())
            notes = ", ".join(f"{k} {r[k]}" for k in ("num_clusters", "fill_batches", "parts",
                                                       "separated", "forced_pairs", "knn_method")
                              if k in r)
            lines.append(f"| {data_name} | {name} | {r['build_s']:.1f} | {r['epoch_s']:.1f} | "
                         f"{parts} | {r['peak_rss_gb']:.2f} | {r['data_rss_gb']:.2f} | {notes} |")
    lines += ["", f"Batches, wiki MiniLM {wiki:,} (one epoch, B = {b}, measured in the MiniLM "
              "embedding):", "",
              "| sampler | hardness (top-1 cos) | mean negative cos | pairs cos > 0.9 | "
              "3-NN in the batch | epoch (s) |", "|---|---|---|---|---|---|"]
    for name, r in results["quality"].items():
        lines.append(f"| {name} | {r['hardness']:.3f} | {r['mean_negative_similarity']:.3f} | "
                     f"{r['near_duplicate_pairs']:.2e} | {r['top3_together']:.3f} | "
                     f"{r['epoch_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wiki", type=int, default=100_000, help="Wikipedia sentences (N)")
    ap.add_argument("--big", type=int, default=1_000_000, help="synthetic items of the scale run")
    ap.add_argument("--big-samplers", default="cluster,community",
                    help="samplers built at --big items (community: kNN graph and METIS at 1M "
                         "ran past 300 s on 2 busy cores)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--limit", type=float, default=300.0, help="seconds per child build")
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None, help="print the markdown of a saved result")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default="wiki", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.data, args.n, args.batch)))
        return {}
    if args.table:
        with open(args.table) as f:
            print(markdown(json.load(f)))
        return {}
    t0 = time.perf_counter()
    x = wiki_minilm(limit=args.wiki)  # cached before the children read it
    results = {"machine": machine(), "batch": args.batch, "wiki_n": len(x), "big_n": args.big}
    results["builds_wiki"] = {name: run_child(name, "wiki", len(x), args.batch, args.limit)
                              for name in ("cluster", "community")}
    print(json.dumps(results["builds_wiki"]), flush=True)
    results["builds_big"] = {name: run_child(name, "mixture", args.big, args.batch, args.limit)
                             for name in args.big_samplers.split(",") if name}
    print(json.dumps(results["builds_big"]), flush=True)
    results["quality"] = quality(x, args.batch)
    results["wall_s"] = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
