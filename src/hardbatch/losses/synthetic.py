"""Internal: SSCL's synthetic hard negatives (Dong et al., eq. 2), batched, no ``[R, k, d]`` tensor.

Not public API (see :func:`hardbatch.losses.sscl_loss`). :func:`synthetic_logits` selects each
row's hardest negatives (:func:`hardest_columns`), mixes random pairs of them and returns the
mixtures' logits; the autograd functions give the gathers and the detached variant fast backwards.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .inputs import Logits


def hardest_columns(logits: Tensor, s: int) -> Tensor:
    """Column indices ``[R, s]`` of the ``s`` largest entries of each row, in decreasing order.

    On CPU ``torch.topk`` is several times slower than numpy's introselect (``argpartition``), which
    is used instead. For wide rows (``C >= 64 s``) the rows are first cut to the ``s`` column groups
    with the largest maxima: they hold every top-``s`` entry, since at most ``s`` groups can contain
    an entry >= the ``s``-th largest.
    """
    x = logits.detach()
    rows, cols = x.shape
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return torch.topk(x, s, dim=1).indices
    g = int(math.sqrt(cols / s))
    if g < 8:  # introselect's per-row overhead makes two passes slower on narrower rows
        cand = None
        top = np.argpartition(x.numpy(), cols - s, axis=1)[:, cols - s :]
    else:
        n_groups = cols // g
        # Strided groups (column t * n_groups + j is in group j): the max is a vectorised reduction.
        group_max = x[:, : n_groups * g].unflatten(1, (g, n_groups)).amax(dim=1)
        top_groups = np.argpartition(group_max.numpy(), n_groups - s, axis=1)[:, n_groups - s :]
        offsets = torch.arange(g) * n_groups
        cand = (torch.from_numpy(top_groups)[:, :, None] + offsets).flatten(1)
        if n_groups * g < cols:
            tail = torch.arange(n_groups * g, cols).expand(rows, -1)
            cand = torch.cat([cand, tail], dim=1)
        n = cand.shape[1]
        top = np.argpartition(x.gather(1, cand).numpy(), n - s, axis=1)[:, n - s :]
    top = torch.from_numpy(np.ascontiguousarray(top))
    top = top if cand is None else cand.gather(1, top)
    return top.gather(1, x.gather(1, top).argsort(dim=1, descending=True))


class KeyPairDot(torch.autograd.Function):
    """``<keys[i], keys[j]>`` for index tensors ``i, j`` of shape ``[R, k]``.

    The backward is one sparse-dense product, ``grad_keys = S keys`` with ``S`` the symmetric
    ``[C, C]`` matrix holding ``grad`` at every ``(i, j)`` and ``(j, i)``: ``index_add_`` (the
    generic gather backward) is far slower on a multi-threaded CPU.
    """

    @staticmethod
    def forward(ctx, keys: Tensor, i: Tensor, j: Tensor) -> Tensor:
        ij = torch.cat([i.flatten(), j.flatten()])
        ctx.save_for_backward(keys, ij)
        k = keys.index_select(0, ij).view(2, -1, keys.shape[1])
        return k[0].mul_(k[1]).sum(dim=1).view_as(i)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        keys, ij = ctx.saved_tensors
        ji = ij.view(2, -1).flip(0).flatten()
        g = grad.flatten().to(keys.dtype)
        n = keys.shape[0]
        pairs = torch.sparse_coo_tensor(
            torch.stack([ij, ji]), torch.cat([g, g]), (n, n), check_invariants=False
        )
        return torch.sparse.mm(pairs, keys), None, None


class TakeAlongRows(torch.autograd.Function):
    """``logits.gather(1, index)``; the backward accumulates into a flat view with ``index_put_``.

    Same values and gradient as ``gather``, whose ``scatter_add_`` backward is far slower on a
    multi-threaded CPU.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor) -> Tensor:
        cols = logits.shape[1]
        flat = index + torch.arange(0, index.shape[0] * cols, cols, device=index.device)[:, None]
        ctx.save_for_backward(flat)
        ctx.shape = logits.shape
        return logits.reshape(-1).take(flat)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (flat,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.shape.numel())
        out.index_put_((flat.flatten(),), grad.flatten(), accumulate=True)
        return out.view(ctx.shape), None


class QueryOnlyGrad(torch.autograd.Function):
    """Synthetic logits ``value[r, p] = <q_r, h_rp>`` whose gradient reaches the queries only.

    ``h_rp = sum_c weights[r, p, c] keys[cols[r, p, c]]`` (``cols``, ``weights``: ``[R, k, n]``)
    is a constant, as in the released SSCL code, which detaches its synthetic negatives;
    ``value`` ``[R, k]`` is computed by the caller from the logits and returned unchanged. The
    backward is ``grad_queries = S keys`` with the sparse ``[R, C]`` matrix ``S`` holding
    ``grad[r, p] weights[r, p, c]`` at ``(r, cols[r, p, c])``: no ``[R, k, d]`` tensor is built.
    """

    @staticmethod
    def forward(
        ctx, queries: Tensor, value: Tensor, keys: Tensor, cols: Tensor, weights: Tensor
    ) -> Tensor:
        ctx.save_for_backward(keys, cols, weights)
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        keys, cols, weights = ctx.saved_tensors
        rows = cols.shape[0]
        row_idx = torch.arange(rows, device=cols.device)[:, None].expand(rows, cols[0].numel())
        pairs = torch.sparse_coo_tensor(
            torch.stack([row_idx.flatten(), cols.flatten()]),
            (grad[..., None] * weights).flatten().to(keys.dtype),
            (rows, keys.shape[0]),
            check_invariants=False,
        )
        return torch.sparse.mm(pairs, keys), None, None, None, None


def synthetic_logits(core: Logits, options) -> tuple[Tensor, Tensor | int]:
    """SSCL eq. 2: ``k = synthetic`` negatives per row, mixed from its ``s = hardest`` hardest ones.

    Returns their logits ``[R, k]`` (``-inf`` for rows without negatives) and how many were added
    per row. For ``h = a z_i + (1 - a) z_j`` the logit is ``<q, h> / |h|`` with
    ``<q, h> = a l_i + (1 - a) l_j`` read off the logits, and for unit keys
    ``|h|^2 = a^2 + (1 - a)^2 + 2 a (1 - a) <z_i, z_j>``, so no ``[R, k, d]`` tensor is built (an
    all-zero key, which ``F.normalize`` leaves zero, drops its ``a^2`` or ``(1 - a)^2`` term).
    ``normalize=False`` keeps ``h`` unnormalised (logit ``a l_i + (1 - a) l_j``).
    ``detach_synthetic``: the same values, with ``h`` a constant (gradient into the queries only,
    :class:`QueryOnlyGrad`). The other settings are ``options``' (:class:`.SSCLOptions`).
    """
    hardest, synthetic, mix, normalize = (options.hardest, options.synthetic, options.mix,
                                          options.normalize)
    detach, generator = options.detach_synthetic, options.generator
    logits = core.logits.detach() if detach else core.logits
    keys = core.keys.detach() if detach else core.keys
    if generator is not None and generator.device.type != logits.device.type:
        raise ValueError(f"generator is on {generator.device} but the inputs are on "
                         f"{logits.device}; pass torch.Generator(device='{logits.device.type}')")
    rows = logits.shape[0]
    # float32 draws whatever the input dtype, so a seed gives the same negatives in every precision.
    if core.row_ids is None:
        draws = None
    else:  # gathered: the global batch's draws, this rank's rows (same as one process); drawn
        # first, so that every rank's generator advances alike, even a rank without rows
        draws = torch.rand(core.global_rows, synthetic, 3, generator=generator,
                           device=logits.device)[core.row_ids]
    max_neg = core.num_neg
    if isinstance(max_neg, Tensor):
        max_neg = int(max_neg.max()) if rows else 0
    s = min(hardest, max_neg)
    if s == 0 or rows == 0:
        return logits.new_empty(rows, 0), 0
    # Decreasing order: rows with fewer than s negatives (labels) have the valid ones first.
    hard = hardest_columns(logits, s).to(logits.device)
    if draws is None:
        draws = torch.rand(rows, synthetic, 3, generator=generator, device=logits.device)
    if isinstance(core.num_neg, Tensor):
        count = core.num_neg.clamp(max=s)[:, None, None]  # valid hard negatives of each row
        pick = torch.minimum((draws[..., :2] * count).long(), (count - 1).clamp(min=0))
    else:
        count = None
        pick = (draws[..., :2] * s).long().clamp(max=s - 1)
    first = hard.gather(1, pick[..., 0])
    norm = None
    if mix:
        second = hard.gather(1, pick[..., 1])
        alpha = draws[..., 2].to(logits.dtype)
        picked = TakeAlongRows.apply(logits, torch.cat([first, second], dim=1))
        syn = torch.lerp(picked[:, synthetic:], picked[:, :synthetic], alpha)
        if normalize:
            cos = KeyPairDot.apply(keys, first, second)
            mixed = alpha * (1.0 - alpha)
            # a^2 |z_i|^2 + (1 - a)^2 |z_j|^2 with |z|^2 = 1, or 0 for an all-zero key
            zero = ~keys.any(dim=1)
            zero_i, zero_j = zero[first], zero[second]
            sq_sum = torch.where(
                zero_i | zero_j,
                alpha.square() * ~zero_i + (1.0 - alpha).square() * ~zero_j,
                1.0 - 2.0 * mixed,  # a^2 + (1 - a)^2 = 1 - 2a(1 - a)
            )
            norm = (sq_sum + 2.0 * mixed * cos).clamp(min=1e-24).sqrt()  # F.normalize's eps
            syn = syn / norm
    else:
        syn = TakeAlongRows.apply(logits, first)
    if detach:  # h = sum_c weights[..., c] keys[cols[..., c]], a constant
        if mix:
            cols = torch.stack([first, second], dim=2)
            weights = torch.stack([alpha, 1.0 - alpha], dim=2)
            weights = weights if norm is None else weights / norm[..., None]
        else:
            cols, weights = first[..., None], logits.new_ones(1, 1, 1).expand(rows, synthetic, 1)
        syn = QueryOnlyGrad.apply(core.queries, syn, keys, cols, weights)
    if count is None:
        return syn, synthetic
    valid = count[:, 0] > 0  # [R, 1]
    syn = torch.where(valid, syn, syn.new_tensor(-math.inf))
    return syn, valid[:, 0].long() * synthetic
