"""SingleSourceBatchSampler: each batch from one source, sources drawn by size, temperature or
weights, any sampler inside; sentence-transformers' multi-dataset call; resume (issue 31)."""

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


@pytest.mark.parametrize("kwargs,match", [
    ({"weights": [1, -1, 1]}, "weights=.* must be finite and >= 0"),
    ({"weights": [1, float("nan"), 1]}, "must be finite"),
    ({"weights": [0, 0, 0]}, "all zero"),
    ({"weights": [1, 2]}, "weights has 2 values for 3 sources"),
    ({"weights": "uniform"}, "use 'proportional'"),
    ({"temperature": 0}, "temperature=0 must be a positive number"),
    ({"temperature": 2, "weights": [1, 1, 1]}, "with explicit weights leave it out"),
    ({"batch_size": 20, "drop_last": True}, "source 2 has 17 items, fewer than batch_size=20 "
                                            "with drop_last=True.*weight 0 for it"),
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
