"""Tests of hardbatch.losses.modules: defaults, options, repr and the one-time floor warning."""

from __future__ import annotations

import dataclasses
import inspect
import sys

import numpy as np
import pytest
import torch
from loss_reference import graded_pair, pair

from hardbatch.losses.functional import (
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)
from hardbatch.losses.modules import (
    DCLOptions,
    DebiasedInfoNCE,
    HardNegativeInfoNCE,
    HCLOptions,
    InfoNCE,
    InfoNCEOptions,
    SSCLLoss,
    SSCLOptions,
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


def test_floor_warning_once_for_degenerate_setting():
    a, p = graded_pair()
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


MODULES = [
    (InfoNCE, info_nce, InfoNCEOptions),
    (DebiasedInfoNCE, debiased_info_nce, DCLOptions),
    (HardNegativeInfoNCE, hard_negative_info_nce, HCLOptions),
    (SSCLLoss, sscl_loss, SSCLOptions),
]


@pytest.mark.parametrize("cls, fn, options", MODULES)
def test_options_are_the_function_arguments(cls, fn, options):
    """One options object per module: its fields are the function's keyword arguments (but the
    per-batch labels, negatives and false_negatives), and the options classes nest like the
    losses."""
    loss = cls()
    assert type(loss.options) is options
    params = inspect.signature(fn).parameters
    keyword = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(loss.options.kwargs()) == sorted(set(keyword) - {"labels", "negatives", "false_negatives"})
    assert InfoNCEOptions in options.__mro__
    with pytest.raises(dataclasses.FrozenInstanceError):
        loss.options.temperature = 0.1


def test_reprs():
    assert repr(InfoNCE()) == "InfoNCE(temperature=0.5, form='simclr')"
    assert repr(DebiasedInfoNCE(0.2, 0.05, form="simcse", reduction="none")) == (
        "DebiasedInfoNCE(temperature=0.2, form='simcse', tau_plus=0.05)")
    assert repr(HardNegativeInfoNCE(detach_weights=True)) == (
        "HardNegativeInfoNCE(temperature=0.5, form='simclr', tau_plus=0.1, beta=1.0)")
    assert repr(SSCLLoss(generator=torch.Generator())) == (
        "SSCLLoss(temperature=0.5, form='simclr', tau_plus=0.1, beta=1.0, hardest=32, "
        "synthetic=8, mix=True, detach_synthetic=False)")


def test_assigning_an_option():
    """``loss.x = v`` replaces the options (checked again) and takes effect on the next call."""
    a, p = pair(b=6, seed=24)
    loss = SSCLLoss(hardest=3, synthetic=2)
    loss.generator = torch.Generator().manual_seed(5)
    loss.temperature = np.float32(0.25)
    assert loss.temperature == 0.25 and type(loss.temperature) is float
    assert "temperature=0.25" in repr(loss) and loss.options.temperature == 0.25
    expected = sscl_loss(a, p, temperature=0.25, hardest=3, synthetic=2,
                         generator=torch.Generator().manual_seed(5))
    assert torch.equal(loss(a, p), expected)
    with pytest.raises(ValueError, match="temperature"):
        loss.temperature = 0.0
    with pytest.raises(ValueError, match="tau_plus"):
        DebiasedInfoNCE().tau_plus = 1.0
    assert loss.temperature == 0.25  # a rejected value leaves the options as they were


def _calls_during(fn) -> list[str]:
    """The names of the Python functions ``fn()`` calls (``sys.setprofile``)."""
    names = []
    sys.setprofile(lambda frame, event, arg: names.append(frame.f_code.co_name)
                   if event == "call" else None)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


@pytest.mark.parametrize("cls, fn, options", MODULES)
def test_options_are_checked_once(cls, fn, options):
    """A module checks its options when made, never in a call; a function once per call."""
    a, p = pair(b=6, seed=3)
    kw = {"hardest": 3, "synthetic": 2} if cls is SSCLLoss else {}
    module = cls(**kw)
    in_call = _calls_during(lambda: module(a, p))
    assert "__post_init__" not in in_call and "check_temperature" not in in_call, in_call
    assert not {"check_choice", "check_tau_plus", "check_beta", "check_synthetic"} & set(in_call)
    in_fn = _calls_during(lambda: fn(a, p, **kw))
    assert in_fn.count("check_temperature") == 1 and in_fn.count("__post_init__") >= 1
    assert torch.equal(module(a, p), fn(a, p, **kw)) or cls is SSCLLoss  # SSCL draws anew


def test_signatures_are_the_declared_options():
    """The module constructors take the declared options, their positional ones first (the
    agreement of every signature with the declarations: test_typing.py)."""
    params = list(inspect.signature(SSCLLoss).parameters)
    assert params[:6] == ["temperature", "tau_plus", "beta", "hardest", "synthetic", "mix"]
    assert inspect.signature(InfoNCE).parameters["form"].default == "simclr"
    with pytest.raises(TypeError, match="info_nce\\(\\) got an unexpected keyword argument 'beta'"):
        info_nce(*pair(b=4), beta=1.0)
    with pytest.raises(TypeError, match="takes from 1 to 3 positional arguments but 4 were given"):
        InfoNCE(0.5, "simclr", True)


def test_tau_plus_none_is_no_debiasing():
    a, p = pair(b=6, seed=8)
    assert InfoNCEOptions().tau_plus is None and DCLOptions().beta == 0.0
    assert torch.equal(DebiasedInfoNCE(tau_plus=None)(a, p), info_nce(a, p))
    assert torch.equal(debiased_info_nce(a, p, tau_plus=None), info_nce(a, p))
