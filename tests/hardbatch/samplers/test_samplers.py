import itertools
import math

import numpy as np
import pytest
import torch
from support import unit_rows
from torch.utils.data import DataLoader, TensorDataset

import hardbatch as hb

N, B = 1000, 64


@pytest.fixture(scope="module")
def emb():
    return unit_rows(np.random.default_rng(0), N, 16)


def make(kind, emb, refresh_every=5, **kw):
    if kind == "uniform":
        return hb.UniformBatchSampler(N, B, **kw)
    if kind == "knn":
        return hb.KNNBatchSampler(emb, B, refresh_every=refresh_every, **kw)
    if kind == "proximity":
        return hb.ProximityGraphSampler(emb, B, candidates=200, neighbors=20,
                                        refresh_every=refresh_every, **kw)
    if kind == "proximity_decay":
        return hb.ProximityGraphSampler(emb, B, candidates=200, neighbors=20,
                                        refresh_every=refresh_every,
                                        restart=hb.LinearDecay(0.2, 0.05), epochs=3, **kw)
    if kind in ("bfs", "dfs", "rw"):
        return hb.ProximityGraphSampler(emb, B, candidates=200, neighbors=20, walk=kind, **kw)
    if kind == "knn_graph":
        return hb.ProximityGraphSampler(emb, B, neighbors=20, graph="knn", **kw)
    if kind == "gcbs":
        return hb.GCBSSampler(emb, B, quantile=0.99, **kw)
    raise AssertionError(kind)


KINDS = ["uniform", "knn", "proximity", "proximity_decay", "bfs", "dfs", "rw", "knn_graph", "gcbs"]
PARTITIONS = {"uniform", "gcbs"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_epoch_contract(kind, emb, drop_last):
    s = make(kind, emb, drop_last=drop_last)
    batches = list(s)
    expected = N // B if drop_last else math.ceil(N / B)
    assert len(s) == len(batches) == expected
    for i, batch in enumerate(batches):
        assert isinstance(batch, list) and all(isinstance(v, int) for v in batch)
        assert len(set(batch)) == len(batch)
        assert min(batch) >= 0 and max(batch) < N
        short_ok = kind in PARTITIONS and not drop_last and i == len(batches) - 1
        assert len(batch) == B or (short_ok and len(batch) == N % B)
    if kind in PARTITIONS:
        drawn = sorted(itertools.chain.from_iterable(batches))
        if drop_last:
            assert len(set(drawn)) == len(drawn) == N - N % B
        else:
            assert drawn == list(range(N))


@pytest.mark.parametrize("kind", KINDS)
def test_dataloader_integration(kind, emb):
    ds = TensorDataset(torch.arange(N), torch.from_numpy(emb))
    s = make(kind, emb)
    loader = DataLoader(ds, batch_sampler=s)
    first = next(iter(loader))
    assert first[0].shape[0] == B
    assert len(loader) == len(s)


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_and_epoch_dependent(kind, emb):
    a, b = make(kind, emb, seed=3), make(kind, emb, seed=3)
    ea, eb = list(a), list(b)
    assert ea == eb
    assert a.epoch == 1  # iteration advanced the epoch
    assert list(a) != ea  # epoch 1 differs from epoch 0
    b.set_epoch(1)
    a.set_epoch(1)
    assert list(a) == list(b)
    assert list(make(kind, emb, seed=4)) != ea


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cut", [0, 3, 9])
def test_resume_mid_epoch_yields_exactly_the_rest(kind, emb, cut):
    ref_sampler = make(kind, emb, seed=1)
    reference = list(ref_sampler) + list(ref_sampler)  # two epochs uninterrupted
    s = make(kind, emb, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(cut)]
    state = s.state_dict()
    fresh = make(kind, emb, seed=1)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert head + rest == reference[:len(s)]
    assert list(fresh) == reference[len(s):]  # the following epoch continues identically


@pytest.mark.parametrize("kind", ["proximity", "gcbs", "uniform"])
def test_resume_with_prefetching_loader(kind, emb):
    # A loader that ran 4 batches ahead: state_dict(consumed=...) rewinds to what was trained.
    reference = list(make(kind, emb, seed=2))
    s = make(kind, emb, seed=2)
    it = iter(s)
    for _ in range(7):
        next(it)
    state = s.state_dict(consumed=3)
    fresh = make(kind, emb, seed=2)
    fresh.load_state_dict(state)
    assert list(fresh) == reference[3:]
    with pytest.raises(ValueError, match="consumed=8 must be between"):
        s.state_dict(consumed=8)


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


def test_state_dict_mismatch_rejected(emb):
    state = make("proximity", emb).state_dict()
    other = hb.ProximityGraphSampler(emb, 32, 200, 20)
    with pytest.raises(ValueError, match="batch_size=64 but this sampler has batch_size=32"):
        other.load_state_dict(state)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_distributed_ranks_share_plan_and_take_disjoint_batches(kind, emb, world_size):
    # refresh_every counts each rank's steps, so compare with graphs built once
    single = list(make(kind, emb, refresh_every=None, seed=7, rank=0, world_size=1))
    per_rank = [list(make(kind, emb, refresh_every=None, seed=7, rank=r, world_size=world_size))
                for r in range(world_size)]
    steps = math.ceil(math.ceil(N / B) / world_size)
    assert all(len(p) == steps for p in per_rank)
    interleaved = [per_rank[r][s] for s in range(steps) for r in range(world_size)]
    # the first ceil(N/B) plan batches are the single-process plan, in order
    assert interleaved[:len(single)] == single
    for s in range(steps):
        assert len({tuple(p[s]) for p in per_rank}) == world_size  # distinct batches per step


def test_distributed_defaults_from_torch_distributed(emb, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    s = hb.UniformBatchSampler(N, B)
    assert (s.rank, s.world_size) == (1, 4)
    assert len(s) == math.ceil(math.ceil(N / B) / 4)


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


def test_linear_decay_schedule_progress(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=hb.LinearDecay(0.2, 0.05), epochs=2)
    assert s._restart_at(0, 0) == pytest.approx(0.2)
    assert s._restart_at(1, 0) == pytest.approx(0.125)
    assert s._restart_at(1, len(s)) == pytest.approx(0.05)
    sched = hb.LinearDecay(0.2, 0.05, total_steps=10)
    s2 = hb.ProximityGraphSampler(emb, B, 200, 20, restart=sched)
    assert s2._restart_at(0, 5) == pytest.approx(0.125)
    with pytest.raises(ValueError, match="pass epochs=.* or total_steps"):
        hb.ProximityGraphSampler(emb, B, 200, 20, restart=hb.LinearDecay())
    with pytest.raises(ValueError, match="start=1.5 must lie in"):
        hb.LinearDecay(1.5, 0.1)


def test_coverage_and_fresh_starts(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=0.2)
    seen = set()
    for batch in s:
        if len(seen) < N:
            assert batch[0] not in seen  # start node drawn from unseen items
        seen.update(batch)
        assert s.coverage == pytest.approx(len(seen) / N)


def test_knn_sampler_is_anchor_plus_nearest(emb):
    s = hb.KNNBatchSampler(emb, 32)
    x = emb.astype(np.float64)
    for batch in itertools.islice(s, 5):
        sims = x @ x[batch[0]]
        sims[batch[0]] = -np.inf
        assert set(batch[1:]) == set(np.argsort(-sims)[:31].tolist())


def test_gcbs_sampler_batches_follow_permutation(emb):
    s = hb.GCBSSampler(emb, B, quantile=0.99, seed=0)
    batches = list(s)
    perm = hb.gcbs_permutation(emb, 0.99, seed=hb._rng.derive_seed(0, 0) & 0x7FFFFFFF)
    assert list(itertools.chain.from_iterable(batches)) == perm.tolist()
    shuffled = hb.GCBSSampler(emb, B, quantile=0.99, seed=0, shuffle_batches=True)
    assert sorted(map(tuple, list(shuffled))) == sorted(map(tuple, batches))


def test_gcbs_sampler_paired_source(emb):
    y = emb + 0.05 * unit_rows(np.random.default_rng(9), N, 16)
    s = hb.GCBSSampler(emb, B, quantile=0.99, paired=y)
    assert sorted(itertools.chain.from_iterable(s)) == list(range(N))
    with pytest.raises(ValueError, match="paired has 10 rows but embeddings has N=1000"):
        hb.GCBSSampler(emb, B, paired=y[:10])


@pytest.mark.parametrize("factory,match", [
    (lambda e: hb.UniformBatchSampler(10, 11), "batch_size=11 is larger than the number of items N=10"),
    (lambda e: hb.UniformBatchSampler([], 1), "has no items"),
    (lambda e: hb.UniformBatchSampler(10, 0), "batch_size=0 must be >= 1"),
    (lambda e: hb.UniformBatchSampler(10, 2, rank=2, world_size=2), "rank=2 must be smaller"),
    (lambda e: hb.ProximityGraphSampler(e, B, candidates=100, neighbors=100), "neighbors=100 must be smaller than candidates=100"),
    (lambda e: hb.ProximityGraphSampler(e, B, candidates=N, neighbors=10), "candidates=1000 must be smaller than the number of items N=1000"),
    (lambda e: hb.ProximityGraphSampler(e, N + 1), "batch_size=1001 is larger"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, walk="levy"), "walk='levy' must be one of"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, graph="hnsw"), "graph='hnsw' must be"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=-0.1), "restart=-0.1 must lie in"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, refresh_every=0), "refresh_every=0 must be >= 1"),
    (lambda e: hb.KNNBatchSampler(e, N), "must be smaller than N"),
    (lambda e: hb.GCBSSampler(e, B, quantile=1.0), "quantile=1.0 must lie strictly between"),
    (lambda e: hb.GCBSSampler(e, B, method="annoy"), "method='annoy'"),
    (lambda e: hb.ProximityGraphSampler(np.full((20, 3), np.nan), 4, 10, 5), "NaN or inf"),
    (lambda e: hb.ProximityGraphSampler(e[0], 4, 10, 5), "2-D"),
    (lambda e: hb.GCBSSampler(np.zeros((0, 3)), 4), "empty"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=1.0),
     r"restart=1.0 must lie in \[0, 1\).*KNNBatchSampler"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=1),
     r"restart=1.0 must lie in \[0, 1\)"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=True),
     "restart must be a number in \\[0, 1\\) or a schedule"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart="0.2"), "restart must be a number"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=hb.LinearDecay(1.0, 0.05), epochs=2),
     r"LinearDecay\(...\) start=1.0 must lie in \[0, 1\).*KNNBatchSampler"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=hb.LinearDecay(0.2, 1.0), epochs=2),
     r"LinearDecay\(...\) end=1.0 must lie in \[0, 1\)"),
    (lambda e: hb.LinearDecay(total_steps=True), "LinearDecay total_steps must be a positive"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, group_size=10**6),
     "group_size=1000000 must be <= 800"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, group_size=0), "group_size=0 must be >= 1"),
    (lambda e: hb.ProximityGraphSampler(e[:50], 16, 1000, 60),
     "candidates=1000 must be smaller than the number of items N=50; lower neighbors below "
     "N - 1 = 49"),
    (lambda e: hb.UniformBatchSampler(10, 4, drop_last=True, rank=0, world_size=4),
     "drop_last=True leaves 2 full batch\\(es\\) of batch_size=4 for world_size=4 ranks.*"
     "batch_size <= N // world_size = 2"),
    (lambda e: hb.ProximityGraphSampler(e, 300, 200, 20, drop_last=True, world_size=4, rank=0),
     "drop_last=True leaves 3 full batch"),
    (lambda e: hb.GCBSSampler(e, B, nlist=-1, method="ivf"), "nlist=-1 must be >= 1"),
    (lambda e: hb.GCBSSampler(e, B, nlist=2.5, method="ivf"), "nlist must be an integer"),
    (lambda e: hb.GCBSSampler(e, B, nprobe=0, method="ivf"), "nprobe=0 must be >= 1"),
])
def test_bad_input_raises_clear_errors(emb, factory, match):
    with pytest.raises(ValueError, match=match):
        factory(emb)


def test_source_that_turns_nan_is_reported(emb):
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


def test_embedding_bank(emb):
    bank = hb.EmbeddingBank(10, 4, seed=1)
    assert bank.filled == 0.0 and (bank.staleness() == -1).all()
    bank.update([1, 2], torch.ones(2, 4))
    bank.update(torch.tensor([2]), torch.zeros(1, 4))
    assert bank.filled == 0.2
    assert bank.staleness()[1] == 2 and bank.staleness()[2] == 1 and bank.staleness()[0] == -1
    assert torch.equal(bank.embeddings[2], torch.zeros(4))
    other = hb.EmbeddingBank(10, 4, seed=2)
    other.load_state_dict(bank.state_dict())
    assert torch.equal(other.embeddings, bank.embeddings) and other.step == 2
    with pytest.raises(ValueError, match="shape \\[b, 4\\]"):
        bank.update([1], torch.ones(1, 5))
    with pytest.raises(ValueError, match="one index per row"):
        bank.update([1, 2, 3], torch.ones(2, 4))
    with pytest.raises(ValueError, match="indices must lie in"):
        bank.update([10], torch.ones(1, 4))


# -- restart: numbers of any kind, never 1 ----------------------------------------------------

@pytest.mark.parametrize("alpha", [np.float32(0.3), np.float64(0.3), torch.tensor(0.3),
                                   np.array(0.3, np.float32), 0])
def test_restart_accepts_real_scalars(emb, alpha):
    ref = hb.ProximityGraphSampler(emb, B, 200, 20, restart=float(alpha), seed=6)
    got = hb.ProximityGraphSampler(emb, B, 200, 20, restart=alpha, seed=6)
    assert list(itertools.islice(got, 4)) == list(itertools.islice(ref, 4))


def test_restart_schedule_reaching_one_is_reported_when_used(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=lambda p: 0.5 + p, epochs=1)
    with pytest.raises(ValueError, match=r"restart \(schedule value at progress 0.5\)=1.0 must "
                                         r"lie in \[0, 1\)"):
        list(s)  # progress 0, 1/16, ..., 8/16 = 0.5 reaches alpha = 1


@pytest.mark.parametrize("n,k", [(50, 10), (50, 40), (30, 28), (1000, 20)])
def test_candidates_hint_is_a_valid_value(emb, n, k):
    with pytest.raises(ValueError, match="lower candidates") as err:
        hb.ProximityGraphSampler(emb[:n], 8, n, k)
    suggested = int(str(err.value).split("(e.g. ")[1].rstrip(")"))
    assert k < suggested < n
    hb.ProximityGraphSampler(emb[:n], 8, suggested, k)  # accepted


# -- KNN snapshot: a copy taken at the refresh step ---------------------------------------------

def test_knn_snapshot_does_not_follow_the_bank_between_refreshes(emb):
    bank = hb.EmbeddingBank(N, 16, seed=4)
    s = hb.KNNBatchSampler(bank, 32, refresh_every=4, normalize=False, seed=2)
    gen = np.random.default_rng(8)
    snapshot = None
    for step, batch in enumerate(itertools.islice(s, 10)):
        if step % 4 == 0:  # the batch of a refresh step is drawn from the bank as it is now
            snapshot = bank.embeddings.numpy().astype(np.float64).copy()
        sims = snapshot @ snapshot[batch[0]]
        sims[batch[0]] = -np.inf
        assert set(batch[1:]) == set(np.argsort(-sims)[:31].tolist()), step
        bank.update(torch.arange(N), torch.from_numpy(gen.standard_normal((N, 16))).float())


# -- checkpoints: any rank's state resumes every rank --------------------------------------------

def make_ranked(kind, emb, rank, world_size, prefetch=0):
    if kind == "uniform":
        return hb.UniformBatchSampler(N, B, seed=3, rank=rank, world_size=world_size)
    if kind == "gcbs":
        return hb.GCBSSampler(emb, B, quantile=0.99, seed=3, rank=rank, world_size=world_size)
    if kind == "knn":
        return hb.KNNBatchSampler(emb, B, refresh_every=3, seed=3, rank=rank,
                                  world_size=world_size, prefetch=prefetch)
    return hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=3, seed=3, rank=rank,
                                    world_size=world_size, prefetch=prefetch)


@pytest.mark.parametrize("kind,prefetch", [("uniform", 0), ("gcbs", 0), ("knn", 2),
                                           ("proximity", 0), ("proximity", 3)])
def test_state_of_one_rank_resumes_every_rank(emb, kind, prefetch):
    world = 3
    reference = [list(make_ranked(kind, emb, r, world)) for r in range(world)]
    saver = make_ranked(kind, emb, 0, world, prefetch)
    it = iter(saver)
    for _ in range(4):
        next(it)
    state = saver.state_dict(consumed=2)  # a loader 2 batches ahead (+ planned, with prefetch)
    assert state["rank"] == 0
    for r in range(world):
        fresh = make_ranked(kind, emb, r, world)
        fresh.load_state_dict(state)
        assert list(fresh) == reference[r][2:], r


def legacy(state, rank, world):
    """The state as hardbatch wrote it before pending batches were kept for every rank."""
    old = {k: v for k, v in state.items() if k not in ("pending_plan", "rank", "drop_last",
                                                        "refresh_every")}
    old["pending"] = state["pending_plan"][rank::world]
    return old


def test_legacy_state_with_this_ranks_batches_still_resumes(emb):
    world = 2
    reference = list(make_ranked("proximity", emb, 1, world))
    saver = make_ranked("proximity", emb, 1, world)
    it = iter(saver)
    for _ in range(5):
        next(it)
    old = legacy(saver.state_dict(consumed=2), 1, world)
    fresh = make_ranked("proximity", emb, 1, world)
    fresh.load_state_dict(old)
    it = iter(fresh)
    assert next(it) == reference[2]  # replaying the legacy pending batches
    # a state taken while replaying holds rank 1's batches only: it records the rank
    again = fresh.state_dict(consumed=2)
    assert "pending_plan" not in again and again["rank"] == 1
    with pytest.raises(ValueError, match="pending batches of rank 1 only but this sampler has "
                                         "rank=0"):
        make_ranked("proximity", emb, 0, world).load_state_dict(again)
    same = make_ranked("proximity", emb, 1, world)
    same.load_state_dict(again)
    assert list(same) == reference[2:]
    assert [next(it) for _ in range(len(reference) - 3)] == reference[3:]


@pytest.mark.parametrize("other,match", [
    (dict(drop_last=True), "saved with drop_last=False but this sampler has drop_last=True"),
    (dict(refresh_every=4), "saved with refresh_every=5 but this sampler has refresh_every=4"),
])
def test_state_settings_that_change_the_plan_must_match(emb, other, match):
    s = make("proximity", emb)
    it = iter(s)
    next(it)
    state = s.state_dict()
    kw = dict(refresh_every=5)
    kw.update(other)
    with pytest.raises(ValueError, match=match):
        make("proximity", emb, **kw).load_state_dict(state)


def test_damaged_pending_plan_rejected(emb):
    s = make_ranked("uniform", emb, 0, 2)
    it = iter(s)
    next(it), next(it)
    state = s.state_dict(consumed=1)
    state["pending_plan"] = state["pending_plan"][:1]
    with pytest.raises(ValueError, match="holds 1 batches, not whole steps of world_size=2"):
        make_ranked("uniform", emb, 1, 2).load_state_dict(state)


# -- planner threads: one per iteration --------------------------------------------------------

def test_a_new_iteration_is_not_stopped_by_an_abandoned_one(emb):
    import gc

    reference = list(make("proximity", emb, seed=3))
    s = make("proximity", emb, seed=3, prefetch=2)
    first = iter(s)
    head = [next(first) for _ in range(3)]
    assert head == reference[:3]
    second = iter(s)  # e.g. iter(loader) again: a new epoch-0 iteration
    assert next(second) == reference[0]
    with pytest.raises(RuntimeError, match="superseded by a newer iteration"):
        next(first)  # its planner was stopped when the new iteration began
    del first
    gc.collect()  # the abandoned generator's cleanup must leave the new planner running
    rest = list(second)
    assert [reference[0]] + rest == reference
    assert s._run.thread is None


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


# -- GCBS: source size, dropped items ------------------------------------------------------------

def test_gcbs_source_that_changes_size_is_reported(emb):
    calls = []

    def source():
        calls.append(1)
        return emb if len(calls) == 1 else emb[:900]

    s = hb.GCBSSampler(source, B, quantile=0.99)
    list(s)
    with pytest.raises(ValueError, match="embedding source now has 900 items, the sampler was "
                                         "built for 1000"):
        list(s)
    paired = hb.GCBSSampler(emb, B, quantile=0.99, paired=lambda: emb[:900])
    with pytest.raises(ValueError, match="paired source now has 900 items"):
        list(paired)


def test_gcbs_drop_last_drops_random_items_not_always_the_tail(emb):
    from hardbatch.gcbs import similarity_threshold, thresholded_pairs

    s = hb.GCBSSampler(emb, B, quantile=0.99, drop_last=True, seed=0)
    dropped = np.zeros(N, int)
    for epoch in range(12):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == N // B and all(len(b) == B for b in batches)
        kept = [i for b in batches for i in b]
        assert len(set(kept)) == len(kept) == N - N % B
        # the kept items follow the epoch's GCBS order, minus N mod B of its positions
        perm = hb.gcbs_permutation(emb, 0.99, seed=hb._rng.derive_seed(0, epoch) & 0x7FFFFFFF)
        assert [i for i in perm.tolist() if i in set(kept)] == kept
        missing = np.setdiff1d(np.arange(N), kept)
        dropped[missing] += 1
        if epoch == 0:
            first_missing = set(missing.tolist())
    x = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    rows, cols = thresholded_pairs(x, x, similarity_threshold(x, x, 0.99))
    degree = np.bincount(np.concatenate([rows, cols]), minlength=N)
    assert (dropped[degree > 0] > 0).sum() > 100  # not only isolated items (the order's tail)
    assert dropped.max() <= 4  # spread out: 12 * 40 drops over 1000 items
    assert set(np.flatnonzero(dropped).tolist()) != first_missing


def test_gcbs_drop_last_without_a_remainder_cuts_the_order(emb):
    x = emb[:960]  # 960 = 15 * 64: nothing to drop
    batches = list(hb.GCBSSampler(x, B, quantile=0.99, drop_last=True, seed=0))
    perm = hb.gcbs_permutation(x, 0.99, seed=hb._rng.derive_seed(0, 0) & 0x7FFFFFFF)
    assert list(itertools.chain.from_iterable(batches)) == perm.tolist()
