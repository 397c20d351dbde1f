"""RefreshPolicy: the schedule (every t steps, every epoch), pipelined and background builds,
the next-build slot across checkpoints and pickling; one policy for the graph, kNN and GCBS,
each sampler injecting a builder of its own; the source read once per build, as torch,
normalised once."""

import math
import pickle
import threading

import numpy as np
import pytest
import torch
from sampler_support import B, LIVE_B, LIVE_D, LIVE_N, N, finish_epoch, live_gcbs, live_graph, \
    make, run

import hardbatch as hb
from hardbatch.samplers import Builder, ProximityGraphSampler
from hardbatch.samplers.refresh import RefreshPolicy


class KeyBuilder:
    """A builder whose 'structure' is the key it was built for."""

    exact_build, cheaper_build = False, "nothing cheaper"

    def build(self, x, key, group):
        return key

    def save_structure(self, structure):
        return {"key": structure}

    def load_structure(self, state):
        return state.get("key")


def policy(every, lag, per_epoch=False):
    """A policy over a fixed table whose 'structure' is the key it was built for."""
    reads = []
    assert isinstance(KeyBuilder(), Builder)
    pol = RefreshPolicy(np.ones((4, 2), np.float32), KeyBuilder(), 4, every=every, lag=lag,
                        background=False, distributed=False, per_epoch=per_epoch)
    read = pol.read

    def spy(copy, step=0):
        reads.append(copy)
        return read(copy, step)

    pol.read = spy
    return pol, reads


def in_use(pol, steps):
    """The structure used at each step by a loop that asks for one batch per step."""
    out = []
    for g in range(steps):
        pol.before_step(g)
        out.append(pol.use(pol.due(g)))
    return out


@pytest.mark.parametrize("every,lag,expected,snapshots", [
    (4, 0, [0] * 4 + [4] * 4 + [8] * 3, 0),
    (4, 2, [0] * 6 + [4] * 4 + [8], 2),
    (None, 0, [0] * 11, 0),
    (3, 2, [0] * 5 + [3] * 3 + [6] * 3, 3),  # step 9's build is used from step 11
])
def test_step_schedule(every, lag, expected, snapshots):
    pol, reads = policy(every, lag)
    assert in_use(pol, 11) == expected
    assert pol.refreshes == len(set(expected))
    # pipelined builds read a copy (a snapshot) at their refresh step, the others when needed
    assert reads == [False] + ([True] * snapshots if lag else [False] * (len(set(expected)) - 1))


def test_epoch_schedule_snapshots_lag_steps_before_the_epoch_ends():
    pol, reads = policy(5, 2, per_epoch=True)  # 5 steps per epoch
    used = []
    for epoch in range(3):
        pol.use(epoch, rebuild=True)  # an epoch starts
        for g in range(epoch * 5, epoch * 5 + 5):
            pol.before_step(g)
            used.append(pol.structure)
            assert pol.next_key == (epoch + 1 if g % 5 >= 3 else None)
    assert used == [0] * 5 + [1] * 5 + [2] * 5
    assert reads == [False, True, True, True]  # epoch 0 now; 1, 2, 3 from snapshots


def test_one_policy_serves_the_graph_knn_and_gcbs_samplers(emb):
    builders = {"proximity": "ProximityGraphBuilder", "knn": "SnapshotBuilder",
                "knn_graph": "ProximityGraphBuilder", "gcbs": "GCBSOrderBuilder"}
    for kind, builder in builders.items():
        sampler = make(kind, emb)
        assert type(sampler.refresh_policy) is RefreshPolicy
        assert type(sampler.builder).__name__ == builder  # an object of its own, injected
        assert sampler.refresh_policy.builder is sampler.builder
        assert isinstance(sampler.builder, Builder) and not isinstance(sampler, Builder)
        assert sampler.builder.exact_build == (kind == "knn_graph")


@pytest.mark.parametrize("normalize", [True, False])
def test_a_refresh_reads_the_bank_in_place_and_normalises_once(normalize):
    """The bank's table is read without a copy, as torch on its device; the build gets unit
    rows (a new tensor) or, pipelined, a snapshot that later updates leave alone."""
    bank = hb.EmbeddingBank(LIVE_N, LIVE_D, seed=3)
    bank.embeddings.mul_(3.0)
    pol = hb.KNNBatchSampler(bank, LIVE_B, refresh_every=4, normalize=normalize).refresh_policy
    live = pol.read(copy=False)
    assert isinstance(live, torch.Tensor) and live.device == bank.embeddings.device
    if normalize:
        torch.testing.assert_close(live.norm(dim=1), torch.ones(LIVE_N))
        assert live.data_ptr() != bank.embeddings.data_ptr()
    else:
        assert live.data_ptr() == bank.embeddings.data_ptr()  # no copy at all
    snapshot = pol.read(copy=True)
    before = snapshot.clone()
    bank.update(torch.arange(5), torch.zeros(5, LIVE_D))
    assert torch.equal(snapshot, before)


def test_the_one_row_normaliser():
    from hardbatch._validation import as_embeddings
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32) * 1e3
    got = as_embeddings(x, normalize=True)
    assert np.array_equal(got, torch.nn.functional.normalize(torch.from_numpy(x), dim=1).numpy())


# -- step schedule: counted over the run ---------------------------------------------------------

def test_resume_at_epoch_boundary_keeps_graph(emb):
    # refresh_every larger than an epoch: the graph built in epoch 0 is reused in epoch 1.
    ref = hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=1000, seed=5)
    reference = [list(ref), list(ref)]
    assert ref.refreshes == 1
    s = hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=1000, seed=5)
    assert list(s) == reference[0]
    state = s.state_dict()
    fresh = hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=1000, seed=5)
    fresh.load_state_dict(state)
    assert list(fresh) == reference[1]
    assert fresh.refreshes == 0


def test_refresh_reads_bank_every_t_steps(emb):
    bank = hb.EmbeddingBank(N, 16, seed=0)
    s = hb.ProximityGraphSampler(bank, B, 200, 20, refresh_every=4)
    graphs = []
    for step, batch in enumerate(s):
        if step % 4 == 0:
            graphs.append(s.graph.clone())
        bank.update(batch, torch.from_numpy(emb[batch]))
    assert s.refreshes == math.ceil(len(s) / 4)
    # after the bank holds the real embeddings, the graph follows them
    x = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sims_first = np.einsum("nd,nkd->nk", x, x[graphs[0].numpy()]).mean()
    sims_last = np.einsum("nd,nkd->nk", x, x[graphs[-1].numpy()]).mean()
    assert sims_last > sims_first + 0.1


def test_refresh_counts_steps_across_epochs(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=10)  # 16 steps per epoch
    for _ in range(3):
        list(s)
    assert s.refreshes == math.ceil(3 * 16 / 10)
    once = hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=None)
    list(once), list(once)
    assert once.refreshes == 1


def test_callable_source_called_once_at_construction_then_per_refresh(emb):
    calls = []

    def encode():
        calls.append(1)
        return torch.from_numpy(emb)

    s = hb.ProximityGraphSampler(encode, B, 200, 20, refresh_every=8)
    assert len(calls) == 1 and len(s) == math.ceil(N / B)
    list(s)
    assert len(calls) == 2  # the first build reused the construction call; one refresh at step 8


def test_source_that_turns_nan_is_reported():
    bank = hb.EmbeddingBank(N, 16)
    s = hb.ProximityGraphSampler(bank, B, 200, 20, refresh_every=2)
    it = iter(s)
    next(it)
    with pytest.raises(ValueError, match="NaN or inf"):
        bank.update([0], torch.full((1, 16), float("nan")))
    bank.embeddings[3, 0] = float("inf")
    next(it)
    with pytest.raises(ValueError, match="NaN or inf"):
        next(it)


# -- pipelined and background builds of graphs ---------------------------------------------------

@pytest.mark.parametrize("graph", ["proximity", "knn"])
def test_background_equals_synchronous_pipelined_refresh(base, graph):
    sync = run(live_graph(False, 2, graph), base)
    bg_sampler = live_graph(True, 2, graph)
    bg = run(bg_sampler, base)
    assert bg == sync
    assert bg_sampler.refreshes == 12  # steps 0, 4, ..., 44 (step 48's graph would be used at 50)
    assert run(live_graph(False, 0, graph), base) != sync  # the lag changes which graph is used


def test_pipelined_refresh_uses_the_snapshot_of_the_refresh_step(base):
    sampler = live_graph(False, 3)
    built = {}
    original = sampler.builder.build

    def spy(x, global_step, group):
        built[global_step] = x.clone()
        return original(x, global_step, group)

    sampler.builder.build = spy
    bank = sampler.source
    for step, _ in enumerate(run(sampler, base, epochs=1, stop_after=9)):
        pass
    # The graph for step 4 was built from the bank as it stood when batch 4 was requested.
    assert sorted(built) == [0, 4, 8]
    assert sampler.refresh_policy.key == 4  # step 8's graph comes into use at step 11
    assert bank.step == 9


def test_background_build_runs_in_a_worker_thread(base):
    sampler = live_graph(True, 1)
    threads = []
    original = sampler.builder.build

    def spy(x, step, group):
        threads.append(threading.current_thread().name)
        return original(x, step, group)

    sampler.builder.build = spy
    run(sampler, base, epochs=1)
    assert threads[0] == threading.current_thread().name  # step 0: nothing to overlap with
    assert all(name.startswith("hardbatch-refresh") for name in threads[1:]) and len(threads) > 3


def test_background_resume_with_a_pending_build(base):
    full = run(live_graph(True, 3), base, epochs=2)
    first = live_graph(True, 3)
    head = run(first, base, epochs=2, stop_after=30)  # step 29: step 28's build is pending
    assert first.refresh_policy.next_key == 28
    state = first.state_dict()
    assert "next" in state["generator"]
    second = live_graph(True, 3)
    second.source.load_state_dict(first.source.state_dict())
    second.load_state_dict(state)
    assert head + finish_epoch(second, base, 30) == full


@pytest.mark.parametrize("factory,match", [
    (lambda bank: ProximityGraphSampler(bank, LIVE_B, 100, 10, refresh_every=4, background=True,
                                        refresh_lag=0), "background=True needs refresh_lag >= 1"),
    (lambda bank: ProximityGraphSampler(bank, LIVE_B, 100, 10, refresh_every=4, refresh_lag=4),
     "refresh_lag=4 must be smaller than refresh_every=4"),
    (lambda bank: ProximityGraphSampler(bank, LIVE_B, 100, 10, refresh_every=4, refresh_lag=-1),
     "refresh_lag=-1 must be >= 0"),
    (lambda bank: hb.GCBSSampler(bank, LIVE_B, background=True, refresh_lag=0),
     "background=True needs refresh_lag >= 1"),
    (lambda bank: hb.GCBSSampler(bank, LIVE_B, refresh_lag=26),
     "refresh_lag=26 must be at most the 25 steps"),
    (lambda bank: hb.GCBSSampler(bank, LIVE_B, refresh_lag=-2), "refresh_lag=-2 must be >= 0"),
])
def test_bad_pipelining_options(factory, match):
    with pytest.raises(ValueError, match=match):
        factory(hb.EmbeddingBank(LIVE_N, LIVE_D))


# -- GCBS: pipelined / background epochs -------------------------------------------------------

def test_gcbs_background_equals_synchronous_pipelined_epochs(base):
    sync = run(live_gcbs(False, 5), base, epochs=3)
    assert run(live_gcbs(True, 5), base, epochs=3) == sync
    assert run(live_gcbs(False, 0), base, epochs=3) != sync  # the lag changes the snapshot
    steps = -(-LIVE_N // LIVE_B)
    for epoch in range(3):  # every epoch still partitions the items
        items = sorted(i for b in sync[epoch * steps:(epoch + 1) * steps] for i in b)
        assert items == list(range(LIVE_N))


def test_gcbs_next_is_built_from_the_snapshot_lag_steps_before_the_end(base):
    sampler = live_gcbs(True, 4)
    snapshots, builders = [], {}
    policy_ = sampler.refresh_policy
    read, build = policy_.read, sampler.builder.build

    def spy_read(copy, **kw):
        snapshots.append((sampler.source.step, copy))
        return read(copy, **kw)

    def spy_build(xy, epoch, group):
        builders[epoch] = threading.current_thread().name
        return build(xy, epoch, group)

    policy_.read, sampler.builder.build = spy_read, spy_build
    run(sampler, base, epochs=2)
    # epoch 2's order (not iterated) is built by now: a checkpoint waits for it
    assert sampler.state_dict()["generator"]["next_epoch"] == 2
    steps = len(sampler)  # 25; the bank counts one update per step
    assert snapshots == [(0, False), (steps - 4, True), (2 * steps - 4, True)]
    assert builders[0] == threading.current_thread().name  # the first epoch: at its start
    assert all(builders[e].startswith("hardbatch-refresh") for e in (1, 2))


def test_gcbs_resume_between_epochs_keeps_the_pipelined_order(base):
    full = run(live_gcbs(True, 6), base, epochs=2)
    first = live_gcbs(True, 6)
    head = run(first, base, epochs=1)
    state = first.state_dict()  # between epochs: epoch 1's order is built, not yet used
    assert state["generator"]["next_epoch"] == 1
    second = live_gcbs(False, 6)
    second.source.load_state_dict(first.source.state_dict())
    second.load_state_dict(state)
    assert head + finish_epoch(second, base, len(head)) == full


def test_gcbs_sampler_with_an_order_building_in_the_background_pickles(base):
    sampler = live_gcbs(True, 3)
    it = iter(sampler)
    for _ in range(len(sampler) - 2):  # past the snapshot: epoch 1's order is being built
        next(it)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.refresh_policy.next_key == 1
    want, got = sampler.state_dict()["generator"], copy.state_dict()["generator"]
    assert got["next_epoch"] == 1 and torch.equal(got["next_order"], want["next_order"])


EXACT = {"proximity": {"neighbors": 5, "candidates": 50, "graph": "knn"},
         "knn": {"method": "exact"}, "gcbs": {"method": "exact"}, "cluster": {}, "community": {}}


@pytest.mark.parametrize("name", list(EXACT))
def test_cheaper_build_advice_names_options_the_sampler_accepts(name):
    """The rebuild-cost warning quotes ``builder.cheaper_build``: every ``option=value`` it
    advises (the first one per option; "instead of the exact graph='knn'" names the current
    setting) is accepted by that sampler's constructor, gives full batches and changes the
    build: the new builder does not give the same advice again."""
    import re

    from hardbatch import registry

    x = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    advice = registry.make_sampler(name, x, 8, **EXACT[name]).refresh_policy.builder.cheaper_build
    options = {}
    for key, value in re.findall(r"(\w+)=('[^']*'|\w+\([^)]*\)|\d+)", advice):
        options.setdefault(key, eval(value, {"CommunityCells": hb.CommunityCells}))
    assert options, f"{name}: no option=value in the advice {advice!r}"
    followed = registry.make_sampler(name, x, 8, **{**EXACT[name], **options})
    batches = list(followed)
    assert len(batches) == 50 and all(len(b) == 8 for b in batches)
    assert followed.refresh_policy.builder.cheaper_build != advice


def cost_warning(sampler) -> str:
    """The rebuild-cost warning of ``sampler`` after two slow builds (1 s per step) and no
    training time between them."""
    from hardbatch.samplers.refresh import RefreshCostWarning

    policy = sampler.refresh_policy
    with pytest.warns(RefreshCostWarning) as caught:
        policy._watch_cost(policy.every * 1.0, True)
        policy._watch_cost(policy.every * 1.0, True)
    return str(caught[0].message)


def test_cost_warning_advises_only_what_the_sampler_takes():
    """KNNBatchSampler has no ``background=``: its warning does not advise it; a sampler
    already on the cheaper build is not told to use it; the exact builds are."""
    x = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    knn = cost_warning(hb.KNNBatchSampler(x, 8, refresh_every=10, method="exact"))
    assert "method='faiss-ivf'" in knn and "background" not in knn
    with pytest.raises(TypeError, match="background"):
        hb.KNNBatchSampler(x, 8, refresh_every=10, background=True)
    exact = cost_warning(hb.ProximityGraphSampler(x, 8, neighbors=5, candidates=50,
                                                  graph="knn", refresh_every=10))
    assert "use graph='proximity'" in exact and "background=True" in exact
    approx = cost_warning(hb.ProximityGraphSampler(x, 8, neighbors=5, candidates=50,
                                                   graph="proximity", refresh_every=10))
    assert "graph='proximity'" not in approx and "raise refresh_every" in approx
