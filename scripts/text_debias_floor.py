"""Why DCL / HCL do not train in unsupervised SimCSE at t = 0.05: the debiasing floor.

For batches of the text benchmark's training sentences (uniform and proximity-graph batches of 64,
as in `hardbatch bench simcse`), encodes each batch twice in train mode (dropout = SimCSE's
augmentation, 32 tokens) with all-MiniLM-L6-v2 and reports, per temperature / tau_plus / beta,
the share of rows whose debiased negative term sits on its floor N e^(-1/t)
(`hardbatch.losses.debiased_floor_stats`): those rows have loss ~0 and no gradient.

    HF_HUB_OFFLINE=1 python scripts/text_debias_floor.py      # 15-35 s on 2 CPU cores
Writes results/text/debias_floor.json (rendered by scripts/report_text.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hardbatch import debiased_floor_stats
from hardbatch.registry import make_sampler
from hardbatch_experiments.recipes.simcse import read_sentences, starting_embeddings
from hardbatch_experiments.sts import load_sentence_transformer

SETTINGS = [(t, tp, beta) for t in (0.05, 0.1, 0.2, 0.5) for tp in (0.1, 0.01)
            for beta in (0.0, 1.0)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-sentences", type=int, default=5120)
    p.add_argument("--batches", type=int, default=4, help="batches per sampler (default 4)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="results/text/debias_floor.json")
    args = p.parse_args(argv)
    if args.batches < 1:
        p.error(f"--batches must be >= 1, got {args.batches}")
    if args.batch_size < 2:
        p.error(f"--batch-size must be >= 2 (a batch needs negatives), got {args.batch_size}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    texts = read_sentences(args.data_dir, args.num_sentences)
    model = load_sentence_transformer("all-MiniLM-L6-v2")
    emb, origin = starting_embeddings(model, texts, "all-MiniLM-L6-v2")
    model.max_seq_length = 32
    model.train()  # dropout on: the two passes are SimCSE's two views
    n, b = len(texts), args.batch_size
    samplers = {
        "uniform": make_sampler("uniform", n, b, drop_last=True, seed=args.seed),
        # The benchmark's proximity settings: M = 1000, K = 500, alpha = 0.7, built once.
        "proximity": make_sampler("proximity", emb, b, candidates=1000, neighbors=500,
                                  restart=0.7, refresh_every=None, drop_last=True,
                                  seed=args.seed),
    }
    rows = []
    for name, sampler in samplers.items():
        for k, batch in enumerate(sampler):
            if k >= args.batches:
                break
            feats = model.tokenize([texts[i] for i in batch])
            with torch.no_grad():
                z0, z1 = (model(dict(feats))["sentence_embedding"] for _ in range(2))
            z0, z1 = F.normalize(z0, dim=1), F.normalize(z1, dim=1)
            sim = z0 @ z1.T
            off = ~torch.eye(len(batch), dtype=torch.bool)
            cosines = {"pos_cos": float(sim.diagonal().mean()), "neg_cos": float(sim[off].mean()),
                       "neg_cos_max": float(sim[off].max())}
            for t, tp, beta in SETTINGS:
                frac, tau_max = debiased_floor_stats(z0, z1, temperature=t, tau_plus=tp,
                                                     beta=beta, form="simcse")
                rows.append({"sampler": name, "batch": k, "temperature": t, "tau_plus": tp,
                             "beta": beta, "floor_fraction": frac, "tau_plus_max": tau_max,
                             **cosines})
    record = {"what": "share of rows on the DCL / HCL floor, SimCSE dropout views, "
                      "all-MiniLM-L6-v2, form simcse",
              "num_sentences": n, "batch_size": b, "batches_per_sampler": args.batches,
              "seed": args.seed, "start_embeddings": origin, "rows": rows,
              "command": "python scripts/text_debias_floor.py " + " ".join(argv or sys.argv[1:]),
              "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}",
              "wall_time_s": time.perf_counter() - t0}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    agg: dict = {}
    for r in rows:
        agg.setdefault((r["sampler"], r["temperature"], r["tau_plus"], r["beta"]), []).append(
            r["floor_fraction"])
    for key, v in agg.items():
        print(*key, f"{np.mean(v):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
