"""Run bookkeeping shared by the recipes: skip finished runs, respect live locks, survive failures."""

import json
import os

import pytest

from hardbatch_experiments import runs


def _writer(path, value):
    def run():
        rec = {"accuracy": value}
        runs.write_json_atomic(path, rec)
        return rec
    return run


def test_result_path_names():
    p = runs.result_path("out", "MUTAG", "knn", "dcl", seed=3, tag="e1")
    assert p.as_posix() == "out/MUTAG__knn__dcl__seed3__e1.json"
    assert runs.result_path("o", "a", seed=0).name == "a__seed0.json"


def test_run_exclusive_runs_then_skips(tmp_path):
    path = tmp_path / "r.json"
    rec, failed = runs.run_exclusive(path, _writer(path, 0.5))
    assert rec == {"accuracy": 0.5} and not failed
    assert json.loads(path.read_text()) == {"accuracy": 0.5}
    assert not list(tmp_path.glob(".*.lock"))  # lock released
    rec, failed = runs.run_exclusive(path, _writer(path, 0.9))  # finished: skipped
    assert rec is None and not failed and json.loads(path.read_text())["accuracy"] == 0.5
    rec, _ = runs.run_exclusive(path, _writer(path, 0.9), force=True)
    assert rec == {"accuracy": 0.9}
    # a JSON without the key is not finished
    other = tmp_path / "o.json"
    other.write_text('{"started": 1}')
    assert not runs.finished(other) and runs.finished(other, key="started")


def test_run_exclusive_respects_live_lock_and_takes_over_dead_one(tmp_path):
    path = tmp_path / "r.json"
    lock = tmp_path / ".r.json.lock"
    lock.write_text(str(os.getppid()))  # a live process that is not us
    rec, failed = runs.run_exclusive(path, _writer(path, 1.0))
    assert rec is None and not failed and not path.exists() and lock.exists()
    lock.write_text("999999999")  # no such process: stale lock, taken over
    rec, failed = runs.run_exclusive(path, _writer(path, 1.0))
    assert rec == {"accuracy": 1.0} and not lock.exists()


def test_run_exclusive_failure_and_reraise(tmp_path, capsys):
    path = tmp_path / "r.json"

    def boom():
        raise RuntimeError("diverged")

    rec, failed = runs.run_exclusive(path, boom, prefix="[t]")
    assert rec is None and failed and "[t] FAILED r.json: RuntimeError: diverged" in \
        capsys.readouterr().out
    assert not list(tmp_path.glob(".*.lock"))

    def bad_input():
        raise FileNotFoundError("no data")

    with pytest.raises(FileNotFoundError):
        runs.run_exclusive(path, bad_input, reraise=(FileNotFoundError,))
    assert not list(tmp_path.glob(".*.lock"))


def test_seeds_of():
    import argparse

    ns = argparse.Namespace
    assert runs.seeds_of(ns(seed_list=None, seeds=3)) == [0, 1, 2]
    assert runs.seeds_of(ns(seed_list="4,1,4", seeds=3)) == [4, 1]
    for bad in ("a", "1,-2", ","):
        with pytest.raises(ValueError, match="--seed-list"):
            runs.seeds_of(ns(seed_list=bad, seeds=3))


def test_a_run_finished_under_a_loss_alias_counts_as_finished(tmp_path):
    """SimCLR runs were named with debiased / hard_negative; new runs use dcl / hcl."""
    canonical = runs.result_path(tmp_path, "simclr-mnist", "proximity", "dcl", seed=0)
    assert canonical.name == "simclr-mnist__proximity__dcl__seed0.json"
    assert [p.name for p in runs.stored_paths(canonical)] == [
        canonical.name, "simclr-mnist__proximity__debiased__seed0.json"]
    assert runs.stored_paths(tmp_path / "a__infonce__seed0__dcl.json") == [
        tmp_path / "a__infonce__seed0__dcl.json"]  # a tag after the seed is not a loss name
    assert not runs.finished(canonical, "knn_accuracy")
    old = tmp_path / "simclr-mnist__proximity__debiased__seed0.json"
    old.write_text(json.dumps({"knn_accuracy": 0.9}))
    assert runs.finished(canonical, "knn_accuracy")
    rec, failed = runs.run_exclusive(canonical, _writer(canonical, 0.1), key="knn_accuracy")
    assert rec is None and not failed and not canonical.exists()  # skipped, nothing written
    hcl = runs.result_path(tmp_path, "simclr-mnist", "uniform", "hcl", seed=1, tag="e1")
    (tmp_path / "simclr-mnist__uniform__hard_negative__seed1__e1.json").write_text(
        json.dumps({"knn_accuracy": 0.5}))
    assert runs.finished(hcl, "knn_accuracy")
