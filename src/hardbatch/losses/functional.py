"""The losses as functions: :func:`contrastive_loss`, the one estimator, and its four settings.

Each makes its options object (:mod:`.options`: its signature and ``Args``) and calls
:func:`compute_loss`, as a module does with its own; :func:`debiased_floor_stats` measures the
floor of DCL / HCL.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from .core import autocast_enabled, build_logits, debias, finish, log_negative_sum, log_num_neg
from .options import (
    INPUTS,
    OFF,
    DCLOptions,
    HCLOptions,
    InfoNCEOptions,
    LossOptions,
    SSCLOptions,
    document,
)
from .synthetic import synthetic_logits


def compute_loss(options: LossOptions, anchor: Tensor, positive: Tensor,
                 labels: Tensor | None = None, negatives: Tensor | None = None,
                 false_negatives: Tensor | None = None) -> Tensor:
    """The loss set by ``options`` (checked when made, not again) on one batch, as every loss
    function and module computes it; inputs as in :func:`info_nce`, autocast disabled.

    Example:
        >>> import torch
        >>> from hardbatch.losses.functional import compute_loss, info_nce
        >>> from hardbatch.losses.options import InfoNCEOptions
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
    log_n = log_num_neg(core, added)
    log_ng = log_negative_sum(blocks, log_n, options.beta, options.detach_weights)
    if options.tau_plus is not None:
        log_ng = debias(log_ng, core.log_pos, log_n, options.tau_plus, core.temperature)
    return finish(core, log_ng, options.reduction)


def floor_stats(options: LossOptions, anchor: Tensor, positive: Tensor,
                labels: Tensor | None = None, negatives: Tensor | None = None,
                false_negatives: Tensor | None = None) -> tuple[float, float]:
    """:func:`debiased_floor_stats` of an options object (``tau_plus=None`` counts as 0).

    Example:
        >>> import torch
        >>> from hardbatch.losses.functional import floor_stats
        >>> from hardbatch.losses.options import DCLOptions
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
        log_max = log_s - core.log_pos - log_n
        if core.has_neg is not None:
            floored, log_max = floored[core.has_neg], log_max[core.has_neg]
        if floored.numel() == 0:
            return 0.0, float("nan")
        return float(floored.float().mean()), float(log_max.median().exp())


def _from_options(options: type[LossOptions], run: Callable = compute_loss, *,
                  defaults: dict | None = None, drop: tuple[str, ...] = ()) -> Callable:
    """Decorator: the function ``stub`` names and documents, taking the inputs and the options
    (``defaults`` replaced, less ``drop``), returning ``run(options(**options), inputs...)``."""
    params = options.parameters(defaults=defaults, drop=drop)
    names = frozenset(p.name for p in params)
    defaults = {p.name: p.default for p in params} if defaults else None

    def decorate(stub: Callable) -> Callable:
        def fn(anchor: Tensor, positive: Tensor, *, labels: Tensor | None = None,
               negatives: Tensor | None = None, false_negatives: Tensor | None = None, **kwargs):
            if not names.issuperset(kwargs):
                raise TypeError(f"{fn.__name__}() got an unexpected keyword argument "
                                f"{min(kwargs.keys() - names)!r}")
            made = options(**kwargs) if defaults is None else options(**{**defaults, **kwargs})
            return run(made, anchor, positive, labels, negatives, false_negatives)

        inputs = list(inspect.signature(fn).parameters.values())[:-1]
        fn.__signature__ = inspect.Signature(
            inputs[:2] + params + inputs[2:], return_annotation=stub.__annotations__["return"])
        fn.__name__ = fn.__qualname__ = stub.__name__
        fn.__doc__ = document(stub.__doc__, options, drop, INPUTS)
        return fn

    return decorate


@_from_options(SSCLOptions, defaults=OFF)
def contrastive_loss() -> Tensor:
    """The general loss ``-log(pos / (pos + Ng))`` (BatchSampler eq. 16-18, SSCL eq. 2-4).

    The negative term ``Ng`` of each row is built in three steps, each off by default:

    1. ``synthetic = k > 0``: ``k`` synthetic negatives, mixed from the row's ``hardest`` most
       similar ones, join its negatives (SSCL eq. 2), so ``N`` becomes ``N + k``.
    2. ``S = sum_j w_ij neg_ij`` with the HCL weights of ``beta``; ``beta = 0`` gives ``w = 1``.
    3. ``tau_plus`` a number: DCL's debiasing and floor, ``Ng = max((S - tau_plus N pos) /
       (1 - tau_plus), N e^(-1/t))``; ``tau_plus=None``: ``Ng = S``.

    The named losses are these settings, literally (same values and gradients bit for bit):

    * :func:`info_nce`: ``tau_plus=None``, ``beta=0``, ``synthetic=0``.
    * :func:`debiased_info_nce` (DCL): ``tau_plus`` given, ``beta=0``, ``synthetic=0``.
    * :func:`hard_negative_info_nce` (HCL): ``tau_plus``, ``beta``, ``detach_weights``,
      ``synthetic=0``.
    * :func:`sscl_loss`: every argument.

    So ``sscl_loss(synthetic=0)`` is HCL, HCL with ``beta=0`` is DCL, and DCL with ``tau_plus=0``
    is InfoNCE but for the floor ``N e^(-1/t)``, which binds only without ``normalize``.

    Args:
        {args}

    Example:
        >>> import torch
        >>> from hardbatch.losses.functional import contrastive_loss, debiased_info_nce
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> round(contrastive_loss(a, p).item(), 4)  # every step off: InfoNCE
        2.3139
        >>> torch.equal(contrastive_loss(a, p, tau_plus=0.1), debiased_info_nce(a, p))
        True
    """


@_from_options(InfoNCEOptions)
def info_nce() -> Tensor:
    """InfoNCE / NT-Xent: ``-log(pos / (pos + sum_j neg_ij))`` (BatchSampler eq. 16 and 17).

    SimCLR's NT-Xent (Chen et al. 2020); with ``form="simcse"`` SimCSE's loss (Gao et al. 2021),
    sentence-transformers' ``MultipleNegativesRankingLoss``.

    Args:
        {args}

    Returns:
        The loss, a scalar or ``[R]`` for ``reduction="none"`` (``R = 2B`` or ``B``).

    Example:
        >>> import torch
        >>> from hardbatch.losses import info_nce
        >>> _ = torch.manual_seed(0)
        >>> anchor = torch.randn(4, 8, requires_grad=True)
        >>> positive = anchor.detach() + 0.5 * torch.randn(4, 8)  # a second view
        >>> loss = info_nce(anchor, positive, temperature=0.5)
        >>> round(loss.item(), 4)
        1.0538
        >>> info_nce(anchor, positive, form="simcse", reduction="none").shape
        torch.Size([4])
        >>> loss.backward()
        >>> anchor.grad.shape
        torch.Size([4, 8])
    """


@_from_options(DCLOptions)
def debiased_info_nce() -> Tensor:
    """Debiased contrastive loss (DCL, Chuang et al. 2020; BatchSampler eq. 18 with ``lambda = 1``).

    ``Ng = max((sum_j neg_ij - tau_plus N pos) / (1 - tau_plus), N e^(-1/t))``, the loss
    ``-log(pos / (pos + Ng))``, ``N`` the row's negatives. ``tau_plus = 0`` gives InfoNCE.

    Args:
        {args}

    Example:
        >>> import torch
        >>> from hardbatch.losses import debiased_info_nce, info_nce
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> round(debiased_info_nce(a, p, tau_plus=0.1).item(), 4)
        2.3445
        >>> torch.allclose(debiased_info_nce(a, p, tau_plus=0.0), info_nce(a, p))
        True
    """


@_from_options(HCLOptions)
def hard_negative_info_nce() -> Tensor:
    """Hard-negative contrastive loss (HCL, Robinson et al. 2021; BatchSampler eq. 18).

    The negatives reweighted by ``beta``, ``S = sum_j w_ij neg_ij``, then debiased and clamped as
    in :func:`debiased_info_nce`. ``beta = 0`` gives DCL.

    Args:
        {args}

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> labels = torch.tensor([0, 0, 1, 2])  # item 1 is no negative of item 0
        >>> round(hb.hard_negative_info_nce(a, p, beta=1.0, labels=labels).item(), 4)
        2.4975
    """


@_from_options(SSCLOptions)
def sscl_loss() -> Tensor:
    """SSCL: synthetic hard negatives, reweighted and debiased (Dong et al., eq. 2-4).

    Each row gets ``k = synthetic`` negatives ``h = a z_i + (1 - a) z_j`` (eq. 2; ``a ~ U(0, 1)``,
    ``i``, ``j`` drawn uniformly and independently from its ``hardest`` most similar negatives,
    ``h`` re-normalised with ``normalize``); the extended set is reweighted and debiased as in
    HCL (:func:`hard_negative_info_nce`), so ``synthetic = 0`` gives HCL.

    Differences from the paper's text, following the released code:

    * eq. 3 writes the weights unnormalised (``beta * exp(s / t)``); the released code, and this
      one, divide them by their mean over the negatives (HCL's estimator, HCL's scale).
    * the released code's mixing line is disabled: its "synthetic" negatives are copies of
      resampled hard negatives, ``mix=False`` (with ``detach_synthetic=True``, also its gradient).

    Gradients flow through the synthetic negatives into the embeddings they are mixed from; the
    released code's, through ``<q, stopgrad(h)> / t`` to the anchor only: ``detach_synthetic``.

    Args:
        {args}

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> from hardbatch.losses import sscl_loss
        >>> a, p = torch.randn(6, 8), torch.randn(6, 8)
        >>> seeded = torch.Generator().manual_seed(0)
        >>> loss = sscl_loss(a, p, hardest=4, synthetic=2, generator=seeded)
        >>> round(loss.item(), 4)
        3.1564
    """


@_from_options(HCLOptions, floor_stats, defaults={"beta": OFF["beta"]},
               drop=("reduction", "detach_weights"))
def debiased_floor_stats() -> tuple[float, float]:
    """How often DCL / HCL's negative term sits on its floor ``N e^(-1/t)``, for one batch.

    Returns ``(fraction, tau_plus_max)``: the fraction of rows (those with negatives) whose
    ``Ng`` in :func:`debiased_info_nce` / :func:`hard_negative_info_nce` (``beta``) is the clamp
    value, i.e. ``tau_plus N pos >= S``; such a row's loss is ``softplus(log N - 1/t - log pos)``,
    about 0 with almost no gradient. ``tau_plus_max`` is the (lower) median over rows of
    ``S / (N pos)``: the ``tau_plus`` below which the median row is not clamped. The floor takes
    most rows when positives are far closer than negatives at a low temperature (SimCSE's dropout
    positives at ``t = 0.05``: BatchSampler paper, Appendix B.6). No gradient.

    Args:
        {args}

    Example:
        >>> import torch
        >>> from hardbatch import debiased_floor_stats
        >>> _ = torch.manual_seed(0)
        >>> a = torch.randn(8, 16)
        >>> close = a + 0.01 * torch.randn(8, 16)  # positives far closer than the negatives
        >>> fraction, tau_max = debiased_floor_stats(a, close, temperature=0.05, tau_plus=0.1)
        >>> fraction, tau_max < 1e-6  # every row clamped: lower tau_plus below tau_max
        (1.0, True)
    """
