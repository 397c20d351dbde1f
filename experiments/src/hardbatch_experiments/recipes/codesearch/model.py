"""The sentence-transformers side of the code-search recipe: the starting model (offline
all-MiniLM-L6-v2), frozen lower layers, per-column token limits for the trainer, encoding, and
hard-negative mining with ``sentence_transformers.util.mine_hard_negatives``.

sentence-transformers is imported inside the functions (as everywhere in the experiments), so
importing this module stays light.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..simcse.data import RecordingSampler

__all__ = ["DEVICES", "TimedSampler", "column_length_collator", "device_record", "encode_texts",
           "freeze_layers", "library_versions", "mine_negatives", "no_duplicates_sampler",
           "resolve_device", "training_classes"]

#: ``--device`` values: ``auto`` is the CUDA device when there is one, else the CPU.
DEVICES = ("cpu", "auto", "cuda")


def resolve_device(name: str) -> str:
    """``cpu`` or ``cuda`` for ``--device NAME``: ``auto`` picks CUDA when available; ``cuda``
    without a CUDA device is an error."""
    if name not in DEVICES:
        raise ValueError(f"--device {name!r}: use one of {', '.join(DEVICES)}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda: torch {torch.__version__} sees no CUDA device; use "
                         "--device cpu or --device auto")
    return name


def device_record(device: str, reset: bool = False) -> dict | None:
    """On ``cuda``: the device's name and the peak memory allocated since the last reset (GiB);
    ``reset=True`` starts a new peak. None on the CPU."""
    if device != "cuda":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return {"name": torch.cuda.get_device_name(),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}


def training_classes():
    """``(SentenceTransformerTrainer, SentenceTransformerTrainingArguments,
    MultipleNegativesRankingLoss)``, offline and quiet (transformers' logging at errors only)."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    import sentence_transformers as st
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:  # where the losses live since sentence-transformers 6
        losses = importlib.import_module("sentence_transformers.sentence_transformer.losses")
    except ImportError:
        losses = importlib.import_module("sentence_transformers.losses")
    return (st.SentenceTransformerTrainer, st.SentenceTransformerTrainingArguments,
            losses.MultipleNegativesRankingLoss)


def library_versions() -> dict:
    """The versions of the training stack (stored with every run)."""
    import sentence_transformers
    import transformers

    import hardbatch

    return {"sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "hardbatch": getattr(hardbatch, "__version__", None)}


def freeze_layers(model, n: int) -> dict:
    """Freeze the token embeddings and the lowest ``n`` transformer layers of ``model`` (a
    BERT-style ``SentenceTransformer``; ``n = 0`` freezes nothing). Returns the parameter counts
    ``{"trainable", "frozen"}``."""
    if n:
        auto = model[0].auto_model
        layers = auto.encoder.layer
        if not 0 <= n <= len(layers):
            raise ValueError(f"--freeze-layers {n} must lie in [0, {len(layers)}] (the model "
                             f"has {len(layers)} transformer layers)")
        for module in (auto.embeddings, *layers[:n]):
            for p in module.parameters():
                p.requires_grad_(False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return {"trainable": trainable, "frozen": frozen}


def column_length_collator(model, lengths: dict[str, int]):
    """The trainer's data collator with a token limit per dataset column (``{"anchor": 64,
    "positive": 256, ...}``; other columns: the model's ``max_seq_length``).

    sentence-transformers' collator resolves a column's task and then that task's
    ``max_length``; this subclass keys the limit by the column instead (hooks of
    sentence-transformers >= 6; older versions raise a ``RuntimeError``).
    """
    from sentence_transformers.sentence_transformer.data_collator import (
        SentenceTransformerDataCollator,
    )

    if not all(hasattr(SentenceTransformerDataCollator, h)
               for h in ("_get_task_for_column", "_get_max_length_for_task")):
        raise RuntimeError("per-column token limits need sentence-transformers >= 6")

    @dataclass
    class ColumnLengthCollator(SentenceTransformerDataCollator):
        column_max_length: dict = field(default_factory=dict)
        column: str | None = field(default=None, init=False, repr=False)

        def _get_task_for_column(self, column_name, column_position, router_mapping):
            self.column = column_name  # read by the next call, for the same column
            return super()._get_task_for_column(column_name, column_position, router_mapping)

        def _get_max_length_for_task(self, task):
            return self.column_max_length.get(self.column,
                                              super()._get_max_length_for_task(task))

    return ColumnLengthCollator(preprocess_fn=model.preprocess, column_max_length=dict(lengths))


def no_duplicates_sampler():
    """``BatchSamplers.NO_DUPLICATES`` (its module moved in sentence-transformers 6)."""
    try:
        from sentence_transformers.base.sampler import BatchSamplers
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.training_args import BatchSamplers
    return BatchSamplers.NO_DUPLICATES


def encode_texts(model, texts: Sequence[str], max_length: int, batch_size: int = 64) -> np.ndarray:
    """Unit-norm float32 ``[n, d]`` embeddings of ``texts`` (eval mode, no gradients) with the
    model's token limit set to ``max_length`` for the call."""
    before, was_training = model.max_seq_length, model.training
    model.max_seq_length = int(max_length)
    try:
        with torch.no_grad():
            emb = model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                               normalize_embeddings=True, show_progress_bar=False)
    finally:
        model.max_seq_length = before
        model.train(was_training)
    return np.asarray(emb, np.float32)


def mine_negatives(model, train, *, range_max: int, relative_margin: float, max_length: int,
                   batch_size: int = 64):
    """One mined hard negative per (anchor, positive) row of ``train`` (a ``datasets.Dataset``)
    with ``mine_hard_negatives`` and ``model`` (the starting model): the most similar code not
    relevant to the query among its ``range_max`` nearest, skipping codes within
    ``relative_margin`` of the positive's score; triplets out (rows without a negative are
    dropped; rows come grouped by query). Codes are embedded with ``max_length`` tokens.

    Returns ``(triplets, stats)``: ``stats`` holds the rows in / out and the seconds taken.
    """
    from sentence_transformers.util import mine_hard_negatives

    t0 = time.perf_counter()
    before = model.max_seq_length
    model.max_seq_length = int(max_length)
    try:  # (mine_hard_negatives always shows its encoding progress bars)
        triplets = mine_hard_negatives(
            train, model, anchor_column_name="anchor", positive_column_name="positive",
            range_max=range_max, relative_margin=relative_margin, num_negatives=1,
            sampling_strategy="top", output_format="triplet", batch_size=batch_size,
            faiss_batch_size=2048, use_faiss=False, verbose=False)
    finally:
        model.max_seq_length = before
    stats = {"rows_in": len(train), "rows_out": len(triplets), "range_max": range_max,
             "relative_margin": relative_margin, "num_negatives": 1, "sampling_strategy": "top",
             "max_seq_length": int(max_length), "seconds": time.perf_counter() - t0}
    return triplets, stats


class TimedSampler(RecordingSampler):
    """A batch sampler wrapper that records the batches and the seconds spent drawing them
    (``seconds``: graph rebuilds, re-encodings and walks happen there)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.seconds = 0.0

    def __iter__(self):
        it = iter(self.inner)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self.seconds += time.perf_counter() - t0
                return
            self.seconds += time.perf_counter() - t0
            batch = [int(i) for i in batch]
            self.batches.append(batch)
            yield batch
