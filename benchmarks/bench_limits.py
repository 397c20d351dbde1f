"""The two builds at ImageNet scale against their limits and their previous versions (issue 33).

    python benchmarks/bench_limits.py --json benchmarks/results/scaling_limits.json
    python benchmarks/bench_limits.py --components proximity --repeat 3
    python benchmarks/bench_limits.py --components proximity --update \
        --json benchmarks/results/scaling_limits.json

Data: N = 1,281,167 unit rows, d = 128, a 1000-component Gaussian mixture (``_common``).
Every row of the JSON holds seconds (wall), CPU seconds of the process, the load average at
the start, and the peak RSS beyond the embeddings (sampled every 10 ms); timings are the best
of ``--repeat`` runs. With ``--update`` the rows of the components not measured are kept from
the JSON file, each with the date and command of its own run. In the same process:

- ``proximity``: :func:`hardbatch.proximity_graph` (M = 1000, K = 100); the *limit*: the same
  batched products ([g, d] x [d, M] for each of the N / g groups sharing a pool) with the
  candidates already in place (no gather, no selection), split over the same worker threads,
  in blocks of the build's size, of 1, 2 and 4 groups, and of 32 groups (the build's blocks
  before issue 46): the fastest is the limit; and the *previous build* (before issue 33:
  per-block gather of the pools' rows, batched product, ``torch.topk`` with the torch
  threads), whose graph must equal ours.
- ``gcbs``: :func:`hardbatch.gcbs_permutation` with the default ``method="auto"`` (at this N:
  ``partition`` into cells of ~2,500 items, ``AUTO_CELL_ITEMS``), then ``partition`` into cells
  of ~10,000 items (the default before issue 33), and that same partition run as before issue
  33 (selection of the pairs by torch: threshold mask, ``nonzero``, ``topk`` of the short rows;
  row blocks of ~16M similarities; cells one after the other), whose order must equal it.
  Quantile 1 - 32/N, the default ``min_partners`` (16), and the batch hardness (mean top-1
  cosine inside batches of 256) of each order.
- ``cells`` (``--components cells``): how the cell size of ``partition`` trades time against
  batch hardness (the choice of ``AUTO_CELL_ITEMS``): cells of 10,000 / 5,000 / 2,500 / 1,250
  items and ``ivf`` on MNIST train (PCA-64), MiniLM (20k Wikipedia sentences, d = 384, when
  cached) and the mixture (N = 100k and 320k, d = 128).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import threading
import time

import numpy as np
import torch
from _common import gaussian_mixture, machine
from bench_gcbs import batch_top1
from bench_scaling import Recorder, measure

import hardbatch as hb
from hardbatch._device import BLOCK_ELEMENTS_CPU
from hardbatch._logging import NO_BAR
from hardbatch.batching.gcbs import PartitionLayout
from hardbatch.batching.gcbs import pairs as gcbs_pairs
from hardbatch.neighbors.knn_graph import ProximityGraphLayout


def sgemm_limit(layout: ProximityGraphLayout, threads: int, per: int) -> None:
    """The build's products alone: every group's [g, d] x [d, M], candidates not gathered,
    in blocks of ``per`` groups."""
    x, g, m = layout.x, layout.g, layout.candidates
    blocks = iter(range(-(-layout.n_groups // per)))
    cand = x[torch.arange(per * m) % x.shape[0]].reshape(per, m, -1)
    lock = threading.Lock()

    def work():
        torch.set_num_threads(1)
        out = torch.empty(per, g, m)
        while True:
            with lock:
                b = next(blocks, None)
            if b is None:
                return
            s = b * per
            e = min(layout.n_groups, s + per)
            rows = x[s * g:e * g]
            if rows.shape[0] < (e - s) * g:  # the padded last group
                rows = torch.cat([rows, rows.new_zeros((e - s) * g - rows.shape[0], x.shape[1])])
            torch.bmm(rows.view(e - s, g, -1), cand[:e - s].transpose(1, 2), out=out[:e - s])

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    torch.set_num_threads(threads)


def previous_proximity_graph(x: np.ndarray, m: int, k: int, seed: int = 0) -> torch.Tensor:
    """The build before issue 33: gather each block's pool rows, bmm, torch.topk."""
    layout = ProximityGraphLayout(x, m, k, seed, None, None, "fp32")
    emb, g, per = layout.x, layout.g, old_block_groups(layout)
    out = torch.empty((layout.num_items, k), dtype=torch.int64)
    for s in range(0, layout.n_groups, per):
        mem = layout.members[s:s + per]
        pool = layout.pools[s:s + per].to(torch.int64)
        blk = mem.shape[0]
        cand = torch.index_select(emb, 0, pool.reshape(-1)).view(blk, m, -1)
        query = torch.index_select(emb, 0, mem.clamp(min=0).reshape(-1))
        sims = torch.bmm(query.view(blk, g, -1), cand.transpose(1, 2))
        ids = torch.gather(pool.unsqueeze(1).expand(blk, g, m), 2,
                           sims.topk(k, dim=2, sorted=True).indices).reshape(-1, k)
        valid = mem.reshape(-1) >= 0
        out[mem.reshape(-1)[valid]] = ids[valid]
    return out


def previous_hits(self, sims, self_col):
    """PairSearchLayout._hits before issue 33 (torch: mask, nonzero, topk of the short rows)."""
    self.block_bytes = max(self.block_bytes, sims.numel() * 5)
    mine = torch.nonzero(self_col >= 0).squeeze(1)
    sims[mine, self_col[mine]] = -torch.inf
    r, c = torch.nonzero(sims > self.threshold, as_tuple=True)
    if self.min_partners:
        r2, c2 = gcbs_pairs.strongest_partners(sims, r, self.min_partners, self.threshold)
        r, c = torch.cat([r, r2]), torch.cat([c, c2])
    return r, c


@contextlib.contextmanager
def previous_gcbs():
    """GCBS as before issue 33: torch selection (:func:`previous_hits`), row blocks of ~16M
    similarities, cells one after the other with the torch threads."""
    saved = (gcbs_pairs.PairSearchLayout._hits, gcbs_pairs.block_elements, PartitionLayout.order)
    gcbs_pairs.PairSearchLayout._hits = previous_hits
    gcbs_pairs.block_elements = lambda device: 16 * saved[1](device)  # old rows per block
    PartitionLayout.order = lambda self, start, end, bar=None, log=None: np.concatenate(
        [np.empty(0, np.int64)] + [self._cell_order(c, bar or NO_BAR, log)
                                   for c in self.chain[start:end]])
    try:
        yield
    finally:
        gcbs_pairs.PairSearchLayout._hits, gcbs_pairs.block_elements, PartitionLayout.order = saved


def old_block_groups(layout: ProximityGraphLayout) -> int:
    """Groups per block of the build before issue 46 (32 at M = 1000, d = 128): similarities
    and gathered candidate floats each under ``BLOCK_ELEMENTS_CPU``."""
    return max(1, BLOCK_ELEMENTS_CPU // (layout.width * max(layout.g, layout.x.shape[1])))


COMPONENT_OF_ROW = {"proximity_graph": "proximity", "gcbs": "gcbs", "gcbs cells": "cells"}


def kept_rows(path: str | None, measured: list[str]) -> list[dict]:
    """The rows of ``path`` (a JSON of this script) of the components not in ``measured``,
    each holding the date, command and machine of its own run."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    run = {key: old[key] for key in ("date", "command", "machine", "cpu") if key in old}
    return [{**run, **row} for row in old.get("rows", [])
            if COMPONENT_OF_ROW.get(row.get("component")) not in measured]


def cpu_model() -> str:
    """The processor as lscpu names it, with its family and model numbers (Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines()
                        if ":" in line)
    except OSError:
        return "unknown"
    get = {key.strip(): value.strip() for key, value in info.items()}.get
    return f"{get('model name', '?')} (family {get('cpu family', '?')}, model {get('model', '?')})"


def busy_seconds() -> float:
    """CPU seconds all processes of the machine have run so far (Linux ``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def timed(fn, repeat: int):
    """(result, best wall s, its CPU s, peak RSS GB of that run, load average at its start,
    CPU s that other processes ran meanwhile: ~0 on an idle machine)."""
    best = None
    for _ in range(repeat):
        load = os.getloadavg()[0]
        b0, c0 = busy_seconds(), time.process_time()
        out, s, mem, _ = measure(fn, torch.device("cpu"))
        cpu = time.process_time() - c0
        others = busy_seconds() - b0 - cpu
        if best is None or s < best[1]:
            best = (out, s, cpu, mem, load, others)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=1_281_167)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--components", nargs="*", default=["proximity", "gcbs"])
    p.add_argument("--repeat", type=int, default=2, help="runs of each measurement (best kept)")
    p.add_argument("--no-previous", action="store_true", help="skip the previous versions")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--update", action="store_true",
                   help="keep the --json file's rows of the components not measured")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = {"machine": machine(), "cpu": cpu_model(), "load_at_start": os.getloadavg(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python benchmarks/bench_limits.py " + " ".join(argv or os.sys.argv[1:])}
    rec = Recorder(args.json, meta)
    if args.update:
        rec.rows = kept_rows(args.json, args.components)
    n, d = args.n, args.dim
    x = gaussian_mixture(n, d, seed=0)
    common = {"n": n, "d": d}
    if "proximity" in args.components:
        m, k = 1000, 100
        hb.proximity_graph(x[:20000], m, k)  # compile the kernels
        graph, s, cpu, mem, load, others = timed(lambda: hb.proximity_graph(x, m, k, seed=0),
                                                 args.repeat)
        rec.add(component="proximity_graph", method="ours", M=m, K=k, seconds=s, cpu_seconds=cpu,
                peak_rss_gb=mem, load=load, others_cpu=round(others, 2), **common)
        ours = s
        layout = ProximityGraphLayout(x, m, k, 0, None, None, "fp32")
        limits = []
        for per in sorted({layout.per_block, 1, 2, 4, old_block_groups(layout)}):
            _, s, cpu, mem, load, others = timed(
                lambda per=per: sgemm_limit(layout, args.threads, per), args.repeat)
            limits.append((s, cpu, load, others, per))
        s, cpu, load, others, per = min(limits)
        rec.add(component="proximity_graph", method="limit: the same sgemm products only",
                M=m, K=k, gflop=round(2 * layout.n_groups * layout.g * m * d / 1e9), seconds=s,
                cpu_seconds=cpu, load=load, others_cpu=round(others, 2), block_groups=per,
                other_blocks={str(p): round(t, 4) for t, _, _, _, p in limits if p != per},
                ratio=round(ours / s, 2), **common)
        if not args.no_previous:
            old, s, cpu, mem, load, others = timed(lambda: previous_proximity_graph(x, m, k), 1)
            rec.add(component="proximity_graph", method="previous build (before issue 33)",
                    M=m, K=k, seconds=s, cpu_seconds=cpu, peak_rss_gb=mem, load=load,
                    others_cpu=round(others, 2),
                    same_graph=bool(torch.equal(old, graph)), **common)
        graph = old = None
    if "gcbs" in args.components:
        q = 1.0 - 32.0 / n
        hb.gcbs_permutation(x[:20000], q)  # compile the kernels
        order, s, cpu, mem, load, others = timed(lambda: hb.gcbs_permutation(x, q), args.repeat)
        method, _, cells = gcbs_pairs.resolve_build("auto", None, None, n)
        label = f", {cells} cells" if method == "partition" else ""
        rec.add(component="gcbs", method=f"default (auto: {method}{label})", quantile=q,
                seconds=s, cpu_seconds=cpu, peak_rss_gb=mem, load=load, others_cpu=round(others, 2),
                batch_top1=batch_top1(x, order.numpy(), 256), **common)
        cells = -(-n // 10_000)
        order, s, cpu, mem, load, others = timed(lambda: hb.gcbs_permutation(
            x, q, method="partition", partitions=cells), 1)
        rec.add(component="gcbs", method=f"partition, {cells} cells of ~10,000", quantile=q,
                seconds=s, cpu_seconds=cpu, peak_rss_gb=mem, load=load, others_cpu=round(others, 2),
                batch_top1=batch_top1(x, order.numpy(), 256), **common)
        if not args.no_previous:
            with previous_gcbs():
                old, s, cpu, mem, load, others = timed(lambda: hb.gcbs_permutation(
                    x, q, method="partition", partitions=cells), 1)
            rec.add(component="gcbs", method=f"partition, {cells} cells, before issue 33",
                    quantile=q, seconds=s, cpu_seconds=cpu, peak_rss_gb=mem, load=load,
                    others_cpu=round(others, 2),
                    same_order=bool(torch.equal(old, order)), **common)
    if "cells" in args.components:
        cell_scan(rec)
    return rec.rows


def cell_scan(rec: Recorder) -> None:
    """Time and batch hardness of ``partition`` by cell size, and of ``ivf``, per data set."""
    from _common import CACHE, mnist_pca64
    sets = {"mixture_d128": lambda: gaussian_mixture(100_000, 128, seed=0),
            "mixture320k_d128": lambda: gaussian_mixture(320_000, 128, seed=0),
            "mnist60k_pca64": lambda: mnist_pca64()[0]}
    if (CACHE / "wiki20000_minilm.npy").exists():
        sets["minilm20k_d384"] = lambda: np.load(CACHE / "wiki20000_minilm.npy")
    for name, load_data in sets.items():
        x = load_data()
        n = len(x)
        q = 1.0 - 32.0 / n
        runs = [(f"partition, cells of ~{c:,}", dict(method="partition", partitions=-(-n // c)))
                for c in (10_000, 5_000, 2_500, 1_250) if c < n] + [("ivf", dict(method="ivf"))]
        for label, kw in runs:
            order, s, cpu, mem, load, others = timed(
                lambda kw=kw: hb.gcbs_permutation(x, q, **kw), 1)
            rec.add(component="gcbs cells", data=name, n=n, d=x.shape[1], method=label,
                    seconds=s, cpu_seconds=cpu, load=load, others_cpu=round(others, 2),
                    batch_top1=batch_top1(x, order.numpy(), 256))
        rec.add(component="gcbs cells", data=name, n=n, d=x.shape[1], method="uniform",
                batch_top1=batch_top1(x, np.random.default_rng(0).permutation(n), 256))


if __name__ == "__main__":
    main()
