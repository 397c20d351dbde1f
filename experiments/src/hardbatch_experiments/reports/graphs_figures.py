"""The per-dataset figures of docs/results/graphs.md: false-negative rate and hardness over
training per sampler (InfoNCE runs), and the page section that shows them."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .common import link, pyplot, save_figure
from .graphs_runs import SAMPLERS

__all__ = ["figures", "plot"]


def plot(runs: dict, dataset: str, fig_dir: Path) -> Path | None:
    """False-negative rate and hardness over training per sampler (InfoNCE); None if no run."""
    have = [s for s in SAMPLERS if runs.get((dataset, s, "infonce"))]
    if not have:
        return None
    keys = ("false_negative_rate", "hardness")
    if any("reference_hardness" in r["trace"] for s in have
           for r in runs[(dataset, s, "infonce")].values()):
        keys += ("reference_hardness",)  # runs that recorded it (the others: no curve)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6))
    for s in have:
        every = list(runs[(dataset, s, "infonce")].values())
        steps = min(len(r["trace"]["step"]) for r in every)
        if steps == 0:
            continue
        x = every[0]["trace"]["step"][:steps]
        window = max(1, sum(1 for e in every[0]["trace"]["epoch"] if e == 0))  # one epoch
        for ax, key in zip(axes, keys):
            recs = [r for r in every if key in r["trace"]]
            if not recs:
                continue
            cols = [[r["trace"][key][i] for r in recs] for i in range(steps)]
            y = [statistics.fmean(v for v in c if not math.isnan(v))
                 if any(not math.isnan(v) for v in c) else math.nan
                 for c in cols]
            # trailing mean over one epoch of steps (the short last batch makes raw values
            # zig-zag)
            sm = [statistics.fmean(y[max(0, i - window + 1):i + 1]) for i in range(len(y))]
            ax.plot(x, sm, label=f"{s} ({len(recs)} seeds)", lw=1.2)
    axes[0].set_title(f"{dataset}: false-negative rate per batch", fontsize=10)
    axes[1].set_title(f"{dataset}: hardness (mean top-1 negative cosine)", fontsize=10)
    if len(keys) == 3:
        axes[2].set_title(f"{dataset}: hardness in the reference (untrained encoder)",
                          fontsize=10)
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    path = fig_dir / f"graphcl_{dataset}.png"
    save_figure(fig, path)
    return path


def figures(runs: dict, datasets: list[str], fig_dir: Path, out: Path) -> tuple[list[str], int]:
    """Draw the per-dataset figures; the section that shows them (empty if none), their count."""
    figs = [(d, p) for d in datasets if (p := plot(runs, d, fig_dir)) is not None]
    if not figs:
        return [], 0
    lines = ["## False-negative rate and hardness over training (InfoNCE)", "",
             "Per logged step, of the batch's bank embeddings (anchor readout, right after the "
             "step's update) and graph labels; mean over seeds, then a trailing mean over "
             "one epoch of steps. The readout is an uncentred sum over nodes (taken in "
             "training mode), so on the constant-feature datasets (IMDB-B, COLLAB, "
             "REDDIT-B) every pair of graphs has a cosine near 1 and the hardness curves "
             "barely separate the samplers; the false-negative rate does. Where runs recorded "
             "it, a third panel measures the same batches in one fixed reference embedding "
             "shared by every sampler of a seed (the untrained encoder's readout): the "
             "current-embedding hardness moves with each run's own model.", ""]
    for d, p in figs:
        lines += [f"![{d}]({link(p, out)})", ""]
    return lines, len(figs)
