"""Tests of hardbatch.losses against straightforward float64 references written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hardbatch.losses import (
    DebiasedInfoNCE,
    HardNegativeInfoNCE,
    InfoNCE,
    SSCLLoss,
    debiased_floor_stats,
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)

FORMS = ["simclr", "simcse"]
KINDS = ["infonce", "debiased", "hard_negative", "sscl"]


# --------------------------------------------------------------------------- references


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their norm; an all-zero row stays zero (as with F.normalize)."""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def reference(
    anchor,
    positive,
    *,
    kind,
    t=0.5,
    form="simclr",
    tau=0.0,
    beta=0.0,
    labels=None,
    bank=None,
    normalize=True,
    hardest=0,
    synthetic=0,
    mix=True,
    seed=0,
    detach_weights=False,
    detach_synthetic=False,
):
    """Per-row losses in float64 with explicit exp / sum / log and Python loops (as in the papers).

    SSCL: the row's negatives sorted by decreasing similarity, ``count = min(hardest, N)``;
    synthetic ``p`` of row ``r`` uses ``(u1, u2, a) = torch.rand(R, k, 3, generator=seed)[r, p]``
    (float32) and mixes ``hard[floor(u1 count)]`` and ``hard[floor(u2 count)]`` into an explicit
    vector ``h``, mixed then normalised; ``detach_synthetic`` detaches ``h`` (the released code).
    """
    a, p = anchor.double(), positive.double()
    bank = None if bank is None else bank.double()
    if normalize:
        a, p = _unit(a), _unit(p)
        bank = None if bank is None else _unit(bank)
    b = a.shape[0]
    extra = [] if bank is None else list(bank)
    rows = []
    if form == "simclr":
        views = torch.cat([a, p])
        lab = None if labels is None else torch.cat([labels, labels]).tolist()
        for i in range(2 * b):
            j_pos = (i + b) % (2 * b)
            negs = [
                views[j]
                for j in range(2 * b)
                if j not in (i, j_pos) and (lab is None or lab[j] != lab[i])
            ]
            rows.append((views[i], views[j_pos], negs + extra))
    else:
        lab = None if labels is None else labels.tolist()
        for i in range(b):
            negs = [p[j] for j in range(b) if j != i and (lab is None or lab[j] != lab[i])]
            rows.append((a[i], p[i], negs + extra))

    draws = None
    if kind == "sscl" and synthetic > 0:
        gen = torch.Generator().manual_seed(seed)
        draws = torch.rand(len(rows), synthetic, 3, generator=gen)  # float32, as in hardbatch

    losses = []
    for r, (q, pos_vec, negs) in enumerate(rows):
        if draws is not None and negs:
            sims = [float((q @ n).detach()) for n in negs]
            order = sorted(range(len(negs)), key=lambda j: -sims[j])
            count = min(hardest, len(negs))
            hard = order[:count]
            synth = []
            for k in range(synthetic):
                u1, u2, alpha = draws[r, k]
                vi = negs[hard[min(int(u1 * count), count - 1)]]
                vj = negs[hard[min(int(u2 * count), count - 1)]]
                if mix:
                    alpha = alpha.double()
                    h = alpha * vi + (1 - alpha) * vj
                    h = _unit(h) if normalize else h
                else:
                    h = vi
                synth.append(h.detach() if detach_synthetic else h)
            negs = negs + synth
        n = len(negs)
        if n == 0:
            losses.append(torch.zeros((), dtype=torch.float64))
            continue
        pos = torch.exp(q @ pos_vec / t)
        neg = torch.stack([torch.exp(q @ v / t) for v in negs])
        if kind == "infonce":
            ng = neg.sum()
        else:
            imp = neg**beta  # exp(beta * sim / t), as in the HCL code
            if detach_weights:
                imp = imp.detach()
            reweight = (imp * neg).sum() / imp.mean()
            ng = torch.maximum(
                (reweight - tau * n * pos) / (1 - tau),
                torch.tensor(n * math.exp(-1 / t), dtype=torch.float64),
            )
        losses.append(-torch.log(pos / (pos + ng)))
    return torch.stack(losses)


def call(kind, anchor, positive, **kw):
    """The hardbatch functional form for ``kind``, ignoring options that do not apply to it."""
    if kind == "infonce":
        kw = {
            k: v
            for k, v in kw.items()
            if k not in ("tau_plus", "beta", "hardest", "synthetic", "mix", "seed")
        }
        return info_nce(anchor, positive, **kw)
    if kind == "debiased":
        kw = {
            k: v for k, v in kw.items() if k not in ("beta", "hardest", "synthetic", "mix", "seed")
        }
        return debiased_info_nce(anchor, positive, **kw)
    if kind == "hard_negative":
        kw = {k: v for k, v in kw.items() if k not in ("hardest", "synthetic", "mix", "seed")}
        return hard_negative_info_nce(anchor, positive, **kw)
    seed = kw.pop("seed", 0)
    return sscl_loss(anchor, positive, generator=torch.Generator().manual_seed(seed), **kw)


def ref_kwargs(kind, **kw):
    """Map hardbatch keyword arguments to the reference's, with the classes' semantics."""
    out = {
        "kind": kind,
        "t": kw.get("temperature", 0.5),
        "form": kw.get("form", "simclr"),
        "labels": kw.get("labels"),
        "bank": kw.get("negatives"),
        "normalize": kw.get("normalize", True),
        "seed": kw.get("seed", 0),
    }
    if kind != "infonce":
        out["tau"] = kw.get("tau_plus", 0.1)
    if kind in ("hard_negative", "sscl"):
        out["beta"] = kw.get("beta", 1.0)
    if kind == "sscl":
        out.update(
            hardest=kw.get("hardest", 32), synthetic=kw.get("synthetic", 8), mix=kw.get("mix", True)
        )
    return out


def pair(b=6, d=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=gen, dtype=dtype), torch.randn(
        b, d, generator=gen, dtype=dtype
    )


# --------------------------------------------------------------------------- exactness


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
    kw = {
        "form": form,
        "temperature": 0.3,
        "tau_plus": 0.2,
        "beta": 0.7,
        "hardest": 4,
        "synthetic": 3,
        "seed": 5,
    }
    if "labels" in variant:
        kw["labels"] = torch.tensor([0, 1, 0, 2, 1, 3])
    if "bank" in variant:
        kw["negatives"] = torch.randn(
            4, 5, generator=torch.Generator().manual_seed(9), dtype=torch.float64
        )
    if variant == "raw":
        kw["normalize"] = False
        a, p = _unit(a), _unit(p)
    got = call(kind, a, p, reduction="none", **kw)
    expected = reference(a, p, **ref_kwargs(kind, **kw))
    assert got.shape == (12 if form == "simclr" else 6,)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


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
    from hardbatch.losses import _hardest_columns

    x = torch.randn(rows, cols)
    x[0, : cols // 2] = float("-inf")  # a masked row: the valid columns must come first
    expected = torch.topk(x, s, dim=1)
    got = _hardest_columns(x, s)
    torch.testing.assert_close(x.gather(1, got), expected.values)


# --------------------------------------------------------------------------- invariants


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


def test_module_defaults():
    assert (InfoNCE().temperature, InfoNCE().form) == (0.5, "simclr")
    assert (DebiasedInfoNCE().temperature, DebiasedInfoNCE().tau_plus) == (0.5, 0.1)
    h = HardNegativeInfoNCE()
    assert (h.temperature, h.tau_plus, h.beta, h.detach_weights) == (0.5, 0.1, 1.0, False)
    s = SSCLLoss()
    assert (s.temperature, s.tau_plus, s.beta, s.hardest, s.synthetic, s.mix) == (
        0.5,
        0.1,
        1.0,
        32,
        8,
        True,
    )
    assert (s.detach_weights, s.detach_synthetic) == (False, False)
    assert "hardest=32" in repr(s)


# --------------------------------------------------------------------------- gradients


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


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["hard_negative", "sscl"])
def test_detach_weights(kind, form):
    """Same value; the gradient treats the HCL weights as constants."""
    a, p = pair(b=5, d=4, seed=8)
    kw = {
        "form": form,
        "temperature": 0.3,
        "tau_plus": 0.1,
        "beta": 1.5,
        "hardest": 3,
        "synthetic": 2,
        "seed": 4,
    }
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
        a, p = _unit(a), _unit(p)
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


def test_sscl_detach_synthetic_module():
    a, p = pair(b=5, d=4, seed=17)
    module = SSCLLoss(0.3, hardest=3, synthetic=2, detach_synthetic=True,
                      generator=torch.Generator().manual_seed(2))
    assert module.detach_synthetic and "detach_synthetic=True" in repr(module)
    x = a.clone().requires_grad_(True)
    module(x, p).backward()
    y = a.clone().requires_grad_(True)
    sscl_loss(y, p, temperature=0.3, hardest=3, synthetic=2, detach_synthetic=True,
              generator=torch.Generator().manual_seed(2)).backward()
    assert torch.equal(x.grad, y.grad)


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
    # A zero row's gradient is ~1e11 (F.normalize divides by eps = 1e-12): compare relatively.
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-8)


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_low_temperature(kind, form, dtype):
    """At t = 0.05, exp(1/t) = 4.9e8 overflows fp16; the log-space losses stay finite and exact."""
    a, p = pair(b=8, d=16, seed=9)
    a, p = _unit(a).to(dtype), _unit(p).to(dtype)
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


# --------------------------------------------------------------------------- labels and masking


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


def test_numpy_and_tensor_hyperparameters():
    """numpy scalars and 0-d tensors work where Python numbers do (same result)."""
    a, p = pair(b=6, seed=22)
    kw = {"temperature": 0.25, "tau_plus": 0.125, "beta": 0.5, "hardest": 3, "synthetic": 2}
    expected = sscl_loss(a, p, generator=torch.Generator().manual_seed(0), **kw)
    for converted in (
        {"temperature": np.float32(0.25), "hardest": np.int64(3), "synthetic": np.int32(2)},
        {"temperature": torch.tensor(0.25), "tau_plus": np.float32(0.125),
         "beta": torch.tensor(0.5, dtype=torch.float64)},
    ):
        got = sscl_loss(a, p, generator=torch.Generator().manual_seed(0), **{**kw, **converted})
        assert torch.equal(got, expected)
    module = SSCLLoss(np.float32(0.25), np.float32(0.125), hardest=np.int64(3))
    assert type(module.hardest) is int and module.temperature == 0.25 and module.tau_plus == 0.125


# --------------------------------------------------------------------------- errors


def _bad(**over):
    a, p = pair(b=4, d=3)
    kw = {"anchor": a, "positive": p}
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "fn, kwargs, match",
    [
        (info_nce, _bad(positive=torch.randn(4, 5, dtype=torch.float64)), "same shape"),
        (info_nce, _bad(anchor=torch.randn(4)), "anchor must be a 2-D"),
        (info_nce, _bad(anchor=torch.randn(1, 3), positive=torch.randn(1, 3)), "drop_last"),
        (
            info_nce,
            _bad(anchor=torch.randn(1, 3), positive=torch.randn(1, 3), negatives=torch.ones(0, 3)),
            "B >= 2",
        ),
        (info_nce, _bad(anchor=torch.randn(4, 0), positive=torch.randn(4, 0)), "d >= 1"),
        (info_nce, _bad(positive=torch.randn(4, 3, device="meta")), "anchor and positive.*device"),
        (info_nce, _bad(negatives=torch.randn(2, 3, device="meta")), "negatives.*device"),
        (info_nce, _bad(labels=torch.tensor([0.0, float("nan"), 1.0, 2.0])), "labels.*NaN"),
        (info_nce, _bad(labels=torch.tensor([0.0, float("inf"), 1.0, 2.0])), "labels.*NaN"),
        (info_nce, _bad(temperature=True), "temperature"),
        (info_nce, _bad(temperature=torch.tensor([0.5, 0.2])), "temperature"),
        (info_nce, _bad(temperature="0.5"), "temperature"),
        (info_nce, _bad(temperature=torch.tensor(0.5, requires_grad=True)), "temperature.*grad"),
        (debiased_info_nce, _bad(tau_plus=float("nan")), "tau_plus"),
        (hard_negative_info_nce, _bad(beta=float("inf")), "beta"),
        (sscl_loss, _bad(hardest=True), "hardest"),
        (sscl_loss, _bad(synthetic=np.float64(2.0)), "synthetic"),
        (info_nce, _bad(anchor=torch.ones(4, 3, dtype=torch.long)), "floating point"),
        (info_nce, _bad(temperature=0.0), "temperature"),
        (info_nce, _bad(temperature=-1.0), "temperature"),
        (info_nce, _bad(temperature=float("nan")), "temperature"),
        (info_nce, _bad(form="moco"), "form"),
        (info_nce, _bad(reduction="avg"), "reduction"),
        (info_nce, _bad(anchor=torch.full((4, 3), float("nan"))), "NaN or inf"),
        (info_nce, _bad(positive=torch.full((4, 3), float("inf"))), "NaN or inf"),
        (info_nce, _bad(negatives=torch.full((2, 3), float("nan"))), "NaN or inf"),
        (info_nce, _bad(labels=torch.zeros(3)), "labels"),
        (info_nce, _bad(negatives=torch.zeros(2, 4)), "negatives"),
        (debiased_info_nce, _bad(tau_plus=1.0), "tau_plus"),
        (debiased_info_nce, _bad(tau_plus=-0.1), "tau_plus"),
        (hard_negative_info_nce, _bad(beta=-1.0), "beta"),
        (hard_negative_info_nce, _bad(tau_plus=1.5), "tau_plus"),
        (sscl_loss, _bad(hardest=-1), "hardest"),
        (sscl_loss, _bad(synthetic=-2), "synthetic"),
        (sscl_loss, _bad(hardest=0, synthetic=3), "hardest"),
        (sscl_loss, _bad(hardest=2.5), "hardest"),
        (sscl_loss, _bad(form="nt-xent"), "form"),
    ],
)
def test_clear_errors(fn, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fn(**kwargs)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: InfoNCE(temperature=0), "temperature"),
        (lambda: InfoNCE(form="x"), "form"),
        (lambda: InfoNCE(reduction="x"), "reduction"),
        (lambda: DebiasedInfoNCE(tau_plus=1), "tau_plus"),
        (lambda: HardNegativeInfoNCE(beta=-0.5), "beta"),
        (lambda: SSCLLoss(hardest=-1), "hardest"),
        (lambda: SSCLLoss(synthetic=-1), "synthetic"),
    ],
)
def test_module_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_check_finite_can_be_skipped():
    a, p = pair(b=4, d=3)
    a[0, 0] = float("nan")
    assert torch.isnan(info_nce(a, p, check_finite=False))
    # the DCL / HCL modules' first-batch floor check honours it too
    assert torch.isnan(DebiasedInfoNCE(check_finite=False)(a, p))
    assert torch.isnan(HardNegativeInfoNCE(check_finite=False)(a, p))
    with pytest.raises(ValueError, match="NaN|finite"):
        DebiasedInfoNCE()(a, p)


# --------------------------------------------------------------------------- debiasing floor


def _graded_pair(b=16, d=8, seed=3):
    """Positives from very close to unrelated, so some rows sit on the DCL floor and some not."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(b, d, generator=gen, dtype=torch.float64)
    noise = torch.randn(b, d, generator=gen, dtype=torch.float64)
    return a, a + torch.linspace(0.01, 3.0, b, dtype=torch.float64)[:, None] * noise


def _floor_reference(anchor, positive, *, t, tau, beta, form, labels=None):
    """Plain-Python share of rows with ``(S - tau N pos) / (1 - tau) <= N e^(-1/t)`` and the
    lower median (torch's) over rows of ``S / (N pos)``."""
    a, p = _unit(anchor.double()), _unit(positive.double())
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
        ratios.append(big_s / (n * pos))
    return sum(floored) / len(floored), sorted(ratios)[(len(ratios) - 1) // 2]  # lower median


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("labelled", [False, True])
def test_debiased_floor_stats_matches_reference(form, beta, labelled):
    a, p = _graded_pair()
    labels = torch.tensor([0, 1, 2, 3] * 4) if labelled else None
    frac, tau_max = debiased_floor_stats(a, p, temperature=0.1, tau_plus=0.1, beta=beta,
                                         form=form, labels=labels)
    ref_frac, ref_tau = _floor_reference(a, p, t=0.1, tau=0.1, beta=beta, form=form,
                                         labels=labels)
    assert 0.0 < ref_frac < 1.0  # the data mixes floored and free rows
    assert frac == pytest.approx(ref_frac)
    assert tau_max == pytest.approx(ref_tau, rel=1e-9)


def test_debiased_floor_rows_have_zero_loss_and_gradient():
    a, p = _graded_pair()
    a = a.clone().requires_grad_()
    frac, _ = debiased_floor_stats(a, p, temperature=0.1, tau_plus=0.1, form="simcse")
    per_row = debiased_info_nce(a, p, temperature=0.1, tau_plus=0.1, form="simcse",
                                reduction="none")
    ref = reference(a.detach(), p, kind="debiased", t=0.1, form="simcse", tau=0.1)
    torch.testing.assert_close(per_row.detach(), ref)
    # On the floor the loss is softplus(log N - 1/t - log pos): tiny next to free rows.
    assert (per_row < 1e-3).double().mean().item() == pytest.approx(frac)


def test_floor_warning_once_for_degenerate_setting():
    a, p = _graded_pair()
    close = a + 1e-3 * p  # positives nearly identical to the anchors
    loss = DebiasedInfoNCE(temperature=0.05, tau_plus=0.1, form="simcse")
    with pytest.warns(UserWarning, match=r"tau_plus \(=0.1\) below about .*temperature"):
        loss(a, close)
    assert loss.floor_fraction == 1.0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss(a, close)  # warned once only
        hcl = HardNegativeInfoNCE(temperature=0.5, tau_plus=0.1, form="simcse")
        hcl(a, p)  # a trainable setting: no warning
        assert hcl.floor_fraction is not None and hcl.floor_fraction < 0.5
        with torch.no_grad():  # evaluation calls are not checked
            fresh = HardNegativeInfoNCE(temperature=0.05, form="simcse")
            fresh(a, close)
        assert fresh.floor_fraction is None


def test_debiased_floor_stats_bad_input():
    a, p = _graded_pair()
    with pytest.raises(ValueError, match="tau_plus"):
        debiased_floor_stats(a, p, tau_plus=1.0)
    with pytest.raises(ValueError, match="beta"):
        debiased_floor_stats(a, p, beta=-1.0)
    with pytest.raises(ValueError, match="finite|NaN|nan"):
        debiased_floor_stats(a.clone().fill_(float("nan")), p)
