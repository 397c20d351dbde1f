"""``scripts/gpu_check.sh --smoke``: the GPU check's code paths, tiny, on the CPU.

The full check runs on a GPU machine when one is lent (benchmarks/results/gpu_check.md); this
test keeps its script, its sections and its summary from rotting on machines without one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest
from support import REPO, shared_data_root

pytestmark = pytest.mark.slow


def test_gpu_check_smoke_runs_every_section(tmp_path):
    root = shared_data_root()
    if root is None:
        pytest.skip("real data not found: set HARDBATCH_DATA to the shared/data folder")
    env = dict(os.environ, OUT=str(tmp_path), PAIRS=str(root / "code" / "valid.jsonl.gz"))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for section in ("tests", "proximity", "knn", "dist", "st", "gcbs"):
        record = json.loads((tmp_path / f"gpu_{section}.json").read_text())
        assert record["ok"] and record["smoke"] and record["rows"], section
    summary = (tmp_path / "gpu_check.md").read_text()
    assert summary.count("(ok,") == 6 and "smoke sizes on CPU" in summary
    dist = {r["what"]: r for r in json.loads((tmp_path / "gpu_dist.json").read_text())["rows"]}
    for name in ("plain", "gradcache"):  # the first step apart, then the median of warm steps
        assert dist[f"{name} first step"]["seconds"] >= 0
        assert dist[f"{name} step"]["statistic"] == "median" and dist[f"{name} step"]["steps"] >= 3
    ratio = dist["GradCache step / plain step (issue 46 target: <= 2)"]["ratio"]
    assert ratio == pytest.approx(dist["gradcache step"]["seconds"] / dist["plain step"]["seconds"],
                                  rel=0.05, abs=0.01)
    exact = dist["GradCache vs plain gradients"]
    assert exact["grad_max_abs_diff"] <= 1e-5 * max(exact["grad_max_abs"], 1e-12)


def test_smoke_without_out_leaves_the_tracked_results_alone(tmp_path):
    """``--smoke`` without ``OUT``: the CPU figures go to a new temporary folder (printed),
    never over the tracked GPU results in benchmarks/results. Run on a copy of the two scripts
    (one section), so that a regression cannot overwrite this checkout's results."""
    root = tmp_path / "repo"
    for rel in ("scripts/gpu_check.sh", "benchmarks/gpu_check.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    results = root / "benchmarks" / "results"
    results.mkdir()
    (results / "gpu_dist.json").write_text("the H100 figures\n")
    (tmp_path / "tmp").mkdir()
    with socket.socket() as s:  # a free port for the section's one-rank process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(TMPDIR=str(tmp_path / "tmp"), SECTIONS="dist", MASTER_PORT=str(port),
               MINILM=str(tmp_path), PYTHONPATH=os.pathsep.join(
                   [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in results.iterdir()) == ["gpu_dist.json"]
    assert (results / "gpu_dist.json").read_text() == "the H100 figures\n"
    (out,) = (tmp_path / "tmp").glob("gpu_check_smoke.*")
    assert f"summary: {out}/gpu_check.md" in proc.stdout
    record = json.loads((out / "gpu_dist.json").read_text())
    assert record["ok"] and record["smoke"] and record["rows"]
    assert "## dist (ok," in (out / "gpu_check.md").read_text()
