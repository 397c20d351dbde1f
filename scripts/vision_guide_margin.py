"""Choose the margin of the vision sweep's guided arm before any guided sweep run (issue 21).

The guide is the sweep's fixed reference encoder (a uniform + InfoNCE run at B = 256 with seed
100, no sweep seed): a per-item embedding of the 8,192-image training subset. With a per-item
guide, ``Trainer(guide=, guide_margin=m)`` drops j as a negative of anchor i when
cos(g_i, g_j) > 1 - m (``hardbatch.guided_mask(g, g, m)``). For each margin of a grid this script
measures, in batches of the sweep's proximity arm built on the guide embedding (B = 64, M 500,
K 100, alpha 0.2 as at the start of a run, one epoch; and over all pairs), how many in-batch
pairs the mask drops and which share of them are same-class pairs (precision; CIFAR-10
labels, used for this choice only) and which share of the same-class pairs it drops (recall).

Rule, fixed before running it: the largest margin whose precision in proximity batches is at
least 0.5, i.e. the mask removes at least as many false negatives as true ones. Writes
results/vision/sweep/guide_margin.json (and prints a table).

    python scripts/vision_guide_margin.py
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from hardbatch import ProximityGraphSampler, guided_mask
from hardbatch_experiments.recipes.simclr import load_images, train_subset
from hardbatch_experiments.recipes.simclr_budget import load_reference_file

MARGINS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
MIN_PRECISION = 0.5


def mask_counts(g: torch.Tensor, y: torch.Tensor, batches, margin: float) -> dict:
    """Pairs (i < j) dropped by the guided mask inside ``batches``: count, same-class share
    (precision), share of the same-class pairs dropped (recall), dropped pairs per anchor."""
    dropped = same_dropped = same = pairs = 0
    for b in batches:
        b = torch.as_tensor(b)
        m = guided_mask(g[b], g[b], margin)
        s = y[b][:, None] == y[b][None, :]
        upper = torch.triu(torch.ones_like(m), diagonal=1)
        dropped += int((m & upper).sum())
        same_dropped += int((m & s & upper).sum())
        same += int((s & upper).sum())
        pairs += int(upper.sum())
    return {"dropped_pairs": dropped, "pairs": pairs,
            "dropped_share": dropped / pairs,
            "precision": same_dropped / dropped if dropped else None,
            "recall": same_dropped / same if same else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", default="results/vision/sweep/reference/"
                   "reference_uniform_infonce_b256_seed100.pt")
    p.add_argument("--train-size", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="results/vision/sweep/guide_margin.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    _, y_all, _, _ = load_images("cifar10", args.data_dir)
    ids = train_subset(y_all, args.train_size, seed=0)
    g, info = load_reference_file(args.reference, ids, flag="--reference")
    y = y_all[ids]
    # the sweep's proximity arm: M 500 candidates, K 100 neighbours, alpha 0.2 at its start
    sampler = ProximityGraphSampler(g, args.batch_size, candidates=500, neighbors=100,
                                    restart=0.2, seed=100)
    prox = [np.asarray(b) for b in sampler]
    everything = [np.arange(len(ids))]
    rows = []
    for m in MARGINS:
        rows.append({"margin": m, "proximity_batches": mask_counts(g, y, prox, m),
                     "all_pairs": mask_counts(g, y, everything, m)})
    ok = [r["margin"] for r in rows
          if (r["proximity_batches"]["precision"] or 0) >= MIN_PRECISION]
    chosen = max(ok) if ok else None
    print(f"{'margin':>7} {'dropped/pair':>13} {'precision':>9} {'recall':>7} | all pairs: "
          f"{'dropped/pair':>13} {'precision':>9} {'recall':>7}")
    for r in rows:
        a, b = r["proximity_batches"], r["all_pairs"]
        f = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{r['margin']:>7} {a['dropped_share']:>13.4f} {f(a['precision']):>9} "
              f"{f(a['recall']):>7} | {b['dropped_share']:>24.4f} {f(b['precision']):>9} "
              f"{f(b['recall']):>7}")
    print(f"chosen margin (largest with precision >= {MIN_PRECISION} in proximity batches): "
          f"{chosen}")
    record = {"rule": f"largest margin with precision >= {MIN_PRECISION} in proximity batches "
                      f"(B = {args.batch_size}, one epoch of ProximityGraphSampler(guide, B, "
                      "candidates=500, neighbors=100, restart=0.2, seed=100))",
              "chosen_margin": chosen, "margins": rows, "reference": info,
              "train_size": args.train_size, "batch_size": args.batch_size,
              "command": "python scripts/vision_guide_margin.py",
              "machine": {"host": platform.node(), "torch": torch.__version__},
              "wall_time_s": time.perf_counter() - t0}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
