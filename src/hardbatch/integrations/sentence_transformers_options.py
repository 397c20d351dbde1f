"""Options of the sentence-transformers batch sampler: which ones each sampler takes (checked
when the factory is made, with the close name for a typo), the duplicate-text check run before
any encoding (with errors that name the rows, the texts and the parameters that control them),
and the log line of every structure build. Used by
:mod:`hardbatch.integrations.sentence_transformers_sampler`.
"""

from __future__ import annotations

import difflib
import inspect
import time

from .._logging import get_logger
from ..registry import canonical_sampler, sampler_class, sampler_names
from ..samplers import EmbeddingSampler
from ..samplers.duplicates import check_partition_keys, check_walk_keys

__all__ = ["DEFAULT_SAMPLER", "GENERIC_OPTIONS", "LABEL_COLUMNS", "LoggedBuild",
           "check_options", "check_text_keys", "parameters", "sampler_name", "sampler_options",
           "texts_error"]

#: sentence-transformers' own ``NoDuplicatesBatchSampler``, accepted besides the registry's names.
DEFAULT_SAMPLER = "default"
#: options of the integration itself, for every sampler
GENERIC_OPTIONS = ("text_column", "refresh_every", "encode_batch_size", "show_progress_bar",
                   "no_duplicates", "duplicate_columns")
SET_HERE = ("embeddings", "n_or_dataset", "batch_size", "drop_last", "seed", "rank",
             "world_size", "progress")  # what the integration passes the sampler itself
LABEL_COLUMNS = ("label", "score")  # sentence-transformers' default valid_label_columns
_log = get_logger("integrations.sentence_transformers")


def sampler_name(name: str) -> str:
    """``name`` as a registry sampler name, or ``"default"``; ``ValueError`` listing both.

    Example:
        >>> from hardbatch.integrations.sentence_transformers_sampler import sampler_name
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
    """The keyword parameters of ``cls.__init__`` (no ``self``, ``*args``, ``**kwargs``).

    Example:
        >>> import hardbatch as hb
        >>> from hardbatch.integrations.sentence_transformers_options import parameters
        >>> parameters(hb.UniformBatchSampler)[:2]
        ['n_or_dataset', 'batch_size']
    """
    params = inspect.signature(cls.__init__).parameters
    return [p for p, v in params.items() if p != "self" and v.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def sampler_options(sampler: str) -> tuple[str, ...]:
    """The keyword options :func:`hard_negative_batch_sampler` takes with ``sampler``: the
    integration's own, ``embeddings`` for samplers that encode, and the sampler's options (but
    those the integration sets: batch size, seed, ranks, ...).

    Example:
        >>> from hardbatch.integrations.sentence_transformers_sampler import sampler_options
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
        >>> from hardbatch.integrations.sentence_transformers_options import check_options
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
        >>> from hardbatch.samplers.duplicates import encode_keys
        >>> from hardbatch.integrations.sentence_transformers_options import check_text_keys
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
        >>> from hardbatch.integrations.sentence_transformers_options import texts_error
        >>> "no_duplicates=False" in str(texts_error(ValueError("duplicate_keys: ..."), None))
        True
    """
    return ValueError(
        f"{err} [here the keys are the rows' texts (columns {getattr(keys, 'columns', '?')}): "
        "'items' are rows, and rows sharing a text never share a batch; choose the columns "
        "that count with duplicate_columns=[...], or turn this off with no_duplicates=False]")


class LoggedBuild:
    """A sampler's ``build`` (of the :class:`~hardbatch.samplers.Builder` protocol) that logs
    one INFO line per build (what, N, seconds) on ``hardbatch.integrations.sentence_transformers``;
    set as the sampler's own attribute (picklable, unlike a closure).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.integrations.sentence_transformers_options import LoggedBuild
        >>> sampler = hb.KNNBatchSampler(np.eye(40, 8), 4, refresh_every=None)
        >>> sampler.build = LoggedBuild(sampler, "knn")
        >>> len(list(sampler)), sampler.refreshes
        (10, 1)
    """

    def __init__(self, sampler, kind: str) -> None:
        self.sampler, self.kind = sampler, kind

    def __call__(self, x, key, group):
        t0 = time.perf_counter()
        out = type(self.sampler).build(self.sampler, x, key, group)
        seconds, n = time.perf_counter() - t0, self.sampler.num_items
        _log.info("%s build (refresh %s): N=%d, seconds=%.3f", self.kind, key, n, seconds,
                  extra={"build": self.kind, "n": n, "seconds": seconds})
        return out
