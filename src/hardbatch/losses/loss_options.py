"""The options of the losses, each declared once: name, type, default and check (:func:`option`).

An options class, a frozen dataclass of them, is checked once when made: a loss function makes
one per call from its arguments (:meth:`LossOptions.of`), a module holds one. The classes nest
like the losses (:class:`InfoNCEOptions` ⊂ :class:`DCLOptions` ⊂ :class:`HCLOptions` ⊂
:class:`SSCLOptions`); a class without a step reads the value that leaves it out from
:class:`LossOptions` (:data:`OFF`). The loss functions and modules restate each option's name,
type and default in their signatures, so that readers, IDEs and type checkers see them
(``tests/hardbatch/losses/test_typing.py`` checks that they agree with these declarations), and
document them in their docstrings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from .._validation import (
    check_beta,
    check_choice,
    check_generator,
    check_synthetic,
    check_tau_plus,
    check_temperature,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

Form = Literal["simclr", "simcse"]
Reduction = Literal["mean", "sum", "none"]
FORMS = ("simclr", "simcse")
REDUCTIONS = ("mean", "sum", "none")

_Options = TypeVar("_Options", bound="LossOptions")


def option(default: Any, check: Callable[[Any], Any] | None = None, *, shown: bool = True) -> Any:
    """One option as a dataclass field: its ``default``, its ``check`` (value -> the value to
    store, or None to keep it; a ``ValueError`` that names the option and the fix) and whether it
    is ``shown`` in the module's repr."""
    return field(default=default, repr=shown, metadata={"check": check})


def _flag(name: str) -> Callable[[object], None]:
    """The check of the on/off option ``name``: True or False only (a string such as
    ``"False"`` or a number such as ``0.5`` would otherwise be read by its truth value)."""
    def check(value: object) -> None:
        if not isinstance(value, bool):
            raise ValueError(  # noqa: TRY004
                f"{name} must be True or False, got {value!r}; pass a Python bool")
    return check


class LossOptions:
    """Base of the options classes: the checks, the module repr, and the values that leave the
    steps of :func:`~hardbatch.losses.functional.contrastive_loss` out (read by a class without
    the step: ``InfoNCEOptions().tau_plus`` is None)."""

    tau_plus: float | None = None
    beta: float = 0.0
    detach_weights: bool = False
    hardest: int = 0
    synthetic: int = 0

    def __post_init__(self) -> None:
        cls = type(self)
        if "_checks" not in cls.__dict__:  # listed at a class's first instance
            cls._checks = [(f.name, f.metadata["check"]) for f in dataclasses.fields(cls)
                           if f.metadata["check"] is not None]
        for name, check in cls._checks:
            value = check(getattr(self, name))
            if value is not None:
                object.__setattr__(self, name, value)  # frozen: the checked value, stored once

    @classmethod
    def of(cls: type[_Options], arguments: Mapping[str, Any]) -> _Options:
        """The checked options of a loss's ``arguments`` (its ``locals()``): every field found
        there, the others at their defaults.

        Example:
            >>> from hardbatch.losses.loss_options import DCLOptions
            >>> DCLOptions.of({"temperature": 0.2, "anchor": None}).temperature
            0.2
        """
        return cls(**{f.name: arguments[f.name] for f in dataclasses.fields(cls)
                      if f.name in arguments})

    def kwargs(self) -> dict[str, object]:
        """The loss function's keyword arguments: every field by name, values as they are."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> str:
        """``name=value, ...`` of the fields with ``repr=True``: the module's ``extra_repr``."""
        return ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                         for f in dataclasses.fields(self) if f.repr)


#: The values that leave the steps out: :func:`~hardbatch.losses.functional.contrastive_loss`'s
#: defaults.
OFF = {name: getattr(LossOptions, name)
       for name in ("tau_plus", "beta", "detach_weights", "hardest", "synthetic")}


@dataclass(frozen=True)
class InfoNCEOptions(LossOptions):
    """Options of :func:`~hardbatch.losses.info_nce` and :class:`~hardbatch.losses.InfoNCE`.

    Example:
        >>> from hardbatch.losses.loss_options import InfoNCEOptions
        >>> InfoNCEOptions(temperature=0.1, form="simcse")
        InfoNCEOptions(temperature=0.1, form='simcse')
        >>> InfoNCEOptions(form="moco")
        Traceback (most recent call last):
        ...
        ValueError: unknown form 'moco'; use one of 'simclr', 'simcse'
    """

    temperature: float = option(0.5, check_temperature)
    form: Form = option("simclr", partial(check_choice, "form", choices=FORMS))
    normalize: bool = option(True, _flag("normalize"), shown=False)
    reduction: Reduction = option(
        "mean", partial(check_choice, "reduction", choices=REDUCTIONS), shown=False)
    check_finite: bool = option(True, _flag("check_finite"), shown=False)
    gather: bool = option(False, _flag("gather"), shown=False)
    group: ProcessGroup | None = option(None, shown=False)


@dataclass(frozen=True)
class DCLOptions(InfoNCEOptions):
    """Options of :func:`~hardbatch.losses.debiased_info_nce`: InfoNCE's and ``tau_plus``.

    Example:
        >>> from hardbatch.losses.loss_options import DCLOptions
        >>> DCLOptions(tau_plus=0.05).tau_plus, DCLOptions().beta  # no HCL weights
        (0.05, 0.0)
    """

    tau_plus: float | None = option(
        0.1, lambda value: value if value is None else check_tau_plus(value))


@dataclass(frozen=True)
class HCLOptions(DCLOptions):
    """Options of :func:`~hardbatch.losses.hard_negative_info_nce`: DCL's and the weights'.

    Example:
        >>> from hardbatch.losses.loss_options import HCLOptions
        >>> HCLOptions(beta=0.5)
        HCLOptions(temperature=0.5, form='simclr', tau_plus=0.1, beta=0.5)
    """

    beta: float = option(1.0, check_beta)
    detach_weights: bool = option(False, _flag("detach_weights"), shown=False)


@dataclass(frozen=True)
class SSCLOptions(HCLOptions):
    """Options of :func:`~hardbatch.losses.sscl_loss`: HCL's and the synthetic negatives'.

    Example:
        >>> from hardbatch.losses.loss_options import SSCLOptions
        >>> SSCLOptions(hardest=4, synthetic=2).hardest
        4
        >>> SSCLOptions(synthetic=-1)
        Traceback (most recent call last):
        ...
        ValueError: synthetic=-1 must be >= 0
    """

    hardest: int = option(32)  # checked with synthetic, in __post_init__
    synthetic: int = option(8)
    mix: bool = option(True, _flag("mix"))
    detach_synthetic: bool = option(False, _flag("detach_synthetic"))
    generator: torch.Generator | None = option(None, check_generator, shown=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value in zip(("hardest", "synthetic"), check_synthetic(self.hardest,
                                                                          self.synthetic)):
            object.__setattr__(self, name, value)  # one rule of both
