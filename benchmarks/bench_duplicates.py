"""Copies in batches, without and with ``duplicate_keys``, and what the keys cost.

    python benchmarks/bench_duplicates.py                 # both parts (a few minutes)
    python benchmarks/bench_duplicates.py --only wiki --limit 20000
    python benchmarks/bench_duplicates.py --quick         # small sizes, a smoke run

Part ``wiki``: the shared Wikipedia sentences (``wiki_sentences_100k.txt``) embedded with
all-MiniLM-L6-v2 (``_common.wiki_minilm``, cached). The key of a sentence is its text; a
"duplicate pair" is two items of one batch with the same text. For each sampler, one epoch
(seed 0) without keys and one with ``duplicate_keys=texts``: pairs per epoch, per batch and
the worst batch.

Part ``cost``: MNIST train (60k) in 64 PCA dims (``_common.mnist_pca64``) with synthetic
copies: 5% of the rows (seed 0) are replaced by a copy of another row plus noise of norm
1e-3 and share its key, so copies are each other's nearest neighbours as real duplicates are.
Sampler time of an epoch (B = 512) without and with keys on the same embeddings: the first
epoch includes the structure's build (graph), the best of 3 later epochs is the per-epoch
work (walks, kNN products, permutations). GCBS (``method="ivf"`` in both parts, faster than
the exact search, so its cost share is an upper bound) rebuilds its order every epoch: its
epoch time with keys is the build plus the key repair, timed alone.

Part ``conflicts`` (issue 31): mined-style rows (anchor, positive, 2 negatives), N = 98,304
(12 batches of B = 8192): anchors are distinct wiki sentences, positives "passage: " + the
anchor, each negative column the positives of the rows in a random permutation
(``mine_hard_negatives`` picks negatives among the corpus' passages; a permutation keeps every
passage in 3 rows), so each row conflicts with up to 6 others. Costs: encoding the texts as key sets once
(``row_conflicts``: pyarrow dictionary codes + CSR) against sentence-transformers'
``NO_DUPLICATES_HASHED`` precomputation (xxhash of every cell via ``datasets.map``, one
process); then sampler seconds per epoch without and with the key sets (embeddings: MNIST
PCA-64 rows, as in ``cost``; best of ``--repeat`` later epochs; GCBS: its repair timed
alone against the order's build) and the epoch of ``NoDuplicatesBatchSampler(precompute_
hashes=True)``; and the conflicting pairs (two rows sharing a text) per epoch.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _common import machine, mnist_pca64, wiki_minilm

import hardbatch as hb
from hardbatch.keys import separate_keys

SAMPLERS = {
    "uniform": lambda x, b, **kw: hb.UniformBatchSampler(len(x), b, **kw),
    "knn": lambda x, b, **kw: hb.KNNBatchSampler(x, b, refresh_every=None, **kw),
    "proximity": lambda x, b, **kw: hb.ProximityGraphSampler(
        x, b, candidates=500, neighbors=50, refresh_every=None, **kw),
    # method="ivf": the exact pair search takes minutes at N = 100k on 2 cores
    "gcbs": lambda x, b, **kw: hb.GCBSSampler(x, b, method="ivf", **kw),
}


def duplicate_pairs(batches: list[list[int]], keys) -> list[int]:
    """Pairs of items with equal keys, per batch."""
    return [sum(c * (c - 1) // 2 for c in Counter(keys[i] for i in b).values()) for b in batches]


def epoch(sampler) -> tuple[list[list[int]], float]:
    t0 = time.perf_counter()
    batches = list(sampler)
    return batches, time.perf_counter() - t0


def bench_wiki(limit: int, b: int) -> dict:
    from hardbatch_experiments.datasets import data_root

    lines = (data_root(None) / "text" / "wiki_sentences_100k.txt").read_text().splitlines()
    texts = lines[:limit]
    x = wiki_minilm(limit=100_000)[:limit]
    counts = Counter(texts)
    out = {"n": len(x), "batch_size": b, "seed": 0,
           "extra_copies": sum(c - 1 for c in counts.values()),
           "copied_texts": sum(c > 1 for c in counts.values()),
           "most_copies": max(counts.values())}
    for name, make in SAMPLERS.items():
        row = {}
        for label, kw in (("without", {}), ("with", {"duplicate_keys": texts})):
            batches, seconds = epoch(make(x, b, seed=0, **kw))
            pairs = duplicate_pairs(batches, texts)
            row[label] = {"pairs": int(sum(pairs)), "per_batch": sum(pairs) / len(batches),
                          "worst_batch": int(max(pairs)), "batches": len(batches),
                          "seconds": seconds}
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def synthetic_copies(x: np.ndarray, share: float, seed: int = 0) -> tuple[np.ndarray, list]:
    """``x`` with a ``share`` of rows replaced by noisy copies of others; keys = source rows."""
    r = np.random.default_rng(seed)
    n = len(x)
    targets = r.choice(n, int(share * n), replace=False)
    sources = r.choice(np.setdiff1d(np.arange(n), targets), len(targets))
    y = x.copy()
    y[targets] = x[sources] + 1e-3 * r.standard_normal((len(targets), x.shape[1])) / np.sqrt(
        x.shape[1])
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    keys = list(range(n))
    for t, s in zip(targets.tolist(), sources.tolist()):
        keys[t] = keys[s]
    return y.astype(np.float32), keys


def bench_cost(n: int, b: int, repeat: int) -> dict:
    x, _ = mnist_pca64()
    x, keys = synthetic_copies(x[:n], 0.05)
    out = {"n": len(x), "batch_size": b, "seed": 0, "copy_share": 0.05,
           "gcbs_method": "ivf", "repeat": repeat}
    for name, make in SAMPLERS.items():
        plain = make(x, b, seed=0)
        keyed = make(x, b, seed=0, duplicate_keys=keys)
        row = {}
        for label, sampler in (("without", plain), ("with", keyed)):
            batches, first = epoch(sampler)  # builds the structure (GCBS: every epoch)
            row[label] = {"first_epoch_s": first,
                          "pairs": int(sum(duplicate_pairs(batches, keys)))}
        if name != "gcbs":  # later epochs: walks, kNN products, permutations (best of repeat,
            times = {"without": [], "with": []}  # alternating, so both see the same load)
            for _ in range(repeat):
                for label, sampler in (("without", plain), ("with", keyed)):
                    times[label].append(epoch(sampler)[1])
            for label in times:
                row[label]["epoch_s"] = min(times[label])
        else:  # the order's build dominates: time the key repair alone on a built order
            order = plain.refresh_policy.structure[0]
            t0 = time.perf_counter()
            for _ in range(repeat):
                separate_keys(order, len(order), b, keyed.duplicate_keys)
            row["with"]["repair_s"] = (time.perf_counter() - t0) / repeat
            row["without"]["epoch_s"] = row["without"]["first_epoch_s"]
            row["with"]["epoch_s"] = row["without"]["epoch_s"] + row["with"]["repair_s"]
        row["overhead"] = row["with"]["epoch_s"] / row["without"]["epoch_s"] - 1
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def mined_rows(n: int, negatives: int = 2, seed: int = 0):
    """The ``conflicts`` part's rows: a ``datasets.Dataset`` of wiki sentences."""
    import datasets

    from hardbatch_experiments.datasets import data_root

    lines = (data_root(None) / "text" / "wiki_sentences_100k.txt").read_text().splitlines()
    lines = list(dict.fromkeys(lines))[:n]  # distinct sentences
    if len(lines) < n:
        raise ValueError(f"n={n}: the wiki file holds {len(lines)} distinct sentences")
    r = np.random.default_rng(seed)
    anchors, positives = lines, [f"passage: {t}" for t in lines]
    cols = {"anchor": anchors, "positive": positives}
    for k in range(negatives):
        cols[f"negative_{k + 1}"] = [positives[j] for j in r.permutation(n).tolist()]
    return datasets.Dataset.from_dict(cols)


def conflict_pairs(batches, keys) -> int:
    """Pairs of rows of a batch that share a key (a text)."""
    from hardbatch.keys import item_keys

    out = 0
    for b in batches:
        held = item_keys(keys.ptr, keys.idx, np.asarray(b))
        _, counts = np.unique(held, return_counts=True)
        out += int((counts * (counts - 1) // 2).sum())
    return out


def bench_conflicts(n: int, b: int, repeat: int) -> dict:
    from _common import best_of

    from hardbatch.integrations.sentence_transformers import row_conflicts
    try:
        from sentence_transformers.base.sampler import NoDuplicatesBatchSampler
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.sampler import NoDuplicatesBatchSampler

    data = mined_rows(n)
    keys = row_conflicts(data)
    encode_s = best_of(lambda: row_conflicts(data), repeat)

    def st_sampler():
        s = NoDuplicatesBatchSampler(data, b, False, precompute_hashes=True,
                                     precompute_num_proc=1)
        s._build_hashes()
        return s

    t0 = time.perf_counter()
    st = st_sampler()
    st_hash_s = time.perf_counter() - t0
    st_epoch_s = best_of(lambda: list(st), repeat)
    x, _ = mnist_pca64()
    x = np.ascontiguousarray(np.resize(x, (n, x.shape[1])))  # MNIST rows, repeated past 60k
    x += 1e-3 * np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    exact = {"method": "exact"} if "method" in inspect.signature(hb.KNNBatchSampler).parameters \
        else {}  # the exact product per batch (an index's tuning at k = 8191 is not the point)
    samplers = {**SAMPLERS, "knn": lambda x, b, **kw: hb.KNNBatchSampler(
        x, b, refresh_every=None, **exact, **kw)}
    out = {"n": n, "batch_size": b, "columns": len(data.column_names), "repeat": repeat,
           "shared_texts": len(keys.values), "rows_with_conflicts": int(keys.has_key.sum()),
           "encode_s": encode_s, "st_hashed": {"hash_s": st_hash_s, "epoch_s": st_epoch_s,
                                               "pairs": conflict_pairs(list(st), keys)}}
    for name, make in samplers.items():
        plain, keyed = make(x, b, seed=0), make(x, b, seed=0, duplicate_keys=keys)
        row = {"without": {"pairs": conflict_pairs(epoch(plain)[0], keys)},
               "with": {"pairs": conflict_pairs(epoch(keyed)[0], keys)}}
        state = getattr(keyed, "walk_state", None)
        row["with"]["fallbacks"] = 0 if state is None else int(state.fallbacks[0])
        if name != "gcbs":
            times = {"without": [], "with": []}
            for _ in range(repeat):
                for label, sampler in (("without", plain), ("with", keyed)):
                    times[label].append(epoch(sampler)[1])
            for label in times:
                row[label]["epoch_s"] = min(times[label])
        else:
            order = plain.refresh_policy.structure[0]
            row["with"]["repair_s"] = best_of(lambda: separate_keys(order, len(order), b, keys),
                                              repeat)
            row["without"]["epoch_s"] = best_of(lambda: epoch(plain), 1)
            row["with"]["epoch_s"] = row["without"]["epoch_s"] + row["with"]["repair_s"]
        row["overhead"] = row["with"]["epoch_s"] / row["without"]["epoch_s"] - 1
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def markdown(results: dict) -> str:
    """The tables of docs/samplers.md from the results."""
    lines = []
    wiki = results.get("wiki")
    if wiki:
        lines += [f"Copies in batches, wiki sentences (N = {wiki['n']}: {wiki['copied_texts']} "
                  f"sentences occur more than once, {wiki['extra_copies']} extra copies, up to "
                  f"{wiki['most_copies']} of one sentence; B = {wiki['batch_size']}, one epoch):",
                  "",
                  "| sampler | duplicate pairs per epoch (per batch, worst batch) without keys "
                  "| with `duplicate_keys=texts` |", "|---|---|---|"]
        for name in SAMPLERS:
            a, b = wiki[name]["without"], wiki[name]["with"]
            lines.append(f"| {name} | {a['pairs']} ({a['per_batch']:.3f}, {a['worst_batch']}) "
                         f"| {b['pairs']} ({b['per_batch']:.3f}, {b['worst_batch']}) |")
        lines.append("")
    cost = results.get("cost")
    if cost:
        lines += [f"Cost of keys, MNIST PCA-64 with synthetic copies (N = {cost['n']}, "
                  f"{cost['copy_share']:.0%} copies, B = {cost['batch_size']}; sampler seconds "
                  "per epoch, best of "
                  f"{cost['repeat']}):", "",
                  "| sampler | without keys | with keys | cost | duplicate pairs without / with |",
                  "|---|---|---|---|---|"]
        for name in SAMPLERS:
            r = cost[name]
            lines.append(f"| {name} | {r['without']['epoch_s'] * 1e3:.2f} ms | "
                         f"{r['with']['epoch_s'] * 1e3:.2f} ms | {r['overhead']:+.1%} | "
                         f"{r['without']['pairs']} / {r['with']['pairs']} |")
    conf = results.get("conflicts")
    if conf:
        st = conf["st_hashed"]
        lines += ["", f"Conflicts, mined-style rows (N = {conf['n']}, {conf['columns']} text "
                  f"columns, {conf['shared_texts']} texts in two rows or more, "
                  f"{conf['rows_with_conflicts']} rows with a conflict; B = "
                  f"{conf['batch_size']}; seconds per epoch, best of {conf['repeat']}): key "
                  f"sets encoded once in {conf['encode_s']:.2f} s (sentence-transformers' "
                  f"NO_DUPLICATES_HASHED hashing: {st['hash_s']:.2f} s, then "
                  f"{st['epoch_s']:.2f} s per epoch, {st['pairs']} pairs).", "",
                  "| sampler | without keys | with key sets | cost | conflicting pairs without "
                  "/ with |", "|---|---|---|---|---|"]
        for name in SAMPLERS:
            r = conf[name]
            lines.append(f"| {name} | {r['without']['epoch_s'] * 1e3:.1f} ms | "
                         f"{r['with']['epoch_s'] * 1e3:.1f} ms | {r['overhead']:+.1%} | "
                         f"{r['without']['pairs']} / {r['with']['pairs']} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="*", choices=["wiki", "cost", "conflicts"],
                   default=["wiki", "cost", "conflicts"])
    p.add_argument("--limit", type=int, default=100_000, help="wiki sentences (default all)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--n", type=int, default=60_000, help="MNIST rows of the cost part")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--conflict-n", type=int, default=98_304, help="rows of the conflicts part")
    p.add_argument("--conflict-batch-size", type=int, default=8192)
    p.add_argument("--quick", action="store_true", help="limit 5000, n 10000, repeat 1")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--table", default=None, metavar="JSON",
                   help="only print the markdown tables of saved results")
    args = p.parse_args(argv)
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return {}
    if args.quick:
        args.limit, args.n, args.repeat, args.conflict_n = 5000, 10_000, 1, 10_000
        args.conflict_batch_size = 1024
    results = {"machine": machine(), "command": "python benchmarks/bench_duplicates.py "
               + " ".join(argv if argv is not None else __import__("sys").argv[1:])}
    if "wiki" in args.only:
        results["wiki"] = bench_wiki(args.limit, args.batch_size)
    if "cost" in args.only:
        results["cost"] = bench_cost(args.n, args.batch_size, args.repeat)
    if "conflicts" in args.only:
        results["conflicts"] = bench_conflicts(args.conflict_n, args.conflict_batch_size,
                                               args.repeat)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
