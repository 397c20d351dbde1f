"""The device paths (``device=``, CUDA banks, losses, GradCache) against the CPU.

Marked ``gpu``: they run on the device named by ``HARDBATCH_TEST_DEVICE`` (``cuda`` where one
is present), and are skipped when it names none that torch can use. ``scripts/gpu_check.sh``
runs them on the GPU machine; its ``--smoke`` mode (run by tests/test_gpu_check.py) runs them
on the CPU, so that they cannot rot on machines without a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import hardbatch as hb

pytestmark = pytest.mark.gpu


def _device() -> torch.device:
    name = os.environ.get("HARDBATCH_TEST_DEVICE", "cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("no CUDA device (set HARDBATCH_TEST_DEVICE=cpu to run these on the CPU)")
    return torch.device(name)


@pytest.fixture
def device() -> torch.device:
    return _device()


def _rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def test_proximity_graph_on_device_matches_cpu(device):
    x = _rows(2000, 32)
    cpu = hb.proximity_graph(x, 200, 20, seed=3)
    dev = hb.proximity_graph(x.to(device), 200, 20, seed=3, device=device).cpu()
    same = (cpu.sort(1).values == dev.sort(1).values).float().mean().item()
    assert same > 0.999  # the same candidates; products may round differently at ties


def test_knn_graph_on_device_matches_cpu(device):
    x = _rows(1500, 32, seed=1)
    cpu = hb.knn_graph(x, 15)
    dev = hb.knn_graph(x.to(device), 15, device=device).cpu()
    assert (cpu.sort(1).values == dev.sort(1).values).float().mean().item() > 0.999


def test_gcbs_permutation_on_device_equals_cpu(device):
    # Every sampled pair lies at least half a gap from the threshold (gcbs.similarity_threshold),
    # so the same pairs pass on any device and the orders are identical.
    x = _rows(1200, 16, seed=2)
    cpu = hb.gcbs_permutation(x, 0.99, seed=5, method="exact")
    dev = hb.gcbs_permutation(x.to(device), 0.99, seed=5, method="exact", device=device)
    assert torch.equal(cpu, dev.cpu())


def test_sampler_reads_a_bank_on_device(device):
    n, b = 600, 32
    bank = hb.EmbeddingBank(n, 16, device=device)
    bank.update(torch.arange(n, device=device), _rows(n, 16, seed=4).to(device))
    sampler = hb.ProximityGraphSampler(bank, b, candidates=100, neighbors=10,
                                       refresh_every=5, device=device)
    batches = list(sampler)
    assert len(batches) == -(-n // b)
    assert all(len(set(batch)) == len(batch) and max(batch) < n for batch in batches)


@pytest.mark.parametrize("name", ["infonce", "dcl", "hcl"])
def test_losses_on_device_match_cpu(device, name):
    gen = torch.Generator().manual_seed(0)
    a, p = torch.randn(64, 16, generator=gen), torch.randn(64, 16, generator=gen)
    loss = hb.registry.make_loss(name, temperature=0.1)
    want = loss(a, p)
    got = loss(a.to(device), p.to(device))
    assert got.device.type == device.type
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        half = loss(a.to(device), p.to(device))
    assert torch.isfinite(half) and abs(half.item() - want.item()) < 0.05


def test_gradcache_on_device_equals_the_plain_step(device):
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 8)).to(device)
    gen = torch.Generator().manual_seed(1)
    v1 = torch.randn(48, 16, generator=gen).to(device)
    v2 = v1 + 0.1 * torch.randn(48, 16, generator=gen).to(device)
    loss_fn = hb.InfoNCE(temperature=0.1)
    loss_fn(enc(v1), enc(v2)).backward()
    plain = [q.grad.clone() for q in enc.parameters()]
    enc.zero_grad()
    hb.GradCache(enc, loss_fn, chunk_size=7)(v1, v2)
    for g, q in zip(plain, enc.parameters()):
        torch.testing.assert_close(q.grad, g, rtol=1e-4, atol=1e-6)


def test_gcbs_hardness_on_device(device):
    x = _rows(3000, 8, seed=6).to(device)
    order = hb.gcbs_permutation(x, 0.995, device=device).cpu()
    xs = x.cpu()

    def hardness(o):
        vals = []
        for s in range(0, 3000 - 64 + 1, 64):
            sims = xs[o[s:s + 64]] @ xs[o[s:s + 64]].T
            sims.fill_diagonal_(-2)
            vals.append(sims.max(1).values.mean().item())
        return np.mean(vals)

    assert hardness(order) > hardness(torch.randperm(3000)) + 0.05
