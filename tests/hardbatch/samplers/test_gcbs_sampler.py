"""GCBSSampler: batches cut from each epoch's GCBS order; paired data, drop_last, methods."""

import itertools

import numpy as np
import pytest
import torch
from sampler_support import B, N
from support import REPO, unit_rows

import hardbatch as hb


def test_gcbs_sampler_batches_follow_permutation(emb):
    s = hb.GCBSSampler(emb, B, quantile=0.99, seed=0)
    batches = list(s)
    assert s.interleave == hb.batching.gcbs.default_interleave(B) == 8
    perm = hb.gcbs_permutation(emb, 0.99, seed=hb._rng.derive_seed(0, 0) & 0x7FFFFFFF,
                               interleave=8)  # the defaults: method auto, min_partners 16
    assert list(itertools.chain.from_iterable(batches)) == perm.tolist()
    shuffled = hb.GCBSSampler(emb, B, quantile=0.99, seed=0, shuffle_batches=True)
    assert sorted(map(tuple, list(shuffled))) == sorted(map(tuple, batches))


def test_gcbs_sampler_paper_settings_cut_the_paper_order(emb):
    s = hb.GCBSSampler(emb, B, quantile=0.99, seed=0, method="exact", min_partners=0,
                       interleave=0)
    perm = hb.gcbs_permutation(emb, 0.99, method="exact", min_partners=0,
                               seed=hb._rng.derive_seed(0, 0) & 0x7FFFFFFF)
    assert list(itertools.chain.from_iterable(s)) == perm.tolist()
    with pytest.raises(ValueError, match="interleave=-1 must be >= 0"):
        hb.GCBSSampler(emb, B, interleave=-1)


def test_gcbs_sampler_min_partners_follows_the_permutation(emb):
    s = hb.GCBSSampler(emb, B, quantile=0.99, seed=0, min_partners=4, interleave=0)
    perm = hb.gcbs_permutation(emb, 0.99, method="exact", min_partners=4,
                               seed=hb._rng.derive_seed(0, 0) & 0x7FFFFFFF)
    assert list(itertools.chain.from_iterable(s)) == perm.tolist()
    with pytest.raises(ValueError, match="min_partners"):
        hb.GCBSSampler(emb, B, min_partners=-1)


def test_gcbs_sampler_paired_source(emb):
    y = emb + 0.05 * unit_rows(np.random.default_rng(9), N, 16)
    s = hb.GCBSSampler(emb, B, quantile=0.99, paired=y)
    assert sorted(itertools.chain.from_iterable(s)) == list(range(N))
    with pytest.raises(ValueError, match="paired has 10 rows but embeddings has N=1000"):
        hb.GCBSSampler(emb, B, paired=y[:10])


@pytest.mark.parametrize("factory,match", [
    (lambda e: hb.GCBSSampler(e, B, quantile=1.0), "quantile=1.0 must lie strictly between"),
    (lambda e: hb.GCBSSampler(e, B, method="annoy"), "method='annoy'"),
    (lambda e: hb.GCBSSampler(np.zeros((0, 3)), 4), "empty"),
    (lambda e: hb.GCBSSampler(e, B, nlist=-1, method="ivf"), "nlist=-1 must be >= 1"),
    (lambda e: hb.GCBSSampler(e, B, nlist=2.5, method="ivf"), "nlist must be an integer"),
    (lambda e: hb.GCBSSampler(e, B, nprobe=0, method="ivf"), "nprobe=0 must be >= 1"),
])
def test_bad_input_raises_clear_errors(emb, factory, match):
    with pytest.raises(ValueError, match=match):
        factory(emb)


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
    from hardbatch.batching.gcbs import similarity_threshold, thresholded_pairs

    s = hb.GCBSSampler(emb, B, quantile=0.99, drop_last=True, seed=0, method="exact",
                       min_partners=0, interleave=0)  # the paper's order: isolated items last
    dropped = np.zeros(N, int)
    for epoch in range(12):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == N // B and all(len(b) == B for b in batches)
        kept = [i for b in batches for i in b]
        assert len(set(kept)) == len(kept) == N - N % B
        # the kept items follow the epoch's GCBS order, minus N mod B of its positions
        perm = hb.gcbs_permutation(emb, 0.99, method="exact", min_partners=0,
                                   seed=hb._rng.derive_seed(0, epoch) & 0x7FFFFFFF)
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
    perm = hb.gcbs_permutation(x, 0.99, seed=hb._rng.derive_seed(0, 0) & 0x7FFFFFFF,
                               interleave=hb.batching.gcbs.default_interleave(B))
    assert list(itertools.chain.from_iterable(batches)) == perm.tolist()


# -- devices and methods ---------------------------------------------------------------------

def test_gcbs_device_and_precision(rng):
    x = unit_rows(rng, 500, 16)
    ref = hb.gcbs_permutation(x, 0.99, seed=2)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=2, device="cpu"), ref)
    half = hb.gcbs_permutation(x, 0.99, seed=2, precision="bf16")
    assert sorted(half.tolist()) == list(range(500))


def test_gcbs_sampler_accepts_device_and_precision(rng):
    x = unit_rows(rng, 400, 16)
    gcbs = hb.GCBSSampler(x, 16, quantile=0.99, device="cpu", precision="bf16")
    assert sorted(i for b in gcbs for i in b) == list(range(400))


def test_gcbs_partition_method():
    import sys
    sys.path.insert(0, str(REPO / "benchmarks"))
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
    from hardbatch.batching.gcbs import PartitionLayout, similarity_threshold

    x = unit_rows(rng, 3000, 8)
    layout = PartitionLayout(x, x, similarity_threshold(x, x, 0.99, 1), 7, 1, None, "fp32")
    whole = layout.order(0, 7)
    assert torch.equal(torch.from_numpy(whole),
                       hb.gcbs_permutation(x, 0.99, method="partition", partitions=7, seed=1))
    sizes = np.diff(layout.start)[layout.chain]
    for world in (1, 2, 3, 7, 9):
        shards = [layout.shard(r, world) for r in range(world)]
        assert shards[0][0] == 0 and shards[-1][1] == 7
        assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(shards, shards[1:]))
        assert np.array_equal(np.concatenate([layout.order(*sh) for sh in shards]), whole)
        if world == 2:  # about equal cost: no shard holds more than the total minus one cell
            cost = [float((sizes[a:b].astype(float) ** 2).sum()) for a, b in shards]
            assert max(cost) <= (sizes.astype(float) ** 2).sum() - (sizes.astype(float) ** 2).min()


@pytest.mark.parametrize("method", ["ivf", "faiss", "exact"])
def test_nlist_above_n_is_rejected_by_the_constructor(emb, method):
    with pytest.raises(ValueError, match="nlist=1001 must be at most the N=1000 items"):
        hb.GCBSSampler(emb, 64, method=method, nlist=1001)
    with pytest.raises(ValueError, match="partitions=1001 must be at most the N=1000 items"):
        hb.GCBSSampler(emb, 64, method="partition", partitions=1001)
    assert len(hb.GCBSSampler(emb, 64, method="ivf", nlist=1000)) == 16
