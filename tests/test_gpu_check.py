"""``scripts/gpu_check.sh --smoke``: the GPU check's code paths, tiny, on the CPU.

The full check runs on a GPU machine when one is lent (benchmarks/results/gpu_check.md); this
test keeps its script, its sections and its summary from rotting on machines without one.
"""

from __future__ import annotations

import json
import os
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
