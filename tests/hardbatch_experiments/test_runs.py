"""Run bookkeeping shared by the recipes: skip finished runs, respect live locks, survive failures."""

import json
import os

import pytest

from hardbatch.recipes import _runs


def _writer(path, value):
    def run():
        rec = {"accuracy": value}
        _runs.write_json_atomic(path, rec)
        return rec
    return run


def test_result_path_names():
    p = _runs.result_path("out", "MUTAG", "knn", "dcl", seed=3, tag="e1")
    assert p.as_posix() == "out/MUTAG__knn__dcl__seed3__e1.json"
    assert _runs.result_path("o", "a", seed=0).name == "a__seed0.json"


def test_run_exclusive_runs_then_skips(tmp_path):
    path = tmp_path / "r.json"
    rec, failed = _runs.run_exclusive(path, _writer(path, 0.5))
    assert rec == {"accuracy": 0.5} and not failed
    assert json.loads(path.read_text()) == {"accuracy": 0.5}
    assert not list(tmp_path.glob(".*.lock"))  # lock released
    rec, failed = _runs.run_exclusive(path, _writer(path, 0.9))  # finished: skipped
    assert rec is None and not failed and json.loads(path.read_text())["accuracy"] == 0.5
    rec, _ = _runs.run_exclusive(path, _writer(path, 0.9), force=True)
    assert rec == {"accuracy": 0.9}
    # a JSON without the key is not finished
    other = tmp_path / "o.json"
    other.write_text('{"started": 1}')
    assert not _runs.finished(other) and _runs.finished(other, key="started")


def test_run_exclusive_respects_live_lock_and_takes_over_dead_one(tmp_path):
    path = tmp_path / "r.json"
    lock = tmp_path / ".r.json.lock"
    lock.write_text(str(os.getppid()))  # a live process that is not us
    rec, failed = _runs.run_exclusive(path, _writer(path, 1.0))
    assert rec is None and not failed and not path.exists() and lock.exists()
    lock.write_text("999999999")  # no such process: stale lock, taken over
    rec, failed = _runs.run_exclusive(path, _writer(path, 1.0))
    assert rec == {"accuracy": 1.0} and not lock.exists()


def test_run_exclusive_failure_and_reraise(tmp_path, capsys):
    path = tmp_path / "r.json"

    def boom():
        raise RuntimeError("diverged")

    rec, failed = _runs.run_exclusive(path, boom, prefix="[t]")
    assert rec is None and failed and "[t] FAILED r.json: RuntimeError: diverged" in \
        capsys.readouterr().out
    assert not list(tmp_path.glob(".*.lock"))

    def bad_input():
        raise FileNotFoundError("no data")

    with pytest.raises(FileNotFoundError):
        _runs.run_exclusive(path, bad_input, reraise=(FileNotFoundError,))
    assert not list(tmp_path.glob(".*.lock"))


def test_expand_choices_and_seeds_of():
    import argparse

    allowed = ("uniform", "knn", "gcbs")
    assert _runs.expand_choices("all", allowed, "sampler") == list(allowed)
    assert _runs.expand_choices(" KNN,uniform,knn ", allowed, "sampler") == ["knn", "uniform"]
    for bad in ("bfs", ",", "knn,bfs"):
        with pytest.raises(ValueError, match="--sampler"):
            _runs.expand_choices(bad, allowed, "sampler")
    ns = argparse.Namespace
    assert _runs.seeds_of(ns(seed_list=None, seeds=3)) == [0, 1, 2]
    assert _runs.seeds_of(ns(seed_list="4,1,4", seeds=3)) == [4, 1]
    for bad in ("a", "1,-2", ","):
        with pytest.raises(ValueError, match="--seed-list"):
            _runs.seeds_of(ns(seed_list=bad, seeds=3))
