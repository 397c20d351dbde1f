"""GCBS per-position hardness: the random tail of the paper's graph and ``min_partners``.

    python benchmarks/bench_gcbs_tail.py --json benchmarks/results/gcbs_tail.json \\
        --plot docs/figures/gcbs_position_hardness.png
    python benchmarks/bench_gcbs_tail.py --explore --json benchmarks/results/gcbs_explore.json
    python benchmarks/bench_gcbs_tail.py --data mnist10k --quick

For each data set and each arm (uniform batches; the paper's GCBS: quantile 0.999,
``method="exact"``, ``min_partners=0``, which was also the library's default before; the
new default ``gcbs_permutation(x, 0.999)``: ``method="auto"``, ``min_partners=16``; the same
order interleaved in chunks of 32 = B / 8, ``interleave_chunks``) the epoch's order is cut
into batches of B = 256 and, batch by batch in epoch order:

- hardness: the mean over the batch's items of the largest cosine to another item of the
  batch (top-1 negative similarity), in the data's own embedding (one fixed coordinate
  system for every arm);
- false-negative rate (data with labels): the share of the batch's ordered pairs (i != j)
  with the same label.

Summaries: the share of batches no harder than the 95th percentile of uniform batches
(20 uniform epochs), the mean of each tenth of the epoch (head = first tenth, tail = last),
the spread of batch hardness, and the false-negative rate overall and per tenth.

``--explore`` chooses the default ``min_partners`` and the interleaving chunk on exploration
sets that the report does not use: MNIST *test* images (10k, 64 PCA dims fitted on them,
labels) and a labelled 200-component Gaussian mixture (20k, d = 64, uneven sizes and
spreads), exact orders, seeds 0-2, k in 0, 1, 2, 4, 8, 16, 32 and, at the default k, chunks
of 0, 8, ..., 128 items.

Data of the report: MNIST train in 64 PCA dims (``_common.mnist_pca64``; first 10k and all
60k, labels) and all-MiniLM-L6-v2 embeddings of the shared Wikipedia sentences
(``_common.wiki_minilm``, the cached 100k; 20k: its first 20k rows; no labels). Orders use
seed 0; uniform epochs seeds 0-19.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from _common import machine, mnist_pca64, wiki_minilm

import hardbatch as hb
from hardbatch.batching.gcbs import DEFAULT_MIN_PARTNERS, interleave_chunks

B = 256
UNIFORM_EPOCHS = 20
EXPLORE_K = (0, 1, 2, 4, 8, 16, 32)
EXPLORE_CHUNKS = (0, 8, 16, 32, 64, 128)
INTERLEAVE = 32  # chunk length of the interleaved arm: B / 8, chosen by --explore (docs/gcbs.md)


def batch_stats(x: np.ndarray, order: np.ndarray, b: int = B,
                labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per full batch of ``order``, in epoch order: hardness [nb] and false-negative rate [nb]."""
    nb = len(order) // b
    idx = torch.from_numpy(np.ascontiguousarray(order[:nb * b]).reshape(nb, b))
    xt = torch.from_numpy(x)
    hard = np.empty(nb)
    fn = None if labels is None else np.empty(nb)
    for s in range(0, nb, 16):  # 16 batches per product
        e = xt[idx[s:s + 16]]
        sims = e @ e.transpose(1, 2)
        sims.diagonal(dim1=1, dim2=2).fill_(-torch.inf)
        hard[s:s + 16] = sims.max(dim=2).values.mean(dim=1).double().numpy()
    if labels is not None:
        lab = labels[idx.numpy()]
        same = (lab[:, :, None] == lab[:, None, :]).sum(axis=(1, 2)) - b
        fn[:] = same / (b * (b - 1))
    return hard, fn


def tenths(v: np.ndarray) -> list[float]:
    return [round(float(p.mean()), 4) for p in np.array_split(v, 10)]


def summarize(hard: np.ndarray, fn: np.ndarray | None, p95: float) -> dict:
    out = {"hardness": round(float(hard.mean()), 4),
           "below_uniform_p95": round(float(np.mean(hard <= p95)), 4),
           "hardness_std": round(float(hard.std()), 4),
           "hardness_min": round(float(hard.min()), 4),
           "hardness_max": round(float(hard.max()), 4),
           "hardness_tenths": tenths(hard)}
    if fn is not None:
        out.update(false_negative_rate=round(float(fn.mean()), 4),
                   false_negative_max=round(float(fn.max()), 4),
                   batches_fn_over_half=round(float(np.mean(fn > 0.5)), 4),
                   false_negative_tenths=tenths(fn))
    return out


def uniform_reference(x, labels, seed0: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """Hardness (and false-negative rate) of the batches of ``UNIFORM_EPOCHS`` uniform epochs."""
    hs, fns = [], []
    for s in range(seed0, seed0 + UNIFORM_EPOCHS):
        h, f = batch_stats(x, np.random.default_rng(s).permutation(len(x)), B, labels)
        hs.append(h)
        fns.append(f)
    return np.concatenate(hs), None if labels is None else np.concatenate(fns)


def arms(n: int) -> dict[str, dict | None]:
    """The compared settings: name -> gcbs_permutation keywords (None: uniform batches)."""
    return {"uniform": None,
            "paper (q 0.999, exact, min_partners 0)": dict(method="exact", min_partners=0),
            f"default (auto, min_partners {DEFAULT_MIN_PARTNERS})": {},
            f"default + interleave {INTERLEAVE} (B / {B // INTERLEAVE})": dict(
                interleave=INTERLEAVE)}


def run_data(name: str, x: np.ndarray, labels, skip_exact_above: int) -> dict:
    n = len(x)
    print(f"== {name}: N={n} d={x.shape[1]}", flush=True)
    uh, ufn = uniform_reference(x, labels)
    p95 = float(np.quantile(uh, 0.95))
    res = {"n": n, "d": x.shape[1], "uniform_p95": round(p95, 4),
           "auto_method": hb.batching.gcbs.resolve_method("auto", n), "arms": {}}
    default = None
    for arm, kw in arms(n).items():
        if kw is not None and kw.get("method") == "exact" and n > skip_exact_above:
            continue
        sec = None
        if kw is None:
            hard, fn = uh[:n // B], None if ufn is None else ufn[:n // B]
            summary = summarize(uh, ufn, p95)
        else:
            if "interleave" in kw and default is not None:  # the default order, dealt apart
                order = interleave_chunks(default, kw["interleave"])
            else:
                t0 = time.perf_counter()
                order = hb.gcbs_permutation(x, 0.999, seed=0, **kw).numpy()
                sec = time.perf_counter() - t0
                default = order if not kw else default
            hard, fn = batch_stats(x, order, B, labels)
            summary = summarize(hard, fn, p95)
        summary["seconds"] = None if sec is None else round(sec, 2)
        summary["per_batch_hardness"] = [round(float(v), 4) for v in hard]
        if fn is not None:
            summary["per_batch_false_negative_rate"] = [round(float(v), 4) for v in fn]
        res["arms"][arm] = summary
        print(f"  {arm}: " + ", ".join(f"{k}={v}" for k, v in summary.items()
                                        if not k.startswith("per_batch")), flush=True)
    return res


def mnist_test_pca64() -> tuple[np.ndarray, np.ndarray]:
    """Exploration set: MNIST test images, 64 PCA dims fitted on them, unit rows."""
    from hardbatch_experiments.datasets import data_root, load_mnist

    images, labels = load_mnist(data_root(None), split="test")
    z = images.reshape(len(images), -1).numpy().astype(np.float32) / 255.0
    z -= z.mean(axis=0)
    z = z @ np.linalg.svd(z, full_matrices=False)[2][:64].T
    return np.ascontiguousarray(z / np.linalg.norm(z, axis=1, keepdims=True)), labels.numpy()


def labelled_mixture(n: int = 20_000, d: int = 64, components: int = 200,
                     seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Exploration set: unit rows of a Gaussian mixture with uneven component sizes, labels."""
    r = np.random.default_rng(seed)
    centers = r.standard_normal((components, d)).astype(np.float32)
    weights = r.dirichlet(np.full(components, 0.5))
    labels = r.choice(components, n, p=weights)
    spread = r.uniform(0.4, 1.0, components).astype(np.float32)[labels, None]
    x = centers[labels] + spread * r.standard_normal((n, d), dtype=np.float32)
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True)), labels


def _mean_rows(per_seed: list[dict]) -> dict:
    """Seed means of the summary figures of :func:`explore`."""
    keys = ("hardness", "below_uniform_p95", "hardness_std", "hardness_max",
            "false_negative_rate", "batches_fn_over_half", "false_negative_max", "seconds")
    row = {key: round(float(np.mean([s[key] for s in per_seed])), 4)
           for key in keys if key in per_seed[0]}
    row["head_tail_hardness"] = [
        round(float(np.mean([s["hardness_tenths"][i] for s in per_seed])), 4) for i in (0, 9)]
    return row


def explore(seeds=(0, 1, 2)) -> dict:
    """Per exploration set: summaries by ``min_partners`` (exact orders) and, at the default
    ``min_partners``, by ``interleave`` chunk length; seed means."""
    out = {}
    for name, (x, labels) in {"mnist_test_pca64": mnist_test_pca64(),
                              "mixture20k_d64": labelled_mixture()}.items():
        uh, ufn = uniform_reference(x, labels)
        p95 = float(np.quantile(uh, 0.95))
        by_k, by_chunk = {}, {}
        for k in EXPLORE_K:
            per_seed, per_chunk = [], {c: [] for c in EXPLORE_CHUNKS}
            for seed in seeds:
                t0 = time.perf_counter()
                order = hb.gcbs_permutation(x, 0.999, method="exact", min_partners=k,
                                            seed=seed).numpy()
                sec = time.perf_counter() - t0
                per_seed.append({**summarize(*batch_stats(x, order, B, labels), p95),
                                 "seconds": sec})
                for c in EXPLORE_CHUNKS if k == DEFAULT_MIN_PARTNERS else ():
                    mixed = interleave_chunks(order, c)
                    per_chunk[c].append(summarize(*batch_stats(x, mixed, B, labels), p95))
            by_k[k] = _mean_rows(per_seed)
            print(f"{name} min_partners={k}: {by_k[k]}", flush=True)
            for c in EXPLORE_CHUNKS if k == DEFAULT_MIN_PARTNERS else ():
                by_chunk[c] = _mean_rows(per_chunk[c])
                print(f"{name} min_partners={k} interleave={c}: {by_chunk[c]}", flush=True)
        out[name] = {"n": len(x), "uniform_p95": round(p95, 4),
                     "uniform_hardness": round(float(uh.mean()), 4),
                     "uniform_false_negative_rate": round(float(ufn.mean()), 4),
                     "by_min_partners": by_k,
                     f"by_interleave_at_min_partners_{DEFAULT_MIN_PARTNERS}": by_chunk}
    return out


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def markdown(results: dict) -> str:
    """The docs/gcbs.md tables of a JSON written by this script (``--tables``)."""
    lines = []
    for name, res in results.get("explore", {}).items():
        lines += [f"**{name}** (N = {res['n']}; uniform batches: hardness "
                  f"{res.get('uniform_hardness')}, p95 {res['uniform_p95']}, FN rate "
                  f"{res.get('uniform_false_negative_rate')})", "",
                  "| setting | hardness | head / tail tenth | spread (std) | max | "
                  "below uniform p95 | FN rate | worst batch FN | batches FN > 0.5 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        tables = [("min_partners", res["by_min_partners"])] + [
            (f"min_partners {key.rsplit('_', 1)[1]}, interleave", rows)
            for key, rows in res.items() if key.startswith("by_interleave")]
        for label, rows in tables:
            for k, r in rows.items():
                lines.append(f"| {label} {k} | {r['hardness']:.3f} | "
                             f"{r['head_tail_hardness'][0]:.3f} / "
                             f"{r['head_tail_hardness'][1]:.3f} | {r['hardness_std']:.3f} | "
                             f"{r['hardness_max']:.3f} | {_pct(r['below_uniform_p95'])} | "
                             f"{r['false_negative_rate']:.3f} | {r['false_negative_max']:.2f} | "
                             f"{_pct(r['batches_fn_over_half'])} |")
        lines.append("")
    for name, res in results.get("data", {}).items():
        labelled = any("false_negative_rate" in a for a in res["arms"].values())
        lines += [f"**{name}** (N = {res['n']}, d = {res['d']}, auto = "
                  f"{res.get('auto_method')}, uniform p95 = {res['uniform_p95']})", "",
                  "| arm | seconds | hardness | below uniform p95 | spread (std) | min / max | "
                  "hardness by tenth of the epoch |" + (" FN rate | batches FN > 0.5 | "
                                                        "FN rate by tenth |" if labelled else ""),
                  "|---|---|---|---|---|---|---|" + ("---|---|---|" if labelled else "")]
        for arm, a in res["arms"].items():
            row = (f"| {arm} | {'' if a['seconds'] is None else a['seconds']} | "
                   f"{a['hardness']:.3f} | {_pct(a['below_uniform_p95'])} | "
                   f"{a['hardness_std']:.3f} | {a['hardness_min']:.2f} / {a['hardness_max']:.2f}"
                   f" | {' '.join(f'{v:.2f}' for v in a['hardness_tenths'])} |")
            if labelled:
                row += (f" {a['false_negative_rate']:.3f} | {_pct(a['batches_fn_over_half'])} |"
                        f" {' '.join(f'{v:.2f}' for v in a['false_negative_tenths'])} |")
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Per-position hardness (top row) and false-negative rate (bottom row, labelled data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 6.2), squeeze=False,
                             sharex=True)
    for col, name in enumerate(names):
        res = results[name]
        for arm, s in res["arms"].items():
            label = arm if col == 0 else None
            for row, key in enumerate(("per_batch_hardness", "per_batch_false_negative_rate")):
                if key in s:
                    v = np.asarray(s[key])
                    axes[row][col].plot((np.arange(len(v)) + 0.5) / len(v), v, lw=0.9,
                                        label=label if row == 0 else None)
        axes[0][col].axhline(res["uniform_p95"], color="k", ls=":", lw=0.8)
        axes[0][col].set_title(f"{name} (N={res['n']}, d={res['d']})", fontsize=9)
        axes[1][col].set_xlabel("position of the batch in the epoch")
        if not axes[1][col].lines:
            axes[1][col].set_axis_off()
    axes[0][0].set_ylabel("hardness (mean top-1 cosine)")
    axes[1][0].set_ylabel("false-negative rate (same label)")
    fig.legend(loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", nargs="+", default=["mnist10k", "mnist60k", "minilm20k",
                                                 "minilm100k"],
                   choices=["mnist10k", "mnist60k", "minilm20k", "minilm100k"])
    p.add_argument("--explore", action="store_true", help="choose min_partners (see above)")
    p.add_argument("--quick", action="store_true", help="first 3000 items of each set")
    p.add_argument("--skip-exact-above", type=int, default=100_000,
                   help="leave out the exact arms above this N (the paper's arm at 100k: "
                        "~80 s)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--tables", nargs="+", default=None, metavar="JSON",
                   help="print the markdown tables of these result files and exit "
                        "(--plot: also draw their per-position hardness)")
    args = p.parse_args(argv)
    if args.tables:
        data = {}
        for path in args.tables:
            with open(path) as f:
                res = json.load(f)
            print(markdown(res))
            data.update(res.get("data", {}))
        if args.plot and data:
            plot(data, args.plot)
        return
    torch.set_num_threads(min(2, torch.get_num_threads()))
    results = {"machine": machine(), "batch_size": B, "quantile": 0.999, "seed": 0,
               "command": "python benchmarks/bench_gcbs_tail.py " + " ".join(argv or [])}
    if args.explore:
        results["explore"] = explore()
    else:
        results["data"] = {}
        for name in args.data:
            if name.startswith("mnist"):
                x, labels = mnist_pca64()
                n = 10_000 if name == "mnist10k" else 60_000
            else:
                n = 20_000 if name == "minilm20k" else 100_000
                x, labels = wiki_minilm(limit=100_000), None  # 20k: its first rows
            n = 3000 if args.quick else n
            x = np.ascontiguousarray(x[:n])
            labels = None if labels is None else labels[:n]
            results["data"][name] = run_data(name, x, labels, args.skip_exact_above)
        if args.plot:
            plot(results["data"], args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
