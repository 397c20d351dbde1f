"""The sampler contract, for every sampler configuration (each walk, both graphs, kNN, GCBS):
epoch length, determinism, resume, DataLoader, ranks, checkpoints, pickling, prefetch."""

import itertools
import math
import pickle

import pytest
import torch
from sampler_support import B, KINDS, N, PARTITIONS, PREFETCH_KINDS, make, make_ranked
from torch.utils.data import DataLoader, TensorDataset

import hardbatch as hb


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
def test_a_framework_that_rebuilds_the_sampler_around_its_own_gets_a_clear_error(kind, emb):
    """PyTorch Lightning under DDP (use_distributed_sampler=True, its default) rebuilds a batch
    sampler as type(bs)(DistributedSampler, batch_size=..., drop_last=...); before, a uniform
    sampler then planned over the DistributedSampler's N / W items, others failed obscurely."""
    update = pytest.importorskip("lightning.pytorch.utilities.data")._update_dataloader
    ds = TensorDataset(torch.arange(N), torch.from_numpy(emb))
    loader = DataLoader(ds, batch_sampler=make(kind, emb))
    with pytest.raises(ValueError, match=r"is a DistributedSampler \(a torch Sampler\), not "
                                         r"the items.*Trainer\(use_distributed_sampler=False\)"):
        update(loader, torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=0))


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


# -- resume ------------------------------------------------------------------------------------

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


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cut", [0, 3])
def test_a_state_saved_right_after_a_load_resumes_the_same_place(kind, emb, cut):
    """A job preempted again before its first batch after a restart: the state saved then held
    step 0 and no pending batches, so the next resume replayed the epoch from its start."""
    ref_sampler = make(kind, emb, seed=1)
    reference = list(ref_sampler) + list(ref_sampler)
    s = make(kind, emb, seed=1)
    it = iter(s)
    head = [next(it) for _ in range(cut)]
    loaded = make(kind, emb, seed=1)
    loaded.load_state_dict(s.state_dict())
    again = loaded.state_dict()  # nothing iterated since the load
    assert again["step"] == cut and again["epoch"] == 0
    assert loaded.state_dict(consumed=cut)["step"] == cut
    with pytest.raises(ValueError, match=rf"consumed={cut + 1}: this sampler resumed at step "
                                         rf"{cut} of epoch 0 and has yielded nothing since"):
        loaded.state_dict(consumed=cut + 1)
    third = make(kind, emb, seed=1)
    third.load_state_dict(again)
    assert head + list(third) == reference[:len(s)]
    assert list(third) == reference[len(s):]
    assert list(loaded)[0] == reference[cut]  # the loaded sampler itself resumes as before
    assert loaded.state_dict()["step"] == 0 and loaded.epoch == 1  # then counts afresh


@pytest.mark.parametrize("kind", KINDS)
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


@pytest.mark.parametrize("kind", KINDS)
def test_pickled_mid_epoch_resumes_identically(kind, emb):
    reference = list(make(kind, emb, seed=4))
    s = make(kind, emb, seed=4)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    copy = pickle.loads(pickle.dumps(s))
    fresh = make(kind, emb, seed=4)
    fresh.load_state_dict(copy.state_dict())
    assert head + list(fresh) == reference
    assert list(it) == reference[5:]  # the original iterates on, unaffected


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_mismatch_rejected(kind, emb):
    state = make(kind, emb).state_dict()
    other = make(kind, emb, batch_size=32)
    with pytest.raises(ValueError, match="batch_size=64 but this sampler has batch_size=32"):
        other.load_state_dict(state)


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


# -- ranks -------------------------------------------------------------------------------------

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


def test_distributed_defaults_from_torch_distributed(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 4)
    s = hb.UniformBatchSampler(N, B)
    assert (s.rank, s.world_size) == (1, 4)
    assert len(s) == math.ceil(math.ceil(N / B) / 4)


@pytest.mark.parametrize("kind,prefetch", [(k, 0) for k in KINDS] + [("knn", 2), ("proximity", 3)])
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


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_of_another_format_is_refused_naming_what_is_missing(emb, kind):
    saver = make_ranked(kind, emb, 1, 2)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = saver.state_dict(consumed=2)
    old = {k: v for k, v in state.items() if k not in ("pending_plan", "integrity")}
    old["pending"] = state["pending_plan"][1::2]  # one rank's batches, no checksum
    with pytest.raises(ValueError, match="state is missing 'pending_plan'.*not a whole "
                                         "state_dict"):
        make_ranked(kind, emb, 1, 2).load_state_dict(old)


def test_damaged_pending_plan_rejected(emb):
    s = make_ranked("uniform", emb, 0, 2)
    it = iter(s)
    next(it), next(it)
    state = s.state_dict(consumed=1)
    state["pending_plan"] = state["pending_plan"][:1]
    with pytest.raises(ValueError, match="sampler state is corrupted"):  # its checksum (issue 34)
        make_ranked("uniform", emb, 1, 2).load_state_dict(state)
    from hardbatch._integrity import seal

    del state["integrity"]
    resealed = seal(state, "sampler state")  # a whole, sealed state: the plan is still checked
    with pytest.raises(ValueError, match="holds 1 batches, not whole steps of world_size=2"):
        make_ranked("uniform", emb, 1, 2).load_state_dict(resealed)


# -- the prefetch thread gives the same batches -----------------------------------------------

@pytest.mark.parametrize("kind", PREFETCH_KINDS)
def test_prefetch_gives_the_same_batches(kind, emb):
    plain = make(kind, emb, seed=6)
    planned = make(kind, emb, seed=6, prefetch=3)
    assert [list(planned), list(planned)] == [list(plain), list(plain)]
    assert planned.prefetcher.run.thread is None  # the thread ends with the epoch
