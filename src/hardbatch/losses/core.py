"""Internal: the computation of every loss, from the inputs to the reduced loss.

Not public API (the losses are :mod:`hardbatch.losses`): the functions of :mod:`.functional` and
the modules of :mod:`.modules` call :func:`compute_loss` with a checked options object
(:mod:`.loss_options`). One call:

1. :func:`prepare_batch`: the input checks (:func:`check_pair_inputs`), half precision cast to
   float32, L2 normalisation (``hardbatch._validation.l2_normalize_rows``, the library's one row
   normaliser) and, with ``gather=True`` under a process group, the all-gather (:mod:`.inputs`);
2. :func:`build_logits`: the ``[R, C]`` logits ``<query_r, key_c> / t``, ``-inf`` where column
   ``c`` is not a negative of row ``r``, and the positives' logits ``l_r+``;
3. SSCL only: the synthetic negatives' logits (:mod:`.synthetic`);
4. :func:`log_negative_sum`: ``log S``, the max-shifted log-sum-exp of each row's negatives in
   torch ops, or HCL's reweighted one (:class:`WeightedLogSumExp`);
5. DCL / HCL / SSCL: :func:`debias`, DCL's ``log Ng`` with its floor;
6. :func:`finish`: the per-row loss ``softplus(log Ng - l_r+) = -log(pos / (pos + Ng))`` and the
   reduction.

Plain InfoNCE is steps 1, 2, 4 and 6 in this file, torch operations only:
``softplus(logsumexp_j l_rj - l_r+)``. :func:`autocast_enabled` tells a loss to run with
``torch.autocast`` disabled; :func:`floor_stats` measures DCL / HCL's floor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._validation import l2_normalize_rows
from .inputs import (
    Logits,
    PairBatch,
    check_every_rank,
    excluded_items,
    gather_world,
    gathered_batch,
    to_compute,
)
from .loss_options import InfoNCEOptions
from .synthetic import synthetic_logits

_LOG_HALF = -math.log(2.0)


def compute_loss(options: InfoNCEOptions, anchor: Tensor, positive: Tensor,
                 labels: Tensor | None = None, negatives: Tensor | None = None,
                 false_negatives: Tensor | None = None) -> Tensor:
    """The loss set by ``options`` (checked when made, not again) on one batch, as every loss
    function and module computes it; inputs as in :func:`~hardbatch.losses.info_nce`.

    Example:
        >>> import torch
        >>> from hardbatch.losses import info_nce
        >>> from hardbatch.losses.core import compute_loss
        >>> from hardbatch.losses.loss_options import InfoNCEOptions
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> loss = compute_loss(InfoNCEOptions(temperature=0.1), a, p)
        >>> torch.equal(loss, info_nce(a, p, temperature=0.1))
        True
    """
    if autocast_enabled(anchor):
        with torch.autocast(anchor.device.type, enabled=False):
            return compute_loss(options, anchor, positive, labels, negatives, false_negatives)
    core = build_logits(options, anchor, positive, labels, negatives, false_negatives)
    blocks, added = [core.logits], 0
    if options.synthetic > 0:
        syn, added = synthetic_logits(core, options)
        if syn.shape[1]:
            blocks.append(syn)
    log_n = 0.0
    if options.beta or options.tau_plus is not None:
        log_n = log_num_neg(core, added)
    log_ng = log_negative_sum(blocks, log_n, options.beta, options.detach_weights)
    if options.tau_plus is not None:
        log_ng = debias(log_ng, core.log_pos, log_n, options.tau_plus, core.temperature)
    return finish(core, log_ng, options.reduction)


def floor_stats(options: InfoNCEOptions, anchor: Tensor, positive: Tensor,
                labels: Tensor | None = None, negatives: Tensor | None = None,
                false_negatives: Tensor | None = None) -> tuple[float, float]:
    """:func:`~hardbatch.losses.debiased_floor_stats` of an options object (``tau_plus=None``
    counts as 0).

    Example:
        >>> import torch
        >>> from hardbatch.losses.core import floor_stats
        >>> from hardbatch.losses.loss_options import DCLOptions
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> floor_stats(DCLOptions(), a, p)[0]
        0.0
    """
    if autocast_enabled(anchor):
        with torch.autocast(anchor.device.type, enabled=False):
            return floor_stats(options, anchor, positive, labels, negatives, false_negatives)
    with torch.no_grad():
        core = build_logits(options, anchor, positive, labels, negatives, false_negatives)
        log_n = log_num_neg(core)
        log_s = log_negative_sum([core.logits], log_n, options.beta, True)
        log_ng = debias(log_s, core.log_pos, log_n, options.tau_plus or 0.0, core.temperature)
        floored = log_ng <= log_n - 1.0 / core.temperature
        a, p, inv_t = (log_s - log_n).double(), core.log_pos.double(), 1.0 / core.temperature
        tau_star = (a - p).exp() * torch.expm1(-inv_t - a) / torch.expm1(-inv_t - p)
        if core.has_neg is not None:
            floored, tau_star = floored[core.has_neg], tau_star[core.has_neg]
        if floored.numel() == 0:
            return 0.0, float("nan")
        return float(floored.float().mean()), float(tau_star.median())


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


def compute_dtype(*xs: Tensor) -> torch.dtype:
    """The promoted dtype of ``xs``; half precision computes in float32."""
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _rows(x: Tensor, dtype: torch.dtype, normalize: bool) -> Tensor:
    x = x if x.dtype == dtype else to_compute(x, dtype)
    return l2_normalize_rows(x) if normalize else x


def prepare_batch(options: InfoNCEOptions, anchor: Tensor, positive: Tensor,
                  labels: Tensor | None, negatives: Tensor | None,
                  false_negatives: Tensor | None) -> PairBatch:
    """Check, cast (half -> float32), normalise (``options.normalize``) and, with
    ``options.gather``, all-gather the inputs (:mod:`.inputs`)."""
    gathered = options.gather and gather_world(options.group) > 1
    if gathered:
        error = _rank_error(anchor, positive, labels, negatives, false_negatives,
                            options.check_finite)
        infos, pairs, extra = check_every_rank(anchor, positive, labels, negatives,
                                               false_negatives, error, options.group)
        check_pair_count(pairs, extra, "global ")
    else:
        check_pair_inputs(anchor, positive, labels, negatives, options.check_finite)
        if false_negatives is not None:
            check_false_negatives(false_negatives, anchor.shape[0], anchor.shape[0])
    dtype, normalize = compute_dtype(anchor, positive), options.normalize
    za, zp = _rows(anchor, dtype, normalize), _rows(positive, dtype, normalize)
    bank = None
    if negatives is not None and negatives.shape[0] > 0:
        bank = _rows(negatives, dtype, normalize)
    if gathered:
        return gathered_batch(za, zp, bank, labels, false_negatives, infos, options.group)
    excluded = None
    if labels is not None or false_negatives is not None:
        excluded = excluded_items(labels, labels, false_negatives, 0, za.device)
    return PairBatch(za, zp, za, zp, bank, excluded, za.shape[0])


def _shape_of(x) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def check_pair_inputs(anchor: Tensor, positive: Tensor, labels: Tensor | None,
                      negatives: Tensor | None, check_finite: bool,
                      check_batch_size: bool = True) -> None:
    """The inputs of a contrastive loss: two ``[B, d]`` float views on one device, optional
    ``[B]`` labels and ``[m, d]`` negatives; ``B >= 2``, or ``B >= 1`` with ``m >= 1``
    (:func:`check_pair_count`; ``check_batch_size=False`` leaves it to the caller, as
    ``gather=True`` does for the global batch). A 1-D ``positive`` (pytorch-metric-learning's
    ``loss(embeddings, labels)``) gets an error naming hardbatch's call form."""
    if (isinstance(anchor, Tensor) and isinstance(positive, Tensor)
            and anchor.dim() == 2 and positive.dim() == 1):
        raise ValueError(
            f"positive must be a 2-D tensor [B, d] (the second view), got a 1-D tensor of shape "
            f"{tuple(positive.shape)}: hardbatch losses are called loss(anchor, positive, "
            f"labels=labels) with two views of the batch, not pytorch-metric-learning's "
            f"loss(embeddings, labels); pass the labels by keyword (labels=...) and the second "
            f"view's embeddings as positive"
        )
    for name, x in (("anchor", anchor), ("positive", positive)):
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor [B, d], got {_shape_of(x)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating point tensor, got dtype {x.dtype}")
    if anchor.shape != positive.shape:
        raise ValueError(
            f"anchor and positive must have the same shape [B, d] (row i of each is a positive "
            f"pair), got {tuple(anchor.shape)} and {tuple(positive.shape)}"
        )
    if anchor.shape[1] == 0:
        raise ValueError(
            f"anchor and positive must have at least one feature (d >= 1), got shape "
            f"{tuple(anchor.shape)}"
        )
    if anchor.device != positive.device:
        raise ValueError(
            f"anchor and positive must be on the same device, got {anchor.device} and "
            f"{positive.device}; move them with .to(device)"
        )
    if labels is not None:
        if not isinstance(labels, Tensor) or labels.shape != (anchor.shape[0],):
            raise ValueError(
                f"labels must be a 1-D tensor [B] = [{anchor.shape[0]}], got {_shape_of(labels)}"
            )
        # NaN != NaN would make an item a negative of itself and of its positive.
        if labels.is_floating_point() and not bool(torch.isfinite(labels).all()):
            raise ValueError(
                "labels contains NaN or inf values; use integer class ids (or finite floats)"
            )
    if negatives is not None:
        if (not isinstance(negatives, Tensor) or negatives.dim() != 2
                or negatives.shape[1] != anchor.shape[1]):
            raise ValueError(f"negatives must be a 2-D tensor [m, d] with d={anchor.shape[1]}, "
                             f"got {_shape_of(negatives)}")
        if not negatives.is_floating_point():
            raise ValueError(
                f"negatives must be a floating point tensor, got dtype {negatives.dtype}"
            )
        if negatives.device != anchor.device:
            raise ValueError(
                f"negatives must be on the device of anchor and positive ({anchor.device}), "
                f"got {negatives.device}; move them with .to(device)"
            )
    if check_batch_size:
        check_pair_count(anchor.shape[0], 0 if negatives is None else negatives.shape[0])
    if check_finite:  # one device sync per tensor on GPU
        for name, x in (("anchor", anchor), ("positive", positive), ("negatives", negatives)):
            if x is not None and not bool(torch.isfinite(x).all()):
                raise ValueError(f"{name} contains NaN or inf values; check the encoder output "
                                 "(or pass check_finite=False to skip this test)")


def check_pair_count(pairs: int, extra_negatives: int, where: str = "") -> None:
    """``ValueError`` unless ``pairs >= 2``, or ``pairs >= 1`` with ``extra_negatives >= 1``.

    With extra negatives a single pair still has something to be contrasted with. ``where``
    qualifies the count (e.g. "global " under ``gather=True``).
    """
    has_bank = extra_negatives > 0
    if pairs < (1 if has_bank else 2):
        raise ValueError(
            f"need a {where}batch of at least 2 pairs (B >= 2) for in-batch negatives, or B >= 1 "
            f"with at least one row of negatives, got B={pairs}"
            + ("" if has_bank else "; use drop_last=True in the batch sampler (or in the "
               "DataLoader when it has no batch_sampler), or pass negatives")
        )


def check_false_negatives(mask, rows: int, cols: int | str, *, gathered: bool = False) -> None:
    """``false_negatives``: a bool tensor ``[rows, cols]`` (True: not a negative of the row).

    ``gathered``: under ``gather=True`` the columns are the global batch's items, so the hint
    names the ``[b, B_global]`` form.
    """
    expected = f"[{rows}, {cols}]" + (
        " (this rank's anchors x the global batch's items, in rank order)" if gathered
        else " (anchors x items of the batch)")
    if not isinstance(mask, Tensor) or mask.shape != (rows, cols):
        raise ValueError(
            f"false_negatives must be a bool tensor of shape {expected}, got {_shape_of(mask)}"
            + ("; with gather=True build it with hardbatch.guided_mask(..., gather=True) or "
               "for the gathered items" if gathered else "")
        )
    if mask.dtype != torch.bool:
        raise ValueError(
            f"false_negatives must be a bool tensor (True: item j is not a negative of anchor "
            f"i), got dtype {mask.dtype}; compare or cast it, e.g. mask.bool() or mask > 0"
        )


def _rank_error(anchor, positive, labels, negatives, false_negatives,
                check_finite: bool) -> ValueError | None:
    """Under ``gather=True``: the error of this rank's own checks, or None. Returned, not raised:
    :func:`~.inputs.check_every_rank` raises it after the exchange, so that no rank waits alone;
    the pair count is the global batch's, checked after it."""
    try:
        check_pair_inputs(anchor, positive, labels, negatives, check_finite,
                          check_batch_size=False)
        if false_negatives is not None:
            fn = false_negatives
            cols = fn.shape[1] if isinstance(fn, Tensor) and fn.dim() == 2 else "B_global"
            check_false_negatives(fn, anchor.shape[0], cols, gathered=True)
    except ValueError as exc:
        return exc
    return None


def build_logits(options: InfoNCEOptions, anchor: Tensor, positive: Tensor,
                 labels: Tensor | None, negatives: Tensor | None,
                 false_negatives: Tensor | None) -> Logits:
    """The :class:`~.inputs.Logits` of one batch (``options``: checked).

    Rows: this rank's ``R = 2b`` views (``form="simclr"``) or ``b`` anchors (``"simcse"``);
    columns: the batch keys (``2B`` views or ``B`` positives; ``B = b`` unless ``gather``, see
    :mod:`.inputs`) then the ``m`` rows of ``negatives``. An item excluded for anchor ``i``
    (same label, ``false_negatives``) loses both its views in both of ``i``'s rows. The
    excluded entries are set to ``-inf`` (their gradient is 0: ``exp(-inf) = 0`` for every
    consumer).
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

    if batch.excluded is None:  # each row's own view and positive
        num_neg = cb - (2 if form == "simclr" else 1) + m
        idx = torch.arange(rows, device=logits.device)
        if form == "simclr":
            ar = idx[:b] + off
            index = (torch.cat([idx, idx]), torch.cat([ar, ar + total, ar + total, ar]))
        else:
            index = (idx, idx + off)
        logits = logits.index_put_(index, logits.new_tensor(-math.inf))
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
    logits = logits.masked_fill(same, -math.inf)
    return Logits(logits, log_pos, num_neg, has_neg, keys, queries, temperature, *extra)


class WeightedLogSumExp(torch.autograd.Function):
    """Row-wise ``LSE((1 + beta) l) - LSE(beta l')`` (HCL, eq. 18), ``beta > 0``.

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
            if beta == 1:
                e = eb = shifted.exp_()
                sum1 = sum1 + torch.linalg.vector_norm(e, dim=1).square()
            else:
                eb = torch.mul(shifted, beta).exp_()
                e = shifted.exp_()
                sum1 = sum1 + torch.linalg.vecdot(e, eb, dim=1)
            sumb = sumb + eb.sum(dim=1)
            saved += [e, eb]
        ctx.beta, ctx.detach = beta, detach
        ctx.save_for_backward(sum1, sumb, *saved)
        return row_max + torch.log(sum1) - torch.log(sumb)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple:
        sum1, sumb, *saved = ctx.saved_tensors
        beta = ctx.beta
        grads = []
        for e, eb in zip(saved[::2], saved[1::2]):
            if ctx.detach:
                grads.append((e * (grad / sum1)[:, None]).mul_(eb))
            else:
                c1 = (grad * (1.0 + beta) / sum1)[:, None]
                cb = (grad * -beta / sumb)[:, None]
                grads.append(torch.addcmul(cb, e, c1).mul_(eb))
        return (None, None, *grads)


def log_negative_sum(
    blocks: list[Tensor], log_n: Tensor | float, beta: float, detach_weights: bool
) -> Tensor:
    """``log sum_j w_j exp(l_j)`` over the negatives in ``blocks`` (``-inf`` = not a negative).

    ``beta == 0``: the plain sum (``w_j = 1``), ``M + log sum_j exp(l_j - M)`` with the row max
    ``M`` (a constant: its gradient cancels), in torch operations. Otherwise the HCL weights
    ``w_j = N softmax_j(beta l)``, so ``log sum_j w_j exp(l_j) = log N + LSE((1 + beta) l) -
    LSE(beta l)`` (:class:`WeightedLogSumExp`).
    """
    if beta != 0:
        return log_n + WeightedLogSumExp.apply(float(beta), detach_weights, *blocks)
    row_max = blocks[0].detach().amax(dim=1)
    for blk in blocks[1:]:
        row_max = torch.maximum(row_max, blk.detach().amax(dim=1))
    total = (blocks[0] - row_max[:, None]).exp_().sum(dim=1)
    for blk in blocks[1:]:
        total = total + (blk - row_max[:, None]).exp_().sum(dim=1)
    return row_max + torch.log(total)


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate on both sides of ``-log 2`` (Maechler 2012)."""
    near = torch.log(-torch.expm1(x.clamp(min=_LOG_HALF)))  # each branch on its side only: a
    far = torch.log1p(-torch.exp(x.clamp(max=_LOG_HALF)))  # NaN gradient of the other otherwise
    return torch.where(x > _LOG_HALF, near, far)


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
