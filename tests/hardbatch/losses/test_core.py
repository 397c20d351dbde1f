"""Tests of hardbatch.losses.core through the losses: masking (labels, rows without negatives,
memory bank, B = 1), reductions, the HCL weights' gradient, precision and autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from loss_reference import FORMS, KINDS, call, pair, ref_kwargs, reference, unit

from hardbatch.losses import debiased_info_nce, hard_negative_info_nce, info_nce


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["hard_negative", "sscl"])
def test_detach_weights(kind, form):
    """Same value; the gradient treats the HCL weights as constants."""
    a, p = pair(b=5, d=4, seed=8)
    kw = {"form": form, "temperature": 0.3, "tau_plus": 0.1, "beta": 1.5, "hardest": 3,
          "synthetic": 2, "seed": 4}
    grads = []
    for detach in (False, True):
        x, y = a.clone().requires_grad_(True), p.clone().requires_grad_(True)
        loss = call(kind, x, y, detach_weights=detach, **kw)
        loss.backward()
        xr, yr = a.clone().requires_grad_(True), p.clone().requires_grad_(True)
        ref = reference(xr, yr, detach_weights=detach, **ref_kwargs(kind, **kw)).mean()
        ref.backward()
        torch.testing.assert_close(loss, ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(x.grad, xr.grad, rtol=0, atol=1e-8)
        torch.testing.assert_close(y.grad, yr.grad, rtol=0, atol=1e-8)
        grads.append(x.grad)
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_low_temperature(kind, form, dtype):
    """At t = 0.05, exp(1/t) = 4.9e8 overflows fp16; the log-space losses stay finite and exact."""
    a, p = pair(b=8, d=16, seed=9)
    a, p = unit(a).to(dtype), unit(p).to(dtype)
    kw = {
        "form": form,
        "temperature": 0.05,
        "tau_plus": 0.1,
        "beta": 1.0,
        "hardest": 4,
        "synthetic": 3,
        "seed": 1,
    }
    if dtype == torch.float16:
        naive = torch.exp((a @ p.T) / torch.tensor(0.05, dtype=dtype))
        assert not torch.isfinite(naive.sum(dim=1)).all()  # the plain round trip overflows
    x, y = a.clone().requires_grad_(True), p.clone().requires_grad_(True)
    loss = call(kind, x, y, **kw)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()
    assert x.grad.dtype == dtype
    xr, yr = a.double().requires_grad_(True), p.double().requires_grad_(True)
    ref = reference(xr, yr, **ref_kwargs(kind, **kw)).mean()
    ref.backward()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    scale = xr.grad.abs().max()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=0, atol=2e-2 * scale)


@pytest.mark.parametrize("kind", KINDS)
def test_float32_extreme_temperature(kind):
    a, p = pair(b=16, d=8, seed=10)
    kw = {"temperature": 0.005, "tau_plus": 0.1, "hardest": 6, "synthetic": 4}
    got = call(kind, a.float(), p.float(), reduction="none", **kw)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(
        got.double(), reference(a, p, **ref_kwargs(kind, **kw)), rtol=1e-4, atol=1e-3
    )


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_autocast_is_disabled_inside(kind, form):
    """Under bf16 autocast (mixed-precision trainers) float32 inputs give the same loss."""
    gen = torch.Generator().manual_seed(19)
    a = torch.randn(24, 32, generator=gen)
    p = 0.3 * a + torch.randn(24, 32, generator=gen)
    kw = {"form": form, "temperature": 0.05, "hardest": 4, "synthetic": 3, "seed": 2,
          "labels": torch.arange(24) % 5, "negatives": torch.randn(4, 32, generator=gen)}
    results = []
    for autocast in (False, True):
        x = a.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = call(kind, x, p, reduction="none", **kw)
            assert torch.is_autocast_cpu_enabled() == autocast  # restored on the way out
        loss.sum().backward()
        results.append((loss, x.grad))
    assert results[1][0].dtype == torch.float32
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_labels_exclude_same_label_pairs(kind, form):
    """Moving a same-label item (not the positive) leaves the anchor's loss unchanged."""
    a, p = pair(b=6, seed=11)
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    kw = {"form": form, "labels": labels, "reduction": "none", "hardest": 3, "synthetic": 2}
    before = call(kind, a, p, **kw)
    a2, p2 = a.clone(), p.clone()
    a2[2], p2[2] = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    after = call(kind, a2, p2, **kw)
    rows = [0, 5] + ([6, 11] if form == "simclr" else [])
    torch.testing.assert_close(after[rows], before[rows], rtol=0, atol=1e-12)
    changed = [1] if form == "simcse" else [1, 7]  # label 1 sees item 2 as a negative
    assert not torch.allclose(after[changed], before[changed])


@pytest.mark.parametrize("form", FORMS)
def test_labels_dense_logsumexp(form):
    """InfoNCE with labels equals a dense masked logsumexp over the logit matrix."""
    a, p = pair(b=7, seed=12)
    labels = torch.tensor([3, 1, 3, 2, 1, 0, 3])
    t = 0.25
    za, zp = F.normalize(a, dim=1), F.normalize(p, dim=1)
    if form == "simclr":
        z = torch.cat([za, zp])
        logits = z @ z.T / t
        lab = torch.cat([labels, labels])
        pos = torch.cat([(za * zp).sum(1), (za * zp).sum(1)]) / t
    else:
        logits = za @ zp.T / t
        lab = labels
        pos = (za * zp).sum(1) / t
    negative = lab[:, None] != lab[None, :]
    dense = (
        torch.logaddexp(pos, torch.logsumexp(logits.masked_fill(~negative, float("-inf")), 1)) - pos
    )
    got = info_nce(a, p, temperature=t, form=form, labels=labels, reduction="none")
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_rows_without_negatives(kind, form):
    """Every item shares a label: loss 0 per row, no NaN in values or gradients."""
    a, p = pair(b=4, seed=13)
    a.requires_grad_(True)
    for labels, zero_rows in (
        (torch.zeros(4, dtype=torch.long), slice(None)),
        (torch.tensor([0, 0, 0, 1]), None),
    ):
        loss = call(kind, a, p, form=form, labels=labels, reduction="none", hardest=2, synthetic=2)
        loss.sum().backward()
        assert torch.isfinite(loss).all() and torch.isfinite(a.grad).all()
        if zero_rows is not None:
            assert (loss == 0).all() and (a.grad == 0).all()
        else:
            torch.testing.assert_close(
                loss,
                reference(
                    a, p, **ref_kwargs(kind, form=form, labels=labels, hardest=2, synthetic=2)
                ),
                rtol=0,
                atol=1e-6,
            )
        a.grad = None


def test_reductions():
    a, p = pair(b=5, seed=14)
    for form, rows in (("simclr", 10), ("simcse", 5)):
        none = info_nce(a, p, form=form, reduction="none")
        assert none.shape == (rows,)
        torch.testing.assert_close(info_nce(a, p, form=form, reduction="sum"), none.sum())
        torch.testing.assert_close(info_nce(a, p, form=form), none.mean())


def test_memory_bank_only_adds_negatives():
    a, p = pair(b=4, seed=15)
    bank = torch.randn(6, 5, dtype=torch.float64)
    with_bank = info_nce(a, p, form="simcse", negatives=bank, reduction="none")
    assert (with_bank > info_nce(a, p, form="simcse", reduction="none")).all()
    empty = info_nce(a, p, form="simcse", negatives=bank[:0], reduction="none")
    torch.testing.assert_close(empty, info_nce(a, p, form="simcse", reduction="none"))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("labelled", [False, True])
def test_single_pair_with_negatives(kind, form, labelled):
    """B = 1 is allowed when ``negatives`` gives the pair something to be contrasted with."""
    a, p = pair(b=1, d=5, seed=20)
    bank = torch.randn(3, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    kw = {"form": form, "temperature": 0.3, "tau_plus": 0.1, "beta": 0.7, "hardest": 2,
          "synthetic": 3, "seed": 1, "labels": torch.tensor([7]) if labelled else None}
    x, y, n = (t.clone().requires_grad_(True) for t in (a, p, bank))
    loss = call(kind, x, y, negatives=n, reduction="none", **kw)
    assert loss.shape == (2 if form == "simclr" else 1,)
    got = torch.autograd.grad(loss.sum(), [x, y, n])
    xr, yr, nr = (t.clone().requires_grad_(True) for t in (a, p, bank))
    ref = reference(xr, yr, **ref_kwargs(kind, negatives=nr, **kw))
    expected = torch.autograd.grad(ref.sum(), [xr, yr, nr])
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-10)
    for g, e in zip(got, expected):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, e, rtol=0, atol=1e-8)


def test_finite_float_and_bool_labels_accepted():
    a, p = pair(b=6, seed=21)
    ids = torch.tensor([0, 1, 0, 2, 1, 2])
    expected = info_nce(a, p, labels=ids, reduction="none")
    torch.testing.assert_close(info_nce(a, p, labels=ids.double(), reduction="none"), expected)
    flags = torch.tensor([True, False, True, False, False, True])
    torch.testing.assert_close(
        info_nce(a, p, labels=flags, reduction="none"),
        info_nce(a, p, labels=flags.long(), reduction="none"),
    )


@pytest.mark.parametrize("form", FORMS)
def test_infonce_and_dcl_are_twice_differentiable(form):
    """Plain torch operations (no fused kernel): gradgradcheck passes; HCL's fused weighted
    log-sum-exp gives first-order gradients only."""
    a, p = pair(b=5, d=4, seed=21)
    labels = torch.tensor([0, 1, 0, 2, 1])
    for fn in (info_nce, debiased_info_nce):
        assert torch.autograd.gradgradcheck(
            lambda x, fn=fn: fn(x, p, form=form, labels=labels), (a.clone().requires_grad_(),))
    x = a.clone().requires_grad_()
    (grad,) = torch.autograd.grad(hard_negative_info_nce(x, p, form=form), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()
