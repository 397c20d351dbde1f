"""Sampler states with prefetching DataLoader workers, and states that weights_only loads
(issue 17, items 1 and 2)."""

import io

import pytest
import torch
from sampler_support import KINDS, N, finish_epoch, live_gcbs, live_graph, make, run
from torch.utils.data import DataLoader, TensorDataset

from hardbatch.train import TrainConfig, Trainer


def reload(state: dict) -> dict:
    """``state`` through torch.save and torch.load with weights_only=True."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("kind,prefetch", [(k, 0) for k in KINDS] + [("proximity", 2)])
def test_state_is_exact_for_every_step_under_a_prefetching_dataloader(kind, emb, prefetch):
    kw = dict(seed=5, **({"prefetch": prefetch} if prefetch else {}))
    ref = make(kind, emb, **kw)
    reference = [list(ref), list(ref)]
    steps = len(reference[0])
    s = make(kind, emb, **kw)
    loader = DataLoader(TensorDataset(torch.arange(N)), batch_sampler=s, num_workers=2,
                        prefetch_factor=2)
    it = iter(loader)
    states = [reload(s.state_dict(consumed=0))]  # the loader already asked for 4 batches
    finished_early = False
    for k, (idx,) in enumerate(it):
        assert idx.tolist() == reference[0][k]
        finished_early |= s.epoch == 1 and k + 1 < steps  # the sampler's epoch is over
        states.append(reload(s.state_dict(consumed=k + 1)))
    assert finished_early and len(states) == steps + 1
    assert reload(s.state_dict())["epoch"] == 1  # after the whole epoch: the next one
    for k, state in enumerate(states):
        fresh = make(kind, emb, **kw)
        fresh.load_state_dict(state)
        if k < steps:
            assert (state["epoch"], state["step"]) == (0, k)
            assert list(fresh) == reference[0][k:], k
        else:
            assert (state["epoch"], state["step"]) == (1, 0)
        assert list(fresh) == reference[1], k  # and the next epoch continues identically
    s.set_epoch(1)  # the loop's next epoch: consumed counts its steps
    assert s.state_dict(consumed=0)["epoch"] == 1
    with pytest.raises(ValueError, match="consumed=1 must be between"):
        s.state_dict(consumed=1)


@pytest.mark.parametrize("kind,option", [(k, o) for k in KINDS
                                          for o in ("plain", "global_batch", "lagged")
                                          if (k, o) != ("uniform", "lagged")])
def test_mid_epoch_state_loads_with_weights_only(kind, emb, option):
    kw = {"plain": {}, "lagged": dict(refresh_lag=1),
          "global_batch": dict(batch_size=32, rank=1, world_size=2, global_batch=True)}[option]
    reference = list(make(kind, emb, seed=9, **kw))
    s = make(kind, emb, seed=9, **kw)
    it = iter(s)
    for _ in range(6):
        next(it)
    state = reload(s.state_dict(consumed=4))
    fresh = make(kind, emb, seed=9, **kw)
    fresh.load_state_dict(state)
    assert list(fresh) == reference[4:]


@pytest.mark.parametrize("factory,stop", [(live_graph, 5), (live_gcbs, 25)])
def test_state_holding_a_background_build_loads_with_weights_only(factory, stop, base):
    # stopped just after a snapshot: the state holds the next build (graph / next epoch's order)
    reference = run(factory(True, 1), base, epochs=2)
    s = factory(True, 1)
    head = run(s, base, epochs=2, stop_after=stop)
    state = reload(s.state_dict())
    assert "next" in state["generator"] or "next_order" in state["generator"]
    fresh = factory(True, 1)
    fresh.source.load_state_dict(s.source.state_dict())
    fresh.load_state_dict(state)
    rest = finish_epoch(fresh, base, stop)
    rest += finish_epoch(fresh, base, stop + len(rest))  # the next epoch, on the next build
    assert head + rest == reference


def test_trainer_with_workers_checkpoints_and_resumes_exactly(tmp_path, one_thread):
    from hardbatch_experiments.datasets import load_digits

    import hardbatch as hb
    from hardbatch.losses import InfoNCE

    x, y = load_digits()
    data = TensorDataset(x[:160])

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(),
                                   torch.nn.Linear(16, 8))

    def trainer(**kw):
        config = TrainConfig(epochs=2, seed=3, progress=False, num_workers=2, **kw)
        return Trainer(model(), InfoNCE(0.5), lambda bank: hb.ProximityGraphSampler(
            bank, 16, candidates=50, neighbors=10, refresh_every=3, seed=1), data,
            augment=lambda v, generator=None: v + 0.05 * torch.randn(v.shape,
                                                                      generator=generator),
            config=config)

    full = trainer().fit()
    ck = tmp_path / "ck.pt"
    # 10 steps per epoch: at step 9 the loader (2 workers x 2) has asked for the whole epoch
    partial = trainer(max_steps=9, checkpoint_path=str(ck), checkpoint_every=3).fit()
    assert partial.steps == 9
    result = trainer(checkpoint_path=str(ck), checkpoint_every=3).fit()
    assert [r["loss"] for r in result.history] == [r["loss"] for r in full.history]
    assert result.last_epoch_batches == full.last_epoch_batches
