"""The losses as functions: :func:`contrastive_loss`, the one estimator, and its four settings.

Each function checks its options once (it makes an options object of its arguments,
:mod:`.loss_options`) and computes the loss with :func:`~hardbatch.losses.core.compute_loss`, as a
module does with the options it holds; :func:`debiased_floor_stats` measures the floor of
DCL / HCL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .core import compute_loss, floor_stats
from .loss_options import DCLOptions, Form, HCLOptions, InfoNCEOptions, Reduction, SSCLOptions

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def info_nce(anchor: Tensor, positive: Tensor, *, temperature: float = 0.5,
             form: Form = "simclr", normalize: bool = True, reduction: Reduction = "mean",
             check_finite: bool = True, gather: bool = False, group: ProcessGroup | None = None,
             labels: Tensor | None = None, negatives: Tensor | None = None,
             false_negatives: Tensor | None = None) -> Tensor:
    """InfoNCE / NT-Xent: ``-log(pos / (pos + sum_j neg_ij))`` (BatchSampler eq. 16 and 17).

    Row ``i`` of ``anchor`` and of ``positive`` are two views of one item, a positive pair, and
    the other items' views are its negatives: with ``s`` the cosine similarities (``normalize``),
    ``pos = exp(s_i+ / t)`` and ``neg_ij = exp(s_ij / t)``. In the SimCLR form (NT-Xent) the
    ``2B`` views are all anchors, each with the ``2B - 2`` views of the other items as
    negatives; in the SimCSE form each of the ``B`` anchors is contrasted with the ``B``
    positives (``B - 1`` negatives): sentence-transformers' ``MultipleNegativesRankingLoss`` at
    ``scale = 1 / t``. Computed as ``softplus(logsumexp_j l_ij - l_i+)`` on the logits ``l``.

    Args:
        anchor, positive: ``[B, d]`` embeddings of the two views; ``B >= 2``, or ``B >= 1``
            with ``negatives`` (half precision is computed in float32, the loss returned in
            float32).
        temperature: ``t > 0``; the logits are ``cos / t`` (e.g. 0.5 for SimCLR, 0.05 for
            SimCSE).
        form: ``"simclr"`` (NT-Xent, eq. 16) or ``"simcse"`` (eq. 17), as above.
        normalize: L2-normalise the embeddings first (cosine similarity; scale-safe).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (the per-row losses).
        check_finite: raise ``ValueError`` on NaN / inf inputs (one device sync on GPU).
        gather: contrast this rank's rows with the global batch: the embeddings (with
            gradient), ``negatives`` and ``labels`` of every rank of ``group``, all-gathered
            (rank order, sizes may differ; ``false_negatives`` is then ``[b, B_global]``),
            scaled so that DDP's mean gradient is the global batch's (docs/losses.md). Without
            a process group: nothing (one warning). Every rank must call the loss, and its
            backward, together.
        group: the process group of ``gather`` (None: the default group).
        labels: optional ``[B]`` class labels (integer, bool or finite float); items sharing
            the anchor's label are not negatives.
        negatives: optional ``[m, d]`` extra negatives appended for every anchor (a memory
            bank, mined hard negatives); never masked by ``labels`` or ``false_negatives``.
        false_negatives: optional bool ``[B, B]``, True where item ``j`` is not a negative of
            anchor ``i`` (e.g. :func:`~hardbatch.losses.guided_mask`); in the SimCLR form both
            views of ``j`` leave both rows of ``i``. It generalises ``labels`` (``M[i, j] =
            labels[i] == labels[j]``); with both, their union. The diagonal is ignored.

    Returns:
        The loss: a scalar, or with ``reduction="none"`` the ``[2B]`` per-row losses of the
        SimCLR form (rows ``B..2B-1`` have the positives as anchors) or the ``[B]`` of the
        SimCSE form.

    References:
        Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations"
        (SimCLR), ICML 2020; Gao et al., "SimCSE: Simple Contrastive Learning of Sentence
        Embeddings", EMNLP 2021.

    Relations:
        :class:`~hardbatch.losses.InfoNCE` is this loss as a module;
        :func:`contrastive_loss` with every step off is this loss.

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
    options = InfoNCEOptions.of(locals())
    return compute_loss(options, anchor, positive, labels, negatives, false_negatives)


def debiased_info_nce(anchor: Tensor, positive: Tensor, *, temperature: float = 0.5,
                      form: Form = "simclr", normalize: bool = True,
                      reduction: Reduction = "mean", check_finite: bool = True,
                      gather: bool = False, group: ProcessGroup | None = None,
                      tau_plus: float | None = 0.1, labels: Tensor | None = None,
                      negatives: Tensor | None = None,
                      false_negatives: Tensor | None = None) -> Tensor:
    """Debiased contrastive loss (DCL; BatchSampler eq. 18 with ``lambda = 1``).

    InfoNCE whose negative term is corrected for the false negatives a uniform batch holds with
    probability ``tau_plus``: ``Ng = max((sum_j neg_ij - tau_plus N pos) / (1 - tau_plus),
    N e^(-1/t))``, ``N`` the row's negatives, and the loss ``-log(pos / (pos + Ng))``. On the
    floor ``N e^(-1/t)`` a row's loss is about 0 and trains nothing
    (:func:`debiased_floor_stats`).

    Args:
        anchor, positive, temperature, form, normalize, reduction, check_finite, gather,
            group, labels, negatives, false_negatives: as in :func:`info_nce`, which also
            gives the loss's shape.
        tau_plus: the class prior of false negatives in ``[0, 1)``; None: no debiasing,
            ``Ng = S``.

    References:
        Chuang et al., "Debiased Contrastive Learning", NeurIPS 2020.

    Relations:
        :class:`~hardbatch.losses.DebiasedInfoNCE` is this loss as a module;
        :func:`hard_negative_info_nce` with ``beta=0`` is this loss, bit for bit; with
        ``tau_plus=0`` it is :func:`info_nce` wherever the floor does not bind (always with
        ``normalize``).

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
    options = DCLOptions.of(locals())
    return compute_loss(options, anchor, positive, labels, negatives, false_negatives)


def hard_negative_info_nce(
        anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, form: Form = "simclr",
        normalize: bool = True, reduction: Reduction = "mean", check_finite: bool = True,
        gather: bool = False, group: ProcessGroup | None = None, tau_plus: float | None = 0.1,
        beta: float = 1.0, detach_weights: bool = False, labels: Tensor | None = None,
        negatives: Tensor | None = None, false_negatives: Tensor | None = None) -> Tensor:
    """Hard-negative contrastive loss (HCL; BatchSampler eq. 18).

    DCL over reweighted negatives: ``S = sum_j w_ij neg_ij`` with ``w_ij = exp(beta s_ij / t) /
    mean_j exp(beta s_ij / t)``, so the negatives most similar to the anchor weigh most, then
    debiased and clamped as in :func:`debiased_info_nce`.

    Args:
        anchor, positive, temperature, form, normalize, reduction, check_finite, gather,
            group, labels, negatives, false_negatives: as in :func:`info_nce` (and the loss's
            shape).
        tau_plus: the class prior of false negatives, as in :func:`debiased_info_nce`.
        beta: the hardness concentration ``>= 0``; 0: no reweighting (DCL).
        detach_weights: treat the weights as constants (same value, different gradient); by
            default, as in the authors' code, the gradient flows through them.

    Relations:
        :class:`~hardbatch.losses.HardNegativeInfoNCE` is this loss as a module. It is
        :func:`sscl_loss` with ``synthetic=0``, bit for bit.

    References:
        Robinson, Chuang, Sra and Jegelka, "Contrastive Learning with Hard Negative Samples",
        ICLR 2021.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> labels = torch.tensor([0, 0, 1, 2])  # item 1 is no negative of item 0
        >>> round(hb.hard_negative_info_nce(a, p, beta=1.0, labels=labels).item(), 4)
        2.4975
    """
    options = HCLOptions.of(locals())
    return compute_loss(options, anchor, positive, labels, negatives, false_negatives)


def sscl_loss(anchor: Tensor, positive: Tensor, *, temperature: float = 0.5,
              form: Form = "simclr", normalize: bool = True, reduction: Reduction = "mean",
              check_finite: bool = True, gather: bool = False,
              group: ProcessGroup | None = None, tau_plus: float | None = 0.1, beta: float = 1.0,
              detach_weights: bool = False, hardest: int = 32, synthetic: int = 8,
              mix: bool = True, detach_synthetic: bool = False,
              generator: torch.Generator | None = None, labels: Tensor | None = None,
              negatives: Tensor | None = None, false_negatives: Tensor | None = None) -> Tensor:
    """SSCL: synthetic hard negatives, reweighted and debiased (Dong et al., eq. 2-4).

    Each row gets ``k = synthetic`` more negatives ``h = a z_i + (1 - a) z_j`` (eq. 2; ``a ~
    U(0, 1)``, ``i``, ``j`` drawn uniformly and independently from its ``hardest`` most similar
    negatives, ``h`` re-normalised with ``normalize``), so ``N`` becomes ``N + k``; the extended
    set is reweighted and debiased as in :func:`hard_negative_info_nce`. Differences from the
    paper's text, following the released code: eq. 3's weights are divided by their mean (HCL's
    estimator and scale), and the released code's mixing line is disabled (``mix=False``).

    Args:
        anchor, positive, temperature, form, normalize, reduction, check_finite, gather,
            group, labels, negatives, false_negatives: as in :func:`info_nce`.
        tau_plus, beta, detach_weights: as in :func:`hard_negative_info_nce`.
        hardest: the ``s`` most similar negatives of a row that its synthetic negatives are
            mixed from (clamped to the row's negatives); an integer >= 1 when ``synthetic > 0``.
        synthetic: ``k``, the synthetic negatives of each row; an integer >= 0 (0: HCL).
        mix: mix ``h`` (eq. 2); False: copies of resampled hard negatives, the released
            code's values.
        detach_synthetic: treat ``h`` as a constant, as the released code does: only the
            anchor gets a gradient through a synthetic logit (same value, different gradient).
        generator: the ``torch.Generator`` (on the inputs' device) of the pairs and ``a``: a
            seeded one makes the synthetic negatives reproducible.

    Returns:
        The loss, shaped as :func:`info_nce`'s.

    References:
        Dong et al., "Synthetic Hard Negative Samples for Contrastive Learning" (SSCL),
        arXiv:2304.02971, 2023.

    Relations:
        :class:`~hardbatch.losses.SSCLLoss` is this loss as a module; with ``synthetic=0`` it is
        :func:`hard_negative_info_nce`, bit for bit.

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
    options = SSCLOptions.of(locals())
    return compute_loss(options, anchor, positive, labels, negatives, false_negatives)


def contrastive_loss(
        anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, form: Form = "simclr",
        normalize: bool = True, reduction: Reduction = "mean", check_finite: bool = True,
        gather: bool = False, group: ProcessGroup | None = None, tau_plus: float | None = None,
        beta: float = 0.0, detach_weights: bool = False, hardest: int = 0, synthetic: int = 0,
        mix: bool = True, detach_synthetic: bool = False,
        generator: torch.Generator | None = None, labels: Tensor | None = None,
        negatives: Tensor | None = None, false_negatives: Tensor | None = None) -> Tensor:
    """The general loss ``-log(pos / (pos + Ng))`` (BatchSampler eq. 16-18, SSCL eq. 2-4).

    The negative term ``Ng`` of each row is built in three steps, each off by default:

    1. ``synthetic = k > 0``: ``k`` synthetic negatives, mixed from the row's ``hardest`` most
       similar ones, join its negatives (SSCL eq. 2), so ``N`` becomes ``N + k``.
    2. ``S = sum_j w_ij neg_ij`` with the HCL weights of ``beta``; ``beta = 0`` gives ``w = 1``.
    3. ``tau_plus`` a number: DCL's debiasing and floor, ``Ng = max((S - tau_plus N pos) /
       (1 - tau_plus), N e^(-1/t))``; ``tau_plus=None``: ``Ng = S``.

    Args:
        anchor, positive, temperature, form, normalize, reduction, check_finite, gather, group,
            labels, negatives, false_negatives: as in :func:`info_nce`.
        tau_plus: step 3, as in :func:`debiased_info_nce` (None: off).
        beta, detach_weights: step 2, as in :func:`hard_negative_info_nce` (``beta=0``: off).
        hardest, synthetic, mix, detach_synthetic, generator: step 1, as in :func:`sscl_loss`
            (``synthetic=0``: off).

    Returns:
        The loss, shaped as :func:`info_nce`'s.

    Relations:
        The named losses are these settings, literally (same values and gradients bit for
        bit): :func:`info_nce` no step, :func:`debiased_info_nce` step 3,
        :func:`hard_negative_info_nce` steps 2-3, :func:`sscl_loss` all three. So
        ``sscl_loss(synthetic=0)`` is HCL, HCL with ``beta=0`` is DCL, and DCL with
        ``tau_plus=0`` is InfoNCE but for the floor ``N e^(-1/t)``, which binds only without
        ``normalize``.

    Example:
        >>> import torch
        >>> from hardbatch.losses.functional import contrastive_loss, debiased_info_nce
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(4, 8), torch.randn(4, 8)
        >>> round(contrastive_loss(a, p).item(), 4)  # every step off: InfoNCE
        2.3139
        >>> torch.equal(contrastive_loss(a, p, tau_plus=0.1), debiased_info_nce(a, p))
        True
        >>> contrastive_loss(a, p, beta=1.0, reduction="none").shape  # HCL's weights, no debiasing
        torch.Size([8])
    """
    options = SSCLOptions.of(locals())
    return compute_loss(options, anchor, positive, labels, negatives, false_negatives)


def debiased_floor_stats(
        anchor: Tensor, positive: Tensor, *, temperature: float = 0.5, form: Form = "simclr",
        normalize: bool = True, check_finite: bool = True, gather: bool = False,
        group: ProcessGroup | None = None, tau_plus: float | None = 0.1, beta: float = 0.0,
        labels: Tensor | None = None, negatives: Tensor | None = None,
        false_negatives: Tensor | None = None) -> tuple[float, float]:
    """How often DCL / HCL's negative term sits on its floor ``N e^(-1/t)``, for one batch.

    Returns ``(fraction, tau_plus_max)``: the fraction of rows (those with negatives) whose
    ``Ng`` in :func:`debiased_info_nce` / :func:`hard_negative_info_nce` (``beta``) is the clamp
    value, i.e. ``(S - tau_plus N pos) / (1 - tau_plus) <= N e^(-1/t)``, which holds exactly when
    ``tau_plus >= (S / N - e^(-1/t)) / (pos - e^(-1/t))`` (always below ``S / (N pos)``); such a
    row's loss is ``softplus(log N - 1/t - log pos)``, about 0 with almost no gradient.
    ``tau_plus_max`` is the (lower) median over rows of that bound: the ``tau_plus`` below which
    the median row is not clamped. The floor takes
    most rows when positives are far closer than negatives at a low temperature (SimCSE's dropout
    positives at ``t = 0.05``: BatchSampler paper, Appendix B.6). No gradient.

    Args:
        anchor, positive, temperature, form, normalize, check_finite, gather, group, labels,
            negatives, false_negatives: as in :func:`info_nce`.
        tau_plus: as in :func:`debiased_info_nce` (None counts as 0).
        beta: as in :func:`hard_negative_info_nce` (default 0: DCL).

    Returns:
        ``(fraction, tau_plus_max)``, two floats (``(0.0, nan)`` when no row has a negative).

    Relations:
        :class:`~hardbatch.losses.DebiasedInfoNCE` and
        :class:`~hardbatch.losses.HardNegativeInfoNCE` keep the fraction of their first
        training batch as ``floor_fraction`` and warn when it is 0.5 or more.

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
    options = HCLOptions.of(locals())
    return floor_stats(options, anchor, positive, labels, negatives, false_negatives)
