"""Batch diagnostics: how hard, how false-negative-prone and how complete a batch plan is.

Pure functions (tensors / arrays in, numbers / tensors out) to compare samplers without
training, or to monitor them during training:

* per batch, from item embeddings ``[N, d]`` (cosine similarity: rows are L2-normalised
  inside; an all-zero row has similarity 0 to everything) and a batch of item ids ``[B]``:
  :func:`negative_similarities` (the values histogrammed in BatchSampler, KDD 2023, Fig. 4
  left and Fig. 5), :func:`similarity_histogram`, :func:`batch_hardness`,
  :func:`batch_false_negative_rate` (Fig. 4 right), :func:`batch_duplicate_rate` and
  :func:`batch_stats` (all of them at once);
* per epoch / plan: :func:`draw_counts`, :func:`coverage` and :func:`plan_stats`
  (per-batch numbers averaged over a list of batches, with a pooled histogram);
* for a whole batch plan: :func:`loss_gap`, the gap between the global NT-Xent loss and the
  loss actually seen with in-batch negatives (GCBS paper, Definitions 3.1 / 3.2 and the
  quantity of section 7.2, Fig. 3, that GCBS minimises).

Pairs are taken over batch *positions*: a batch that repeats an id holds a pair of an item with
itself (cosine 1, same label). That is exactly what an in-batch contrastive loss sees, so a
repeated id counts as the anchor's hardest negative and as a false negative;
:func:`batch_duplicate_rate` reports how often it happens (never for the uniform and GCBS
samplers, which partition the items, nor for the walk samplers, which return distinct items).

Batches are any 1-D sequence of integer ids (list, NumPy array, tensor); a plan (``batches``)
is any iterable of batches (a list, a 2-D array, or a sampler, which is iterated once).
Bad input raises ``ValueError`` naming the parameter and the fix.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from ._validation import as_embeddings, check_matrix_shape

__all__ = [
    "batch_duplicate_rate",
    "batch_false_negative_rate",
    "batch_hardness",
    "batch_stats",
    "coverage",
    "draw_counts",
    "loss_gap",
    "negative_similarities",
    "plan_stats",
    "similarity_histogram",
]

BatchLike = Sequence[int] | np.ndarray | Tensor
ArrayLike = Tensor | np.ndarray | Sequence

_TILE_ELEMENTS = 1 << 21  # similarity tile size of loss_gap (8 MiB of float32): cache friendly
_DIRECT_TEMPERATURE = 0.02  # t >= this: |s/t| <= 50, exp() neither overflows nor underflows
_MIN_COLS = 256  # narrowest column chunk of a tile


# ---------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------
def _check_num_items(num_items, name: str = "num_items") -> int:
    if isinstance(num_items, bool) or not isinstance(num_items, numbers.Integral):
        raise ValueError(  # noqa: TRY004 - the package's contract: ValueError naming the fix
            f"{name} must be an integer (the number of items N), got {num_items!r}")
    if int(num_items) < 1:
        raise ValueError(f"{name}={num_items} must be >= 1 (the number of items N)")
    return int(num_items)


def _as_batch(batch, num_items: int | None, name: str = "batch") -> np.ndarray:
    """A batch as an int64 [B] array of ids in ``[0, num_items)``."""
    if isinstance(batch, Tensor):
        batch = batch.detach().cpu().numpy()
    try:
        arr = np.asarray(batch)
    except Exception as exc:  # ragged or exotic input
        raise ValueError(f"{name} must be a 1-D sequence of integer item ids") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of integer item ids, got shape "
                         f"{tuple(arr.shape)}; pass one batch (for a list of batches use "
                         "draw_counts / coverage / plan_stats / loss_gap)")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; pass at least one item id")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer item ids, got dtype {arr.dtype}; "
                         "convert it with .astype(int) / .long()")
    arr = arr.astype(np.int64, copy=False)
    if num_items is not None:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= num_items:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds item id {bad}, outside [0, {num_items}); ids index "
                             f"the rows of embeddings / labels (N={num_items})")
    return arr


def _as_batches(batches, num_items: int | None, name: str = "batches") -> list[np.ndarray]:
    """A plan as a list of int64 batches; a sampler or generator is consumed once."""
    if isinstance(batches, (Tensor, np.ndarray)):
        if batches.ndim == 1:
            raise ValueError(f"{name} must be a sequence of batches, got a 1-D array; wrap a "
                             f"single batch as [{name}]")
        seq = list(batches)
    elif isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
        raise ValueError(f"{name} must be an iterable of batches (lists/arrays of item ids), "  # noqa: TRY004
                         f"got {type(batches).__name__}")
    else:
        seq = list(batches)
    if not seq:
        raise ValueError(f"{name} is empty; pass at least one batch")
    if isinstance(seq[0], numbers.Integral) and not isinstance(seq[0], bool):
        raise ValueError(f"{name} must be a sequence of batches, got a flat list of ids; "  # noqa: TRY004
                         f"wrap a single batch as [{name}]")
    return [_as_batch(b, num_items, f"{name}[{k}]") for k, b in enumerate(seq)]


def _embedding_table(embeddings, name: str = "embeddings"):
    """(table, N, d) with shape and dtype checked; no copy of the whole table."""
    if isinstance(embeddings, Tensor):
        table = embeddings.detach()
        is_float = table.is_floating_point() or not (
            table.is_complex() or table.dtype == torch.bool)
    else:
        try:
            table = np.asarray(embeddings)
        except Exception as exc:
            raise ValueError(f"{name} must be a tensor or array of shape [N, d]") from exc
        is_float = np.issubdtype(table.dtype, np.floating) or (
            np.issubdtype(table.dtype, np.integer) and table.dtype != bool)
    check_matrix_shape(tuple(table.shape), name)
    if not is_float:
        raise ValueError(f"{name} must hold real numbers, got dtype {table.dtype}")
    return table, int(table.shape[0]), int(table.shape[1])


def _unit_rows(table, ids: np.ndarray, name: str = "embeddings") -> Tensor:
    """Rows ``ids`` of ``table`` as L2-normalised float64 [B, d]; NaN/inf rejected."""
    if isinstance(table, Tensor):
        rows = table[torch.from_numpy(ids).to(table.device)].to("cpu", torch.float64)
    else:
        rows = torch.from_numpy(np.asarray(table[ids], dtype=np.float64))
    finite = torch.isfinite(rows).all(dim=1)
    if not bool(finite.all()):
        bad = int(ids[int(torch.nonzero(~finite)[0, 0])])
        raise ValueError(f"{name} row {bad} contains NaN or inf; check the encoder output (a "
                         "diverged loss, fp16 overflow) before computing diagnostics")
    return torch.nn.functional.normalize(rows, dim=1, eps=1e-12)


def _labels_array(labels, num_items: int | None = None, name: str = "labels") -> np.ndarray:
    """Labels as a 1-D array; with ``num_items``, one label per embedding row is required."""
    if isinstance(labels, Tensor):
        labels = labels.detach().cpu().numpy()
    try:
        arr = np.asarray(labels)
    except Exception as exc:
        raise ValueError(f"{name} must be a 1-D sequence with one label per item") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D [N] (one label per item), got shape "
                         f"{tuple(arr.shape)}; for one-hot labels pass labels.argmax(1)")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; pass one label per item")
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf at position "
                         f"{int(np.flatnonzero(~np.isfinite(arr))[0])}; every item needs a label")
    if num_items is not None and arr.shape[0] != num_items:
        raise ValueError(f"labels has {arr.shape[0]} entries but embeddings has {num_items} rows; "
                         "pass one label per item")
    return arr


def _pairwise(embeddings, batch) -> tuple[Tensor, np.ndarray]:
    table, n, _ = _embedding_table(embeddings)
    ids = _as_batch(batch, n)
    x = _unit_rows(table, ids)
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
    """
    lab = _labels_array(labels)
    ids = _as_batch(batch, lab.shape[0])
    return _fn_rate_of(lab[ids])


def batch_duplicate_rate(batch: BatchLike) -> float:
    """Share of the batch's entries that repeat an earlier entry: ``1 - unique(B) / B``.

    Args:
        batch: ``[B]`` ids.

    Returns:
        a float in ``[0, 1)``; 0 for samplers that draw without replacement.
    """
    return _duplicate_rate_of(_as_batch(batch, None))


def batch_stats(embeddings: ArrayLike, batch: BatchLike,
                labels: ArrayLike | None = None) -> dict[str, float]:
    """All per-batch diagnostics at once (one similarity matrix).

    Args:
        embeddings: ``[N, d]``; batch: ``[B]`` ids; labels: optional ``[N]``.

    Returns:
        ``{"batch_size", "hardness", "mean_negative_similarity", "duplicate_rate"}`` plus
        ``"false_negative_rate"`` when ``labels`` is given (see the single-metric functions;
        NaN entries when ``B = 1``).
    """
    table, n, _ = _embedding_table(embeddings)
    ids = _as_batch(batch, n)
    lab = None
    if labels is not None:
        lab = _labels_array(labels, n)
    x = _unit_rows(table, ids)
    sims = (x @ x.T).clamp_(-1.0, 1.0)
    pairs = _upper_pairs(sims)
    out = {
        "batch_size": int(ids.size),
        "hardness": _hardness_of(sims),
        "mean_negative_similarity": float(pairs.mean()) if pairs.numel() else math.nan,
        "duplicate_rate": _duplicate_rate_of(ids),
    }
    if lab is not None:
        out["false_negative_rate"] = _fn_rate_of(lab[ids])
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
    """
    n = _check_num_items(num_items)
    plan = _as_batches(batches, n)
    return torch.from_numpy(np.bincount(np.concatenate(plan), minlength=n).astype(np.int64))


def coverage(batches: Iterable[BatchLike], num_items: int) -> float:
    """Share of the ``num_items`` items drawn at least once in ``batches`` (1.0 for a full epoch
    of a sampler that partitions the data)."""
    counts = draw_counts(batches, num_items)
    return float((counts > 0).double().mean())


def plan_stats(embeddings: ArrayLike, batches: Iterable[BatchLike],
               labels: ArrayLike | None = None, bins: int = 50,
               range: tuple[float, float] = (-1.0, 1.0)) -> dict:
    """:func:`batch_stats` pooled over a plan, plus coverage and a pooled histogram.

    Every anchor, pair and entry of every batch counts once: ``hardness`` is the mean over all
    anchors (with at least one negative) of all batches, ``false_negative_rate`` and
    ``mean_negative_similarity`` pool all in-batch pairs, ``duplicate_rate`` all entries. For
    equal-size batches these equal the means of the per-batch values; a short last batch (or a
    single-item one, which has no pairs) weighs in proportion to its size. Uniform batches
    then have exactly the chance false-negative rate ``sum_c n_c (n_c - 1) / (N (N - 1))`` in
    expectation.

    Args:
        embeddings: ``[N, d]``; batches: iterable of id batches; labels: optional ``[N]``.
        bins, range: of the pooled :func:`similarity_histogram` (all pairs of all batches).

    Returns:
        ``{"batches", "items_drawn", "coverage", "hardness", "mean_negative_similarity",
        "duplicate_rate", ["false_negative_rate"], "histogram": (counts, edges)}``;
        ``items_drawn`` counts entries (with repeats across batches), ``coverage`` is the share
        of the N items drawn at least once.
    """
    table, n, _ = _embedding_table(embeddings)
    plan = _as_batches(batches, n)
    bins, lo, hi = _check_range(range, bins)
    lab = None
    if labels is not None:
        lab = _labels_array(labels, n)
    counts = torch.zeros(bins, dtype=torch.int64)
    top_sum = sim_sum = 0.0
    anchors = pair_count = same_pairs = repeats = entries = 0
    for ids in plan:
        b = ids.size
        entries += b
        repeats += b - np.unique(ids).size
        if b < 2:
            continue
        x = _unit_rows(table, ids)
        sims = (x @ x.T).clamp_(-1.0, 1.0)
        pairs = _upper_pairs(sims)
        top_sum += _hardness_of(sims) * b
        anchors += b
        counts += _histogram(pairs, bins, lo, hi)[0]
        sim_sum += float(pairs.sum())
        pair_count += pairs.numel()
        if lab is not None:
            _, c = np.unique(lab[ids], return_counts=True)
            same_pairs += int((c * (c - 1) // 2).sum())
    drawn = np.bincount(np.concatenate(plan), minlength=n)
    out = {
        "batches": len(plan),
        "items_drawn": entries,
        "coverage": float((drawn > 0).mean()),
        "hardness": top_sum / anchors if anchors else math.nan,
        "mean_negative_similarity": sim_sum / pair_count if pair_count else math.nan,
        "duplicate_rate": repeats / entries,
    }
    if lab is not None:
        out["false_negative_rate"] = same_pairs / pair_count if pair_count else math.nan
    out["histogram"] = (counts, torch.linspace(lo, hi, bins + 1, dtype=torch.float64))
    return out


# ---------------------------------------------------------------------------------------------
# global vs training loss
# ---------------------------------------------------------------------------------------------
def _row_logsumexp(xs: Tensor, y: Tensor, direct: bool, block_size: int) -> Tensor:
    """``logsumexp_j (xs_i . y_j)`` for every row i, in [block_size, cols] tiles (float64 out).

    ``direct``: every logit is known to lie in [-50, 50], so ``log sum_j exp(logit_ij)`` is
    computed as is (float32 exp cannot overflow or underflow; sums in float64): one exp pass per
    tile, no max pass. Otherwise a streaming log-sum-exp with per-tile maxima.
    """
    n, m = xs.shape[0], y.shape[0]
    cols = max(_MIN_COLS, _TILE_ELEMENTS // block_size)
    out = torch.empty(n, dtype=torch.float64)
    buf = torch.empty(min(block_size, n), min(cols, m), dtype=xs.dtype)
    for r0 in range(0, n, block_size):
        xb = xs[r0:r0 + block_size]
        rows = xb.shape[0]
        if direct:
            acc = torch.zeros(rows, dtype=torch.float64)
        else:
            acc = torch.full((rows,), -math.inf, dtype=torch.float64)
        for c0 in range(0, m, cols):
            yc = y[c0:c0 + cols]
            tile = buf[:rows, :yc.shape[0]]
            torch.mm(xb, yc.T, out=tile)
            if direct:
                acc += tile.exp_().sum(dim=1)
            else:
                acc = torch.logaddexp(acc, torch.logsumexp(tile, dim=1).double())
        out[r0:r0 + rows] = acc.log_() if direct else acc
    return out


def _symmetric_row_logsumexp(xs: Tensor, x: Tensor, block_size: int) -> Tensor:
    """As ``_row_logsumexp(xs, x, direct=True)`` when ``xs = x / t``: the logit matrix is
    symmetric, so only tiles on and above the diagonal are computed; each off-diagonal tile
    adds its row sums to its rows and its column sums to its columns (half the work)."""
    n = xs.shape[0]
    cols = max(block_size, (_TILE_ELEMENTS // block_size) // block_size * block_size)
    acc = torch.zeros(n, dtype=torch.float64)
    buf = torch.empty(min(block_size, n), min(cols, n), dtype=xs.dtype)
    for r0 in range(0, n, block_size):
        r1 = min(n, r0 + block_size)
        xb = xs[r0:r1]
        rows = r1 - r0
        diag = buf[:rows, :rows]
        torch.mm(xb, x[r0:r1].T, out=diag)
        acc[r0:r1] += diag.exp_().sum(dim=1)
        for c0 in range(r1, n, cols):
            c1 = min(n, c0 + cols)
            tile = buf[:rows, :c1 - c0]
            torch.mm(xb, x[c0:c1].T, out=tile)
            tile.exp_()
            acc[r0:r1] += tile.sum(dim=1)
            acc[c0:c1] += tile.sum(dim=0)
    return acc.log_()


def loss_gap(embeddings: ArrayLike, batches: Iterable[BatchLike], temperature: float = 0.5,
             positives: ArrayLike | None = None, block_size: int = 512) -> dict[str, float]:
    """Global vs training NT-Xent loss of a batch plan, and their gap (GCBS paper, sec. 3, 7.2).

    Item ``i`` has anchor view ``x_i = embeddings[i]`` and positive view ``y_i = positives[i]``;
    both are L2-normalised (cosine similarity, NT-Xent) and ``s_ij = x_i . y_j / temperature``.

    * global loss (Definition 3.1): every other item is a negative,
      ``L_i^G = logsumexp_{j in [N]} s_ij - s_ii``, averaged over all N items;
    * training loss (Definition 3.2): only the items of i's batch ``b`` are negatives,
      ``L_i^b = logsumexp_{j in b} s_ij - s_ii``. An item drawn in several batches has the mean of
      its occurrences (repeats inside a batch included); items never drawn are excluded from
      the training loss and from the gap. Repeated ids inside a batch are used once as columns
      (the batch is a set of negatives, as in the paper where batches partition the data), so
      ``L_i^b <= L_i^G`` for every occurrence.

    The gap ``mean_i (L_i^G - L_i^b)`` over the drawn items is ``>= 0``; it is what GCBS reduces
    (gcbs paper, section 7.2, Fig. 3: GCBS vs random sampling). When every item is drawn (a full
    epoch of uniform or GCBS batches) ``gap = global_loss - batch_loss`` exactly.

    With ``positives=None`` the positive view is ``embeddings`` itself (``y = x``: ``s_ii =
    1/temperature``, every item is its own positive); this measures how well the batches
    approximate the global denominator for the current embeddings, which is what matters for
    comparing batch plans. Pass a second view (e.g. another augmentation or dropout pass,
    or the paired Y of query/document data) for the actual training objective.

    The global term is computed in ``[block_size, ~2M / block_size]`` tiles, never forming
    ``N x N``: O(N^2 d) time, O(N + tile) memory. Per tile, a streaming log-sum-exp (for
    ``temperature >= 0.02`` the logits are bounded by ``1 / temperature <= 50``, so the exp is
    taken directly without a max pass; below that a per-tile max is used). With
    ``positives=None`` the similarity matrix is symmetric and only half of the tiles are
    computed. N = 100k, d = 128 (``positives=None``) took 59 s of CPU time with 2 threads,
    i.e. about 30 s of wall time on 2 idle cores (measured on a heavily loaded machine, so an
    upper bound); ``positives`` doubles it. float32 products with float64 accumulation across
    tiles (agreement with a dense float64 reference about 1e-5).

    Args:
        embeddings: ``[N, d]`` anchor views.
        batches: iterable of id batches (e.g. one epoch of a sampler), ids in ``[0, N)``.
        temperature: NT-Xent temperature ``> 0``.
        positives: ``[N, d]`` positive views, or None for ``embeddings``.
        block_size: rows per tile of the global term.

    Returns:
        ``{"global_loss", "batch_loss", "gap", "items_drawn", "coverage"}``: the global loss over
        all N items, the training loss over the ``items_drawn`` distinct drawn items, the mean
        gap over those items, and ``items_drawn / N``.
    """
    xs, y, pos = _prepare_views(embeddings, positives, temperature)
    symmetric = positives is None
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) \
            or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive integer (e.g. 512)")
    plan = _as_batches(batches, xs.shape[0])
    global_i = _global_losses(xs, y, pos, float(temperature), int(block_size), symmetric)
    return _plan_losses(xs, y, pos, plan, global_i)


def _prepare_views(embeddings, positives, temperature) -> tuple[Tensor, Tensor, Tensor]:
    """Validated ``(x / t, y, s_ii)``: unit rows float32 [N, d] and positive logits float64 [N]."""
    x = torch.from_numpy(as_embeddings(embeddings, "embeddings", normalize=True))
    if positives is None:
        y = x
    else:
        y = torch.from_numpy(as_embeddings(positives, "positives", normalize=True))
        if tuple(y.shape) != tuple(x.shape):
            raise ValueError(f"positives has shape {tuple(y.shape)} but embeddings has shape "
                             f"{tuple(x.shape)}; pass one positive view per item with the same "
                             "dimension (or positives=None)")
    try:
        t = float(temperature)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"temperature={temperature!r} must be a positive number (e.g. 0.5)"
                         ) from exc
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature={temperature!r} must be a positive number (e.g. 0.5)")
    pos = (x.double() * y.double()).sum(dim=1) / t  # s_ii
    return x / t, y, pos


def _global_losses(xs: Tensor, y: Tensor, pos: Tensor, t: float, block_size: int = 512,
                   symmetric: bool = False) -> Tensor:
    """Per-item global NT-Xent losses ``logsumexp_j s_ij - s_ii``, float64 [N].

    ``symmetric``: ``y`` is the anchor view itself (``xs = y / t``), so ``S`` is symmetric.
    """
    # Unit rows: |logit| <= 1/t, so for t >= 0.02 exp() of every logit is a normal float32.
    direct = t >= _DIRECT_TEMPERATURE
    if direct and symmetric:
        return _symmetric_row_logsumexp(xs, y, block_size) - pos
    return _row_logsumexp(xs, y, direct, block_size) - pos


def _plan_losses(xs: Tensor, y: Tensor, pos: Tensor, plan: list[np.ndarray],
                 global_i: Tensor) -> dict[str, float]:
    """Training losses of ``plan`` and the summary dict of :func:`loss_gap`."""
    n = xs.shape[0]
    loss_sum = torch.zeros(n, dtype=torch.float64)
    occurrences = torch.zeros(n, dtype=torch.float64)
    for ids in plan:
        uniq, mult = np.unique(ids, return_counts=True)
        u = torch.from_numpy(uniq)
        logits = (xs[u] @ y[u].T).double()
        lb = torch.logsumexp(logits, dim=1) - pos[u]
        m = torch.from_numpy(mult.astype(np.float64))
        loss_sum.index_add_(0, u, lb * m)
        occurrences.index_add_(0, u, m)
    drawn = occurrences > 0
    batch_i = loss_sum[drawn] / occurrences[drawn]
    gap_i = (global_i[drawn] - batch_i).clamp_(min=0.0)  # >= 0 exactly; clamp rounding
    return {
        "global_loss": float(global_i.mean()),
        "batch_loss": float(batch_i.mean()),
        "gap": float(gap_i.mean()),
        "items_drawn": int(drawn.sum()),
        "coverage": float(drawn.double().mean()),
    }
