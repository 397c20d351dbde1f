"""``hardbatch demo``: the same contrastive run on scikit-learn's digits with every sampler.

Each sampler trains the same MLP encoder (same seed, loss, epochs, augmentation) with
:class:`hardbatch.train.Trainer`; afterwards the demo compares, per sampler:

* kNN (k=200, t=0.1) and linear-probe accuracy on a held-out 20 % of the digits;
* hardness (mean top-1 in-batch cosine similarity) and false-negative rate (share of
  in-batch pairs with the same digit) of the last epoch's batches under the final model;
* coverage of the last epoch (share of items drawn);
* sampler time (batch planning plus graph rebuilds) as a share of training step time;

and draws BatchSampler's Fig. 4: cosine-similarity histograms of in-batch pairs after training
and the false-negative rate over training (graph / order rebuilds marked, the rate defined on
the figure). The table is followed by a one-line legend per column (:data:`COLUMNS`: what it
is, whether higher is better). Samplers and losses come from
:mod:`hardbatch.registry` (through :mod:`hardbatch_experiments.factories`); ``hardbatch demo``
(:mod:`hardbatch_experiments.cli`) runs :func:`run_demo`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hardbatch import EmbeddingBank, LinearDecay, registry
from hardbatch.metrics import plan_stats
from hardbatch.train import TrainConfig, Trainer, embed

from . import factories

__all__ = [
    "COLUMNS",
    "FALSE_NEGATIVE_DEFINITION",
    "DemoConfig",
    "digits_augment",
    "digits_encoder",
    "make_loss",
    "make_sampler",
    "markdown_table",
    "run_demo",
    "split_digits",
]

SAMPLER_TITLES = {"uniform": "uniform", "knn": "kNN", "proximity": "proximity graph (RWR)",
                  "gcbs": "GCBS", "cluster": "cluster (TAS-B)", "community": "community (B3)"}

#: The table's columns: (header, what it is and which way is better).
COLUMNS = (
    ("kNN acc", ("weighted kNN accuracy (k=200, t=0.1) of the frozen encoder on the held-out "
                 "20% of the digits; higher is better")),
    ("linear acc", ("accuracy of a logistic-regression probe on the same features; higher is "
                    "better")),
    ("hardness", ("mean over anchors of the most similar in-batch negative's cosine (last "
                  "epoch's batches, final model); higher = harder negatives, not better by "
                  "itself")),
    ("mean cos", "mean cosine of all in-batch pairs (same batches and model); higher = harder"),
    ("false-neg rate", ("share of in-batch pairs whose two digits have the same label "
                        "(negatives that are really positives); lower is better, uniform "
                        "batches give about 0.10")),
    ("coverage", ("share of the training digits drawn in the last epoch; 1.000 = every digit "
                  "seen")),
    ("sampler / step time", ("share of training step time spent handing over batches (walks, "
                             "graph / order rebuilds); lower is better")),
)
FALSE_NEGATIVE_DEFINITION = ("false-negative rate = share of the in-batch pairs whose two "
                             "digits have the same label (used as negatives although they are "
                             "of one class); uniform batches of 10 balanced classes: about 0.10")


@dataclass
class DemoConfig:
    """Settings of the digits demo (the defaults are what ``hardbatch demo`` runs)."""

    samplers: tuple[str, ...] = registry.sampler_names()
    loss: str = "infonce"
    epochs: int = 60
    batch_size: int = 128
    seed: int = 0
    temperature: float = 0.5
    lr: float = 2e-3
    candidates: int = 500      # M
    neighbors: int = 100       # K
    restart_start: float = 0.2  # alpha, LinearDecay start -> end
    restart_end: float = 0.05
    refresh_every: int = 100
    gcbs_quantile: float = 0.999
    test_fraction: float = 0.2
    progress: bool = False
    threads: int | None = 1    # torch intra-op threads while training (None: leave as is)
    out: str | None = "hardbatch-demo"
    plots: bool = True


# --------------------------------------------------------------------------- data and model


def digits_augment(x: torch.Tensor, generator: torch.Generator | None = None, *,
                   max_rotation: float = 15.0, scale: tuple[float, float] = (0.8, 1.1),
                   max_shift: float = 1.5, noise: float = 0.1,
                   dropout: float = 0.1) -> torch.Tensor:
    """One random view of a batch of 8x8 digits ``[B, 64]`` in ``[0, 1]``; batched tensor ops.

    A random affine crop (rotation, zoom in/out, shift of up to ``max_shift`` pixels, bilinear
    resampling of the 8x8 image), Gaussian pixel noise and pixel dropout. All randomness comes
    from ``generator``.
    """
    b = x.shape[0]
    img = x.reshape(b, 1, 8, 8)

    def uniform(lo, hi):
        return torch.rand(b, generator=generator) * (hi - lo) + lo

    angle = uniform(-max_rotation, max_rotation) * (math.pi / 180.0)
    zoom = uniform(*scale)
    shift = (torch.rand(b, 2, generator=generator) * 2 - 1) * (max_shift * 2 / 8)
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = nn.functional.affine_grid(theta, list(img.shape), align_corners=False)
    out = nn.functional.grid_sample(img, grid, mode="bilinear", padding_mode="zeros",
                                    align_corners=False).reshape(b, 64)
    out = out + noise * torch.randn(out.shape, generator=generator)
    keep = torch.rand(out.shape, generator=generator) >= dropout
    return (out * keep).clamp_(0.0, 1.0)


def digits_encoder(features: int = 128, hidden: int = 256,
                   projection: int = 64) -> tuple[nn.Module, nn.Module]:
    """A small MLP encoder ``64 -> hidden -> hidden -> features`` and projection head."""
    encoder = nn.Sequential(
        nn.Linear(64, hidden), nn.LayerNorm(hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(),
        nn.Linear(hidden, features))
    head = nn.Sequential(nn.ReLU(), nn.Linear(features, features), nn.ReLU(),
                         nn.Linear(features, projection))
    return encoder, head


def make_loss(name: str, temperature: float = 0.5, seed: int = 0) -> nn.Module:
    """The demo's loss ``name`` (a registry name or alias; SimCLR form): ``tau_plus`` 0.1 and
    ``beta`` 1.0 where the loss takes them, SSCL's generator seeded with ``seed``."""
    return factories.make_loss(name, temperature, tau_plus=0.1, beta=1.0,
                               generator=torch.Generator().manual_seed(seed))


def make_sampler(name: str, bank: EmbeddingBank, cfg: DemoConfig):
    """The demo's sampler ``name`` reading ``bank``."""
    return factories.make_sampler(
        name, bank, cfg.batch_size, seed=cfg.seed, candidates=cfg.candidates,
        neighbors=cfg.neighbors, restart=LinearDecay(cfg.restart_start, cfg.restart_end),
        refresh_every=cfg.refresh_every, epochs=cfg.epochs, quantile=cfg.gcbs_quantile)


def split_digits(seed: int, test_fraction: float):
    """Digits as ``(x_train, y_train, x_test, y_test)``: a seeded, stratified split."""
    from .datasets import load_digits

    x, y = load_digits()
    gen = torch.Generator().manual_seed(seed)
    test = []
    for c in range(int(y.max()) + 1):
        members = torch.nonzero(y == c).flatten()
        members = members[torch.randperm(len(members), generator=gen)]
        test.append(members[:round(test_fraction * len(members))])
    is_test = torch.zeros(len(y), dtype=torch.bool)
    is_test[torch.cat(test)] = True
    return x[~is_test], y[~is_test], x[is_test], y[is_test]


# --------------------------------------------------------------------------- run


def _run_one(name: str, cfg: DemoConfig, data) -> dict:
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(cfg.seed)
    encoder, head = digits_encoder()
    trainer = Trainer(
        encoder, make_loss(cfg.loss, cfg.temperature, cfg.seed),
        lambda bank: make_sampler(name, bank, cfg), x_train, y_train, head=head,
        augment=digits_augment, eval_data=(x_test, y_test),
        config=TrainConfig(epochs=cfg.epochs, lr=cfg.lr, seed=cfg.seed,
                           progress=cfg.progress))
    t0 = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - t0
    z = embed(trainer.model, x_train)  # final embeddings, the space the loss and bank use
    stats = plan_stats(z, result.last_epoch_batches, y_train, bins=50, range=(-1.0, 1.0))
    counts, edges = stats.pop("histogram")
    steps = [r["step"] for r in result.history]
    built = [r.get("refreshes", 0) for r in result.history]
    rebuilds = [s for s, now, before in zip(steps, built, [0] + built[:-1]) if now > before]
    return {
        "sampler": name,
        "knn_accuracy": result.final.get("knn_accuracy", math.nan),
        "linear_probe_accuracy": result.final.get("linear_probe_accuracy", math.nan),
        "hardness": stats["hardness"],
        "mean_negative_similarity": stats["mean_negative_similarity"],
        "false_negative_rate": stats["false_negative_rate"],
        "coverage": stats["coverage"],
        "sampler_seconds": result.sampler_seconds,
        "step_seconds": result.step_seconds,
        "sampler_share": result.sampler_share,
        "refreshes": getattr(trainer.sampler, "refreshes", None),
        "steps": result.steps,
        "wall_seconds": wall,
        "final_loss": result.mean("loss", last=len(result.last_epoch_batches)),
        "histogram": {"counts": counts.tolist(), "edges": edges.tolist()},
        "curves": {"step": steps,
                   "false_negative_rate": [r["false_negative_rate"] for r in result.history],
                   "hardness": [r["hardness"] for r in result.history],
                   "loss": [r["loss"] for r in result.history]},
        "rebuild_steps": rebuilds,
    }


def _smooth(values: list[float], window: int) -> list[float]:
    if window <= 1 or len(values) < window:
        return list(values)
    arr = np.asarray(values, dtype=np.float64)
    kernel = np.ones(window) / window
    return np.convolve(arr, kernel, mode="valid").tolist()


def markdown_table(rows: list[dict], legend: bool = True) -> str:
    """The side-by-side comparison as a markdown table, then (``legend``) one line per column
    saying what it is and whether higher is better (:data:`COLUMNS`)."""
    head = ("| sampler | kNN acc | linear acc | hardness | mean cos | false-neg rate | coverage "
            "| sampler / step time |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {SAMPLER_TITLES.get(r['sampler'], r['sampler'])} | {r['knn_accuracy']:.3f} "
            f"| {r['linear_probe_accuracy']:.3f} | {r['hardness']:.3f} "
            f"| {r['mean_negative_similarity']:.3f} "
            f"| {r['false_negative_rate']:.3f} | {r['coverage']:.3f} "
            f"| {100 * r['sampler_share']:.1f}% |")
    if legend:
        lines += [""] + [f"- {name}: {meaning}" for name, meaning in COLUMNS]
    return "\n".join(lines)


def _write_plots(rows: list[dict], out: Path, cfg: DemoConfig) -> list[str]:
    from hardbatch.plots import plot_metric_curves, plot_similarity_histograms

    hists = {SAMPLER_TITLES.get(r["sampler"], r["sampler"]):
             (torch.tensor(r["histogram"]["counts"]), torch.tensor(r["histogram"]["edges"]))
             for r in rows}
    window = max(1, min(25, len(rows[0]["curves"]["step"]) // 10))
    curves, rebuilds = {}, {}
    for r in rows:
        steps = r["curves"]["step"][window - 1:] if window > 1 else r["curves"]["step"]
        title = SAMPLER_TITLES.get(r["sampler"], r["sampler"])
        curves[title] = (steps, _smooth(r["curves"]["false_negative_rate"], window))
        if r.get("rebuild_steps"):
            rebuilds[title] = r["rebuild_steps"]
    hist_path, fn_path = out / "similarity_histograms.png", out / "false_negative_rate.png"
    plot_similarity_histograms(
        hists, hist_path,
        title=f"In-batch cosine similarity after training (digits, {cfg.loss}, B={cfg.batch_size})")
    plot_metric_curves(curves, fn_path, ylabel="false-negative rate",
                       title=f"False negatives in the batch during training (moving mean, "
                             f"{window} steps)", events=rebuilds,
                       event_label="graph / order rebuilt at this step",
                       note=FALSE_NEGATIVE_DEFINITION)
    return [str(hist_path), str(fn_path)]


def run_demo(cfg: DemoConfig | None = None, echo: Callable[[str], None] | None = print) -> dict:
    """Train with every sampler of ``cfg.samplers``; print the table, write plots and results.json.

    Returns the results dict (also written to ``<out>/results.json`` when ``cfg.out`` is set).
    """
    cfg = cfg or DemoConfig()
    echo = echo or (lambda _msg: None)
    cfg = replace(cfg, samplers=tuple(registry.parse_names(cfg.samplers, "sampler")),
                  loss=registry.canonical_loss(cfg.loss))
    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        # a tiny MLP: more intra-op threads only add synchronisation (and collapse when the
        # cores are shared); the samplers' numba kernels keep their own threads
        torch.set_num_threads(cfg.threads)
    try:
        return _run_demo(cfg, echo)
    finally:
        torch.set_num_threads(threads_before)


def _warm_up(cfg: DemoConfig, num_items: int) -> None:
    """Draw one batch from every sampler on a random bank: loads the compiled (numba) kernels
    once per process, so that this one-off cost is not charged to the first sampler's steps."""
    bank = EmbeddingBank(num_items, 8, seed=cfg.seed)
    for name in cfg.samplers:
        next(iter(make_sampler(name, bank, cfg)))


def _run_demo(cfg: DemoConfig, echo: Callable[[str], None]) -> dict:
    data = split_digits(cfg.seed, cfg.test_fraction)
    _warm_up(cfg, len(data[0]))
    echo(f"digits: {len(data[0])} training / {len(data[2])} test images; loss={cfg.loss}, "
         f"epochs={cfg.epochs}, batch size={cfg.batch_size}, seed={cfg.seed}")
    t0 = time.perf_counter()
    rows = []
    for name in cfg.samplers:
        row = _run_one(name, cfg, data)
        rows.append(row)
        echo(f"  {SAMPLER_TITLES.get(name, name):<22} kNN acc {row['knn_accuracy']:.3f}, "
             f"false-neg rate {row['false_negative_rate']:.3f}  ({row['wall_seconds']:.1f} s)")
    table = markdown_table(rows)
    echo("")
    echo(table)
    results = {"config": {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in vars(cfg).items()},
               "data": {"dataset": "sklearn digits", "train": len(data[0]), "test": len(data[2])},
               "table": table, "results": rows, "seconds": time.perf_counter() - t0,
               "files": []}
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        if cfg.plots:
            try:
                results["files"] = _write_plots(rows, out, cfg)
            except ImportError as exc:
                echo(f"plots skipped ({exc}); pip install matplotlib")
        results["files"].append(str(out / "results.json"))
        with open(out / "results.json", "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1, allow_nan=True)
        echo("")
        echo(f"wrote {', '.join(results['files'])}")
    return results
