"""Plan stability: the share of a sampler's batches that stay identical when the embeddings
carry tiny relative noise (two machines' matrix kernels; issue 45).

    python benchmarks/bench_plan_stability.py --n 20000 --data minilm mnist \
        --samplers uniform knn proximity gcbs cluster community community@cells=2 \
        community@cells=4 community@cells=8 --json benchmarks/results/plan_stability.json
    python benchmarks/bench_plan_stability.py --n 2000 --samplers community   # a quick look

Data: ``minilm``, the shared Wikipedia sentences embedded with all-MiniLM-L6-v2
(``_common.wiki_minilm``, cached; its first ``--n``), and ``mnist``, MNIST train in 64 PCA
dimensions (``_common.mnist_pca64``; its first ``--n``). For every sampler (the registry's
defaults, ``batch_size`` B, ``seed``) one epoch is drawn from the unit rows x and one from
x * (1 + eps * N(0, 1)) per entry (NumPy ``default_rng(--noise-seed)``, float32) for each eps;
a batch is identical when plan batch i holds the same items in the same order in both.
``community`` is the community sampler's default (``cells.batches = 0``: one METIS run over
the whole graph, B3's); ``community@global`` the same; ``community@cells=C``: the opt-in local
build, cells of about C batches (the
default: 2). Prints a Markdown table per data set; ``--json`` keeps every count, the epoch
times (build included) and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from _common import machine, mnist_pca64, wiki_minilm

import hardbatch as hb

SAMPLERS = ("uniform", "knn", "proximity", "gcbs", "cluster", "community", "community@cells=2")
VARIANTS = SAMPLERS + ("community@global", "community@cells=4", "community@cells=8")
EPS = (1e-7, 1e-6, 1e-5)


def epoch(name: str, x: np.ndarray, batch_size: int, seed: int) -> list[list[int]]:
    """One epoch's batches of sampler ``name`` over ``x`` (``@global``: one METIS run;
    ``@cells=C``: cells of about C batches)."""
    kind, _, variant = name.partition("@")
    extra = {"cells": hb.CommunityCells(
        batches=0 if variant == "global" else int(variant.split("=")[1]))} if variant else {}
    sampler = hb.registry.make_sampler(kind, x, batch_size, seed=seed, **extra)
    return [list(map(int, b)) for b in sampler]


def noisy(x: np.ndarray, eps: float, seed: int) -> np.ndarray:
    """``x * (1 + eps * N(0, 1))`` per entry, float32."""
    r = np.random.default_rng(seed)
    return (x * (1.0 + eps * r.standard_normal(x.shape))).astype(np.float32)


def measure(name: str, x: np.ndarray, args) -> dict:
    t = time.perf_counter()
    base = epoch(name, x, args.batch_size, args.seed)
    row = {"sampler": name, "batches": len(base), "epoch_s": time.perf_counter() - t}
    for eps in args.eps:
        other = epoch(name, noisy(x, eps, args.noise_seed), args.batch_size, args.seed)
        same = sum(a == b for a, b in zip(base, other))
        row[f"identical@{eps:g}"] = same
        row[f"share@{eps:g}"] = same / len(base)
        print(f"  {name} eps={eps:g}: {same}/{len(base)} identical", flush=True)
    return row


def load(name: str, n: int) -> np.ndarray:
    """The first ``n`` unit rows of data set ``name``."""
    if name == "mnist":
        x = mnist_pca64()[0][:n].astype(np.float64)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return wiki_minilm(limit=max(n, 20_000))[:n]  # the cached 20k, or more


def table(result: dict) -> str:
    eps = result["eps"]
    lines = [f"{result['data']}:", "",
             "| sampler | " + " | ".join(f"identical at {e:g}" for e in eps) + " |",
             "|---|" + "---|" * len(eps)]
    for row in result["rows"]:
        n = row["batches"]
        lines.append(f"| {row['sampler']} | " + " | ".join(
            f"{row[f'identical@{e:g}']}/{n} ({row[f'share@{e:g}']:.0%})" for e in eps) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="the samplers' seed")
    p.add_argument("--noise-seed", type=int, default=1)
    p.add_argument("--eps", type=float, nargs="+", default=list(EPS))
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=VARIANTS)
    p.add_argument("--data", nargs="+", default=["minilm"], choices=["minilm", "mnist"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    out = {"machine": machine(), "command": "python benchmarks/bench_plan_stability.py "
           + " ".join(sys.argv[1:]), "runs": []}
    for data in args.data:
        x = load(data, args.n)
        result = {"data": f"{data} {len(x)} x {x.shape[1]}", "n": len(x),
                  "batch_size": args.batch_size, "seed": args.seed,
                  "noise_seed": args.noise_seed, "eps": args.eps,
                  "loadavg_1min_before": os.getloadavg()[0], "rows": []}
        for name in args.samplers:
            result["rows"].append(measure(name, x, args))
        result["loadavg_1min_after"] = os.getloadavg()[0]
        out["runs"].append(result)
        print(table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
