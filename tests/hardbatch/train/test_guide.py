"""hardbatch.train.guide: Trainer(guide=...) masks false negatives by a per-item guide
embedding or a guide module (GISTEmbed), against a plain-Python rule; its input checks."""

import math

import numpy as np
import pytest
import torch
from torch import nn
from train_support import SAMPLERS, noise_augment, small_model

import hardbatch as hb
from hardbatch.losses import InfoNCE
from hardbatch.train import TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


class RecordingInfoNCE(InfoNCE):
    """InfoNCE that keeps each call's ``false_negatives`` mask."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.masks = []

    def forward(self, anchor, positive, labels=None, negatives=None, false_negatives=None):
        self.masks.append(false_negatives)
        return super().forward(anchor, positive, labels, negatives, false_negatives)


def test_per_item_guide_masks_pairs_closer_than_the_margin(digits, tmp_path):
    """Trainer(guide=[N, d']): the loss gets False/True exactly as the plain rule
    i != j and cos(g_i, g_j) > 1 - margin (float64 reference), for every step's batch."""
    x, y = digits
    g = x[:, :8].double() + 0.2 * torch.arange(8, dtype=torch.float64)
    np.save(tmp_path / "guide.npy", g.numpy())
    for guide in (g, str(tmp_path / "guide.npy")):
        loss = RecordingInfoNCE(0.5, form="simcse")
        trainer = Trainer(small_model(), loss, SAMPLERS["uniform"], x, y, augment=noise_augment,
                          epochs=1, progress=False, guide=guide, guide_margin=0.05)
        result = trainer.fit()
        assert len(loss.masks) == len(result.last_epoch_batches) == 5
        for mask, batch in zip(loss.masks, result.last_epoch_batches):
            rows = [g[i].tolist() for i in batch]
            norm = [math.sqrt(sum(v * v for v in r)) for r in rows]
            want = [[i != j and sum(a * b for a, b in zip(rows[i], rows[j])) / (norm[i] * norm[j])
                     > 1 - 0.05 for j in range(len(batch))] for i in range(len(batch))]
            assert mask.dtype == torch.bool and mask.tolist() == want
        assert any(m.any() for m in loss.masks) and not all(m.all() for m in loss.masks)


def test_module_guide_embeds_the_two_views(digits):
    x, y = digits
    seen = []

    class Guide(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 6)

        def forward(self, v):
            seen.append(v.clone())
            return self.lin(v)

    guide = Guide()
    loss = RecordingInfoNCE(0.5)  # the SimCLR form
    Trainer(small_model(), loss, SAMPLERS["uniform"], x, y, augment=noise_augment, epochs=1,
            progress=False, guide=guide, guide_margin=0.2, max_steps=2).fit()
    assert len(loss.masks) == 2 and len(seen) == 4
    with torch.no_grad():
        for step, mask in enumerate(loss.masks):
            v1, v2 = seen[2 * step], seen[2 * step + 1]
            assert not torch.equal(v1, v2)  # the two augmented views
            assert torch.equal(mask, hb.guided_mask(guide(v1), guide(v2), 0.2, form="simclr"))


def test_guide_bad_input(digits):
    x, y = digits
    with pytest.raises(ValueError, match="guide_margin=0 with a per-item guide"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y, progress=False,
                guide=x[:, :4])
    with pytest.raises(ValueError, match="guide_margin=3 must lie in"):
        TrainConfig(guide_margin=3)
    with pytest.raises(ValueError, match="guide_margin=nan must lie in"):
        TrainConfig(guide_margin=float("nan"))
    with pytest.raises(ValueError, match="guide has 10 rows but there are 160 items"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y, progress=False,
                guide=x[:10, :4], guide_margin=0.1)
