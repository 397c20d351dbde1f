"""kNN graph (K = 100) by approximate indexes: build time and recall@K against exact (issue 33).

    python benchmarks/bench_knn_index.py --json benchmarks/results/knn_index.json
    python benchmarks/bench_knn_index.py --cases 100000:128 --libraries ours faiss-ivf
    python benchmarks/bench_knn_index.py --switch 5000 10000 20000 40000   # auto's switch point
    python benchmarks/bench_knn_index.py --report benchmarks/results/knn_index.json \
        --plot docs/figures/knn_index.png

Every row is one library at one setting on one data set (N, d): the seconds to build the
index (``build_s``), to search all N items for their K + 1 nearest (``search_s``; self
dropped) and their sum (``graph_s``), and recall@K on ``--sample`` seeded rows against the
exact neighbours (torch products). Searches that are not ours are timed on ``--queries``
rows (the sample first) and scaled to N (search time is linear in the number of queries;
``search_scaled`` says so), and ``short_rows`` is the share of rows left with fewer than K + 1
results (-1; IVF lists too small), which a kNN graph must fill and ours fills; ``ours`` rows are full ``hb.knn_graph`` calls, end to end
(index, nprobe / ef tuning, all N searches).

Libraries: faiss ``IndexFlatIP`` (exact; ``faiss-flat``) and torch products (``exact``,
knn_graph's exact method), both scaled from ``--queries`` rows; faiss ``IndexIVFFlat``
(nlist 2 sqrt(N) and 4 sqrt(N), at 1M only 2 sqrt(N); nprobe 1..64), faiss
``IndexHNSWFlat``, hnswlib and usearch (M = 16, ef_construction = 100, ef 101..512; up to
``--hnsw-max`` items), pynndescent (n_neighbors = K + 1, defaults otherwise; up to
``--nnd-max`` items and ``--nnd-max-d`` dims); ours: ``knn_graph(method="auto")`` and
``method="hnsw"`` (``--libraries ours-auto`` / ``ours-hnsw`` run one of them). The other
libraries build with all threads (their default; not deterministic for the HNSW ones); ours
builds HNSW with one thread.

Data: the 1000-component Gaussian mixture of ``_common.py``; ``--real`` adds the MiniLM
Wikipedia embeddings (100k x 384, else 20k x 384) that ``_common.wiki_minilm`` has cached.
Below auto's switch point ``ours:auto-ivf`` is auto's tuned IVF, forced. Rows are
appended to the JSON after every measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import time

import numpy as np
import torch
from _common import CACHE, gaussian_mixture, machine

import hardbatch as hb
from hardbatch.neighbors import index_search as neighbor_index

K = 100
EF = (101, 128, 192, 256, 384, 512)
NPROBE = (1, 2, 4, 8, 16, 32, 64)


class Recorder:
    def __init__(self, path: str | None, meta: dict, append: bool = False) -> None:
        self.path, self.meta, self.rows = path, meta, []
        if append and path and os.path.exists(path):
            with open(path) as f:
                old = json.load(f)
            self.rows = old["rows"]
            self.meta = {**meta, "earlier_runs": old.get("earlier_runs", []) + [
                {k: v for k, v in old.items() if k not in ("rows", "earlier_runs")}]}

    def add(self, **row) -> None:
        row["loadavg_1min"] = round(os.getloadavg()[0], 2)
        if row["library"].startswith("ours"):  # re-measured, ours replaces the earlier row
            keys = ("data", "n", "d", "library")
            self.rows = [r for r in self.rows if any(r.get(k) != row.get(k) for k in keys)]
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        if self.path:
            with open(self.path, "w") as f:
                json.dump({**self.meta, "rows": self.rows}, f, indent=1)


def truth_of(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    xt = torch.from_numpy(x)
    sims = xt[torch.from_numpy(rows)] @ xt.T
    sims[torch.arange(len(rows)), torch.from_numpy(rows)] = -torch.inf
    return sims.topk(K, dim=1).indices.numpy()


def drop_self(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    own = ids == rows[:, None]
    own[~own.any(axis=1), K] = True
    return ids[~own].reshape(len(rows), K)


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(a, b)) / K for a, b in zip(ids, truth)]))


class Case:
    def __init__(self, name: str, x: np.ndarray, sample: int, queries: int, rec: Recorder):
        self.name, self.x, self.rec = name, x, rec
        self.n, self.d = x.shape
        perm = np.random.default_rng(123).permutation(self.n)
        self.sample = perm[:sample]
        self.queries = perm[:min(self.n, queries)]  # the sample first
        self.truth = truth_of(x, self.sample)

    def scaled(self, library: str, params: dict, build_s: float, search, **extra) -> float:
        """Time ``search(rows) -> ids [Q, K + 1]`` on the query rows, scale it to N, record."""
        t0 = time.perf_counter()
        ids = search(self.x[self.queries])
        s = (time.perf_counter() - t0) * self.n / len(self.queries)
        ids = np.asarray(ids, np.int64)
        r = recall(drop_self(ids[:len(self.sample)], self.sample), self.truth)
        self.rec.add(data=self.name, n=self.n, d=self.d, library=library, params=params,
                     build_s=build_s, search_s=s, graph_s=build_s + s, search_scaled=True,
                     recall=r, short_rows=float((ids < 0).any(axis=1).mean()), **extra)
        return r


def run_exact(case: Case, libraries: list[str]) -> None:
    import faiss

    if "faiss-flat" in libraries:
        t0 = time.perf_counter()
        index = faiss.IndexFlatIP(case.d)
        index.add(case.x)
        case.scaled("faiss-flat", {}, time.perf_counter() - t0,
                    lambda q: index.search(q, K + 1)[1])
    if "exact" in libraries:
        xt = torch.from_numpy(case.x)

        def torch_exact(q):
            return torch.cat([(torch.from_numpy(q[s:s + 4096]) @ xt.T).topk(K + 1, dim=1)
                              .indices for s in range(0, len(q), 4096)]).numpy()
        case.scaled("exact", {"torch": torch.__version__}, 0.0, torch_exact)


def run_faiss_ivf(case: Case) -> None:
    import faiss

    nlists = (round(2 * np.sqrt(case.n)), min(case.n // 39, round(4 * np.sqrt(case.n))))
    for nlist in nlists[:1] if case.n >= 1_000_000 else nlists:  # 1M: one build (time)
        t0 = time.perf_counter()
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(case.d), case.d, nlist,
                                   faiss.METRIC_INNER_PRODUCT)
        train = np.random.default_rng(0).choice(case.n, min(case.n, 39 * nlist), replace=False)
        index.train(case.x[np.sort(train)])
        index.add(case.x)
        build = time.perf_counter() - t0
        for nprobe in NPROBE:
            index.nprobe = nprobe
            if case.scaled("faiss-ivf", {"nlist": nlist, "nprobe": nprobe}, build,
                           lambda q: index.search(q, K + 1)[1]) >= 0.99:
                break


def run_hnsw(case: Case, library: str) -> None:
    t0 = time.perf_counter()
    if library == "faiss-hnsw":
        import faiss

        index = faiss.IndexHNSWFlat(case.d, 16, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 100
        index.add(case.x)

        def search(q, ef):
            index.hnsw.efSearch = ef
            return index.search(q, K + 1)[1]
    elif library == "hnswlib":
        import hnswlib

        index = hnswlib.Index(space="ip", dim=case.d)
        index.init_index(max_elements=case.n, M=16, ef_construction=100, random_seed=0)
        index.add_items(case.x, np.arange(case.n))

        def search(q, ef):
            index.set_ef(ef)
            return index.knn_query(q, K + 1)[0]
    else:
        from usearch.index import Index

        index = Index(ndim=case.d, metric="ip", dtype="f32", connectivity=16, expansion_add=100)
        index.add(np.arange(case.n), case.x)

        def search(q, ef):
            index.expansion_search = ef
            return index.search(q, K + 1).keys
    build = time.perf_counter() - t0
    for ef in EF:
        if case.scaled(library, {"M": 16, "ef_construction": 100, "ef": ef}, build,
                       lambda q, ef=ef: search(q, ef)) >= 0.99:
            break


def run_pynndescent(case: Case) -> None:
    from pynndescent import NNDescent

    t0 = time.perf_counter()
    index = NNDescent(case.x, metric="dot", n_neighbors=K + 1, random_state=0)
    ids = index.neighbor_graph[0]
    s = time.perf_counter() - t0
    case.rec.add(data=case.name, n=case.n, d=case.d, library="pynndescent",
                 params={"n_neighbors": K + 1}, build_s=s, search_s=0.0, graph_s=s,
                 search_scaled=False,
                 recall=recall(drop_self(ids[case.sample], case.sample), case.truth))


class _LastRecord(logging.Handler):
    def emit(self, record):
        self.record = record


def run_ours(case: Case, method: str, repeat: int) -> None:
    times, graph = [], None
    last = _LastRecord()
    logging.getLogger("hardbatch.neighbors").addHandler(last)
    logging.getLogger("hardbatch.neighbors").setLevel(logging.INFO)
    for _ in range(repeat):
        t0 = time.perf_counter()
        graph = neighbor_index.index_knn_graph(case.x, K, method) if method == "auto-ivf" \
            else hb.knn_graph(case.x, K, method=method, seed=0)
        times.append(time.perf_counter() - t0)
    resolved = method if method == "auto-ivf" else neighbor_index.resolve_knn_method(method,
                                                                                      case.n)
    rec = getattr(last, "record", None)
    tuned = {k: getattr(rec, k) for k in ("method", "breadth", "sample_recall") if
             hasattr(rec, k)}
    logging.getLogger("hardbatch.neighbors").removeHandler(last)
    case.rec.add(data=case.name, n=case.n, d=case.d, library=f"ours:{method}",
                 params={"resolves_to": resolved, **tuned}, build_s=None, search_s=None,
                 graph_s=min(times), all_s=times, search_scaled=False,
                 recall=recall(graph.numpy()[case.sample], case.truth))


def run_sampler(n: int, d: int, batch_size: int, rec: Recorder) -> None:
    """KNNBatchSampler: exact product per batch vs an IVF index (build, then one query a batch);
    the steps after which the index has paid for its build."""
    x = gaussian_mixture(n, d, seed=0)
    out = {}
    for method in ("exact", "faiss-ivf"):
        t0 = time.perf_counter()
        sampler = hb.KNNBatchSampler(x, batch_size, refresh_every=None, method=method)
        it = iter(sampler)
        next(it)  # the build (snapshot, index) and a first batch
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(100):
            next(it)
        out[method] = (build, (time.perf_counter() - t0) / 100)
    (eb, eb_step), (ib, ib_step) = out["exact"], out["faiss-ivf"]
    rec.add(data="mixture", n=n, d=d, library="sampler", params={"batch_size": batch_size},
            exact_build_s=eb, exact_step_s=eb_step, ivf_build_s=ib, ivf_step_s=ib_step,
            break_even_steps=(ib - eb) / max(1e-9, eb_step - ib_step))


def run_switch(sizes: list[int], dims: list[int], rec: Recorder) -> None:
    """exact vs the tuned IVF of "auto", best of 2, at each N below and around the switch."""
    for d in dims:
        for n in sizes:
            x = gaussian_mixture(n, d, seed=0)
            best = {}
            for method in ("exact", "auto-ivf"):
                ts = []
                for _ in range(2):
                    t0 = time.perf_counter()
                    if method == "exact":
                        hb.knn_graph(x, K, method="exact")
                    else:
                        neighbor_index.index_knn_graph(x, K, "auto-ivf")
                    ts.append(time.perf_counter() - t0)
                best[method] = min(ts)
            rec.add(data="mixture", n=n, d=d, library="switch", params={},
                    exact_s=best["exact"], ivf_s=best["auto-ivf"],
                    auto_resolves_to=neighbor_index.resolve_knn_method("auto", n))


def best_rows(rows: list[dict]) -> list[dict]:
    """Per case and library: the fastest row with recall >= 0.95 (else the most accurate)."""
    out = {}
    for r in rows:
        if r["library"] in ("switch", "sampler"):
            continue
        key = (r["data"], r["n"], r["d"], r["library"])
        ok = r["recall"] >= neighbor_index.RECALL_TARGET
        rank = (not ok, r["graph_s"] if ok else -r["recall"])
        if key not in out or rank < out[key][0]:
            out[key] = (rank, r)
    return [r for _, r in out.values()]


def report(path: str, plot: str | None) -> None:
    """A markdown table of :func:`best_rows` (and a recall / time chart) from a results JSON."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    best = best_rows(rows)
    print("| data | N | d | library | setting | build s | kNN graph s | recall@100 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(best, key=lambda r: (r["data"], r["n"], -r["d"], r["graph_s"])):
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        build = "" if r["build_s"] is None else f"{r['build_s']:.1f}"
        graph = f"{r['graph_s']:.1f}" + ("*" if r["search_scaled"] else "")
        name = f"**{r['library']}**" if r["library"].startswith("ours") else r["library"]
        print(f"| {r['data']} | {r['n']:,} | {r['d']} | {name} | {params} | {build} | {graph} "
              f"| {r['recall']:.3f} |")
    if not plot:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cases = sorted({(r["data"], r["n"], r["d"]) for r in best}, key=lambda c: (c[1], -c[2]))
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases):
        mine = [r for r in rows if (r["data"], r["n"], r["d"]) == case
                and r["library"] not in ("switch", "sampler")]
        def series(r):
            return r["library"] + (f" nlist={r['params']['nlist']}" if "nlist" in r["params"]
                                   else "")
        for lib in sorted({series(r) for r in mine}):
            pts = sorted((r["graph_s"], r["recall"]) for r in mine if series(r) == lib)
            style = {"marker": "*", "markersize": 14} if lib.startswith("ours") else \
                {"marker": "o"}
            ax.plot(*zip(*pts), label=lib, **style)
        ax.axhline(neighbor_index.RECALL_TARGET, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("kNN graph seconds (2 loaded cores)")
        ax.set_ylabel("recall@100")
        ax.set_ylim(0.85, 1.005)
        ax.set_title(f"{case[0]} N={case[1]:,} d={case[2]}")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(plot, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", default=["100000:384", "100000:128", "1000000:128"],
                   help="N:d of the Gaussian mixture")
    p.add_argument("--libraries", nargs="+",
                   default=["ours", "faiss-flat", "exact", "faiss-ivf", "faiss-hnsw", "hnswlib",
                            "usearch", "pynndescent"])
    p.add_argument("--hnsw-max", type=int, default=200_000,
                   help="HNSW libraries (build ~1-2 min per 100k here) up to this N")
    p.add_argument("--nnd-max", type=int, default=100_000)
    p.add_argument("--nnd-max-d", type=int, default=128)
    p.add_argument("--real", action="store_true", help="also MiniLM Wikipedia 100k x 384")
    p.add_argument("--sample", type=int, default=1000)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=1, help="calls of ours (best of)")
    p.add_argument("--switch", type=int, nargs="*", default=[])
    p.add_argument("--switch-dims", type=int, nargs="+", default=[128, 384])
    p.add_argument("--sampler", type=int, nargs="*", default=[],
                   help="N of the KNNBatchSampler exact-vs-index measurement (d = 384, B = 256)")
    p.add_argument("--json", default=None)
    p.add_argument("--append", action="store_true", help="keep the rows already in --json")
    p.add_argument("--report", default=None, help="print the table of this results JSON, exit")
    p.add_argument("--plot", default=None, help="with --report: the chart's PNG path")
    args = p.parse_args()
    if args.report:
        return report(args.report, args.plot)
    import faiss

    meta = {"machine": machine(), "faiss_threads": faiss.omp_get_max_threads(), "K": K,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
            "args": vars(args)}
    rec = Recorder(args.json, meta, args.append)
    if args.switch:
        run_switch(args.switch, args.switch_dims, rec)
    for n in args.sampler:
        run_sampler(n, 384, 256, rec)
    cases = [("mixture", int(n), int(d)) for n, d in (c.split(":") for c in args.cases)]
    real = [n for n in (100_000, 20_000) if (CACHE / f"wiki{n}_minilm.npy").exists()]
    if args.real and real:
        cases.insert(0, ("minilm-wiki", real[0], 384))
    for name, n, d in cases:
        x = np.load(CACHE / f"wiki{n}_minilm.npy") if name == "minilm-wiki" else \
            gaussian_mixture(n, d, seed=0)
        case = Case(name, np.ascontiguousarray(x, np.float32), args.sample, args.queries, rec)
        libs = args.libraries
        if "ours" in libs or "ours-auto" in libs:
            run_ours(case, "auto", args.repeat)
        if "ours-ivf" in libs or ("ours" in libs and n <= neighbor_index.AUTO_EXACT_MAX_ITEMS):
            run_ours(case, "auto-ivf", args.repeat)  # auto's IVF below its switch point
        run_exact(case, libs)
        if "faiss-ivf" in libs:
            run_faiss_ivf(case)
        for lib in ("faiss-hnsw", "hnswlib", "usearch"):
            if lib in libs and n <= args.hnsw_max:
                run_hnsw(case, lib)
        if ("ours" in libs or "ours-hnsw" in libs) and n <= args.hnsw_max:
            run_ours(case, "hnsw", 1)
        if "pynndescent" in libs and n <= args.nnd_max and d <= args.nnd_max_d:
            run_pynndescent(case)


if __name__ == "__main__":
    main()
