"""The losses as functions: :func:`contrastive_loss`, the one estimator, and its four settings.

:func:`info_nce`, :func:`debiased_info_nce`, :func:`hard_negative_info_nce` and :func:`sscl_loss`
call :func:`contrastive_loss`, whose docstring states how they nest; :func:`debiased_floor_stats`
measures DCL / HCL's floor. Shapes and the common arguments are documented on :func:`info_nce`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_beta, check_choice, check_synthetic, check_tau_plus
from .core import (
    REDUCTIONS,
    Form,
    Reduction,
    build_logits,
    debias,
    finish,
    log_negative_sum,
    log_num_neg,
    without_autocast,
)
from .synthetic import synthetic_logits


@without_autocast
def contrastive_loss(
    anchor: Tensor,
    positive: Tensor,
    *,
    temperature: float = 0.5,
    tau_plus: float | None = None,
    beta: float = 0.0,
    detach_weights: bool = False,
    hardest: int = 0,
    synthetic: int = 0,
    mix: bool = True,
    detach_synthetic: bool = False,
    generator: torch.Generator | None = None,
    form: Form = "simclr",
    labels: Tensor | None = None,
    negatives: Tensor | None = None,
    normalize: bool = True,
    reduction: Reduction = "mean",
    check_finite: bool = True,
    false_negatives: Tensor | None = None,
    gather: bool = False,
    group=None,
) -> Tensor:
    """The general loss ``-log(pos / (pos + Ng))`` (BatchSampler eq. 16-18, SSCL eq. 2-4).

    The negative term ``Ng`` of each row is built in three steps, each off by default:

    1. ``synthetic = k > 0``: ``k`` synthetic negatives mixed from the row's ``hardest`` most
       similar ones join its negatives (SSCL eq. 2), so ``N`` becomes ``N + k``.
    2. ``S = sum_j w_ij neg_ij`` with the HCL weights
       ``w_ij = exp(beta s_ij / t) / mean_j exp(beta s_ij / t)``; ``beta = 0`` gives ``w = 1``.
    3. ``tau_plus`` a number in ``[0, 1)``: DCL's debiasing and floor,
       ``Ng = max((S - tau_plus N pos) / (1 - tau_plus), N e^(-1/t))``; ``tau_plus=None``:
       ``Ng = S``.

    The named losses are these settings, literally (same values and gradients bit for bit):

    * :func:`info_nce`: ``tau_plus=None``, ``beta=0``, ``synthetic=0``.
    * :func:`debiased_info_nce` (DCL): ``tau_plus`` given, ``beta=0``, ``synthetic=0``.
    * :func:`hard_negative_info_nce` (HCL): ``tau_plus``, ``beta``, ``detach_weights``,
      ``synthetic=0``.
    * :func:`sscl_loss`: every argument.

    So ``sscl_loss(synthetic=0)`` is HCL and HCL with ``beta=0`` is DCL. DCL with ``tau_plus=0``
    is InfoNCE except for the floor, ``Ng = max(S, N e^(-1/t))``: with ``normalize=True`` every
    logit is ``>= -1/t``, so ``S >= N e^(-1/t)`` and the floor never binds (up to rounding);
    with raw embeddings it can. ``detach_weights`` (step 2) and ``detach_synthetic``, ``mix``,
    ``generator`` (step 1) are described on :func:`hard_negative_info_nce` and :func:`sscl_loss`;
    the other arguments and the shapes on :func:`info_nce`.
    """
    check_choice("reduction", reduction, REDUCTIONS)
    tau_plus = None if tau_plus is None else check_tau_plus(tau_plus)
    beta = check_beta(beta)
    hardest, synthetic = check_synthetic(hardest, synthetic)
    core = build_logits(anchor, positive, temperature=temperature, form=form, labels=labels,
                        negatives=negatives, normalize=normalize, check_finite=check_finite,
                        false_negatives=false_negatives, gather=gather, group=group)
    blocks, added = [core.logits], 0
    if synthetic > 0:
        syn, added = synthetic_logits(
            core, hardest, synthetic, mix, normalize, detach_synthetic, generator
        )
        if syn.shape[1]:
            blocks.append(syn)
    log_n = log_num_neg(core, added)
    log_ng = log_negative_sum(blocks, log_n, beta, detach_weights)
    if tau_plus is not None:
        log_ng = debias(log_ng, core.log_pos, log_n, tau_plus, core.temperature)
    return finish(core, log_ng, reduction)


def info_nce(
    anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, form: Form = "simclr",
    labels: Tensor | None = None, negatives: Tensor | None = None, normalize: bool = True,
    reduction: Reduction = "mean", check_finite: bool = True,
    false_negatives: Tensor | None = None, gather: bool = False, group=None,
) -> Tensor:
    """InfoNCE / NT-Xent: ``-log(pos / (pos + sum_j neg_ij))`` (BatchSampler eq. 16 and 17).

    Args:
        anchor, positive: ``[B, d]`` embeddings of the two views; row ``i`` is a positive pair.
        temperature: ``t > 0``; logits are ``cos / t``.
        form: ``"simclr"`` (``2B`` anchors, ``2B - 2`` negatives each, eq. 16) or ``"simcse"``
            (``B`` anchors against the ``B`` positives, ``B - 1`` negatives each, eq. 17).
        labels: optional ``[B]`` class labels; items sharing the anchor's label are not negatives.
        negatives: optional ``[m, d]`` extra negatives appended for every anchor (memory bank);
            never masked by ``labels`` or ``false_negatives``.
        normalize: L2-normalise the embeddings first (cosine similarity; scale-safe).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (per-row ``[2B]`` simclr / ``[B]`` simcse).
        check_finite: raise ``ValueError`` on NaN / inf inputs (one device sync on GPU).
        false_negatives: optional bool ``[B, B]``, True where item ``j`` is not a negative of
            anchor ``i`` (e.g. :func:`~hardbatch.losses.guided_mask`); in the SimCLR form both
            views of ``j`` leave both rows of ``i`` (``i`` and ``B + i``). It generalises
            ``labels`` (``M[i, j] = labels[i] == labels[j]``); with both, their union. The
            diagonal is ignored: the positive pair always stays the positive. ``N`` then varies
            per row (DCL / HCL) and SSCL picks its hardest among the remaining negatives.
        gather: all-gather the embeddings (with gradient), ``negatives`` and ``labels`` from
            every rank of ``group`` (default: the default process group): this rank's rows are
            contrasted with the global batch (the ranks' batches concatenated in rank order; they
            may differ in size). ``false_negatives`` is then ``[b, B_global]``. The value is
            scaled so that DDP's averaged gradient is the global batch's gradient (see
            docs/losses.md, "Gathered negatives"). Without an initialised process group it does
            nothing (one warning). Every rank must call the loss, and its backward, together.
        group: the process group of ``gather`` (None: the default group).

    Returns:
        The loss, a scalar or ``[R]`` for ``reduction="none"``.
    """
    return contrastive_loss(anchor, positive, temperature=temperature, form=form, labels=labels,
                            negatives=negatives, normalize=normalize, reduction=reduction,
                            check_finite=check_finite, false_negatives=false_negatives,
                            gather=gather, group=group)


def debiased_info_nce(
    anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, tau_plus: float = 0.1,
    form: Form = "simclr", labels: Tensor | None = None, negatives: Tensor | None = None,
    normalize: bool = True, reduction: Reduction = "mean", check_finite: bool = True,
    false_negatives: Tensor | None = None, gather: bool = False, group=None,
) -> Tensor:
    """Debiased contrastive loss (DCL, Chuang et al. 2020; BatchSampler eq. 18 with ``lambda = 1``).

    ``Ng = max((sum_j neg_ij - tau_plus N pos) / (1 - tau_plus), N e^(-1/t))`` and the loss is
    ``-log(pos / (pos + Ng))``, with ``N`` the number of negatives of the row (it varies per row
    when ``labels`` mask some). ``tau_plus = 0`` gives InfoNCE (for normalised inputs the clamp is
    then never active). Other arguments and shapes as in :func:`info_nce`.
    """
    return contrastive_loss(anchor, positive, temperature=temperature, tau_plus=tau_plus,
                            form=form, labels=labels, negatives=negatives, normalize=normalize,
                            reduction=reduction, check_finite=check_finite,
                            false_negatives=false_negatives, gather=gather, group=group)


def hard_negative_info_nce(
    anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, tau_plus: float = 0.1,
    beta: float = 1.0, detach_weights: bool = False, form: Form = "simclr",
    labels: Tensor | None = None, negatives: Tensor | None = None, normalize: bool = True,
    reduction: Reduction = "mean", check_finite: bool = True,
    false_negatives: Tensor | None = None, gather: bool = False, group=None,
) -> Tensor:
    """Hard-negative contrastive loss (HCL, Robinson et al. 2021; BatchSampler eq. 18).

    Importance weights ``w_ij = exp(beta s_ij / t) / mean_j exp(beta s_ij / t)`` (mean over the
    row's negatives) reweight the negatives, ``S = sum_j w_ij neg_ij``, which is then debiased and
    clamped as in :func:`debiased_info_nce`. As in the authors' code, gradients flow through the
    weights; ``detach_weights=True`` treats them as constants (same value, different gradient).
    ``beta = 0`` gives DCL. Other arguments and shapes as in :func:`info_nce`.
    """
    return contrastive_loss(anchor, positive, temperature=temperature, tau_plus=tau_plus,
                            beta=beta, detach_weights=detach_weights, form=form, labels=labels,
                            negatives=negatives, normalize=normalize, reduction=reduction,
                            check_finite=check_finite, false_negatives=false_negatives,
                            gather=gather, group=group)


def sscl_loss(
    anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, tau_plus: float = 0.1,
    beta: float = 1.0, hardest: int = 32, synthetic: int = 8, mix: bool = True,
    detach_weights: bool = False, detach_synthetic: bool = False,
    generator: torch.Generator | None = None, form: Form = "simclr",
    labels: Tensor | None = None, negatives: Tensor | None = None, normalize: bool = True,
    reduction: Reduction = "mean", check_finite: bool = True,
    false_negatives: Tensor | None = None, gather: bool = False, group=None,
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
    return contrastive_loss(anchor, positive, temperature=temperature, tau_plus=tau_plus,
                            beta=beta, detach_weights=detach_weights, hardest=hardest,
                            synthetic=synthetic, mix=mix, detach_synthetic=detach_synthetic,
                            generator=generator, form=form, labels=labels, negatives=negatives,
                            normalize=normalize, reduction=reduction, check_finite=check_finite,
                            false_negatives=false_negatives, gather=gather, group=group)


@without_autocast
def debiased_floor_stats(
    anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, tau_plus: float = 0.1,
    beta: float = 0.0, form: Form = "simclr", labels: Tensor | None = None,
    negatives: Tensor | None = None, normalize: bool = True, check_finite: bool = True,
    false_negatives: Tensor | None = None, gather: bool = False, group=None,
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
    tau_plus = check_tau_plus(tau_plus)
    beta = check_beta(beta)
    with torch.no_grad():
        core = build_logits(anchor, positive, temperature=temperature, form=form, labels=labels,
                            negatives=negatives, normalize=normalize, check_finite=check_finite,
                            false_negatives=false_negatives, gather=gather, group=group)
        log_n = log_num_neg(core)
        log_s = log_negative_sum([core.logits], log_n, beta, True)
        log_ng = debias(log_s, core.log_pos, log_n, tau_plus, core.temperature)
        floored = log_ng <= log_n - 1.0 / core.temperature
        log_max = log_s - core.log_pos - log_n
        if core.has_neg is not None:
            floored, log_max = floored[core.has_neg], log_max[core.has_neg]
        if floored.numel() == 0:
            return 0.0, float("nan")
        return float(floored.float().mean()), float(log_max.median().exp())
