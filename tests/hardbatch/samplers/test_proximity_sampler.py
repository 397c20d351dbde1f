"""ProximityGraphSampler: walks on a proximity (or exact kNN) graph; restart, arguments, devices."""

import itertools

import numpy as np
import pytest
import torch
from sampler_support import B, LIVE_B, LIVE_D, LIVE_N, N
from support import unit_rows

import hardbatch as hb
from hardbatch.samplers import ProximityGraphSampler


def test_linear_decay_schedule_progress(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=hb.LinearDecay(0.2, 0.05), epochs=2)
    assert s.restart_at(0, 0) == pytest.approx(0.2)
    assert s.restart_at(1, 0) == pytest.approx(0.125)
    assert s.restart_at(1, len(s)) == pytest.approx(0.05)
    sched = hb.LinearDecay(0.2, 0.05, total_steps=10)
    s2 = hb.ProximityGraphSampler(emb, B, 200, 20, restart=sched)
    assert s2.restart_at(0, 5) == pytest.approx(0.125)
    with pytest.raises(ValueError, match="pass epochs=.* or total_steps"):
        hb.ProximityGraphSampler(emb, B, 200, 20, restart=hb.LinearDecay())
    with pytest.raises(ValueError, match="start=1.5 must lie in"):
        hb.LinearDecay(1.5, 0.1)


def test_epoch_step_decay_is_the_released_code_schedule(emb):
    """alpha = max(0.05, 0.2 - 0.02 * epoch) per epoch, no epochs= needed; an epoch's batches
    equal those of a constant restart with that epoch's alpha."""
    sched = hb.EpochStepDecay()
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=sched, refresh_every=None, seed=4)
    for epoch in (0, 1, 3, 7, 8, 30):
        want = max(0.05, 0.2 - 0.02 * epoch)
        assert s.restart_at(epoch, 0) == s.restart_at(epoch, len(s) - 1) == pytest.approx(want)
    for epoch in (2, 9):
        const = hb.ProximityGraphSampler(emb, B, 200, 20, restart=sched.at_epoch(epoch),
                                         refresh_every=None, seed=4)
        s.set_epoch(epoch)
        const.set_epoch(epoch)
        assert [list(b) for b in s] == [list(b) for b in const]
    with pytest.raises(ValueError, match="floor=1.0 must lie in"):
        hb.EpochStepDecay(floor=1.0)
    with pytest.raises(ValueError, match="step=-0.1 must be >= 0"):
        hb.EpochStepDecay(step=-0.1)


def test_coverage_and_fresh_starts(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=0.2)
    seen = set()
    for batch in s:
        if len(seen) < N:
            assert batch[0] not in seen  # start node drawn from unseen items
        seen.update(batch)
        assert s.coverage == pytest.approx(len(seen) / N)


@pytest.mark.parametrize("factory,match", [
    (lambda e: hb.ProximityGraphSampler(e, B, candidates=100, neighbors=100), "neighbors=100 must be smaller than candidates=100"),
    (lambda e: hb.ProximityGraphSampler(e, B, candidates=N, neighbors=10), "candidates=1000 must be smaller than the number of items N=1000"),
    (lambda e: hb.ProximityGraphSampler(e, N + 1), "batch_size=1001 is larger"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, walk="levy"), "walk='levy' must be one of"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, graph="hnsw"), "graph='hnsw' must be"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=-0.1), "restart=-0.1 must lie in"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, refresh_every=0), "refresh_every=0 must be >= 1"),
    (lambda e: hb.ProximityGraphSampler(np.full((20, 3), np.nan), 4, 10, 5), "NaN or inf"),
    (lambda e: hb.ProximityGraphSampler(e[0], 4, 10, 5), "2-D"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=1.0),
     r"restart=1.0 must lie in \[0, 1\).*KNNBatchSampler"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=1),
     r"restart=1.0 must lie in \[0, 1\)"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=True),
     "restart must be a number in \\[0, 1\\) or a schedule"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart="0.2"), "restart must be a number"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=hb.LinearDecay(1.0, 0.05), epochs=2),
     r"LinearDecay\(...\) start=1.0 must lie in \[0, 1\).*KNNBatchSampler"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, restart=hb.LinearDecay(0.2, 1.0), epochs=2),
     r"LinearDecay\(...\) end=1.0 must lie in \[0, 1\)"),
    (lambda e: hb.LinearDecay(total_steps=True),
     "LinearDecay total_steps must be an integer, got True"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, group_size=10**6),
     "group_size=1000000 must be <= 800"),
    (lambda e: hb.ProximityGraphSampler(e, B, 200, 20, group_size=0), "group_size=0 must be >= 1"),
    (lambda e: hb.ProximityGraphSampler(e[:50], 16, 1000, 60),
     "candidates=1000 must be smaller than the number of items N=50; lower neighbors below "
     "N - 1 = 49"),
    (lambda e: hb.ProximityGraphSampler(e, 300, 200, 20, drop_last=True, world_size=4, rank=0),
     "drop_last=True leaves 3 full batch"),
    (lambda e: ProximityGraphSampler(hb.EmbeddingBank(LIVE_N, LIVE_D), LIVE_B, 100, 10,
                                     refresh_every=4, precision="fp8"), "precision='fp8' must be"),
    (lambda e: ProximityGraphSampler(hb.EmbeddingBank(LIVE_N, LIVE_D), LIVE_B, 100, 10,
                                     refresh_every=4, device="nodevice"), "device='nodevice' is not a torch device"),
])
def test_bad_input_raises_clear_errors(emb, factory, match):
    with pytest.raises(ValueError, match=match):
        factory(emb)


def test_group_size_with_the_knn_graph_warns_that_it_is_ignored(emb):
    with pytest.warns(UserWarning, match="group_size=10 shapes the candidate pools of "
                                         "graph='proximity'; graph='knn' has none"):
        s = hb.ProximityGraphSampler(emb, B, neighbors=20, graph="knn", group_size=10, seed=1)
    ref = hb.ProximityGraphSampler(emb, B, neighbors=20, graph="knn", seed=1)
    assert list(itertools.islice(s, 3)) == list(itertools.islice(ref, 3))
    with pytest.warns(UserWarning, match="candidates=200 shapes the candidate pools of "
                                         "graph='proximity'; graph='knn' has none and ignores "
                                         r"it \(drop candidates\)"):  # was silent
        s = hb.ProximityGraphSampler(emb, B, 200, 20, graph="knn", seed=1)
    assert list(itertools.islice(s, 3)) == list(itertools.islice(ref, 3))


def test_refresh_lag_without_refreshes_warns_that_it_does_nothing(emb):
    with pytest.warns(UserWarning, match=r"refresh_lag=2 \(or background=True\) pipelines the "
                                         r"refreshes, but refresh_every=None never refreshes"):
        hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=None, refresh_lag=2)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hb.ProximityGraphSampler(emb, B, 200, 20, refresh_every=10, refresh_lag=2)


# -- restart: numbers of any kind, never 1 ----------------------------------------------------

@pytest.mark.parametrize("alpha", [np.float32(0.3), np.float64(0.3), torch.tensor(0.3),
                                   np.array(0.3, np.float32), 0])
def test_restart_accepts_real_scalars(emb, alpha):
    ref = hb.ProximityGraphSampler(emb, B, 200, 20, restart=float(alpha), seed=6)
    got = hb.ProximityGraphSampler(emb, B, 200, 20, restart=alpha, seed=6)
    assert list(itertools.islice(got, 4)) == list(itertools.islice(ref, 4))


def test_restart_schedule_reaching_one_is_reported_when_used(emb):
    s = hb.ProximityGraphSampler(emb, B, 200, 20, restart=lambda p: 0.5 + p, epochs=1)
    with pytest.raises(ValueError, match=r"restart \(schedule value at progress 0.5\)=1.0 must "
                                         r"lie in \[0, 1\)"):
        list(s)  # progress 0, 1/16, ..., 8/16 = 0.5 reaches alpha = 1


def test_a_custom_restart_schedule_resumes_in_another_process(emb):
    """The state recorded restart by repr, which for a function holds its memory address: the
    same job restarted (a new function object) refused its own state."""
    def schedule():
        def decay(progress):
            return 0.3 - 0.1 * progress
        return decay

    first = hb.ProximityGraphSampler(emb, B, 200, 20, restart=schedule(), epochs=2, seed=1)
    head = list(itertools.islice(first, 2))
    state = first.state_dict()
    assert state["restart"].endswith("schedule.<locals>.decay") and "0x" not in state["restart"]
    again = hb.ProximityGraphSampler(emb, B, 200, 20, restart=schedule(), epochs=2, seed=1)
    again.load_state_dict(state)  # was: "state was saved with restart='<function ... at 0x..>'"
    ref = hb.ProximityGraphSampler(emb, B, 200, 20, restart=schedule(), epochs=2, seed=1)
    assert head + list(again) == list(ref)


@pytest.mark.parametrize("n,k", [(50, 10), (50, 40), (30, 28), (1000, 20)])
def test_candidates_hint_is_a_valid_value(emb, n, k):
    with pytest.raises(ValueError, match="lower candidates") as err:
        hb.ProximityGraphSampler(emb[:n], 8, n, k)
    suggested = int(str(err.value).split("(e.g. ")[1].rstrip(")"))
    assert k < suggested < n
    hb.ProximityGraphSampler(emb[:n], 8, suggested, k)  # accepted


# -- devices and precision ---------------------------------------------------------------------

def test_device_argument_gives_the_same_graph(rng):
    x = unit_rows(rng, 600, 16)
    ref = hb.proximity_graph(x, 100, 10, seed=4)
    assert torch.equal(hb.proximity_graph(x, 100, 10, seed=4, device="cpu"), ref)
    assert torch.equal(hb.knn_graph(x, 10, device=torch.device("cpu")), hb.knn_graph(x, 10))
    if torch.cuda.is_available():  # not exercised on the CPU-only CI machine
        cuda = hb.proximity_graph(x, 100, 10, seed=4, device="cuda")
        assert (cuda == ref).float().mean() > 0.99


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_graphs_close_to_fp32(rng, precision):
    try:
        torch.ones(2, 2, dtype=torch.bfloat16 if precision == "bf16" else torch.float16) @ \
            torch.ones(2, 2, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    except RuntimeError:
        pytest.skip(f"{precision} matmul not supported on this CPU build")
    x = unit_rows(rng, 1000, 32)
    for build in (lambda **kw: hb.proximity_graph(x, 200, 20, seed=1, **kw),
                  lambda **kw: hb.knn_graph(x, 20, **kw)):
        ref, half = build().numpy(), build(precision=precision).numpy()
        # Same neighbour sets up to near-ties; neighbour similarity within 0.5%.
        overlap = np.mean([len(set(a) & set(b)) / 20 for a, b in zip(ref, half)])
        assert overlap > 0.9
        sim = lambda g: np.einsum("nd,nkd->nk", x, x[g]).mean()
        assert abs(sim(half) / sim(ref) - 1) < 0.005


@pytest.mark.parametrize("method", ["faiss", "faiss-ivf"])
def test_faiss_knn_graph(rng, method):
    pytest.importorskip("faiss")
    x = unit_rows(rng, 2000, 16)
    ref = hb.knn_graph(x, 10).numpy()
    got = hb.knn_graph(x, 10, method=method, nlist=16, nprobe=8).numpy()
    assert got.shape == ref.shape and (got != np.arange(2000)[:, None]).all()
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ref, got)])
    assert recall > (0.999 if method == "faiss" else 0.9)


def test_proximity_sampler_accepts_device_and_precision(rng):
    x = unit_rows(rng, 400, 16)
    ref = list(ProximityGraphSampler(x, 16, 60, 8, refresh_every=None, seed=2))
    assert list(ProximityGraphSampler(x, 16, 60, 8, refresh_every=None, seed=2,
                                      device="cpu")) == ref
    half = list(ProximityGraphSampler(x, 16, 60, 8, refresh_every=None, seed=2, precision="bf16"))
    assert len(half) == len(ref) and all(len(set(b)) == 16 for b in half)


@pytest.mark.parametrize("make, match", [
    (lambda: hb.EpochStepDecay(step="0.02"), r"EpochStepDecay step must be a number >= 0, "
                                             r"got '0.02'"),  # was a TypeError at the 1st batch
    (lambda: hb.EpochStepDecay(start="0.2"), r"EpochStepDecay start must be a number in \[0, 1\)"),
    (lambda: hb.EpochStepDecay(floor=1.0), r"EpochStepDecay floor=1.0 must lie in \[0, 1\)"),
    (lambda: hb.LinearDecay(start="0.2"), r"LinearDecay start must be a number in \[0, 1\]"),
    (lambda: hb.LinearDecay(end=1.5), r"LinearDecay end=1.5 must lie in \[0, 1\]"),
    (lambda: hb.LinearDecay(total_steps=2.5), r"LinearDecay total_steps must be an integer, "
                                              r"got 2.5"),  # was accepted, used as a float
    (lambda: hb.LinearDecay(total_steps=0), r"LinearDecay total_steps=0 must be >= 1"),
])
def test_schedules_refuse_what_is_not_a_number(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_schedules_take_numpy_numbers():
    assert hb.LinearDecay(np.float32(0.2), 0.05, total_steps=np.int64(10))(1.0) == \
        pytest.approx(0.05)
    assert hb.EpochStepDecay(np.float64(0.2), 0.02, 0.05).at_epoch(1) == pytest.approx(0.18)
