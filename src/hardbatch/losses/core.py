"""Internal core of the losses: the logits of a batch and the negative term in log space.

Not public API (the losses are :mod:`hardbatch.losses`); :mod:`.functional` and :mod:`.synthetic`
build on these names. :func:`build_logits` turns the two ``[B, d]`` views (and optional labels,
false-negative mask and extra negatives, prepared and with ``gather`` all-gathered by
:mod:`.inputs`) into ``[R, C]`` logits, ``-inf`` where a column is not a negative of the row;
:func:`log_negative_sum` is ``log S``, the plain or HCL-reweighted sum of the negatives
(:class:`WeightedLogSumExp`); :func:`debias` is DCL's ``log Ng`` (BatchSampler eq. 18) with its
floor; :func:`finish` the per-row loss ``softplus(log Ng - log pos)`` and the reduction (scaled
for DDP when gathered).
:func:`autocast_enabled` tells a loss to run with ``torch.autocast`` disabled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .inputs import prepare_batch

_LOG_HALF = -math.log(2.0)


@dataclass
class Logits:
    """Similarity logits of one batch, shared by every loss.

    ``logits[r, c] = <query_r, key_c> / t`` for the R anchor rows and C candidate columns, with
    ``-inf`` wherever column ``c`` is not a negative of row ``r`` (itself, its positive, same
    label).
    """

    logits: Tensor  # [R, C]
    log_pos: Tensor  # [R], s_i+ / t
    num_neg: Tensor | int  # [R] (labels given) or one int for every row
    has_neg: Tensor | None  # [R] bool, None when every row has a negative
    keys: Tensor  # [C, d]
    queries: Tensor  # [R, d], already divided by t (logits = queries @ keys.T)
    temperature: float
    world: int = 1  # ranks the candidates were gathered from (1: no gather)
    global_rows: int = 0  # rows of the global batch (with gather)
    row_ids: Tensor | None = None  # [R] global row index of each row (with gather)


class Exclude(torch.autograd.Function):
    """``logits[r, c] = -inf`` at ``index = (rows, cols)`` (in place) or where ``mask`` is True.

    The backward is the identity: every consumer of the logits (logsumexp, the HCL weights, the
    gather of valid negatives) gives an excluded entry an exactly zero gradient (``exp(-inf) = 0``),
    so the true Jacobian, which zeroes those entries, would change nothing but cost an [R, C] pass.
    """

    @staticmethod
    def forward(
        ctx, logits: Tensor, index: tuple[Tensor, Tensor] | None, mask: Tensor | None
    ) -> Tensor:
        if mask is not None:
            return torch.where(mask, logits.new_tensor(-math.inf), logits)
        ctx.mark_dirty(logits)
        return logits.index_put_(index, logits.new_tensor(-math.inf))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad, None, None


class WeightedLogSumExp(torch.autograd.Function):
    """Row-wise ``LSE(l)`` (``beta = 0``) or ``LSE((1 + beta) l) - LSE(beta l')`` (HCL, eq. 18).

    Over the concatenation of ``[R, *]`` blocks, without concatenating. ``l' = l`` (gradient
    through the weights) or ``l' = l.detach()`` (``detach_weights``). With the row max ``M``,
    ``e = exp(l - M)`` and ``e_b = e^beta``, the value is ``M + log sum(e e_b) - log sum(e_b)`` and
    the gradient ``e_b (c_1 e - c_b)`` with ``c_1 = (1 + beta) g / sum(e e_b)``,
    ``c_b = beta g / sum(e_b)`` (``c_1 = g / sum(e e_b)``, ``c_b = 0`` with detached weights). The
    exponentials are computed once and reused by the backward, in place where possible: on CPU
    the [R, C] passes and allocations are the cost of these losses.
    """

    @staticmethod
    def forward(ctx, beta: float, detach: bool, *blocks: Tensor) -> Tensor:
        row_max = blocks[0].amax(dim=1)
        for blk in blocks[1:]:
            row_max = torch.maximum(row_max, blk.amax(dim=1))
        saved = []
        sum1 = sumb = 0
        for blk in blocks:
            shifted = blk - row_max[:, None]
            if beta == 0:
                e = eb = shifted.exp_()
                sum1 = sum1 + e.sum(dim=1)
            elif beta == 1:
                e = eb = shifted.exp_()
                sum1 = sum1 + torch.linalg.vector_norm(e, dim=1).square()
            else:
                eb = torch.mul(shifted, beta).exp_()
                e = shifted.exp_()
                sum1 = sum1 + torch.linalg.vecdot(e, eb, dim=1)
            if beta != 0:
                sumb = sumb + eb.sum(dim=1)
            saved += [e, eb]
        ctx.beta, ctx.detach = beta, detach
        ctx.save_for_backward(sum1, sumb if beta != 0 else sum1, *saved)
        out = row_max + torch.log(sum1)
        return out if beta == 0 else out - torch.log(sumb)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple:
        sum1, sumb, *saved = ctx.saved_tensors
        beta = ctx.beta
        grads = []
        for e, eb in zip(saved[::2], saved[1::2]):
            if beta == 0:
                grads.append(e * (grad / sum1)[:, None])
            elif ctx.detach:
                grads.append((e * (grad / sum1)[:, None]).mul_(eb))
            else:
                c1 = (grad * (1.0 + beta) / sum1)[:, None]
                cb = (grad * -beta / sumb)[:, None]
                grads.append(torch.addcmul(cb, e, c1).mul_(eb))
        return (None, None, *grads)


def autocast_enabled(anchor) -> bool:
    """Whether ``torch.autocast`` is on for the device of the tensor ``anchor``: a loss then runs
    with it disabled, so that half precision is computed in float32 and a float32 input gives
    the same loss inside and outside autocast (the logit matmuls would run in bf16 / fp16)."""
    if not isinstance(anchor, Tensor):
        return False
    device_type = anchor.device.type
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device_type == "cuda" and torch.is_autocast_enabled()
    except RuntimeError:  # a device type autocast does not know (e.g. "meta")
        return False


def build_logits(options, anchor: Tensor, positive: Tensor, labels: Tensor | None,
                 negatives: Tensor | None, false_negatives: Tensor | None) -> Logits:
    """Check the inputs and build the :class:`Logits` of one batch (``options``: checked).

    Rows: this rank's ``R = 2b`` views (``form="simclr"``) or ``b`` anchors (``"simcse"``);
    columns: the batch keys (``2B`` views or ``B`` positives; ``B = b`` unless ``gather``, see
    :mod:`.inputs`) then the ``m`` rows of ``negatives``. An item excluded for anchor ``i``
    (same label, ``false_negatives``) loses both its views in both of ``i``'s rows.
    Half-precision inputs are computed in float32.
    """
    temperature, form = options.temperature, options.form
    batch = prepare_batch(options, anchor, positive, labels, negatives, false_negatives)
    za, zp, bank = batch.anchor, batch.positive, batch.bank
    b, total, off = za.shape[0], batch.total, batch.offset
    m = 0 if bank is None else bank.shape[0]
    gathered = batch.world > 1

    log_pos = (za * zp).sum(dim=1) / temperature
    if form == "simclr":
        batch_keys = queries = torch.cat([za, zp])
        if gathered:
            batch_keys = torch.cat([batch.all_anchor, batch.all_positive])
        log_pos = torch.cat([log_pos, log_pos])
    else:
        batch_keys, queries = batch.all_positive, za
    keys = batch_keys if bank is None else torch.cat([batch_keys, bank])
    # Scaling the [R, d] queries is cheaper than scaling the [R, C] logits.
    queries = queries / temperature
    logits = queries @ keys.T
    rows, cb = queries.shape[0], batch_keys.shape[0]
    row_ids = None
    if gathered:  # the rows of this rank in the global batch's row order
        own = torch.arange(off, off + b, device=logits.device)
        row_ids = torch.cat([own, own + total]) if form == "simclr" else own
    extra = (batch.world, (2 if form == "simclr" else 1) * total, row_ids)

    if batch.excluded is None:
        num_neg = cb - (2 if form == "simclr" else 1) + m
        idx = torch.arange(rows, device=logits.device)
        if form == "simclr":
            ar = idx[:b] + off
            self_col = torch.cat([ar, ar + total])
            pos_col = torch.cat([ar + total, ar])
            excluded = (torch.cat([idx, idx]), torch.cat([self_col, pos_col]))
        else:
            excluded = (idx, idx + off)
        logits = Exclude.apply(logits, excluded, None)
        return Logits(logits, log_pos, num_neg, None, keys, queries, temperature, *extra)

    # Excluded columns include the row's own views, so no index fill is needed.
    same = batch.excluded
    per_view = same.sum(dim=1)
    if form == "simclr":
        same = same.repeat(2, 2)
        num_neg = cb - 2 * per_view + m
        num_neg = torch.cat([num_neg, num_neg])
    else:
        num_neg = cb - per_view + m
    has_neg = num_neg > 0
    if bool(has_neg.all()):
        has_neg = None
    else:
        # Leave rows without negatives unmasked (finite) so nothing below sees an all -inf row;
        # their loss is set to 0 at the end.
        same = same & has_neg[:, None]
    if m:
        same = torch.cat([same, same.new_zeros(rows, m)], dim=1)
    logits = Exclude.apply(logits, None, same)
    return Logits(logits, log_pos, num_neg, has_neg, keys, queries, temperature, *extra)


def log_negative_sum(
    blocks: list[Tensor], log_n: Tensor | float, beta: float, detach_weights: bool
) -> Tensor:
    """``log sum_j w_j exp(l_j)`` over the negatives in ``blocks`` (``-inf`` = not a negative).

    ``beta == 0``: plain sum (``w_j = 1``). Otherwise the HCL weights ``w_j = N softmax_j(beta l)``,
    so ``log sum_j w_j exp(l_j) = log N + LSE((1 + beta) l) - LSE(beta l)``.
    """
    out = WeightedLogSumExp.apply(float(beta), detach_weights, *blocks)
    return out if beta == 0 else log_n + out


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate on both sides of ``-log 2`` (Maechler 2012)."""
    return torch.where(x > _LOG_HALF, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def debias(
    log_s: Tensor, log_pos: Tensor, log_n: Tensor | float, tau_plus: float, temperature: float
) -> Tensor:
    """``log Ng`` of BatchSampler eq. 18 from ``log S`` (the (re)weighted negative sum).

    ``Ng = max((S - tau_plus N pos) / (1 - tau_plus), N e^(-1/t))``, evaluated as
    ``max(log S + log(1 - tau_plus N pos / S) - log(1 - tau_plus), log N - 1/t)``; when
    ``tau_plus N pos >= S`` the first term is ``-inf`` and the clamp is taken.
    """
    if tau_plus > 0:
        log_ratio = (math.log(tau_plus) + log_pos + log_n) - log_s
        below = log_ratio < 0
        # Feed a harmless value to the branch that is discarded, so its gradient is not NaN.
        safe = torch.where(below, log_ratio, torch.full_like(log_ratio, -1.0))
        log_s = torch.where(below, log_s + _log1mexp(safe), torch.full_like(log_s, -math.inf))
        log_s = log_s - math.log1p(-tau_plus)
    floor = log_n - 1.0 / temperature
    if isinstance(floor, Tensor):
        return torch.maximum(log_s, floor)
    return torch.clamp(log_s, min=floor)


def finish(core: Logits, log_ng: Tensor, reduction: str) -> Tensor:
    """Per-row ``-log(pos / (pos + Ng)) = softplus(log Ng - log pos)``, then the reduction.

    Gathered over W ranks, ``"mean"`` / ``"sum"`` return W times this rank's share of the global
    batch's mean / sum (``W / R_global * sum of own rows``, ``W * sum``): DDP averages the
    ranks' gradients, so it then applies the global batch's gradient, and the ranks' values
    average to the global loss. ``"none"`` returns the own rows unscaled.
    """
    loss = F.softplus(log_ng - core.log_pos, beta=1.0, threshold=40.0)
    if core.has_neg is not None:
        loss = torch.where(core.has_neg, loss, torch.zeros_like(loss))
    if reduction == "mean":
        return loss.mean() if core.world == 1 else loss.sum() * (core.world / core.global_rows)
    if reduction == "sum":
        return loss.sum() if core.world == 1 else loss.sum() * core.world
    return loss


def log_num_neg(core: Logits, extra: Tensor | int = 0) -> Tensor | float:
    """``log N`` per row (``[R]`` with labels, else a float), ``N`` counting ``extra`` ones."""
    n = core.num_neg + extra
    if isinstance(n, Tensor):
        # Rows without negatives get log 1 = 0, so no -inf enters the arithmetic (zeroed later).
        return torch.log(n.clamp(min=1).to(core.logits.dtype))
    return math.log(n) if n > 0 else 0.0

