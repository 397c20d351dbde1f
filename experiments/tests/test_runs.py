"""Run bookkeeping shared by the recipes: skip finished runs, respect live locks, survive failures."""

import json
import os
import socket
import time

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


# --------------------------------------------------------------------------- issue 17.3


def _lock(tmp_path, **record):
    lock = tmp_path / ".r.json.lock"
    lock.write_text(json.dumps(record))
    return lock


def _parent():
    return os.getppid(), runs.process_start_time(os.getppid())


def test_lock_records_host_pid_and_start_time(tmp_path):
    lock = runs.try_lock(tmp_path / "r.json")
    rec = json.loads(lock.read_text())
    assert rec["host"] == socket.gethostname() and rec["pid"] == os.getpid()
    assert rec["start"] == pytest.approx(runs.process_start_time(os.getpid()))
    assert abs(rec["created"] - time.time()) < 60
    assert runs.try_lock(tmp_path / "r.json") is not None  # our own pid: not a live other run


@pytest.mark.skipif(runs.process_start_time(os.getpid()) is None, reason="needs Linux /proc")
def test_a_reused_pid_does_not_hold_a_lock(tmp_path):
    """After a restart the lock's PID may run another process: it started at another time (or
    after an old-style lock was written), so the lock is stale and the run is not skipped."""
    pid, start = _parent()
    host, now = socket.gethostname(), time.time()
    _lock(tmp_path, host=host, pid=pid, start=start, created=now)
    assert runs.lock_holder(tmp_path / ".r.json.lock").startswith(f"pid {pid} on host {host}")
    assert runs.try_lock(tmp_path / "r.json") is None  # the live writer holds it
    _lock(tmp_path, host=host, pid=pid, start=start - 3600.0, created=now)  # other start time
    assert runs.lock_holder(tmp_path / ".r.json.lock") is None
    rec, _ = runs.run_exclusive(tmp_path / "r.json", _writer(tmp_path / "r.json", 0.7))
    assert rec == {"accuracy": 0.7}
    lock = tmp_path / ".r.json.lock"
    lock.write_text(str(pid))  # old style: only a PID ...
    os.utime(lock, (start - 86400.0, start - 86400.0))  # ... written before that process began
    assert runs.lock_holder(lock) is None
    os.utime(lock, None)  # written after it began: its writer may be alive
    assert runs.lock_holder(lock) is not None


def test_locks_of_other_hosts_and_old_locks_expire(tmp_path):
    now = time.time()
    _lock(tmp_path, host="elsewhere", pid=1, start=None, created=now - 3600)
    assert "on host elsewhere" in runs.lock_holder(tmp_path / ".r.json.lock")
    _lock(tmp_path, host="elsewhere", pid=1, start=None, created=now - runs.REMOTE_LOCK_AGE_S - 1)
    assert runs.lock_holder(tmp_path / ".r.json.lock") is None
    pid, start = _parent()
    _lock(tmp_path, host=socket.gethostname(), pid=pid, start=start,
          created=now - runs.LOCK_MAX_AGE_S - 1)
    assert runs.lock_holder(tmp_path / ".r.json.lock") is None


def test_grid_tally_lists_missing_runs_and_exits_non_zero(tmp_path, capsys):
    """A run held by a live process is skipped but missing at the end: exit code 1; the
    summary line counts ran / skipped / failed / missing."""
    held, fine, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    _lock(tmp_path, host="elsewhere", pid=1, start=None, created=time.time())
    (tmp_path / ".r.json.lock").rename(tmp_path / ".a.json.lock")

    def run(name, path):
        if name == "c":
            raise RuntimeError("diverged")
        return _writer(path, 0.5)()

    tally = runs.run_grid([("a",), ("b",), ("c",)], lambda n: tmp_path / f"{n}.json", run,
                          lambda n, rec: f"{n} ok", key="accuracy", force=False, prefix="[t]")
    tally.skipped += 2
    assert (tally.ran, tally.failed, tally.missing) == (1, 1, [held, bad]) and fine.exists()
    assert tally.exit_code == 1
    out = capsys.readouterr().out
    assert "[t] [1/3] a.json ..." in out and "[t] [3/3] c.json ..." in out
    lines = tally.summary("[t]").splitlines()
    assert lines[0].startswith("[t] done: 1 ran, 2 skipped (finished before), 1 failed, "
                               "2 missing, wall ")
    assert "missing a.json (running elsewhere: pid 1 on host elsewhere" in lines[1]
    assert lines[2] == "[t]   missing c.json"
    assert runs.GridTally(ran=2).exit_code == 0
