"""gather=True: torchrun runs on gloo with 2 and 3 processes (tests/hardbatch/losses/gather_worker.py
checks DDP gradients against one process on the global batch, uneven batch sizes, the errors on
every rank), and the single-process behaviour (a no-op with one warning)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from loss_reference import pair
from support import run_torchrun

import hardbatch as hb
import hardbatch.distributed as hbdist
from hardbatch.losses import inputs as loss_inputs

WORKER = Path(__file__).with_name("gather_worker.py")


@pytest.mark.skipif(not torch.distributed.is_available() or
                    not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_gathered_losses(world):
    out = run_torchrun(WORKER, nproc=world, timeout=300)
    for rank in range(world):
        assert f"RANK {rank} OK (40 gradient cases, world {world}" in out, out[-6000:]


@pytest.mark.parametrize("fn", [hb.info_nce, hb.sscl_loss])
@pytest.mark.parametrize("form", ["simclr", "simcse"])
def test_without_process_group_gather_is_a_no_op_that_warns_once(monkeypatch, fn, form):
    monkeypatch.setattr(loss_inputs, "_warned_no_group", False)
    a, p = pair(b=6, seed=4)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[0, 3] = True
    kw = {"form": form, "false_negatives": mask}
    if fn is hb.sscl_loss:
        kw["hardest"], kw["synthetic"] = 3, 2
    plain = fn(a, p, **kw, **({"generator": torch.Generator().manual_seed(1)}
                               if fn is hb.sscl_loss else {}))
    with pytest.warns(UserWarning, match="gather=True: torch.distributed is not initialised"):
        got = fn(a, p, gather=True, **kw, **({"generator": torch.Generator().manual_seed(1)}
                                             if fn is hb.sscl_loss else {}))
    assert torch.equal(got, plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        hb.InfoNCE(gather=True)(a, p)
        hb.guided_mask(a, p, gather=True)


def test_gather_helpers_are_plain_calls_without_process_group():
    t = torch.arange(6.0).reshape(3, 2).requires_grad_()
    assert hbdist.all_gather_rows_with_grad(t) is t
    assert hbdist.all_gather_ints([3, 4]) == [[3, 4]]
    assert hbdist.all_gather_rows(t, counts=[3]) is t


def test_gather_option_is_checked():
    with pytest.raises(ValueError, match="gather must be True or False"):
        hb.InfoNCE(gather="yes")
    loss = hb.SSCLLoss(gather=True)
    assert loss.gather is True and "gather" not in repr(loss)
