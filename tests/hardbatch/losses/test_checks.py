"""Tests of the loss checks (inputs: hardbatch.losses.core, options: hardbatch._validation): clear
ValueErrors and accepted inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loss_reference import pair

from hardbatch._validation import check_choice, check_constant, check_synthetic, check_tau_plus
from hardbatch.losses import (
    DebiasedInfoNCE,
    HardNegativeInfoNCE,
    InfoNCE,
    SSCLLoss,
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
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
        (info_nce, _bad(anchor=torch.randn(1, 3), positive=torch.randn(1, 3)),
         r"use drop_last=True in the batch sampler \(or in the DataLoader when it has no "
         r"batch_sampler\)"),
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
        (info_nce, _bad(gather="yes"), "gather must be True or False"),
        (info_nce, _bad(normalize="False"), "normalize must be True or False"),
        (info_nce, _bad(check_finite=0), "check_finite must be True or False"),
        (hard_negative_info_nce, _bad(detach_weights="no"), "detach_weights must be True or"),
        (sscl_loss, _bad(mix=0.5), "mix must be True or False"),
        (sscl_loss, _bad(detach_synthetic=None), "detach_synthetic must be True or False"),
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


def test_loss_checks_are_validation_helpers():
    """The checks the losses use are plain helpers of hardbatch._validation."""
    hardest, synthetic = check_synthetic(np.int64(3), np.int32(2))
    assert (hardest, synthetic) == (3, 2) and type(hardest) is type(synthetic) is int
    assert check_tau_plus(torch.tensor(0.25)) == 0.25
    with pytest.raises(ValueError, match="unknown form 'x'; use one of 'simclr', 'simcse'"):
        check_choice("form", "x", ("simclr", "simcse"))
    with pytest.raises(ValueError, match="beta must be a constant"):
        check_constant(torch.tensor(0.5, requires_grad=True), "beta", "a number")
