"""``drop_last=True`` with W ranks, counted by hand over every rank: the plan holds only the full
batches that whole steps serve, ``floor(floor(N / B) / W) * W``, so no planned batch goes
unserved; ``drop_count`` and ``coverage`` count what an epoch leaves out; the partition
samplers' left-out items are a seeded random choice per epoch, never a fixed region (the
reference users expect: torch's ``DistributedSampler(drop_last=True)``, every rank as many
samples). One process (W = 1) keeps its batches: tests/golden pins them."""

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

import hardbatch as hb

N, B = 60, 8  # 7 full batches and 4 items over
X = np.random.default_rng(0).standard_normal((N, 8)).astype(np.float32)
KINDS = {
    "uniform": lambda **kw: hb.UniformBatchSampler(N, B, **kw),
    "gcbs": lambda **kw: hb.GCBSSampler(X, B, quantile=0.9, **kw),
    "gcbs_shuffled": lambda **kw: hb.GCBSSampler(X, B, quantile=0.9, shuffle_batches=True, **kw),
    "cluster": lambda **kw: hb.ClusterBatchSampler(X, B, kmeans="torch", **kw),
    "cluster_c2": lambda **kw: hb.ClusterBatchSampler(X, B, 4, clusters_per_batch=2,
                                                      kmeans="torch", **kw),
    "community": lambda **kw: hb.CommunityBatchSampler(X, B, 2, skip=1, window=6, **kw),
    "community_cells": lambda **kw: hb.CommunityBatchSampler(
        X, B, 2, skip=1, window=6, cells=hb.CommunityCells(batches=2), **kw),
    "community_trim": lambda **kw: hb.CommunityBatchSampler.authors(X, B, skip=2, window=8,
                                                                    **kw),
}
pytestmark = pytest.mark.filterwarnings("ignore::hardbatch.samplers.refresh.RefreshCostWarning")


def epoch_of_all_ranks(kind: str, world: int, epoch: int = 0, **kw):
    """(the last rank's sampler, every rank's batches of ``epoch``)."""
    ranks = []
    for rank in range(world):
        sampler = KINDS[kind](drop_last=True, world_size=world, rank=rank, **kw)
        sampler.set_epoch(epoch)
        ranks.append([list(map(int, b)) for b in sampler])
    return sampler, ranks


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_planned_batch_is_served_and_counted(kind, world):
    sampler, ranks = epoch_of_all_ranks(kind, world)
    steps = (N // B) // world  # full batches, whole steps of W
    assert [len(r) for r in ranks] == [steps] * world == [len(sampler)] * world
    assert all(len(b) == B for r in ranks for b in r)
    items = [i for r in ranks for b in r for i in b]
    assert len(items) == len(set(items)) == steps * world * B  # a partition of what is served
    assert sampler.batches_per_epoch == steps * world  # the plan: exactly the served batches
    assert sampler.drop_count == N - len(items)  # 4, 12, 12, 28 for W = 1, 2, 3, 4
    assert sampler.coverage == pytest.approx(len(items) / N)
    # as DistributedSampler(drop_last=True): every rank as many samples, none beyond N // W
    reference = [len(DistributedSampler(range(N), world, r, drop_last=True))
                 for r in range(world)]
    assert len(set(reference)) == 1 and len({sum(map(len, r)) for r in ranks}) == 1
    assert sum(map(len, ranks[0])) <= reference[0]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_items_left_out_are_a_new_random_choice_each_epoch(kind):
    left_out = []
    for epoch in range(6):  # 3 ranks: 6 of the 7 full batches, 12 items left out per epoch
        sampler, ranks = epoch_of_all_ranks(kind, 3, epoch)
        left_out.append(frozenset(range(N)) - {i for r in ranks for b in r for i in b})
        assert len(left_out[-1]) == sampler.drop_count == 12
    assert len(set(left_out)) == 6  # never the same items twice (before: the order's tail)
    assert len(frozenset().union(*left_out)) >= 30  # spread over the items


def test_gcbs_serves_its_order_minus_the_left_out_positions():
    """The batches of all ranks, in plan order (batch j: rank j mod W), are the epoch's GCBS
    order with the left-out items removed, whole: no slice of the order is planned unserved,
    and the order's tail (its last batch, before: never served with 3 ranks) is left out no
    more than any other place (12 of 60 places an epoch: 1.6 of its 8 on average)."""
    in_tail = 0
    for epoch in range(6):
        _, ranks = epoch_of_all_ranks("gcbs", 3, epoch)
        plan = [ranks[j % 3][j // 3] for j in range(6)]
        served = {i for b in plan for i in b}
        perm = hb.gcbs_permutation(X, 0.9, seed=hb._rng.derive_seed(0, epoch) & 0x7FFFFFFF,
                                   interleave=0).tolist()
        assert [i for b in plan for i in b] == [i for i in perm if i in served]
        in_tail += len(set(perm[-B:]) - served)
    assert in_tail < 6 * 4  # a fixed tail would give 6 * 8


def test_one_process_drops_only_the_short_batch():
    for kind in KINDS:
        sampler = KINDS[kind](drop_last=True)
        assert (sampler.batches_per_epoch, len(sampler), sampler.drop_count) == (7, 7, N % B)
        assert KINDS[kind]().drop_count == 0 and KINDS[kind]().coverage == 1.0


def test_global_batch_plans_one_batch_per_step():
    # one plan batch of W * B = 24 items per step: floor(60 / 24) = 2 steps, 12 items over
    ranks = [list(KINDS["gcbs"](drop_last=True, world_size=3, rank=r, global_batch=True))
             for r in range(3)]
    sampler = KINDS["gcbs"](drop_last=True, world_size=3, rank=0, global_batch=True)
    items = [i for r in ranks for b in r for i in b]
    assert [len(r) for r in ranks] == [2] * 3 and len(items) == len(set(items)) == 48
    assert (sampler.batches_per_epoch, sampler.drop_count) == (2, 12)


@pytest.mark.parametrize("make,match", [
    (lambda: hb.UniformBatchSampler(40, 16, drop_last=True, world_size=3, rank=0),
     r"drop_last=True leaves 2 full batch\(es\) of batch_size=16 for world_size=3 ranks, so "
     r"every rank would get no batch; use batch_size <= N // world_size = 13 or pass "
     r"drop_last=False"),
    (lambda: hb.GCBSSampler(X[:2], 1, quantile=0.9, drop_last=True, world_size=3, rank=0),
     r"drop_last=True leaves 2 full batch\(es\) of batch_size=1 for world_size=3 ranks, so "
     r"every rank would get no batch; pass drop_last=False"),
    (lambda: hb.UniformBatchSampler(20, 8, world_size=4, rank=0),
     r"world_size=4 needs at least 4 batches per epoch .* N=20 items make 3 of batch_size=8; "
     r"use N >= 25 items, a smaller world_size, or batch_size <= 6"),
])
def test_too_few_batches_for_the_ranks_name_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()
