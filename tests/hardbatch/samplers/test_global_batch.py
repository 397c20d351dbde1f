"""global_batch=True: one hard batch of W * B items per step, rank r taking slice r (issue 20);
and ranks never sharing a batch in a step (issue 17, item 4)."""

import itertools
import math

import pytest
import torch
from sampler_support import KINDS, LIVE_B, LIVE_D, LIVE_N, N, PARTITIONS, PREFETCH_KINDS, feed, \
    make, run

import hardbatch as hb


def global_steps(kind, emb, world, b=32, **kw):
    """Each rank's batches of one epoch, and the steps as concatenations of the ranks' batches."""
    ranks = [list(make(kind, emb, batch_size=b, rank=r, world_size=world, global_batch=True,
                       **kw)) for r in range(world)]
    return ranks, [sum((ranks[r][s] for r in range(world)), []) for s in range(len(ranks[0]))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world,drop_last", [(2, False), (3, False), (2, True)])
def test_ranks_together_are_one_process_with_world_times_the_batch(kind, emb, world, drop_last):
    kw = dict(refresh_every=5, seed=7, drop_last=drop_last)
    single = make(kind, emb, batch_size=world * 32, **kw)
    expected = [list(single), list(single)]  # two epochs (refreshes count the same steps)
    samplers = [make(kind, emb, batch_size=32, rank=r, world_size=world, global_batch=True,
                     **kw) for r in range(world)]
    for epoch in range(2):
        ranks = [list(s) for s in samplers]
        steps = [sum((ranks[r][s] for r in range(world)), []) for s in range(len(ranks[0]))]
        assert steps == expected[epoch]
        per_epoch = N // (world * 32) if drop_last else math.ceil(N / (world * 32))
        assert all(len(s) == len(r) == per_epoch for s, r in zip(samplers, ranks))
        for r in range(world):  # full global batches: slice r is items r*B .. r*B + B - 1
            for s, step in enumerate(steps):
                if len(step) == world * 32:
                    assert ranks[r][s] == step[r * 32:(r + 1) * 32]


@pytest.mark.parametrize("kind", sorted(PARTITIONS))
def test_short_last_global_batch_is_split_evenly(kind, emb):
    ranks, steps = global_steps(kind, emb, 3, b=64)  # 1000 = 5 * 192 + 40
    assert [len(r[-1]) for r in ranks] == [14, 13, 13]
    assert sorted(itertools.chain.from_iterable(steps)) == list(range(N))


@pytest.mark.parametrize("kind", sorted(PARTITIONS))
def test_last_global_batch_of_fewer_than_world_items_is_topped_up(kind, emb):
    ranks, steps = global_steps(kind, emb, 3, b=333)  # 1000 = 999 + 1 item
    last = [r[-1] for r in ranks]
    assert [len(b) for b in last] == [1, 1, 1] and len({b[0] for b in last}) == 3
    assert last[0][0] not in steps[0] and {last[1][0], last[2][0]} <= set(steps[0])
    assert sorted(itertools.chain.from_iterable(steps[:-1] + [last[0]])) == list(range(N))


def test_global_batch_larger_than_n_is_rejected(emb):
    for kind in ("uniform", "knn", "proximity", "gcbs"):
        with pytest.raises(ValueError, match=r"global_batch=True draws world_size \* batch_size "
                                             r"= 4 \* 300 = 1200 items per step, more than the "
                                             r"N=1000 items; use batch_size <= N // world_size "
                                             r"= 250"):
            make(kind, emb, batch_size=300, rank=0, world_size=4, global_batch=True)
    with pytest.raises(ValueError, match=r"world_size \* batch_size = 1000 must be smaller than "
                                         "N=1000 for the kNN sampler"):
        make("knn", emb, batch_size=500, rank=1, world_size=2, global_batch=True)


@pytest.mark.parametrize("kind", KINDS)
def test_any_ranks_state_resumes_every_rank_with_global_batches(kind, emb):
    world, kw = 2, dict(batch_size=32, world_size=2, global_batch=True, seed=3)
    reference = [list(make(kind, emb, rank=r, **kw)) for r in range(world)]
    saver = make(kind, emb, rank=1, **kw)
    it = iter(saver)
    for _ in range(6):
        next(it)
    state = saver.state_dict(consumed=4)
    assert state["global_batch"] is True
    for r in range(world):
        fresh = make(kind, emb, rank=r, **kw)
        fresh.load_state_dict(state)
        assert list(fresh) == reference[r][4:]
    with pytest.raises(ValueError, match="saved with global_batch=True but this sampler has "
                                         "global_batch=False"):
        make(kind, emb, batch_size=32, rank=0, world_size=2, seed=3).load_state_dict(state)


@pytest.mark.parametrize("kind", PREFETCH_KINDS)
def test_prefetch_keeps_global_batches(kind, emb):
    kw = dict(batch_size=32, rank=1, world_size=2, global_batch=True, seed=4)
    assert list(make(kind, emb, prefetch=3, **kw)) == list(make(kind, emb, **kw))


def live(kind, background, batch_size, **kw):
    """A sampler over a fresh live bank with a pipelined refresh (lag 1)."""
    bank = hb.EmbeddingBank(LIVE_N, LIVE_D, seed=3)
    if kind == "proximity":
        return hb.ProximityGraphSampler(bank, batch_size, 100, 10, refresh_every=4,
                                        refresh_lag=1, background=background, seed=1, **kw)
    return hb.GCBSSampler(bank, batch_size, quantile=0.99, refresh_lag=1, background=background,
                          seed=1, **kw)


@pytest.mark.parametrize("kind", ["proximity", "gcbs"])
@pytest.mark.parametrize("background", [False, True])
def test_live_banks_and_background_builds_keep_global_batches(kind, background, base):
    world = 2
    expected = run(live(kind, background, LIVE_B), base)
    ranks = [live(kind, background, LIVE_B // world, rank=r, world_size=world,
                  global_batch=True) for r in range(world)]
    got, step = [], 0
    for epoch in range(2):
        for s in ranks:
            s.set_epoch(epoch)
        for batches in zip(*ranks):
            whole = sum(batches, [])
            got.append(whole)
            for s in ranks:  # every rank's bank gets the whole step (a synchronised bank)
                feed(s.source, whole, base, step)
            step += 1
    assert got == expected


def test_rank_and_world_from_torch_distributed(monkeypatch, emb):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    s = hb.UniformBatchSampler(N, 32, global_batch=True, seed=2)
    assert (s.rank, s.world_size, len(s)) == (1, 2, math.ceil(N / 64))
    whole = list(hb.UniformBatchSampler(N, 64, seed=2, rank=0, world_size=1))
    assert list(s)[:-1] == [b[32:] for b in whole[:-1]]


# -- ranks get distinct batches (issue 17, item 4) ---------------------------------------------

def test_more_ranks_than_batches_is_rejected_naming_world_size_and_n():
    with pytest.raises(ValueError, match=r"world_size=3 needs at least 3 batches per epoch .*"
                                         r"N=5 items make 1 of batch_size=5; use N >= 11 items"):
        hb.UniformBatchSampler(5, 5, rank=0, world_size=3)


@pytest.mark.parametrize("n,b,w,drop_last", [(10, 4, 4, False), (100, 40, 4, False),
                                             (9, 3, 4, False), (100, 30, 4, True)])
def test_too_few_batches_advice_gives_the_largest_batch_size_that_works(n, b, w, drop_last):
    """The advised batch_size is the largest that gives every rank a batch of its own."""
    import re

    with pytest.raises(ValueError, match=r"batch_size <= ") as err:
        hb.UniformBatchSampler(n, b, rank=0, world_size=w, drop_last=drop_last)
    largest = int(re.search(r"batch_size <= (?:N // world_size = )?(\d+)",
                            str(err.value)).group(1))
    assert "global_batch=True" not in str(err.value)  # never possible here
    assert len(hb.UniformBatchSampler(n, largest, rank=0, world_size=w, drop_last=drop_last)) >= 1
    with pytest.raises(ValueError):
        hb.UniformBatchSampler(n, largest + 1, rank=0, world_size=w, drop_last=drop_last)
    for r in range(3):  # one global batch split across the ranks instead
        assert list(hb.UniformBatchSampler(6, 2, rank=r, world_size=3, global_batch=True)) \
            == [list(hb.UniformBatchSampler(6, 6))[0][2 * r:2 * r + 2]]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,b,world", [(40, 16, 2), (70, 16, 4), (130, 32, 3), (33, 16, 3)])
def test_no_two_ranks_get_the_same_batch_in_a_step(kind, n, b, world):
    x = torch.nn.functional.normalize(torch.randn(n, 8, generator=torch.Generator().manual_seed(n)),
                                      dim=1).numpy()
    for seed in range(4):
        if kind == "uniform":
            ranks = [list(hb.UniformBatchSampler(n, b, rank=r, world_size=world, seed=seed))
                     for r in range(world)]
        elif kind in ("knn",):
            ranks = [list(hb.KNNBatchSampler(x, b, rank=r, world_size=world, seed=seed))
                     for r in range(world)]
        elif kind == "gcbs":
            ranks = [list(hb.GCBSSampler(x, b, quantile=0.9, rank=r, world_size=world,
                                         seed=seed)) for r in range(world)]
        elif kind in ("cluster", "community"):
            ranks = [list(make(kind, x, batch_size=b, rank=r, world_size=world, seed=seed))
                     for r in range(world)]
        else:
            walk = {"bfs": "bfs", "dfs": "dfs", "rw": "rw"}.get(kind, "rwr")
            ranks = [list(hb.ProximityGraphSampler(x, b, candidates=n // 2, neighbors=5,
                                                   walk=walk, rank=r, world_size=world,
                                                   seed=seed)) for r in range(world)]
        for step in zip(*ranks):
            assert len({tuple(batch) for batch in step}) == world, (kind, seed, step)
            if kind in PARTITIONS:  # padding repeats other batches of the epoch, never the step's
                items = list(itertools.chain.from_iterable(step))
                assert len(items) == len(set(items))


def test_a_shuffled_short_global_batch_is_topped_up_with_other_items():
    """GCBS shuffle_batches can put the short global batch first; it was topped up from the
    epoch's first batch, i.e. itself: [i, i] split over 4 ranks gave two ranks an empty batch
    (a collate error there, the other ranks waiting in DDP) and item i twice."""
    x = torch.randn(61, 8, generator=torch.Generator().manual_seed(0))
    ranks = []
    for r in range(4):  # 61 items, global batches of 4 * 5: 20, 20, 20 and 1, shuffled
        s = hb.GCBSSampler(x, 5, world_size=4, rank=r, global_batch=True, shuffle_batches=True,
                           seed=2)
        ranks.append(list(s))
    first = [rank[0] for rank in ranks]
    assert sorted(map(len, first)) == [1, 1, 1, 1]  # the short batch came first, now W items
    items = [i for batch in first for i in batch]
    assert len(set(items)) == 4
    seen = [i for rank in ranks for batch in rank for i in batch]
    assert set(seen) == set(range(61))  # every item still served
    assert len(seen) == 61 + 3  # the 3 top-up items served twice, as DistributedSampler pads
