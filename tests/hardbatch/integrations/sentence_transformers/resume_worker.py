"""Worker of test_resume_two_processes.py, on 2 processes (torchrun, gloo on the CPU):
``resume_worker.py OUT AT`` trains the tiny case of test_resume.py (GCBS batches planned every
epoch from the model being trained; accelerate shards the sampler's global plan across the
processes) in
OUT/full, saving checkpoint AT; ``resume_worker.py OUT AT resume`` resumes from it in
OUT/resumed. Each rank writes its trained batches and a SHA-256 of its final weights to
OUT/rank{r}-{full,resumed}.json."""

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from support import end_torchrun_worker, shared_data_root  # noqa: E402

import test_resume as case  # noqa: E402


def main(out: Path, at: int, resume: bool) -> None:
    torch.set_num_threads(1)
    trained, weights = case.train(
        case.tiny_minilm(), case.code_pairs(shared_data_root()),
        out / ("resumed" if resume else "full"), "gcbs", {},
        save=None if resume else at, resume=out / "full" / f"checkpoint-{at}" if resume else None)
    digest = hashlib.sha256()
    for key in sorted(weights):
        digest.update(key.encode() + weights[key].contiguous().numpy().tobytes())
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}-{'resumed' if resume else 'full'}.json").write_text(json.dumps({
        "world_size": torch.distributed.get_world_size(), "trained": trained,
        "weights": digest.hexdigest()}))
    print(f"RANK {rank} OK", flush=True)
    end_torchrun_worker()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["resume"])
