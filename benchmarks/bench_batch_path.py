"""The path of one batch (docs/architecture.md, "The path of a batch"): the Python calls and the
hardbatch files that a refresh step runs through, from the loader's request to the batch.

    python benchmarks/bench_batch_path.py            # proximity, kNN and GCBS
    python benchmarks/bench_batch_path.py --json benchmarks/results/batch_path.json

An ``EmbeddingBank`` of N = 2,000 rows, d = 32 (seed 0), B = 64; the proximity-graph and kNN
samplers refresh every 4 steps, GCBS once an epoch. Four steps are drawn (each followed by a
bank update of its rows), then ``sys.setprofile`` counts the calls of the fifth step (step 4: a
refresh step; GCBS's epoch order was built at the first step, so its fifth step is a slice) and
the files of hardbatch they run in. Counts, not times: the same on any machine for the same
library, torch and NumPy.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch

import hardbatch as hb

N, D, B = 2000, 32, 64


def make(kind: str, bank):
    return {"proximity": lambda: hb.ProximityGraphSampler(bank, B, 200, 20, refresh_every=4),
            "knn": lambda: hb.KNNBatchSampler(bank, B, refresh_every=4),
            "gcbs": lambda: hb.GCBSSampler(bank, B, quantile=0.99)}[kind]()


def count(kind: str) -> dict:
    """Calls (all, in hardbatch) and hardbatch's files, by calls, during step 4 of ``kind``."""
    bank = hb.EmbeddingBank(N, D, seed=0)
    steps = iter(make(kind, bank))
    for _ in range(4):
        batch = next(steps)
        bank.update(torch.tensor(batch), torch.randn(len(batch), D))
    files: collections.Counter = collections.Counter()
    calls = [0]

    def profile(frame, event, arg):
        if event == "call":
            calls[0] += 1
            name = frame.f_code.co_filename.replace("\\", "/")
            if "/hardbatch/" in name:
                files[name.split("/hardbatch/")[-1]] += 1

    sys.setprofile(profile)
    try:
        next(steps)
    finally:
        sys.setprofile(None)
    return {"calls": calls[0], "hardbatch_calls": sum(files.values()),
            "files": dict(sorted(files.items()))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samplers", nargs="+", default=["proximity", "knn", "gcbs"],
                    choices=["proximity", "knn", "gcbs"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = {kind: count(kind) for kind in args.samplers}
    for kind, row in out.items():
        print(f"{kind}: {row['calls']} calls, {row['hardbatch_calls']} in hardbatch, "
              f"{len(row['files'])} files: {', '.join(row['files'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "hardbatch": hb.__version__, **out}, f,
                      indent=1)
    return out


if __name__ == "__main__":
    main()
