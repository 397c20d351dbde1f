"""The options the samplers share, declared once: names, types, defaults and meaning.

A sampler's constructor names its own parameters (the graph's, the walk's, the partition's)
and takes the shared ones as keywords, ``**options``, typed by a :class:`~typing.TypedDict`
that lists exactly the shared options it accepts (a type checker sees them; an option the
sampler does not take is a ``TypeError`` naming it). A new shared option is one entry here.

=================  =========  ===================================================================
option             default    meaning
=================  =========  ===================================================================
``drop_last``      False      full batches only, in whole steps: floor(N / B) rounded down to a
                              multiple of ``world_size`` (``global_batch``: floor(N / (W B))),
                              so every rank gets as many and every plan batch is served
                              (partition samplers: the ``drop_count`` items left out are a
                              seeded random choice per epoch, not a fixed region)
``seed``           0          base seed: the same seed, epoch and rank give the same batches
``rank``           None       this process's rank (None: torch.distributed's, else 0)
``world_size``     None       ranks sharing the plan (None: torch.distributed's, else 1)
``global_batch``   False      each step is ONE plan batch of ``world_size * batch_size`` items,
                              rank r taking slice r of it
``duplicate_keys`` None       N hashable keys (or key sets); items whose keys meet never share a
                              batch (:mod:`hardbatch.keys`)
``prefetch``       0          plan up to this many steps ahead in a thread (same batches)
``normalize``      True       L2-normalise the embeddings read (cosine similarity)
``refresh_lag``    None       steps between a snapshot of the embeddings and the use of the
                              structure built from it (None: 0, or 1 with ``background``)
``background``     False      build the next structure in a worker thread (needs a lag >= 1)
``distributed``    None       build sharded across the ranks of ``process_group`` (None: on when
                              torch.distributed is initialised with these ranks)
``process_group``  None       the torch.distributed group of the builds (None: the default)
``device``         None       where the structure is built (None: the CPU; the cluster
                              sampler's torch k-means: the source's device)
``precision``      "fp32"     ``"fp32"``, ``"bf16"`` or ``"fp16"`` similarity products (fp32
                              accumulation)
``progress``       None       a tqdm bar over long builds (True / False; None: when stderr is a
                              terminal)
=================  =========  ===================================================================

Example:
    >>> import hardbatch as hb
    >>> from hardbatch.samplers.options import sampler_parameters
    >>> sampler_parameters(hb.UniformBatchSampler)
    ('n_or_dataset', 'batch_size', 'drop_last', 'seed', 'rank', 'world_size', 'global_batch', \
'duplicate_keys')
    >>> hb.UniformBatchSampler(40, 8, prefetch=2)
    Traceback (most recent call last):
        ...
    TypeError: UniformBatchSampler() got an unexpected keyword argument 'prefetch'; it takes ...
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

import torch

__all__ = ["ClusterOptions", "CommunityOptions", "GCBSOptions", "KNNOptions", "PlanOptions",
           "ProximityOptions", "sampler_parameters", "take_options"]

DEFAULTS: dict[str, Any] = {
    "drop_last": False, "seed": 0, "rank": None, "world_size": None, "global_batch": False,
    "duplicate_keys": None, "prefetch": 0, "normalize": True, "refresh_lag": None,
    "background": False, "distributed": None, "process_group": None, "device": None,
    "precision": "fp32", "progress": None,
}


class PlanOptions(TypedDict, total=False):
    """Every sampler: the plan's shape, its seed, its ranks and its keys."""

    drop_last: bool
    seed: int
    rank: int | None
    world_size: int | None
    global_batch: bool
    duplicate_keys: Sequence | None


class _Prefetch(TypedDict, total=False):
    prefetch: int


class _Normalize(TypedDict, total=False):
    normalize: bool


class _Refresh(TypedDict, total=False):
    refresh_lag: int | None
    background: bool


class _Distributed(TypedDict, total=False):
    distributed: bool | None
    process_group: Any


class _Device(TypedDict, total=False):
    device: str | torch.device | None


class _Precision(TypedDict, total=False):
    precision: Literal["fp32", "bf16", "fp16"]
    progress: bool | None


class ProximityOptions(PlanOptions, _Prefetch, _Normalize, _Refresh, _Distributed, _Device,
                       _Precision, total=False):
    """The shared options of :class:`~hardbatch.ProximityGraphSampler` (all of them)."""


class KNNOptions(PlanOptions, _Prefetch, _Normalize, _Device, total=False):
    """The shared options of :class:`~hardbatch.KNNBatchSampler` (its snapshot is a copy: no
    background build; one process builds it)."""

    refresh_lag: int | None


class GCBSOptions(PlanOptions, _Refresh, _Distributed, _Device, _Precision, total=False):
    """The shared options of :class:`~hardbatch.GCBSSampler` (its order normalises the rows
    itself; one order per epoch: no prefetch)."""


class ClusterOptions(PlanOptions, _Refresh, _Device, total=False):
    """The shared options of :class:`~hardbatch.ClusterBatchSampler`."""


class CommunityOptions(PlanOptions, _Refresh, _Device, total=False):
    """The shared options of :class:`~hardbatch.CommunityBatchSampler`."""


def _own_parameters(cls: type) -> list[str]:
    params = inspect.signature(cls.__init__).parameters
    return [p for p, v in params.items() if p != "self" and v.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def sampler_parameters(cls: type) -> tuple[str, ...]:
    """Every keyword a sampler class takes: its own parameters, then its shared options
    (``cls.Options``, a TypedDict of this module)."""
    shared = tuple(getattr(cls, "Options", PlanOptions).__annotations__)
    own = _own_parameters(cls)
    return tuple(own) + tuple(k for k in shared if k not in own)


def take_options(cls: type, options: dict, **fixed) -> dict:
    """The shared options of ``cls`` resolved: the given ``options`` (each must be one of
    ``cls.Options``, else ``TypeError`` naming it) over the defaults of :data:`DEFAULTS`, plus
    ``fixed`` values of options the class does not offer (e.g. ``normalize=False``)."""
    accepted = getattr(cls, "Options", PlanOptions).__annotations__
    for key in options:
        if key not in accepted:
            close = difflib.get_close_matches(key, list(accepted), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {key!r}"
                            f"{hint}; it takes {', '.join(sampler_parameters(cls))}")
    out = {k: DEFAULTS[k] for k in accepted}
    out.update(fixed)
    out.update(options)
    return out
