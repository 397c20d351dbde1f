"""The GraphCL grid of the graphs page: datasets, samplers, losses and planned seeds, the
paper's numbers, and the finished runs read from their JSONs.

A cell is ``(dataset, sampler, loss)``; its runs are keyed by seed.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from hardbatch.registry import sampler_names

from .common import Progress, mean_std, read_json

DATASETS = ["IMDB-BINARY", "COLLAB", "REDDIT-BINARY", "PROTEINS", "MUTAG", "NCI1"]
SHORT = {"IMDB-BINARY": "IMDB-B", "REDDIT-BINARY": "REDDIT-B"}
SAMPLERS = sampler_names()
EXPECTED_SEEDS = {"infonce": 5, "dcl": 3, "hcl": 3}  # the grid's losses and planned seeds
LOSSES = tuple(EXPECTED_SEEDS)
# BatchSampler paper (KDD 2023), Table 3 / Table 10, GraphCL rows
PAPER = {
    "uniform": dict(zip(DATASETS, [70.90, 70.62, 90.54, 74.39, 86.80, 77.87])),
    "proximity": dict(zip(DATASETS, [71.90, 71.48, 90.88, 75.04, 87.78, 78.93])),
    "knn": dict(zip(DATASETS, [70.72, 70.59, 90.21, 74.17, 86.46, 77.27])),
}


def load(results: Path, progress: Progress | None = None) -> tuple[dict, dict, dict]:
    """The finished runs under ``results``: ``runs[(dataset, sampler, loss)][seed]`` in the
    paper's setting, ``variants[(dataset, tag, sampler, loss)][seed]`` with overrides, and
    ``probes[dataset]``, the short timing runs (tags ``e<k>``)."""
    runs: dict = defaultdict(dict)
    variants: dict = defaultdict(dict)
    probes: dict = defaultdict(list)
    for f, rec in read_json(results, progress):
        if not isinstance(rec, dict) or "accuracy" not in rec:
            if progress is not None:
                progress.skipped += 1
            continue
        tag = rec.get("tag")
        if tag and tag.startswith("e") and tag[1:].isdigit():
            probes[rec["dataset"]].append(rec)
        elif tag:
            variants[(rec["dataset"], tag, rec["sampler"], rec["loss"])][rec["seed"]] = rec
        else:
            key = (rec["dataset"], rec["sampler"], rec["loss"])
            if rec["seed"] in runs[key]:
                print(f"warning: {f.name}: seed {rec['seed']} of {key} already read; keeping the "
                      "later file", file=sys.stderr)
            runs[key][rec["seed"]] = rec
    return runs, variants, probes


def accs(runs: dict, key) -> list[float]:
    """Per-seed accuracies (%) of one (dataset, sampler, loss) cell; [] when none ran."""
    return [100 * r["accuracy"] for r in runs.get(key, {}).values()]


def seed_accs(runs: dict, key) -> dict[int, float]:
    """``{seed: accuracy (%)}`` of one (dataset, sampler, loss) cell, for paired effects."""
    return {seed: 100 * r["accuracy"] for seed, r in runs.get(key, {}).items()}


def cell(runs: dict, key, expected: int) -> str:
    """``mean ± std`` of a cell's accuracies, ``(k/n)`` when seeds are missing, ``—`` if none."""
    recs = runs.get(key, {})
    if not recs:
        return "—"
    m, s = mean_std(accs(runs, key))
    mark = "" if len(recs) >= expected else f" ({len(recs)}/{expected})"
    return f"{m:.2f} ± {s:.2f}{mark}"


def short(dataset: str) -> str:
    """The column name of a dataset (``IMDB-BINARY`` -> ``IMDB-B``)."""
    return SHORT.get(dataset, dataset)


def paper_gap(source: dict, d: str) -> float:
    """Uniform InfoNCE mean minus the paper's GraphCL (points)."""
    return mean_std(accs(source, (d, "uniform", "infonce")))[0] - PAPER["uniform"][d]
