"""The one table of sampler and loss names, and the factories every command, recipe and
integration builds them with.

Names: samplers ``uniform``, ``knn``, ``proximity``, ``gcbs``, ``cluster`` (TAS-B),
``community`` (B3); losses ``infonce``, ``dcl``,
``hcl``, ``sscl`` (``debiased`` and ``hard_negative`` are accepted aliases of ``dcl`` and
``hcl``). An unknown name raises one ``ValueError`` listing the valid names and aliases; an
unknown option names the option and the ones the sampler or loss accepts.

Example::

    import hardbatch as hb
    sampler = hb.registry.make_sampler("proximity", embeddings, 256, candidates=500,
                                       neighbors=50, refresh_every=None)
    loss = hb.registry.make_loss("dcl", temperature=0.5, tau_plus=0.1)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from torch import nn

from ._validation import num_items_of
from .losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss
from .samplers.options import sampler_parameters
from .samplers import ClusterBatchSampler, CommunityBatchSampler, GCBSSampler, KNNBatchSampler, \
    ProximityGraphSampler, UniformBatchSampler

__all__ = ["LOSS_ALIASES", "canonical_loss", "canonical_sampler", "loss_class", "loss_names",
           "make_loss", "make_sampler", "parse_names", "sampler_class", "sampler_names"]

_SAMPLERS: dict[str, type] = {
    "uniform": UniformBatchSampler,
    "knn": KNNBatchSampler,
    "proximity": ProximityGraphSampler,
    "gcbs": GCBSSampler,
    "cluster": ClusterBatchSampler,
    "community": CommunityBatchSampler,
}
_LOSSES: dict[str, type[nn.Module]] = {
    "infonce": InfoNCE,
    "dcl": DebiasedInfoNCE,
    "hcl": HardNegativeInfoNCE,
    "sscl": SSCLLoss,
}
LOSS_ALIASES: dict[str, str] = {"debiased": "dcl", "hard_negative": "hcl"}


def sampler_names() -> tuple[str, ...]:
    """The sampler names, in the order tables and ``all`` list them.

    Example:
        >>> from hardbatch.registry import sampler_names
        >>> sampler_names()
        ('uniform', 'knn', 'proximity', 'gcbs', 'cluster', 'community')
    """
    return tuple(_SAMPLERS)


def loss_names(aliases: bool = False) -> tuple[str, ...]:
    """The canonical loss names (with ``aliases=True`` also the accepted aliases).

    Example:
        >>> from hardbatch.registry import loss_names
        >>> loss_names()
        ('infonce', 'dcl', 'hcl', 'sscl')
        >>> loss_names(aliases=True)[-2:]
        ('debiased', 'hard_negative')
    """
    return tuple(_LOSSES) + (tuple(LOSS_ALIASES) if aliases else ())


def _unknown(kind: str, name, valid: Iterable[str], aliases: dict[str, str]) -> ValueError:
    alias = "".join(f", {a!r} (= {c!r})" for a, c in aliases.items())
    return ValueError(f"unknown {kind} {name!r}; use one of "
                      f"{', '.join(map(repr, valid))}{alias}")


def canonical_sampler(name: str) -> str:
    """``name`` checked against the sampler names.

    Example:
        >>> from hardbatch.registry import canonical_sampler
        >>> canonical_sampler(" GCBS ")
        'gcbs'
        >>> canonical_sampler("graph")
        Traceback (most recent call last):
            ...
        ValueError: unknown sampler 'graph'; use one of 'uniform', 'knn', 'proximity', 'gcbs', ...
    """
    if not isinstance(name, str) or name.strip().lower() not in _SAMPLERS:
        raise _unknown("sampler", name, _SAMPLERS, {})
    return name.strip().lower()


def canonical_loss(name: str) -> str:
    """``name`` as a canonical loss name (``debiased`` -> ``dcl``, ``hard_negative`` -> ``hcl``).

    Example:
        >>> from hardbatch.registry import canonical_loss
        >>> canonical_loss("debiased"), canonical_loss("HCL")
        ('dcl', 'hcl')
    """
    key = name.strip().lower() if isinstance(name, str) else name
    key = LOSS_ALIASES.get(key, key)
    if key not in _LOSSES:
        raise _unknown("loss", name, _LOSSES, LOSS_ALIASES)
    return key


def sampler_class(name: str) -> type:
    """The sampler class registered as ``name``.

    Example:
        >>> from hardbatch.registry import sampler_class
        >>> sampler_class("proximity").__name__
        'ProximityGraphSampler'
    """
    return _SAMPLERS[canonical_sampler(name)]


def loss_class(name: str) -> type[nn.Module]:
    """The loss class registered as ``name`` (or its alias).

    Example:
        >>> from hardbatch.registry import loss_class
        >>> loss_class("hard_negative").__name__
        'HardNegativeInfoNCE'
    """
    return _LOSSES[canonical_loss(name)]


def parse_names(value: str | Iterable[str], kind: str, extra: Iterable[str] = ()) -> list[str]:
    """``"all"``, a comma-separated string or a list of names -> canonical names, in order, once.

    ``kind`` is ``"sampler"`` or ``"loss"``; ``extra`` names accepted besides the registry's
    (e.g. ``"default"``, ``"mnrl"`` for sentence-transformers' own sampler and loss), listed
    first by ``"all"``.

    Example:
        >>> from hardbatch.registry import parse_names
        >>> parse_names("all", "sampler")
        ['uniform', 'knn', 'proximity', 'gcbs', 'cluster', 'community']
        >>> parse_names("hard_negative, infonce, hcl", "loss")
        ['hcl', 'infonce']
        >>> parse_names(["mnrl", "dcl"], "loss", extra=("mnrl",))
        ['mnrl', 'dcl']
    """
    if kind not in ("sampler", "loss"):
        raise ValueError(f"kind={kind!r} must be 'sampler' or 'loss'")
    extra = tuple(extra)
    names = (sampler_names() if kind == "sampler" else loss_names())
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(v).strip().lower() for v in items if str(v).strip()]
    if items == ["all"]:
        return list(extra + names)
    if not items:
        raise ValueError(f"no {kind} name given; use one of "
                         f"{', '.join(map(repr, extra + names))} or 'all'")
    canon = canonical_sampler if kind == "sampler" else canonical_loss
    out = []
    for item in items:
        if item in extra:
            out.append(item)
            continue
        try:
            out.append(canon(item))
        except ValueError:
            aliases = LOSS_ALIASES if kind == "loss" else {}
            raise _unknown(kind, item, extra + names + ("all",), aliases) from None
    return list(dict.fromkeys(out))


def _check_options(kind: str, name: str, cls: type, options: dict, taken: tuple[str, ...]) -> None:
    if kind == "sampler":
        params = sampler_parameters(cls)
    else:
        params = [p for p, v in inspect.signature(cls.__init__).parameters.items()
                  if v.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                    inspect.Parameter.VAR_KEYWORD)]
    accepted = [p for p in params if p not in ("self", *taken)]
    bad = [k for k in options if k not in accepted]
    if bad:
        raise ValueError(f"unknown option(s) {', '.join(map(repr, bad))} for {kind} {name!r}; "
                         f"it accepts {', '.join(accepted)}")


def make_sampler(name: str, source, batch_size: int, **options):
    """The sampler ``name`` over ``source`` with ``batch_size`` and its keyword ``options``.

    ``source`` is the embedding source of the graph samplers (an [N, d] tensor or array, an
    :class:`~hardbatch.EmbeddingBank`, or a callable); ``uniform`` takes it too (it only needs
    N), or a number of items or a sized dataset.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> _ = torch.manual_seed(0)
        >>> x = torch.randn(40, 8)
        >>> sampler = hb.registry.make_sampler("knn", x, 8, seed=0)
        >>> type(sampler).__name__, len(sampler)
        ('KNNBatchSampler', 5)
        >>> [len(batch) for batch in sampler]
        [8, 8, 8, 8, 8]
        >>> len(hb.registry.make_sampler("uniform", 40, 16))  # N = 40 items, batches of 16
        3
    """
    name = canonical_sampler(name)
    cls = _SAMPLERS[name]
    first = "n_or_dataset" if cls is UniformBatchSampler else "embeddings"
    _check_options("sampler", name, cls, options, (first, "batch_size"))
    if cls is UniformBatchSampler:
        num = getattr(source, "num_items", None)
        if num is None:
            shape = getattr(source, "shape", None)
            num = int(shape[0]) if shape is not None else num_items_of(source, "source")
        return cls(num, batch_size, **options)
    return cls(source, batch_size, **options)


def make_loss(name: str, **options) -> nn.Module:
    """The loss module ``name`` (``infonce``, ``dcl``, ``hcl``, ``sscl`` or an alias).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> loss = hb.registry.make_loss("debiased", temperature=0.5, tau_plus=0.1)
        >>> type(loss).__name__
        'DebiasedInfoNCE'
        >>> _ = torch.manual_seed(0)
        >>> loss(torch.randn(8, 8), torch.randn(8, 8)).shape  # a scalar
        torch.Size([])
        >>> hb.registry.make_loss("dcl", tau=0.1)
        Traceback (most recent call last):
            ...
        ValueError: unknown option(s) 'tau' for loss 'dcl'; it accepts temperature, tau_plus, ...
    """
    name = canonical_loss(name)
    cls = _LOSSES[name]
    _check_options("loss", name, cls, options, ())
    return cls(**options)
