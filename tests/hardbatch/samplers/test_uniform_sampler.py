"""UniformBatchSampler: its argument checks (the contract suite covers its batches)."""

import pytest

import hardbatch as hb


@pytest.mark.parametrize("factory,match", [
    (lambda: hb.UniformBatchSampler(10, 11), "batch_size=11 is larger than the number of items N=10"),
    (lambda: hb.UniformBatchSampler([], 1), "has no items"),
    (lambda: hb.UniformBatchSampler(10, 0), "batch_size=0 must be >= 1"),
    (lambda: hb.UniformBatchSampler(10, 2, rank=2, world_size=2), "rank=2 must be smaller"),
    (lambda: hb.UniformBatchSampler(10, 4, drop_last=True, rank=0, world_size=4),
     "drop_last=True leaves 2 full batch\\(es\\) of batch_size=4 for world_size=4 ranks.*"
     "batch_size <= N // world_size = 2"),
])
def test_bad_input_raises_clear_errors(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_a_sized_dataset_gives_n_and_every_item_once_per_epoch():
    s = hb.UniformBatchSampler(list(range(10)), 4, seed=1)
    assert s.num_items == 10 and s.coverage == 1.0
    assert sorted(i for b in s for i in b) == list(range(10))
