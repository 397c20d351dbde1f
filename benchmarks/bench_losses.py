"""Forward + backward time of the hardbatch losses against a bare ``F.cross_entropy`` InfoNCE.

Run from the repository root::

    python benchmarks/bench_losses.py            # B=1024, d=128, 2 threads
    python benchmarks/bench_losses.py --batch 256 --dim 64 --threads 1

For each form (simclr, simcse) the baseline is the standard implementation on the same raw
``[B, d]`` inputs: L2-normalise, one matmul, (simclr: ``-inf`` on the diagonal of the ``2B x 2B``
logits), ``F.cross_entropy``. Every timed call runs forward and backward. Prints a markdown table
of medians (``torch.utils.benchmark.Timer.blocked_autorange``) and the ratio to the baseline.
Targets: <= 1.3x for InfoNCE / DCL / HCL, <= 2x for SSCL.
"""

from __future__ import annotations

import argparse
import platform

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss


def cross_entropy_info_nce(anchor: torch.Tensor, positive: torch.Tensor, temperature: float, form: str):
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
    parser.add_argument("--min-run-time", type=float, default=3.0, help="seconds per measurement")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    anchor = torch.randn(args.batch, args.dim, requires_grad=True)
    positive = torch.randn(args.batch, args.dim, requires_grad=True)
    t = args.temperature

    def timed(fn) -> float:
        def step() -> None:
            fn().backward()
            anchor.grad = positive.grad = None

        step()  # warm-up
        return Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=args.min_run_time).median

    print(
        f"B={args.batch}, d={args.dim}, temperature={t}, threads={torch.get_num_threads()}, "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}\n"
    )
    print("| form | loss | fwd+bwd median (ms) | ratio to F.cross_entropy |")
    print("|---|---|---:|---:|")
    for form in ("simclr", "simcse"):
        gen = torch.Generator().manual_seed(0)
        losses = {
            "F.cross_entropy InfoNCE (baseline)": lambda: cross_entropy_info_nce(anchor, positive, t, form),
            "InfoNCE": InfoNCE(t, form=form),
            "DebiasedInfoNCE": DebiasedInfoNCE(t, form=form),
            "HardNegativeInfoNCE": HardNegativeInfoNCE(t, form=form),
            "HardNegativeInfoNCE(detach_weights=True)": HardNegativeInfoNCE(t, form=form, detach_weights=True),
            "SSCLLoss": SSCLLoss(t, form=form, generator=gen),
            "SSCLLoss(mix=False)": SSCLLoss(t, form=form, mix=False, generator=gen),
        }
        base = None
        for name, loss in losses.items():
            fn = loss if not isinstance(loss, torch.nn.Module) else (lambda loss=loss: loss(anchor, positive))
            sec = timed(fn)
            base = sec if base is None else base
            print(f"| {form} | {name} | {sec * 1e3:.1f} | {sec / base:.2f}x |")


if __name__ == "__main__":
    main()
