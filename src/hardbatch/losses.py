"""Contrastive losses: InfoNCE (SimCLR / SimCSE forms), debiased (DCL), hard-negative (HCL), SSCL.

Every loss takes two views ``anchor`` and ``positive`` of shape ``[B, d]`` (row ``i`` of each is a
positive pair) and compares each anchor with its positive against a set of negatives:

* ``form="simclr"`` (NT-Xent, BatchSampler paper eq. 16): the ``2B`` views are all anchors; each one
  has ``2B - 2`` negatives (every other view except itself and its positive). Per-row losses are
  ``[2B]``: rows ``0..B-1`` use ``anchor[i]`` as the anchor, rows ``B..2B-1`` use ``positive[i]``.
* ``form="simcse"`` (SimCSE / GraphCL / MultipleNegativesRankingLoss, eq. 17): each anchor is
  contrasted with all ``B`` positives, so it has ``B - 1`` negatives. Per-row losses are ``[B]``.
  GraphCL's released ``loss_cal`` also leaves the positive out of the denominator
  (``-log(pos / sum_j neg_ij)``), which this form does not.

Optional ``labels`` ``[B]`` mask known false negatives (no item with the anchor's label is ever a
negative; the positive pair stays the positive), optional ``negatives`` ``[m, d]`` (a memory bank as
in MoCo, or explicit hard negatives) are appended to every anchor's negatives. ``B >= 2`` is needed
without ``negatives``; with at least one row of them a single pair (``B = 1``) is enough.

Writing ``pos = exp(s_i+ / t)`` and ``neg_ij = exp(s_ij / t)`` (cosine similarities ``s`` when
``normalize=True``) and ``N`` for the number of negatives of row ``i``:

* InfoNCE: ``-log(pos / (pos + sum_j neg_ij))``.
* DCL (Chuang et al. 2020; BatchSampler eq. 18 with ``lambda = 1``):
  ``Ng = max((sum_j neg_ij - tau_plus * N * pos) / (1 - tau_plus), N * e^(-1/t))`` and
  ``-log(pos / (pos + Ng))``.
* HCL (Robinson et al. 2021; eq. 18 with ``lambda_ij = w_ij``): as DCL with ``sum_j neg_ij``
  replaced by ``sum_j w_ij neg_ij``, ``w_ij = exp(beta s_ij / t) / mean_j exp(beta s_ij / t)``.
* SSCL (Dong et al., "Synthetic Hard Negative Samples for Contrastive Learning", eq. 2-4): HCL over
  the negatives plus ``k`` synthetic ones mixed from the ``s`` hardest negatives.

Everything is evaluated in log space: ``log sum exp`` with per-row max shifts, the debiasing
subtraction as ``log S + log(1 - tau_plus N pos / S)`` and the clamp as a maximum of logs, so fp16 /
bf16 inputs at ``t = 0.05`` (where ``exp(1 / t)`` overflows fp16) stay finite. Half-precision inputs
are computed in float32 and the loss is returned in float32; ``torch.autocast`` is disabled inside
the losses, so under mixed precision float32 inputs give the same loss as outside it.

The ``torch.nn.Module`` classes take the two views positionally, ``loss(out0, out1)``, like the
lightly losses (``NTXentLoss``), and class ``labels`` as a keyword, like pytorch-metric-learning.

Rows left without any negative (every other item shares the anchor's label and there is no memory
bank) have loss ``-log(pos / pos) = 0`` and zero gradient; ``reduction="mean"`` still counts them.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ._validation import check_real

__all__ = [
    "DebiasedInfoNCE",
    "HardNegativeInfoNCE",
    "InfoNCE",
    "SSCLLoss",
    "debiased_floor_stats",
    "debiased_info_nce",
    "hard_negative_info_nce",
    "info_nce",
    "sscl_loss",
]

Form = Literal["simclr", "simcse"]
Reduction = Literal["mean", "sum", "none"]

_FORMS = ("simclr", "simcse")
_REDUCTIONS = ("mean", "sum", "none")
_LOG_HALF = -math.log(2.0)


# --------------------------------------------------------------------------- validation


def _as_real(name: str, value: object, hint: str) -> float:
    """``value`` as a Python float (:func:`check_real`), refusing a tensor that requires grad."""
    if isinstance(value, Tensor) and value.requires_grad:
        # float() would silently cut a learnable value off its gradient
        raise ValueError(
            f"{name} must be a constant, got a tensor that requires grad; learnable values "
            f"are not supported, pass float({name}) to use its current value"
        )
    return check_real(value, name, hint)


def _check_temperature(temperature: float) -> float:
    """The validated temperature as a float (also takes numpy scalars and 0-d tensors)."""
    hint = "a finite number > 0 (e.g. 0.5 for SimCLR, 0.05 for SimCSE)"
    t = _as_real("temperature", temperature, hint)
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"temperature must be {hint}, got {temperature!r}")
    return t


def _check_tau_plus(tau_plus: float) -> float:
    hint = "in [0, 1) (class prior of false negatives), e.g. 0.1"
    value = _as_real("tau_plus", tau_plus, hint)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"tau_plus must be {hint}, got {tau_plus!r}")
    return value


def _check_beta(beta: float) -> float:
    hint = "a finite number >= 0 (hardness concentration; 0 disables the reweighting)"
    value = _as_real("beta", beta, hint)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"beta must be {hint}, got {beta!r}")
    return value


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; use one of {', '.join(map(repr, choices))}")


def _check_sscl(hardest: int, synthetic: int) -> tuple[int, int]:
    """The validated ``(hardest, synthetic)`` as Python ints (numpy integers accepted)."""
    out = []
    for name, value in (("hardest", hardest), ("synthetic", synthetic)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        out.append(int(value))
    if out[1] > 0 and out[0] == 0:
        raise ValueError(
            "hardest must be >= 1 when synthetic > 0 (synthetic negatives are mixed from the "
            "hardest ones); set synthetic=0 to disable them"
        )
    return out[0], out[1]


def _check_finite(name: str, x: Tensor) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"{name} contains NaN or inf values; check the encoder output (or pass "
            f"check_finite=False to skip this test)"
        )


def _check_embeddings(
    anchor: Tensor,
    positive: Tensor,
    labels: Tensor | None,
    negatives: Tensor | None,
    check_finite: bool,
) -> None:
    for name, x in (("anchor", anchor), ("positive", positive)):
        if not isinstance(x, Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a 2-D tensor [B, d], got {shape}")
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
            shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
            raise ValueError(
                f"labels must be a 1-D tensor [B] = [{anchor.shape[0]}], got {shape}"
            )
        # NaN != NaN would make an item a negative of itself and of its positive.
        if labels.is_floating_point() and not bool(torch.isfinite(labels).all()):
            raise ValueError(
                "labels contains NaN or inf values; use integer class ids (or finite floats)"
            )
    if negatives is not None:
        if (
            not isinstance(negatives, Tensor)
            or negatives.dim() != 2
            or negatives.shape[1] != anchor.shape[1]
        ):
            shape = (
                tuple(negatives.shape)
                if isinstance(negatives, Tensor)
                else type(negatives).__name__
            )
            raise ValueError(
                f"negatives must be a 2-D tensor [m, d] with d={anchor.shape[1]}, got {shape}"
            )
        if not negatives.is_floating_point():
            raise ValueError(
                f"negatives must be a floating point tensor, got dtype {negatives.dtype}"
            )
        if negatives.device != anchor.device:
            raise ValueError(
                f"negatives must be on the device of anchor and positive ({anchor.device}), "
                f"got {negatives.device}; move them with .to(device)"
            )
    # With extra negatives a single pair still has something to be contrasted with.
    has_bank = negatives is not None and negatives.shape[0] > 0
    if anchor.shape[0] < (1 if has_bank else 2):
        raise ValueError(
            f"need a batch of at least 2 pairs (B >= 2) for in-batch negatives, or B >= 1 with "
            f"at least one row of negatives, got B={anchor.shape[0]}"
            + ("" if has_bank else "; use drop_last=True in the DataLoader or pass negatives")
        )
    if check_finite:
        _check_finite("anchor", anchor)
        _check_finite("positive", positive)
        if negatives is not None:
            _check_finite("negatives", negatives)


# --------------------------------------------------------------------------- shared core


@dataclass
class _Logits:
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


class _Exclude(torch.autograd.Function):
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


class _WeightedLogSumExp(torch.autograd.Function):
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


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device_type == "cuda" and torch.is_autocast_enabled()
    except RuntimeError:  # a device type autocast does not know (e.g. "meta")
        return False


def _without_autocast(fn):
    """Run the loss ``fn(anchor, ...)`` with autocast disabled on the anchor's device.

    Under ``torch.autocast`` (mixed-precision trainers) the logit matmuls would otherwise run in
    bf16 / fp16; disabling it keeps the promise that half precision is computed in float32, and a
    float32 input gives the same loss inside and outside autocast. Outside autocast, ``fn`` runs
    as is.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        anchor = args[0] if args else kwargs.get("anchor")
        if not isinstance(anchor, Tensor) or not _autocast_enabled(anchor.device.type):
            return fn(*args, **kwargs)
        with torch.autocast(device_type=anchor.device.type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper


def _compute_dtype(*xs: Tensor) -> torch.dtype:
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _build_logits(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float,
    form: str,
    labels: Tensor | None,
    negatives: Tensor | None,
    normalize: bool,
    check_finite: bool,
) -> _Logits:
    temperature = _check_temperature(temperature)
    _check_choice("form", form, _FORMS)
    _check_embeddings(anchor, positive, labels, negatives, check_finite)

    dtype = _compute_dtype(anchor, positive)
    za, zp = anchor.to(dtype), positive.to(dtype)
    bank = None if negatives is None or negatives.shape[0] == 0 else negatives.to(dtype)
    if normalize:
        za, zp = F.normalize(za, dim=1), F.normalize(zp, dim=1)
        bank = None if bank is None else F.normalize(bank, dim=1)
    b = za.shape[0]
    m = 0 if bank is None else bank.shape[0]

    log_pos = (za * zp).sum(dim=1) / temperature
    if form == "simclr":
        batch_keys = queries = torch.cat([za, zp])
        log_pos = torch.cat([log_pos, log_pos])
    else:
        batch_keys, queries = zp, za
    keys = batch_keys if bank is None else torch.cat([batch_keys, bank])
    # Scaling the [R, d] queries is cheaper than scaling the [R, C] logits.
    queries = queries / temperature
    logits = queries @ keys.T
    rows, cb = queries.shape[0], batch_keys.shape[0]

    if labels is None:
        num_neg = cb - (2 if form == "simclr" else 1) + m
        idx = torch.arange(rows, device=logits.device)
        if form == "simclr":
            pos_col = torch.cat([idx[b:], idx[:b]])
            excluded = (torch.cat([idx, idx]), torch.cat([idx, pos_col]))
        else:
            excluded = (idx, idx)
        logits = _Exclude.apply(logits, excluded, None)
        return _Logits(logits, log_pos, num_neg, None, keys, queries, temperature)

    labels = labels.to(logits.device)
    row_labels = torch.cat([labels, labels]) if form == "simclr" else labels
    # Same-label columns include the row itself and its positive, so no index fill is needed.
    same = row_labels[:, None] == row_labels[None, :cb]
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    same_count = counts[inverse] * (2 if form == "simclr" else 1)
    num_neg = cb - same_count + m
    if form == "simclr":
        num_neg = torch.cat([num_neg, num_neg])
    has_neg = num_neg > 0
    if bool(has_neg.all()):
        has_neg = None
    else:
        # Leave rows without negatives unmasked (finite) so nothing below sees an all -inf row;
        # their loss is set to 0 at the end.
        same = same & has_neg[:, None]
    if m:
        same = torch.cat([same, same.new_zeros(rows, m)], dim=1)
    logits = _Exclude.apply(logits, None, same)
    return _Logits(logits, log_pos, num_neg, has_neg, keys, queries, temperature)


def _log_negative_sum(
    blocks: list[Tensor], log_n: Tensor | float, beta: float, detach_weights: bool
) -> Tensor:
    """``log sum_j w_j exp(l_j)`` over the negatives in ``blocks`` (``-inf`` = not a negative).

    ``beta == 0``: plain sum (``w_j = 1``). Otherwise the HCL weights ``w_j = N softmax_j(beta l)``,
    so ``log sum_j w_j exp(l_j) = log N + LSE((1 + beta) l) - LSE(beta l)``.
    """
    out = _WeightedLogSumExp.apply(float(beta), detach_weights, *blocks)
    return out if beta == 0 else log_n + out


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate on both sides of ``-log 2`` (Maechler 2012)."""
    return torch.where(x > _LOG_HALF, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _debias(
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


def _finish(core: _Logits, log_ng: Tensor, reduction: str) -> Tensor:
    """Per-row ``-log(pos / (pos + Ng)) = softplus(log Ng - log pos)``, then the reduction."""
    loss = F.softplus(log_ng - core.log_pos, beta=1.0, threshold=40.0)
    if core.has_neg is not None:
        loss = torch.where(core.has_neg, loss, torch.zeros_like(loss))
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _log_num_neg(core: _Logits, extra: Tensor | int = 0) -> Tensor | float:
    n = core.num_neg + extra
    if isinstance(n, Tensor):
        # Rows without negatives get log 1 = 0, so no -inf enters the arithmetic (zeroed later).
        return torch.log(n.clamp(min=1).to(core.logits.dtype))
    return math.log(n) if n > 0 else 0.0


def _hardest_columns(logits: Tensor, s: int) -> Tensor:
    """Column indices ``[R, s]`` of the ``s`` largest entries of each row, in decreasing order.

    On CPU ``torch.topk`` is several times slower than numpy's introselect (``argpartition``), which
    is used instead. For wide rows (``C >= 64 s``) the rows are first cut to the ``s`` column groups
    with the largest maxima: they hold every top-``s`` entry, since at most ``s`` groups can contain
    an entry >= the ``s``-th largest.
    """
    x = logits.detach()
    rows, cols = x.shape
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return torch.topk(x, s, dim=1).indices
    g = int(math.sqrt(cols / s))
    if g < 8:  # introselect's per-row overhead makes two passes slower on narrower rows
        cand = None
        top = np.argpartition(x.numpy(), cols - s, axis=1)[:, cols - s :]
    else:
        n_groups = cols // g
        # Strided groups (column t * n_groups + j is in group j): the max is a vectorised reduction.
        group_max = x[:, : n_groups * g].unflatten(1, (g, n_groups)).amax(dim=1)
        top_groups = np.argpartition(group_max.numpy(), n_groups - s, axis=1)[:, n_groups - s :]
        offsets = torch.arange(g) * n_groups
        cand = (torch.from_numpy(top_groups)[:, :, None] + offsets).flatten(1)
        if n_groups * g < cols:
            tail = torch.arange(n_groups * g, cols).expand(rows, -1)
            cand = torch.cat([cand, tail], dim=1)
        n = cand.shape[1]
        top = np.argpartition(x.gather(1, cand).numpy(), n - s, axis=1)[:, n - s :]
    top = torch.from_numpy(np.ascontiguousarray(top))
    top = top if cand is None else cand.gather(1, top)
    return top.gather(1, x.gather(1, top).argsort(dim=1, descending=True))


class _KeyPairDot(torch.autograd.Function):
    """``<keys[i], keys[j]>`` for index tensors ``i, j`` of shape ``[R, k]``.

    The backward is one sparse-dense product, ``grad_keys = S keys`` with ``S`` the symmetric
    ``[C, C]`` matrix holding ``grad`` at every ``(i, j)`` and ``(j, i)``: ``index_add_`` (the
    generic gather backward) is far slower on a multi-threaded CPU.
    """

    @staticmethod
    def forward(ctx, keys: Tensor, i: Tensor, j: Tensor) -> Tensor:
        ij = torch.cat([i.flatten(), j.flatten()])
        ctx.save_for_backward(keys, ij)
        k = keys.index_select(0, ij).view(2, -1, keys.shape[1])
        return k[0].mul_(k[1]).sum(dim=1).view_as(i)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        keys, ij = ctx.saved_tensors
        ji = ij.view(2, -1).flip(0).flatten()
        g = grad.flatten().to(keys.dtype)
        n = keys.shape[0]
        pairs = torch.sparse_coo_tensor(
            torch.stack([ij, ji]), torch.cat([g, g]), (n, n), check_invariants=False
        )
        return torch.sparse.mm(pairs, keys), None, None


class _TakeAlongRows(torch.autograd.Function):
    """``logits.gather(1, index)``; the backward accumulates into a flat view with ``index_put_``.

    Same values and gradient as ``gather``, whose ``scatter_add_`` backward is far slower on a
    multi-threaded CPU.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:
        cols = logits.shape[1]
        flat = index + torch.arange(0, index.shape[0] * cols, cols, device=index.device)[:, None]
        ctx.save_for_backward(flat)
        ctx.shape = logits.shape
        return logits.reshape(-1).take(flat)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (flat,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.shape.numel())
        out.index_put_((flat.flatten(),), grad.flatten(), accumulate=True)
        return out.view(ctx.shape), None


class _QueryOnlyGrad(torch.autograd.Function):
    """Synthetic logits ``value[r, p] = <q_r, h_rp>`` whose gradient reaches the queries only.

    ``h_rp = sum_c weights[r, p, c] keys[cols[r, p, c]]`` (``cols``, ``weights``: ``[R, k, n]``)
    is a constant, as in the released SSCL code, which detaches its synthetic negatives;
    ``value`` ``[R, k]`` is computed by the caller from the logits and returned unchanged. The
    backward is ``grad_queries = S keys`` with the sparse ``[R, C]`` matrix ``S`` holding
    ``grad[r, p] weights[r, p, c]`` at ``(r, cols[r, p, c])``: no ``[R, k, d]`` tensor is built.
    """

    @staticmethod
    def forward(
        ctx, queries: Tensor, value: Tensor, keys: Tensor, cols: Tensor, weights: Tensor
    ) -> Tensor:
        ctx.save_for_backward(keys, cols, weights)
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        keys, cols, weights = ctx.saved_tensors
        rows = cols.shape[0]
        row_idx = torch.arange(rows, device=cols.device)[:, None].expand(rows, cols[0].numel())
        pairs = torch.sparse_coo_tensor(
            torch.stack([row_idx.flatten(), cols.flatten()]),
            (grad[..., None] * weights).flatten().to(keys.dtype),
            (rows, keys.shape[0]),
            check_invariants=False,
        )
        return torch.sparse.mm(pairs, keys), None, None, None, None


def _synthetic_logits(
    core: _Logits,
    hardest: int,
    synthetic: int,
    mix: bool,
    normalize: bool,
    detach: bool,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor | int]:
    """SSCL eq. 2: ``k = synthetic`` negatives per row, mixed from its ``s = hardest`` hardest ones.

    Returns their logits ``[R, k]`` (``-inf`` for rows without negatives) and how many were added
    per row. For ``h = a z_i + (1 - a) z_j`` the logit is ``<q, h> / |h|`` with
    ``<q, h> = a l_i + (1 - a) l_j`` read off the logits, and for unit keys
    ``|h|^2 = a^2 + (1 - a)^2 + 2 a (1 - a) <z_i, z_j>``, so no ``[R, k, d]`` tensor is built (an
    all-zero key, which ``F.normalize`` leaves zero, drops its ``a^2`` or ``(1 - a)^2`` term).
    ``normalize=False`` keeps ``h`` unnormalised (logit ``a l_i + (1 - a) l_j``). ``detach``: the
    same values, with ``h`` a constant (gradient into the queries only, :class:`_QueryOnlyGrad`).
    """
    logits = core.logits.detach() if detach else core.logits
    keys = core.keys.detach() if detach else core.keys
    rows = logits.shape[0]
    max_neg = int(core.num_neg.max()) if isinstance(core.num_neg, Tensor) else core.num_neg
    s = min(hardest, max_neg)
    if s == 0:
        return logits.new_empty(rows, 0), 0
    # Decreasing order: rows with fewer than s negatives (labels) have the valid ones first.
    hard = _hardest_columns(logits, s).to(logits.device)
    # float32 draws whatever the input dtype, so a seed gives the same negatives in every precision.
    draws = torch.rand(rows, synthetic, 3, generator=generator, device=logits.device)
    if isinstance(core.num_neg, Tensor):
        count = core.num_neg.clamp(max=s)[:, None, None]  # valid hard negatives of each row
        pick = torch.minimum((draws[..., :2] * count).long(), (count - 1).clamp(min=0))
    else:
        count = None
        pick = (draws[..., :2] * s).long().clamp(max=s - 1)
    first = hard.gather(1, pick[..., 0])
    norm = None
    if mix:
        second = hard.gather(1, pick[..., 1])
        alpha = draws[..., 2].to(logits.dtype)
        picked = _TakeAlongRows.apply(logits, torch.cat([first, second], dim=1))
        syn = torch.lerp(picked[:, synthetic:], picked[:, :synthetic], alpha)
        if normalize:
            cos = _KeyPairDot.apply(keys, first, second)
            mixed = alpha * (1.0 - alpha)
            # a^2 |z_i|^2 + (1 - a)^2 |z_j|^2 with |z|^2 = 1, or 0 for an all-zero key
            zero = ~keys.any(dim=1)
            zero_i, zero_j = zero[first], zero[second]
            sq_sum = torch.where(
                zero_i | zero_j,
                alpha.square() * ~zero_i + (1.0 - alpha).square() * ~zero_j,
                1.0 - 2.0 * mixed,  # a^2 + (1 - a)^2 = 1 - 2a(1 - a)
            )
            norm = (sq_sum + 2.0 * mixed * cos).clamp(min=1e-24).sqrt()  # F.normalize's eps
            syn = syn / norm
    else:
        syn = _TakeAlongRows.apply(logits, first)
    if detach:  # h = sum_c weights[..., c] keys[cols[..., c]], a constant
        if mix:
            cols = torch.stack([first, second], dim=2)
            weights = torch.stack([alpha, 1.0 - alpha], dim=2)
            weights = weights if norm is None else weights / norm[..., None]
        else:
            cols, weights = first[..., None], logits.new_ones(1, 1, 1).expand(rows, synthetic, 1)
        syn = _QueryOnlyGrad.apply(core.queries, syn, keys, cols, weights)
    if count is None:
        return syn, synthetic
    valid = count[:, 0] > 0  # [R, 1]
    syn = torch.where(valid, syn, syn.new_tensor(-math.inf))
    return syn, valid[:, 0].long() * synthetic


# --------------------------------------------------------------------------- functional API


@_without_autocast
def info_nce(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float = 0.5,
    form: Form = "simclr",
    labels: Tensor | None = None,
    negatives: Tensor | None = None,
    normalize: bool = True,
    reduction: Reduction = "mean",
    check_finite: bool = True,
) -> Tensor:
    """InfoNCE / NT-Xent: ``-log(pos / (pos + sum_j neg_ij))`` (BatchSampler eq. 16 and 17).

    Args:
        anchor, positive: ``[B, d]`` embeddings of the two views; row ``i`` is a positive pair.
        temperature: ``t > 0``; logits are ``cos / t``.
        form: ``"simclr"`` (``2B`` anchors, ``2B - 2`` negatives each, eq. 16) or ``"simcse"``
            (``B`` anchors against the ``B`` positives, ``B - 1`` negatives each, eq. 17).
        labels: optional ``[B]`` class labels; items sharing the anchor's label are not negatives.
        negatives: optional ``[m, d]`` extra negatives appended for every anchor (memory bank).
        normalize: L2-normalise the embeddings first (cosine similarity).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (per-row ``[2B]`` simclr / ``[B]`` simcse).
        check_finite: raise ``ValueError`` on NaN / inf inputs (one device sync on GPU).

    Returns:
        The loss, a scalar or ``[R]`` for ``reduction="none"``.
    """
    _check_choice("reduction", reduction, _REDUCTIONS)
    core = _build_logits(
        anchor,
        positive,
        temperature=temperature,
        form=form,
        labels=labels,
        negatives=negatives,
        normalize=normalize,
        check_finite=check_finite,
    )
    return _finish(core, _log_negative_sum([core.logits], 0.0, 0.0, False), reduction)


@_without_autocast
def debiased_info_nce(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float = 0.5,
    tau_plus: float = 0.1,
    form: Form = "simclr",
    labels: Tensor | None = None,
    negatives: Tensor | None = None,
    normalize: bool = True,
    reduction: Reduction = "mean",
    check_finite: bool = True,
) -> Tensor:
    """Debiased contrastive loss (DCL, Chuang et al. 2020; BatchSampler eq. 18 with ``lambda = 1``).

    ``Ng = max((sum_j neg_ij - tau_plus N pos) / (1 - tau_plus), N e^(-1/t))`` and the loss is
    ``-log(pos / (pos + Ng))``, with ``N`` the number of negatives of the row (it varies per row
    when ``labels`` mask some). ``tau_plus = 0`` gives InfoNCE (for normalised inputs the clamp is
    then never active). Other arguments and shapes as in :func:`info_nce`.
    """
    tau_plus = _check_tau_plus(tau_plus)
    return hard_negative_info_nce(
        anchor,
        positive,
        temperature=temperature,
        tau_plus=tau_plus,
        beta=0.0,
        form=form,
        labels=labels,
        negatives=negatives,
        normalize=normalize,
        reduction=reduction,
        check_finite=check_finite,
    )


@_without_autocast
def hard_negative_info_nce(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float = 0.5,
    tau_plus: float = 0.1,
    beta: float = 1.0,
    detach_weights: bool = False,
    form: Form = "simclr",
    labels: Tensor | None = None,
    negatives: Tensor | None = None,
    normalize: bool = True,
    reduction: Reduction = "mean",
    check_finite: bool = True,
) -> Tensor:
    """Hard-negative contrastive loss (HCL, Robinson et al. 2021; BatchSampler eq. 18).

    Importance weights ``w_ij = exp(beta s_ij / t) / mean_j exp(beta s_ij / t)`` (mean over the
    row's negatives) reweight the negatives, ``S = sum_j w_ij neg_ij``, which is then debiased and
    clamped as in :func:`debiased_info_nce`. As in the authors' code, gradients flow through the
    weights; ``detach_weights=True`` treats them as constants (same value, different gradient).
    ``beta = 0`` gives DCL. Other arguments and shapes as in :func:`info_nce`.
    """
    _check_choice("reduction", reduction, _REDUCTIONS)
    tau_plus = _check_tau_plus(tau_plus)
    beta = _check_beta(beta)
    core = _build_logits(
        anchor,
        positive,
        temperature=temperature,
        form=form,
        labels=labels,
        negatives=negatives,
        normalize=normalize,
        check_finite=check_finite,
    )
    log_n = _log_num_neg(core)
    log_s = _log_negative_sum([core.logits], log_n, beta, detach_weights)
    return _finish(core, _debias(log_s, core.log_pos, log_n, tau_plus, core.temperature), reduction)


@_without_autocast
def debiased_floor_stats(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float = 0.5,
    tau_plus: float = 0.1,
    beta: float = 0.0,
    form: Form = "simclr",
    labels: Tensor | None = None,
    negatives: Tensor | None = None,
    normalize: bool = True,
    check_finite: bool = True,
) -> tuple[float, float]:
    """How often DCL / HCL's negative term sits on its floor ``N e^(-1/t)``, for one batch.

    Returns ``(fraction, tau_plus_max)``: the fraction of rows (those with negatives) whose
    ``Ng`` in :func:`debiased_info_nce` / :func:`hard_negative_info_nce` (``beta``) is the clamp
    value, i.e. ``tau_plus N pos >= S``; such a row's loss is ``softplus(log N - 1/t - log pos)``,
    about 0 with almost no gradient. ``tau_plus_max`` is the (lower) median over rows of
    ``S / (N pos)``: the ``tau_plus`` below which the median row is not clamped. The floor takes
    most rows when positives are far closer than negatives at a low temperature (SimCSE's dropout
    positives at ``t = 0.05``: BatchSampler paper, Appendix B.6). No gradient; same arguments as
    the losses.
    """
    tau_plus = _check_tau_plus(tau_plus)
    beta = _check_beta(beta)
    with torch.no_grad():
        core = _build_logits(anchor, positive, temperature=temperature, form=form, labels=labels,
                             negatives=negatives, normalize=normalize,
                             check_finite=check_finite)
        log_n = _log_num_neg(core)
        log_s = _log_negative_sum([core.logits], log_n, beta, True)
        log_ng = _debias(log_s, core.log_pos, log_n, tau_plus, core.temperature)
        floored = log_ng <= log_n - 1.0 / core.temperature
        log_max = log_s - core.log_pos - log_n
        if core.has_neg is not None:
            floored, log_max = floored[core.has_neg], log_max[core.has_neg]
        if floored.numel() == 0:
            return 0.0, float("nan")
        return float(floored.float().mean()), float(log_max.median().exp())


@_without_autocast
def sscl_loss(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float = 0.5,
    tau_plus: float = 0.1,
    beta: float = 1.0,
    hardest: int = 32,
    synthetic: int = 8,
    mix: bool = True,
    detach_weights: bool = False,
    detach_synthetic: bool = False,
    generator: torch.Generator | None = None,
    form: Form = "simclr",
    labels: Tensor | None = None,
    negatives: Tensor | None = None,
    normalize: bool = True,
    reduction: Reduction = "mean",
    check_finite: bool = True,
) -> Tensor:
    """SSCL: synthetic hard negatives, reweighted and debiased (Dong et al., eq. 2-4).

    For each anchor row the ``s = hardest`` most similar negatives are taken (``s`` is clamped to
    the number of negatives available to the row); ``k = synthetic`` new negatives
    ``h = a z_i + (1 - a) z_j`` (eq. 2) are mixed from random pairs of them (``i``, ``j`` drawn
    uniformly and independently, ``a ~ U(0, 1)``),
    re-normalised when ``normalize=True``, and added to the row's negatives, so ``N`` becomes
    ``N + k``. The extended set is then reweighted and debiased as in HCL
    (:func:`hard_negative_info_nce`).

    Differences from the paper's text, following the released code:

    * eq. 3 writes the weights unnormalised (``beta * exp(s / t)``); the released code applies
      the HCL estimator (weights ``exp(beta s / t)`` divided by their mean over the negatives),
      which keeps the loss on the HCL scale. This is what is computed here.
    * the released code has the mixing line disabled, so its "synthetic" negatives are copies of
      randomly resampled hard negatives; ``mix=False`` gives those values (``mix=True``, the
      default, is eq. 2), and with ``detach_synthetic=True`` also the released code's gradient.

    Gradients: by default they flow through the synthetic negatives into the embeddings they are
    mixed from. The released code builds them from detached keys, so only the anchor gets a
    gradient through a synthetic logit ``<q, stopgrad(h)> / t`` (``h`` normalised when
    ``normalize=True``); ``detach_synthetic=True`` does the same (same value, different
    gradient). ``detach_weights=True`` treats the HCL weights as constants, as in
    :func:`hard_negative_info_nce`.

    ``generator`` (on the inputs' device) makes the random pairs and ``a`` reproducible.
    ``synthetic = 0`` gives HCL. Other arguments and shapes as in :func:`info_nce`; ``hardest``
    and ``synthetic`` are integers >= 0.
    """
    _check_choice("reduction", reduction, _REDUCTIONS)
    tau_plus = _check_tau_plus(tau_plus)
    beta = _check_beta(beta)
    hardest, synthetic = _check_sscl(hardest, synthetic)
    core = _build_logits(
        anchor,
        positive,
        temperature=temperature,
        form=form,
        labels=labels,
        negatives=negatives,
        normalize=normalize,
        check_finite=check_finite,
    )
    blocks, added = [core.logits], 0
    if synthetic > 0:
        syn, added = _synthetic_logits(
            core, hardest, synthetic, mix, normalize, detach_synthetic, generator
        )
        if syn.shape[1]:
            blocks.append(syn)
    log_n = _log_num_neg(core, added)
    log_s = _log_negative_sum(blocks, log_n, beta, detach_weights)
    return _finish(core, _debias(log_s, core.log_pos, log_n, tau_plus, core.temperature), reduction)


# --------------------------------------------------------------------------- modules


class _ContrastiveLoss(nn.Module):
    """Holds the options shared by all losses; ``forward(anchor, positive, labels, negatives)``."""

    def __init__(
        self,
        temperature: float,
        form: Form,
        normalize: bool,
        reduction: Reduction,
        check_finite: bool,
    ) -> None:
        super().__init__()
        temperature = _check_temperature(temperature)
        _check_choice("form", form, _FORMS)
        _check_choice("reduction", reduction, _REDUCTIONS)
        self.temperature = float(temperature)
        self.form = form
        self.normalize = normalize
        self.reduction = reduction
        self.check_finite = check_finite

    def _common(self) -> dict:
        return {
            "temperature": self.temperature,
            "form": self.form,
            "normalize": self.normalize,
            "reduction": self.reduction,
            "check_finite": self.check_finite,
        }

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._hparams().items())

    def _hparams(self) -> dict:
        return {"temperature": self.temperature, "form": self.form}

    def _options(self) -> dict:
        """Loss-specific keyword arguments of ``_loss``."""
        return {}

    def forward(
        self,
        anchor: Tensor,
        positive: Tensor,
        labels: Tensor | None = None,
        negatives: Tensor | None = None,
    ) -> Tensor:
        return self._loss(anchor, positive, labels=labels, negatives=negatives, **self._common(),
                          **self._options())


class InfoNCE(_ContrastiveLoss):
    """InfoNCE / NT-Xent module; see :func:`info_nce`.

    ``forward(anchor, positive, labels=None, negatives=None)`` with ``[B, d]`` views, optional
    ``[B]`` class labels and ``[m, d]`` extra negatives; lightly-style ``loss(out0, out1)`` works.
    """

    def __init__(
        self,
        temperature: float = 0.5,
        form: Form = "simclr",
        *,
        normalize: bool = True,
        reduction: Reduction = "mean",
        check_finite: bool = True,
    ) -> None:
        super().__init__(temperature, form, normalize, reduction, check_finite)

    _loss = staticmethod(info_nce)

    def _options(self) -> dict:
        return {}


class _DebiasedLoss(_ContrastiveLoss):
    """DCL / HCL modules: on the first forward with gradients, warn once if the debiasing floor
    takes at least half the rows (the loss is then ~0 and trains nothing; see
    :func:`debiased_floor_stats`). ``floor_fraction`` keeps that first batch's fraction."""

    floor_fraction: float | None = None

    def forward(
        self,
        anchor: Tensor,
        positive: Tensor,
        labels: Tensor | None = None,
        negatives: Tensor | None = None,
    ) -> Tensor:
        if self.floor_fraction is None and self.tau_plus > 0 and torch.is_grad_enabled():
            frac, tau_max = debiased_floor_stats(
                anchor, positive, temperature=self.temperature, tau_plus=self.tau_plus,
                beta=getattr(self, "beta", 0.0), form=self.form, labels=labels,
                negatives=negatives, normalize=self.normalize, check_finite=self.check_finite)
            self.floor_fraction = frac
            if frac >= 0.5:
                warnings.warn(
                    f"{type(self).__name__}: on {frac:.0%} of this batch's rows the debiased "
                    f"negative term is clamped to its floor N*exp(-1/temperature) (tau_plus * N * "
                    "pos >= the sum of negatives), so the loss is ~0 and gives almost no "
                    f"gradient: positives are far closer than negatives at temperature="
                    f"{self.temperature:g}. Lower tau_plus (={self.tau_plus:g}) below about "
                    f"{tau_max:.1e} or raise the temperature (the DCL / HCL papers use 0.5).",
                    UserWarning, stacklevel=4)  # the caller of module(...)
        return super().forward(anchor, positive, labels, negatives)


class DebiasedInfoNCE(_DebiasedLoss):
    """Debiased contrastive loss (DCL) module; see :func:`debiased_info_nce`.

    Warns once (first forward with gradients) when the debiasing floor takes most rows.
    """

    def __init__(
        self,
        temperature: float = 0.5,
        tau_plus: float = 0.1,
        *,
        form: Form = "simclr",
        normalize: bool = True,
        reduction: Reduction = "mean",
        check_finite: bool = True,
    ) -> None:
        super().__init__(temperature, form, normalize, reduction, check_finite)
        tau_plus = _check_tau_plus(tau_plus)
        self.tau_plus = float(tau_plus)

    def _hparams(self) -> dict:
        return {**super()._hparams(), "tau_plus": self.tau_plus}

    _loss = staticmethod(debiased_info_nce)

    def _options(self) -> dict:
        return {"tau_plus": self.tau_plus}


class HardNegativeInfoNCE(_DebiasedLoss):
    """Hard-negative contrastive loss (HCL) module; see :func:`hard_negative_info_nce`.

    Warns once (first forward with gradients) when the debiasing floor takes most rows.
    """

    def __init__(
        self,
        temperature: float = 0.5,
        tau_plus: float = 0.1,
        beta: float = 1.0,
        *,
        form: Form = "simclr",
        detach_weights: bool = False,
        normalize: bool = True,
        reduction: Reduction = "mean",
        check_finite: bool = True,
    ) -> None:
        super().__init__(temperature, form, normalize, reduction, check_finite)
        tau_plus = _check_tau_plus(tau_plus)
        beta = _check_beta(beta)
        self.tau_plus = float(tau_plus)
        self.beta = float(beta)
        self.detach_weights = detach_weights

    def _hparams(self) -> dict:
        return {**super()._hparams(), "tau_plus": self.tau_plus, "beta": self.beta}

    _loss = staticmethod(hard_negative_info_nce)

    def _options(self) -> dict:
        return {"tau_plus": self.tau_plus, "beta": self.beta,
                "detach_weights": self.detach_weights}


class SSCLLoss(_ContrastiveLoss):
    """SSCL module (synthetic hard negatives + HCL weights + debiasing); see :func:`sscl_loss`.

    ``generator`` (optional ``torch.Generator`` on the inputs' device) is used for every call, so
    a seeded generator makes a training run reproducible. ``detach_synthetic=True`` gives the
    released code's gradient (none through the synthetic negatives into their keys).
    """

    def __init__(
        self,
        temperature: float = 0.5,
        tau_plus: float = 0.1,
        beta: float = 1.0,
        hardest: int = 32,
        synthetic: int = 8,
        mix: bool = True,
        *,
        form: Form = "simclr",
        detach_weights: bool = False,
        detach_synthetic: bool = False,
        generator: torch.Generator | None = None,
        normalize: bool = True,
        reduction: Reduction = "mean",
        check_finite: bool = True,
    ) -> None:
        super().__init__(temperature, form, normalize, reduction, check_finite)
        tau_plus = _check_tau_plus(tau_plus)
        beta = _check_beta(beta)
        hardest, synthetic = _check_sscl(hardest, synthetic)
        self.tau_plus = float(tau_plus)
        self.beta = float(beta)
        self.hardest = hardest
        self.synthetic = synthetic
        self.mix = mix
        self.detach_weights = detach_weights
        self.detach_synthetic = detach_synthetic
        self.generator = generator

    def _hparams(self) -> dict:
        return {
            **super()._hparams(),
            "tau_plus": self.tau_plus,
            "beta": self.beta,
            "hardest": self.hardest,
            "synthetic": self.synthetic,
            "mix": self.mix,
            "detach_synthetic": self.detach_synthetic,
        }

    _loss = staticmethod(sscl_loss)

    def _options(self) -> dict:
        return {"tau_plus": self.tau_plus, "beta": self.beta, "hardest": self.hardest,
                "synthetic": self.synthetic, "mix": self.mix,
                "detach_weights": self.detach_weights,
                "detach_synthetic": self.detach_synthetic, "generator": self.generator}
