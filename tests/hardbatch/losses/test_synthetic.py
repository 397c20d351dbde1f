"""Tests of hardbatch.losses.synthetic: SSCL's synthetic hard negatives against an explicit
float64 reference (mixing, clamping, reproducibility, detached variant, zero keys)."""

from __future__ import annotations

import pytest
import torch
from loss_reference import FORMS, call, pair, ref_kwargs, reference, unit

from hardbatch.losses import SSCLLoss, sscl_loss
from hardbatch.losses.synthetic import hardest_columns


@pytest.mark.parametrize("form", FORMS)
def test_sscl_copies_of_hard_negatives_mix_false(form):
    """mix=False: synthetic negatives are resampled copies of hard ones (the released code)."""
    a, p = pair(b=5, seed=2)
    kw = {"form": form, "hardest": 3, "synthetic": 4, "mix": False, "seed": 3}
    got = call("sscl", a, p, reduction="none", **kw)
    torch.testing.assert_close(got, reference(a, p, **ref_kwargs("sscl", **kw)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("form", FORMS)
def test_sscl_hardest_clamped_to_available(form):
    a, p = pair(b=4, seed=3)
    available = 6 if form == "simclr" else 3
    big = sscl_loss(
        a, p, form=form, hardest=1000, synthetic=5, generator=torch.Generator().manual_seed(1)
    )
    clamped = sscl_loss(
        a, p, form=form, hardest=available, synthetic=5, generator=torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(big, clamped, rtol=0, atol=0)
    expected = reference(
        a, p, **ref_kwargs("sscl", form=form, hardest=1000, synthetic=5, seed=1)
    ).mean()
    torch.testing.assert_close(big, expected, rtol=0, atol=1e-6)


def test_sscl_generator_reproducible():
    a, p = pair(b=8, seed=4)
    run = lambda seed: sscl_loss(
        a, p, hardest=4, synthetic=6, generator=torch.Generator().manual_seed(seed)
    )
    assert run(7).item() == run(7).item()
    assert run(7).item() != run(8).item()
    module = SSCLLoss(hardest=4, synthetic=6, generator=torch.Generator().manual_seed(7))
    assert module(a, p).item() == run(7).item()


@pytest.mark.parametrize("labelled", [False, True])
def test_sscl_larger_batch_uses_hardest_negatives(labelled):
    """Also exercises the grouped hardest-column selection (C >= 64 s, with a tail)."""
    a, p = pair(b=65, d=8, seed=5)
    kw = {"form": "simclr", "hardest": 2, "synthetic": 3, "seed": 2, "tau_plus": 0.05}
    if labelled:  # label 0 covers all but one item: most rows have just 2 negatives
        kw["labels"] = torch.tensor([0] * 64 + [1])
    expected = reference(a, p, **ref_kwargs("sscl", **kw))
    torch.testing.assert_close(
        call("sscl", a, p, reduction="none", **kw), expected, rtol=0, atol=1e-6
    )
    got = call("sscl", a.float(), p.float(), reduction="none", **kw)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "rows, cols, s", [(7, 2100, 32), (5, 640, 8), (9, 40, 39), (3, 1000, 1), (4, 300, 32)]
)
def test_hardest_columns_match_topk(rows, cols, s):
    x = torch.randn(rows, cols)
    x[0, : cols // 2] = float("-inf")  # a masked row: the valid columns must come first
    expected = torch.topk(x, s, dim=1)
    got = hardest_columns(x, s)
    torch.testing.assert_close(x.gather(1, got), expected.values)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mix", [True, False])
@pytest.mark.parametrize("variant", ["plain", "labels+bank", "raw"])
def test_sscl_detach_synthetic(form, mix, variant):
    """Same value bit for bit; the gradient is that of <q, stopgrad(h)> / t (the released code)."""
    a, p = pair(b=6, d=4, seed=16)
    kw = {"form": form, "temperature": 0.3, "tau_plus": 0.1, "beta": 0.8, "hardest": 4,
          "synthetic": 3, "mix": mix, "seed": 6}
    bank = None
    if variant == "labels+bank":
        kw["labels"] = torch.tensor([0, 1, 0, 2, 1, 3])
        bank = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if variant == "raw":
        kw["normalize"] = False
        a, p = unit(a), unit(p)
    values, grads = [], []
    for detach in (False, True):
        x, y = a.clone().requires_grad_(True), p.clone().requires_grad_(True)
        n = None if bank is None else bank.clone().requires_grad_(True)
        loss = call("sscl", x, y, negatives=n, detach_synthetic=detach, reduction="none", **kw)
        got = torch.autograd.grad(loss.sum(), [x, y] + ([] if n is None else [n]))
        xr, yr = a.clone().requires_grad_(True), p.clone().requires_grad_(True)
        nr = None if bank is None else bank.clone().requires_grad_(True)
        ref = reference(xr, yr, detach_synthetic=detach, **ref_kwargs("sscl", negatives=nr, **kw))
        expected = torch.autograd.grad(ref.sum(), [xr, yr] + ([] if nr is None else [nr]))
        torch.testing.assert_close(loss, ref, rtol=0, atol=1e-10)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-8)
        values.append(loss)
        grads.append(torch.cat([g.flatten() for g in got]))
    assert torch.equal(values[0], values[1])
    assert not torch.allclose(grads[0], grads[1])  # the keys' gradients differ


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("detach", [False, True])
def test_sscl_all_zero_key(form, detach):
    """An all-zero key (F.normalize leaves it zero) mixes as an explicit zero vector.

    Zero rows only where they are keys and not queries (a bank row; a positive in the SimCSE
    form): a zero query's logits all tie at 0, so its hardest negatives are not unique.
    """
    a, p = pair(b=4, d=3, seed=18)
    bank = torch.randn(3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    bank[1] = 0.0
    if form == "simcse":
        p[2] = 0.0
    kw = {"form": form, "tau_plus": 0.0, "beta": 0.0, "hardest": 9, "synthetic": 8, "seed": 3}
    x, y, n = (t.clone().requires_grad_(True) for t in (a, p, bank))
    loss = call("sscl", x, y, negatives=n, reduction="none", detach_synthetic=detach, **kw)
    got = torch.autograd.grad(loss.sum(), [x, y, n])
    xr, yr, nr = (t.clone().requires_grad_(True) for t in (a, p, bank))
    ref = reference(xr, yr, detach_synthetic=detach, **ref_kwargs("sscl", negatives=nr, **kw))
    expected = torch.autograd.grad(ref.sum(), [xr, yr, nr])
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-10)
    # A zero row gets a zero gradient (F.normalize's would be ~1e11: it divides by eps = 1e-12).
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-8)
    assert torch.equal(got[2][1], torch.zeros(3, dtype=torch.float64))
