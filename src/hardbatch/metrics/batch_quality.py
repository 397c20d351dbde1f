"""Per-batch and per-plan diagnostics: hardness, false negatives, duplicates, coverage.

See :mod:`hardbatch.metrics` for the conventions (cosine similarity over L2-normalised rows,
pairs over batch positions, what a batch and a plan may be).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor

from ._input_checks import (
    ArrayLike,
    BatchLike,
    as_batch,
    as_batches,
    check_num_items,
    embedding_table,
    labels_array,
    reference_table,
    unit_rows,
)

__all__ = ["NEAR_DUPLICATE", "batch_duplicate_rate", "batch_false_negative_rate",
           "batch_hardness", "batch_near_duplicate_rate", "batch_stats", "coverage",
           "draw_counts", "negative_similarities", "plan_stats", "similarity_histogram"]

#: Default cosine above which an in-batch pair counts as a near-duplicate (a likely false
#: negative when no labels exist), under the embedding it is measured in.
NEAR_DUPLICATE = 0.9


def _pairwise(embeddings, batch) -> tuple[Tensor, np.ndarray]:
    table, n, _ = embedding_table(embeddings)
    ids = as_batch(batch, n)
    x = unit_rows(table, ids)
    return (x @ x.T).clamp_(-1.0, 1.0), ids


def _upper_pairs(sims: Tensor) -> Tensor:
    b = sims.shape[0]
    iu = torch.triu_indices(b, b, offset=1)
    return sims[iu[0], iu[1]]


def _hardness_of(sims: Tensor) -> float:
    b = sims.shape[0]
    if b < 2:
        return math.nan
    masked = sims.clone()
    masked.fill_diagonal_(-math.inf)
    return float(masked.max(dim=1).values.mean())


def _fn_rate_of(batch_labels: np.ndarray) -> float:
    b = batch_labels.shape[0]
    if b < 2:
        return math.nan
    _, counts = np.unique(batch_labels, return_counts=True)
    counts = counts.astype(np.float64)
    return float((counts * (counts - 1)).sum() / (b * (b - 1)))


def _duplicate_rate_of(ids: np.ndarray) -> float:
    return float(1.0 - np.unique(ids).size / ids.size)


def _check_threshold(near_duplicate) -> float:
    try:
        value = float(near_duplicate)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"near_duplicate={near_duplicate!r} must be a cosine in [-1, 1] "
                         f"(e.g. {NEAR_DUPLICATE})") from exc
    if not -1.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"near_duplicate={near_duplicate!r} must be a cosine in [-1, 1] "
                         f"(e.g. {NEAR_DUPLICATE})")
    return value


def _check_range(range_, bins) -> tuple[int, float, float]:
    if isinstance(bins, bool) or not isinstance(bins, numbers.Integral) or int(bins) < 1:
        raise ValueError(f"bins={bins!r} must be a positive integer (e.g. 50)")
    try:
        lo, hi = (float(v) for v in range_)
    except Exception as exc:
        raise ValueError(f"range={range_!r} must be a pair (low, high), e.g. (-1.0, 1.0)") from exc
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"range={range_!r} must be finite with low < high, e.g. (-1.0, 1.0)")
    return int(bins), lo, hi


def _histogram(values: Tensor, bins: int, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    if values.numel() == 0:
        return torch.zeros(bins, dtype=torch.int64), edges
    counts, _ = torch.histogram(values.to(torch.float64), bins=bins, range=(lo, hi))
    return counts.round().to(torch.int64), edges


# ---------------------------------------------------------------------------------------------
# per batch
# ---------------------------------------------------------------------------------------------
def negative_similarities(embeddings: ArrayLike, batch: BatchLike) -> Tensor:
    """Cosine similarities of all in-batch pairs ``(p, q)``, ``p < q`` (batch positions).

    The values behind the cosine-similarity histograms of BatchSampler (KDD 2023), Fig. 4 left
    and Fig. 5: with in-batch negatives every pair of a batch is a negative pair, so a harder
    batch shifts the histogram to the right.

    Args:
        embeddings: ``[N, d]`` item embeddings (tensor on any device, or array); rows are
            L2-normalised here, so any scale is fine.
        batch: ``[B]`` item ids, rows of ``embeddings``.

    Returns:
        float64 tensor ``[B * (B - 1) / 2]`` in ``[-1, 1]``, pairs in row-major upper-triangle
        order (empty when ``B = 1``).

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import negative_similarities
        >>> negative_similarities(x, [0, 8, 1])  # pairs (0, 8), (0, 1), (8, 1)
        tensor([1., 0., 0.], dtype=torch.float64)
    """
    sims, _ = _pairwise(embeddings, batch)
    return _upper_pairs(sims)


def similarity_histogram(embeddings: ArrayLike, batch: BatchLike, bins: int = 50,
                         range: tuple[float, float] = (-1.0, 1.0)) -> tuple[Tensor, Tensor]:
    """Histogram of :func:`negative_similarities` (BatchSampler, Fig. 4 left).

    Args:
        embeddings: ``[N, d]``; batch: ``[B]`` ids.
        bins: number of equal-width bins.
        range: ``(low, high)``; values outside are not counted, the last bin includes ``high``.

    Returns:
        ``(counts, edges)``: int64 ``[bins]`` pair counts and float64 ``[bins + 1]`` bin edges.
        Histograms of several batches with the same ``bins``/``range`` add up.

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import similarity_histogram
        >>> counts, edges = similarity_histogram(x, [0, 8, 1, 2], bins=4)
        >>> counts.tolist(), edges.tolist()
        ([0, 0, 5, 1], [-1.0, -0.5, 0.0, 0.5, 1.0])
    """
    bins, lo, hi = _check_range(range, bins)
    return _histogram(negative_similarities(embeddings, batch), bins, lo, hi)


def batch_hardness(embeddings: ArrayLike, batch: BatchLike) -> float:
    """Mean over anchors of the top-1 negative cosine similarity.

    ``mean_p max_{q != p} cos(x_{b_p}, x_{b_q})`` over batch positions: how close each item's
    nearest in-batch negative is (1 = some negative coincides with the anchor). The right tail
    of BatchSampler's Fig. 4 histograms, summarised per anchor.

    Args:
        embeddings: ``[N, d]``; batch: ``[B]`` ids.

    Returns:
        a float in ``[-1, 1]``; NaN when ``B = 1`` (no negative).

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import batch_hardness
        >>> batch_hardness(x, [0, 1, 2, 3])  # no anchor has a similar negative
        0.0
        >>> batch_hardness(x, [0, 8, 1, 9])  # every anchor's copy is in the batch
        1.0
    """
    sims, _ = _pairwise(embeddings, batch)
    return _hardness_of(sims)


def batch_false_negative_rate(labels: ArrayLike, batch: BatchLike) -> float:
    """Share of ordered in-batch pairs ``(p, q)``, ``p != q``, whose items share a label.

    The "percentage of false negatives" of BatchSampler (KDD 2023), Fig. 4 right / Fig. 5:
    with in-batch negatives these pairs are negatives of the same class. For ``C`` balanced
    classes uniform batches give about ``1/C`` (``sum_c n_c (n_c - 1) / (N (N - 1))``
    in expectation).

    Args:
        labels: ``[N]`` class labels (ints, strings, ...), indexed by item id.
        batch: ``[B]`` ids.

    Returns:
        a float in ``[0, 1]``; NaN when ``B = 1``.

    Example:
        >>> import torch
        >>> from hardbatch.metrics import batch_false_negative_rate
        >>> labels = torch.arange(40) % 8
        >>> round(batch_false_negative_rate(labels, [0, 8, 1, 2]), 3)  # 2 of 12 ordered pairs
        0.167
    """
    lab = labels_array(labels)
    ids = as_batch(batch, lab.shape[0])
    return _fn_rate_of(lab[ids])


def batch_near_duplicate_rate(embeddings: ArrayLike, batch: BatchLike,
                              near_duplicate: float = NEAR_DUPLICATE) -> float:
    """Share of in-batch pairs ``(p, q)``, ``p < q``, whose cosine exceeds ``near_duplicate``.

    A false-negative rate that needs no labels: pairs this close in ``embeddings`` (best a fixed
    reference, such as a strong pretrained encoder's embeddings) are likely the same thing
    (copies, paraphrases) and are false negatives for an in-batch loss. The SimCSE recipe
    reports it under the starting model's embeddings.

    Args:
        embeddings: ``[N, d]`` (array, tensor or file); batch: ``[B]`` ids.
        near_duplicate: cosine threshold in ``[-1, 1]`` (default 0.9).

    Returns:
        a float in ``[0, 1]``; NaN when ``B = 1``.

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import batch_near_duplicate_rate
        >>> round(batch_near_duplicate_rate(x, [0, 8, 1, 2], near_duplicate=0.9), 3)  # 1 of 6
        0.167
    """
    threshold = _check_threshold(near_duplicate)
    pairs = negative_similarities(embeddings, batch)
    return float((pairs > threshold).double().mean()) if pairs.numel() else math.nan


def batch_duplicate_rate(batch: BatchLike) -> float:
    """Share of the batch's entries that repeat an earlier entry: ``1 - unique(B) / B``.

    Args:
        batch: ``[B]`` ids.

    Returns:
        a float in ``[0, 1)``; 0 for samplers that draw without replacement.

    Example:
        >>> from hardbatch.metrics import batch_duplicate_rate
        >>> batch_duplicate_rate([3, 5, 3, 3]), batch_duplicate_rate([3, 5, 7, 9])
        (0.5, 0.0)
    """
    return _duplicate_rate_of(as_batch(batch, None))


def _similarity_stats(table, ids: np.ndarray, name: str, threshold: float | None) -> dict:
    """hardness, mean negative similarity (and the near-duplicate rate) of one batch."""
    x = unit_rows(table, ids, name)
    sims = (x @ x.T).clamp_(-1.0, 1.0)
    pairs = _upper_pairs(sims)
    out = {"hardness": _hardness_of(sims),
           "mean_negative_similarity": float(pairs.mean()) if pairs.numel() else math.nan}
    if threshold is not None:
        out["near_duplicate_rate"] = (float((pairs > threshold).double().mean())
                                      if pairs.numel() else math.nan)
    return out


def _optional_inputs(labels, reference, near_duplicate, n: int):
    """(labels array or None, reference table or None, near-duplicate threshold or None)."""
    lab = None if labels is None else labels_array(labels, n)
    if reference is None:
        return lab, None, None
    return lab, reference_table(reference, n), _check_threshold(near_duplicate)


def batch_stats(embeddings: ArrayLike, batch: BatchLike, labels: ArrayLike | None = None, *,
                reference: ArrayLike | None = None,
                near_duplicate: float = NEAR_DUPLICATE) -> dict[str, float]:
    """All per-batch diagnostics at once (one similarity matrix per embedding).

    Args:
        embeddings: ``[N, d]`` (array, tensor or file); batch: ``[B]`` ids; labels: optional
            ``[N]``.
        reference: optional fixed ``[N, d]`` reference embedding (array, tensor or ``.npy`` /
            ``.npz`` / ``.pt`` file, see :func:`~hardbatch.metrics.load_reference`): the
            similarity figures are computed in it too, so batches of different samplers or
            runs compare in one coordinate system.
        near_duplicate: cosine threshold of ``reference_near_duplicate_rate``.

    Returns:
        ``{"batch_size", "hardness", "mean_negative_similarity", "duplicate_rate"}`` plus
        ``"false_negative_rate"`` when ``labels`` is given (labels do not depend on the
        embedding) and ``"reference_hardness"``, ``"reference_mean_negative_similarity"``,
        ``"reference_near_duplicate_rate"`` when ``reference`` is given (see the single-metric
        functions; NaN entries when ``B = 1``).

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import batch_stats
        >>> stats = batch_stats(x, [0, 8, 1, 2], labels=torch.arange(40) % 8)
        >>> {key: round(value, 3) for key, value in stats.items()}
        {'batch_size': 4, 'hardness': 0.5, 'mean_negative_similarity': 0.167,
         'duplicate_rate': 0.0, 'false_negative_rate': 0.167}
        >>> stats = batch_stats(x, [0, 8, 1, 2], reference=torch.eye(8)[torch.arange(40) % 4])
        >>> round(stats["reference_hardness"], 3)
        0.5
    """
    table, n, _ = embedding_table(embeddings)
    ids = as_batch(batch, n)
    lab, ref, threshold = _optional_inputs(labels, reference, near_duplicate, n)
    current = _similarity_stats(table, ids, "embeddings", None)
    out = {
        "batch_size": int(ids.size),
        "hardness": current["hardness"],
        "mean_negative_similarity": current["mean_negative_similarity"],
        "duplicate_rate": _duplicate_rate_of(ids),
    }
    if lab is not None:
        out["false_negative_rate"] = _fn_rate_of(lab[ids])
    if ref is not None:
        fixed = _similarity_stats(ref, ids, "reference", threshold)
        out.update({f"reference_{k}": v for k, v in fixed.items()})
    return out


# ---------------------------------------------------------------------------------------------
# per epoch / plan
# ---------------------------------------------------------------------------------------------
def draw_counts(batches: Iterable[BatchLike], num_items: int) -> Tensor:
    """How often each item was drawn in ``batches`` (repeats inside a batch count).

    Args:
        batches: iterable of ``[B_k]`` id batches (e.g. one epoch of a sampler).
        num_items: N.

    Returns:
        int64 tensor ``[N]``.

    Example:
        >>> from hardbatch.metrics import draw_counts
        >>> draw_counts([[0, 1], [1, 2]], num_items=4)
        tensor([1, 2, 1, 0])
    """
    n = check_num_items(num_items)
    plan = as_batches(batches, n)
    return torch.from_numpy(np.bincount(np.concatenate(plan), minlength=n).astype(np.int64))


def coverage(batches: Iterable[BatchLike], num_items: int) -> float:
    """Share of the ``num_items`` items drawn at least once in ``batches`` (1.0 for a full epoch
    of a sampler that partitions the data).

    Example:
        >>> from hardbatch.metrics import coverage
        >>> coverage([[0, 1], [1, 2]], num_items=4)
        0.75
    """
    counts = draw_counts(batches, num_items)
    return float((counts > 0).double().mean())


def plan_stats(embeddings: ArrayLike, batches: Iterable[BatchLike],
               labels: ArrayLike | None = None, bins: int = 50,
               range: tuple[float, float] = (-1.0, 1.0), *, reference: ArrayLike | None = None,
               near_duplicate: float = NEAR_DUPLICATE) -> dict:
    """:func:`batch_stats` pooled over a plan, plus coverage and a pooled histogram.

    Every anchor, pair and entry of every batch counts once: ``hardness`` is the mean over all
    anchors (with at least one negative) of all batches, ``false_negative_rate`` and
    ``mean_negative_similarity`` pool all in-batch pairs, ``duplicate_rate`` all entries. For
    equal-size batches these equal the means of the per-batch values; a short last batch (or a
    single-item one, which has no pairs) weighs in proportion to its size. Uniform batches
    then have exactly the chance false-negative rate ``sum_c n_c (n_c - 1) / (N (N - 1))`` in
    expectation.

    Args:
        embeddings: ``[N, d]`` (array, tensor or file); batches: iterable of id batches;
            labels: optional ``[N]``.
        bins, range: of the pooled :func:`similarity_histogram` (all pairs of all batches).
        reference: optional fixed ``[N, d]`` reference embedding (array, tensor or file): the
            similarity figures and the histogram are computed in it too (``reference_`` keys),
            so plans of different samplers or runs compare in one coordinate system.
        near_duplicate: cosine threshold of ``reference_near_duplicate_rate`` (pooled pairs).

    Returns:
        ``{"batches", "items_drawn", "coverage", "hardness", "mean_negative_similarity",
        "duplicate_rate", ["false_negative_rate"], "histogram": (counts, edges)}``;
        ``items_drawn`` counts entries (with repeats across batches), ``coverage`` is the share
        of the N items drawn at least once. With ``reference``: also ``"reference_hardness"``,
        ``"reference_mean_negative_similarity"``, ``"reference_near_duplicate_rate"`` and
        ``"reference_histogram"``.

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import plan_stats
        >>> stats = plan_stats(x, [[0, 8, 1, 2], [3, 4, 5, 6]], labels=torch.arange(40) % 8, bins=4)
        >>> stats["batches"], stats["items_drawn"], stats["coverage"], stats["hardness"]
        (2, 8, 0.2, 0.25)
        >>> stats["histogram"][0].tolist()  # 12 pairs: one copy pair, 11 orthogonal ones
        [0, 0, 11, 1]
    """
    table, n, _ = embedding_table(embeddings)
    plan = as_batches(batches, n)
    bins, lo, hi = _check_range(range, bins)
    lab, ref, threshold = _optional_inputs(labels, reference, near_duplicate, n)
    repeats = entries = same_pairs = 0
    for ids in plan:
        entries += ids.size
        repeats += ids.size - np.unique(ids).size
        if lab is not None and ids.size >= 2:
            _, c = np.unique(lab[ids], return_counts=True)
            same_pairs += int((c * (c - 1) // 2).sum())
    current = _pooled_similarities(table, plan, "embeddings", bins, lo, hi, None)
    drawn = np.bincount(np.concatenate(plan), minlength=n)
    out = {
        "batches": len(plan),
        "items_drawn": entries,
        "coverage": float((drawn > 0).mean()),
        "hardness": current["hardness"],
        "mean_negative_similarity": current["mean_negative_similarity"],
        "duplicate_rate": repeats / entries,
    }
    if lab is not None:
        pairs = current["pairs"]
        out["false_negative_rate"] = same_pairs / pairs if pairs else math.nan
    out["histogram"] = current["histogram"]
    if ref is not None:
        fixed = _pooled_similarities(ref, plan, "reference", bins, lo, hi, threshold)
        for key in ("hardness", "mean_negative_similarity", "near_duplicate_rate", "histogram"):
            out[f"reference_{key}"] = fixed[key]
    return out


def _pooled_similarities(table, plan: list[np.ndarray], name: str, bins: int, lo: float,
                         hi: float, threshold: float | None) -> dict:
    """Anchor-pooled hardness, pair-pooled mean similarity (and near-duplicate rate) and the
    pooled histogram of ``plan`` under one embedding ``table``."""
    counts = torch.zeros(bins, dtype=torch.int64)
    top_sum = sim_sum = 0.0
    anchors = pair_count = near = 0
    for ids in plan:
        b = ids.size
        if b < 2:
            continue
        x = unit_rows(table, ids, name)
        sims = (x @ x.T).clamp_(-1.0, 1.0)
        pairs = _upper_pairs(sims)
        top_sum += _hardness_of(sims) * b
        anchors += b
        counts += _histogram(pairs, bins, lo, hi)[0]
        sim_sum += float(pairs.sum())
        pair_count += pairs.numel()
        if threshold is not None:
            near += int((pairs > threshold).sum())
    out = {"hardness": top_sum / anchors if anchors else math.nan,
           "mean_negative_similarity": sim_sum / pair_count if pair_count else math.nan,
           "pairs": pair_count,
           "histogram": (counts, torch.linspace(lo, hi, bins + 1, dtype=torch.float64))}
    if threshold is not None:
        out["near_duplicate_rate"] = near / pair_count if pair_count else math.nan
    return out
