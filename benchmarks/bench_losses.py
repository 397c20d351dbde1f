"""Forward + backward time of the hardbatch losses against a bare ``F.cross_entropy`` InfoNCE.

Run from the repository root::

    python benchmarks/bench_losses.py            # B=1024, d=128, 2 threads
    python benchmarks/bench_losses.py --batch 256 --dim 64 --threads 1
    python benchmarks/bench_losses.py --quick    # B=256, 1 s per loss, 4 rounds

For each form (simclr, simcse) the baseline is the standard implementation on the same raw
``[B, d]`` inputs: L2-normalise, one matmul, (simclr: ``-inf`` on the diagonal of the ``2B x 2B``
logits), ``F.cross_entropy``. Every timed call runs forward and backward. Baseline and loss are
timed in alternating rounds (``torch.utils.benchmark.Timer.blocked_autorange``) so that drift of a
shared machine hits both; the table gives the medians over rounds and the median of the
per-round ratios. The ``(false_negatives)`` rows pass a fixed random bool ``[B, B]`` mask
(about 1% True, like a guide's; :func:`hardbatch.guided_mask`) against the same unmasked baseline,
so their ratio includes the masking.
Targets: <= 1.3x for InfoNCE / DCL / HCL, <= 2x for SSCL.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss


def cross_entropy_info_nce(
    anchor: torch.Tensor, positive: torch.Tensor, temperature: float, form: str
):
    """The textbook NT-Xent / SimCSE loss, used as the speed baseline."""
    b = anchor.shape[0]
    if form == "simclr":
        z = F.normalize(torch.cat([anchor, positive]), dim=1)
        logits = z @ z.T / temperature
        logits.fill_diagonal_(float("-inf"))
        target = torch.cat([torch.arange(b, 2 * b), torch.arange(b)])
    else:
        logits = F.normalize(anchor, dim=1) @ F.normalize(positive, dim=1).T / temperature
        target = torch.arange(b)
    return F.cross_entropy(logits, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument(
        "--min-run-time", type=float, default=4.0, help="seconds per loss and per baseline"
    )
    parser.add_argument("--rounds", type=int, default=8, help="alternating baseline / loss rounds")
    parser.add_argument("--quick", action="store_true",
                        help="B=256, 1 s per loss, 4 rounds (a smoke run of a minute)")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.min_run_time, args.rounds = 256, 1.0, 4
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    anchor = torch.randn(args.batch, args.dim, requires_grad=True)
    positive = torch.randn(args.batch, args.dim, requires_grad=True)
    t = args.temperature
    mask = torch.rand(args.batch, args.batch, generator=torch.Generator().manual_seed(1)) < 0.01

    def make_step(fn):
        def step() -> None:
            fn().backward()
            anchor.grad = positive.grad = None

        step()  # warm-up
        return step

    def measure(step) -> float:
        timer = Timer("step()", globals={"step": step})
        return timer.blocked_autorange(min_run_time=args.min_run_time / args.rounds).median

    def compare(baseline, fn) -> tuple[float, float, float]:
        """Median times of baseline and fn and the median of their per-round ratios.

        The two are timed in alternating rounds, so that drift of a shared machine hits both.
        """
        base_step, step = make_step(baseline), make_step(fn)
        base_t, t = [], []
        for _ in range(args.rounds):
            base_t.append(measure(base_step))
            t.append(measure(step))
        ratio = statistics.median(x / y for x, y in zip(t, base_t))
        return statistics.median(base_t), statistics.median(t), ratio

    print(
        f"B={args.batch}, d={args.dim}, temperature={t}, threads={torch.get_num_threads()}, "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| form | loss | baseline median (ms) | loss median (ms) | ratio (median per round) |")
    print("|---|---|---:|---:|---:|")
    for form in ("simclr", "simcse"):
        gen = torch.Generator().manual_seed(0)
        losses = {
            "InfoNCE": InfoNCE(t, form=form),
            "DebiasedInfoNCE": DebiasedInfoNCE(t, form=form),
            "HardNegativeInfoNCE": HardNegativeInfoNCE(t, form=form),
            "HardNegativeInfoNCE(detach_weights=True)": HardNegativeInfoNCE(
                t, form=form, detach_weights=True
            ),
            "SSCLLoss": SSCLLoss(t, form=form, generator=gen),
            "SSCLLoss(mix=False)": SSCLLoss(t, form=form, mix=False, generator=gen),
            "InfoNCE(false_negatives)": InfoNCE(t, form=form),
            "HardNegativeInfoNCE(false_negatives)": HardNegativeInfoNCE(t, form=form),
        }
        for name, loss in losses.items():
            masked = {"false_negatives": mask} if "false_negatives" in name else {}
            base, sec, ratio = compare(
                lambda form=form: cross_entropy_info_nce(anchor, positive, t, form),
                lambda loss=loss, masked=masked: loss(anchor, positive, **masked),
            )
            print(
                f"| {form} | {name} | {base * 1e3:.1f} | {sec * 1e3:.1f} | {ratio:.2f}x |",
                flush=True,
            )

    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
