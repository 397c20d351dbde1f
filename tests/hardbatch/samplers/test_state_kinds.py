"""Sampler states record their kind, the settings that shape the batches and a checksum; the
per-rank batch count; the warning when refreshes dominate training (issue 34)."""

import io
import math
import random
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hardbatch as hb
from hardbatch._integrity import tensor_record_spans
from hardbatch.samplers.refresh import RefreshCostWarning

SMALL = np.random.default_rng(0).standard_normal((120, 8)).astype(np.float32)
FACTORIES = {
    "UniformBatchSampler": lambda **kw: hb.UniformBatchSampler(len(SMALL), 8, **kw),
    "KNNBatchSampler": lambda **kw: hb.KNNBatchSampler(SMALL, 8, refresh_every=None, **kw),
    "ProximityGraphSampler": lambda **kw: hb.ProximityGraphSampler(
        SMALL, 8, 30, 6, refresh_every=None, **kw),
    "GCBSSampler": lambda **kw: hb.GCBSSampler(SMALL, 8, quantile=0.9, **kw),
}


def mid_epoch_state(sampler, steps=3, consumed=None):
    it = iter(sampler)
    for _ in range(steps):
        next(it)
    return sampler.state_dict(consumed)


@pytest.mark.parametrize("saved", sorted(FACTORIES))
@pytest.mark.parametrize("loaded", sorted(FACTORIES))
def test_a_state_loads_only_into_its_own_kind(saved, loaded):
    state = mid_epoch_state(FACTORIES[saved]())
    assert state["kind"] == saved
    target = FACTORIES[loaded]()
    if saved == loaded:
        target.load_state_dict(state)
        return
    with pytest.raises(ValueError, match=f"state was saved by a {saved} but this sampler is a "
                                         f"{loaded}"):
        target.load_state_dict(state)


@pytest.mark.parametrize("make,other,named", [
    (lambda **kw: hb.ProximityGraphSampler(SMALL, 8, **{"candidates": 30, "neighbors": 6,
                                                         "refresh_every": None, **kw}),
     {"candidates": 40}, "candidates=30 but this sampler has candidates=40"),
    (lambda **kw: hb.ProximityGraphSampler(SMALL, 8, 30, 6, refresh_every=None, **kw),
     {"walk": "bfs"}, "walk='rwr' but this sampler has walk='bfs'"),
    (lambda **kw: hb.ProximityGraphSampler(SMALL, 8, 30, 6, refresh_every=None, **kw),
     {"restart": hb.LinearDecay(0.2, 0.05), "epochs": 3}, "restart=0.2 but this sampler has "
                                                          "restart='LinearDecay("),
    (lambda **kw: hb.GCBSSampler(SMALL, 8, **{"quantile": 0.9, **kw}),
     {"quantile": 0.95}, "quantile=0.9 but this sampler has quantile=0.95"),
    (lambda **kw: hb.GCBSSampler(SMALL, 8, quantile=0.9, **kw),
     {"method": "ivf"}, "method='auto' but this sampler has method='ivf'"),
    (lambda **kw: hb.KNNBatchSampler(SMALL, 8, refresh_every=None, **kw),
     {"seed": 4, "normalize": False}, "seed=0, normalize=True but this sampler has seed=4, "
                                      "normalize=False; construct it with the same values"),
    (lambda **kw: hb.UniformBatchSampler(len(SMALL), 8, **kw),
     {"duplicate_keys": [i // 2 for i in range(len(SMALL))]}, "duplicate_keys_digest=None"),
])
def test_options_that_shape_the_batches_must_match(make, other, named):
    state = mid_epoch_state(make())
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        make(**other).load_state_dict(state)


def test_missing_keys_are_named():
    with pytest.raises(ValueError, match="state is missing 'kind', 'epoch', 'step', 'generator', "
                                         "'pending_plan'"):
        hb.UniformBatchSampler(10, 2).load_state_dict({})
    with pytest.raises(ValueError, match="must be the dict of a sampler's state_dict"):
        hb.UniformBatchSampler(10, 2).load_state_dict([1, 2])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(FACTORIES)), data=st.data())
def test_any_missing_key_of_a_state_is_named(kind, data):
    state = mid_epoch_state(FACTORIES[kind](), steps=2)
    keys = sorted(k for k in state if k not in ("rank", "integrity"))
    drop = data.draw(st.lists(st.sampled_from(keys), min_size=1, unique=True))
    broken = {k: v for k, v in state.items() if k not in drop}
    with pytest.raises(ValueError, match="state is missing") as err:
        FACTORIES[kind]().load_state_dict(broken)
    assert all(repr(k) in str(err.value) for k in drop)


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_a_flipped_byte_of_a_saved_state_is_detected(kind, tmp_path):
    path = tmp_path / "state.pt"
    torch.save(mid_epoch_state(FACTORIES[kind](), consumed=1), path)  # 2 batches to replay
    spans = tensor_record_spans(path)
    rng = random.Random(kind)
    for _ in range(10):
        start, end = rng.choice(spans)
        data = bytearray(path.read_bytes())
        data[rng.randrange(start, end)] ^= rng.randrange(1, 256)
        state = torch.load(io.BytesIO(bytes(data)), weights_only=True)
        with pytest.raises(ValueError, match="sampler state is corrupted"):
            FACTORIES[kind]().load_state_dict(state)


def test_a_state_without_kind_or_checksum_is_refused():
    state = mid_epoch_state(FACTORIES["KNNBatchSampler"]())
    old = {k: v for k, v in state.items() if k not in ("kind", "integrity", "normalize",
                                                        "refresh_lag", "duplicate_keys_digest")}
    with pytest.raises(ValueError, match="state is missing 'kind'"):
        FACTORIES["KNNBatchSampler"]().load_state_dict(old)


# -- per-rank batch count ----------------------------------------------------------------------

def per_rank_batches(n, b, w, drop_last):
    """The formula of docs/samplers.md ("Batches per rank")."""
    if drop_last:
        return (n // b) // w
    return math.ceil(math.ceil(n / b) / w)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 400), b=st.integers(1, 40), w=st.integers(1, 6),
       drop_last=st.booleans())
def test_per_rank_batch_count_formula(n, b, w, drop_last):
    minimum = w * b if drop_last else (w - 1) * b + 1
    if b > n or n < minimum:
        with pytest.raises(ValueError, match="world_size|batch_size"):
            hb.UniformBatchSampler(n, b, rank=0, world_size=w, drop_last=drop_last)
        return
    ranks = [list(hb.UniformBatchSampler(n, b, rank=r, world_size=w, drop_last=drop_last))
             for r in range(w)]
    want = per_rank_batches(n, b, w, drop_last)
    assert [len(r) for r in ranks] == [want] * w
    items = [i for r in ranks for batch in r for i in batch]
    if drop_last:  # only full batches, each item at most once
        assert len(items) == want * w * b == len(set(items))
    else:  # every item, padded with repeats of the epoch's first batches
        assert set(items) == set(range(n))


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_worked_example_of_the_docs(kind):
    x = SMALL[:34]
    make = {"UniformBatchSampler": lambda **kw: hb.UniformBatchSampler(34, 4, **kw),
            "KNNBatchSampler": lambda **kw: hb.KNNBatchSampler(x, 4, refresh_every=None, **kw),
            "ProximityGraphSampler": lambda **kw: hb.ProximityGraphSampler(
                x, 4, 12, 4, refresh_every=None, **kw),
            "GCBSSampler": lambda **kw: hb.GCBSSampler(x, 4, quantile=0.9, **kw)}[kind]
    for drop_last, steps, covered in ((False, 3, 34), (True, 2, 24)):
        ranks = [list(make(rank=r, world_size=3, drop_last=drop_last)) for r in range(3)]
        assert [len(r) for r in ranks] == [steps] * 3
        if kind in ("UniformBatchSampler", "GCBSSampler"):  # partitions: items covered
            assert len({i for r in ranks for batch in r for i in batch}) == covered


# -- refreshes that dominate training ----------------------------------------------------------

def slowed(sampler, seconds):
    build = sampler.builder.build

    def slow_build(*args):
        time.sleep(seconds)
        return build(*args)

    sampler.builder.build = slow_build
    return sampler


def cost_warnings(sampler, steps, train_seconds=0.0):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(sampler)
        for _ in range(steps):
            next(it)
            time.sleep(train_seconds)
    return [str(w.message) for w in caught if issubclass(w.category, RefreshCostWarning)]


def test_exact_knn_graph_every_step_warns_once_with_the_estimate_and_the_fixes():
    sampler = slowed(hb.ProximityGraphSampler(SMALL, 8, neighbors=6, graph="knn",
                                              refresh_every=1), 0.03)
    messages = cost_warnings(sampler, 6)
    assert len(messages) == 1
    assert "ms of building per step" in messages[0] and "120 items" in messages[0]
    for fix in ("refresh_every=", "graph='proximity'", "background=True"):
        assert fix in messages[0]


def test_builds_longer_than_the_steps_between_them_warn_once():
    sampler = slowed(hb.ProximityGraphSampler(SMALL, 8, 30, 6, refresh_every=2), 0.03)
    messages = cost_warnings(sampler, 9)
    assert len(messages) == 1 and "% of the run" in messages[0]
    assert "refresh_every=" in messages[0] and "background=True" in messages[0]


def test_cheap_or_rare_refreshes_do_not_warn():
    fast = hb.ProximityGraphSampler(SMALL, 8, 30, 6, refresh_every=2)
    assert not cost_warnings(fast, 9)  # builds far below a millisecond threshold
    rare = slowed(hb.ProximityGraphSampler(SMALL, 8, 30, 6, refresh_every=3), 0.03)
    assert not cost_warnings(rare, 9, train_seconds=0.03)  # 30 ms per 90 ms of training


def epoch_cost_warnings(sampler, epochs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            list(sampler)
    return [str(w.message) for w in caught if issubclass(w.category, RefreshCostWarning)]


def test_a_slow_first_build_over_fixed_embeddings_does_not_warn():
    # cluster batches over a fixed table: the clustering is built once and reused, so the
    # one costly build is no rebuild to make rarer; the same builder, told its source is
    # live, warns (the check below is not vacuous)
    fixed = slowed(hb.ClusterBatchSampler(SMALL, 8, kmeans="torch"), 0.05)
    assert fixed.builder.fixed
    assert not epoch_cost_warnings(fixed, 3)
    live = slowed(hb.ClusterBatchSampler(SMALL, 8, kmeans="torch"), 0.05)
    live.builder.fixed = False
    assert epoch_cost_warnings(live, 3)
