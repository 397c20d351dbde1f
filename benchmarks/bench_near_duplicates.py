"""``hb.near_duplicate_keys`` on real sentences: what it groups, what it costs, ivf vs exact.

    python benchmarks/bench_near_duplicates.py [--json benchmarks/results/near_duplicates.json]
    python benchmarks/bench_near_duplicates.py --quick        # 5k sentences, a smoke run

The shared Wikipedia sentences (``wiki_sentences_100k.txt``) embedded with all-MiniLM-L6-v2
(``_common.wiki_minilm``, cached). For each cosine threshold: items in groups of
near-duplicates, number of groups, the largest group, whether every exact text copy is
grouped with its copies (it must: equal texts have cosine 1), the distinct texts of the largest
group and its first sentences, and the wall time. ``method="ivf"``
on all N sentences; the exact search on the first ``--exact-limit`` sentences, where the ivf
keys are compared with the exact ones (share of exact pairs, i.e. of pairs of items the exact
search puts in one group, that ivf puts in one group too).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _common import machine, wiki_minilm

import hardbatch as hb
from hardbatch_experiments.datasets import data_root

THRESHOLDS = (0.95, 0.9, 0.8)


def grouped_pairs(keys: np.ndarray) -> int:
    """Pairs of items sharing a key."""
    sizes = np.bincount(keys)
    return int((sizes * (sizes - 1) // 2).sum())


def summary(keys: np.ndarray, texts: list[str]) -> dict:
    sizes = np.bincount(keys)
    first: dict = {}
    copies_kept = True
    for i, t in enumerate(texts):
        j = first.setdefault(t, i)
        copies_kept &= bool(keys[i] == keys[j])
    largest = np.flatnonzero(keys == sizes.argmax())
    return {"items_in_groups": int((sizes[keys] > 1).sum()), "groups": int((sizes > 1).sum()),
            "largest_group": int(sizes.max()), "text_copies_grouped": copies_kept,
            "largest_group_distinct_texts": len({texts[i] for i in largest}),
            "largest_group_examples": [texts[i][:100] for i in largest[:3]]}


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), wall seconds)``."""
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=100_000)
    p.add_argument("--exact-limit", type=int, default=20_000)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.quick:
        args.limit, args.exact_limit = 5000, 2000
    x = wiki_minilm(limit=100_000)[:args.limit]
    texts = (data_root(None) / "text" / "wiki_sentences_100k.txt").read_text().splitlines()
    texts = texts[:args.limit]
    rows = []
    for t in THRESHOLDS:
        ivf, ivf_s = timed(hb.near_duplicate_keys, x, t, method="ivf")
        small = x[:args.exact_limit]
        exact, exact_s = timed(hb.near_duplicate_keys, small, t)
        ivf_small = hb.near_duplicate_keys(small, t, method="ivf")
        both = grouped_pairs(np.unique(np.stack([exact, ivf_small]), axis=1,
                                       return_inverse=True)[1].ravel())
        total = grouped_pairs(exact)
        rows.append({"threshold": t, "n": len(x), "ivf_s": ivf_s, **summary(ivf, texts),
                     "exact_n": len(small), "exact_s": exact_s,
                     "ivf_recall_of_exact_pairs": both / total if total else None})
        r = rows[-1]
        print(f"cos > {t}: {r['items_in_groups']} of {len(x)} items in {r['groups']} groups "
              f"(largest {r['largest_group']}), text copies grouped: "
              f"{r['text_copies_grouped']}; ivf {ivf_s:.1f} s; exact on {len(small)}: "
              f"{exact_s:.1f} s, ivf keeps {r['ivf_recall_of_exact_pairs']} of its pairs; "
              f"largest group: {r['largest_group_distinct_texts']} distinct texts, e.g. "
              f"{r['largest_group_examples'][0]!r}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"command": "python benchmarks/bench_near_duplicates.py --json " + args.json,
             "machine": machine(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
