"""Peak memory and step time of plain backward vs ``hardbatch.GradCache`` as the batch grows.

Run from the repository root::

    python benchmarks/bench_gradcache.py             # B = 256 ... 8192, chunks 64 and 256
    python benchmarks/bench_gradcache.py --quick     # B = 256, 1024; one timed round

One training step (``zero_grad``, forward, InfoNCE, backward; no optimiser) of a small CPU
encoder, an MLP on 784-d inputs (MNIST-sized; random data, seed 0): ``depth`` blocks of
Linear -> LayerNorm -> GELU of ``width`` units, then a Linear to ``dim``. Configurations per B:
``plain`` (``loss(enc(x1), enc(x2)).backward()``), ``gc<c>`` (``GradCache(enc, loss, c)``),
``chunked<c>`` (timed only, below) and ``loss`` (the loss alone on random ``[B, dim]``
embeddings that require grad: the part of the memory that no chunking of the encoder removes).

Memory method: every configuration runs in its own subprocess with
``MALLOC_MMAP_THRESHOLD_=65536``, so that glibc serves every tensor above 64 KiB with its own
``mmap`` and returns it on free: the resident set then follows the live tensors. After a warm-up
step, the subprocess resets its peak RSS (``/proc/self/clear_refs`` = 5), reads ``VmRSS`` (the
state between steps: inputs, weights, gradients), runs one step, and reports ``VmHWM - VmRSS``:
the step's peak above that state (activations, logits, embeddings, their gradients).

Time: one subprocess per B builds every configuration side by side and times one step of each
in alternating rounds (drift of the shared machine hits all alike): the process's CPU time
(``time.process_time``; wall time is in the JSON too), the least of ``--repeat`` rounds after
a warm-up round, on one thread by default (CPU time of one thread is what the step costs,
whatever else runs on the shared machine). ``chunked<c>`` is the plain step with the encoder run
on chunks of c items (one graph, no caching): GradCache's time over it is the cost of caching
(one more forward pass), over ``plain`` also that of running the encoder on small chunks.

The loss is InfoNCE in the ``simcse`` form (``B`` anchors against ``B`` positives, as MNRL and
CachedMNRL in sentence-transformers, GradCache's usual setting), whose ``B x B`` logits keep the
loss's own cost moderate at B = 8192. Written to ``benchmarks/results/gradcache.json``; the
table printed at the end is the one in docs/distributed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "gradcache.json"


def encoder(width: int, depth: int, dim: int) -> nn.Module:
    layers: list[nn.Module] = []
    d = 784
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.LayerNorm(width), nn.GELU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, dim))


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def make_step(config: str, batch: int, args: argparse.Namespace):
    """The step function of one configuration (model and data seeded)."""
    import hardbatch as hb
    from hardbatch.gradcache import GradCache

    torch.manual_seed(0)
    loss_fn = hb.InfoNCE(args.temperature, form=args.form)
    if config == "loss":
        z1 = torch.randn(batch, args.dim, requires_grad=True)
        z2 = torch.randn(batch, args.dim, requires_grad=True)

        def loss_step() -> None:
            z1.grad = z2.grad = None
            loss_fn(z1, z2).backward()
        return loss_step
    enc = encoder(args.width, args.depth, args.dim)
    x1, x2 = torch.randn(batch, 784), torch.randn(batch, 784)
    gc = GradCache(enc, loss_fn, int(config[2:])) if config.startswith("gc") else None
    chunk = int(config[7:]) if config.startswith("chunked") else batch

    def step() -> None:
        enc.zero_grad(set_to_none=False)
        if gc is not None:
            gc(x1, x2)
        else:  # plain; "chunked<c>": the same, the encoder run on chunks (one graph)
            z1 = torch.cat([enc(x1[s:s + chunk]) for s in range(0, batch, chunk)])
            z2 = torch.cat([enc(x2[s:s + chunk]) for s in range(0, batch, chunk)])
            loss_fn(z1, z2).backward()
    return step


def child_memory(config: str, batch: int, args: argparse.Namespace) -> dict:
    """Peak RSS of one step above the state between steps (this process runs one config)."""
    step = make_step(config, batch, args)
    step()  # warm-up: one-time allocations, gradient buffers
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kb("VmRSS")
    step()
    return {"config": config, "batch": batch, "peak_mb": (_status_kb("VmHWM") - base) / 1024,
            "base_mb": base / 1024}


def child_time(configs: list[str], batch: int, args: argparse.Namespace) -> dict:
    """CPU and wall times of each config's step, in alternating rounds (drift hits all alike);
    the first round warms up and is dropped."""
    steps = {c: make_step(c, batch, args) for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    wall: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(args.repeat + 1):
        for c, step in steps.items():
            t0, w0 = time.process_time(), time.perf_counter()
            step()
            cpu[c].append(time.process_time() - t0)
            wall[c].append(time.perf_counter() - w0)
    return {c: {"cpu_s": cpu[c][1:], "wall_s": wall[c][1:]} for c in configs}


def run_child(argv: list[str]) -> dict:
    env = dict(os.environ)
    if argv[1] == "memory":  # every tensor its own mmap; not for timing (page faults)
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict], chunks: list[int]) -> str:
    """The markdown table of docs/distributed.md."""
    by = {(r["config"], r["batch"]): r for r in rows}
    gcs = [f"gc{c}" for c in chunks]
    head = (["B", "loss alone MB", "plain MB (+ above loss)"]
            + [f"GradCache {c} MB (+)" for c in chunks]
            + ["plain s"] + [f"GradCache {c} s (x plain, x chunked)" for c in chunks])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in sorted({r["batch"] for r in rows}):
        plain, loss = by[("plain", b)], by[("loss", b)]["peak_mb"]
        cells = [str(b), f"{loss:.0f}"]
        cells += [f"{by[(g, b)]['peak_mb']:.0f} (+{by[(g, b)]['peak_mb'] - loss:.0f})"
                  for g in ["plain", *gcs]]
        cells += [f"{plain['time_s']:.3f}"]
        for c in chunks:
            t = by[(f"gc{c}", b)]["time_s"]
            cells.append(f"{t:.3f} ({t / plain['time_s']:.2f}x, "
                         f"{t / by[(f'chunked{c}', b)]['time_s']:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--chunks", default="64,256")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--form", default="simcse", choices=["simclr", "simcse"])
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2, help="timed steps per configuration")
    parser.add_argument("--quick", action="store_true", help="B = 256, 1024; one timed round")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "CONFIGS", "B"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        kind, configs, b = args.child
        out = (child_memory(configs, int(b), args) if kind == "memory" else
               child_time(configs.split(","), int(b), args))
        print(json.dumps(out))
        return
    if args.quick:
        args.batches, args.repeat = "256,1024", 1
    batches = [int(b) for b in args.batches.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    argv = [f"--width={args.width}", f"--depth={args.depth}", f"--dim={args.dim}",
            f"--form={args.form}", f"--temperature={args.temperature}",
            f"--threads={args.threads}", f"--repeat={args.repeat}"]
    gcs = [f"gc{c}" for c in chunks]
    chunked = [f"chunked{c}" for c in chunks]
    rows = []
    t0 = time.perf_counter()
    for b in batches:
        times = run_child(["--child", "time", ",".join(["plain", *gcs, *chunked]), str(b),
                           *argv])
        for config in ["plain", *gcs, *chunked, "loss"]:
            row = {"config": config, "batch": b}
            if not config.startswith("chunked"):
                row.update(run_child(["--child", "memory", config, str(b), *argv]))
            if config in times:
                row.update(time_s=min(times[config]["cpu_s"]), **times[config])
            rows.append(row)
            print(f"B={b:5d} {config:10s}"
                  + (f" peak {row['peak_mb']:8.1f} MB" if "peak_mb" in row else " " * 17)
                  + (f"  step {row['time_s']:.3f} s CPU" if config in times else ""),
                  flush=True)
    command = "python benchmarks/bench_gradcache.py" + (" --quick" if args.quick else "")
    result = {
        "command": command, "date": date.today().isoformat(), "machine": machine(),
        "seed": 0, "encoder": f"MLP 784 -> {args.depth} x (Linear {args.width}, LayerNorm, "
                              f"GELU) -> {args.dim}",
        "loss": f"InfoNCE(temperature={args.temperature}, form={args.form!r})",
        "chunks": chunks, "repeat": args.repeat, "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows, chunks))
    print(f"wrote {args.out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
