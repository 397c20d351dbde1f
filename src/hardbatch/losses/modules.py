"""The losses as ``torch.nn.Module`` classes, each holding one frozen options object.

The constructor (signature and ``Args`` from :mod:`.options`) makes and checks it, ``forward``
computes with it unchecked. Every option is an attribute of the module (``loss.generator = g``
replaces the options, checked again); those with ``repr=True`` make the module's repr.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import ClassVar

import torch
from torch import Tensor, nn

from .functional import compute_loss, floor_stats
from .options import DCLOptions, HCLOptions, InfoNCEOptions, LossOptions, SSCLOptions, document


class _Option:
    """The module attribute of one options field; assigning it replaces the module's options."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, module: _ContrastiveLoss | None, owner: type | None = None) -> object:
        return self if module is None else getattr(module.options, self.name)

    def __set__(self, module: _ContrastiveLoss, value: object) -> None:
        module.options = dataclasses.replace(module.options, **{self.name: value})


def _constructor(cls: type[_ContrastiveLoss]) -> object:
    """``cls.__init__``: the options of ``cls.Options`` as parameters, ``cls.positional`` first."""
    signature = inspect.Signature(cls.Options.parameters(cls.positional))

    def __init__(self, *args, **kwargs) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{type(self).__name__}(): {exc}") from None
        super(cls, self).__init__()
        self.options = cls.Options(**bound.arguments)

    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    __init__.__signature__ = signature.replace(parameters=[me, *signature.parameters.values()])
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


class _ContrastiveLoss(nn.Module):
    """The loss of ``self.options``; a subclass names its ``Options`` and ``positional`` ones."""

    Options: ClassVar[type[LossOptions]]
    positional: ClassVar[tuple[str, ...]] = ()
    options: LossOptions

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "Options" in cls.__dict__:
            for f in dataclasses.fields(cls.Options):
                setattr(cls, f.name, _Option(f.name))
            cls.__init__ = _constructor(cls)
            cls.__doc__ = document(cls.__doc__, cls.Options)

    def extra_repr(self) -> str:
        return self.options.describe()

    def forward(self, anchor: Tensor, positive: Tensor, labels: Tensor | None = None,
                negatives: Tensor | None = None, false_negatives: Tensor | None = None
                ) -> Tensor:
        return compute_loss(self.options, anchor, positive, labels, negatives, false_negatives)


class InfoNCE(_ContrastiveLoss):
    """InfoNCE / NT-Xent (SimCLR; SimCSE with ``form="simcse"``) as a module.

    The loss of :func:`~hardbatch.losses.info_nce` on its inputs, ``loss(anchor, positive,
    labels=None, negatives=None, false_negatives=None)``; lightly-style ``loss(out0, out1)``.

    Args:
        {args}

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
    positional = ("temperature", "form")


class _DebiasedLoss(_ContrastiveLoss):
    """DCL / HCL: the first forward with gradients keeps its ``floor_fraction`` and warns when
    the debiasing floor takes half the rows or more (the loss is ~0 and trains nothing)."""

    floor_fraction: float | None = None

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
                    f"negative term is clamped to its floor N*exp(-1/temperature) (tau_plus * N * "
                    "pos >= the sum of negatives), so the loss is ~0 and gives almost no "
                    f"gradient: positives are far closer than negatives at temperature="
                    f"{opts.temperature:g}. Lower tau_plus (={opts.tau_plus:g}) below about "
                    f"{tau_max:.1e} or raise the temperature (the DCL / HCL papers use 0.5).",
                    UserWarning, stacklevel=4)  # the caller of module(...)
        return compute_loss(opts, anchor, positive, labels, negatives, false_negatives)


class DebiasedInfoNCE(_DebiasedLoss):
    """Debiased contrastive loss (DCL, Chuang et al. 2020) as a module.

    The loss of :func:`~hardbatch.losses.debiased_info_nce`, called as :class:`InfoNCE`. Warns
    once (first forward with gradients) when the debiasing floor takes most rows.

    Args:
        {args}

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
    positional = ("temperature", "tau_plus")


class HardNegativeInfoNCE(_DebiasedLoss):
    """Hard-negative contrastive loss (HCL, Robinson et al. 2021) as a module.

    The loss of :func:`~hardbatch.losses.hard_negative_info_nce`, called as :class:`InfoNCE`.
    Warns once (first forward with gradients) when the debiasing floor takes most rows.

    Args:
        {args}

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
    positional = ("temperature", "tau_plus", "beta")


class SSCLLoss(_ContrastiveLoss):
    """SSCL (synthetic hard negatives + HCL weights + debiasing, Dong et al.) as a module.

    The loss of :func:`~hardbatch.losses.sscl_loss`, called as :class:`InfoNCE`. Its
    ``generator`` is used for every call, so a seeded one makes a training run reproducible.

    Args:
        {args}

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
    positional = ("temperature", "tau_plus", "beta", "hardest", "synthetic", "mix")
