"""GCBS step 3 (hardbatch.batching.gcbs.order): the partitioned order and interleaved chunks."""

import numpy as np
import pytest
import torch
from support import unit_rows

import hardbatch as hb
from hardbatch.batching import gcbs


def test_partition_order_does_not_depend_on_threads(rng):
    x = unit_rows(rng, 2000, 6)
    threads = torch.get_num_threads()
    try:
        orders = []
        for t in (1, 3):
            torch.set_num_threads(t)
            orders.append(hb.gcbs_permutation(x, 0.995, method="partition", partitions=5))
            assert torch.get_num_threads() == t
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*orders)


def test_partition_keeps_partners_inside_cells(rng):
    x = unit_rows(rng, 600, 6)
    one = hb.gcbs_permutation(x, 0.999, method="partition", partitions=1, seed=3)
    assert torch.equal(one, hb.gcbs_permutation(x, 0.999, method="exact", seed=3))
    four = hb.gcbs_permutation(x, 0.999, method="partition", partitions=4, seed=3)
    assert sorted(four.tolist()) == list(range(600))


def interleave_reference(order, chunk):
    """Plain Python: chunks of ``chunk`` items, chunk j of the result = chunk j*s mod C."""
    import math

    chunks = [list(order[i:i + chunk]) for i in range(0, len(order), chunk)]
    count = len(chunks)
    step = max(1, round(count / ((1 + math.sqrt(5)) / 2)))
    while math.gcd(step, count) != 1:
        step += 1
    return [v for j in range(count) for v in chunks[j * step % count]]


@pytest.mark.parametrize("n,chunk", [(23, 5), (256, 32), (1000, 7), (10, 1), (10, 10), (5, 0)])
def test_interleave_chunks_matches_reference(rng, n, chunk):
    order = rng.permutation(n)
    got = gcbs.interleave_chunks(order, chunk)
    want = interleave_reference(order, chunk) if 0 < chunk < n else list(order)
    assert got.tolist() == want and got.dtype == np.int64


def test_interleave_spreads_dense_regions_over_batches():
    # An order of 16 regions of 64 consecutive items (a near-duplicate head, say): batches
    # of 64 cut from it hold one region each; interleaved by chunks of 8, each holds chunks
    # of at least 6 regions, and every chunk stays whole.
    order = np.arange(1024)
    mixed = gcbs.interleave_chunks(order, 8)
    regions = mixed.reshape(16, 64) // 64
    assert min(len(set(r.tolist())) for r in regions) >= 6
    assert (np.diff(mixed.reshape(-1, 8), axis=1) == 1).all()


def test_default_interleave():
    assert [gcbs.default_interleave(b) for b in (8, 16, 64, 256, 1024)] == [0, 8, 8, 32, 128]
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        gcbs.default_interleave(0)
