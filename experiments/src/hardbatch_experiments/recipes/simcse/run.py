"""One SimCSE run (train through ``SentenceTransformerTrainer``, score STS, write the JSON),
one ``--plan-only`` run (the batch plan's diagnostics, no training), and the run tag."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hardbatch.integrations.sentence_transformers import (
    DEFAULT_SAMPLER,
    hard_negative_batch_sampler,
)

from ... import runs
from ...factories import LOSS_SETTINGS
from .data import RecordingSampler, batch_diagnostics, starting_embeddings

__all__ = ["MNRL", "TAG_DEFAULTS", "plan_one", "result_path", "run_one", "run_steps", "run_tag"]

#: sentence-transformers' own loss, accepted besides the registry's loss names.
MNRL = "mnrl"
# defaults that do not enter the run tag (others do, through a short hash)
TAG_DEFAULTS = {"model": "all-MiniLM-L6-v2", "batch_size": 64, "lr": 3e-5, "temperature": 0.05,
                "max_seq_length": 32, "tau_plus": 0.1, "beta": 1.0, "candidates": 1000,
                "neighbors": 500, "restart": 0.7, "quantile": 0.999, "refresh_every": None,
                "reinit_layers": 0, "guide_margin": None, "input_dropout": 0.0}


def run_tag(args) -> str:
    """``nN_stepsS[_stslimitL][_hHASH]``: the size of the run and a hash of the options that
    differ from :data:`TAG_DEFAULTS`."""
    base = f"n{args.num_sentences}_steps{run_steps(args)}"
    if getattr(args, "reinit_layers", 0):
        base = f"reinit{args.reinit_layers}_" + base
    if args.sts_limit:
        base += f"_stslimit{args.sts_limit}"
    changed = {k: getattr(args, k, v) for k, v in TAG_DEFAULTS.items()
               if getattr(args, k, v) != v}
    if changed:
        digest = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:6]
        base += f"_h{digest}"
    return base


def run_steps(args) -> int:
    """``--max-steps``, else one epoch (N // batch size)."""
    return args.max_steps or max(1, args.num_sentences // args.batch_size)


def result_path(out: Path | str, sampler: str, loss: str, seed: int, tag: str) -> Path:
    """``OUT/simcse__SAMPLER__LOSS__seedS__TAG.json``."""
    return runs.result_path(out, "simcse", sampler, loss, seed=seed, tag=tag)


def _batch_sampler(args, sampler_name: str, model, texts: list[str], start_emb: np.ndarray):
    """``(train, make, options)``: the training dataset (each sentence its own positive), the
    ``batch_sampler`` factory of :func:`hard_negative_batch_sampler` and the sampler options
    (proximity: M, K capped to N/2, M/2 and the restart; GCBS: the quantile)."""
    from datasets import Dataset

    train = Dataset.from_dict({"anchor": texts, "positive": texts})
    cands = min(args.candidates, max(2, len(texts) // 2))
    options: dict = {}
    if sampler_name == "proximity":
        options = {"candidates": cands, "neighbors": min(args.neighbors, max(1, cands // 2)),
                   "restart": args.restart}
    elif sampler_name == "gcbs":
        options = {"quantile": args.quantile}
    make = hard_negative_batch_sampler(
        model, sampler_name, train_dataset=train, refresh_every=args.refresh_every,
        embeddings=None if sampler_name in (DEFAULT_SAMPLER, "uniform") else start_emb,
        **options)
    return train, make, options


def _loss_options(args, loss_name: str) -> dict:
    """``--tau-plus`` / ``--beta`` for the hardbatch losses that take them (none for MNRL)."""
    takes = LOSS_SETTINGS.get(loss_name, ())
    return {k: getattr(args, k) for k in ("tau_plus", "beta") if k in takes}


def run_one(args, sampler_name: str, loss_name: str, seed: int, path: Path, texts: list[str],
            sts_sets: dict, command: str, log=print) -> dict:
    """Train and evaluate one configuration; writes ``path`` (JSON) and returns the record."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:  # v3 - v5
        from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    from hardbatch.integrations.sentence_transformers import SentenceTransformerLoss

    from ...sts import evaluate_sts, load_sentence_transformer

    hf_logging.set_verbosity_error()
    t_start, c_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = load_sentence_transformer(args.model)
    eval_max_len = model.max_seq_length
    t0 = time.perf_counter()
    start_emb, emb_origin = starting_embeddings(model, texts, args.model, args.start_embeddings)
    t_emb = time.perf_counter() - t0
    n, steps, bsz = len(texts), run_steps(args), args.batch_size
    train, make, options = _batch_sampler(args, sampler_name, model, texts, start_emb)
    recorders: list[RecordingSampler] = []

    def batch_sampler(dataset, *a, **kw):
        rec = RecordingSampler(make(dataset, *a, **kw))
        recorders.append(rec)
        return rec

    scale = 1.0 / args.temperature
    if loss_name == MNRL:
        loss = MultipleNegativesRankingLoss(model, scale=scale)
    else:
        loss = SentenceTransformerLoss(model, loss_name, scale=scale,
                                       **_loss_options(args, loss_name))

    trace = {"step": [], "loss": [], "grad_norm": [], "wall_s": []}

    class _Trace(TrainerCallback):
        def on_log(self, targs, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                trace["step"].append(int(state.global_step))
                trace["loss"].append(float(logs["loss"]))
                trace["grad_norm"].append(float(logs.get("grad_norm", "nan")))
                trace["wall_s"].append(time.perf_counter() - t_train)

    model.max_seq_length = args.max_seq_length
    with tempfile.TemporaryDirectory(prefix="hb-simcse-") as tmp:
        targs = SentenceTransformerTrainingArguments(
            output_dir=tmp, per_device_train_batch_size=bsz, max_steps=steps,
            learning_rate=args.lr, warmup_steps=0, weight_decay=0.0, lr_scheduler_type="linear",
            seed=seed, data_seed=seed, dataloader_drop_last=True, save_strategy="no",
            report_to="none", logging_steps=max(1, min(10, steps // 10)), disable_tqdm=True,
            use_cpu=True, batch_sampler=batch_sampler)
        trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train,
                                             loss=loss, callbacks=[_Trace()])
        t_train = time.perf_counter()
        out = trainer.train()
        train_time = time.perf_counter() - t_train
    model.max_seq_length = eval_max_len
    train_sampler = recorders[-1]
    sampler_seconds = float(getattr(getattr(train_sampler.inner, "hard_sampler", None),
                                    "sampler_seconds", 0.0) or 0.0)
    batches = train_sampler.batches[:steps]
    t0 = time.perf_counter()
    diag = batch_diagnostics(start_emb, batches, texts, args.near_duplicate)
    t_diag = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.set_num_threads(max(1, args.eval_threads or args.threads))
    sts = evaluate_sts(model, sts_sets, batch_size=args.eval_batch_size)
    torch.set_num_threads(max(1, args.threads))
    eval_time = time.perf_counter() - t0
    config = {"model": args.model, "num_sentences": n, "steps": steps, "batch_size": bsz,
              "lr": args.lr, "temperature": args.temperature, "scale": scale,
              "max_seq_length_train": args.max_seq_length, "max_seq_length_eval": eval_max_len,
              "optimizer": "AdamW (HF Trainer default), linear decay, no warm-up",
              "drop_last": True,
              **{k: _loss_options(args, loss_name).get(k) for k in ("tau_plus", "beta")},
              **{k: options.get(k) for k in ("candidates", "neighbors", "restart", "quantile")},
              "refresh_every": args.refresh_every, "start_embeddings": emb_origin,
              "threads": args.threads, "eval_threads": args.eval_threads or args.threads,
              "sts_limit": args.sts_limit}
    record = {
        "benchmark": "simcse", "sampler": sampler_name, "loss": loss_name, "seed": seed,
        "tag": run_tag(args), "config": config,
        "avg": sts["avg"], "sts": {t: v["spearman"] for t, v in sts["tasks"].items()},
        "sts_detail": sts,
        "diagnostics": {k: v for k, v in diag.items() if k != "per_batch"},
        "diagnostics_per_batch": diag["per_batch"],
        "reference_diagnostics": _reference(diag, emb_origin),
        "steps": int(out.global_step), "train_loss": float(out.training_loss),
        # DCL / HCL: share of the first batch's rows on the debiasing floor (loss ~0 there).
        "debias_floor_fraction": getattr(getattr(loss, "loss", None), "floor_fraction", None),
        "trace": trace,
        "wall_time_s": time.perf_counter() - t_start, "train_time_s": train_time,
        "steps_per_s": out.global_step / train_time if train_time > 0 else None,
        "eval_time_s": eval_time, "start_embedding_time_s": t_emb,
        "diagnostics_time_s": t_diag, "sampler_time_s": sampler_seconds,
        "cpu_time_s": time.process_time() - c_start,
        "command": command, "env": runs.env_record(),
    }
    runs.write_json_atomic(path, record)
    return record


def _reference(diag: dict, origin: str) -> dict:
    """The run's ``reference_diagnostics``: its batches are scored in the starting model's
    embeddings (``diagnostics``), one coordinate system for every sampler, loss and seed."""
    return {"embedding": f"the starting model's unit embeddings of the training sentences "
                         f"({origin}): the same for every run",
            "mean_hardness": diag["mean_hardness"],
            "mean_near_duplicate_rate": diag["mean_near_duplicate_rate"],
            "near_duplicate_threshold": diag["near_duplicate_threshold"]}


def plan_one(args, sampler_name: str, seed: int, path: Path, texts: list[str],
             command: str) -> dict:
    """Diagnostics of a sampler's batch plan without training (``--plan-only``).

    Graphs and orders are built once from the starting model and never refreshed, so the
    batches a run trains on depend only on the sampler, the seed and the starting embeddings:
    this draws the same number of batches from the same sampler (through the same
    ``hard_negative_batch_sampler``) and scores them with :func:`batch_diagnostics`. Writes
    ``path`` (JSON with ``plan_diagnostics``) and returns the record.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ...sts import load_sentence_transformer

    t0 = time.perf_counter()
    model = load_sentence_transformer(args.model)
    start_emb, origin = starting_embeddings(model, texts, args.model, args.start_embeddings)
    n, steps = len(texts), run_steps(args)
    train, make, options = _batch_sampler(args, sampler_name, model, texts, start_emb)
    sampler = make(train, args.batch_size, drop_last=True, seed=seed,
                   generator=torch.Generator().manual_seed(seed))
    sampler.set_epoch(0)
    batches: list[list[int]] = []
    while len(batches) < steps:
        before = len(batches)
        batches += [[int(i) for i in b] for b in sampler][: steps - len(batches)]
        if len(batches) == before:
            break
    diag = batch_diagnostics(start_emb, batches, texts, args.near_duplicate)
    record = {"benchmark": "simcse-plan", "sampler": sampler_name, "seed": seed,
              "tag": run_tag(args), "num_sentences": n, "steps": len(batches),
              "batch_size": args.batch_size, "sampler_options": options,
              "start_embeddings": origin,
              "plan_diagnostics": {k: v for k, v in diag.items() if k != "per_batch"},
              "reference_diagnostics": _reference(diag, origin),
              "wall_time_s": time.perf_counter() - t0, "command": command,
              "env": runs.env_record()}
    runs.write_json_atomic(path, record)
    return record
