"""Chunks of a batch for :mod:`hardbatch.gradcache`: a view's batch length and row slices, and
the RNG state that replays a chunk exactly.

A *view* is a tensor ``[B, ...]``, a mapping of tensors ``[B, ...]`` (tokenised text; its str /
number / bool / None values are options passed to every chunk) or a list / tuple of such,
nested. :func:`batch_length` checks one and returns ``B``; :func:`slice_view` cuts rows from
every tensor of it. :class:`RandomState` is the RNG state (CPU and the accelerators of a chunk)
taken before a chunk's first pass and restored for its replay; :func:`autocast_state` the
autocast settings of the first pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["RandomState", "accelerator_tensors", "autocast_state", "batch_length", "forked_rng",
           "rng_capturer", "slice_view", "view_tensors"]

# Values of a mapping that are not per-item data: passed unchanged to every chunk.
_CONSTANTS = (str, bytes, int, float, bool, type(None))
_VIEW_TYPES = ("a tensor [B, ...], a dict of tensors [B, ...] (tokenised text) or a list / "
               "tuple of such")


# --------------------------------------------------------------------------- views and chunks


def batch_length(view: Any, name: str = "view") -> int:
    """The batch size ``B`` of a view: a tensor ``[B, ...]``, a mapping of tensors ``[B, ...]``
    (tokenised text; its str / number / bool / None values are options passed to every chunk),
    or a list / tuple of such, nested. ``ValueError`` naming ``name`` for anything else, a 0-d
    tensor, an empty view, or tensors of different lengths.

    Example:
        >>> import torch
        >>> from hardbatch.gradcache import batch_length
        >>> batch_length({"input_ids": torch.zeros(40, 8, dtype=torch.long), "task": "sts"})
        40
        >>> batch_length([torch.zeros(40, 8), torch.zeros(39, 8)])
        Traceback (most recent call last):
            ...
        ValueError: every tensor of view must have the batch size as dim 0, got lengths ...
    """
    lengths: dict[str, int] = {}

    def visit(x: Any, path: str, in_mapping: bool) -> None:
        if isinstance(x, Tensor):
            if x.dim() == 0:
                raise ValueError(f"{path} is a 0-d tensor; every tensor of {name} needs the "
                                 "batch as dim 0")
            lengths[path] = x.shape[0]
        elif isinstance(x, Mapping):
            for key, value in x.items():
                visit(value, f"{path}[{key!r}]", True)
        elif isinstance(x, (list, tuple)):
            for i, value in enumerate(x):
                visit(value, f"{path}[{i}]", False)
        elif not (in_mapping and isinstance(x, _CONSTANTS)):
            raise ValueError(f"{name} must be {_VIEW_TYPES}; got {type(x).__name__} at {path} "
                             "(tokenise text and convert arrays with torch.as_tensor first)")

    visit(view, name, False)
    if not lengths:
        raise ValueError(f"{name} holds no tensor; it must be {_VIEW_TYPES}")
    if len(set(lengths.values())) > 1:
        raise ValueError(f"every tensor of {name} must have the batch size as dim 0, got "
                         f"lengths {lengths}")
    length = next(iter(lengths.values()))
    if length == 0:
        raise ValueError(f"{name} is empty (batch size 0); pass at least one item")
    return length


def slice_view(view: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor of ``view`` (views of the same storage); mapping
    constants unchanged. Mappings become dicts; lists, tuples and named tuples keep their type.

    Example:
        >>> import torch
        >>> from hardbatch.gradcache import slice_view
        >>> chunk = slice_view({"input_ids": torch.arange(40).reshape(20, 2), "task": "sts"}, 4, 6)
        >>> chunk["input_ids"].tolist(), chunk["task"]
        ([[8, 9], [10, 11]], 'sts')
    """
    if isinstance(view, Tensor):
        return view[start:stop]
    if isinstance(view, Mapping):
        return {key: slice_view(value, start, stop) for key, value in view.items()}
    if isinstance(view, (list, tuple)):
        items = [slice_view(value, start, stop) for value in view]
        return type(view)(*items) if hasattr(view, "_fields") else type(view)(items)
    return view


def view_tensors(x: Any) -> list[Tensor]:
    """Every tensor of a view (see :func:`batch_length`), in order."""
    if isinstance(x, Tensor):
        return [x]
    values = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    return [t for value in values for t in view_tensors(value)]


# --------------------------------------------------------------------------- RNG and autocast


def accelerator_tensors(tensors: Sequence[Tensor]) -> list[Tensor]:
    """One tensor per accelerator device among ``tensors`` (CPU excluded)."""
    seen: dict[torch.device, Tensor] = {}
    for t in tensors:
        if t.device.type not in ("cpu", "meta", "mps"):  # MPS: one generator, kept apart
            seen.setdefault(t.device, t)
    return list(seen.values())


@dataclass(frozen=True)
class RandomState:
    """The CPU RNG state and the states of the accelerator devices of some tensors, taken at one
    moment (the generators ``torch.utils.checkpoint.get_device_states`` takes; the MPS generator
    apart, as sentence-transformers' ``RandContext`` does). :meth:`apply` sets them;
    :meth:`restored` sets them inside :func:`forked_rng`, so the RNG outside is left as it was.

    Example:
        >>> import torch
        >>> from hardbatch.gradcache import RandomState
        >>> state = RandomState.capture()
        >>> first = torch.rand(3)
        >>> with state.restored():
        ...     again = torch.rand(3)
        >>> torch.equal(first, again), torch.equal(torch.rand(3), first)  # outside: moved on
        (True, False)
    """

    cpu: Tensor
    devices: tuple[int, ...]
    device_states: tuple[Tensor, ...]
    device_type: str | None
    mps: Tensor | None = None

    @classmethod
    def capture(cls, tensors: Sequence[Tensor] = ()) -> RandomState:
        return rng_capturer(tensors)()

    def apply(self) -> None:
        """Set every generator of this state (no fork: the RNG moves on from here)."""
        torch.set_rng_state(self.cpu)
        if self.devices:
            module = getattr(torch, self.device_type)
            for device, state in zip(self.devices, self.device_states):
                module.set_rng_state(state, device)
        if self.mps is not None:
            torch.mps.set_rng_state(self.mps)

    @contextmanager
    def restored(self):
        with forked_rng([self]):
            self.apply()
            yield


def rng_capturer(tensors: Sequence[Tensor] = ()) -> Callable[[], RandomState]:
    """``capture()``: the :class:`RandomState` of the generators that ``tensors`` may draw from,
    taken when called. The devices are resolved once, here, so that a capture per chunk costs
    only the state copies (host-side: CUDA's Philox state is a seed and an offset, no sync)."""
    probe = accelerator_tensors(tensors)
    device_type = probe[0].device.type if probe else None
    devices = tuple(t.get_device() for t in probe)
    module = getattr(torch, device_type) if devices else None  # torch.cuda, torch.xpu, ...
    mps = any(t.device.type == "mps" for t in tensors)

    def capture() -> RandomState:
        states = tuple(module.get_rng_state(d) for d in devices) if devices else ()
        return RandomState(torch.get_rng_state(), devices, states, device_type,
                           torch.mps.get_rng_state() if mps else None)

    return capture


@contextmanager
def forked_rng(states: Iterable[RandomState | None]):
    """Save the CPU generator and every generator that ``states`` set (their devices, MPS),
    run the block, and put them back: one fork around the replay of many chunks, which
    :meth:`RandomState.apply` each. No state (none kept): nothing is saved or put back."""
    states = [s for s in states if s is not None]
    if not states:
        yield
        return
    devices: dict[tuple[str, int], None] = {}
    for s in states:
        devices.update(((s.device_type, d), None) for d in s.devices)
    outside = RandomState(
        torch.get_rng_state(), tuple(d for _, d in devices),
        tuple(getattr(torch, t).get_rng_state(d) for t, d in devices),
        None, torch.mps.get_rng_state() if any(s.mps is not None for s in states) else None)
    try:
        yield
    finally:
        torch.set_rng_state(outside.cpu)
        for (t, d), state in zip(devices, outside.device_states):
            getattr(torch, t).set_rng_state(state, d)
        if outside.mps is not None:
            torch.mps.set_rng_state(outside.mps)


def autocast_state(device_types: set[str]) -> tuple[tuple[str, torch.dtype], ...]:
    """(device type, dtype) of every device type among ``device_types`` with autocast on."""
    return tuple((t, torch.get_autocast_dtype(t)) for t in sorted(device_types)
                 if torch.is_autocast_enabled(t))
