"""Guided false-negative masks (GISTEmbed, Solatorio 2024) for the losses' ``false_negatives``.

A guide (a fixed, usually stronger embedding model) decides which in-batch candidates are too
close to an anchor to be negatives: :func:`guided_mask` returns the bool ``[B, B]`` mask that
every hardbatch loss takes as ``false_negatives=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from .._validation import check_choice, check_margin, l2_normalize_rows
from ..distributed import all_gather_ints, all_gather_rows, is_distributed
from .core import compute_dtype

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["guided_mask"]


@torch.no_grad()
def guided_mask(
    guide_anchor: Tensor,
    guide_positive: Tensor,
    margin: float = 0.0,
    *,
    form: Literal["simcse", "simclr"] = "simcse",
    gather: bool = False,
    group: ProcessGroup | None = None,
) -> Tensor:
    """GISTEmbed's false-negative mask from guide embeddings of the two views.

    ``M[i, j]`` is True (item ``j`` is not a negative of anchor ``i``) where ``i != j`` and
    ``cos(ga_i, gp_j) > cos(ga_i, gp_i) - margin``: the guide finds ``j``'s positive view
    closer to anchor ``i`` than ``margin`` below ``i``'s own positive. This is the
    ``margin_strategy="absolute"`` rule of sentence-transformers' ``GISTEmbedLoss`` (strict
    ``>``, threshold the guide's anchor-positive similarity of the row, the positive itself never
    masked), so ``info_nce(a, p, form="simcse", false_negatives=guided_mask(ga, gp, margin))``
    equals ``GISTEmbedLoss(..., margin=margin, contrast_anchors=False,
    contrast_positives=False)`` at the same temperature.

    ``form="simclr"``: GISTEmbed (``contrast_anchors=True``, ``contrast_positives=True``) also
    masks the anchor-anchor and positive-positive similarities, each with the guide similarity of
    the same pair (``cos(ga_i, ga_j)``, ``cos(gp_i, gp_j)``) against the same threshold. An item
    mask cannot keep one view of ``j`` and drop the other, so ``j`` is masked for ``i`` when
    any of the three guide similarities exceeds the threshold: every candidate GISTEmbed masks
    is masked, plus the other view of the same item (it is the same item, so it is as false a
    negative). The losses' SimCLR form applies ``M[i]`` to both rows of item ``i``.

    Args:
        guide_anchor, guide_positive: ``[B, d]`` guide embeddings of the anchors and positives
            (no gradient is taken; half precision is computed in float32).
        margin: a finite number; larger masks fewer candidates, negative more.
        form: ``"simcse"`` (the anchor-positive rule) or ``"simclr"`` (any of the three blocks).
        gather: with ``gather=True`` losses: the guide embeddings of every rank of ``group`` are
            all-gathered, and the mask is this rank's anchors against the global batch,
            ``[b, B_global]`` (column ``offset + i`` is anchor ``i``'s own item), as the losses
            expect. Without an initialised process group it is the plain ``[B, B]`` mask.
        group: the process group (None: the default one).

    Returns:
        bool ``[B, B]`` (``[b, B_global]`` with ``gather``), on the guide embeddings' device.

    References:
        Solatorio, "GISTEmbed: Guided In-sample Selection of Training Negatives for Text
        Embedding Fine-tuning", 2024 (arXiv:2402.16829).

    Example:
        >>> import torch
        >>> from hardbatch.losses import guided_mask, info_nce
        >>> guide_a = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])  # items 0, 1 alike
        >>> guide_p = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.1, 1.0]])
        >>> mask = guided_mask(guide_a, guide_p, margin=0.05)
        >>> mask.int()
        tensor([[0, 1, 0],
                [1, 0, 0],
                [0, 0, 0]], dtype=torch.int32)
        >>> _ = torch.manual_seed(0)
        >>> a, p = torch.randn(3, 8), torch.randn(3, 8)
        >>> round(info_nce(a, p, form="simcse", false_negatives=mask).item(), 4)
        1.1017
    """
    check_choice("form", form, ("simcse", "simclr"))
    margin = check_margin(margin)
    error = _check_guides(guide_anchor, guide_positive)
    distributed = gather and is_distributed(group)
    if not distributed and error is not None:
        raise error
    offset = 0
    if distributed:  # shapes (and errors) first, so that a bad rank cannot leave others waiting
        b, d = guide_anchor.shape if error is None else (0, 0)
        infos = all_gather_ints([int(error is not None), b, d], group)
        if error is not None:
            raise error
        if any(bad for bad, _, _ in infos):
            raise ValueError(f"guided_mask(gather=True): the guide embeddings of rank(s) "
                             f"{[r for r, i in enumerate(infos) if i[0]]} were rejected (see "
                             "the error raised there)")
        if len({d for _, _, d in infos}) > 1:
            shapes = ", ".join(f"rank {r}: [{b}, {d}]" for r, (_, b, d) in enumerate(infos))
            raise ValueError(f"guided_mask(gather=True) needs the same guide embedding dim on "
                             f"every rank, got {shapes}")
    dtype = compute_dtype(guide_anchor, guide_positive)
    ga = l2_normalize_rows(guide_anchor.detach().to(dtype))
    gp = l2_normalize_rows(guide_positive.detach().to(dtype))
    all_a, all_p = ga, gp
    if distributed:
        counts = [b for _, b, _ in infos]
        both = all_gather_rows(torch.cat([ga, gp], dim=1), group, counts)
        all_a, all_p = both[:, :d], both[:, d:]
        offset = sum(counts[:torch.distributed.get_rank(group)])
    own = torch.arange(ga.shape[0], device=ga.device)
    sim = ga @ all_p.T  # [b, B]
    # The threshold is the same matrix's diagonal, as in GISTEmbedLoss (no separate rounding).
    threshold = (sim[own, offset + own] - margin)[:, None]
    mask = sim > threshold
    if form == "simclr":
        mask |= ga @ all_a.T > threshold
        mask |= gp @ all_p.T > threshold
    mask[own, offset + own] = False
    return mask


def _check_guides(guide_anchor, guide_positive) -> ValueError | None:
    """The error for guide embeddings that are not two finite float ``[B, d]`` of one shape."""
    for name, x in (("guide_anchor", guide_anchor), ("guide_positive", guide_positive)):
        if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            dtype = f" {x.dtype}" if isinstance(x, Tensor) else ""
            return ValueError(f"{name} must be a 2-D float tensor [B, d] of guide embeddings, "
                              f"got{dtype} {got}")
    if guide_anchor.shape != guide_positive.shape:
        return ValueError(
            f"guide_anchor and guide_positive must have the same shape [B, d] (row i of each is a "
            f"pair), got {tuple(guide_anchor.shape)} and {tuple(guide_positive.shape)}")
    if guide_anchor.device != guide_positive.device:
        return ValueError(f"guide_anchor and guide_positive must be on the same device, got "
                          f"{guide_anchor.device} and {guide_positive.device}; move them with "
                          ".to(device)")
    for name, x in (("guide_anchor", guide_anchor), ("guide_positive", guide_positive)):
        if not bool(torch.isfinite(x).all()):
            return ValueError(f"{name} contains NaN or inf values; check the guide model")
    return None
