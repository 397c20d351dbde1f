"""``false_negatives=`` on every loss and :func:`hardbatch.guided_mask`, against plain float64
references (tests/loss_reference.py: Python loops over the rows and their negatives)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_reference import FORMS, KINDS, call, pair, ref_kwargs, reference, unit

import hardbatch as hb
from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss

LABELS = torch.tensor([0, 1, 0, 2, 1, 3])


def _mask(b: int, seed: int, p: float = 0.35) -> torch.Tensor:
    return torch.rand(b, b, generator=torch.Generator().manual_seed(seed)) < p


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["mask", "mask+labels", "mask+bank", "full_row"])
def test_matches_float64_reference(kind, form, variant):
    """Values and gradients: item j's views leave anchor i's negatives where M[i, j]; N counts
    the remaining ones (DCL / HCL); SSCL mixes its hardest among them; bank rows stay."""
    a, p = pair(b=6, d=5, seed=2)
    mask = _mask(6, 3)
    if variant == "full_row":  # row 1 keeps no in-batch negative: loss 0, no gradient
        mask[1] = True
    kw = {"form": form, "temperature": 0.3, "tau_plus": 0.2, "beta": 0.7, "hardest": 4,
          "synthetic": 3, "seed": 5, "false_negatives": mask}
    if "labels" in variant:
        kw["labels"] = LABELS
    if "bank" in variant:
        kw["negatives"] = torch.randn(3, 5, generator=torch.Generator().manual_seed(9),
                                      dtype=torch.float64)
    x, y = a.clone().requires_grad_(), p.clone().requires_grad_()
    got = call(kind, x, y, reduction="none", **kw)
    xr, yr = a.clone().requires_grad_(), p.clone().requires_grad_()
    want = reference(xr, yr, **ref_kwargs(kind, **kw))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    grads = torch.autograd.grad(got.sum(), [x, y])
    expected = torch.autograd.grad(want.sum(), [xr, yr])
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-10)
    if variant == "full_row":
        rows = [1, 7] if form == "simclr" else [1]
        assert (got[rows] == 0).all()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_generalises_labels(kind, form):
    """M[i, j] = labels_i == labels_j gives the labels' loss exactly; together they are a union;
    the diagonal is ignored (the positive always stays the positive)."""
    a, p = pair(b=6, seed=6)
    same = LABELS[:, None] == LABELS[None, :]
    kw = {"form": form, "hardest": 3, "synthetic": 2, "seed": 1}
    by_labels = call(kind, a, p, labels=LABELS, reduction="none", **kw)
    assert torch.equal(call(kind, a, p, false_negatives=same, reduction="none", **kw), by_labels)
    no_diag = same & ~torch.eye(6, dtype=torch.bool)
    assert torch.equal(call(kind, a, p, false_negatives=no_diag, reduction="none", **kw),
                       by_labels)
    extra = _mask(6, 8)
    union = call(kind, a, p, labels=LABELS, false_negatives=extra, reduction="none", **kw)
    assert torch.equal(union, call(kind, a, p, false_negatives=extra | same, reduction="none",
                                   **kw))


@pytest.mark.parametrize("module, fn", [
    (InfoNCE(0.2, form="simcse"), hb.info_nce),
    (DebiasedInfoNCE(0.5, 0.05), hb.debiased_info_nce),
    (HardNegativeInfoNCE(0.5, 0.05, 0.5), hb.hard_negative_info_nce),
    (SSCLLoss(hardest=3, synthetic=2), hb.sscl_loss),
])
def test_modules_take_false_negatives(module, fn):
    a, p = pair(b=6, seed=12)
    mask = _mask(6, 4)
    if isinstance(module, SSCLLoss):
        module.generator = torch.Generator().manual_seed(0)
    got = module(a, p, false_negatives=mask)
    options = {k: v for k, v in module.options.kwargs().items() if k != "generator"}
    if isinstance(module, SSCLLoss):
        options["generator"] = torch.Generator().manual_seed(0)
    assert torch.equal(got, fn(a, p, false_negatives=mask, **options))
    assert not torch.equal(got, fn(a, p, **options))  # the mask changed something


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(6, 5, dtype=torch.bool), r"false_negatives must be a bool tensor of shape \[6, 6\]"),
    (torch.zeros(6, dtype=torch.bool), r"false_negatives must be a bool tensor of shape"),
    (torch.zeros(6, 6, dtype=torch.uint8), "false_negatives must be a bool tensor.*dtype"),
    (torch.zeros(6, 6), "false_negatives must be a bool tensor.*dtype"),
    ([[False] * 6] * 6, "false_negatives must be a bool tensor of shape"),
])
def test_bad_masks(bad, match):
    a, p = pair(b=6)
    with pytest.raises(ValueError, match=match):
        hb.info_nce(a, p, false_negatives=bad)
    with pytest.raises(ValueError, match=match):
        hb.DebiasedInfoNCE()(a, p, false_negatives=bad)


# ------------------------------------------------------------------------------- guided_mask


def _guided_reference(ga, gp, margin, form):
    """GISTEmbed's rule with explicit loops over float64 cosines."""
    ga, gp = unit(ga.double()), unit(gp.double())
    b = ga.shape[0]
    out = torch.zeros(b, b, dtype=torch.bool)
    for i in range(b):
        threshold = float(ga[i] @ gp[i]) - margin
        for j in range(b):
            sims = [float(ga[i] @ gp[j])]
            if form == "simclr":
                sims += [float(ga[i] @ ga[j]), float(gp[i] @ gp[j])]
            out[i, j] = i != j and max(sims) > threshold
    return out


@pytest.mark.parametrize("form", ["simcse", "simclr"])
@pytest.mark.parametrize("margin", [0.0, 0.1, 0.5, -0.2])
def test_guided_mask_matches_reference(form, margin):
    gen = torch.Generator().manual_seed(21)
    ga = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    gp = ga + 0.9 * torch.randn(9, 4, generator=gen, dtype=torch.float64)
    got = hb.guided_mask(ga, gp, margin, form=form)
    assert got.dtype == torch.bool and got.shape == (9, 9)
    assert torch.equal(got, _guided_reference(ga, gp, margin, form))
    assert not got.diagonal().any()
    if margin == 0.5:
        assert got.any() and not got.all()


def test_guided_mask_feeds_the_losses_and_has_no_gradient():
    """A duplicate item (the same text twice) is masked for its twin; the mask changes the loss
    exactly as the equivalent explicit mask does; guide gradients are not taken."""
    a, p = pair(b=5, seed=30)
    ga, gp = a.clone(), p.clone()
    ga[3], gp[3] = ga[1], gp[1]  # item 3 is a copy of item 1: the guide finds it as close
    mask = hb.guided_mask(ga.requires_grad_(), gp, 0.0)
    assert not mask.requires_grad
    assert not mask[1, 3]  # cos(a1, p3) == cos(a1, p1): not strictly greater (GISTEmbed's rule)
    mask = hb.guided_mask(ga, gp, 1e-6)
    assert mask[1, 3] and mask[3, 1]  # any positive margin masks the copy
    value = hb.info_nce(a, p, form="simcse", false_negatives=mask)
    assert torch.isfinite(value)


@pytest.mark.parametrize("kwargs, match", [
    ({"margin": math.nan}, "margin must be a finite number"),
    ({"margin": math.inf}, "margin must be a finite number"),
    ({"margin": "0.1"}, "margin must be a finite number"),
    ({"form": "moco"}, "unknown form"),
    ({"guide_positive": torch.randn(4, 5)}, "same shape"),
    ({"guide_anchor": torch.randn(4)}, "guide_anchor must be a 2-D float tensor"),
    ({"guide_positive": torch.ones(4, 3, dtype=torch.long)}, "guide_positive must be a 2-D float"),
    ({"guide_anchor": torch.full((4, 3), math.nan)}, "guide_anchor contains NaN"),
    ({"guide_positive": torch.randn(4, 3, device="meta")},  # was a raw RuntimeError in matmul
     r"guide_anchor and guide_positive must be on the same device, got cpu and meta; move"),
])
def test_guided_mask_errors(kwargs, match):
    args = {"guide_anchor": torch.randn(4, 3), "guide_positive": torch.randn(4, 3), **kwargs}
    with pytest.raises(ValueError, match=match):
        hb.guided_mask(**args)


def test_guided_mask_is_exported():
    assert "guided_mask" in hb.__all__ and hb.guided_mask is hb.losses.guided_mask
