"""GraphCL sampler options (issue 18): sampler space, uniform warm-up, per-epoch restart
schedule, coverage epochs; their run tags; the pairing of the uniform and hard arms."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("sklearn")

from hardbatch import EpochStepDecay, ProximityGraphSampler
from hardbatch_experiments.recipes import graphcl
from hardbatch_experiments.recipes.graphcl.sampling import (
    CoverageProximitySampler,
    centred,
    check_options,
    encode_space,
    restart_schedule,
)


def _clusters(n: int = 300, d: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(6, d, generator=g) * 3
    return centres[torch.arange(n) % 6] + torch.randn(n, d, generator=g)


def _args(*extra: str):
    return graphcl.build_parser().parse_args(["--dataset", "MUTAG", *extra])


def test_tags_name_options_of_the_hard_sampler_only():
    hyper = graphcl.hyper_for("MUTAG")
    base = _args()
    assert all(graphcl.run_tag(base, hyper, s) == "" for s in ("uniform", "proximity", "knn"))
    args = _args("--sampler-space", "centred-readout", "--warmup-epochs", "2",
                 "--alpha-schedule", "per-epoch", "--epoch-mode", "coverage")
    assert graphcl.run_tag(args, hyper, "proximity") == "scentred-w2-aepoch-cover"
    assert graphcl.run_tag(args, hyper) == "scentred-w2-aepoch-cover"
    assert graphcl.run_tag(args, hyper, "uniform") == ""  # one baseline for every config
    assert graphcl.run_tag(_args("--sampler-space", "projection"), hyper, "knn") == "sproj"
    assert graphcl.run_tag(_args("--epochs", "3", "--warmup-epochs", "1"), hyper,
                           "proximity") == "e3-w1"


def test_option_checks_name_the_parameter():
    check_options(_args("--epoch-mode", "coverage"), ["uniform", "proximity"], 20)
    with pytest.raises(ValueError, match="--epoch-mode coverage applies to the proximity"):
        check_options(_args("--epoch-mode", "coverage"), ["proximity", "knn"], 20)
    with pytest.raises(ValueError, match="--alpha-schedule per-epoch"):
        check_options(_args("--alpha-schedule", "per-epoch"), ["gcbs"], 20)
    with pytest.raises(ValueError, match="--warmup-epochs 21"):
        check_options(_args("--warmup-epochs", "21"), ["proximity"], 20)
    with pytest.raises(ValueError, match="--warmup-epochs -1"):
        check_options(_args("--warmup-epochs", "-1"), ["proximity"], 20)


def test_per_epoch_alpha_is_the_authors_step_function():
    sched, record = restart_schedule({"alpha_schedule": "per-epoch"})
    assert record == {"schedule": "per-epoch", "start": 0.2, "step": 0.02, "floor": 0.05}
    expected = [max(0.05, 0.2 - 0.02 * e) for e in range(20)]
    assert [sched.at_epoch(e) for e in range(20)] == pytest.approx(expected)
    assert sched.at_epoch(3) == pytest.approx(0.14) and sched.at_epoch(19) == 0.05
    # through the library sampler and the coverage sampler: every batch of epoch e walks with
    # the epoch's alpha
    x = _clusters(100)
    s = ProximityGraphSampler(x, 16, candidates=40, neighbors=10, restart=sched, epochs=20,
                              seed=0)
    c = CoverageProximitySampler(x, 16, candidates=40, neighbors=10, restart=sched, seed=0,
                                 budget=200)
    for e in range(20):
        for i in range(s.batches_per_epoch):
            assert s.restart_at(e, i) == pytest.approx(expected[e])
            assert c.restart_at(e, i) == pytest.approx(expected[e])


def test_coverage_epochs_cover_every_item_within_the_budget():
    n, b, epochs, t = 300, 16, 4, 7
    x = _clusters(n)
    budget = epochs * -(-n // b)  # 76: the uniform run's steps
    s = CoverageProximitySampler(x, b, candidates=60, neighbors=10, restart=0.1,
                                 refresh_every=t, epochs=epochs, seed=3, budget=budget)
    lengths, total = [], 0
    for e in range(100):
        s.set_epoch(e)
        batches = list(s)
        if not batches:
            break
        total += len(batches)
        lengths.append(len(batches))
        assert all(len(set(bt)) == b for bt in batches)  # walks of B distinct items
        if total < budget:  # a complete coverage epoch: every item, and it stops right there
            assert len(set(np.concatenate(batches).tolist())) == n
            assert len(set(np.concatenate(batches[:-1]).tolist())) < n
    assert total == budget and sum(lengths) == budget
    assert lengths[0] > -(-n // b)  # more walks per epoch than ceil(N/B)
    # graph refreshes count the batches drawn: every t of them, as in steps mode
    assert s.refresh_policy.refreshes == -(-budget // t)
    # the plain sampler covers fewer items per epoch
    plain = ProximityGraphSampler(x, b, candidates=60, neighbors=10, restart=0.1,
                                  refresh_every=t, epochs=epochs, seed=3)
    plain.set_epoch(0)
    assert len(set(np.concatenate(list(plain)).tolist())) < n
    with pytest.raises(ValueError, match="budget=0"):
        CoverageProximitySampler(x, b, restart=0.1, candidates=60, neighbors=10, budget=0)


def test_coverage_linear_schedule_reads_batches_over_budget():
    from hardbatch import LinearDecay

    x = _clusters(120)
    s = CoverageProximitySampler(x, 16, candidates=40, neighbors=10,
                                 restart=LinearDecay(0.2, 0.05), epochs=2, seed=0, budget=16)
    assert s.restart_at(0, 0) == pytest.approx(0.2)
    s.offset = 8
    assert s.restart_at(5, 4) == pytest.approx(0.2 - 0.15 * 12 / 16)
    p = CoverageProximitySampler(x, 16, candidates=40, neighbors=10, restart=EpochStepDecay(),
                                 epochs=2, seed=0, budget=16)
    assert p.restart_at(4, 3) == pytest.approx(0.12)  # the epoch's, whatever the progress


def test_space_helpers():
    model = graphcl.GraphCL(3)
    h = torch.randn(5, model.encoder.out_dim)
    assert torch.equal(encode_space(model, h, "readout"), h)
    assert torch.allclose(encode_space(model, h, "projection"), model.proj_head(h))
    c = centred(h)
    assert torch.allclose(c.mean(0), torch.zeros(h.shape[1]), atol=1e-6)
    assert torch.allclose(c, h - h.mean(0))


def _run(data_root, tmp_path, *extra: str) -> dict:
    out = tmp_path / "res"
    argv = ["--dataset", "MUTAG", "--data-dir", str(data_root), "--cache-dir",
            str(tmp_path / "cache"), "--loss", "infonce", "--seed-list", "3", "--epochs", "2",
            "--out", str(out), *extra]
    assert graphcl.main(argv) == 0
    return {f.name: json.loads(f.read_text()) for f in out.glob("*.json")}


def test_full_warmup_reproduces_the_uniform_arm(data_root, tmp_path):
    """Pairing: seed k has the same initial weights, augmentation stream and CV folds in every
    arm, so a proximity run whose whole training is uniform warm-up IS the uniform run."""
    recs = _run(data_root, tmp_path, "--sampler", "uniform,proximity", "--warmup-epochs", "2",
                "--sampler-space", "projection")
    uni = recs["MUTAG__uniform__infonce__seed3__e2.json"]
    hard = recs["MUTAG__proximity__infonce__seed3__e2-sproj-w2.json"]
    assert hard["trace"]["loss"] == uni["trace"]["loss"]
    assert hard["fold_accuracies"] == uni["fold_accuracies"]
    assert hard["config"]["sampler_options"]["warmup_epochs"] == 2
    assert "sampler_options" not in uni["config"]


def test_warmup_then_hard_sampler(data_root, tmp_path):
    recs = _run(data_root, tmp_path, "--sampler", "uniform,proximity", "--warmup-epochs", "1",
                "--sampler-space", "centred-readout")
    uni = recs["MUTAG__uniform__infonce__seed3__e2.json"]
    hard = recs["MUTAG__proximity__infonce__seed3__e2-scentred-w1.json"]
    k = uni["epoch_steps"][0]
    assert hard["trace"]["loss"][:k] == uni["trace"]["loss"][:k]  # epoch 0: the same batches
    assert hard["trace"]["loss"][k:] != uni["trace"]["loss"][k:]
    assert hard["steps"] == uni["steps"] == 4 and hard["epoch_coverage"][0] == 1.0


def test_coverage_run_keeps_the_step_budget(data_root, tmp_path):
    recs = _run(data_root, tmp_path, "--sampler", "proximity", "--epoch-mode", "coverage",
                "--alpha-schedule", "per-epoch")
    (rec,) = recs.values()
    assert rec["tag"] == "e2-aepoch-cover"
    assert rec["steps"] == rec["config"]["step_budget"] == 4 == sum(rec["epoch_steps"])
    assert rec["epoch_coverage"][0] == 1.0 or rec["epoch_steps"][0] == 4
    assert rec["config"]["restart"]["schedule"] == "per-epoch"
