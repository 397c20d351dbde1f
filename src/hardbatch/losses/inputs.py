"""Internal: the data of one loss call and the parts of its preparation beyond the plain batch.

Not public API (the losses are :mod:`hardbatch.losses`; their computation is :mod:`.core`).
:class:`PairBatch` holds the prepared inputs (this rank's anchors and positives, the candidates:
the same tensors or, with ``gather=True``, every rank's, the extra negatives, and the item-level
mask of what is not a negative) and :class:`Logits` the logits built from them. Half-precision
inputs are cast to float32 by :class:`SaturatingCast`; :func:`excluded_items` is the item mask
of ``labels`` and ``false_negatives``.

``gather=True`` under an initialised process group of W > 1 ranks:

1. every rank checks its own inputs (:mod:`.core`), then one fixed-size collective
   (:func:`hardbatch.distributed.all_gather_ints`) exchanges every rank's shapes, dtypes and
   errors, and every rank runs the same checks on them (:func:`check_every_rank`), so bad input
   (a rank's error, different embedding dims) raises a ``ValueError`` on every rank instead of
   hanging in a later gather;
2. :func:`gathered_batch`: ``[anchor | positive]`` (prepared) and the negatives are gathered with
   gradient (:func:`hardbatch.distributed.all_gather_rows_with_grad`), labels without; ranks may
   hold different batch sizes (even 0), the global batch is their concatenation in rank order;
3. ``false_negatives`` is not gathered: it must already be ``[b, B_global]``, this rank's
   anchors against the global batch's items (:func:`hardbatch.guided_mask` with
   ``gather=True`` builds it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ..distributed import all_gather_ints, all_gather_rows, all_gather_rows_with_grad

_warned_no_group = False


@dataclass
class PairBatch:
    """The checked inputs of one loss call (``b`` local pairs, ``B`` global items, ``B = b``
    without gather)."""

    anchor: Tensor  # [b, d], compute dtype, normalised if asked
    positive: Tensor  # [b, d]
    all_anchor: Tensor  # [B, d]: the global batch's anchors (``anchor`` itself without gather)
    all_positive: Tensor  # [B, d]
    bank: Tensor | None  # [m, d] extra negatives (every rank's with gather), None if none
    excluded: Tensor | None  # [b, B] bool: item j is not a negative of anchor i (own item True)
    total: int  # B, the items of the (global) batch
    offset: int = 0  # global index of this rank's first item
    world: int = 1  # ranks gathered over (1: no gather)


@dataclass
class Logits:
    """Similarity logits of one batch, shared by every loss.

    ``logits[r, c] = <query_r, key_c> / t`` for the R anchor rows and C candidate columns, with
    ``-inf`` wherever column ``c`` is not a negative of row ``r`` (itself, its positive, same
    label).
    """

    logits: Tensor  # [R, C]
    log_pos: Tensor  # [R], s_i+ / t
    num_neg: Tensor | int  # [R] (labels given) or one int for every row
    has_neg: Tensor | None  # [R] bool, None when every row has a negative
    keys: Tensor  # [C, d]
    queries: Tensor  # [R, d], already divided by t (logits = queries @ keys.T)
    temperature: float
    world: int = 1  # ranks the candidates were gathered from (1: no gather)
    global_rows: int = 0  # rows of the global batch (with gather)
    row_ids: Tensor | None = None  # [R] global row index of each row (with gather)


class SaturatingCast(torch.autograd.Function):
    """``x.to(dtype)`` whose backward casts the gradient back to ``x``'s (half) dtype saturated at
    its largest finite value: the true gradient of a row of tiny norm (``1 / |x|``) can exceed
    fp16's 65504, which would otherwise arrive as ``inf``."""

    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.in_dtype = x.dtype
        return x.to(dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        big = torch.finfo(ctx.in_dtype).max
        return grad.clamp(-big, big).to(ctx.in_dtype), None


def to_compute(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` (not in ``dtype``) in ``dtype``; half inputs through :class:`SaturatingCast`."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return SaturatingCast.apply(x, dtype)
    return x.to(dtype)


def excluded_items(row_labels: Tensor | None, col_labels: Tensor | None,
                   false_negatives: Tensor | None, offset: int, device) -> Tensor | None:
    """Item-level ``[b, B]`` mask of the candidates that are not negatives of each anchor.

    Same label as the anchor, or True in ``false_negatives``, and the anchor's own item (column
    ``offset + i``, whose positive view is the positive). None when only the own item is.
    """
    excluded = None
    if row_labels is not None:
        row_labels, col_labels = row_labels.to(device), col_labels.to(device)
        excluded = row_labels[:, None] == col_labels[None, :]  # own item included
    if false_negatives is not None:
        fn = false_negatives.to(device)
        excluded = fn.clone() if excluded is None else excluded | fn
        own = torch.arange(fn.shape[0], device=device)
        excluded[own, offset + own] = True
    return excluded


def gather_world(group) -> int:
    """World size to gather over; warns once (and returns 1) without a process group."""
    global _warned_no_group
    if not (dist.is_available() and dist.is_initialized()):
        if not _warned_no_group:
            _warned_no_group = True
            warnings.warn(
                "gather=True: torch.distributed is not initialised, so there is nothing to gather; "
                "the loss uses this process's batch only (launch with torchrun and call "
                "torch.distributed.init_process_group to gather negatives across ranks; warned "
                "once)", UserWarning, stacklevel=6)  # the caller of the loss function
        return 1
    return dist.get_world_size(group)


_LABEL_NONE, _LABEL_INT, _LABEL_FLOAT = 0, 1, 2


def _local_info(anchor, positive, labels, negatives, false_negatives,
                error: ValueError | None) -> list[int]:
    """This rank's ``[error, b, d, m, dtype, labels, fn_rows, fn_cols, grad_z, grad_bank]``;
    ``error``: the error of its own input checks (:mod:`.core`), if any."""
    ok = isinstance(anchor, Tensor) and anchor.dim() == 2
    b, d = (anchor.shape[0], anchor.shape[1]) if ok else (0, 0)
    m = negatives.shape[0] if isinstance(negatives, Tensor) and negatives.dim() else -1
    lab = _LABEL_NONE if labels is None else (
        _LABEL_FLOAT if isinstance(labels, Tensor) and labels.is_floating_point() else _LABEL_INT)
    fn = false_negatives
    fn_2d = isinstance(fn, Tensor) and fn.dim() == 2
    fn_shape = list(fn.shape) if fn_2d else [-1, -1]
    if error is not None:
        return [1, b, d, m, 0, lab, *fn_shape, 0, 0]
    grad = torch.is_grad_enabled()
    # the compute dtype (half precision computes in float32), as a bit width
    dtype = 64 if torch.float64 in (anchor.dtype, positive.dtype) else 32
    grad_z = int(grad and (anchor.requires_grad or positive.requires_grad))
    grad_bank = int(grad and m > 0 and negatives.requires_grad)
    return [0, b, d, m, dtype, lab, *fn_shape, grad_z, grad_bank]


def check_every_rank(anchor, positive, labels, negatives, false_negatives,
                     error: ValueError | None, group) -> tuple[list[list[int]], int, int]:
    """The checks of ``gather=True``, the same on every rank: each rank's :func:`_local_info`
    (``error``: its own checks' error, raised here after the exchange so that no rank waits
    alone), exchanged. Returns every rank's, for :func:`gathered_batch`, and the global batch's
    pairs and extra negatives, whose count the caller checks."""
    info = _local_info(anchor, positive, labels, negatives, false_negatives, error)
    infos = all_gather_ints(info, group)
    bad = [r for r, info in enumerate(infos) if info[0]]
    if error is not None:
        raise error
    if bad:
        raise ValueError(
            f"gather=True: the loss inputs of rank(s) {bad} were rejected (see the error raised "
            "there); every rank raises, so that none waits in the gather")
    shapes = ", ".join(f"rank {r}: [{i[1]}, {i[2]}]" for r, i in enumerate(infos))
    if len({i[2] for i in infos}) > 1:
        raise ValueError(
            f"gather=True needs the same embedding dim on every rank, got anchor / positive "
            f"shapes {shapes}; every rank must use the same encoder output size")
    if len({i[4] for i in infos}) > 1:
        names = ", ".join(f"rank {r}: float{i[4]}" for r, i in enumerate(infos))
        raise ValueError(f"gather=True needs the same compute dtype on every rank (half "
                         f"precision counts as float32), got {names}; cast the embeddings")
    kinds = {i[5] for i in infos}
    if len(kinds) > 1:
        raise ValueError(
            "gather=True: labels must be given on every rank or on none, and be integer on all "
            f"or float on all, got (0 none, 1 integer, 2 float) {[i[5] for i in infos]}")
    total, extra = sum(i[1] for i in infos), sum(max(i[3], 0) for i in infos)
    wrong = [(r, i[6], i[7]) for r, i in enumerate(infos) if i[6] >= 0 and i[7] != total]
    if wrong:
        got = ", ".join(f"rank {r}: [{rows}, {cols}]" for r, rows, cols in wrong)
        raise ValueError(
            f"gather=True: false_negatives must be [b, {total}] on every rank (its anchors x the "
            f"global batch's {total} items, in rank order; batch shapes {shapes}), got {got}; "
            "build it with hardbatch.guided_mask(..., gather=True)")
    return infos, total, extra


def _with_grad(x: Tensor, needed: bool) -> Tensor:
    """``x`` as a leaf that requires grad when another rank's copy does (``needed``): the gather's
    backward is a collective, so every rank must run it."""
    return x.detach().requires_grad_() if needed and not x.requires_grad else x


def gathered_batch(za: Tensor, zp: Tensor, bank: Tensor | None, labels: Tensor | None,
                   false_negatives: Tensor | None, infos: list[list[int]], group) -> PairBatch:
    """The global batch of ``gather=True`` around this rank's prepared (cast, normalised) views
    ``za``, ``zp`` and negatives ``bank``; ``infos`` from :func:`check_every_rank`."""
    rank, world = dist.get_rank(group), len(infos)
    counts = [i[1] for i in infos]
    offset, d = sum(counts[:rank]), za.shape[1]
    both = _with_grad(torch.cat([za, zp], dim=1), any(i[8] for i in infos))
    both = all_gather_rows_with_grad(both, group, counts)
    all_bank = None
    if any(i[3] > 0 for i in infos):
        mine = _with_grad(za.new_zeros(0, d) if bank is None else bank, any(i[9] for i in infos))
        all_bank = all_gather_rows_with_grad(mine, group, [max(i[3], 0) for i in infos])
    all_labels = None
    if labels is not None:
        kind = torch.float64 if labels.is_floating_point() else torch.int64
        all_labels = all_gather_rows(labels.to(kind), group, counts)
        labels = labels.to(kind)
    excluded = excluded_items(labels, all_labels, false_negatives, offset, za.device)
    return PairBatch(za, zp, both[:, :d], both[:, d:], all_bank, excluded, both.shape[0], offset,
                     world)
