"""Peak memory and step time of plain backward vs ``hardbatch.GradCache`` as the batch grows.

Run from the repository root::

    python benchmarks/bench_gradcache.py             # B = 256 ... 8192, chunks 64 and 256
    python benchmarks/bench_gradcache.py --quick     # B = 256, 1024; one timed round
    python benchmarks/bench_gradcache.py --overhead --before HEAD   # GradCache / plain, CPU

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

``--overhead``: GradCache's step over the plain step where the encoder is cheap, so that what
GradCache adds per chunk (RNG capture and replay, one backward call per chunk, Python) shows, as
it does on a GPU; written to ``benchmarks/results/gradcache_cpu.json`` (docs/benchmarks.md).
A smaller MLP (``--in-dim 64``, 2 blocks of 256 units with dropout 0.1, ``dim`` 64) at each
``BxCHUNKS`` of ``--configs``; arms ``plain``, ``chunked`` (the plain step, encoder on the same
chunks, one graph), ``gc`` (this checkout's ``GradCache``) and, with ``--before REV``,
``gc_before``: ``gradcache.py`` and ``_chunks.py`` of git revision REV loaded beside this
checkout's library, timed in the same alternating rounds (CPU time, least of ``--repeat``).
``gc`` and ``gc_before`` must give bit-identical gradients (same seed, dropout replayed);
``same_grads`` records it. ``cold`` rows: a fresh process per code (``before`` / ``after``)
times one plain step and then its first GradCache step at ``--cold`` (wall time), as
``benchmarks/gpu_check.py``'s ``dist`` section does (a one-time cost of the first step shows
there), and whether that step imported sympy. ``profile``: the top operators (``torch.profiler``, self CPU) of one step of
each GradCache arm at the first config.
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
OUT_OVERHEAD = ROOT / "benchmarks" / "results" / "gradcache_cpu.json"
# --overhead: the small encoder (in_dim, width, depth, dim, dropout) and the (B, chunks) grid
OVERHEAD = {"in_dim": 64, "width": 256, "depth": 2, "dim": 64, "dropout": 0.1,
            "configs": "256x16,1024x16,1024x64,4096x16,4096x64", "cold": "1024x16"}


def encoder(width: int, depth: int, dim: int, in_dim: int = 784,
            dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = []
    d = in_dim
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.LayerNorm(width), nn.GELU()]
        layers += [nn.Dropout(dropout)] if dropout else []
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

# --------------------------------------------------------------------------- --overhead


def load_before(rev: str):
    """``hardbatch.gradcache`` as of git revision ``rev``: its ``gradcache.py`` and ``_chunks.py``
    in a temporary package beside this checkout's library (every other module it imports is
    this checkout's), so that both codes run in one process, in the same rounds."""
    import importlib
    import re
    import tempfile

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True,
                            text=True, check=True).stdout.strip()
    pkg = Path(tempfile.mkdtemp(prefix="gradcache_before_")) / "hb_gradcache_before"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("gradcache", "_chunks"):
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:src/hardbatch/{name}.py"],
                              capture_output=True, text=True, check=True).stdout
        (pkg / f"{name}.py").write_text(text)
        for other in set(re.findall(r"^from \.(\w+) import", text, flags=re.M)):
            if other not in ("gradcache", "_chunks"):  # the rest: this checkout's modules
                (pkg / f"{other}.py").write_text(
                    f"import sys\nimport hardbatch.{other} as m\nsys.modules[__name__] = m\n")
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("hb_gradcache_before.gradcache"), commit


def overhead_steps(batch: int, chunks: int, args: argparse.Namespace, before=None) -> dict:
    """The step functions of the --overhead arms on one (B, chunks), model and data seeded."""
    import hardbatch as hb
    from hardbatch.gradcache import GradCache

    torch.manual_seed(0)
    enc = encoder(args.width, args.depth, args.dim, args.in_dim, args.dropout)
    x1 = torch.randn(batch, args.in_dim)
    x2 = x1 + 0.1 * torch.randn(batch, args.in_dim)
    loss_fn = hb.InfoNCE(args.temperature, form=args.form)
    size = -(-batch // chunks)
    caches = {"gc": GradCache(enc, loss_fn, size)}
    if before is not None:
        caches["gc_before"] = before.GradCache(enc, loss_fn, size)

    def plain() -> None:
        enc.zero_grad(set_to_none=False)
        loss_fn(enc(x1), enc(x2)).backward()

    def chunked() -> None:
        enc.zero_grad(set_to_none=False)
        z1 = torch.cat([enc(x1[s:s + size]) for s in range(0, batch, size)])
        z2 = torch.cat([enc(x2[s:s + size]) for s in range(0, batch, size)])
        loss_fn(z1, z2).backward()

    def cached(gc):
        def step() -> None:
            enc.zero_grad(set_to_none=False)
            gc(x1, x2)
        return step

    steps = {"plain": plain, "chunked": chunked}
    steps.update({name: cached(gc) for name, gc in caches.items()})
    return {"steps": steps, "encoder": enc}


def same_gradients(arms: dict) -> bool | None:
    """``gc`` and ``gc_before`` from one seed: bit-identical parameter gradients?"""
    if "gc_before" not in arms["steps"]:
        return None
    got = []
    for name in ("gc", "gc_before"):
        torch.manual_seed(1)
        arms["steps"][name]()
        got.append(torch.cat([q.grad.reshape(-1) for q in arms["encoder"].parameters()]))
    return bool(torch.equal(*got))


def top_ops(step, limit: int = 8) -> list[list]:
    """[name, self CPU ms, calls] of the ``limit`` costliest operators of one step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:limit]
    return [[e.key, round(e.self_cpu_time_total / 1e3, 3), e.count] for e in ops]


def overhead_rows(args: argparse.Namespace, before) -> tuple[list[dict], dict]:
    rows, profiles = [], {}
    for config in args.configs.split(","):
        batch, chunks = (int(v) for v in config.split("x"))
        arms = overhead_steps(batch, chunks, args, before)
        same = same_gradients(arms)
        steps = arms["steps"]
        cpu: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.repeat + 1):  # the first round warms up and is dropped
            for name, step in steps.items():
                t0 = time.process_time()
                step()
                cpu[name].append(time.process_time() - t0)
        best = {name: min(times[1:]) for name, times in cpu.items()}
        row = {"batch": batch, "chunks": chunks, "chunk_size": -(-batch // chunks),
               **{f"{name}_s": round(t, 5) for name, t in best.items()},
               "gc_over_plain": round(best["gc"] / best["plain"], 3)}
        if "gc_before" in best:
            row["gc_before_over_plain"] = round(best["gc_before"] / best["plain"], 3)
            row["same_grads"] = same
        # what GradCache adds per chunk over the chunked plain step (the second forward included)
        row["us_per_chunk_over_chunked"] = {
            name: round((best[name] - best["chunked"]) / (2 * chunks) * 1e6, 1)
            for name in best if name.startswith("gc")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    batch, chunks = (int(v) for v in args.cold.split("x"))
    steps = overhead_steps(batch, chunks, args, before)["steps"]
    for step in steps.values():
        step()  # warm
    profiles = {"config": args.cold, **{name: top_ops(steps[name]) for name in steps
                                        if name.startswith("gc")}}
    return rows, profiles


def child_cold(code: str, args: argparse.Namespace) -> dict:
    """A fresh process: one plain step, then the first GradCache step (wall), then another, at
    ``--cold`` (default 1024 x 16: 16 chunks as in gpu_check.py, a plain step of some 0.04 s
    as that of the H100)."""
    batch, chunks = (int(v) for v in args.cold.split("x"))
    before = load_before(args.before)[0] if code == "before" else None
    arms = overhead_steps(batch, chunks, args, before)
    gc = arms["steps"]["gc_before" if code == "before" else "gc"]
    out = {"code": code, "batch": batch, "chunks": chunks}
    for name, step in (("plain_s", arms["steps"]["plain"]), ("first_gc_s", gc),
                       ("second_gc_s", gc)):
        t0 = time.perf_counter()
        step()
        out[name] = round(time.perf_counter() - t0, 4)
    out["sympy_imported"] = "sympy" in sys.modules
    return out


def run_overhead(args: argparse.Namespace) -> None:
    for key, value in OVERHEAD.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeat is None:
        args.repeat = 5
    if args.child:  # --child cold CODE -
        print(json.dumps(child_cold(args.child[1], args)))
        return
    before, commit = load_before(args.before) if args.before else (None, None)
    t0 = time.perf_counter()
    rows, profiles = overhead_rows(args, before)
    # first steps: fresh processes, alternating codes, 3 of each
    argv = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in OVERHEAD]
    argv += [f"--form={args.form}", f"--temperature={args.temperature}",
             f"--threads={args.threads}", "--overhead"]
    argv += [f"--before={args.before}"] if args.before else []
    cold = [run_child(["--child", "cold", code, "-", *argv]) for _ in range(3)
            for code in (["before"] if args.before else []) + ["after"]]
    for row in cold:
        print(json.dumps(row), flush=True)
    command = " ".join(["python benchmarks/bench_gradcache.py", *sys.argv[1:]])
    result = {
        "command": command, "date": date.today().isoformat(), "machine": machine(),
        "seed": 0, "before": None if commit is None else {"rev": args.before, "commit": commit},
        "encoder": f"MLP {args.in_dim} -> {args.depth} x (Linear {args.width}, LayerNorm, GELU, "
                   f"Dropout {args.dropout}) -> {args.dim}",
        "loss": f"InfoNCE(temperature={args.temperature}, form={args.form!r})",
        "repeat": args.repeat, "time": "CPU s of one step, least of repeat, alternating rounds",
        "rows": rows, "cold": cold, "profile": profiles,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    out = args.out or OUT_OVERHEAD
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} ({result['wall_s']} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--chunks", default="64,256")
    parser.add_argument("--width", type=int, default=None, help="512 (--overhead: 256)")
    parser.add_argument("--depth", type=int, default=None, help="4 (--overhead: 2)")
    parser.add_argument("--dim", type=int, default=None, help="128 (--overhead: 64)")
    parser.add_argument("--in-dim", type=int, default=None, help="784 (--overhead: 64)")
    parser.add_argument("--dropout", type=float, default=None, help="0 (--overhead: 0.1)")
    parser.add_argument("--overhead", action="store_true",
                        help="GradCache / plain with a cheap encoder -> gradcache_cpu.json")
    parser.add_argument("--configs", default=None,
                        help=f"--overhead: BxCHUNKS,... (default {OVERHEAD['configs']})")
    parser.add_argument("--cold", default=None, metavar="BxCHUNKS",
                        help=f"--overhead: the first-step config (default {OVERHEAD['cold']})")
    parser.add_argument("--before", default=None, metavar="REV",
                        help="--overhead: also time gradcache.py / _chunks.py of git REV")
    parser.add_argument("--form", default="simcse", choices=["simclr", "simcse"])
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed steps per configuration (2; --overhead: 5)")
    parser.add_argument("--quick", action="store_true", help="B = 256, 1024; one timed round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "CONFIGS", "B"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.overhead:
        run_overhead(args)
        return
    for key, value in {"width": 512, "depth": 4, "dim": 128, "in_dim": 784, "dropout": 0.0,
                       "repeat": 2, "out": OUT}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
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
