"""SimCLR on CIFAR-10 / MNIST with hardbatch's samplers and losses (BatchSampler Table 1 / Fig. 4,
GCBS Table 2, SSCL Table 1, at small scale).

One run = (dataset, sampler, loss, seed): SimCLR (Chen et al. 2020) with batches from the chosen
sampler, trained by :class:`hardbatch.train.Trainer` (two views of each batch made by
:mod:`hardbatch_experiments.vision` with batched tensor ops on the batch's device; one forward
pass; the anchor view's projections fed to an :class:`~hardbatch.EmbeddingBank` from which the
kNN / proximity-graph samplers rebuild their graph every ``--refresh-every`` steps and GCBS
re-orders every epoch). Evaluation: weighted kNN (k 200, t 0.1) on the frozen encoder features
(before the projection head) every ``--eval-every`` steps, and a linear probe (L-BFGS logistic
regression) at the end; train features are those of the training images, queries the full test
set.

Each run writes one JSON (atomically) with the accuracies, the kNN curve, per-step diagnostics
(loss, hardness, false-negative rate = share of same-class in-batch pairs, labels used for this
only), images/s, sampler share of step time and wall time; an existing JSON means "done" and the
run is skipped (one stored under a loss alias's name, ``debiased`` / ``hard_negative``, as
runs were named before the registry, too). A checkpoint per epoch (``OUT/.NAME.ckpt``) lets a
killed run resume exactly.

Defaults (CPU, 2 cores): compact :class:`~hardbatch_experiments.vision.ConvNet`, a fixed
class-balanced subset of ``--train-size 10000`` CIFAR-10 training images, 10 epochs of batch 256
(400 steps, about 12 minutes with one thread). ``--train-size 0 --epochs 14`` (2,744 steps) is the
"about one hour" setting; on a GPU ``--arch resnet18`` (auto when CUDA is available) with bf16
autocast and channels_last.

Batch-size sweeps (issue 21, :mod:`.simclr_budget`): ``--images N`` fixes the training images
seen (steps = ceil(N / B)), ``--lr-rule sqrt`` scales Adam's lr as sqrt(B / 256), ``--reference
FILE`` measures every arm's batches in one fixed encoder (``--save-reference FILE`` writes one),
and every run stores ``pairing`` fingerprints (initial weights, data ids, augmentation stream).

Usage::

    hardbatch bench simclr --dataset cifar10 --sampler uniform,proximity --loss infonce \\
        --seeds 3 --out results/vision
"""

from __future__ import annotations

import argparse
import math
import shlex
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hardbatch.cli_types import (
    nonnegative_int,
    positive_float,
    positive_int,
    probability,
    temperature,
)
from hardbatch.neighbors.knn_graph import check_graph_sizes
from hardbatch.registry import parse_names

from .. import runs
from ..factories import LOSS_SETTINGS
from . import simclr_budget as budget

__all__ = ["DEFAULTS", "add_simclr_parser", "build_parser", "load_images", "main",
           "result_path", "run_one", "run_simclr", "train_subset"]

DATASETS = ("cifar10", "mnist")
# what a run with no overrides uses (and the tag-free result file names)
DEFAULTS = {"epochs": 10, "train_size": 10000, "test_size": 0, "batch_size": 256, "temperature": 0.5,
            "lr": 1e-3, "candidates": 500, "neighbors": 100, "refresh_every": 100,
            "restart": (0.2, 0.05), "arch": "auto", "bank_init": "encode", "max_steps": None,
            "images": None, "lr_rule": "fixed", "lr_reference_batch": 256}
# the debiasing options of DCL / HCL / SSCL (those a loss takes, see factories.LOSS_SETTINGS)
LOSS_OPTIONS = {"tau_plus": 0.1, "beta": 1.0}


def result_path(out: Path | str, dataset: str, sampler: str, loss: str, seed: int,
                tag: str = "") -> Path:
    """``OUT/simclr-DATASET__SAMPLER__LOSS__seedS[__TAG].json``."""
    return runs.result_path(out, f"simclr-{dataset}", sampler, loss, seed=seed, tag=tag)


# ------------------------------------------------------------------------------ data
def load_images(dataset: str, data_dir=None, cache_dir=None):
    """``(x_train, y_train, x_test, y_test)``: uint8 ``[N, C, H, W]`` images, int64 labels."""
    from ..datasets import load_cifar10, load_mnist

    if dataset == "cifar10":
        cache = True if cache_dir is None else cache_dir
        xtr, ytr = load_cifar10(data_dir, "train", cache_dir=cache)
        xte, yte = load_cifar10(data_dir, "test", cache_dir=cache)
    elif dataset == "mnist":
        xtr, ytr = load_mnist(data_dir, "train")
        xte, yte = load_mnist(data_dir, "test")
        xtr, xte = xtr.unsqueeze(1), xte.unsqueeze(1)
    else:
        raise ValueError(f"dataset={dataset!r} must be one of {DATASETS}")
    return xtr, ytr, xte, yte


def train_subset(labels: torch.Tensor, size: int, seed: int = 0) -> torch.Tensor:
    """Sorted ids of a class-balanced random subset of ``size`` items (all for 0 or >= N).

    The subset depends on ``seed`` only (the recipe uses 0 for every run), so every row and
    seed trains on the same images.
    """
    n = len(labels)
    if size < 0:
        raise ValueError(f"size={size} must be >= 0 (0: all items)")
    if size == 0 or size >= n:
        return torch.arange(n)
    gen = torch.Generator().manual_seed(seed)
    classes = torch.unique(labels)
    per = [size // len(classes) + (1 if i < size % len(classes) else 0)
           for i in range(len(classes))]
    picks = []
    for c, k in zip(classes.tolist(), per):
        members = torch.nonzero(labels == c).flatten()
        picks.append(members[torch.randperm(len(members), generator=gen)[:k]])
    return torch.cat(picks).sort().values


# ------------------------------------------------------------------------------ one run
def _resolve(args) -> dict:
    """Device, architecture, precision and memory format from the arguments."""
    cuda = torch.cuda.is_available()
    device = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    if device.startswith("cuda") and not cuda:
        raise ValueError(f"device={args.device!r}: CUDA is not available here; use --device cpu")
    on_gpu = device.startswith("cuda")
    arch = args.arch if args.arch != "auto" else ("resnet18" if on_gpu else "convnet")
    amp = args.amp if args.amp != "auto" else ("bf16" if on_gpu else "none")
    channels_last = (args.channels_last if args.channels_last is not None else on_gpu)
    return {"device": device, "arch": arch, "amp": None if amp == "none" else amp,
            "channels_last": bool(channels_last)}


def _tag(args) -> str:
    """'' for the default configuration, else a short suffix naming what differs."""
    if args.tag is not None:
        return args.tag
    parts = []
    for key, short in (("epochs", "e"), ("train_size", "n"), ("test_size", "t"),
                       ("batch_size", "b"), ("max_steps", "s"), ("images", "i")):
        if key == "epochs" and args.images is not None:
            continue  # the image budget sets the epochs
        value = getattr(args, key)
        if value != DEFAULTS[key]:
            parts.append(f"{short}{value}")
    if args.arch != DEFAULTS["arch"]:
        parts.append(args.arch)
    if args.bank_init != DEFAULTS["bank_init"]:
        parts.append("bankrand")
    for key in ("temperature", "lr", "candidates", "neighbors", "refresh_every"):
        if getattr(args, key) != DEFAULTS[key]:
            parts.append(f"{key.replace('_', '')}{getattr(args, key)}")
    if tuple(args.restart) != DEFAULTS["restart"]:
        parts.append(f"restart{args.restart[0]}-{args.restart[1]}")
    if args.lr_rule != DEFAULTS["lr_rule"]:
        parts.append(f"lr{args.lr_rule}{args.lr_reference_batch}")
    if args.guide is not None:
        parts.append(f"guide{args.guide_margin:g}")
    return "_".join(parts)


def run_one(args, data, sampler_name: str, loss_name: str, seed: int, path: Path,
            log=print) -> dict:
    """Train and evaluate one configuration; writes ``path`` (JSON) and returns the record.

    ``data`` is :func:`load_images`'s tuple; ``args`` the parsed ``bench simclr`` options.
    """
    from hardbatch import EmbeddingBank, LinearDecay
    from hardbatch.metrics import NEAR_DUPLICATE, coverage
    from hardbatch.train import TrainConfig, Trainer, embed, seed_everything

    from ..factories import gcbs_quantile, make_loss, make_sampler
    from ..vision import cifar_augment, make_encoder, mnist_augment, projection_head

    t_start = time.perf_counter()
    c_start = time.process_time()
    env = _resolve(args)
    device = env["device"]
    x_all, y_all, x_test, y_test = data
    ids = train_subset(y_all, args.train_size, seed=0)
    x_train, y_train = x_all[ids], y_all[ids]
    test_ids = train_subset(y_test, args.test_size, seed=1)
    x_test, y_test = x_test[test_ids], y_test[test_ids]
    n = len(ids)
    bsz = args.batch_size
    if not 2 <= bsz < n:
        raise ValueError(f"batch_size={bsz} must be between 2 and {n - 1} (the training set "
                         f"has {n} images); lower --batch-size or raise --train-size")
    cands = min(args.candidates, n - 1)
    neigh = min(args.neighbors, cands - 1)
    if device != "cpu":  # batches are gathered on the device: no host-to-device copy per step
        x_train, x_test = x_train.to(device), x_test.to(device)
    steps_per_epoch = math.ceil(n / bsz)
    epochs, max_steps = args.epochs, args.max_steps
    if args.images is not None:  # a fixed image budget: steps = ceil(images / B)
        steps, epochs = budget.plan_steps(args.images, bsz, n)
        max_steps = min(steps, max_steps) if max_steps else steps
    total_steps = min(epochs * steps_per_epoch, max_steps or math.inf)
    lr = budget.scaled_lr(args.lr, bsz, args.lr_rule, args.lr_reference_batch)
    eval_every = args.eval_every or max(1, 2 * steps_per_epoch)
    quantile = args.gcbs_quantile or gcbs_quantile(n, bsz)
    augment = cifar_augment() if args.dataset == "cifar10" else mnist_augment()

    seed_everything(seed)
    encoder = make_encoder(env["arch"], args.dataset)
    head = projection_head(encoder.out_dim, 128)
    pairing = budget.pairing_record(torch.nn.Sequential(encoder, head), ids, test_ids)
    loss_fn = make_loss(loss_name, args.temperature, **LOSS_OPTIONS,
                        generator=torch.Generator().manual_seed(seed))
    bank = EmbeddingBank(n, 128, seed=seed)
    ckpt = path.with_name(f".{path.stem}.ckpt")
    t0 = time.perf_counter()  # the untrained network's projections (no random numbers drawn)
    untrained = embed(torch.nn.Sequential(encoder, head).to(device), x_train, 1024, device)
    reference = untrained - untrained.mean(dim=0, keepdim=True)  # every arm's reference, centred
    reference_what = ("projections of the untrained network (the seed's initial weights) of the "
                      "training images, centred: the same for every sampler and loss of this seed")
    reference_info = None
    if args.reference is not None:  # one fixed encoder for every arm, seed and batch size
        reference, reference_info = budget.load_reference_file(args.reference, ids)
        reference_what = (f"fixed reference file {reference_info['path']} (sha256 "
                          f"{reference_info['sha256']}): {reference_info['meta'].get('what', '')}"
                          ).rstrip(": ")
    guide, guide_info = None, None
    if args.guide is not None:  # guided false-negative masks from a fixed embedding
        guide, guide_info = budget.load_reference_file(args.guide, ids, flag="--guide")
        guide_info["margin"] = args.guide_margin
    reference_s = time.perf_counter() - t0
    bank_init_s = 0.0
    if args.bank_init == "encode" and sampler_name != "uniform" and not ckpt.is_file():
        bank.embeddings.copy_(untrained)  # the first graph from the untrained network
        bank_init_s = reference_s
    sampler = make_sampler(sampler_name, bank, bsz, seed=seed, candidates=cands, neighbors=neigh,
                           restart=LinearDecay(*args.restart, total_steps=(
                               total_steps if args.images is not None else None)),
                           refresh_every=args.refresh_every, epochs=epochs, quantile=quantile)
    config = TrainConfig(epochs=epochs, lr=lr, weight_decay=args.weight_decay,
                         seed=seed, eval_every=eval_every, device=device, amp=env["amp"],
                         channels_last=env["channels_last"], probe_every_eval=False,
                         progress=args.progress, max_steps=max_steps,
                         checkpoint_path=str(ckpt), eval_batch_size=1024)
    trainer = Trainer(encoder, loss_fn, sampler, x_train, y_train, head=head, augment=augment,
                      eval_data=(x_test, y_test), config=config, bank=bank, reference=reference,
                      guide=guide, guide_margin=args.guide_margin)
    initial = None
    if not ckpt.is_file():
        initial = {"step": 0, "epoch": 0, **trainer.evaluate(probe=False)}
        initial.pop("kind", None)
    result = trainer.fit()
    final = result.final
    # the augmentation random numbers drawn: equal across arms of a seed at the same B
    pairing["augment_generator_end"] = budget.tensor_digest(trainer.generator.get_state())
    if args.save_reference:
        model = torch.nn.Sequential(encoder, head)
        budget.save_reference(args.save_reference, embed(model, x_train, 1024, device), ids, {
            "what": (f"projections (128-d, un-augmented) of the {n} training images by the "
                     f"encoder + head of run {path.name} ({sampler_name} + {loss_name}, seed "
                     f"{seed}, B {bsz}, {result.steps} steps)"), "run": path.name})
    hist = result.history
    last_epoch = [r for r in hist if r["epoch"] == hist[-1]["epoch"]] if hist else []
    images_per_s = (result.steps * bsz / result.step_seconds if result.step_seconds else math.nan)
    # (the steps of a checkpoint written before the reference existed lack its entries: NaN)
    trace = {k: [r.get(k, math.nan) for r in hist] for k in (
        "step", "epoch", "loss", "hardness", "false_negative_rate", "reference_hardness",
        "reference_near_duplicate_rate", "sampler_seconds", "step_seconds")}
    eval_s = sum(e.get("seconds", 0.0) for e in result.evals) + (initial or {}).get("seconds", 0)
    hp = {"dataset": args.dataset, "train_size": n, "test_size": len(y_test),
          "batch_size": bsz, "epochs": epochs, "steps_per_epoch": steps_per_epoch,
          "max_steps": max_steps, "images": args.images, "temperature": args.temperature,
          "lr": lr, "lr_rule": args.lr_rule, "lr_base": args.lr,
          "lr_reference_batch": args.lr_reference_batch, "guide": guide_info,
          "weight_decay": args.weight_decay, "optimizer": "Adam",
          "encoder": env["arch"], "feature_dim": encoder.out_dim, "projection": [encoder.out_dim,
                                                                                 encoder.out_dim, 128],
          "augment": augment.config(), "device": device, "amp": env["amp"],
          "channels_last": env["channels_last"], "bank_init": args.bank_init,
          "sampler": {"candidates": cands, "neighbors": neigh, "refresh_every": args.refresh_every,
                      "restart": {"schedule": "LinearDecay", "start": args.restart[0],
                                  "end": args.restart[1], "total_steps": (
                                      total_steps if args.images is not None else None)},
                      "gcbs_quantile": quantile},
          "loss": {"name": loss_name,
                   **{k: v if k in LOSS_SETTINGS[loss_name] else None
                      for k, v in LOSS_OPTIONS.items()},
                   "hardest": 32 if loss_name == "sscl" else None,
                   "synthetic": 8 if loss_name == "sscl" else None},
          "eval": {"knn_k": 200, "knn_temperature": 0.1, "eval_every": eval_every,
                   "probe": "L-BFGS logistic regression, at the end"},
          "threads": torch.get_num_threads()}
    record = {
        "dataset": args.dataset, "sampler": sampler_name, "loss": loss_name, "seed": seed,
        "tag": _tag(args), "config": hp, "steps": result.steps,
        "images_seen": (result.steps // steps_per_epoch) * n
                       + (result.steps % steps_per_epoch) * bsz,
        "knn_accuracy": final.get("knn_accuracy"),
        "linear_probe_accuracy": final.get("linear_probe_accuracy"),
        "evals": ([initial] if initial else []) + [
            {k: e[k] for k in ("step", "epoch", "knn_accuracy", "linear_probe_accuracy",
                               "seconds") if k in e} for e in result.evals],
        "images_per_second": images_per_s,
        "sampler_share": result.sampler_share,
        "mean_false_negative_rate": result.mean("false_negative_rate"),
        "last_epoch_false_negative_rate": float(np.nanmean(
            [r["false_negative_rate"] for r in last_epoch])) if last_epoch else None,
        "mean_hardness": result.mean("hardness"),
        "last_epoch_coverage": coverage(result.last_epoch_batches, n),
        "trace": trace,
        "trace_note": ("per step (Trainer history): hardness = mean top-1 in-batch cosine of the "
                       "anchor projections; false_negative_rate = share of same-class in-batch "
                       "pairs (labels used for diagnostics only); reference_* = the same batch "
                       "in the reference embedding; step_seconds includes the sampler and the "
                       "augmentations"),
        "reference_diagnostics": {**runs.reference_summary(trace, reference_what, NEAR_DUPLICATE),
                                  "file": reference_info},
        "pairing": pairing,
        "wall_time_s": time.perf_counter() - t_start,
        "train_time_s": result.step_seconds, "eval_time_s": eval_s, "bank_init_s": bank_init_s,
        "reference_s": reference_s,
        "cpu_time_s": time.process_time() - c_start,
        "resumed": initial is None,
        "command": _command_line(),
        "env": runs.env_record(),
    }
    runs.write_json_atomic(path, record)
    ckpt.unlink(missing_ok=True)
    return record


def _command_line() -> str:
    """The command that started this process, with the module spelled as ``python -m``."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(("simclr.py", "__main__.py")):
        argv[0] = ("python -m hardbatch_experiments.recipes.simclr" if argv[0].endswith("simclr.py")
                   else "hardbatch")
        return argv[0] + "".join(" " + shlex.quote(a) for a in argv[1:])
    return " ".join(shlex.quote(a) for a in argv)


# ------------------------------------------------------------------------------ CLI
def _add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--data-dir", default=None,
                   help="data folder (default: $HARDBATCH_DATA, else ../shared/data)")
    p.add_argument("--cache-dir", default=None,
                   help="cache of decoded CIFAR-10 JPEGs (default ~/.cache/hardbatch)")
    runs.add_run_arguments(p, seeds=1)
    p.add_argument("--epochs", type=positive_int, default=d["epochs"],
                   help=f"epochs over the training subset (default {d['epochs']})")
    p.add_argument("--train-size", type=nonnegative_int, default=d["train_size"],
                   help=f"class-balanced training subset, same for every run (default "
                        f"{d['train_size']}; 0: all)")
    p.add_argument("--test-size", type=nonnegative_int, default=d["test_size"],
                   help="class-balanced subset of the test set for evaluation (default 0: all)")
    p.add_argument("--batch-size", type=positive_int, default=d["batch_size"])
    p.add_argument("--max-steps", type=positive_int, default=None,
                   help="stop after this many steps (smoke tests)")
    p.add_argument("--arch", choices=("auto", "convnet", "resnet18"), default="auto",
                   help="encoder (auto: resnet18 with CUDA, else the compact convnet)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    p.add_argument("--amp", choices=("auto", "none", "bf16", "fp16"), default="auto",
                   help="autocast precision (auto: bf16 on CUDA, none on CPU)")
    p.add_argument("--channels-last", dest="channels_last", action="store_true", default=None,
                   help="channels_last memory format (default: on with CUDA)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--temperature", type=temperature, default=d["temperature"])
    p.add_argument("--lr", type=positive_float, default=d["lr"], help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=1e-6)
    p.add_argument("--candidates", type=positive_int, default=d["candidates"], help="M")
    p.add_argument("--neighbors", type=positive_int, default=d["neighbors"], help="K")
    p.add_argument("--refresh-every", type=positive_int, default=d["refresh_every"], help="t (steps)")
    p.add_argument("--restart", nargs=2, type=probability, default=list(d["restart"]),
                   metavar=("START", "END"), help="RWR alpha, decayed linearly")
    p.add_argument("--gcbs-quantile", type=float, default=None,
                   help="default 1 - 2B/(N-1) clipped to [0.5, 0.999]")
    p.add_argument("--bank-init", choices=("encode", "random"), default=d["bank_init"])
    p.add_argument("--eval-every", type=positive_int, default=None,
                   help="steps between kNN evaluations (default: every 2 epochs)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--tag", default=None, help="result-name suffix (default: from overrides)")
    budget.add_budget_arguments(p)
    runs.add_grid_arguments(p, out="results/vision")
    p.add_argument("--progress", action="store_true", help="progress bar per run")


def run_simclr(args) -> int:
    """Run every (sampler, loss, seed) of ``args``; returns a process exit code."""
    torch.set_num_threads(max(1, int(args.threads)))
    samplers = parse_names(args.sampler, "sampler")
    losses = parse_names(args.loss, "loss")
    seeds = runs.seeds_of(args)
    _resolve(args)  # device / arch errors before any loading
    if args.gcbs_quantile is not None and not 0.0 < args.gcbs_quantile < 1.0:
        raise ValueError(f"--gcbs-quantile {args.gcbs_quantile} must lie strictly in (0, 1)")
    # N is known after loading only (run_one clips the candidates to N - 1): K < M here
    check_graph_sizes(args.candidates, args.neighbors, math.inf, flags=True)
    out = Path(args.out)
    tag = _tag(args)
    todo = [(s, l, seed) for seed in seeds for l in losses for s in samplers
            if args.force or not runs.finished(result_path(out, args.dataset, s, l, seed, tag),
                                                "knn_accuracy")]
    total = len(samplers) * len(losses) * len(seeds)
    print(f"[simclr] {args.dataset}: {total - len(todo)}/{total} runs done, {len(todo)} to run "
          f"-> {out}", flush=True)
    tally = runs.GridTally(skipped=total - len(todo))
    if args.dry_run or not todo:
        print(tally.summary("[simclr]"), flush=True)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    t0 = time.perf_counter()
    data = load_images(args.dataset, args.data_dir, args.cache_dir)
    print(f"[simclr] loaded {args.dataset}: {len(data[1])} train / {len(data[3])} test images "
          f"({time.perf_counter() - t0:.1f}s)", flush=True)
    tally += runs.run_grid(
        todo, lambda s, l, seed: result_path(out, args.dataset, s, l, seed, tag),
        lambda s, l, seed, path: run_one(args, data, s, l, seed, path),
        lambda s, l, seed, rec: _summary(args.dataset, s, l, seed, rec),
        key="knn_accuracy", force=args.force, prefix="[simclr]",
        reraise=(ValueError, FileNotFoundError))
    print(tally.summary("[simclr]"), flush=True)
    return tally.exit_code


def _summary(dataset: str, sampler: str, loss: str, seed: int, rec: dict) -> str:
    return (f"{dataset} {sampler} {loss} seed {seed}: kNN {100 * rec['knn_accuracy']:.2f} "
            f"linear {100 * rec['linear_probe_accuracy']:.2f} fnr "
            f"{rec['mean_false_negative_rate']:.3f} {rec['images_per_second']:.0f} img/s "
            f"sampler {100 * rec['sampler_share']:.1f}% wall {rec['wall_time_s']:.0f}s")


COMMAND = runs.RecipeCommand(
    "simclr", help="SimCLR on CIFAR-10 / MNIST with every sampler and loss",
    description="SimCLR on CIFAR-10 / MNIST with hardbatch samplers and losses; one JSON per run",
    add_arguments=_add_arguments, run=run_simclr)
build_parser, add_simclr_parser, main = COMMAND.parser, COMMAND.register, COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
