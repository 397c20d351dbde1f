"""SingleSourceBatchSampler: each batch from one source, sources drawn by size, temperature or
weights, any sampler inside; sentence-transformers' multi-dataset call; resume (issue 31); the
rank split, resume after the epoch was yielded, and states checked against the schedule."""

import io

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, ConcatDataset, DataLoader, SequentialSampler

import hardbatch as hb
from hardbatch.samplers.single_source_sampler import (
    SingleSourceBatchSampler,
    single_source_batch_sampler,
    source_weights,
)

SIZES = [120, 40, 17]


def source_of(batch, sizes=SIZES):
    ends = np.cumsum(sizes)
    owners = {int(np.searchsorted(ends, i, side="right")) for i in batch}
    assert len(owners) == 1, batch  # never two sources in one batch
    return owners.pop()


def test_proportional_runs_every_source_once_per_epoch():
    s = SingleSourceBatchSampler(sources=SIZES, batch_size=8, seed=3)
    assert len(s) == 15 + 5 + 3
    for epoch in range(2):
        batches = list(s)
        assert len(batches) == len(s) and s.epoch == epoch + 1
        drawn = sorted(itertools.chain.from_iterable(batches))
        assert drawn == list(range(sum(SIZES)))  # every item once (drop_last=False)
        counts = np.bincount([source_of(b) for b in batches], minlength=3)
        assert counts.tolist() == [15, 5, 3]
    s.set_epoch(0)
    first = list(s)
    assert first == list(SingleSourceBatchSampler(sources=SIZES, batch_size=8, seed=3))
    assert first != list(s)  # epoch 1 differs


@pytest.mark.parametrize("temperature", [2.0, 10.0])
def test_temperature_flattens_the_source_shares(temperature):
    s = SingleSourceBatchSampler(sources=SIZES, batch_size=8, temperature=temperature)
    batches = list(s)
    counts = np.bincount([source_of(b) for b in batches], minlength=3)
    p = np.array(SIZES, float) ** (1 / temperature)
    expected = p / p.sum() * len(s)
    assert counts.sum() == len(s) == 23 and np.all(np.abs(counts - expected) < 1)
    assert counts[2] > 3  # the small source is drawn more often than its size says


def test_explicit_weights_and_zero_weight_sources():
    s = SingleSourceBatchSampler(sources=SIZES, batch_size=8, weights=[1, 0, 3],
                                 num_batches=40)
    counts = np.bincount([source_of(b) for b in s], minlength=3)
    assert counts.tolist() == [10, 0, 30]  # the 17 items give 3 batches: cycled 10 times
    assert source_weights([5, 5], [1, 3]).tolist() == [0.25, 0.75]


def test_hard_samplers_inside_each_source():
    r = np.random.default_rng(0)
    tables = [r.standard_normal((n, 8)).astype(np.float32) for n in SIZES]

    def factory(i, n):
        assert n == SIZES[i]
        return hb.KNNBatchSampler(tables[i], 8, refresh_every=None, seed=i)

    s = SingleSourceBatchSampler(sources=SIZES, sampler=factory, temperature=2.0, seed=1)
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    for batch in s:
        i = source_of(batch)
        local = [k - offsets[i] for k in batch]
        x = tables[i] / np.linalg.norm(tables[i], axis=1, keepdims=True)
        sims = x @ x[local[0]]
        sims[local[0]] = -np.inf
        assert set(local[1:]) == set(np.argsort(-sims)[:7].tolist())  # the anchor's kNN


def test_sentence_transformers_call_and_a_dataloader():
    data = ConcatDataset([list(range(100, 130)), list(range(200, 210)), list(range(300, 307))])
    subs = [BatchSampler(SequentialSampler(d), 4, False) for d in data.datasets]
    make = single_source_batch_sampler(temperature=3.0)
    s = make(data, batch_samplers=subs, generator=torch.Generator(), seed=5)
    assert isinstance(s, SingleSourceBatchSampler) and s.batch_size == 4
    loader = DataLoader(data, batch_sampler=s)
    for values in loader:
        assert len({int(v) // 100 for v in values}) == 1  # one dataset per batch
    plain = SingleSourceBatchSampler(data, batch_samplers=subs, seed=5)  # the class itself
    assert len(plain) == 8 + 3 + 2


def resume_case(kind):
    if kind == "uniform":
        return {"batch_size": 8}
    if kind == "knn":
        r = np.random.default_rng(0)
        tables = [r.standard_normal((n, 8)).astype(np.float32) for n in SIZES]
        return {"sampler": lambda i, n: hb.KNNBatchSampler(tables[i], 8, refresh_every=2)}
    return {"batch_samplers": [BatchSampler(SequentialSampler(range(n)), 8, False)
                               for n in SIZES]}


@pytest.mark.parametrize("kind", ["uniform", "knn", "torch"])
@pytest.mark.parametrize("consumed", [0, 3, 11])
def test_resume_mid_epoch(kind, consumed, tmp_path):
    def build():
        return SingleSourceBatchSampler(sources=SIZES, temperature=2.0, seed=7,
                                        num_batches=30, **resume_case(kind))

    s = build()
    s.set_epoch(1)
    reference = list(s)
    s = build()
    s.set_epoch(1)
    it = iter(s)
    head = [next(it) for _ in range(consumed + 2)]  # a prefetching loader ran ahead
    torch.save(s.state_dict(consumed=consumed), tmp_path / "state.pt")
    fresh = build()
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert head[:consumed] + list(fresh) == reference
    assert fresh.epoch == 2


def reloaded(state):
    """``state`` through torch.save / torch.load(weights_only=True), as a checkpoint holds it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("kind", ["uniform", "knn", "torch"])
@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_resume_after_the_whole_epoch_was_yielded(kind, rank, world_size):
    """A prefetching loader took the whole epoch while the loop still trains it: every
    consumed=k resumes exactly the remaining batches, then the next epoch as uninterrupted."""
    def build():
        return SingleSourceBatchSampler(sources=SIZES, temperature=2.0, seed=7, num_batches=31,
                                        rank=rank, world_size=world_size, **resume_case(kind))

    s = build()
    s.set_epoch(1)
    reference, following = list(s), list(s)  # epochs 1 and 2, uninterrupted
    n = len(s)
    assert len(reference) == n == -(-31 // world_size)
    s = build()
    s.set_epoch(1)
    assert list(s) == reference and s.epoch == 2  # drained: the loader asked for every batch
    states = [reloaded(s.state_dict(consumed=k)) for k in range(n + 1)]
    assert states[n]["epoch"] == 2 and states[n]["step"] == 0  # that epoch done: the next one
    omitted = s.state_dict()  # all yielded: the next epoch's start, as consumed=len()
    assert (omitted["epoch"], omitted["step"]) == (2, 0)
    for k, state in enumerate(states):
        assert state["epoch"] == (1 if k < n else 2)
        fresh = build()
        fresh.load_state_dict(state)
        assert list(fresh) == (reference[k:] if k < n else following), k
        if k < n:
            assert fresh.epoch == 2 and list(fresh) == following  # the inner epochs line up
    with pytest.raises(ValueError, match=f"consumed={n + 1} must be between 0 and the {n} "
                                         "batches this rank's sampler yielded of epoch 1"):
        s.state_dict(consumed=n + 1)
    s.set_epoch(2)  # the loop's next epoch: consumed counts its steps, none yielded yet
    with pytest.raises(ValueError, match="consumed=1 must be between 0 and the 0 batches"):
        s.state_dict(consumed=1)


def test_state_bounds_mid_epoch_and_after_a_resume():
    def build():
        return SingleSourceBatchSampler(sources=SIZES, batch_size=8, seed=2)

    reference = list(build())
    s = build()
    it = iter(s)
    head = [next(it) for _ in range(5)]
    with pytest.raises(ValueError, match="consumed=6 must be between 0 and the 5 batches"):
        s.state_dict(consumed=6)
    fresh = build()
    fresh.load_state_dict(s.state_dict(consumed=3))
    again = build()  # a state saved before the resumed sampler iterated: the same point
    again.load_state_dict(reloaded(fresh.state_dict()))
    assert head[:3] + list(again) == reference
    it = iter(fresh)
    assert [next(it) for _ in range(4)] == reference[3:7]
    with pytest.raises(ValueError, match=r"consumed=2 must be between 3 \(where this epoch "
                                         r"was resumed\) and the 7 batches"):
        fresh.state_dict(consumed=2)
    later = build()
    later.load_state_dict(fresh.state_dict(consumed=5))
    assert reference[:5] + list(later) == reference


def expected_rank_batches(schedule, num_batches, world_size, drop_last, batch_size=8):
    """The documented rule, from the shared schedule of one rank: the steps cut to a multiple
    of W (tail dropped) or padded with the sources of the first steps; source i's k-th draw is
    batch k mod len of its sequential BatchSampler; rank r takes steps r, r + W, ..."""
    w = world_size
    total = (num_batches // w if drop_last else -(-num_batches // w)) * w
    steps = list(schedule[:min(total, num_batches)]) + list(schedule[:max(total - num_batches, 0)])
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    runs = [list(BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)) for n in SIZES]
    drawn = [0] * len(SIZES)
    plan = []
    for i in steps:
        plan.append([int(offsets[i]) + k for k in runs[i][drawn[i] % len(runs[i])]])
        drawn[i] += 1
    return [plan[r::w] for r in range(w)]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("mode", ["proportional", "temperature"])
def test_each_rank_takes_every_wth_step_of_one_schedule(world_size, drop_last, mode):
    kw = {"temperature": 2.0, "num_batches": 31} if mode == "temperature" else {}

    def build(rank, world):
        subs = [BatchSampler(SequentialSampler(range(n)), 8, drop_last) for n in SIZES]
        return SingleSourceBatchSampler(sources=SIZES, batch_samplers=subs, seed=4, rank=rank,
                                        world_size=world, **kw)

    one = build(0, 1)
    expected = expected_rank_batches(one.schedule(1), one.num_batches, world_size, drop_last)
    ranks = [build(r, world_size) for r in range(world_size)]
    for rank in ranks:
        rank.set_epoch(1)
    got = [list(rank) for rank in ranks]
    assert [len(g) for g in got] == [len(r) for r in ranks] == [len(expected[0])] * world_size
    assert got == expected
    one.set_epoch(1)
    assert [[b] for b in list(one)] == [[b] for b in expected_rank_batches(
        one.schedule(1), one.num_batches, 1, drop_last)[0]]  # the rule, checked with one rank


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_of_the_default_samplers_split_the_single_process_epoch(drop_last):
    one = list(SingleSourceBatchSampler(sources=SIZES, batch_size=8, drop_last=drop_last,
                                        seed=9, world_size=1))
    ranks = [SingleSourceBatchSampler(sources=SIZES, batch_size=8, drop_last=drop_last, seed=9,
                                      rank=r, world_size=2) for r in range(2)]
    steps = [b for step in zip(*ranks) for b in step]
    assert len(ranks[0]) == len(ranks[1]) == (len(one) // 2 if drop_last else -(-len(one) // 2))
    shared = min(len(one), len(steps))
    assert steps[:shared] == one[:shared]  # the tail dropped, or padded with extra batches
    if not drop_last:  # every item on some rank (once, apart from the padding)
        assert sorted({i for b in steps for i in b}) == list(range(sum(SIZES)))
        source_of(steps[-1])


def test_rank_and_world_size_default_to_torch_distributed(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    s = SingleSourceBatchSampler(sources=SIZES, batch_size=8)
    assert (s.rank, s.world_size) == (1, 2)
    assert all(sub.world_size == 1 for sub in s.batch_samplers)  # one plan, split by steps
    assert list(s) == list(SingleSourceBatchSampler(sources=SIZES, batch_size=8, rank=1,
                                                    world_size=2))
    # sentence-transformers: accelerate shards the batches, so the callable keeps one rank
    data = ConcatDataset([list(range(30)), list(range(10))])
    subs = [BatchSampler(SequentialSampler(d), 4, False) for d in data.datasets]
    st = single_source_batch_sampler()(data, batch_samplers=subs, generator=None, seed=0)
    assert (st.rank, st.world_size) == (0, 1) and len(st) == len(list(st)) == 8 + 3


@pytest.mark.parametrize("kind", ["uniform", "knn", "torch"])
def test_resume_per_rank_and_from_any_rank(kind):
    def build(rank):
        return SingleSourceBatchSampler(sources=SIZES, temperature=2.0, seed=7, num_batches=31,
                                        rank=rank, world_size=2, **resume_case(kind))

    reference = [list(build(r)) for r in range(2)]
    for saver in range(2):
        s = build(saver)
        it = iter(s)
        for _ in range(6):  # a prefetching loader ran ahead of the 4 trained steps
            next(it)
        state = reloaded(s.state_dict(consumed=4))
        for rank in range(2):
            fresh = build(rank)
            fresh.load_state_dict(state)
            assert list(fresh) == reference[rank][4:]


def test_a_state_loads_only_into_the_same_schedule():
    def build(**kw):
        return SingleSourceBatchSampler(**{"sources": SIZES, "batch_size": 8, "seed": 7,
                                           "num_batches": 30, "weights": [1, 1, 1], **kw})

    s = build()
    it = iter(s)
    next(it), next(it)
    state = reloaded(s.state_dict())
    assert state["kind"] == "SingleSourceBatchSampler" and state["step"] == 2
    build().load_state_dict(state)  # the same settings load
    cases = [  # every one the same number of steps (30), another schedule or other batches
        ({"weights": [3, 1, 1]}, r"saved with weights=\[0.333333, 0.333333, 0.333333\], "
                                 r"counts=\[10, 10, 10\] but this sampler has weights="
                                 r"\[0.6, 0.2, 0.2\], counts=\[18, 6, 6\]; construct it with"),
        ({"weights": "proportional", "temperature": 2.0}, "temperature=None.* but this "
                                                          "sampler has .*temperature=2.0"),
        ({"sources": [120, 40, 18]}, r"sizes=\[120, 40, 17\] but .* sizes=\[120, 40, 18\]"),
        ({"batch_size": 10}, r"lengths=\[15, 5, 3\] but .* lengths=\[12, 4, 2\]"),
        ({"seed": 8}, "seed=7 but this sampler has seed=8"),
        ({"rank": 1, "world_size": 2}, "world_size=1 but this sampler has world_size=2"),
        ({"drop_last": True}, "drop_last=False.* but .*drop_last=True"),
        ({"num_batches": 31}, "num_batches=30.* but .*num_batches=31"),
    ]
    for kw, named in cases:
        with pytest.raises(ValueError, match=named):
            build(**kw).load_state_dict(state)
    t2 = build(weights="proportional", temperature=2.0)
    it = iter(t2)
    next(it)
    with pytest.raises(ValueError, match=r"temperature=2.0, counts=\[15, 9, 6\] but this "
                                         r"sampler has .*temperature=3.0"):
        build(weights="proportional", temperature=3.0).load_state_dict(t2.state_dict())


def test_a_state_of_another_kind_incomplete_or_corrupted_is_a_value_error():
    s = SingleSourceBatchSampler(sources=SIZES, batch_size=8, seed=7)
    uniform = hb.UniformBatchSampler(100, 8, seed=7)
    next(iter(uniform))
    with pytest.raises(ValueError, match="state was saved by a UniformBatchSampler but this "
                                         "sampler is a SingleSourceBatchSampler"):
        s.load_state_dict(uniform.state_dict())
    old = {"epoch": 0, "step": 1, "seed": 7, "num_batches": 23, "sources": [None] * 3}
    with pytest.raises(ValueError, match="saved by a sampler without a recorded kind"):
        s.load_state_dict(old)
    it = iter(s)
    next(it), next(it)
    good = s.state_dict()
    with pytest.raises(ValueError, match="state is missing 'counts'"):
        s.load_state_dict({k: v for k, v in good.items() if k != "counts"})
    with pytest.raises(ValueError, match="corrupted"):
        s.load_state_dict({**good, "step": 1})
    with pytest.raises(ValueError, match="must be the dict of a sampler's state_dict"):
        s.load_state_dict([good])
    torch_subs = SingleSourceBatchSampler(sources=SIZES, seed=7, batch_samplers=[
        BatchSampler(SequentialSampler(range(n)), 8, False) for n in SIZES])
    with pytest.raises(ValueError, match="state of source 0's sampler, but this one "
                                         r"\(BatchSampler\) has no load_state_dict"):
        torch_subs.load_state_dict(good)


@pytest.mark.parametrize("kwargs,match", [
    ({"rank": 2, "world_size": 2}, "rank=2 must be smaller than world_size=2"),
    ({"rank": 0, "world_size": 0}, "world_size=0 must be >= 1"),
    ({"rank": -1, "world_size": 2}, "rank=-1 must be >= 0"),
    ({"rank": 0, "world_size": 40}, "world_size=40 ranks need at least 40 steps per epoch, but "
                                    "the schedule has num_batches=23; pass num_batches >= 40"),
    ({"rank": 0, "world_size": 2, "sampler": lambda i, n: hb.UniformBatchSampler(
        n, 8, rank=0, world_size=2)}, "source 0's sampler is split across world_size=2 ranks, "
                                      "and so is this sampler.*build the source samplers with "
                                      "rank=0, world_size=1"),
])
def test_bad_ranks_name_the_parameter_and_the_fix(kwargs, match):
    kwargs = {"batch_size": None if "sampler" in kwargs else 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        SingleSourceBatchSampler(sources=SIZES, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"weights": [1, -1, 1]}, "weights=.* must be finite and >= 0"),
    ({"weights": [1, float("nan"), 1]}, "must be finite"),
    ({"weights": [0, 0, 0]}, "all zero"),
    ({"weights": [1, 2]}, "weights has 2 values for 3 sources"),
    ({"weights": "uniform"}, "use 'proportional'"),
    ({"temperature": 0}, "temperature=0 must be a positive number"),
    ({"temperature": 2, "weights": [1, 1, 1]}, "with explicit weights leave it out"),
    ({"batch_size": 20, "drop_last": True}, "source 2 has 17 items, fewer than batch_size=20 "
                                            "with drop_last=True.*leave the source out, or "
                                            r"pass its own sampler \(sampler=\[...\] or "
                                            "batch_samplers=\\) and weight 0"),
    ({}, "batch_size= is needed"),
])
def test_bad_input_names_the_parameter_and_the_fix(kwargs, match):
    if kwargs:  # the last case leaves batch_size out
        kwargs = {"batch_size": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        SingleSourceBatchSampler(sources=SIZES, **kwargs)


def test_bad_sources_and_sampler_counts():
    with pytest.raises(ValueError, match="source 1 has 3 items, which give its sampler no batch "
                                         r".*; build source 1's sampler with drop_last=False"):
        SingleSourceBatchSampler(sources=[10, 3], batch_samplers=[
            BatchSampler(SequentialSampler(range(10)), 4, True),
            BatchSampler(SequentialSampler(range(3)), 4, True)])
    with pytest.raises(ValueError, match="2 batch samplers for 3 sources"):
        SingleSourceBatchSampler(ConcatDataset([[1], [2], [3]]), batch_samplers=[[[0]], [[0]]])
    with pytest.raises(ValueError, match="either dataset= .* or sources="):
        SingleSourceBatchSampler(ConcatDataset([[1]]), sources=[1], batch_size=1)
    with pytest.raises(ValueError, match="must be a contiguous range"):
        SingleSourceBatchSampler(sources=[range(0, 10, 2)], batch_size=2)
    with pytest.raises(ValueError, match="temperature=-1"):
        single_source_batch_sampler(temperature=-1)


def test_a_second_load_replaces_the_first_before_iterating():
    # the source samplers' states are applied when the iteration starts: a state loaded and
    # then replaced by another leaves nothing of itself behind
    def make():
        return SingleSourceBatchSampler(sources=[40, 20], batch_size=4)

    fresh = make()
    at_start = fresh.state_dict()
    whole = list(fresh)
    s = make()
    it = iter(s)
    for _ in range(5):
        next(it)
    mid = s.state_dict()
    r = make()
    r.load_state_dict(mid)
    r.load_state_dict(at_start)
    assert list(r) == whole


def test_a_source_too_small_for_a_batch_can_stay_with_weight_zero():
    """The advice of the too-small-source error: its own sampler and weight 0."""
    s = SingleSourceBatchSampler(sources=[40, 3], weights=[1, 0], batch_samplers=[
        BatchSampler(SequentialSampler(range(40)), 8, False),
        BatchSampler(SequentialSampler(range(3)), 8, True)])
    batches = list(s)
    assert batches and all(max(b) < 40 for b in batches)  # only source 0's items
