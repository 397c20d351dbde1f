"""Guided false-negative masks in the training loop (``Trainer(guide=...)``; GISTEmbed)."""

from __future__ import annotations

import torch
from torch import nn

from ..losses import guided_mask
from ..metrics import load_reference

__all__ = ["check_guide", "guide_mask"]


def check_guide(guide, num_items: int, margin: float, device: torch.device):
    """``guide`` checked: None, an ``nn.Module`` (on ``device``, eval mode), or a float32
    ``[N, d']`` tensor of per-item guide embeddings (array, tensor or file)."""
    if guide is None:
        return None
    if isinstance(guide, nn.Module):
        return guide.to(device).eval()
    if margin <= 0:
        raise ValueError("guide_margin=0 with a per-item guide embedding masks nothing (an "
                         "item's guide similarity to itself is 1, so j is masked when "
                         "cos(g_i, g_j) > 1 - guide_margin): pass e.g. guide_margin=0.1")
    return torch.from_numpy(load_reference(guide, num_items, name="guide"))


@torch.no_grad()
def guide_mask(guide, idx: torch.Tensor, view1: torch.Tensor, view2: torch.Tensor,
               margin: float, loss) -> torch.Tensor:
    """The batch's mask [B, B] (``[b, B_global]`` with a gathering loss; True: not a
    negative) from a checked ``guide``.

    A module guide embeds the two views (``guided_mask(guide(view1), guide(view2))``); a
    per-item embedding gives both views row ``idx`` of it. The mask's form, ``gather`` and
    ``group`` follow the loss's options (``"simclr"`` or ``"simcse"``; a loss without
    options: ``"simcse"``, not gathered): with a ``gather=True`` loss under DDP the mask is
    this rank's anchors against the global batch, ``[b, B_global]``, as the loss expects
    (every rank's guide rows are all-gathered).
    """
    if isinstance(guide, nn.Module):
        g1, g2 = guide(view1).float(), guide(view2).float()
    else:
        g1 = g2 = guide[idx.cpu()]
    options = getattr(loss, "options", None)
    return guided_mask(g1, g2, margin, form=getattr(options, "form", "simcse"),
                       gather=bool(getattr(options, "gather", False)),
                       group=getattr(options, "group", None))
