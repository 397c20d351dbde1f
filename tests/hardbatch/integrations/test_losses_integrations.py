"""hardbatch losses used like those of lightly and pytorch-metric-learning (as
sentence-transformers' losses: tests/hardbatch/integrations/sentence_transformers/test_loss.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss


def _views(b=8, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=gen), torch.randn(b, d, generator=gen)


# --------------------------------------------------------------------------- lightly style


@pytest.mark.parametrize("cls", [InfoNCE, DebiasedInfoNCE, HardNegativeInfoNCE, SSCLLoss])
def test_lightly_style_two_positional_views(cls):
    """``criterion(out0, out1)`` as in lightly's NTXentLoss: SimCLR form, both directions."""
    out0, out1 = _views()
    criterion = (
        cls(temperature=0.5)
        if cls is not SSCLLoss
        else cls(generator=torch.Generator().manual_seed(0))
    )
    loss = criterion(out0, out1)
    assert loss.shape == () and torch.isfinite(loss)
    if cls is InfoNCE:  # lightly's NT-Xent: cross-entropy over the 2B x 2B cosine logits
        z = F.normalize(torch.cat([out0, out1]), dim=1)
        logits = (z @ z.T / 0.5).fill_diagonal_(float("-inf"))
        b = out0.shape[0]
        target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)])
        torch.testing.assert_close(loss, F.cross_entropy(logits, target))


# ------------------------------------------------------------------- pytorch-metric-learning style


def test_metric_learning_style_labels_mask_false_negatives():
    """``labels=`` class labels: a same-class item is never a negative (dense check)."""
    out0, out1 = _views(b=6)
    labels = torch.tensor([0, 1, 0, 1, 2, 2])
    loss = InfoNCE(temperature=0.2, form="simcse", reduction="none")(out0, out1, labels=labels)
    logits = F.normalize(out0, dim=1) @ F.normalize(out1, dim=1).T / 0.2
    same = labels[:, None] == labels[None, :]
    dense = logits.masked_fill(same & ~torch.eye(6, dtype=torch.bool), float("-inf"))
    torch.testing.assert_close(loss, F.cross_entropy(dense, torch.arange(6), reduction="none"))
    # Without labels the same-class items count as negatives, so the loss is larger.
    assert (InfoNCE(0.2, form="simcse", reduction="none")(out0, out1) > loss).all()
