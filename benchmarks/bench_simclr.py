"""SimCLR training throughput per sampler: images/s and the sampler's share of step time.

    # GPU (issue 7's target: ResNet-18 CIFAR stem, bf16 autocast, channels_last, all of
    # CIFAR-10's 50k training images, sampler overhead < 2% of step time)
    python benchmarks/bench_simclr.py --device cuda --json benchmarks/results/simclr_gpu.json
    python benchmarks/bench_simclr.py --device cuda --background \
        --json benchmarks/results/simclr_gpu_background.json
    # CPU (compact ConvNet; slow: a few steps per sampler)
    python benchmarks/bench_simclr.py --device cpu --steps 30 --warmup 5 \
        --json benchmarks/results/simclr_cpu.json

Real data (CIFAR-10 from ``../shared/data/images`` or ``--data-dir``). For each sampler the
training loop of ``hardbatch bench simclr`` (:class:`hardbatch.train.Trainer`: two augmented views
made on the device, one forward pass, InfoNCE, the anchor projections written to the
EmbeddingBank) runs ``--steps`` steps with no evaluation. Step times are wall times of whole
steps; each step reads the loss back (``float(loss)``), so asynchronous GPU work is included.
Reported after ``--warmup`` steps (cuDNN autotuning, first allocations): images/s, the sampler's
share of step time (graph rebuilds every ``--refresh-every`` steps and GCBS's per-epoch order
included), the slowest sampler call, and peak GPU memory.

``--background``: graph samplers and GCBS build their next graph / order in a worker thread from a
snapshot ``--refresh-lag`` steps early (``background=True``), so the loop only waits for walks.
The bank starts from random unit rows (``bank_init="random"``): what is timed does not depend on
how good the embeddings are, and no encoding pass is needed before the first graph.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
from _common import machine

import hardbatch as hb
from hardbatch.cli_types import nonnegative_int, positive_int
from hardbatch.registry import make_sampler as registry_sampler
from hardbatch.registry import sampler_names
from hardbatch.train import TrainConfig, Trainer
from hardbatch_experiments.factories import SAMPLER_SETTINGS, gcbs_quantile
from hardbatch_experiments.recipes.simclr import load_images, train_subset
from hardbatch_experiments.vision import cifar_augment, make_encoder, mnist_augment, projection_head


def make_sampler(name: str, bank: hb.EmbeddingBank, args, steps_per_epoch: int):
    """The recipes' settings (hardbatch_experiments.factories), on ``--sampler-device``."""
    b, n = args.batch_size, bank.num_items
    settings = {"seed": 0, "refresh_every": args.refresh_every, "candidates": args.candidates,
                "neighbors": args.neighbors, "restart": hb.LinearDecay(0.2, 0.05),
                "epochs": math.ceil(args.steps / steps_per_epoch),
                "quantile": gcbs_quantile(n, b)}  # as the recipes: ~2B pairs a row
    options = {key: settings[key] for key in SAMPLER_SETTINGS[name]}
    if name != "uniform":
        options["device"] = args.sampler_device
        if args.background:
            options.update(background=True, refresh_lag=args.refresh_lag)
    return registry_sampler(name, bank, b, **options)


def run(name: str, x_train: torch.Tensor, args, env: dict) -> dict:
    n = len(x_train)
    steps_per_epoch = math.ceil(n / args.batch_size)
    torch.manual_seed(0)
    encoder = make_encoder(env["arch"], args.dataset)
    head = projection_head(encoder.out_dim, 128)
    bank = hb.EmbeddingBank(n, 128, seed=0)
    sampler = make_sampler(name, bank, args, steps_per_epoch)
    augment = cifar_augment() if args.dataset == "cifar10" else mnist_augment()
    config = TrainConfig(epochs=math.ceil(args.steps / steps_per_epoch), max_steps=args.steps,
                         lr=1e-3, seed=0, eval_every=None, device=env["device"], amp=env["amp"],
                         channels_last=env["channels_last"], progress=False)
    trainer = Trainer(encoder, hb.InfoNCE(0.5), sampler, x_train, head=head, augment=augment,
                      config=config, bank=bank)
    if env["device"].startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - t0
    hist = result.history[args.warmup:]
    step_s = np.array([r["step_seconds"] for r in hist])
    sampler_s = np.array([r["sampler_seconds"] for r in hist])
    out = {
        "sampler": name, "steps": len(result.history), "timed_steps": len(hist),
        "images_per_second": float(len(hist) * args.batch_size / step_s.sum()),
        "sampler_share": float(sampler_s.sum() / step_s.sum()),
        "median_step_ms": float(np.median(step_s) * 1e3),
        "median_sampler_ms": float(np.median(sampler_s) * 1e3),
        "max_sampler_ms": float(sampler_s.max() * 1e3),
        "warmup_seconds": float(sum(r["step_seconds"] for r in result.history[:args.warmup])),
        "wall_seconds": wall,
    }
    if env["device"].startswith("cuda"):
        out["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=("cifar10", "mnist"), default="cifar10")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--samplers", nargs="+", default=list(sampler_names()),
                    choices=sampler_names())
    ap.add_argument("--steps", type=positive_int, default=300, help="steps per sampler (default 300)")
    ap.add_argument("--warmup", type=nonnegative_int, default=20, help="first steps not timed (default 20)")
    ap.add_argument("--batch-size", type=positive_int, default=256)
    ap.add_argument("--train-size", type=nonnegative_int, default=0,
                    help="class-balanced training subset (default 0: all training images)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    ap.add_argument("--arch", choices=("auto", "convnet", "resnet18"), default="auto")
    ap.add_argument("--amp", choices=("auto", "none", "bf16", "fp16"), default="auto")
    ap.add_argument("--channels-last", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--candidates", type=positive_int, default=500)
    ap.add_argument("--neighbors", type=positive_int, default=100)
    ap.add_argument("--refresh-every", type=positive_int, default=100)
    ap.add_argument("--background", action="store_true",
                    help="build graphs / GCBS orders in a worker thread (background=True)")
    ap.add_argument("--refresh-lag", type=positive_int, default=20,
                    help="with --background: snapshot this many steps before it is needed")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must be larger than --warmup {args.warmup}")
    if args.threads:
        torch.set_num_threads(args.threads)

    cuda = torch.cuda.is_available()
    device = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    if device.startswith("cuda") and not cuda:
        ap.error(f"--device {device}: CUDA is not available here; use --device cpu")
    on_gpu = device.startswith("cuda")
    env = {"device": device,
           "arch": args.arch if args.arch != "auto" else ("resnet18" if on_gpu else "convnet"),
           "amp": {"auto": "bf16" if on_gpu else None, "none": None}.get(args.amp, args.amp),
           "channels_last": on_gpu if args.channels_last == "auto" else args.channels_last == "on"}
    args.sampler_device = device  # graphs, kNN and GCBS orders on the training device

    x_all, y_all, _, _ = load_images(args.dataset, args.data_dir)
    x_train = x_all[train_subset(y_all, args.train_size, seed=0)]
    if on_gpu:  # batches are gathered on the device (as hardbatch bench simclr does)
        x_train = x_train.to(device)
    print(f"[bench_simclr] {args.dataset}: {len(x_train)} images, batch {args.batch_size}, "
          f"{env}, {machine()}", flush=True)
    rows = []
    for name in args.samplers:
        row = run(name, x_train, args, env)
        rows.append(row)
        print(f"[bench_simclr] {name:9s} {row['images_per_second']:8.1f} img/s  sampler "
              f"{100 * row['sampler_share']:5.2f}% of step time  median step "
              f"{row['median_step_ms']:.1f} ms  slowest sampler call {row['max_sampler_ms']:.1f} ms",
              flush=True)
    if args.json:
        record = {"benchmark": "simclr_throughput", "command": " ".join(sys.argv),
                  "machine": machine(),
                  "gpu": torch.cuda.get_device_name(0) if on_gpu else None,
                  "config": {**{k: v for k, v in vars(args).items() if k != "json"}, **env,
                             "train_size": len(x_train)},
                  "results": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
