"""Exact gradient caching (GradCache; Gao et al. 2021, "Scaling Deep Contrastive Learning Batch
Size under Memory Limited Setup", Sec. 3).

A contrastive loss ``L(z_1, z_2)`` couples the items of a batch only through their embeddings
``z_v = f_v(x_v)`` (``[B, d]`` per view), so its parameter gradient splits over chunks of rows
(paper eq. 4-6):

    dL/dθ = sum_v sum_chunks c  (dL/dz_v[c])^T  dz_v[c]/dθ.

The loss of a batch far larger than the encoder's activations fit in memory is therefore trained
exactly in three steps, each a public function:

1. :func:`embed_chunks`: every view in chunks of ``chunk_size`` rows without a graph, keeping the
   RNG state before each chunk (CPU and the accelerators the chunk or the encoder live on, as
   ``torch.utils.checkpoint`` does) and the autocast state;
2. :func:`loss_gradients`: the loss of the whole batch on the detached embeddings, and its
   gradient with respect to them (the cache, ``[B, d]`` per view); parameters of the loss itself
   get their gradients here;
3. :func:`backward_chunks`: every chunk again, with a graph, under its saved RNG state (so dropout
   draws the same masks and the embeddings are the same), back-propagating its rows of the cache
   (``backward(z_c, g_c)``: the gradient of the surrogate ``(z_c * g_c).sum()``).

The parameter gradients are those of the plain backward of the same forward pass (the chunks
computed with a graph, concatenated, the loss, ``backward()``); with ``chunk_size >= B``, or
without randomness and batch statistics in the encoder, that is ``loss(f(x1), f(x2)).backward()``
itself, up to rounding: ``.grad`` sums the chunks' contributions in the parameters' dtype, so
with bf16 / fp16 parameters the rounding grows with the number of chunks (keep float32
parameters and use ``torch.autocast``). :class:`GradCache` is the three steps for a pair of
views. Memory: one chunk's activations, plus the ``[B, d]`` embeddings, their cache, and the
loss of the whole batch (for InfoNCE the ``2B x 2B`` logits). Time: one more forward pass of
the encoder.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ._chunks import (RandomState, accelerator_tensors, autocast_state, batch_length, forked_rng,
                      rng_capturer, slice_view, view_tensors)
from ._validation import check_int

# batch_length, slice_view and RandomState (the views and the replayed RNG) live in _chunks.py.
__all__ = ["ChunkedViews", "GradCache", "GradCacheOutput", "RandomState", "backward_chunks",
           "batch_length", "embed_chunks", "loss_gradients", "slice_view", "warn_batch_norm"]


def _module_of(encoder: Callable) -> nn.Module | None:
    return encoder if isinstance(encoder, nn.Module) else None


def _parameter_probe(module: nn.Module | None) -> list[Tensor]:
    return [] if module is None else accelerator_tensors(list(module.parameters()))


# --------------------------------------------------------------------------- the three steps


@dataclass
class ChunkedViews:
    """Step 1 of GradCache for ``n`` views: what step 3 needs to replay every chunk.

    ``views[v]`` is view ``v`` and ``bounds[v]`` its chunks' row ranges (each chunk is sliced
    afresh for every pass: encoders may write into their input dict, as sentence-transformers
    models do), ``states[v]`` the RNG state before each chunk (None when not kept),
    ``embeddings[v]`` the concatenated ``[B, ...]`` encoder outputs (no graph), ``autocast``
    the autocast settings of the first pass, and ``modules[v]`` the ``nn.Module`` behind the encoder (or None): its
    parameters' devices are in the RNG states, its batch-norm statistics are restored after the
    replay, and when it is ``DistributedDataParallel`` its gradient all-reduce is deferred to its
    last replayed chunk.

    Example:
        >>> import torch
        >>> from hardbatch.gradcache import ChunkedViews, embed_chunks
        >>> encoder = torch.nn.EmbeddingBag(100, 4)  # a bag of token ids
        >>> chunked = embed_chunks([encoder], [torch.randint(0, 100, (40, 6))], chunk_size=16)
        >>> isinstance(chunked, ChunkedViews), chunked.bounds[0], len(chunked.states[0])
        (True, [(0, 16), (16, 32), (32, 40)], 3)
    """

    encoders: list[Callable]
    views: list[Any]
    bounds: list[list[tuple[int, int]]]
    states: list[list[RandomState | None]]
    embeddings: list[Tensor]
    autocast: tuple[tuple[str, torch.dtype], ...]
    modules: list[nn.Module | None]


def embed_chunks(
    encoders: Sequence[Callable],
    views: Sequence[Any],
    chunk_size: int,
    *,
    names: Sequence[str] | None = None,
    keep_rng: bool = True,
    modules: Sequence[nn.Module | None] | None = None,
) -> ChunkedViews:
    """Step 1: ``encoders[v](chunk)`` on rows ``[k*chunk_size, (k+1)*chunk_size)`` of every view,
    under ``torch.no_grad``, in view order; the outputs are concatenated per view.

    Args:
        encoders: one callable per view, each returning a tensor ``[b, ...]`` for a chunk of
            ``b`` items (the same object may serve several views).
        views: the inputs, see :func:`batch_length`; all views must have the same ``B``.
        chunk_size: rows per chunk, ``>= 1`` (the last chunk may be shorter).
        names: the views' names in error messages (default ``view1``, ``view2``, ...).
        keep_rng: capture each chunk's RNG state (needed by step 3 for dropout; off for a pass
            that is never replayed, e.g. evaluation).
        modules: per view the ``nn.Module`` behind its encoder, possibly
            ``DistributedDataParallel`` (default: the encoder itself when it is a module); pass
            it when the encoder is a function calling the module.

    Example:
        >>> from hardbatch.gradcache import embed_chunks
        >>> import torch
        >>> import hardbatch as hb
        >>> encoder, loss = torch.nn.Linear(8, 4), hb.InfoNCE(0.5)
        >>> x1, x2 = torch.randn(40, 8), torch.randn(40, 8)  # two views of 40 items
        >>> z1, z2 = embed_chunks([encoder, encoder], [x1, x2], chunk_size=16).embeddings
        >>> z1.shape, z1.requires_grad, torch.allclose(z1, encoder(x1))
        (torch.Size([40, 4]), False, True)
    """
    chunk_size = check_int(chunk_size, "chunk_size", low=1)
    names = list(names) if names is not None else [f"view{i + 1}" for i in range(len(views))]
    lengths = [batch_length(view, name) for view, name in zip(views, names)]
    if len(set(lengths)) > 1:
        got = ", ".join(f"{name} has {n}" for name, n in zip(names, lengths))
        raise ValueError(f"the views must have the same batch size (row i of every view is one "
                         f"item); got {got} items")
    modules = [_module_of(e) for e in encoders] if modules is None else list(modules)
    for module in modules:
        if isinstance(module, DistributedDataParallel) and module.static_graph:
            raise ValueError("GradCache runs one backward pass per chunk; "
                             "DistributedDataParallel(static_graph=True) expects one per step: "
                             "build the DDP module with static_graph=False")
    probes = [_parameter_probe(m) for m in modules]
    out = ChunkedViews(list(encoders), [], [], [], [], (), modules)
    device_types = {"cpu"}
    with torch.no_grad():
        for encoder, view, name, length, probe in zip(encoders, views, names, lengths, probes):
            bounds = [(s, min(s + chunk_size, length)) for s in range(0, length, chunk_size)]
            # a chunk's tensors are slices of the view's: the devices, hence the generators to
            # keep, are resolved once per view, not per chunk
            tensors = view_tensors(view) + probe
            device_types.update(t.device.type for t in tensors)
            capture = rng_capturer(tensors) if keep_rng else None
            states, outputs = [], []
            for s, e in bounds:
                chunk = slice_view(view, s, e)
                states.append(capture() if capture is not None else None)
                outputs.append(_checked_output(encoder(chunk), e - s, name))
            out.views.append(view)
            out.bounds.append(bounds)
            out.states.append(states)
            out.embeddings.append(torch.cat(outputs) if len(outputs) > 1 else outputs[0])
    out.autocast = autocast_state(device_types)
    return out


def _checked_output(z: Any, rows: int, name: str) -> Tensor:
    if not isinstance(z, Tensor) or z.dim() == 0 or z.shape[0] != rows:
        got = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
        raise ValueError(f"encoder must return a tensor [b, d] with one row per item of its "
                         f"input; for a chunk of {rows} items of {name} it returned {got} (wrap "
                         "an encoder that returns a dict, e.g. lambda x: model(x)['embedding'])")
    return z


def loss_gradients(
    loss_fn: Callable[[list[Tensor]], Tensor],
    embeddings: Sequence[Tensor],
    *,
    scale: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, list[Tensor | None]]:
    """Step 2: ``loss = loss_fn(leaves)`` on detached copies of the ``[B, ...]`` embeddings,
    ``backward()`` (through ``scale(loss)`` if given, e.g. ``GradScaler.scale``), and the leaves'
    gradients (None for an embedding the loss did not use). Parameters of the loss and tensors
    it gets otherwise (``negatives`` that require grad) accumulate their gradients as in a plain
    backward. Returns the detached (unscaled) loss and the gradients.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> encoder, loss = torch.nn.Linear(8, 4), hb.InfoNCE(0.5)
        >>> x1, x2 = torch.randn(40, 8), torch.randn(40, 8)  # two views of 40 items
        >>> from hardbatch.gradcache import loss_gradients
        >>> z1, z2 = encoder(x1).detach(), encoder(x2).detach()
        >>> value, (g1, g2) = loss_gradients(lambda z: loss(z[0], z[1]), [z1, z2])
        >>> value.shape, g1.shape, z1.grad is None  # the gradients of detached copies
        (torch.Size([]), torch.Size([40, 4]), True)
    """
    leaves = [z.detach().requires_grad_() for z in embeddings]
    with torch.enable_grad():
        loss = loss_fn(leaves)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise ValueError(f"loss must return a scalar tensor, got {got}; use "
                             "reduction='mean' or 'sum'")
        if loss.requires_grad:
            (loss if scale is None else scale(loss)).backward()
    return loss.detach().reshape(()), [leaf.grad for leaf in leaves]


@contextmanager
def _autocast(state: tuple[tuple[str, torch.dtype], ...]):
    with ExitStack() as stack:
        for device_type, dtype in state:
            stack.enter_context(torch.autocast(device_type, dtype=dtype))
        yield


def _running_stat_buffers(modules: Sequence[nn.Module | None]) -> list[Tensor]:
    """Buffers of modules that update running statistics in training mode (batch norm)."""
    out, seen = [], set()
    for module in modules:
        for m in () if module is None else module.modules():
            if id(m) not in seen and m.training and getattr(m, "track_running_stats", False):
                seen.add(id(m))
                out += list(m.buffers(recurse=False))
    return out


# torch.autograd.backward(z, g) minus its argument checks, which run torch's symbolic-shape
# helpers: their first use imports torch.fx.experimental.symbolic_shapes and sympy (0.5 s on a
# warm CPU machine, more from a cold disk: paid by the first GradCache step of a process, which
# a plain loss.backward() never pays) and they cost ~25 us per call after. The function below
# is the rest of that call (a private torch function: without it, the public call); the g of
# GradCache has z's shape, dtype and device by construction, which _backward checks.
# Its signature is checked once here: a torch whose private function takes other arguments
# gets the public call.
def _engine_backward():
    fn = getattr(getattr(torch.autograd, "graph", None), "_engine_run_backward", None)
    try:
        inspect.signature(fn).bind((), (), False, False, (), allow_unreachable=True,
                                   accumulate_grad=True)
    except (TypeError, ValueError):
        return None
    return fn


_ENGINE_BACKWARD = _engine_backward()


def _backward(z: Tensor, g: Tensor) -> None:
    """``torch.autograd.backward(z, g)``, bit for bit, without its per-call checks."""
    if (_ENGINE_BACKWARD is None or z.shape != g.shape or z.dtype != g.dtype
            or z.device != g.device):
        torch.autograd.backward(z, g)  # its checks and messages
        return
    _ENGINE_BACKWARD((z,), (g,), False, False, (), allow_unreachable=True, accumulate_grad=True)


def backward_chunks(
    chunked: ChunkedViews,
    grads: Sequence[Tensor | None],
    grad_output: Tensor | float | None = None,
) -> None:
    """Step 3: re-run every chunk with a graph, under its RNG state and the first pass's
    autocast, and back-propagate ``grad_output * grads[v][rows]`` (``grads`` from
    :func:`loss_gradients`; a view whose gradient is None is skipped). Each chunk's graph is
    freed before the next chunk runs.

    Under ``DistributedDataParallel`` every chunk but the last one of each DDP module runs in
    ``no_sync()``, so gradients are all-reduced once, after all chunks have accumulated. Running
    statistics of batch-norm modules are restored after the replay, so that they are updated
    once per step (by step 1), not twice.

    Example:
        >>> from hardbatch.gradcache import backward_chunks, embed_chunks, loss_gradients
        >>> import torch
        >>> import hardbatch as hb
        >>> encoder, loss = torch.nn.Linear(8, 4), hb.InfoNCE(0.5)
        >>> x1, x2 = torch.randn(40, 8), torch.randn(40, 8)  # two views of 40 items
        >>> chunked = embed_chunks([encoder, encoder], [x1, x2], 16)  # step 1
        >>> value, grads = loss_gradients(lambda z: loss(*z), chunked.embeddings)  # step 2
        >>> backward_chunks(chunked, grads)  # step 3
        >>> cached = encoder.weight.grad.clone()
        >>> encoder.zero_grad()
        >>> loss(encoder(x1), encoder(x2)).backward()  # the plain step: the same gradients
        >>> torch.allclose(cached, encoder.weight.grad, atol=1e-6)
        True
    """
    jobs = [(v, k) for v in range(len(chunked.views)) if grads[v] is not None
            for k in range(len(chunked.bounds[v]))]
    if grad_output is not None:  # once per view, not per chunk (the same products)
        grads = [g if g is None else g * grad_output for g in grads]
    ddp = [m if isinstance(m, DistributedDataParallel) else None for m in chunked.modules]
    last = {id(ddp[v]): (v, k) for v, k in jobs if ddp[v] is not None}
    buffers = _running_stat_buffers(chunked.modules)
    saved = [b.clone() for b in buffers]
    shapes = [z.shape[1:] for z in chunked.embeddings]
    # One fork of the RNG around the whole replay (each chunk sets its saved state; the RNG
    # afterwards is where step 1 left it), not one fork per chunk.
    with torch.enable_grad(), _autocast(chunked.autocast), \
            forked_rng(chunked.states[v][k] for v, k in jobs):
        for v, k in jobs:
            module = ddp[v]
            sync = module is None or last[id(module)] == (v, k)
            state = chunked.states[v][k]
            with nullcontext() if sync else module.no_sync():
                if state is not None:
                    state.apply()
                s, e = chunked.bounds[v][k]
                z = chunked.encoders[v](slice_view(chunked.views[v], s, e))
                if not isinstance(z, Tensor) or z.shape != (e - s, *shapes[v]):
                    raise ValueError("encoder returned a different shape when a chunk was run "
                                     "again; it must be a function of its input and the RNG")
                if not z.requires_grad:
                    continue  # a frozen encoder: nothing to back-propagate
                g = grads[v][s:e]
                _backward(z, g if g.dtype == z.dtype else g.to(z.dtype))
    with torch.no_grad():
        for buffer, value in zip(buffers, saved):
            buffer.copy_(value)


# --------------------------------------------------------------------------- the class

_WARNED_BATCH_NORM: set[int] = set()
# (LazyBatchNorm* become these on their first forward pass)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def warn_batch_norm(chunked: ChunkedViews) -> None:
    """Warn once per module when chunking changes what its batch norm sees (per-chunk
    statistics instead of the whole batch's).

    Example:
        >>> import warnings
        >>> import torch
        >>> from hardbatch.gradcache import embed_chunks, warn_batch_norm
        >>> encoder = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
        >>> chunked = embed_chunks([encoder], [torch.randn(40, 8)], chunk_size=16)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_batch_norm(chunked)
        >>> "batch norm in training mode" in str(caught[0].message)
        True
    """
    if max(map(len, chunked.bounds)) < 2:
        return
    for module in chunked.modules:
        if module is None or id(module) in _WARNED_BATCH_NORM:
            continue
        if any(isinstance(m, _BATCH_NORMS) and m.training for m in module.modules()):
            _WARNED_BATCH_NORM.add(id(module))
            warnings.warn(
                f"GradCache: {type(module).__name__} has batch norm in training mode; it "
                "normalises each chunk with the chunk's statistics, so the gradients are those "
                "of a forward pass in chunks, not of one forward pass on the whole batch. Use "
                "chunk_size >= batch size, LayerNorm, or batch norm in eval mode for the latter.",
                UserWarning, stacklevel=3)


class GradCacheOutput(NamedTuple):
    """What :class:`GradCache` returns with ``return_embeddings=True``: the detached loss and the
    detached ``[B, d]`` embeddings of the two views (e.g. for ``EmbeddingBank.update``).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> encoder, loss = torch.nn.Linear(8, 4), hb.InfoNCE(0.5)
        >>> x1, x2 = torch.randn(40, 8), torch.randn(40, 8)  # two views of 40 items
        >>> gc = hb.GradCache(encoder, loss, chunk_size=16, return_embeddings=True)
        >>> out = gc(x1, x2)
        >>> out.loss.shape, out.embeddings1.shape, out.embeddings1.requires_grad
        (torch.Size([]), torch.Size([40, 4]), False)
    """

    loss: Tensor
    embeddings1: Tensor
    embeddings2: Tensor


class GradCache:
    """``gc(view1, view2, **loss_kwargs)``: the gradients of ``loss(encoder(view1),
    encoder(view2), **loss_kwargs).backward()`` with the encoder's activations of only
    ``chunk_size`` items in memory at a time (GradCache, Gao et al. 2021; see the module
    docstring for the three steps). Returns the loss value, detached.

    Args:
        encoder: a callable (an ``nn.Module``, possibly ``DistributedDataParallel``) mapping a
            chunk of a view to embeddings ``[b, d]``, used for both views; or a pair
            ``(encoder1, encoder2)``, one per view (CLIP-style dual encoders).
        loss: ``loss(z1, z2, **loss_kwargs) -> scalar``: any hardbatch loss module
            (``InfoNCE``, ``DebiasedInfoNCE``, ``HardNegativeInfoNCE``, ``SSCLLoss``, also with
            ``gather=True``: it is called once, on the local batch) or a functional form
            (``functools.partial(hb.info_nce, temperature=0.1)``).
        chunk_size: items per encoder pass, ``>= 1``; the peak activation memory is that of
            ``chunk_size`` items, whatever the batch size.
        return_embeddings: return a :class:`GradCacheOutput` ``(loss, z1, z2)`` instead of the
            loss alone.
        scaler: a ``torch.amp.GradScaler`` for fp16: the gradients are those of
            ``scaler.scale(loss).backward()``; call ``scaler.step(optimizer)`` as usual.

    Views are tensors ``[B, ...]``, dicts of tensors ``[B, ...]`` (tokenised text) or lists /
    tuples of such; every tensor is cut along dim 0 and the encoder gets the chunk in the same
    structure. ``loss_kwargs`` (``labels``, ``negatives``, ...) go to the loss unchanged. Call it
    inside ``torch.autocast`` for mixed precision. Dropout is replayed exactly (the RNG state of
    each chunk is restored; the RNG afterwards is where the plain step leaves it); batch norm in
    training mode sees per-chunk statistics (warned once).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> encoder, loss = torch.nn.Linear(8, 4), hb.InfoNCE(0.5)
        >>> x1, x2 = torch.randn(40, 8), torch.randn(40, 8)  # two views of 40 items
        >>> hb.GradCache(encoder, loss, chunk_size=16)(x1, x2).shape  # 16 items at a time
        torch.Size([])
        >>> cached = encoder.weight.grad.clone()
        >>> encoder.zero_grad()
        >>> loss(encoder(x1), encoder(x2)).backward()  # all 40 items at once
        >>> torch.allclose(cached, encoder.weight.grad, atol=1e-6)
        True
    """

    def __init__(
        self,
        encoder: Callable | tuple[Callable, Callable],
        loss: Callable[..., Tensor],
        chunk_size: int,
        *,
        return_embeddings: bool = False,
        scaler: Any | None = None,
    ) -> None:
        encoders = list(encoder) if isinstance(encoder, (tuple, list)) else [encoder, encoder]
        if len(encoders) != 2 or not all(callable(e) for e in encoders):
            raise ValueError("encoder must be a callable (one encoder for both views) or a pair "
                             f"(encoder1, encoder2) of callables, got {encoder!r}")
        if not callable(loss):
            raise ValueError(  # noqa: TRY004 - the package contract: ValueError naming it
                f"loss must be a callable loss(z1, z2, **kwargs), got {loss!r}")
        if scaler is not None and not callable(getattr(scaler, "scale", None)):
            raise ValueError(f"scaler must be a torch.amp.GradScaler (or None), got {scaler!r}")
        self.encoders = encoders
        self.loss = loss
        self.chunk_size = check_int(chunk_size, "chunk_size", low=1)
        self.return_embeddings = bool(return_embeddings)
        self.scaler = scaler

    def __call__(self, view1: Any, view2: Any, **loss_kwargs: Any) -> Tensor | GradCacheOutput:
        chunked = embed_chunks(self.encoders, [view1, view2], self.chunk_size)
        warn_batch_norm(chunked)
        loss, grads = loss_gradients(
            lambda z: self.loss(z[0], z[1], **loss_kwargs), chunked.embeddings,
            scale=None if self.scaler is None else self.scaler.scale)
        backward_chunks(chunked, grads)
        if self.return_embeddings:
            return GradCacheOutput(loss, *chunked.embeddings)
        return loss

    def __repr__(self) -> str:
        enc = (type(self.encoders[0]).__name__ if self.encoders[0] is self.encoders[1] else
               f"({type(self.encoders[0]).__name__}, {type(self.encoders[1]).__name__})")
        return f"GradCache(encoder={enc}, loss={self.loss!r}, chunk_size={self.chunk_size})"
