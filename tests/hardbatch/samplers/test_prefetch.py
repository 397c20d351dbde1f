"""The prefetch thread (``prefetch``): same batches as without it, one thread per iteration,
snapshots still taken in the loop's thread, checkpoints and pickles keep the planned steps."""

import gc
import pickle
import threading

import numpy as np
import pytest
import torch
from sampler_support import LIVE_B, LIVE_D, LIVE_N, N, finish_epoch, live_graph, make, run
from support import unit_rows
from torch.utils.data import DataLoader, TensorDataset

import hardbatch as hb
from hardbatch.samplers import ProximityGraphSampler


def wait_for(predicate, tries: int = 500) -> None:
    for _ in range(tries):
        if predicate():
            return
        threading.Event().wait(0.01)


@pytest.mark.parametrize("background,lag,graph", [(False, 0, "proximity"), (False, 2, "proximity"),
                                                  (True, 1, "proximity"), (True, 3, "knn")])
def test_prefetch_gives_the_same_batches_from_a_live_bank(base, background, lag, graph):
    sync = run(live_graph(background, lag, graph), base)
    planned = live_graph(background, lag, graph, prefetch=6)
    assert run(planned, base) == sync
    assert planned.prefetcher.run.thread is None  # the thread ends with the epoch


def test_prefetch_knn_sampler_gives_the_same_batches(base):
    def knn(prefetch):
        return hb.KNNBatchSampler(hb.EmbeddingBank(LIVE_N, LIVE_D, seed=3), LIVE_B,
                                  refresh_every=4, refresh_lag=2, seed=5, prefetch=prefetch)
    assert run(knn(5), base) == run(knn(0), base)


def test_prefetch_plans_ahead_in_a_thread(base):
    sampler = ProximityGraphSampler(base, LIVE_B, 100, 10, refresh_every=None, seed=2, prefetch=5)
    it = iter(sampler)
    first = next(it)
    thread = sampler.prefetcher.run.thread
    assert thread is not None and thread.name == "hardbatch-prefetch" and thread.is_alive()
    wait_for(lambda: len(sampler.prefetcher.run.queue) == 5, 200)  # the loop does nothing
    assert len(sampler.prefetcher.run.queue) == 5
    rest = [first] + list(it)
    reference = ProximityGraphSampler(base, LIVE_B, 100, 10, refresh_every=None, seed=2)
    assert rest == list(reference)
    assert not thread.is_alive()


def test_prefetch_waits_for_the_snapshot_of_an_unreached_refresh_step(base):
    """The prefetch thread never runs past step s + L - 1 before the loop has reached refresh
    step s."""
    sampler = live_graph(False, 2, prefetch=50)
    it = iter(sampler)
    next(it)  # step 0
    wait_for(lambda: len(sampler.prefetcher.run.queue) >= 5)
    threading.Event().wait(0.1)
    # steps 1..5 are plannable (step 4's snapshot is needed from step 6 on)
    assert len(sampler.prefetcher.run.queue) == 5
    next(it), next(it), next(it), next(it)  # consume up to step 4: its snapshot is taken
    wait_for(lambda: len(sampler.prefetcher.run.queue) > 1, 200)
    assert len(sampler.prefetcher.run.queue) > 1
    it.close()
    assert sampler.prefetcher.run.thread is None


def test_prefetch_resume_mid_epoch_with_batches_planned_ahead(base):
    full = run(live_graph(True, 3), base, epochs=2)
    first = live_graph(True, 3, prefetch=7)
    head = run(first, base, epochs=2, stop_after=29)  # the thread is ahead of step 28
    state = first.state_dict()
    assert len(state["pending_plan"]) > 0  # planned but not handed out
    for prefetch in (0, 4):  # resume with or without a prefetch thread
        second = live_graph(True, 3, prefetch=prefetch)
        second.source.load_state_dict(first.source.state_dict())
        second.load_state_dict(state)
        assert head + finish_epoch(second, base, 29) == full


def test_prefetch_error_in_the_thread_reaches_the_loop():
    calls = []

    def source():
        calls.append(1)
        x = unit_rows(np.random.default_rng(0), LIVE_N, LIVE_D)
        if len(calls) > 1:
            x[3, 0] = np.nan
        return x

    sampler = ProximityGraphSampler(source, LIVE_B, 100, 10, refresh_every=4, seed=1, prefetch=3)
    with pytest.raises(ValueError, match="NaN"):
        for _ in sampler:
            pass
    assert sampler.prefetcher.run.thread is None


def test_bad_prefetch():
    with pytest.raises(ValueError, match="prefetch"):
        ProximityGraphSampler(hb.EmbeddingBank(LIVE_N, LIVE_D), LIVE_B, 100, 10, prefetch=-1)


def test_prefetch_sampler_pickled_mid_epoch_keeps_its_planned_steps(base):
    sampler = ProximityGraphSampler(base, LIVE_B, 100, 10, refresh_every=None, seed=2, prefetch=3)
    it = iter(sampler)
    next(it), next(it)
    wait_for(lambda: len(sampler.prefetcher.run.queue) == 3)  # the queue is full: the thread waits
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.prefetcher.run.thread is None and len(copy.prefetcher.run.queue) == 3
    want, got = sampler.state_dict(consumed=1), copy.state_dict(consumed=1)
    assert len(want["pending_plan"]) == 4  # 1 yielded but not consumed + 3 planned
    assert all(torch.equal(a, b) for a, b in zip(want["pending_plan"], got["pending_plan"]))
    it.close()


# -- one prefetch thread per iteration -----------------------------------------------------------

def test_a_new_iteration_is_not_stopped_by_an_abandoned_one(emb):
    reference = list(make("proximity", emb, seed=3))
    s = make("proximity", emb, seed=3, prefetch=2)
    first = iter(s)
    head = [next(first) for _ in range(3)]
    assert head == reference[:3]
    second = iter(s)  # e.g. iter(loader) again: a new epoch-0 iteration
    assert next(second) == reference[0]
    with pytest.raises(RuntimeError, match="superseded by a newer iteration"):
        next(first)  # its thread was stopped when the new iteration began
    del first
    gc.collect()  # the abandoned generator's cleanup must leave the new thread running
    rest = list(second)
    assert [reference[0]] + rest == reference
    assert s.prefetcher.run.thread is None


def test_abandoned_dataloader_iterator_with_a_worker(emb):
    ds = TensorDataset(torch.arange(N))
    s = make("proximity", emb, seed=3, prefetch=2)
    loader = DataLoader(ds, batch_sampler=s, num_workers=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    it = iter(loader)  # the old iterator is released while the new one runs
    batches = [b[0].tolist() for b in it]
    assert batches == list(make("proximity", emb, seed=3))
