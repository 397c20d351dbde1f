"""The losses as ``torch.nn.Module`` classes, each holding one frozen options object.

The constructor makes and checks it (:mod:`.loss_options`), ``forward`` computes with it unchecked
(:func:`~hardbatch.losses.core.compute_loss`). Every option is an attribute of the module
(``loss.generator = g`` replaces the options, checked again); those with ``repr=True`` make the
module's repr.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

import torch
from torch import Tensor, nn

from .core import compute_loss, floor_stats
from .loss_options import DCLOptions, Form, HCLOptions, InfoNCEOptions, Reduction, SSCLOptions

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

_T = TypeVar("_T")


class _Option(Generic[_T]):
    """``loss.<name>``: that option of ``loss.options``; assigning it replaces the options (made
    and checked again, so a rejected value leaves them as they were)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, module: None, owner: type | None = None) -> _Option[_T]: ...
    @overload
    def __get__(self, module: _ContrastiveLoss, owner: type | None = None) -> _T: ...
    def __get__(self, module: _ContrastiveLoss | None, owner: type | None = None) -> Any:
        return self if module is None else getattr(module.options, self.name)

    def __set__(self, module: _ContrastiveLoss, value: _T) -> None:
        module.options = dataclasses.replace(module.options, **{self.name: value})


class _ContrastiveLoss(nn.Module):
    """A loss of ``options``: ``forward(anchor, positive, labels=None, negatives=None,
    false_negatives=None)``, the views positionally (lightly's ``loss(out0, out1)``)."""

    Options: ClassVar[type[InfoNCEOptions]]
    options: InfoNCEOptions
    temperature: _Option[float] = _Option()
    form: _Option[Form] = _Option()
    normalize: _Option[bool] = _Option()
    group: _Option[ProcessGroup | None] = _Option()
    reduction: _Option[Reduction] = _Option()
    check_finite: _Option[bool] = _Option()
    gather: _Option[bool] = _Option()

    def __init__(self, options: InfoNCEOptions) -> None:
        super().__init__()
        self.options = options

    def extra_repr(self) -> str:
        return self.options.describe()

    def forward(self, anchor: Tensor, positive: Tensor, labels: Tensor | None = None,
                negatives: Tensor | None = None, false_negatives: Tensor | None = None
                ) -> Tensor:
        return compute_loss(self.options, anchor, positive, labels, negatives, false_negatives)

    if TYPE_CHECKING:  # nn.Module.__call__ runs forward: typed as it, for type checkers
        __call__ = forward


class InfoNCE(_ContrastiveLoss):
    """InfoNCE / NT-Xent (SimCLR; SimCSE with ``form="simcse"``) as a module.

    :func:`~hardbatch.losses.info_nce` with its options fixed (and checked) when the module is
    made: ``-log(pos / (pos + sum_j neg_ij))`` for each anchor, its positive against the other
    items' views. ``InfoNCE(temperature=0.5)`` is lightly's ``NTXentLoss``;
    ``InfoNCE(1 / scale, "simcse")`` is sentence-transformers' ``MultipleNegativesRankingLoss``
    on embeddings.

    Args:
        temperature, form: positional, as in :func:`~hardbatch.losses.info_nce`.
        normalize, reduction, check_finite, gather, group: keyword-only, as in
            :func:`~hardbatch.losses.info_nce`.

    Inputs:
        ``loss(anchor, positive, labels=None, negatives=None, false_negatives=None)``: two
        ``[B, d]`` views (row ``i`` of each is a positive pair), optional ``[B]`` labels,
        ``[m, d]`` extra negatives and bool ``[B, B]`` false-negative mask, as in
        :func:`~hardbatch.losses.info_nce`. Returns a scalar, or ``[2B]`` (SimCLR) / ``[B]``
        (SimCSE) per-row losses with ``reduction="none"``.

    References:
        Chen et al. (SimCLR), ICML 2020; Gao et al. (SimCSE), EMNLP 2021.

    Example:
        >>> from hardbatch.losses import InfoNCE
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> anchor, positive = torch.randn(4, 8), torch.randn(4, 8)
        >>> loss = InfoNCE(temperature=0.5)
        >>> loss
        InfoNCE(temperature=0.5, form='simclr')
        >>> round(loss(anchor, positive).item(), 4)
        2.3139
        >>> InfoNCE(0.05, "simcse", reduction="none")(anchor, positive).shape
        torch.Size([4])
    """

    Options = InfoNCEOptions

    def __init__(self, temperature: float = 0.5, form: Form = "simclr", *,
                 normalize: bool = True, reduction: Reduction = "mean",
                 check_finite: bool = True, gather: bool = False,
                 group: ProcessGroup | None = None) -> None:
        super().__init__(InfoNCEOptions.of(locals()))


class _DebiasedLoss(_ContrastiveLoss):
    """DCL / HCL: the first forward with gradients keeps its ``floor_fraction`` and warns when
    the debiasing floor takes half the rows or more (the loss is ~0 and trains nothing)."""

    options: DCLOptions
    floor_fraction: float | None = None
    tau_plus: _Option[float | None] = _Option()

    def forward(self, anchor: Tensor, positive: Tensor, labels: Tensor | None = None,
                negatives: Tensor | None = None, false_negatives: Tensor | None = None
                ) -> Tensor:
        opts = self.options
        if self.floor_fraction is None and opts.tau_plus and torch.is_grad_enabled():
            frac, tau_max = floor_stats(opts, anchor, positive, labels, negatives,
                                        false_negatives)
            self.floor_fraction = frac
            if frac >= 0.5:
                warnings.warn(
                    f"{type(self).__name__}: on {frac:.0%} of this batch's rows the debiased "
                    f"negative term is clamped to its floor N*exp(-1/temperature) (the sum of "
                    "negatives minus tau_plus * N * pos falls below it), so the loss is ~0 and "
                    "gives almost no "
                    f"gradient: positives are far closer than negatives at temperature="
                    f"{opts.temperature:g}. Lower tau_plus (={opts.tau_plus:g}) below about "
                    f"{tau_max:.1e} or raise the temperature (the DCL / HCL papers use 0.5).",
                    UserWarning, stacklevel=4)  # the caller of module(...)
        return compute_loss(opts, anchor, positive, labels, negatives, false_negatives)


class DebiasedInfoNCE(_DebiasedLoss):
    """Debiased contrastive loss (DCL) as a module.

    :func:`~hardbatch.losses.debiased_info_nce` with its options fixed when the module is made,
    called as :class:`InfoNCE`. The first forward with gradients keeps ``floor_fraction`` (the
    share of rows on the debiasing floor, :func:`~hardbatch.losses.debiased_floor_stats`) and
    warns once when the floor takes most rows (the loss then trains nothing).

    Args:
        temperature, tau_plus: positional, as in :func:`~hardbatch.losses.debiased_info_nce`.
        form, normalize, reduction, check_finite, gather, group: keyword-only, as in
            :func:`~hardbatch.losses.info_nce`.

    References:
        Chuang et al., "Debiased Contrastive Learning", NeurIPS 2020.

    Example:
        >>> import hardbatch as hb
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> anchor, positive = torch.randn(4, 8), torch.randn(4, 8)
        >>> loss = hb.DebiasedInfoNCE(temperature=0.5, tau_plus=0.1)
        >>> round(loss(anchor, positive).item(), 4), loss.floor_fraction
        (2.3445, 0.0)
    """

    Options = DCLOptions

    def __init__(self, temperature: float = 0.5, tau_plus: float | None = 0.1, *,
                 form: Form = "simclr", normalize: bool = True,
                 reduction: Reduction = "mean", check_finite: bool = True,
                 gather: bool = False, group: ProcessGroup | None = None) -> None:
        super().__init__(DCLOptions.of(locals()))


class HardNegativeInfoNCE(_DebiasedLoss):
    """Hard-negative contrastive loss (HCL) as a module.

    :func:`~hardbatch.losses.hard_negative_info_nce` with its options fixed when the module is
    made, called as :class:`InfoNCE`; warns once, as :class:`DebiasedInfoNCE`, when the
    debiasing floor takes most rows.

    Args:
        temperature, tau_plus, beta: positional, as in
            :func:`~hardbatch.losses.hard_negative_info_nce`.
        form, normalize, reduction, check_finite, gather, group: keyword-only, as in
            :func:`~hardbatch.losses.info_nce`.
        detach_weights: keyword-only, as in :func:`~hardbatch.losses.hard_negative_info_nce`.

    References:
        Robinson et al., "Contrastive Learning with Hard Negative Samples", ICLR 2021.

    Example:
        >>> from hardbatch import HardNegativeInfoNCE
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> anchor, positive = torch.randn(2, 4, 8)  # two views of 4 items
        >>> loss = HardNegativeInfoNCE(temperature=0.5, tau_plus=0.1, beta=1.0)
        >>> round(loss(anchor, positive, labels=torch.tensor([0, 0, 1, 2])).item(), 4)
        2.4975
    """

    Options = HCLOptions
    options: HCLOptions
    beta: _Option[float] = _Option()
    detach_weights: _Option[bool] = _Option()

    def __init__(self, temperature: float = 0.5, tau_plus: float | None = 0.1,
                 beta: float = 1.0, *, form: Form = "simclr", normalize: bool = True,
                 reduction: Reduction = "mean", check_finite: bool = True,
                 gather: bool = False, group: ProcessGroup | None = None,
                 detach_weights: bool = False) -> None:
        super().__init__(HCLOptions.of(locals()))


class SSCLLoss(_ContrastiveLoss):
    """SSCL (synthetic hard negatives, HCL weights and debiasing) as a module.

    :func:`~hardbatch.losses.sscl_loss` with its options fixed when the module is made, called
    as :class:`InfoNCE`. Its ``generator`` is used for every call, so a seeded one makes a
    training run reproducible.

    Args:
        temperature, tau_plus, beta, hardest, synthetic, mix: positional, as in
            :func:`~hardbatch.losses.sscl_loss`.
        form, normalize, reduction, check_finite, gather, group: keyword-only, as in
            :func:`~hardbatch.losses.info_nce`.
        detach_weights, detach_synthetic, generator: keyword-only, as in
            :func:`~hardbatch.losses.sscl_loss`.

    References:
        Dong et al., "Synthetic Hard Negative Samples for Contrastive Learning" (SSCL),
        arXiv:2304.02971, 2023.

    Example:
        >>> from torch import Generator, manual_seed, randn
        >>> from hardbatch.losses import SSCLLoss
        >>> _ = manual_seed(0)
        >>> anchor, positive = randn(6, 8), randn(6, 8)
        >>> loss = SSCLLoss(hardest=4, synthetic=2, generator=Generator().manual_seed(0))
        >>> loss.hardest, loss.synthetic, loss.tau_plus
        (4, 2, 0.1)
        >>> round(loss(anchor, positive).item(), 4)
        3.1564
    """

    Options = SSCLOptions
    options: SSCLOptions
    tau_plus: _Option[float | None] = _Option()
    beta: _Option[float] = _Option()
    detach_weights: _Option[bool] = _Option()
    hardest: _Option[int] = _Option()
    generator: _Option[torch.Generator | None] = _Option()
    synthetic: _Option[int] = _Option()
    mix: _Option[bool] = _Option()
    detach_synthetic: _Option[bool] = _Option()

    def __init__(self, temperature: float = 0.5, tau_plus: float | None = 0.1,
                 beta: float = 1.0, hardest: int = 32, synthetic: int = 8, mix: bool = True, *,
                 form: Form = "simclr", normalize: bool = True, reduction: Reduction = "mean",
                 check_finite: bool = True, gather: bool = False,
                 group: ProcessGroup | None = None, detach_weights: bool = False,
                 detach_synthetic: bool = False, generator: torch.Generator | None = None
                 ) -> None:
        super().__init__(SSCLOptions.of(locals()))
