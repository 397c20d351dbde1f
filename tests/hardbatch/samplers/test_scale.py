"""Throughput options: pipelined/background refresh, device and half-precision paths, faiss kNN."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from support import unit_rows

import hardbatch as hb
from hardbatch.samplers import ProximityGraphSampler

N, D, B = 800, 16, 32


def feed(bank, batch, base, step):
    """The bank update of a training step: the batch's rows, moved with the step."""
    idx = torch.tensor(batch)
    bank.update(idx, base[idx] + 0.5 * torch.cos(idx[:, None] * 0.1 + step
                                                 + torch.arange(D)).float())


def run(sampler, base, epochs=2, stop_after=None):
    """A training loop feeding the sampler's bank; returns the batches (and stops early if asked)."""
    out, step = [], 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            out.append(batch)
            feed(sampler.source, batch, base, step)
            step += 1
            if stop_after is not None and step == stop_after:
                return out
    return out


def finish_epoch(sampler, base, step):
    """The rest of a resumed epoch, from global step ``step``."""
    out = []
    for batch in sampler:
        out.append(batch)
        feed(sampler.source, batch, base, step)
        step += 1
    return out


def make(background, lag, graph="proximity", **kw):
    bank = hb.EmbeddingBank(N, D, seed=3)
    return ProximityGraphSampler(bank, B, 100, 10, graph=graph, refresh_every=4,
                                 refresh_lag=lag, background=background, seed=1, **kw)


@pytest.fixture(scope="module")
def base():
    return torch.from_numpy(unit_rows(np.random.default_rng(0), N, D))


@pytest.mark.parametrize("graph", ["proximity", "knn"])
def test_background_equals_synchronous_pipelined_refresh(base, graph):
    sync = run(make(False, 2, graph), base)
    bg_sampler = make(True, 2, graph)
    bg = run(bg_sampler, base)
    assert bg == sync
    assert bg_sampler.refreshes == 12  # steps 0, 4, ..., 44 (step 48's graph would be used at 50)
    assert run(make(False, 0, graph), base) != sync  # the lag changes which graph is used


def test_pipelined_refresh_uses_the_snapshot_of_the_refresh_step(base):
    sampler = make(False, 3)
    built = {}
    original = sampler._build

    def spy(x, global_step, group):
        built[global_step] = x.copy()
        return original(x, global_step, group)

    sampler._build = spy
    bank = sampler.source
    for step, _ in enumerate(run(sampler, base, epochs=1, stop_after=9)):
        pass
    # The graph for step 4 was built from the bank as it stood when batch 4 was requested.
    assert sorted(built) == [0, 4, 8]
    assert sampler._built_step == 4  # step 8's graph comes into use at step 11
    assert bank.step == 9


def test_background_build_runs_in_a_worker_thread(base):
    sampler = make(True, 1)
    threads = []
    original = sampler._rebuild

    def spy(x, seed, group):
        threads.append(threading.current_thread().name)
        return original(x, seed, group)

    sampler._rebuild = spy
    run(sampler, base, epochs=1)
    assert threads[0] == threading.current_thread().name  # step 0: nothing to overlap with
    assert all(name.startswith("hardbatch-refresh") for name in threads[1:]) and len(threads) > 3


def test_background_resume_with_a_pending_build(base):
    full = run(make(True, 3), base, epochs=2)
    first = make(True, 3)
    head = run(first, base, epochs=2, stop_after=30)  # step 29: step 28's build is pending
    assert first._next is not None
    state = first.state_dict()
    assert "next" in state["generator"]
    second = make(True, 3)
    second.source.load_state_dict(first.source.state_dict())
    second.load_state_dict(state)
    assert head + finish_epoch(second, base, 30) == full


@pytest.mark.parametrize("kwargs,match", [
    (dict(background=True, refresh_lag=0), "background=True needs refresh_lag >= 1"),
    (dict(refresh_lag=4), "refresh_lag=4 must be smaller than refresh_every=4"),
    (dict(refresh_lag=-1), "refresh_lag=-1 must be >= 0"),
    (dict(precision="fp8"), "precision='fp8' must be"),
    (dict(device="nodevice"), "device='nodevice' is not a torch device"),
])
def test_bad_throughput_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProximityGraphSampler(hb.EmbeddingBank(N, D), B, 100, 10, refresh_every=4, **kwargs)


def test_device_argument_gives_the_same_graph(rng):
    x = unit_rows(rng, 600, 16)
    ref = hb.proximity_graph(x, 100, 10, seed=4)
    assert torch.equal(hb.proximity_graph(x, 100, 10, seed=4, device="cpu"), ref)
    assert torch.equal(hb.knn_graph(x, 10, device=torch.device("cpu")), hb.knn_graph(x, 10))
    if torch.cuda.is_available():  # not exercised on the CPU-only CI machine
        cuda = hb.proximity_graph(x, 100, 10, seed=4, device="cuda")
        assert (cuda == ref).float().mean() > 0.99


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_graphs_close_to_fp32(rng, precision):
    try:
        torch.ones(2, 2, dtype=torch.bfloat16 if precision == "bf16" else torch.float16) @ \
            torch.ones(2, 2, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    except RuntimeError:
        pytest.skip(f"{precision} matmul not supported on this CPU build")
    x = unit_rows(rng, 1000, 32)
    for build in (lambda **kw: hb.proximity_graph(x, 200, 20, seed=1, **kw),
                  lambda **kw: hb.knn_graph(x, 20, **kw)):
        ref, half = build().numpy(), build(precision=precision).numpy()
        # Same neighbour sets up to near-ties; neighbour similarity within 0.5%.
        overlap = np.mean([len(set(a) & set(b)) / 20 for a, b in zip(ref, half)])
        assert overlap > 0.9
        sim = lambda g: np.einsum("nd,nkd->nk", x, x[g]).mean()
        assert abs(sim(half) / sim(ref) - 1) < 0.005


@pytest.mark.parametrize("method", ["faiss", "faiss-ivf"])
def test_faiss_knn_graph(rng, method):
    pytest.importorskip("faiss")
    x = unit_rows(rng, 2000, 16)
    ref = hb.knn_graph(x, 10).numpy()
    got = hb.knn_graph(x, 10, method=method, nlist=16, nprobe=8).numpy()
    assert got.shape == ref.shape and (got != np.arange(2000)[:, None]).all()
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ref, got)])
    assert recall > (0.999 if method == "faiss" else 0.9)


def test_gcbs_device_and_precision(rng):
    x = unit_rows(rng, 500, 16)
    ref = hb.gcbs_permutation(x, 0.99, seed=2)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=2, device="cpu"), ref)
    half = hb.gcbs_permutation(x, 0.99, seed=2, precision="bf16")
    assert sorted(half.tolist()) == list(range(500))


def test_samplers_accept_device_and_precision(rng):
    x = unit_rows(rng, 400, 16)
    ref = list(ProximityGraphSampler(x, 16, 60, 8, refresh_every=None, seed=2))
    assert list(ProximityGraphSampler(x, 16, 60, 8, refresh_every=None, seed=2,
                                      device="cpu")) == ref
    half = list(ProximityGraphSampler(x, 16, 60, 8, refresh_every=None, seed=2, precision="bf16"))
    assert len(half) == len(ref) and all(len(set(b)) == 16 for b in half)
    gcbs = hb.GCBSSampler(x, 16, quantile=0.99, device="cpu", precision="bf16")
    assert sorted(i for b in gcbs for i in b) == list(range(400))
    knn = list(hb.KNNBatchSampler(x, 16, refresh_every=None, device="cpu"))
    assert knn == list(hb.KNNBatchSampler(x, 16, refresh_every=None))


def test_gcbs_partition_method():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from _common import gaussian_mixture
    from bench_gcbs import batch_top1

    x = gaussian_mixture(6000, 16, components=100)
    q = 1 - 32 / 6000
    exact = hb.gcbs_permutation(x, q, method="exact", seed=3)
    assert torch.equal(hb.gcbs_permutation(x, q, method="partition", partitions=1, seed=3), exact)
    part = hb.gcbs_permutation(x, q, method="partition", partitions=6, seed=3)
    assert sorted(part.tolist()) == list(range(6000))
    assert batch_top1(x, part.numpy(), 64) > 0.97 * batch_top1(x, exact.numpy(), 64)
    with pytest.raises(ValueError, match="partitions=0 must be >= 1"):
        hb.gcbs_permutation(x, q, method="partition", partitions=0)
    sampler = hb.GCBSSampler(x, 64, quantile=q, method="partition", partitions=3)
    assert sorted(i for b in sampler for i in b) == list(range(6000))


def test_gcbs_partition_shards_cover_the_chain_and_concatenate_to_the_order(rng):
    from hardbatch.gcbs import PartitionPlan, similarity_threshold

    x = unit_rows(rng, 3000, 8)
    plan = PartitionPlan(x, x, similarity_threshold(x, x, 0.99, 1), 7, 1, None, "fp32")
    whole = plan.order(0, 7)
    assert torch.equal(torch.from_numpy(whole),
                       hb.gcbs_permutation(x, 0.99, method="partition", partitions=7, seed=1))
    sizes = np.diff(plan.start)[plan.chain]
    for world in (1, 2, 3, 7, 9):
        shards = [plan.shard(r, world) for r in range(world)]
        assert shards[0][0] == 0 and shards[-1][1] == 7
        assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(shards, shards[1:]))
        assert np.array_equal(np.concatenate([plan.order(*sh) for sh in shards]), whole)
        if world == 2:  # about equal cost: no shard holds more than the total minus one cell
            cost = [float((sizes[a:b].astype(float) ** 2).sum()) for a, b in shards]
            assert max(cost) <= (sizes.astype(float) ** 2).sum() - (sizes.astype(float) ** 2).min()


# -- planner thread (prefetch) ---------------------------------------------------------------

@pytest.mark.parametrize("background,lag,graph", [(False, 0, "proximity"), (False, 2, "proximity"),
                                                  (True, 1, "proximity"), (True, 3, "knn")])
def test_prefetch_gives_the_same_batches(base, background, lag, graph):
    sync = run(make(background, lag, graph), base)
    planned = make(background, lag, graph, prefetch=6)
    assert run(planned, base) == sync
    assert planned._run.thread is None  # the thread ends with the epoch


def test_prefetch_knn_sampler_gives_the_same_batches(base):
    def knn(prefetch):
        return hb.KNNBatchSampler(hb.EmbeddingBank(N, D, seed=3), B, refresh_every=4,
                                  refresh_lag=2, seed=5, prefetch=prefetch)
    assert run(knn(5), base) == run(knn(0), base)


def test_prefetch_plans_ahead_in_a_thread(base):
    sampler = ProximityGraphSampler(base, B, 100, 10, refresh_every=None, seed=2, prefetch=5)
    it = iter(sampler)
    first = next(it)
    planner = sampler._run.thread
    assert planner is not None and planner.name == "hardbatch-planner" and planner.is_alive()
    for _ in range(200):  # the planner fills its queue while the loop does nothing
        if len(sampler._run.queue) == 5:
            break
        threading.Event().wait(0.01)
    assert len(sampler._run.queue) == 5
    rest = [first] + list(it)
    reference = ProximityGraphSampler(base, B, 100, 10, refresh_every=None, seed=2)
    assert rest == list(reference)
    assert not planner.is_alive()


def test_prefetch_waits_for_the_snapshot_of_an_unreached_refresh_step(base):
    """The planner never runs past step s + L - 1 before the loop has reached refresh step s."""
    sampler = make(False, 2, prefetch=50)
    it = iter(sampler)
    next(it)  # step 0
    for _ in range(500):
        if len(sampler._run.queue) >= 5:
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.1)
    # steps 1..5 are plannable (step 4's snapshot is needed from step 6 on)
    assert len(sampler._run.queue) == 5
    next(it), next(it), next(it), next(it)  # consume up to step 4: its snapshot is taken
    for _ in range(200):
        if len(sampler._run.queue) > 1:
            break
        threading.Event().wait(0.01)
    assert len(sampler._run.queue) > 1
    it.close()
    assert sampler._run.thread is None


def test_prefetch_resume_mid_epoch_with_batches_planned_ahead(base):
    full = run(make(True, 3), base, epochs=2)
    first = make(True, 3, prefetch=7)
    head = run(first, base, epochs=2, stop_after=29)  # planner is ahead of step 28
    state = first.state_dict()
    assert len(state["pending_plan"]) > 0  # planned but not handed out
    for prefetch in (0, 4):  # resume with or without a planner
        second = make(True, 3, prefetch=prefetch)
        second.source.load_state_dict(first.source.state_dict())
        second.load_state_dict(state)
        assert head + finish_epoch(second, base, 29) == full


def test_prefetch_error_in_the_planner_reaches_the_loop():
    calls = []

    def source():
        calls.append(1)
        x = unit_rows(np.random.default_rng(0), N, D)
        if len(calls) > 1:
            x[3, 0] = np.nan
        return x

    sampler = ProximityGraphSampler(source, B, 100, 10, refresh_every=4, seed=1, prefetch=3)
    with pytest.raises(ValueError, match="NaN"):
        for _ in sampler:
            pass
    assert sampler._run.thread is None


def test_bad_prefetch():
    with pytest.raises(ValueError, match="prefetch"):
        ProximityGraphSampler(hb.EmbeddingBank(N, D), B, 100, 10, prefetch=-1)


# -- GCBS: pipelined / background epochs -------------------------------------------------------

def gcbs(background, lag, **kw):
    return hb.GCBSSampler(hb.EmbeddingBank(N, D, seed=3), B, quantile=0.99, refresh_lag=lag,
                          background=background, seed=1, **kw)


def test_gcbs_background_equals_synchronous_pipelined_epochs(base):
    sync = run(gcbs(False, 5), base, epochs=3)
    assert run(gcbs(True, 5), base, epochs=3) == sync
    assert run(gcbs(False, 0), base, epochs=3) != sync  # the lag changes the snapshot
    steps = -(-N // B)
    for epoch in range(3):  # every epoch still partitions the items
        items = sorted(i for b in sync[epoch * steps:(epoch + 1) * steps] for i in b)
        assert items == list(range(N))


def test_gcbs_next_is_built_from_the_snapshot_lag_steps_before_the_end(base):
    sampler = gcbs(True, 4)
    snapshots, builders = [], {}
    snapshot, build = sampler._snapshot, sampler._build_order

    def spy_snapshot(copy):
        snapshots.append((sampler.source.step, copy))
        return snapshot(copy)

    def spy_build(x, y, epoch, group):
        builders[epoch] = threading.current_thread().name
        return build(x, y, epoch, group)

    sampler._snapshot, sampler._build_order = spy_snapshot, spy_build
    run(sampler, base, epochs=2)
    from hardbatch.samplers import _resolve
    _resolve(sampler._next[1])  # epoch 2's order (not iterated) is built by now
    steps = len(sampler)  # 25; the bank counts one update per step
    assert snapshots == [(0, False), (steps - 4, True), (2 * steps - 4, True)]
    assert builders[0] == threading.current_thread().name  # the first epoch: at its start
    assert all(builders[e].startswith("hardbatch-refresh") for e in (1, 2))


def test_gcbs_resume_between_epochs_keeps_the_pipelined_order(base):
    full = run(gcbs(True, 6), base, epochs=2)
    first = gcbs(True, 6)
    head = run(first, base, epochs=1)
    state = first.state_dict()  # between epochs: epoch 1's order is built, not yet used
    assert state["generator"]["next_epoch"] == 1
    second = gcbs(False, 6)
    second.source.load_state_dict(first.source.state_dict())
    second.load_state_dict(state)
    assert head + finish_epoch(second, base, len(head)) == full


@pytest.mark.parametrize("kwargs,match", [
    (dict(background=True, refresh_lag=0), "background=True needs refresh_lag >= 1"),
    (dict(refresh_lag=26), "refresh_lag=26 must be at most the 25 steps"),
    (dict(refresh_lag=-2), "refresh_lag=-2 must be >= 0"),
])
def test_bad_gcbs_pipelining(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hb.GCBSSampler(hb.EmbeddingBank(N, D), B, **kwargs)


def test_gcbs_sampler_with_an_order_building_in_the_background_pickles(base):
    import pickle

    sampler = gcbs(True, 3)
    it = iter(sampler)
    for _ in range(len(sampler) - 2):  # past the snapshot: epoch 1's order is being built
        next(it)
    copy = pickle.loads(pickle.dumps(sampler))
    from hardbatch.samplers import _resolve
    epoch, (order, batch_order) = copy._next
    assert epoch == 1 and np.array_equal(order, _resolve(sampler._next[1])[0])


def test_prefetch_sampler_pickled_mid_epoch_keeps_its_planned_steps(base):
    import pickle

    sampler = ProximityGraphSampler(base, B, 100, 10, refresh_every=None, seed=2, prefetch=3)
    it = iter(sampler)
    next(it), next(it)
    for _ in range(500):  # the queue is full: the planner waits
        if len(sampler._run.queue) == 3:
            break
        threading.Event().wait(0.01)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._run.thread is None and len(copy._run.queue) == 3
    want, got = sampler.state_dict(consumed=1), copy.state_dict(consumed=1)
    assert len(want["pending_plan"]) == 4  # 1 yielded but not consumed + 3 planned
    assert all(torch.equal(a, b) for a, b in zip(want["pending_plan"], got["pending_plan"]))
    it.close()
