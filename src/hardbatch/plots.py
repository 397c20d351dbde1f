"""Diagnostic plots of batch plans (BatchSampler, KDD 2023, Fig. 4 and Fig. 5).

matplotlib is imported inside the functions, so ``import hardbatch`` never imports it (install
it with ``pip install hardbatch[plots]``). Figures are drawn on an Agg canvas without pyplot:
no display is needed and the caller's pyplot backend and figures are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["plot_metric_curves", "plot_similarity_histograms"]


def _new_figure(entries: int = 1):
    """A Figure on an Agg canvas: no pyplot, no global backend switch, no display needed.

    The figure grows by one legend row per entry (the legend sits under the axes, where it
    never hides a curve).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("hardbatch.plots needs matplotlib: pip install matplotlib "
                          "(or hardbatch[plots])") from exc
    fig = Figure(figsize=(7.0, 4.2 + 0.22 * entries), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _legend_below(fig, ax) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False,
              fontsize="small")
    fig.tight_layout()


def _to_numpy(values, name: str) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got shape "
                         f"{tuple(arr.shape)}")
    return arr


def _prepare_path(path) -> str:
    path = os.fspath(path)
    if not os.path.splitext(path)[1]:
        raise ValueError(f"path={path!r} needs a file extension such as .png, .pdf or .svg")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    return path


def plot_similarity_histograms(histograms: Mapping[str, tuple[Sequence, Sequence]], path,
                               title: str = "In-batch cosine similarity",
                               density: bool = True, log: bool = False) -> str:
    """Step histograms of in-batch cosine similarity, one per sampler (BatchSampler Fig. 4 left).

    Args:
        histograms: ``{name: (counts [bins], edges [bins + 1])}``, e.g. from
            :func:`hardbatch.metrics.similarity_histogram` or ``plan_stats(...)["histogram"]``.
        path: output file (``.png``, ``.pdf``, ``.svg``, ...); parent folders are created.
        title: figure title.
        density: normalise each histogram to unit area, so samplers with different numbers of
            pairs compare (default); False plots raw pair counts.
        log: a logarithmic y axis, on which the samplers' rare high-similarity tails (the hard
            negatives and near-copies) differ visibly; a linear axis shows only the bulk.

    Returns:
        ``path`` as a string.

    Example:
        >>> import pathlib, tempfile
        >>> import torch
        >>> from hardbatch.metrics import similarity_histogram
        >>> from hardbatch.plots import plot_similarity_histograms
        >>> _ = torch.manual_seed(0)
        >>> x = torch.randn(40, 8)
        >>> histograms = {"first 10": similarity_histogram(x, range(10), bins=20),
        ...               "last 10": similarity_histogram(x, range(30, 40), bins=20)}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = plot_similarity_histograms(histograms, pathlib.Path(tmp, "hist.png"))
        ...     print(pathlib.Path(path).name, pathlib.Path(path).stat().st_size > 0)
        hist.png True
    """
    if not isinstance(histograms, Mapping) or not histograms:
        raise ValueError("histograms must be a non-empty dict {name: (counts, edges)}")
    prepared = []
    for name, value in histograms.items():
        try:
            counts, edges = value
        except (TypeError, ValueError) as exc:
            raise ValueError(f"histograms[{name!r}] must be a pair (counts, edges)") from exc
        counts = _to_numpy(counts, f"histograms[{name!r}] counts")
        edges = _to_numpy(edges, f"histograms[{name!r}] edges")
        if edges.size != counts.size + 1:
            raise ValueError(f"histograms[{name!r}]: edges must have len(counts) + 1 = "
                             f"{counts.size + 1} entries, got {edges.size}")
        prepared.append((str(name), counts, edges))
    path = _prepare_path(path)
    fig, ax = _new_figure(len(prepared))
    for name, counts, edges in prepared:
        heights = counts
        total = counts.sum()
        if density and total > 0:
            heights = counts / (total * np.diff(edges))
        ax.stairs(heights, edges, label=f"{name} ({int(total):,} pairs)", linewidth=1.6)
    ax.set_xlabel("cosine similarity of in-batch pairs")
    ax.set_ylabel(("density" if density else "pairs") + (" (log scale)" if log else ""))
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend_below(fig, ax)
    fig.savefig(path)
    return path


def plot_metric_curves(curves: Mapping[str, tuple[Sequence, Sequence]], path, ylabel: str,
                       title: str = "", xlabel: str = "training step", *,
                       events: Mapping[str, Sequence] | None = None,
                       event_label: str = "rebuild", note: str = "") -> str:
    """One line per sampler of a diagnostic over training (BatchSampler Fig. 4 right).

    Args:
        curves: ``{name: (steps [T], values [T])}``, e.g. false-negative rate per logged step.
        path: output file; parent folders are created.
        ylabel, title, xlabel: axis labels and title.
        events: ``{name: steps}``: steps marked on that name's curve (a triangle in its colour),
            e.g. the steps at which a sampler rebuilt its graph or order.
        event_label: what the markers are, for the legend (``"rebuild"``).
        note: a line of text under the plot, e.g. the definition of the plotted quantity.

    Returns:
        ``path`` as a string.

    Example:
        >>> import pathlib, tempfile
        >>> from hardbatch.plots import plot_metric_curves
        >>> curves = {"uniform": ([1, 2, 3], [0.25, 0.24, 0.26]),
        ...           "knn": ([1, 2, 3], [0.4, 0.5, 0.6])}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = plot_metric_curves(curves, pathlib.Path(tmp, "plots", "fn.png"),
        ...                               "false-negative rate", events={"knn": [2]})
        ...     print(pathlib.Path(path).relative_to(tmp))
        plots/fn.png
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves must be a non-empty dict {name: (steps, values)}")
    prepared = []
    for name, value in curves.items():
        try:
            steps, values = value
        except (TypeError, ValueError) as exc:
            raise ValueError(f"curves[{name!r}] must be a pair (steps, values)") from exc
        steps = _to_numpy(steps, f"curves[{name!r}] steps")
        values = _to_numpy(values, f"curves[{name!r}] values")
        if steps.size != values.size:
            raise ValueError(f"curves[{name!r}]: steps has {steps.size} entries but values has "
                             f"{values.size}; pass one value per step")
        prepared.append((str(name), steps, values))
    events = dict(events or {})
    unknown = sorted(set(map(str, events)) - {name for name, _, _ in prepared})
    if unknown:
        raise ValueError(f"events names {unknown} have no curve; use names of curves")
    path = _prepare_path(path)
    fig, ax = _new_figure(len(prepared) + (1 if events else 0) + (2 if note else 0))
    for name, steps, values in prepared:
        marker = "o" if steps.size <= 30 else None
        (line,) = ax.plot(steps, values, label=name, marker=marker, markersize=3, linewidth=1.6)
        at = np.asarray(events.get(name, ()), dtype=np.float64)
        at = at[(at >= steps.min()) & (at <= steps.max())] if at.size else at
        if at.size:
            ax.plot(at, np.interp(at, steps, values), linestyle="none", marker="v",
                    markersize=6, color=line.get_color(), markeredgecolor="black",
                    markeredgewidth=0.4)
    if events:
        ax.plot([], [], linestyle="none", marker="v", color="grey", markeredgecolor="black",
                markeredgewidth=0.4, label=f"{event_label} (in the curve's colour)")
    if all(np.array_equal(steps, np.round(steps)) for _, steps, _ in prepared):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend_below(fig, ax)
    if note:
        import textwrap

        fig.text(0.01, 0.005, "\n".join(textwrap.wrap(note, 110)), fontsize="x-small",
                 va="bottom", ha="left")
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.06)
    fig.savefig(path)
    return path
