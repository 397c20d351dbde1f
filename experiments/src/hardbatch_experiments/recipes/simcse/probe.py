"""Measurements that fix the re-initialised-MiniLM setting before any confirmatory run.

``python -m hardbatch_experiments.recipes.simcse.probe start --layers 0,1,2,3,4``: for each L,
the starting model (:mod:`.partial`, L = 0: the unmodified fine-tuned MiniLM), its SimCSE loss
at step 0 on a fixed set of batches (the first ``--probe-batches`` batches of hardbatch's
uniform sampler, seed 0, over the first N sentences; dropout views, temperature 0.05, B = 64),
its 6-task STS average, and the costs: cache build, one training step (top layers only, B = 64)
and one re-encoding pass over the cache. One JSON per (L, seed): ``OUT/start__L{L}__seed{S}.json``.

``python -m hardbatch_experiments.recipes.simcse.probe cost --layers 1,2,3,4,6``: the CPU time
(one thread) of the cache build, a re-encoding pass and a training step per L (``OUT/cost.json``).

``python -m hardbatch_experiments.recipes.simcse.probe hardness --layers 2``: mean top-1
negative cosine (:func:`hardbatch.metrics.batch_hardness`) of proximity-graph batches for each
K of ``--neighbors`` (M = ``--candidates``, alpha ``--restart``) and of uniform batches, all
built from and measured in one fixed embedding: the starting model's (L, seed 0); the full
fine-tuned MiniLM's cached embeddings are a second, reported column. ``OUT/hardness__L{L}.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ... import runs
from .data import batch_diagnostics, read_sentences
from .partial import (
    INIT_RULE,
    CachedEncoder,
    LowerCache,
    bert_of,
    probe_loss,
    reinit_top_layers,
    train_partial,
)
from .partial_run import cached_lower

__all__ = ["build_parser", "fixed_batches", "main", "starting_model"]


def fixed_batches(n: int, batch_size: int, count: int, seed: int = 0) -> list[list[int]]:
    """The first ``count`` batches of hardbatch's uniform sampler over ``n`` items (``seed``)."""
    from hardbatch.registry import make_sampler

    s = make_sampler("uniform", n, batch_size, drop_last=True, seed=seed)
    s.set_epoch(0)
    return [[int(i) for i in b] for b, _ in zip(s, range(count))]


def starting_model(model_name: str, layers: int, seed: int, texts, max_seq_length: int = 32):
    """``(model, top_layers, cache, encoder)``: MiniLM with its top ``layers`` layers
    re-initialised (``layers`` = 0: unchanged, the top layer is then the 'trained' part) and the
    lower layers' cache over ``texts``."""
    from ...sts import load_sentence_transformer

    model = load_sentence_transformer(model_name)
    bert = bert_of(model)
    if layers > 0:
        top = reinit_top_layers(model, layers, seed)
    else:
        top = list(bert.encoder.layer[-1:])
    if layers > 0:  # stored under $HARDBATCH_CACHE, shared with the training runs
        cache, _ = cached_lower(model, texts, layers, max_seq_length, model_name)
    else:
        cache = LowerCache(model, texts, 1, max_seq_length=max_seq_length)
    return model, top, cache, CachedEncoder(cache, top)


def _start(args) -> int:
    from ...sts import evaluate_sts, load_sts

    texts = read_sentences(args.data_dir, args.num_sentences)
    batches = fixed_batches(len(texts), args.batch_size, args.probe_batches)
    sts_sets = None if args.no_sts else load_sts(args.sts_dir)
    for layers in [int(x) for x in args.layers.split(",")]:
        for seed in [int(x) for x in args.seeds.split(",")]:
            drop = f"__indrop{args.input_dropout:g}" if args.input_dropout else ""
            path = Path(args.out) / f"start__L{layers}__seed{seed}{drop}.json"
            if path.exists() and not args.force:
                print(f"[probe] {path} exists, skipped", flush=True)
                continue
            t0 = time.perf_counter()
            model, top, cache, enc = starting_model(args.model, layers, seed, texts)
            losses = probe_loss(cache, top, batches, args.temperature, seed=0,
                                input_dropout=args.input_dropout)
            enc.encode_rows(range(len(cache)))
            encode_s, encode_cpu = enc.seconds, enc.cpu_seconds
            state = [p.detach().clone() for layer in top for p in layer.parameters()]
            trace = train_partial(cache, top, iter(batches), min(args.timing_steps, len(batches)),
                                  lr=1e-4, temperature=args.temperature, seed=seed)
            with torch.no_grad():  # back to the starting model for the STS evaluation
                for p, s in zip((p for layer in top for p in layer.parameters()), state):
                    p.copy_(s)
            sts = None
            if sts_sets is not None:
                t_sts, c_sts = time.perf_counter(), time.process_time()
                sts = evaluate_sts(model, sts_sets, batch_size=128)
                sts = {"avg": sts["avg"], "tasks": {t: v["spearman"]
                                                     for t, v in sts["tasks"].items()},
                       "seconds": time.perf_counter() - t_sts,
                       "cpu_seconds": time.process_time() - c_sts}
            step_s = trace["step_seconds"][1:] or trace["step_seconds"]
            step_c = trace["step_cpu_seconds"][1:] or trace["step_cpu_seconds"]
            rec = {"benchmark": "simcse-start", "reinit_layers": layers, "seed": seed,
                   "input_dropout": args.input_dropout,
                   "init_rule": INIT_RULE if layers else "none (the fine-tuned model)",
                   "num_sentences": len(texts), "batch_size": args.batch_size,
                   "temperature": args.temperature, "probe_batches": len(batches),
                   "probe_batches_rule": "first batches of hardbatch uniform, seed 0",
                   "step0_loss_mean": float(np.mean(losses)), "step0_loss": losses,
                   "log_batch_size": float(np.log(args.batch_size)),
                   "sts": sts, "cache_build_s": cache.build_seconds,
                   "cache_bytes": cache.nbytes,
                   "cache_build_s_per_1k": 1000 * cache.build_seconds / len(cache),
                   "encode_pass_s": encode_s,
                   "encode_s_per_1k": 1000 * encode_s / len(cache),
                   "encode_cpu_s_per_1k": 1000 * encode_cpu / len(cache),
                   "cache_build_cpu_s_per_1k": 1000 * getattr(cache, "build_cpu_seconds",
                                                              float("nan")) / len(cache),
                   "step_cpu_s_median": float(np.median(step_c)),
                   "step_s_median": float(np.median(step_s)), "step_s": trace["step_seconds"],
                   "threads": torch.get_num_threads(),
                   "wall_time_s": time.perf_counter() - t0,
                   "command": " ".join(["python -m hardbatch_experiments.recipes.simcse.probe",
                                        *sys.argv[1:]]), "env": runs.env_record()}
            runs.write_json_atomic(path, rec)
            print(f"[probe] L={layers} seed={seed}: step-0 loss {rec['step0_loss_mean']:.3f} "
                  f"(log B = {rec['log_batch_size']:.3f}) STS avg "
                  f"{sts['avg'] if sts else float('nan'):.2f}; step {rec['step_s_median']:.3f}s, "
                  f"encode {rec['encode_s_per_1k']:.2f}s/1k, cache "
                  f"{rec['cache_build_s_per_1k']:.1f}s/1k", flush=True)
    return 0


def _cost(args) -> int:
    """CPU cost (process time, one thread) of the cache build, a re-encoding pass and a B-size
    training step of the top L layers, per L (L = 6: the whole transformer, for reference)."""
    from ...sts import load_sentence_transformer

    texts = read_sentences(args.data_dir, args.num_sentences)
    batches = fixed_batches(len(texts), args.batch_size, args.timing_steps + 1)
    rows = []
    for layers in [int(x) for x in args.layers.split(",")]:
        model = load_sentence_transformer(args.model)
        top = reinit_top_layers(model, layers, 0)
        cache = LowerCache(model, texts, layers)
        enc = CachedEncoder(cache, top)
        enc.encode_rows(range(len(cache)))
        trace = train_partial(cache, top, iter(batches), len(batches), lr=1e-4,
                              temperature=args.temperature, seed=0)
        rows.append({"reinit_layers": layers,
                     "cache_build_cpu_s_per_1k": 1000 * cache.build_cpu_seconds / len(cache),
                     "cache_build_s_per_1k": 1000 * cache.build_seconds / len(cache),
                     "cache_mb_per_1k": cache.nbytes / len(cache) * 1000 / 2**20,
                     "encode_cpu_s_per_1k": 1000 * enc.cpu_seconds / len(cache),
                     "encode_s_per_1k": 1000 * enc.seconds / len(cache),
                     "step_cpu_s_median": float(np.median(trace["step_cpu_seconds"][1:])),
                     "step_s_median": float(np.median(trace["step_seconds"][1:])),
                     "steps_timed": len(batches) - 1})
        print(f"[probe] cost L={layers}: {rows[-1]}", flush=True)
    rec = {"benchmark": "simcse-cost", "num_sentences": len(texts),
           "batch_size": args.batch_size, "threads": torch.get_num_threads(), "rows": rows,
           "note": "CPU = process time of this one-thread process (the work, whatever else "
                   "shares the cores); wall times were measured under that contention",
           "command": " ".join(["python -m hardbatch_experiments.recipes.simcse.probe",
                                *sys.argv[1:]]), "env": runs.env_record()}
    runs.write_json_atomic(Path(args.out) / "cost.json", rec)
    return 0


def _hardness(args) -> int:
    from hardbatch.metrics import batch_hardness
    from hardbatch.registry import make_sampler

    texts = read_sentences(args.data_dir, args.num_sentences)
    n = len(texts)
    ref = None
    if args.reference:
        ref = torch.from_numpy(np.load(args.reference, mmap_mode="r")[:n].astype(np.float32))
        ref = torch.nn.functional.normalize(ref, dim=1)
    for layers in [int(x) for x in args.layers.split(",")]:
        t0 = time.perf_counter()
        _, _, _, enc = starting_model(args.model, layers, 0, texts)
        emb = enc.encode_rows(range(n))
        rows = []
        settings = [("uniform", None)] + [("proximity", int(k)) for k in args.neighbors.split(",")]
        for name, k in settings:
            opts = {"drop_last": True, "seed": 0}
            if name == "proximity":
                opts.update(candidates=args.candidates, neighbors=k, restart=args.restart,
                            refresh_every=None)
            s = make_sampler(name, emb, args.batch_size, **opts)
            s.set_epoch(0)
            batches = [b for b, _ in zip(s, range(args.batches))]
            h = [batch_hardness(emb, torch.as_tensor(b)) for b in batches]
            hr = [batch_hardness(ref, torch.as_tensor(b)) for b in batches] if ref is not None \
                else []
            above = (batch_diagnostics(ref.numpy(), batches, texts)["mean_pairs_above"]
                     if ref is not None else None)
            rows.append({"sampler": name, "neighbors": k, "batches": len(batches),
                         "hardness": float(np.mean(h)),
                         "hardness_reference": float(np.mean(hr)) if hr else None,
                         "reference_pairs_above": above})
            print(f"[probe] L={layers} {name} K={k}: hardness {rows[-1]['hardness']:.3f} "
                  f"(full MiniLM {rows[-1]['hardness_reference']})", flush=True)
        rec = {"benchmark": "simcse-hardness", "reinit_layers": layers, "seed": 0,
               "num_sentences": n, "batch_size": args.batch_size,
               "candidates": args.candidates, "restart": args.restart,
               "embedding": f"starting model (L = {layers}, seed 0), top layers over the cache",
               "reference": args.reference, "rows": rows,
               "wall_time_s": time.perf_counter() - t0,
               "command": " ".join(["python -m hardbatch_experiments.recipes.simcse.probe",
                                    *sys.argv[1:]]), "env": runs.env_record()}
        runs.write_json_atomic(Path(args.out) / f"hardness__L{layers}.json", rec)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hardbatch_experiments.recipes.simcse.probe",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("start", "cost", "hardness"))
    p.add_argument("--layers", default="1,2,3,4")
    p.add_argument("--seeds", default="0")
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--sts-dir", default=None)
    p.add_argument("--num-sentences", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--probe-batches", type=int, default=20)
    p.add_argument("--timing-steps", type=int, default=8)
    p.add_argument("--no-sts", action="store_true")
    p.add_argument("--input-dropout", type=float, default=0.0,
                   help="start: dropout on the cached inputs of each view (default 0)")
    p.add_argument("--neighbors", default="10,20,50,100")
    p.add_argument("--candidates", type=int, default=1000)
    p.add_argument("--restart", type=float, default=0.7)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--reference", default=None, help="fixed reference embeddings (.npy)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--force", action="store_true")
    p.add_argument("--out", default="results/text/start")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    return {"start": _start, "cost": _cost, "hardness": _hardness}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
