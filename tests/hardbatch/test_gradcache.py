"""GradCache: parameter gradients equal to the plain backward (float64), for every loss, both
forms, any chunk size, dropout, dict / list inputs, two encoders, autocast, DDP; bad input.

The reference is always the plain backward: ``loss(encoder(view1), encoder(view2)).backward()``;
with dropout (whose masks depend on how the forward is chunked) the plain backward of the same
chunks, computed with a graph and concatenated (:func:`chunked_reference`), under the same seed.
"""

from __future__ import annotations

import functools
import inspect
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from support import REPO, run_torchrun
from torch import nn

import hardbatch as hb
from hardbatch.gradcache import (
    GradCache,
    GradCacheOutput,
    backward_chunks,
    embed_chunks,
    loss_gradients,
)

pytestmark = pytest.mark.usefixtures("one_thread")

B, D_IN, D_OUT = 7, 6, 5
CHUNKS = (1, 3, B, B + 5)


def mlp(seed: int = 0, dropout: float = 0.0, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(D_IN, 16), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else [])
    return nn.Sequential(*layers, nn.Linear(16, D_OUT)).to(dtype)


class TokenEncoder(nn.Module):
    """Tokenised text: masked mean of token embeddings, dropout, a projection. Takes a dict
    ``{"input_ids", "attention_mask", ...}`` or a list ``[input_ids, attention_mask]``."""

    def __init__(self, seed: int = 1, dropout: float = 0.2) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(30, 8, dtype=torch.float64)
        self.drop = nn.Dropout(dropout)
        self.proj = nn.Linear(8, D_OUT, dtype=torch.float64)

    def forward(self, x) -> torch.Tensor:
        ids, mask = (x["input_ids"], x["attention_mask"]) if isinstance(x, dict) else x
        mask = mask.to(torch.float64)[..., None]
        pooled = (self.drop(self.embed(ids)) * mask).sum(1) / mask.sum(1)
        return self.proj(pooled)


def views(seed: int = 0, b: int = B, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, D_IN, generator=gen, dtype=dtype),
            torch.randn(b, D_IN, generator=gen, dtype=dtype))


def tokens(seed: int, b: int = B) -> dict:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(5)[None, :] < torch.randint(1, 6, (b, 1), generator=gen)).long()
    return {"input_ids": torch.randint(0, 30, (b, 5), generator=gen), "attention_mask": mask,
            "modality": "text"}


def take_grads(*modules) -> torch.Tensor:
    """All parameter gradients as one vector (zeros for None); the gradients are reset."""
    out = []
    for m in modules:
        for p in m.parameters():
            out.append(torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten())
            p.grad = None
    return torch.cat(out)


def assert_same_grads(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-9) -> None:
    assert want.abs().max() > 0
    err = ((got - want).norm() / want.norm()).item()
    assert err <= rel, err


def chunked_reference(encoders, view_pair, loss_fn, chunk: int):
    """The plain backward of a forward in chunks of ``chunk`` rows (with a graph)."""
    def embed(enc, view):
        n = len(view) if isinstance(view, torch.Tensor) else len(view["input_ids"])
        parts = [{k: (v[s:s + chunk] if isinstance(v, torch.Tensor) else v)
                  for k, v in view.items()} if isinstance(view, dict) else view[s:s + chunk]
                 for s in range(0, n, chunk)]
        return torch.cat([enc(p) for p in parts])

    loss = loss_fn(embed(encoders[0], view_pair[0]), embed(encoders[1], view_pair[1]))
    loss.backward()
    return loss.detach()


# --------------------------------------------------------------------------- every loss

MODULES = {
    "infonce": lambda form: hb.InfoNCE(0.5, form=form),
    "dcl": lambda form: hb.DebiasedInfoNCE(0.5, 0.1, form=form),
    "hcl": lambda form: hb.HardNegativeInfoNCE(0.5, 0.1, 1.0, form=form),
    "sscl": lambda form: hb.SSCLLoss(0.5, hardest=4, synthetic=3, form=form,
                                     generator=torch.Generator().manual_seed(5)),
}
FUNCTIONS = {
    "infonce": lambda form: functools.partial(hb.info_nce, temperature=0.5, form=form),
    "dcl": lambda form: functools.partial(hb.debiased_info_nce, temperature=0.5, form=form),
    "hcl": lambda form: functools.partial(hb.hard_negative_info_nce, beta=0.5, form=form),
    "sscl": lambda form: functools.partial(hb.sscl_loss, hardest=3, synthetic=2, form=form,
                                           generator=torch.Generator().manual_seed(5)),
}


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("form", ["simclr", "simcse"])
@pytest.mark.parametrize("kind", ["module", "function"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_loss_equals_plain_backward(name, kind, form, chunk):
    make = (MODULES if kind == "module" else FUNCTIONS)[name]
    enc = mlp()
    x1, x2 = views()
    plain = make(form)(enc(x1), enc(x2))
    plain.backward()
    want = take_grads(enc)
    got_loss = GradCache(enc, make(form), chunk)(x1, x2)
    assert not got_loss.requires_grad and got_loss.shape == ()
    torch.testing.assert_close(got_loss, plain.detach(), rtol=1e-12, atol=0)
    assert_same_grads(take_grads(enc), want)


# --------------------------------------------------------------------------- dropout and RNG


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_dropout_replayed_exactly(name, chunk):
    """Train mode with dropout: equal to the plain backward of the same chunks with the same
    seed (with chunk >= B that is ``loss(enc(x1), enc(x2)).backward()`` itself), and the RNG
    afterwards is where the plain run leaves it. SSCL without a generator also draws its
    synthetic negatives from the global RNG, after the forward pass, as in the plain run."""
    loss = hb.SSCLLoss(0.5, hardest=4, synthetic=3) if name == "sscl" else MODULES[name]("simclr")
    enc = mlp(dropout=0.3).train()
    x1, x2 = views(1)
    torch.manual_seed(11)
    want_loss = chunked_reference((enc, enc), (x1, x2), loss, chunk)
    want, rng_after = take_grads(enc), torch.get_rng_state()
    torch.manual_seed(11)
    got_loss = GradCache(enc, loss, chunk)(x1, x2)
    assert torch.equal(torch.get_rng_state(), rng_after)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=0)
    assert_same_grads(take_grads(enc), want)


def test_dropout_masks_differ_between_calls():
    """The check above can fail: another seed gives other masks, hence other gradients."""
    enc = mlp(dropout=0.3).train()
    x1, x2 = views(1)
    torch.manual_seed(11)
    chunked_reference((enc, enc), (x1, x2), hb.InfoNCE(), 3)
    want = take_grads(enc)
    torch.manual_seed(12)
    GradCache(enc, hb.InfoNCE(), 3)(x1, x2)
    assert ((take_grads(enc) - want).norm() / want.norm()) > 1e-3


def by_hand(enc, x1, x2, loss, chunk: int) -> torch.Tensor:
    """The three steps written out as in GradCache's paper: each chunk's RNG state forked and
    restored on its own (torch.random.fork_rng), ``torch.autograd.backward(z, g)`` per chunk."""
    states, outputs = [], []
    with torch.no_grad():
        for x in (x1, x2):
            for s in range(0, len(x), chunk):
                states.append(torch.get_rng_state())
                outputs.append(enc(x[s:s + chunk]))
    n = -(-len(x1) // chunk)
    value, grads = loss_gradients(lambda z: loss(*z),
                                  [torch.cat(outputs[:n]), torch.cat(outputs[n:])])
    for i, (x, g) in enumerate(zip((x1, x2), grads)):
        for k, s in enumerate(range(0, len(x), chunk)):
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(states[i * n + k])
                torch.autograd.backward(enc(x[s:s + chunk]), g[s:s + chunk])
    return value


@pytest.mark.parametrize("chunk", (1, 3, B))
def test_replay_bit_identical_to_the_steps_by_hand(chunk):
    """One RNG fork around the whole replay (each chunk's state set in turn) and the engine's
    backward without torch.autograd.backward's checks: the same bits as a fork per chunk and
    torch.autograd.backward, and the RNG left where step 1 left it."""
    enc = mlp(dropout=0.3).train()
    x1, x2 = views(3)
    torch.manual_seed(5)
    want_loss = by_hand(enc, x1, x2, hb.InfoNCE(), chunk)
    want, rng_after = take_grads(enc), torch.get_rng_state()
    torch.manual_seed(5)
    got_loss = GradCache(enc, hb.InfoNCE(), chunk)(x1, x2)
    assert torch.equal(torch.get_rng_state(), rng_after)
    assert torch.equal(got_loss, want_loss) and torch.equal(take_grads(enc), want)


def test_replay_of_one_view_only_sets_each_chunk_state():
    """A loss that uses only the second view: its chunks alone are replayed, each under its
    own state (not a sequence continued from the first view's), equal to the plain backward of
    the same chunks; the RNG afterwards is where step 1 left it."""
    enc = mlp(dropout=0.5).train()
    x1, x2 = views(4)
    torch.manual_seed(21)
    chunked_reference((enc, enc), (x1, x2), lambda a, b: b.square().sum(), 3)
    want, rng_after = take_grads(enc), torch.get_rng_state()
    torch.manual_seed(21)
    GradCache(enc, lambda a, b: b.square().sum(), 3)(x1, x2)
    assert torch.equal(torch.get_rng_state(), rng_after)
    assert_same_grads(take_grads(enc), want)


def test_replay_error_leaves_the_rng_where_step_1_did():
    """An encoder failing in the replay: the error surfaces and the RNG is put back."""
    calls = []

    def flaky(x):
        calls.append(1)
        if len(calls) > 4:  # step 1 ran the 2 x 2 chunks; the replay fails on its first
            raise RuntimeError("replay failed")
        return torch.nn.functional.dropout(x, 0.5) * 2

    x1, x2 = views(6, b=4)
    chunked = embed_chunks([flaky, flaky], [x1, x2], 2)
    _, grads = loss_gradients(lambda z: hb.InfoNCE()(*z), chunked.embeddings)
    torch.rand(3)  # the RNG moves on between the steps; the replay must not rewind it
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="replay failed"):
        backward_chunks(chunked, grads)
    assert torch.equal(torch.get_rng_state(), rng)


def test_first_step_imports_no_sympy():
    """torch.autograd.backward(z, g) imports torch's symbolic shapes (and sympy) on its first
    call: 0.5 s or more that only the first step pays, which made one timed GradCache step 100x
    a plain one on an H100 (docs/benchmarks.md). GradCache's step does not make that call."""
    code = ("import sys, torch, hardbatch as hb\n"
            "enc = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1))\n"
            "hb.GradCache(enc, hb.InfoNCE(0.5), 16)(torch.randn(40, 8), torch.randn(40, 8))\n"
            "print('sympy' in sys.modules, 'torch.fx.experimental.symbolic_shapes' in "
            "sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_the_public_backward_gives_the_same_gradients(monkeypatch):
    """Where torch's private engine call is missing or takes other arguments, GradCache uses
    ``torch.autograd.backward`` (checked once at import): the same gradients, bit for bit."""
    import hardbatch.gradcache as gradcache_module
    assert gradcache_module._engine_backward() is not None  # this torch: the private call
    enc, (x1, x2) = mlp(), views()
    GradCache(enc, hb.InfoNCE(0.2), 5)(x1, x2)
    want = take_grads(enc)
    monkeypatch.setattr(torch.autograd.graph, "_engine_run_backward",
                        lambda tensors, grads, keep: None)  # another signature
    assert gradcache_module._engine_backward() is None
    monkeypatch.setattr(gradcache_module, "_ENGINE_BACKWARD", None)
    enc2 = mlp()
    GradCache(enc2, hb.InfoNCE(0.2), 5)(x1, x2)
    got = take_grads(enc2)
    assert torch.equal(got, want)


# --------------------------------------------------------------------------- inputs and encoders


@pytest.mark.parametrize("chunk", [1, 3, B])
def test_dict_inputs_tokenised_text(chunk):
    enc = TokenEncoder().train()
    t1, t2 = tokens(0), tokens(1)
    torch.manual_seed(3)
    chunked_reference((enc, enc), (t1, t2), hb.InfoNCE(0.2), chunk)
    want = take_grads(enc)
    torch.manual_seed(3)
    GradCache(enc, hb.InfoNCE(0.2), chunk)(t1, t2)
    assert_same_grads(take_grads(enc), want)


def test_list_inputs_and_nested_structures():
    enc = TokenEncoder(dropout=0.0)
    t1, t2 = tokens(2), tokens(3)
    list1, list2 = [t1["input_ids"], t1["attention_mask"]], (t2["input_ids"], t2["attention_mask"])
    hb.InfoNCE()(enc(list1), enc(list2)).backward()
    want = take_grads(enc)
    seen = []

    def encoder(x):
        seen.append(type(x))
        return enc(x)

    GradCache(encoder, hb.InfoNCE(), 2)(list1, list2)
    assert_same_grads(take_grads(enc), want)
    assert set(seen) == {list, tuple}  # each chunk keeps its view's structure


def test_two_encoders_clip_style():
    enc_a, enc_b = mlp(seed=4, dropout=0.2).train(), TokenEncoder(seed=5).train()
    x, t = views(2)[0], tokens(4)
    loss = hb.InfoNCE(0.1, form="simcse")
    torch.manual_seed(8)
    chunked_reference((enc_a, enc_b), (x, t), loss, 3)
    want_a, want_b = take_grads(enc_a), take_grads(enc_b)
    torch.manual_seed(8)
    gc = GradCache((enc_a, enc_b), loss, 3)
    gc(x, t)
    assert_same_grads(take_grads(enc_a), want_a)
    assert_same_grads(take_grads(enc_b), want_b)
    assert "MLP" not in repr(gc) and "(Sequential, TokenEncoder)" in repr(gc)


def test_loss_kwargs_and_loss_parameters():
    """labels and negatives go to the loss; a learnable loss parameter and negatives that
    require grad get the plain backward's gradients too."""

    class ScaledInfoNCE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.log_scale = nn.Parameter(torch.tensor(0.3, dtype=torch.float64))

        def forward(self, a, b, labels=None, negatives=None):
            return self.log_scale.exp() * hb.info_nce(a, b, labels=labels, negatives=negatives)

    enc, crit = mlp(seed=6), ScaledInfoNCE()
    x1, x2 = views(3)
    labels = torch.tensor([0, 1, 0, 2, 3, 3, 4])
    negatives = torch.randn(4, D_OUT, dtype=torch.float64, requires_grad=True)
    crit(enc(x1), enc(x2), labels=labels, negatives=negatives).backward()
    want, want_neg = take_grads(enc, crit), negatives.grad.clone()
    negatives.grad = None
    GradCache(enc, crit, 2)(x1, x2, labels=labels, negatives=negatives)
    assert_same_grads(take_grads(enc, crit), want)
    assert_same_grads(negatives.grad, want_neg)
    GradCache(enc, crit, 2)(x1, x2)  # without labels: another loss, other gradients
    assert ((take_grads(enc, crit) - want).norm() / want.norm()) > 1e-3


def test_return_embeddings_feed_a_bank():
    enc = mlp(seed=7)
    x1, x2 = views(4)
    out = GradCache(enc, hb.InfoNCE(), 3, return_embeddings=True)(x1, x2)
    assert isinstance(out, GradCacheOutput)
    loss, z1, z2 = out
    with torch.no_grad():
        torch.testing.assert_close(z1, enc(x1), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(z2, enc(x2), rtol=1e-12, atol=1e-14)
    assert not (z1.requires_grad or z2.requires_grad or loss.requires_grad)
    bank = hb.EmbeddingBank(20, D_OUT)
    bank.update(torch.arange(B), z1.float())
    assert torch.equal(bank.embeddings[:B], z1.float())


def test_frozen_encoder_and_unused_view():
    """A frozen second tower and a loss that ignores a view: nothing replayed, no error."""
    enc_a, enc_b = mlp(seed=8), mlp(seed=9).requires_grad_(False)
    x1, x2 = views(5)
    hb.InfoNCE()(enc_a(x1), enc_b(x2)).backward()
    want = take_grads(enc_a)
    GradCache((enc_a, enc_b), hb.InfoNCE(), 3)(x1, x2)
    assert_same_grads(take_grads(enc_a), want)
    GradCache(enc_a, lambda a, b: a.square().sum(), 3)(x1, x2)
    got = take_grads(enc_a)
    enc_a(x1).square().sum().backward()
    assert_same_grads(got, take_grads(enc_a))


# --------------------------------------------------------------------------- precision


def test_autocast_bf16_close_to_plain():
    """Under CPU autocast (bf16 encoder matmuls, the loss in float32): close, not equal, and
    every encoder pass, first and replayed, runs in bf16."""
    enc = mlp(seed=10, dtype=torch.float32)
    x1, x2 = views(6, b=32, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = hb.InfoNCE(0.5)(enc(x1), enc(x2))
        plain.backward()
        want = take_grads(enc)
        dtypes = []
        enc.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        loss, e1, _ = GradCache(enc, hb.InfoNCE(0.5), 8, return_embeddings=True)(x1, x2)
    assert dtypes == [torch.bfloat16] * 16 and e1.dtype == torch.bfloat16
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, plain.detach(), rtol=1e-3, atol=0)
    got = take_grads(enc)
    err = ((got - want).norm() / want.norm()).item()
    assert 0 < err < 0.02, err
    # The difference is autocast's weight cache (one bf16 copy of each weight for both views,
    # its gradient summed in bf16): without it, and with one chunk per view, bit-equal.
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        hb.InfoNCE(0.5)(enc(x1), enc(x2)).backward()
        want = take_grads(enc)
        GradCache(enc, hb.InfoNCE(0.5), 32)(x1, x2)
    assert torch.equal(take_grads(enc), want)


def test_replay_restores_the_first_pass_autocast():
    """A deferred replay (sentence-transformers' backward hook runs outside the autocast of the
    forward pass) still runs the encoder under the first pass's autocast."""
    enc = mlp(seed=11, dtype=torch.float32)
    dtypes = []
    enc.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    x1, x2 = views(7, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = embed_chunks([enc, enc], [x1, x2], 4)
        _, grads = loss_gradients(lambda z: hb.info_nce(z[0], z[1]), chunked.embeddings)
    backward_chunks(chunked, grads)
    assert dtypes == [torch.bfloat16] * 8
    assert all(p.grad is not None for p in enc.parameters())


def test_grad_scaler_scales_the_gradients():
    enc = mlp(seed=12)
    x1, x2 = views(8)
    hb.InfoNCE()(enc(x1), enc(x2)).backward()
    want = take_grads(enc)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    loss = GradCache(enc, hb.InfoNCE(), 3, scaler=scaler)(x1, x2)
    assert_same_grads(take_grads(enc), 64.0 * want)
    assert loss.item() == pytest.approx(hb.InfoNCE()(enc(x1), enc(x2)).item(), rel=1e-12)


def test_batch_norm_warns_once_and_running_stats_updated_once():
    torch.manual_seed(13)
    enc = nn.Sequential(nn.Linear(D_IN, 8), nn.BatchNorm1d(8), nn.Tanh(),
                        nn.Linear(8, D_OUT)).double().train()
    x1, x2 = views(9, b=8)
    bn = enc[1]
    start = {k: v.clone() for k, v in bn.state_dict().items()}
    chunked_reference((enc, enc), (x1, x2), hb.InfoNCE(), 3)
    want, want_stats = take_grads(enc), {k: v.clone() for k, v in bn.state_dict().items()}
    bn.load_state_dict(start)
    with pytest.warns(UserWarning, match="batch norm"):
        GradCache(enc, hb.InfoNCE(), 3)(x1, x2)
    assert_same_grads(take_grads(enc), want)
    for k, v in bn.state_dict().items():  # 6 chunk updates (as the chunked forward), not 12
        assert torch.equal(v, want_stats[k]), k
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GradCache(enc, hb.InfoNCE(), 3)(x1, x2)  # once per module
        GradCache(mlp(), hb.InfoNCE(), 3)(x1, x2)  # no batch norm, no warning
        GradCache(enc.eval(), hb.InfoNCE(), 3)(x1, x2)  # eval mode: running stats, exact


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("chunk", [0, -1, 2.5, True, "3", None])
def test_bad_chunk_size(chunk):
    with pytest.raises(ValueError, match="chunk_size"):
        GradCache(mlp(), hb.InfoNCE(), chunk)


@pytest.mark.parametrize(("view1", "view2", "match"), [
    (torch.zeros(7, D_IN), torch.zeros(6, D_IN), r"view1 has 7, view2 has 6"),
    (["a text", "another"], torch.zeros(2, D_IN), r"view1 must be .* got str at view1\[0\]"),
    (torch.zeros(2, D_IN).numpy(), torch.zeros(2, D_IN), "view1 must be .* got ndarray"),
    (torch.zeros(2, D_IN), None, "view2 must be .* got NoneType"),
    (torch.zeros(2, D_IN), torch.tensor(1.0), "view2 is a 0-d tensor"),
    (torch.zeros(2, D_IN), {"mask": torch.ones(2, 3), "texts": ["a", "b"]},
     r"view2 must be .* got str at view2\['texts'\]\[0\]"),
    ({"input_ids": torch.zeros(3, 5), "attention_mask": torch.zeros(2, 5)}, torch.zeros(3, D_IN),
     r"every tensor of view1 must have the batch size as dim 0"),
    ({"names": "x"}, torch.zeros(3, D_IN), "view1 holds no tensor"),
    (torch.zeros(0, D_IN), torch.zeros(0, D_IN), "view1 is empty"),
])
def test_bad_views(view1, view2, match):
    enc = mlp().float()
    with pytest.raises(ValueError, match=match):
        GradCache(lambda x: enc(x) if isinstance(x, torch.Tensor) else enc(x["mask"][:, :1]
                                                                          .expand(-1, D_IN)),
                  hb.InfoNCE(), 2)(view1, view2)
    assert all(p.grad is None for p in enc.parameters())


def test_bad_encoder_loss_and_scaler():
    enc = mlp()
    x1, x2 = views()
    with pytest.raises(ValueError, match="encoder must be a callable"):
        GradCache("mlp", hb.InfoNCE(), 2)
    with pytest.raises(ValueError, match="encoder must be a callable"):
        GradCache((enc, enc, enc), hb.InfoNCE(), 2)
    with pytest.raises(ValueError, match="loss must be a callable"):
        GradCache(enc, "infonce", 2)
    with pytest.raises(ValueError, match="scaler"):
        GradCache(enc, hb.InfoNCE(), 2, scaler=2.0)
    with pytest.raises(ValueError, match=r"encoder must return a tensor \[b, d\].* dict"):
        GradCache(lambda x: {"embedding": enc(x)}, hb.InfoNCE(), 2)(x1, x2)
    with pytest.raises(ValueError, match=r"encoder must return .* 2 items of view1 .* \(1, 5\)"):
        GradCache(lambda x: enc(x)[:1], hb.InfoNCE(), 2)(x1, x2)
    with pytest.raises(ValueError, match="loss must return a scalar tensor, got \\(14,\\)"):
        GradCache(enc, hb.InfoNCE(reduction="none"), 2)(x1, x2)
    assert all(p.grad is None for p in enc.parameters())


# --------------------------------------------------------------------------- DDP (gloo, 2 ranks)

DDP_WORKER = '''
import copy, functools, inspect
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
import hardbatch as hb
from hardbatch.gradcache import GradCache
from support import end_torchrun_worker

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
base = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5)).double()
gen = torch.Generator().manual_seed(1)
sizes = [7, 5, 6][:world]  # uneven local batches
x1 = [torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in sizes]
x2 = [torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in sizes]

def grads(m):
    out = torch.cat([p.grad.flatten() for p in m.parameters()])
    m.zero_grad(set_to_none=True)
    return out

def check(got, want, what):
    err = ((got - want).norm() / want.norm()).item()
    assert err <= 1e-9, (what, err)

def counted(model):
    calls = []
    def hook(state, bucket):
        calls.append(1)
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, hook)
    return calls

# 1. local loss: DDP's average of the ranks' gradients, one all-reduce per step (no_sync)
ref = copy.deepcopy(base)
for r in range(world):
    hb.InfoNCE()(ref(x1[r]), ref(x2[r])).backward()
want = grads(ref) / world
model = copy.deepcopy(base)
ddp = nn.parallel.DistributedDataParallel(model)
calls = counted(ddp)
GradCache(ddp, hb.InfoNCE(), 3)(x1[rank], x2[rank])
check(grads(model), want, "local loss")
assert len(calls) == 1, calls  # 1 bucket, reduced once after 2 x 3 chunks

# 2. two DDP towers: each reduced once
a, b = copy.deepcopy(base), copy.deepcopy(base)
ref_a, ref_b = copy.deepcopy(base), copy.deepcopy(base)
for r in range(world):
    hb.InfoNCE(form="simcse")(ref_a(x1[r]), ref_b(x2[r])).backward()
want_a, want_b = grads(ref_a) / world, grads(ref_b) / world
da, db = (nn.parallel.DistributedDataParallel(m) for m in (a, b))
calls_a, calls_b = counted(da), counted(db)
GradCache((da, db), hb.InfoNCE(form="simcse"), 2)(x1[rank], x2[rank])
check(grads(a), want_a, "tower a")
check(grads(b), want_b, "tower b")
assert len(calls_a) == len(calls_b) == 1, (calls_a, calls_b)

# 3. gathered negatives: the gradient of one process on the global batch
if "gather" in inspect.signature(hb.info_nce).parameters:
    for form in ("simclr", "simcse"):
        ref = copy.deepcopy(base)
        hb.InfoNCE(form=form)(ref(torch.cat(x1)), ref(torch.cat(x2))).backward()
        want = grads(ref)
        model = copy.deepcopy(base)
        ddp = nn.parallel.DistributedDataParallel(model)
        fn = functools.partial(hb.info_nce, form=form, gather=True)
        GradCache(ddp, fn, 2)(x1[rank], x2[rank])
        check(grads(model), want, "gather " + form)
    print(f"RANK {rank} GATHER OK", flush=True)
print(f"RANK {rank} OK", flush=True)
torch.distributed.barrier()
end_torchrun_worker()
'''


@pytest.mark.skipif(not torch.distributed.is_available() or
                    not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_ddp_two_ranks_gloo(tmp_path):
    """torchrun, 2 ranks, gloo: GradCache through DistributedDataParallel gives DDP's averaged
    gradient with one all-reduce per step (every chunk but the last in ``no_sync``), for one
    shared encoder and two towers, and with ``gather=True`` the global batch's gradient."""
    worker = tmp_path / "gradcache_worker.py"
    worker.write_text(DDP_WORKER)
    out = run_torchrun(worker, timeout=300)
    assert "RANK 0 OK" in out and "RANK 1 OK" in out, out[-6000:]
    if "gather" in inspect.signature(hb.info_nce).parameters:
        assert "RANK 0 GATHER OK" in out and "RANK 1 GATHER OK" in out, out[-6000:]


# --------------------------------------------------------------------------- docs examples

DOCS = REPO / "docs" / "distributed.md"
SECTION = "## Scaling the negatives: gathered negatives, one global hard batch, gradient caching"


def section_blocks() -> list[str]:
    """The ```python blocks of the section of docs/distributed.md that documents GradCache (the
    page's other blocks need GPUs and torchrun)."""
    text = DOCS.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end if end > 0 else None],
                      flags=re.DOTALL)


def test_docs_section_has_the_examples():
    blocks = section_blocks()
    assert len(blocks) == 2
    assert all("GradCache(" in b for b in blocks) and "lightning" in blocks[1]


@pytest.mark.parametrize("index", [0, 1])
def test_docs_example_runs(index, tmp_path, monkeypatch):
    """Each example of the section runs on its tiny CPU data and trains: the bank it feeds is
    written by every step."""
    block = section_blocks()[index]
    if "lightning" in block:
        pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)  # anything an example writes stays out of the repository
    namespace: dict = {"__name__": "docs_example"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips and deprecations
        code = compile(textwrap.dedent(block), f"{DOCS.name} block {index}", "exec")
        exec(code, namespace)  # noqa: S102 - the documented example, run as a user would
    assert namespace["bank"].step == 4
    if "loss" in namespace:
        assert torch.isfinite(namespace["loss"])
