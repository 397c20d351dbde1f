"""Global vs training NT-Xent loss of a batch plan, and their gap (GCBS paper, sec. 3, 7.2).

:func:`loss_gap` scores one plan; :class:`LossGap` computes the O(N^2 d) global term once and
scores any number of plans against it (``hardbatch inspect --loss-gap`` compares samplers so).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor

from .._validation import as_embeddings
from ._input_checks import ArrayLike, BatchLike, as_batches, reference_table

__all__ = ["LossGap", "loss_gap"]

_TILE_ELEMENTS = 1 << 21  # similarity tile size of the global term (8 MiB of float32)
_DIRECT_TEMPERATURE = 0.02  # t >= this: |s/t| <= 50, exp() neither overflows nor underflows
_MIN_COLS = 256  # narrowest column chunk of a tile


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
             positives: ArrayLike | None = None, block_size: int = 512, *,
             reference: ArrayLike | None = None) -> dict[str, float]:
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
        reference: optional fixed ``[N, d]`` reference embedding (array, tensor or file, see
            :func:`~hardbatch.metrics.load_reference`): the three losses are computed in it too
            (each item its own positive), so the plans of different samplers or runs compare
            in one coordinate system (doubles the cost).

    Returns:
        ``{"global_loss", "batch_loss", "gap", "items_drawn", "coverage"}``: the global loss over
        all N items, the training loss over the ``items_drawn`` distinct drawn items, the mean
        gap over those items, and ``items_drawn / N``; with ``reference`` also
        ``"reference_global_loss"``, ``"reference_batch_loss"`` and ``"reference_gap"``.

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import loss_gap
        >>> plan = torch.arange(40).reshape(5, 8).T  # batch k: items k, k + 8, ...: all copies
        >>> {key: round(value, 3) for key, value in loss_gap(x, plan, temperature=0.5).items()}
        {'global_loss': 2.276, 'batch_loss': 1.609, 'gap': 0.666, 'items_drawn': 40,
         'coverage': 1.0}
    """
    return LossGap(embeddings, temperature, positives, block_size, reference=reference)(batches)


class LossGap:
    """:func:`loss_gap` with the global term computed once, for several plans of one table.

    ``LossGap(embeddings, temperature, positives, block_size, reference=None)`` checks the
    views (same arguments and rules as :func:`loss_gap`); ``gap(batches)`` returns
    :func:`loss_gap`'s dict for that plan. The per-item global losses ``L_i^G`` (float64
    ``[N]``, :attr:`global_losses`) are computed on first use.

    Example:
        >>> import torch
        >>> x = torch.eye(8)[torch.arange(40) % 8]  # 40 items, d = 8: item i is a copy of i + 8
        >>> from hardbatch.metrics import LossGap
        >>> gap = LossGap(x, temperature=0.5)
        >>> gap.global_losses.shape
        torch.Size([40])
        >>> round(gap(torch.arange(40).reshape(5, 8))["gap"], 3)  # no copies in a batch
        1.609
        >>> round(gap(torch.arange(40).reshape(5, 8).T)["gap"], 3)  # copies together: harder
        0.666
    """

    def __init__(self, embeddings: ArrayLike, temperature: float = 0.5,
                 positives: ArrayLike | None = None, block_size: int = 512, *,
                 reference: ArrayLike | None = None) -> None:
        self._xs, self._y, self._pos = _prepare_views(embeddings, positives, temperature)
        self.reference = None
        if reference is not None:
            table = reference_table(reference, self._xs.shape[0])
            self.reference = LossGap(table, temperature, None, block_size)
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) \
                or block_size < 1:
            raise ValueError(f"block_size={block_size!r} must be a positive integer (e.g. 512)")
        self._temperature = float(temperature)
        self._block_size = int(block_size)
        self._symmetric = positives is None
        self._global: Tensor | None = None

    @property
    def global_losses(self) -> Tensor:
        """``L_i^G = logsumexp_j s_ij - s_ii`` for every item, float64 ``[N]``."""
        if self._global is None:
            self._global = _global_losses(self._xs, self._y, self._pos, self._temperature,
                                          self._block_size, self._symmetric)
        return self._global

    def __call__(self, batches: Iterable[BatchLike]) -> dict[str, float]:
        plan = as_batches(batches, self._xs.shape[0])
        out = _plan_losses(self._xs, self._y, self._pos, plan, self.global_losses)
        if self.reference is not None:
            fixed = self.reference(plan)
            out.update({f"reference_{k}": fixed[k] for k in ("global_loss", "batch_loss", "gap")})
        return out


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
