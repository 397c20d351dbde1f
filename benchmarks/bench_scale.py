"""Ten million items on one machine (issue 46): the cluster (TAS-B) and community (B3) samplers'
builds at N = 100k (real MiniLM), 1M and 10M (Gaussian mixture, d = 128), their components,
peak memory, and what the cell-local community build loses.

    python benchmarks/bench_scale.py --runs wiki:100000 mixture:1000000 \
        --samplers cluster cluster@levels=3 community@cells=10000 community@global \
        --json benchmarks/results/scale.json
    python benchmarks/bench_scale.py --runs mixture:10000000 --samplers cluster@levels=3 \
        community@cells=10000 --json benchmarks/results/scale.json
    python benchmarks/bench_scale.py --quality --json benchmarks/results/scale.json
    python benchmarks/bench_scale.py --table benchmarks/results/scale.json

Data: ``wiki``: all-MiniLM-L6-v2 embeddings (d = 384) of the shared Wikipedia sentences
(``_common.wiki_minilm``, at most 100,000: the only real text here); ``mixture``: the
1000-component Gaussian mixture of ``_common.gaussian_mixture`` (d = 128, seed 0), kept in
``--cache`` as ``.npy`` so that the children load rather than draw it. Samplers (B = ``--batch``,
seed 0, the registry's defaults otherwise): ``cluster`` (``kmeans_levels=None``),
``cluster@levels=L`` (a k-means tree of L levels), ``community`` (its default at that N),
``community@cells=C`` (cells of about C items), ``community@global``
(``cells=CommunityCells(items=0)``); ``+workers=W`` runs the cell-local build in W threads (the
sampler's ``LOCAL_WORKERS``, 2).

Each build runs in a child process of its own (``--limit`` seconds at most): the first epoch
(build and order) over fixed embeddings, timed by component (wrappers around the functions the
samplers call: their wall seconds, and for the cells' kNN graphs, graph assembly and METIS,
which run in two worker threads, thread-seconds), the process's peak RSS (``ru_maxrss``) with
the embeddings and after loading them, the process's CPU seconds (at most twice the wall
time on 2 cores) and the load average before and after. The child saves the
epoch's order and the coarse cells into ``--cache``; ``--quality`` then measures, in the
embeddings themselves (the fixed reference), the batch hardness (mean over items of the largest
cosine to another item of their batch) of every saved order, that of a uniform order, and the
share of 2,000 sampled items' exact global top ``skip + window`` neighbours that lie in their
cell. Results are merged into ``--json`` (keyed by data, N and sampler).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from _common import gaussian_mixture, machine, wiki_minilm

import hardbatch as hb

SKIP, WINDOW = 3, 20  # the community sampler's defaults


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor()


def load(kind: str, n: int, cache: Path) -> np.ndarray:
    if kind == "wiki":
        return wiki_minilm(limit=n)
    path = cache / f"mixture_{n}_128.npy"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, gaussian_mixture(n, 128, seed=0))
    return np.load(path)


def sampler_of(name: str, x: np.ndarray, b: int):
    """``kind@option=value+option=value``: ``levels`` (kmeans_levels), ``cells`` (cells of that
    many items: ``cells=CommunityCells(items=...)``), ``global`` (``items=0``), ``workers``
    (the cell-local build's threads, a module constant)."""
    kind, _, variants = name.partition("@")
    opts: dict = {}
    for variant in filter(None, variants.split("+")):
        key, _, value = variant.partition("=")
        if key == "levels":
            opts["kmeans_levels"] = int(value)
        elif key == "cells":
            opts["cells"] = hb.CommunityCells(items=int(value))
        elif key == "global":
            opts["cells"] = hb.CommunityCells(items=0)
        elif key == "workers":
            sys.modules["hardbatch.samplers.community_sampler"].LOCAL_WORKERS = int(value)
        else:
            raise ValueError(f"unknown sampler variant {variant!r} in {name!r}")
    return hb.registry.make_sampler(kind, x, b, seed=0, **opts)


class Clock:
    """Wrappers that add a function's wall seconds (thread-seconds from worker threads) and
    call count under a component name, and the peak RSS after its last call."""

    def __init__(self) -> None:
        self.parts: dict = {}
        self.lock = threading.Lock()
        self.captured: dict = {}

    def wrap(self, module, name: str, part: str, capture: bool = False) -> None:
        f = getattr(module, name)

        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                out = f(*args, **kw)
                if capture:
                    self.captured[part] = out
                return out
            finally:
                with self.lock:
                    row = self.parts.setdefault(part, {"s": 0.0, "calls": 0})
                    row["s"] += time.perf_counter() - t0
                    row["calls"] += 1
                    row["rss_gb_after"] = rss_gb()
        setattr(module, name, wrapper)


def child(name: str, kind: str, n: int, b: int, cache: Path) -> dict:
    """One sampler's build and first epoch over fixed embeddings (run in a child process)."""
    x = load(kind, n, cache)
    loaded = rss_gb()
    clock = Clock()
    cs = sys.modules["hardbatch.samplers.community_sampler"]
    cl = sys.modules["hardbatch.samplers.cluster_sampler"]
    lc = sys.modules["hardbatch.batching.local_communities"]
    cm = sys.modules["hardbatch.batching.communities"]
    for module, fname, part in (
            (cs, "coarse_cells", "cells (k-means)"), (cs, "local_communities", "by cell (wall)"),
            (cs, "knn_graph", "kNN graph"), (lc, "cell_neighbors", "kNN graph"),
            (cm, "rank_graph", "graph assembly"), (cm, "metis_parts", "METIS"),
            (cs, "community_labels", "partition (wall)"), (cs, "rank_graph", "skipped pairs"),
            (cs, "group_order", "ordering"), (cs, "cell_order", "ordering"),
            (cs, "separate_pairs", "separation"), (cs, "separate_keys", "ordering"),
            (cl, "spherical_clusters", "k-means"), (cl, "kmeans_tree", "k-means"),
            (cl, "group_order", "ordering"), (cl, "separate_keys", "ordering")):
        clock.wrap(module, fname, part, capture=fname == "coarse_cells")
    load_avg = os.getloadavg()
    t0, cpu0 = time.perf_counter(), time.process_time()
    sampler = sampler_of(name, x, b)
    batches = list(sampler)
    epoch, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    tag = f"{kind}_{n}_{name.replace('@', '-').replace('=', '').replace('+', '-')}"
    order = np.concatenate([np.asarray(bt, np.int64) for bt in batches])
    np.save(cache / f"order_{tag}.npy", order)
    if "cells (k-means)" in clock.captured:
        np.save(cache / f"cells_{tag}.npy", clock.captured["cells (k-means)"])
    out = {"epoch_s": epoch, "build_s": sampler.last_refresh_seconds, "peak_rss_gb": rss_gb(),
           "data_rss_gb": loaded, "embeddings_gb": x.nbytes / 2**30, "batches": len(batches),
           "loadavg_before": [round(v, 2) for v in load_avg], "cpu_s": cpu,
           "loadavg_after": [round(v, 2) for v in os.getloadavg()], "parts": clock.parts,
           "order_file": str(cache / f"order_{tag}.npy"), "d": int(x.shape[1])}
    for key in ("num_clusters", "fill_batches", "parts", "separated", "forced_pairs",
                "cell_items_used", "kmeans_levels"):
        if hasattr(sampler, key):
            value = getattr(sampler, key)
            out["sampler_" + key] = None if value is None else int(value)
    return out


def run_child(name: str, kind: str, n: int, b: int, limit: float, cache: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--data", kind, "--n", str(n),
           "--batch", str(b), "--cache", str(cache)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return {"skipped": f"stopped after {limit:.0f} s"}
    except subprocess.CalledProcessError as err:
        lines = err.stderr.strip().splitlines()
        return {"failed": lines[-1] if lines else f"exit {err.returncode}",
                "wall_s": time.perf_counter() - t0}
    return json.loads(done.stdout.strip().splitlines()[-1])


def hardness(x: torch.Tensor, order: np.ndarray, b: int) -> float:
    """Mean over the items of full batches of the largest cosine to another item of theirs."""
    full = len(order) // b
    total = 0.0
    step = max(1, (1 << 16) // b)
    for s in range(0, full, step):
        e = min(full, s + step)
        rows = x[torch.from_numpy(order[s * b:e * b])].view(e - s, b, -1)
        sims = torch.bmm(rows, rows.transpose(1, 2))
        sims.diagonal(dim1=1, dim2=2).fill_(-2.0)
        total += float(sims.amax(2).double().sum())
    return total / (full * b)


def in_cell_share(x: torch.Tensor, cells: np.ndarray, samples: int = 2000) -> dict:
    """Share of sampled items' exact global top ``SKIP + WINDOW`` neighbours in their cell
    (all ranks; the window's ranks alone), and of their exact nearest neighbour."""
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(len(x), size=min(samples, len(x)), replace=False))
    k = SKIP + WINDOW
    q = x[torch.from_numpy(pick)]
    best_v = torch.full((len(pick), k), -torch.inf)
    best_i = torch.zeros((len(pick), k), dtype=torch.int64)
    rows = torch.arange(len(pick))
    for s in range(0, len(x), 1 << 16):  # blocks of [samples, 65536] similarities (0.5 GB)
        sims = q @ x[s:s + (1 << 16)].T
        mine = (pick >= s) & (pick < s + sims.shape[1])
        sims[rows[mine], torch.from_numpy(pick[mine] - s)] = -torch.inf  # the item itself
        top = sims.topk(min(k, sims.shape[1]), dim=1)
        v, i = torch.cat([best_v, top.values], 1), torch.cat([best_i, top.indices + s], 1)
        top = v.topk(k, dim=1)
        best_v, best_i = top.values, i.gather(1, top.indices)
    same = cells[best_i.numpy()] == cells[pick][:, None]
    return {"top_ranks": float(same.mean()), "window_ranks": float(same[:, SKIP:].mean()),
            "nearest": float(same[:, 0].mean()), "samples": int(len(pick))}


def quality(results: dict, b: int, cache: Path) -> None:
    """Hardness of every saved order and the cells' share of global neighbours, per data set."""
    by_data: dict = {}
    for key, row in results["runs"].items():
        if "order_file" in row and Path(row["order_file"]).exists():
            kind, n, name = key.split(":")
            by_data.setdefault((kind, int(n)), []).append((name, row))
    results.setdefault("quality", {})
    for (kind, n), rows in by_data.items():
        x = torch.from_numpy(load(kind, n, cache))
        x = torch.nn.functional.normalize(x, dim=1)
        key = f"{kind}:{n}"
        q = results["quality"].setdefault(key, {})
        q["uniform"] = hardness(x, np.random.default_rng(0).permutation(n), b)
        for name, row in rows:
            t0 = time.perf_counter()
            entry = {"hardness": hardness(x, np.load(row["order_file"]), b)}
            cells_file = row["order_file"].replace("order_", "cells_")
            if Path(cells_file).exists():
                entry["in_cell"] = in_cell_share(x, np.load(cells_file))
            entry["seconds"] = time.perf_counter() - t0
            q[name] = entry
            print(key, name, json.dumps(entry), flush=True)


def markdown(results: dict) -> str:
    lines = ["| data | N | d | sampler | build (s) | epoch (s) | components (s) | peak RSS (GB) | "
             "embeddings (GB) | hardness | load before / after (1 min) | when (UTC) | notes |",
             "|---" * 13 + "|"]
    quality_rows = results.get("quality", {})
    for key, r in results["runs"].items():
        kind, n, name = key.split(":")
        hard = quality_rows.get(f"{kind}:{n}", {}).get(name, {}).get("hardness")
        hard_s = "" if hard is None else f"{hard:.3f}"
        if "epoch_s" not in r:
            lines.append(f"| {kind} | {int(n):,} | | {name} | - | - | - | - | - | | | | "
                         f"{r.get('skipped') or r.get('failed')} |")
            continue
        parts = ", ".join(f"{k} {v['s']:.1f}" for k, v in r["parts"].items())
        notes = ", ".join(f"{k[8:]} {v}" for k, v in r.items() if k.startswith("sampler_")
                          and v is not None)
        load = " / ".join(f"{r[k][0]:.1f}" if r.get(k) else "-"
                          for k in ("loadavg_before", "loadavg_after"))
        when = str(r.get("when", "")).replace(" UTC", "")[5:16]
        lines.append(f"| {kind} | {int(n):,} | {r['d']} | {name} | {r['build_s']:.1f} | "
                     f"{r['epoch_s']:.1f} | {parts} | {r['peak_rss_gb']:.2f} | "
                     f"{r['embeddings_gb']:.2f} | {hard_s} | {load} | {when} | {notes} |")
    for key, q in quality_rows.items():
        lines.append(f"\n{key}: uniform hardness {q['uniform']:.3f}; " + "; ".join(
            f"{name}: in cell {e['in_cell']['top_ranks']:.3f} of the top {SKIP + WINDOW}, "
            f"{e['in_cell']['window_ranks']:.3f} of the window, {e['in_cell']['nearest']:.3f} "
            "of the nearest" for name, e in q.items() if isinstance(e, dict) and "in_cell" in e))
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", default=[], help="data:N, e.g. wiki:100000")
    ap.add_argument("--samplers", nargs="*", default=["cluster", "community"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--limit", type=float, default=2400.0, help="seconds per child build")
    ap.add_argument("--cache", default="/tmp/hardbatch_scale")
    ap.add_argument("--json", default=None, help="results merged into this file")
    ap.add_argument("--quality", action="store_true", help="hardness and cells' neighbours")
    ap.add_argument("--table", default=None, help="print the markdown of a saved result")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default="wiki", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    if args.child:
        print(json.dumps(child(args.child, args.data, args.n, args.batch, cache)))
        return {}
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return {}
    results = json.loads(Path(args.json).read_text()) if args.json and Path(
        args.json).exists() else {}
    results.update(machine=machine(), cpu=cpu_model(), batch=args.batch,
                   versions={"torch": torch.__version__, "numpy": np.__version__})
    results.setdefault("runs", {})
    for spec in args.runs:
        kind, n = spec.split(":")
        load(kind, int(n), cache)  # cached before the children read it
        for name in args.samplers:
            row = run_child(name, kind, int(n), args.batch, args.limit, cache)
            row["when"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            results["runs"][f"{kind}:{n}:{name}"] = row
            print(kind, n, name, json.dumps(row), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    if args.quality:
        quality(results, args.batch, cache)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
