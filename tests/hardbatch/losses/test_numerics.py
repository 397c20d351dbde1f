"""Issue 17 items 7, 8 and 13 for the losses (and the samplers' normalisation): very large
embeddings, all-zero and tiny half-precision rows, tiny temperatures, and the
pytorch-metric-learning call form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loss_reference import FORMS, KINDS, call, pair

import hardbatch as hb
from hardbatch._validation import MIN_TEMPERATURE, as_embeddings, l2_normalize_rows


@pytest.mark.parametrize("scale", [1e19, 1e25, 1e30])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_large_embeddings_normalise_scale_safely(kind, form, scale):
    """float32 rows of size ~1e19-1e30 used to overflow the squared norm and become zero (InfoNCE
    at 1e30 gave 6.44 instead of 40.27); now the loss is that of the unscaled rows."""
    a, p = pair(b=8, d=6, seed=3, dtype=torch.float32)
    neg = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    kw = {"form": form, "temperature": 0.05, "negatives": neg, "hardest": 4, "synthetic": 2}
    want = call(kind, a, p, **kw)
    got = call(kind, a * scale, p * scale, **{**kw, "negatives": neg * scale})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_normalize_rows_is_f_normalize_bit_for_bit_on_ordinary_rows():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(40, 7, generator=gen, dtype=dtype)
        x = (x * 10.0 ** torch.randint(-3, 4, (40, 1), generator=gen).to(dtype)).requires_grad_()
        g = torch.randn(40, 7, generator=gen, dtype=dtype)
        y1, y2 = F.normalize(x, dim=1), l2_normalize_rows(x)
        assert torch.equal(y1, y2)
        assert torch.equal(torch.autograd.grad(y1, x, g)[0], torch.autograd.grad(y2, x, g)[0])
    big = torch.tensor([[3e30, -4e30], [0.0, 0.0]])
    torch.testing.assert_close(l2_normalize_rows(big), torch.tensor([[0.6, -0.8], [0.0, 0.0]]))
    assert torch.equal(F.normalize(big, dim=1)[0], torch.zeros(2))  # what it fixes


def test_sampler_normalisation_is_scale_safe_and_unchanged_otherwise():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 8)).astype(np.float32) * 10.0 ** rng.integers(-3, 4, (50, 1))
    x = x.astype(np.float32)
    # one normaliser for samplers and losses: torch's row normalisation, where nothing overflowed
    want = torch.nn.functional.normalize(torch.from_numpy(x), dim=1).numpy()
    np.testing.assert_allclose(as_embeddings(x, normalize=True), want, rtol=2e-7, atol=0)
    np.testing.assert_allclose(l2_normalize_rows(torch.from_numpy(x)).numpy(), want, rtol=2e-7,
                               atol=0)
    big = np.array([[3e30, 4e30], [1e20, 0.0], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(as_embeddings(big, normalize=True),
                               [[0.6, 0.8], [1.0, 0.0], [0.0, 0.0]], rtol=1e-6)
    with np.errstate(over="ignore"):  # the old formula: the squared norm overflows, rows -> 0
        old = big / np.maximum(np.linalg.norm(big, axis=1, keepdims=True), 1e-12)
    assert not old[:2].any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_zero_and_tiny_rows_give_finite_gradients(kind, form, dtype):
    """An all-zero row gets a zero gradient (F.normalize's is 1/eps = 1e12: -inf in fp16); a row
    of tiny norm, whose true gradient exceeds fp16's range, saturates at fp16's largest value."""
    a, p = pair(b=6, d=5, seed=4, dtype=torch.float32)
    a[2] = 0.0
    a[4] = torch.tensor([6e-8, 0.0, 0.0, 0.0, 0.0]) if dtype == torch.float16 else 0.0
    x, y = a.to(dtype).requires_grad_(), p.to(dtype).requires_grad_()
    value = call(kind, x, y, form=form, temperature=0.05, hardest=3, synthetic=2)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()
    assert torch.equal(x.grad[2], torch.zeros(5, dtype=dtype))


@pytest.mark.parametrize("temperature", [1e-31, 1e-39, 5e-324])
def test_tiny_temperatures_are_rejected(temperature):
    a, p = pair(b=4)
    with pytest.raises(ValueError, match="temperature=.* is too small: it must be >= 1e-30"):
        hb.info_nce(a, p, temperature=temperature)
    with pytest.raises(ValueError, match="too small"):
        hb.SSCLLoss(temperature=temperature)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_smallest_temperature_is_finite_in_float32(kind, form):
    a, p = pair(b=16, d=8, seed=5, dtype=torch.float32)
    x, y = a.requires_grad_(), p.requires_grad_()
    value = call(kind, x, y, form=form, temperature=MIN_TEMPERATURE, hardest=4, synthetic=2)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()


@pytest.mark.parametrize("loss", [hb.info_nce, hb.InfoNCE(), hb.SSCLLoss(), hb.DebiasedInfoNCE()])
def test_metric_learning_call_form_is_named(loss):
    """loss(embeddings, labels) (pytorch-metric-learning) says which call form hardbatch uses."""
    embeddings, labels = torch.randn(8, 4), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    with pytest.raises(ValueError, match=r"loss\(anchor, positive, labels=labels\).*not "
                                         r"pytorch-metric-learning's loss\(embeddings, labels\)"):
        loss(embeddings, labels)
