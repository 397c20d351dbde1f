"""Batch-size sweep options of ``hardbatch bench simclr`` (issue 21): image budget, lr rule,
fixed reference encoder file, pairing fingerprints (recipes/simclr_budget.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hardbatch_experiments.recipes import simclr_budget as budget


def test_scaled_lr_rules():
    assert budget.scaled_lr(1e-3, 64, "fixed") == 1e-3
    assert budget.scaled_lr(1e-3, 64, "sqrt", 256) == pytest.approx(5e-4)
    assert budget.scaled_lr(1e-3, 32, "sqrt", 256) == pytest.approx(1e-3 / math.sqrt(8))
    assert budget.scaled_lr(2e-3, 512, "sqrt", 128) == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="lr_rule"):
        budget.scaled_lr(1e-3, 64, "linear")
    with pytest.raises(ValueError, match="lr="):
        budget.scaled_lr(0.0, 64, "sqrt")


def test_plan_steps_fixed_image_budget():
    # 10 epochs of 8192 images: steps scale as 1 / B, whole epochs at every B
    assert [budget.plan_steps(81920, b, 8192) for b in (32, 64, 128, 256)] == [
        (2560, 10), (1280, 10), (640, 10), (320, 10)]
    assert budget.plan_steps(20480, 64, 8192) == (320, 3)  # 2.5 epochs: the last one partial
    assert budget.plan_steps(1000, 300, 1000) == (4, 1)  # 4 steps, 4 per epoch
    with pytest.raises(ValueError, match="images"):
        budget.plan_steps(0, 32, 100)


def test_reference_file_round_trip_and_wrong_subset(tmp_path):
    ids = torch.tensor([3, 5, 9, 11])
    emb = torch.randn(4, 6)
    path = budget.save_reference(tmp_path / "ref.pt", emb, ids, {"what": "test encoder"})
    x, info = budget.load_reference_file(path, ids)
    assert torch.allclose(x, emb) and info["meta"]["what"] == "test encoder"
    assert info["shape"] == [4, 6] and len(info["sha256"]) == 16
    with pytest.raises(ValueError, match="--reference .*another training subset"):
        budget.load_reference_file(path, torch.tensor([3, 5, 9, 12]))
    with pytest.raises(FileNotFoundError, match="--reference"):
        budget.load_reference_file(tmp_path / "nope.pt", ids)
    with pytest.raises(ValueError, match="must end in .pt"):
        budget.save_reference(tmp_path / "ref.npy", emb, ids, {})


def _run(data_root, out, *extra):
    from hardbatch.cli import main

    args = ["bench", "simclr", "--dataset", "mnist", "--data-dir", str(data_root),
            "--train-size", "256", "--test-size", "100", "--candidates", "50", "--neighbors",
            "10", "--lr-rule", "sqrt", "--out", str(out), *extra]
    assert main(args) == 0


def _records(out):
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def test_bench_simclr_budget_pairing_and_fixed_reference(data_root, tmp_path):
    ref = tmp_path / "ref" / "reference.pt"
    _run(data_root, tmp_path / "ref", "--sampler", "uniform", "--batch-size", "64", "--images",
         "128", "--seed-list", "100", "--save-reference", str(ref))
    blob = torch.load(ref, weights_only=True)
    assert blob["embeddings"].shape == (256, 128) and "uniform + infonce" in blob["meta"]["what"]
    out = tmp_path / "sweep"
    for b in ("32", "64"):
        _run(data_root, out, "--sampler", "uniform,proximity", "--batch-size", b, "--images",
             "128", "--seed-list", "0", "--reference", str(ref))
    recs = _records(out)
    assert len(recs) == 4 and all("_i128_" in n and n.endswith("_lrsqrt256.json") for n in recs)
    by = {(r["sampler"], r["config"]["batch_size"]): r for r in recs.values()}
    for (sampler, b), r in by.items():
        assert r["steps"] == 128 // b and r["images_seen"] == 128  # steps = images / B
        assert r["config"]["lr"] == pytest.approx(1e-3 * math.sqrt(b / 256))
        assert r["config"]["sampler"]["restart"]["total_steps"] == 128 // b
        diag = r["reference_diagnostics"]
        assert diag["file"]["path"] == str(ref) and "fixed reference file" in diag["embedding"]
        trace = r["trace"]["reference_hardness"]
        assert diag["mean_hardness"] == pytest.approx(sum(trace) / len(trace))
    # pairing: one initialisation and one evaluation split for seed 0 in every arm and B; the
    # same augmentation random numbers for both samplers at the same B
    assert len({r["pairing"]["initial_weights"] for r in recs.values()}) == 1
    assert len({(r["pairing"]["train_ids"], r["pairing"]["test_ids"]) for r in recs.values()}) == 1
    assert len({r["evals"][0]["knn_accuracy"] for r in recs.values()}) == 1  # step-0 accuracy
    # (every image draws the same random numbers: at one image budget the generator ends in
    # the same state at every B too)
    assert len({r["pairing"]["augment_generator_end"] for r in recs.values()}) == 1
    other = tmp_path / "other"
    _run(data_root, other, "--sampler", "uniform", "--batch-size", "32", "--images", "96",
         "--seed-list", "0")
    (rec,) = _records(other).values()
    assert rec["pairing"]["initial_weights"] == by[("uniform", 32)]["pairing"]["initial_weights"]
    assert (rec["pairing"]["augment_generator_end"]
            != by[("uniform", 32)]["pairing"]["augment_generator_end"])  # fewer draws
    assert "untrained network" in rec["reference_diagnostics"]["embedding"]


def test_bench_simclr_budget_bad_input(data_root, tmp_path, capsys):
    from hardbatch.cli import main

    base = ["bench", "simclr", "--dataset", "mnist", "--data-dir", str(data_root),
            "--train-size", "128", "--test-size", "50", "--batch-size", "32", "--sampler",
            "uniform", "--out", str(tmp_path)]
    wrong = tmp_path / "wrong.pt"
    budget.save_reference(wrong, torch.randn(100, 4), torch.arange(100), {})
    assert main(base + ["--images", "64", "--reference", str(wrong)]) == 2
    assert "--reference" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--images", "0"])
    assert "--images" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--lr-rule", "linear"])
    assert "--lr-rule" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def test_bench_simclr_guided_false_negatives(data_root, tmp_path, capsys):
    """--guide FILE: Trainer(guide=) masks pairs whose guide cosine exceeds 1 - margin; the
    run's tag and record name the guide, and its margin is checked."""
    ref = tmp_path / "ref" / "reference.pt"
    _run(data_root, tmp_path / "ref", "--sampler", "uniform", "--batch-size", "64", "--images",
         "128", "--seed-list", "100", "--save-reference", str(ref))
    out = tmp_path / "guided"
    _run(data_root, out, "--sampler", "uniform", "--batch-size", "32", "--images", "96",
         "--seed-list", "0", "--guide", str(ref), "--guide-margin", "0.3")
    (name, rec), = _records(out).items()
    assert "_guide0.3" in name and rec["config"]["guide"]["margin"] == 0.3
    assert rec["config"]["guide"]["path"] == str(ref)
    from hardbatch.cli import main

    assert main(["bench", "simclr", "--dataset", "mnist", "--data-dir", str(data_root),
                 "--train-size", "256", "--test-size", "100", "--batch-size", "32",
                 "--sampler", "uniform", "--images", "64", "--out", str(tmp_path / "bad"),
                 "--guide", str(ref), "--guide-margin", "0"]) == 2
    assert "guide_margin=0" in capsys.readouterr().err
