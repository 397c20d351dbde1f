"""Tests of hardbatch.losses.functional: the four losses and the floor statistics against
plain float64 references, gradients, and the nesting InfoNCE ⊂ DCL ⊂ HCL ⊂ SSCL."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from loss_reference import FORMS, KINDS, call, graded_pair, pair, ref_kwargs, reference, unit

from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss
from hardbatch.losses.functional import (
    contrastive_loss,
    debiased_floor_stats,
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)


@pytest.mark.parametrize("form", FORMS)
def test_reference_matches_cross_entropy(form):
    """The test reference itself agrees with the standard F.cross_entropy implementations."""
    a, p = pair(b=7)
    b = a.shape[0]
    if form == "simclr":
        z = F.normalize(torch.cat([a, p]), dim=1)
        logits = z @ z.T / 0.5
        logits = logits.masked_fill(torch.eye(2 * b, dtype=torch.bool), float("-inf"))
        target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)])
    else:
        logits = F.normalize(a, dim=1) @ F.normalize(p, dim=1).T / 0.5
        target = torch.arange(b)
    expected = F.cross_entropy(logits, target, reduction="none")
    torch.testing.assert_close(
        reference(a, p, kind="infonce", form=form), expected, rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        info_nce(a, p, form=form, reduction="none"), expected, rtol=0, atol=1e-10
    )


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["plain", "labels", "bank", "labels+bank", "raw"])
def test_matches_float64_reference(kind, form, variant):
    a, p = pair(b=6, d=5, seed=1)
    kw = {"form": form, "temperature": 0.3, "tau_plus": 0.2, "beta": 0.7, "hardest": 4,
          "synthetic": 3, "seed": 5}
    if "labels" in variant:
        kw["labels"] = torch.tensor([0, 1, 0, 2, 1, 3])
    if "bank" in variant:
        kw["negatives"] = torch.randn(
            4, 5, generator=torch.Generator().manual_seed(9), dtype=torch.float64
        )
    if variant == "raw":
        kw["normalize"] = False
        a, p = unit(a), unit(p)
    got = call(kind, a, p, reduction="none", **kw)
    expected = reference(a, p, **ref_kwargs(kind, **kw))
    assert got.shape == (12 if form == "simclr" else 6,)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("labelled", [False, True])
def test_invariants(form, labelled):
    a, p = pair(b=8, seed=6)
    kw = {"form": form, "temperature": 0.2, "reduction": "none"}
    if labelled:
        kw["labels"] = torch.tensor([0, 0, 1, 2, 2, 3, 4, 1])
        kw["negatives"] = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(
        debiased_info_nce(a, p, tau_plus=0.0, **kw), info_nce(a, p, **kw), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        hard_negative_info_nce(a, p, tau_plus=0.3, beta=0.0, **kw),
        debiased_info_nce(a, p, tau_plus=0.3, **kw),
        rtol=0,
        atol=1e-12,
    )
    torch.testing.assert_close(
        sscl_loss(a, p, tau_plus=0.3, beta=0.5, synthetic=0, **kw),
        hard_negative_info_nce(a, p, tau_plus=0.3, beta=0.5, **kw),
        rtol=0,
        atol=1e-12,
    )
    # The module classes agree with the functional forms and with each other in the same way.
    x, y = a.float(), p.float()
    red = {"reduction": "none", "form": form}
    torch.testing.assert_close(DebiasedInfoNCE(0.2, 0.0, **red)(x, y), InfoNCE(0.2, **red)(x, y))
    torch.testing.assert_close(
        HardNegativeInfoNCE(0.2, 0.3, 0.0, **red)(x, y), DebiasedInfoNCE(0.2, 0.3, **red)(x, y)
    )
    torch.testing.assert_close(
        SSCLLoss(0.2, 0.3, 0.5, synthetic=0, **red)(x, y),
        HardNegativeInfoNCE(0.2, 0.3, 0.5, **red)(x, y),
    )


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("labelled", [False, True])
def test_gradcheck(kind, form, labelled):
    a, p = pair(b=4, d=3, seed=7)
    a.requires_grad_(True)
    p.requires_grad_(True)
    bank = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    kw = {
        "form": form,
        "temperature": 0.4,
        "tau_plus": 0.15,
        "beta": 0.8,
        "hardest": 3,
        "synthetic": 2,
    }
    if labelled:
        kw["labels"] = torch.tensor([0, 1, 0, 2])
    assert torch.autograd.gradcheck(
        lambda x, y, n: call(kind, x, y, negatives=n, **kw), (a, p, bank)
    )
    if kind == "sscl":
        kw["mix"] = False
        assert torch.autograd.gradcheck(lambda x, y: call(kind, x, y, **kw), (a, p))


def _floor_reference(anchor, positive, *, t, tau, beta, form, labels=None):
    """Plain-Python share of rows with ``(S - tau N pos) / (1 - tau) <= N e^(-1/t)`` and the
    lower median (torch's) over rows of ``S / (N pos)``."""
    a, p = unit(anchor.double()), unit(positive.double())
    b = a.shape[0]
    views = torch.cat([a, p]) if form == "simclr" else p
    queries = torch.cat([a, p]) if form == "simclr" else a
    lab = None if labels is None else labels.tolist() * (2 if form == "simclr" else 1)
    floored, ratios = [], []
    for i in range(len(queries)):
        j_pos = (i + b) % (2 * b) if form == "simclr" else i
        skip = (i, j_pos)
        negs = [float(queries[i] @ views[j]) for j in range(len(views))
                if j not in skip and (lab is None or lab[j] != lab[i])]
        if not negs:
            continue
        n = len(negs)
        pos = math.exp(float(queries[i] @ views[j_pos]) / t)
        imp = [math.exp(beta * s / t) for s in negs]
        big_s = sum(w * math.exp(s / t) for w, s in zip(imp, negs)) / (sum(imp) / n)
        floored.append((big_s - tau * n * pos) / (1 - tau) <= n * math.exp(-1 / t))
        floor = math.exp(-1 / t)
        ratios.append((big_s / n - floor) / (pos - floor))  # tau_plus >= this: on the floor
    return sum(floored) / len(floored), sorted(ratios)[(len(ratios) - 1) // 2]  # lower median


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("labelled", [False, True])
def test_debiased_floor_stats_matches_reference(form, beta, labelled):
    a, p = graded_pair()
    labels = torch.tensor([0, 1, 2, 3] * 4) if labelled else None
    frac, tau_max = debiased_floor_stats(a, p, temperature=0.1, tau_plus=0.1, beta=beta,
                                         form=form, labels=labels)
    ref_frac, ref_tau = _floor_reference(a, p, t=0.1, tau=0.1, beta=beta, form=form,
                                         labels=labels)
    assert 0.0 < ref_frac < 1.0  # the data mixes floored and free rows
    assert frac == pytest.approx(ref_frac)
    assert tau_max == pytest.approx(ref_tau, rel=1e-9)


def test_debiased_floor_bound_is_where_the_clamp_starts():
    # Near-antipodal negatives: the clamp binds well below S / (N pos) (a review's example);
    # tau_plus_max is the exact bound, so each row is free just below it and floored just above.
    a = torch.tensor([[1.0, 0.0], [-1.0, 0.02]])
    p = torch.tensor([[0.99, 0.14], [-0.99, 0.16]])
    _, tau_max = debiased_floor_stats(a, p, temperature=0.5, tau_plus=0.1, form="simcse")
    assert 0.0 < tau_max < 1.0
    below, _ = debiased_floor_stats(a, p, temperature=0.5, tau_plus=tau_max * 0.99,
                                    form="simcse")
    above, _ = debiased_floor_stats(a, p, temperature=0.5, tau_plus=min(tau_max * 1.01, 0.999),
                                    form="simcse")
    assert below <= 0.5 < above


def test_debiased_gradient_is_finite_where_the_ratio_nears_one():
    # log(1 - tau N pos / S) with the ratio within float32's rounding of 1: the loss is finite,
    # and so must the gradient be (torch.where differentiates the branch it discards too).
    from hardbatch.losses.core import _log1mexp

    x = torch.tensor([-1e-9, -1e-20, -0.1, -5.0], requires_grad=True)
    _log1mexp(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    torch.testing.assert_close(x.grad[2:], (-x.detach().exp() / -torch.expm1(x.detach()))[2:])
    nan_rows = 0
    for c in torch.linspace(-math.log(0.9) - 6e-7, -math.log(0.9) + 6e-7, 600):
        a = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
        p = torch.tensor([[float(c), math.sqrt(1 - float(c) ** 2)], [0.0, 1.0]])
        loss = debiased_info_nce(a, p, temperature=1.0, form="simcse", tau_plus=0.9)
        loss.backward()
        assert torch.isfinite(loss)
        nan_rows += int(not torch.isfinite(a.grad).all())
    assert nan_rows == 0


def test_debiased_floor_rows_have_zero_loss_and_gradient():
    a, p = graded_pair()
    a = a.clone().requires_grad_()
    frac, _ = debiased_floor_stats(a, p, temperature=0.1, tau_plus=0.1, form="simcse")
    per_row = debiased_info_nce(a, p, temperature=0.1, tau_plus=0.1, form="simcse",
                                reduction="none")
    ref = reference(a.detach(), p, kind="debiased", t=0.1, form="simcse", tau=0.1)
    torch.testing.assert_close(per_row.detach(), ref)
    # On the floor the loss is softplus(log N - 1/t - log pos): tiny next to free rows.
    assert (per_row < 1e-3).double().mean().item() == pytest.approx(frac)


def test_debiased_floor_stats_bad_input():
    a, p = graded_pair()
    with pytest.raises(ValueError, match="tau_plus"):
        debiased_floor_stats(a, p, tau_plus=1.0)
    with pytest.raises(ValueError, match="beta"):
        debiased_floor_stats(a, p, beta=-1.0)
    with pytest.raises(ValueError, match="finite|NaN|nan"):
        debiased_floor_stats(a.clone().fill_(float("nan")), p)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("variant", ["plain", "labels+bank"])
def test_nesting_bit_for_bit(form, variant):
    """InfoNCE ⊂ DCL ⊂ HCL ⊂ SSCL: each loss is contrastive_loss at its settings, and the next
    one with its extra step switched off, in values and gradients bit for bit."""
    a, p = pair(b=8, seed=23)
    kw = {"form": form, "temperature": 0.3, "reduction": "none"}
    if variant == "labels+bank":
        kw["labels"] = torch.tensor([0, 0, 1, 2, 2, 3, 4, 1])
        kw["negatives"] = torch.randn(3, 5, generator=torch.Generator().manual_seed(2),
                                      dtype=torch.float64)
    hcl = {"tau_plus": 0.2, "beta": 0.7, "detach_weights": True}
    sscl = {**hcl, "hardest": 3, "synthetic": 2, "mix": False, "detach_synthetic": True}

    def run(fn, **options):
        x, y = a.clone().requires_grad_(True), p.clone().requires_grad_(True)
        loss = fn(x, y, **kw, **options)
        return [loss, *torch.autograd.grad(loss.sum(), [x, y])]

    def same(left, right):
        assert all(torch.equal(u, v) for u, v in zip(left, right))

    seeded = lambda: torch.Generator().manual_seed(4)
    same(run(info_nce), run(contrastive_loss))
    same(run(debiased_info_nce, tau_plus=0.2), run(contrastive_loss, tau_plus=0.2))
    same(run(hard_negative_info_nce, **hcl), run(contrastive_loss, **hcl))
    same(run(sscl_loss, **sscl, generator=seeded()),
         run(contrastive_loss, **sscl, generator=seeded()))
    same(run(sscl_loss, **{**sscl, "synthetic": 0}), run(hard_negative_info_nce, **hcl))
    same(run(hard_negative_info_nce, tau_plus=0.2, beta=0.0), run(debiased_info_nce, tau_plus=0.2))
    # normalised embeddings: every logit >= -1/t, so DCL's floor never binds at tau_plus = 0
    same(run(debiased_info_nce, tau_plus=0.0), run(info_nce))


def test_dcl_floor_binds_only_without_normalisation():
    """Raw embeddings with every negative logit below -1/t: DCL at tau_plus = 0 is InfoNCE with
    the negative term raised to its floor N e^(-1/t)."""
    u = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=torch.float64)
    a, p = 2.0 * u, -2.0 * u.flip(0)  # <a_i, p_j> <= -1.6 * 2 / 2 < -1 for every pair
    kw = {"form": "simcse", "temperature": 0.5, "reduction": "none", "normalize": False}
    plain = info_nce(a, p, **kw)
    floored = debiased_info_nce(a, p, tau_plus=0.0, **kw)
    log_pos = (a * p).sum(1) / 0.5
    torch.testing.assert_close(floored, F.softplus(math.log(2) - 1 / 0.5 - log_pos))
    assert (floored > plain).all()
