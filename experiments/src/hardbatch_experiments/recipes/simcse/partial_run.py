"""One SimCSE run in the re-initialised-MiniLM setting (``--reinit-layers L``, :mod:`.partial`):
build the starting model (seeded), load or build the lower layers' cache, draw batches from the
sampler through the library's sentence-transformers integration (re-encoding = the top layers
over the cache), train the top layers, score STS + the STS-B retrieval view, write the JSON."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import torch

from ... import runs
from .data import batch_diagnostics, cache_dir
from .partial import INIT_RULE, CachedEncoder, LowerCache, reinit_top_layers, train_partial
from .retrieval import stsb_retrieval
from .run import run_tag

__all__ = ["cached_lower", "run_partial", "sampler_options"]


def cached_lower(model, texts: list[str], layers: int, max_seq_length: int,
                 model_name: str) -> tuple[LowerCache, str]:
    """The :class:`LowerCache` of ``texts``, stored under ``$HARDBATCH_CACHE`` (the lower layers
    are frozen and never re-initialised: the same for every seed and sampler); returns it and
    where it came from."""
    key = hashlib.sha1("\n".join(texts).encode()).hexdigest()[:10]
    name = (f"simcse_lower__{Path(str(model_name)).name}__L{layers}__n{len(texts)}__"
            f"t{max_seq_length}__{key}.pt")
    path = cache_dir() / name
    if path.is_file():
        t0 = time.perf_counter()
        state = torch.load(path)
        cache = LowerCache.__new__(LowerCache)
        cache.texts, cache.hidden, cache.mask = list(texts), state["hidden"], state["mask"]
        cache.build_seconds = time.perf_counter() - t0
        cache.index = {t: i for i, t in reversed(list(enumerate(cache.texts)))}
        return cache, f"loaded {path}"
    cache = LowerCache(model, texts, layers, max_seq_length=max_seq_length)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"hidden": cache.hidden, "mask": cache.mask}, tmp)
    os.replace(tmp, path)
    return cache, f"built ({cache.build_seconds:.0f} s) and stored at {path}"


def sampler_options(args, name: str, n: int) -> dict:
    """The sampler's options: proximity M (capped to N/2), K, alpha; GCBS quantile."""
    if name == "proximity":
        cands = min(args.candidates, max(2, n // 2))
        return {"candidates": cands, "neighbors": min(args.neighbors, max(1, cands // 2)),
                "restart": args.restart}
    if name == "gcbs":
        return {"quantile": args.quantile}
    return {}


def _batches(sampler, recorded: list[list[int]]):
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        before = len(recorded)
        for b in sampler:
            b = [int(i) for i in b]
            recorded.append(b)
            yield b
        if len(recorded) == before:
            raise ValueError("the sampler yielded no batch in a whole epoch")
        epoch += 1


def _guide(args, n: int) -> torch.Tensor | None:
    if args.guide_margin is None:
        return None
    g = np.load(args.reference_embeddings, mmap_mode="r")[:n].astype(np.float32)
    return torch.nn.functional.normalize(torch.from_numpy(g), dim=1)


def run_partial(args, sampler_name: str, loss_name: str, seed: int, path: Path,
                texts: list[str], sts_sets: dict, command: str, log=print) -> dict:
    """Train and evaluate one (sampler, seed) run of the re-initialised setting; writes
    ``path`` (JSON) and returns the record. ``loss_name`` must be ``mnrl`` / ``infonce``."""
    from datasets import Dataset

    from hardbatch.integrations.sentence_transformers import hard_negative_batch_sampler

    from ...sts import evaluate_sts, load_sentence_transformer

    if loss_name not in ("mnrl", "infonce"):
        raise ValueError(f"--reinit-layers trains with the SimCSE InfoNCE loss only (mnrl / "
                         f"infonce), got --loss {loss_name}")
    t_start, c_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = load_sentence_transformer(args.model)
    layers = reinit_top_layers(model, args.reinit_layers, seed)
    cache, cache_origin = cached_lower(model, texts, args.reinit_layers, args.max_seq_length,
                                       args.model)
    t_cache = time.perf_counter() - t_start
    enc = CachedEncoder(cache, layers)
    n, steps, bsz = len(texts), args.max_steps or max(1, len(texts) // args.batch_size), \
        args.batch_size
    options = sampler_options(args, sampler_name, n)
    train = Dataset.from_dict({"anchor": texts, "positive": texts})
    make = hard_negative_batch_sampler(enc, sampler_name, train_dataset=train,
                                       refresh_every=args.refresh_every, **options)
    t0 = time.perf_counter()
    sampler = make(train, bsz, drop_last=True, seed=seed,
                   generator=torch.Generator().manual_seed(seed))
    t_build = time.perf_counter() - t0
    guide = _guide(args, n)
    recorded: list[list[int]] = []
    enc_before, enc_cpu_before = enc.seconds, enc.cpu_seconds
    trace = train_partial(cache, layers, _batches(sampler, recorded), steps, lr=args.lr,
                          temperature=args.temperature, seed=seed, guide=guide,
                          guide_margin=args.guide_margin if args.guide_margin is not None
                          else 0.0, input_dropout=args.input_dropout)
    train_time = sum(trace["step_seconds"])
    refresh_time = enc.seconds - enc_before
    refresh_cpu = enc.cpu_seconds - enc_cpu_before
    sampler_seconds = float(getattr(getattr(sampler, "hard_sampler", None),
                                    "sampler_seconds", 0.0) or 0.0)
    wall_train = time.perf_counter() - t0
    ref = np.load(args.reference_embeddings, mmap_mode="r")[:n].astype(np.float32)
    diag = batch_diagnostics(ref, recorded[:steps], texts, args.near_duplicate)
    t0, c0 = time.perf_counter(), time.process_time()
    model.eval()
    torch.set_num_threads(max(1, args.eval_threads or args.threads))
    sts = evaluate_sts(model, sts_sets, batch_size=args.eval_batch_size)
    retr = stsb_retrieval(model, sts_sets, batch_size=args.eval_batch_size)
    torch.set_num_threads(max(1, args.threads))
    eval_time, eval_cpu = time.perf_counter() - t0, time.process_time() - c0
    loss = np.asarray(trace["loss"])
    chunk = max(1, steps // 50)
    config = {"model": args.model, "reinit_layers": args.reinit_layers, "init_rule": INIT_RULE,
              "trained": f"top {args.reinit_layers} transformer layers only (lower layers "
                         "frozen, their eval-mode output cached in float16)",
              "cache": cache_origin, "num_sentences": n, "steps": steps, "batch_size": bsz,
              "lr": args.lr, "temperature": args.temperature,
              "max_seq_length_train": args.max_seq_length,
              "max_seq_length_eval": model.max_seq_length,
              "optimizer": "AdamW (no weight decay), linear decay to 0, no warm-up",
              "dropout_stream": "torch.manual_seed(seed * 1000003 + step) before every step",
              "drop_last": True, **options, "refresh_every": args.refresh_every,
              "guide_margin": args.guide_margin, "input_dropout": args.input_dropout,
              "guide": args.reference_embeddings if args.guide_margin is not None else None,
              "threads": args.threads, "eval_threads": args.eval_threads or args.threads}
    record = {
        "benchmark": "simcse-reinit", "sampler": sampler_name, "loss": loss_name, "seed": seed,
        "tag": run_tag(args), "config": config,
        "avg": sts["avg"], "sts": {t: v["spearman"] for t, v in sts["tasks"].items()},
        "retrieval": {k: v for k, v in retr.items() if k != "ranks"},
        "diagnostics": {k: v for k, v in diag.items() if k != "per_batch"},
        "reference_diagnostics": {
            "embedding": f"the full fine-tuned MiniLM's unit embeddings "
                         f"({args.reference_embeddings}): the same for every run",
            "mean_hardness": diag["mean_hardness"],
            "mean_near_duplicate_rate": diag["mean_near_duplicate_rate"],
            "near_duplicate_threshold": diag["near_duplicate_threshold"]},
        "steps": len(trace["loss"]), "train_loss": float(loss.mean()),
        "loss_curve": [float(loss[i:i + chunk].mean()) for i in range(0, len(loss), chunk)],
        "loss_curve_chunk": chunk,
        "masked_fraction": float(np.mean(trace["masked_fraction"]))
        if trace["masked_fraction"] else None,
        "wall_time_s": time.perf_counter() - t_start, "train_time_s": train_time,
        "train_wall_s": wall_train, "step_s_median": float(np.median(trace["step_seconds"])),
        "train_cpu_s": float(sum(trace["step_cpu_seconds"])),
        "step_cpu_s_median": float(np.median(trace["step_cpu_seconds"])),
        "refresh_time_s": refresh_time, "refresh_cpu_s": refresh_cpu, "encoder_calls": enc.calls,
        "sampler_build_s": t_build, "sampler_time_s": sampler_seconds,
        "cache_time_s": t_cache, "eval_time_s": eval_time, "eval_cpu_s": eval_cpu,
        "cpu_time_s": time.process_time() - c_start,
        "command": command, "env": runs.env_record(),
    }
    runs.write_json_atomic(path, record)
    return record
