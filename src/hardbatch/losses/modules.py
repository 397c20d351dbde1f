"""The losses as ``torch.nn.Module`` classes, each holding one frozen options object.

A module calls its function of :mod:`.functional` with ``**module.options.kwargs()``. The options
classes nest like the losses (:class:`InfoNCEOptions` ⊂ :class:`DCLOptions` ⊂ :class:`HCLOptions`
⊂ :class:`SSCLOptions`), each adding the arguments of one step of
:func:`~hardbatch.losses.functional.contrastive_loss`. Every field is also an attribute of the
module: ``loss.temperature`` reads it, ``loss.generator = g`` replaces the options (checked
again). The fields with ``repr=True`` make the module's repr.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from .._validation import (
    check_beta,
    check_choice,
    check_synthetic,
    check_tau_plus,
    check_temperature,
)
from .core import FORMS, REDUCTIONS, Form, Reduction
from .functional import (
    debiased_floor_stats,
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)


@dataclass(frozen=True)
class InfoNCEOptions:
    """Options of :func:`~hardbatch.losses.info_nce` (checked; numbers stored as Python floats)."""

    temperature: float = 0.5
    form: Form = "simclr"
    normalize: bool = field(default=True, repr=False)
    reduction: Reduction = field(default="mean", repr=False)
    check_finite: bool = field(default=True, repr=False)
    gather: bool = field(default=False, repr=False)
    group: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name, value in self._checked().items():
            object.__setattr__(self, name, value)  # frozen: the checked values are stored once

    def _checked(self) -> dict[str, object]:
        """The checked values of the fields that a check converts; ``ValueError`` if one is bad."""
        temperature = check_temperature(self.temperature)
        check_choice("form", self.form, FORMS)
        check_choice("reduction", self.reduction, REDUCTIONS)
        if not isinstance(self.gather, bool):
            raise ValueError(f"gather must be True or False, got {self.gather!r}")  # noqa: TRY004
        return {"temperature": temperature}

    def kwargs(self) -> dict[str, object]:
        """The loss function's keyword arguments: every field by name, values as they are."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> str:
        """``name=value, ...`` of the fields with ``repr=True``: the module's ``extra_repr``."""
        return ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr
        )


@dataclass(frozen=True)
class DCLOptions(InfoNCEOptions):
    """Options of :func:`~hardbatch.losses.debiased_info_nce`: InfoNCE's and ``tau_plus``."""

    tau_plus: float = 0.1

    def _checked(self) -> dict[str, object]:
        return {**super()._checked(), "tau_plus": check_tau_plus(self.tau_plus)}


@dataclass(frozen=True)
class HCLOptions(DCLOptions):
    """Options of :func:`~hardbatch.losses.hard_negative_info_nce`: DCL's and the weights'."""

    beta: float = 1.0
    detach_weights: bool = field(default=False, repr=False)

    def _checked(self) -> dict[str, object]:
        return {**super()._checked(), "beta": check_beta(self.beta)}


@dataclass(frozen=True)
class SSCLOptions(HCLOptions):
    """Options of :func:`~hardbatch.losses.sscl_loss`: HCL's and the synthetic negatives'."""

    hardest: int = 32
    synthetic: int = 8
    mix: bool = True
    detach_synthetic: bool = False
    generator: torch.Generator | None = field(default=None, repr=False)

    def _checked(self) -> dict[str, object]:
        out = super()._checked()
        out["hardest"], out["synthetic"] = check_synthetic(self.hardest, self.synthetic)
        return out


class _Option:
    """The module attribute of one options field; assigning it replaces the module's options."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, module: _ContrastiveLoss | None, owner: type | None = None) -> object:
        return self if module is None else getattr(module.options, self.name)

    def __set__(self, module: _ContrastiveLoss, value: object) -> None:
        module.options = dataclasses.replace(module.options, **{self.name: value})


class _ContrastiveLoss(nn.Module):
    """``forward(anchor, positive, labels, negatives, false_negatives)`` =
    ``function(..., **options.kwargs())``."""

    Options: ClassVar[type[InfoNCEOptions]]
    function: ClassVar[Callable[..., Tensor]]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "Options" in cls.__dict__:
            for f in dataclasses.fields(cls.Options):
                setattr(cls, f.name, _Option(f.name))

    def __init__(self, options: InfoNCEOptions) -> None:
        super().__init__()
        self.options = options

    def extra_repr(self) -> str:
        return self.options.describe()

    def forward(self, anchor: Tensor, positive: Tensor, labels: Tensor | None = None,
                negatives: Tensor | None = None, false_negatives: Tensor | None = None
                ) -> Tensor:
        return self.function(anchor, positive, labels=labels, negatives=negatives,
                             false_negatives=false_negatives, **self.options.kwargs())


class InfoNCE(_ContrastiveLoss):
    """InfoNCE / NT-Xent module; see :func:`~hardbatch.losses.info_nce`.

    ``forward(anchor, positive, labels=None, negatives=None, false_negatives=None)`` with
    ``[B, d]`` views, optional ``[B]`` class labels, ``[m, d]`` extra negatives and a bool
    ``[B, B]`` false-negative mask; lightly-style ``loss(out0, out1)`` works. ``gather=True``
    contrasts with every rank's batch (``group``: the process group); see
    :func:`~hardbatch.losses.info_nce`.
    """

    Options = InfoNCEOptions
    function = staticmethod(info_nce)

    def __init__(
        self, temperature: float = 0.5, form: Form = "simclr", *, normalize: bool = True,
        reduction: Reduction = "mean", check_finite: bool = True, gather: bool = False,
        group=None,
    ) -> None:
        super().__init__(InfoNCEOptions(temperature=temperature, form=form, normalize=normalize,
                                        reduction=reduction, check_finite=check_finite,
                                        gather=gather, group=group))


class _DebiasedLoss(_ContrastiveLoss):
    """DCL / HCL modules: on the first forward with gradients, warn once if the debiasing floor
    takes at least half the rows (the loss is then ~0 and trains nothing; see
    :func:`~hardbatch.losses.debiased_floor_stats`). ``floor_fraction`` keeps that first batch's
    fraction."""

    floor_fraction: float | None = None

    def forward(self, anchor: Tensor, positive: Tensor, labels: Tensor | None = None,
                negatives: Tensor | None = None, false_negatives: Tensor | None = None
                ) -> Tensor:
        opts = self.options
        if self.floor_fraction is None and opts.tau_plus > 0 and torch.is_grad_enabled():
            frac, tau_max = debiased_floor_stats(
                anchor, positive, temperature=opts.temperature, tau_plus=opts.tau_plus,
                beta=getattr(opts, "beta", 0.0), form=opts.form, labels=labels,
                negatives=negatives, normalize=opts.normalize, check_finite=opts.check_finite,
                false_negatives=false_negatives, gather=opts.gather, group=opts.group)
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
        return super().forward(anchor, positive, labels, negatives, false_negatives)


class DebiasedInfoNCE(_DebiasedLoss):
    """Debiased contrastive loss (DCL) module; see :func:`~hardbatch.losses.debiased_info_nce`.

    Warns once (first forward with gradients) when the debiasing floor takes most rows.
    """

    Options = DCLOptions
    function = staticmethod(debiased_info_nce)

    def __init__(
        self, temperature: float = 0.5, tau_plus: float = 0.1, *, form: Form = "simclr",
        normalize: bool = True, reduction: Reduction = "mean", check_finite: bool = True,
        gather: bool = False, group=None,
    ) -> None:
        super().__init__(DCLOptions(temperature=temperature, form=form, normalize=normalize,
                                    reduction=reduction, check_finite=check_finite,
                                    gather=gather, group=group, tau_plus=tau_plus))


class HardNegativeInfoNCE(_DebiasedLoss):
    """Hard-negative contrastive loss (HCL) module; see
    :func:`~hardbatch.losses.hard_negative_info_nce`.

    Warns once (first forward with gradients) when the debiasing floor takes most rows.
    """

    Options = HCLOptions
    function = staticmethod(hard_negative_info_nce)

    def __init__(
        self, temperature: float = 0.5, tau_plus: float = 0.1, beta: float = 1.0, *,
        form: Form = "simclr", detach_weights: bool = False, normalize: bool = True,
        reduction: Reduction = "mean", check_finite: bool = True, gather: bool = False,
        group=None,
    ) -> None:
        super().__init__(HCLOptions(temperature=temperature, form=form, normalize=normalize,
                                    reduction=reduction, check_finite=check_finite,
                                    gather=gather, group=group, tau_plus=tau_plus, beta=beta,
                                    detach_weights=detach_weights))


class SSCLLoss(_ContrastiveLoss):
    """SSCL module (synthetic hard negatives + HCL weights + debiasing); see
    :func:`~hardbatch.losses.sscl_loss`.

    ``generator`` (optional ``torch.Generator`` on the inputs' device) is used for every call, so
    a seeded generator makes a training run reproducible. ``detach_synthetic=True`` gives the
    released code's gradient (none through the synthetic negatives into their keys).
    """

    Options = SSCLOptions
    function = staticmethod(sscl_loss)

    def __init__(
        self, temperature: float = 0.5, tau_plus: float = 0.1, beta: float = 1.0,
        hardest: int = 32, synthetic: int = 8, mix: bool = True, *, form: Form = "simclr",
        detach_weights: bool = False, detach_synthetic: bool = False,
        generator: torch.Generator | None = None, normalize: bool = True,
        reduction: Reduction = "mean", check_finite: bool = True, gather: bool = False,
        group=None,
    ) -> None:
        super().__init__(SSCLOptions(
            temperature=temperature, form=form, normalize=normalize, reduction=reduction,
            check_finite=check_finite, gather=gather, group=group, tau_plus=tau_plus, beta=beta,
            detach_weights=detach_weights, hardest=hardest, synthetic=synthetic, mix=mix,
            detach_synthetic=detach_synthetic, generator=generator))
