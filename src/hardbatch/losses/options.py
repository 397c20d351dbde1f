"""The options of the losses, each declared once: name, default, check and doc (:func:`option`).

An options class, a frozen dataclass of them, is checked once when made (a module holds one, a
function makes one per call); the classes nest like the losses (a class without a step reads its
:data:`OFF` values) and give the losses their signatures and ``Args`` (:func:`document`).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch

from .._validation import (
    check_beta,
    check_choice,
    check_generator,
    check_synthetic,
    check_tau_plus,
    check_temperature,
)

Form = Literal["simclr", "simcse"]
Reduction = Literal["mean", "sum", "none"]
FORMS = ("simclr", "simcse")
REDUCTIONS = ("mean", "sum", "none")

#: The per-batch inputs of every loss (``forward``'s arguments of the modules), documented once.
INPUTS = {
    "anchor, positive": "``[B, d]`` embeddings of the two views; row ``i`` is a positive pair.",
    "labels": "optional ``[B]`` class labels (integer, bool or finite float); items sharing the "
              "anchor's label are not negatives.",
    "negatives": "optional ``[m, d]`` extra negatives appended for every anchor (a memory bank, "
                 "mined hard negatives); never masked by ``labels`` or ``false_negatives``.",
    "false_negatives": "optional bool ``[B, B]``, True where item ``j`` is not a negative of "
                       "anchor ``i`` (e.g. :func:`~hardbatch.losses.guided_mask`); in the SimCLR "
                       "form both views of ``j`` leave both rows of ``i``. It generalises "
                       "``labels`` (``M[i, j] = labels[i] == labels[j]``); with both, their "
                       "union. The diagonal is ignored: the positive pair stays the positive.",
}


def option(default, doc: str, check: Callable | None = None, *, shown: bool = True,
           off=dataclasses.MISSING):
    """One option as a dataclass field: ``default``, ``doc`` (its ``Args`` entry), ``check``
    (value -> the value to store, or None to keep it; ``ValueError`` naming the option and the
    fix), ``shown`` in the module repr, and the ``off`` value that leaves its step out."""
    return field(default=default, repr=shown, metadata={"doc": doc, "check": check, "off": off})


def _flag(value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"gather must be True or False, got {value!r}")  # noqa: TRY004


class LossOptions:
    """Base of the options classes: the checks, the signatures and the module repr."""

    def __post_init__(self) -> None:
        cls = type(self)
        if "_checks" not in cls.__dict__:  # listed at a class's first instance
            cls._checks = [(f.name, f.metadata["check"]) for f in dataclasses.fields(cls)
                           if f.metadata["check"] is not None]
        for name, check in cls._checks:
            value = check(getattr(self, name))
            if value is not None:
                object.__setattr__(self, name, value)  # frozen: the checked value, stored once

    def kwargs(self) -> dict[str, object]:
        """The loss function's keyword arguments: every field by name, values as they are."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> str:
        """``name=value, ...`` of the fields with ``repr=True``: the module's ``extra_repr``."""
        return ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)

    @classmethod
    def parameters(cls, positional: tuple[str, ...] = (), *, defaults: dict | None = None,
                   drop: tuple[str, ...] = ()) -> list[inspect.Parameter]:
        """The options as parameters: ``positional`` first (in that order), then the others
        keyword-only, with their declared defaults or those in ``defaults``; less ``drop``."""
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in drop}
        defaults = {name: f.default for name, f in fields.items()} | (defaults or {})
        return [inspect.Parameter(
            name, inspect.Parameter.POSITIONAL_OR_KEYWORD if name in positional
            else inspect.Parameter.KEYWORD_ONLY, default=defaults[name],
            annotation=fields[name].type)
            for name in [*positional, *(n for n in fields if n not in positional)]]


def document(doc: str, options: type[LossOptions], drop: tuple[str, ...] = (),
             inputs: dict[str, str] | None = None) -> str:
    """``doc`` with its ``{args}`` line replaced by ``inputs`` and ``options`` but ``drop``."""
    entries = {**(inputs or {}), **{f.name: f.metadata["doc"] for f in dataclasses.fields(options)
                                    if f.name not in drop}}
    indent = re.search(r"^( *)\{args\}$", doc, re.MULTILINE).group(1)
    lines = [textwrap.fill(f"{name}: {text}", 99, initial_indent=indent,
                           subsequent_indent=indent + "    ") for name, text in entries.items()]
    return re.sub(r"^ *\{args\}$", lambda _: "\n".join(lines), doc, flags=re.MULTILINE)


@dataclass(frozen=True)
class InfoNCEOptions(LossOptions):
    """Options of :func:`~hardbatch.losses.info_nce` and :class:`~hardbatch.losses.InfoNCE`.

    Example:
        >>> from hardbatch.losses.options import InfoNCEOptions
        >>> InfoNCEOptions(temperature=0.1, form="simcse")
        InfoNCEOptions(temperature=0.1, form='simcse')
        >>> InfoNCEOptions(form="moco")
        Traceback (most recent call last):
        ...
        ValueError: unknown form 'moco'; use one of 'simclr', 'simcse'
    """

    temperature: float = option(
        0.5, "``t > 0``; the logits are ``cos / t`` (e.g. 0.5 for SimCLR, 0.05 for SimCSE).",
        check_temperature)
    form: Form = option(
        "simclr", '``"simclr"`` (NT-Xent, eq. 16: the ``2B`` views are all anchors, ``2B - 2`` '
        'negatives each) or ``"simcse"`` (eq. 17: ``B`` anchors against the ``B`` positives, '
        "``B - 1`` negatives each).", partial(check_choice, "form", choices=FORMS))
    normalize: bool = option(
        True, "L2-normalise the embeddings first (cosine similarity; scale-safe).", shown=False)
    reduction: Reduction = option(
        "mean", '``"mean"``, ``"sum"`` or ``"none"`` (per-row losses: ``[2B]`` in the SimCLR '
        "form, rows ``B..2B-1`` with the positives as anchors; ``[B]`` in the SimCSE form).",
        partial(check_choice, "reduction", choices=REDUCTIONS), shown=False)
    check_finite: bool = option(
        True, "raise ``ValueError`` on NaN / inf inputs (one device sync on GPU).", shown=False)
    gather: bool = option(
        False, "contrast this rank's rows with the global batch: the embeddings (with gradient), "
        "``negatives`` and ``labels`` of every rank of ``group``, all-gathered (rank order, sizes "
        "may differ; ``false_negatives`` is then ``[b, B_global]``), scaled so that DDP's mean "
        "gradient is the global batch's (docs/losses.md). Without a process group: nothing (one "
        "warning). Every rank must call the loss, and its backward, together.", _flag,
        shown=False)
    group: object = option(
        None, "the process group of ``gather`` (None: the default group).", shown=False)


@dataclass(frozen=True)
class DCLOptions(InfoNCEOptions):
    """Options of :func:`~hardbatch.losses.debiased_info_nce`: InfoNCE's and ``tau_plus``.

    Example:
        >>> from hardbatch.losses.options import DCLOptions
        >>> DCLOptions(tau_plus=0.05).tau_plus, DCLOptions().beta  # no HCL weights
        (0.05, 0.0)
    """

    tau_plus: float | None = option(
        0.1, "DCL's class prior of false negatives in ``[0, 1)``, ``Ng = max((S - tau_plus N "
        "pos) / (1 - tau_plus), N e^(-1/t))``; None: no debiasing, ``Ng = S``.",
        lambda value: value if value is None else check_tau_plus(value), off=None)


@dataclass(frozen=True)
class HCLOptions(DCLOptions):
    """Options of :func:`~hardbatch.losses.hard_negative_info_nce`: DCL's and the weights'.

    Example:
        >>> from hardbatch.losses.options import HCLOptions
        >>> HCLOptions(beta=0.5)
        HCLOptions(temperature=0.5, form='simclr', tau_plus=0.1, beta=0.5)
    """

    beta: float = option(
        1.0, "HCL's hardness concentration ``>= 0``: negative ``j`` is weighted by ``w_ij = "
        "exp(beta s_ij / t) / mean_j exp(beta s_ij / t)``; 0: no reweighting.", check_beta,
        off=0.0)
    detach_weights: bool = option(
        False, "treat the HCL weights as constants (same value, different gradient); by default, "
        "as in the authors' code, the gradient flows through them.", shown=False, off=False)


@dataclass(frozen=True)
class SSCLOptions(HCLOptions):
    """Options of :func:`~hardbatch.losses.sscl_loss`: HCL's and the synthetic negatives'.

    Example:
        >>> from hardbatch.losses.options import SSCLOptions
        >>> SSCLOptions(hardest=4, synthetic=2).hardest
        4
        >>> SSCLOptions(synthetic=-1)
        Traceback (most recent call last):
        ...
        ValueError: synthetic=-1 must be >= 0
    """

    hardest: int = option(
        32, "the ``s`` most similar negatives of a row that its synthetic negatives are mixed "
        "from (clamped to the row's negatives); an integer >= 1 when ``synthetic > 0``.",
        off=0)  # checked with synthetic, in __post_init__
    synthetic: int = option(
        8, "``k``, the synthetic negatives added to each row, so ``N`` becomes ``N + k``; an "
        "integer >= 0 (0: none, HCL).", off=0)
    mix: bool = option(
        True, "mix ``h = a z_i + (1 - a) z_j`` (eq. 2); False: copies of resampled hard "
        "negatives, the released code's values (its mixing line is disabled).")
    detach_synthetic: bool = option(
        False, "treat the synthetic negatives as constants, as the released code does: only "
        "the anchor gets a gradient through them (same value, different gradient).")
    generator: torch.Generator | None = option(
        None, "``torch.Generator`` (on the inputs' device) of the random pairs and ``a``, used "
        "for every call: a seeded one makes the synthetic negatives reproducible.",
        check_generator, shown=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value in zip(("hardest", "synthetic"), check_synthetic(self.hardest,
                                                                          self.synthetic)):
            object.__setattr__(self, name, value)  # one rule of both


#: The values that leave the steps out: ``contrastive_loss``'s defaults, read by a class without
#: the step (``InfoNCEOptions().tau_plus`` is None).
OFF = {f.name: f.metadata["off"] for f in dataclasses.fields(SSCLOptions)
       if f.metadata["off"] is not dataclasses.MISSING}
for _name, _value in OFF.items():
    setattr(LossOptions, _name, _value)
