"""The SimCSE runs of the text page, arranged: run tags, loss settings, the main configuration,
the results table's cells and their paired effects.

A run's row is its sampler and its loss key (the loss and the training options that make a
different row: temperature, tau+, beta, ...); runs of the main tag's size with other sampler
options are ablations.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from hardbatch.registry import sampler_names

from .common import Progress, read_json
from .paired import PairedEffect, paired_effect

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark"]
SAMPLERS = ("default", *sampler_names())  # default: sentence-transformers' own sampler
LOSS_NAME = {"mnrl": "MNRL", "infonce": "InfoNCE", "dcl": "DCL", "hcl": "HCL"}
LOSSES = tuple(LOSS_NAME)  # the table's order; mnrl: sentence-transformers' own loss
# the run options that shape each sampler's batches (shown for ablation rows)
SAMPLER_OPTIONS = {"proximity": ("candidates", "neighbors", "restart"), "gcbs": ("quantile",),
                   "knn": (), "uniform": (), "default": ()}
# training options that make a different row of the results table (loss settings and the like)
LOSS_OPTIONS = ("temperature", "tau_plus", "beta", "lr", "batch_size", "max_seq_length_train")


def sampler_opts(r: dict) -> tuple:
    return tuple((k, r["config"].get(k)) for k in SAMPLER_OPTIONS.get(r["sampler"], ()))


def loss_key(r: dict) -> tuple:
    """A run's row key beside its sampler: the loss and its training options."""
    return (r["loss"],) + tuple(r["config"].get(k) for k in LOSS_OPTIONS)


def loss_label(key: tuple, main_cfg: dict) -> str:
    """``DCL (t 0.05, tau+ 0.1)``: the loss, with its temperature / tau+ / beta where it has them
    and any other training option that differs from the main configuration."""
    opts = dict(zip(LOSS_OPTIONS, key[1:]))
    parts = []
    if key[0] in ("dcl", "hcl") or opts["temperature"] != main_cfg.get("temperature"):
        parts.append(f"t {opts['temperature']:g}")
    if opts["tau_plus"] is not None:
        parts.append(f"tau+ {opts['tau_plus']:g}")
    if opts["beta"] is not None:
        parts.append(f"beta {opts['beta']:g}")
    for k in LOSS_OPTIONS[3:]:
        if opts[k] != main_cfg.get(k):
            parts.append(f"{k} {opts[k]:g}")
    return LOSS_NAME[key[0]] + (f" ({', '.join(parts)})" if parts else "")


def never_trained(r: dict) -> bool:
    """A run whose mean loss is ~0 from the start (DCL / HCL on their debiasing floor)."""
    return r["train_loss"] <= 1e-10


def r_base(tag: str | None) -> str:
    """A run tag without its options hash (``n5120_steps80_hc5d607`` -> ``n5120_steps80``)."""
    return re.sub(r"_h[0-9a-f]{6}$", "", tag or "")


def avg_by_seed(seeds: dict) -> dict:
    """``{seed: STS Avg}`` of a row's ``{seed: run}``."""
    return {k: r["avg"] for k, r in seeds.items()}


def effect_of(seeds: dict, ref: dict | None) -> PairedEffect | bool | None:
    """The paired effect (Avg by seed) of ``seeds`` over ``ref``: False where there is no
    reference row (or the row is its own reference), None where the rows share no seed."""
    if not ref:
        return False
    return paired_effect(avg_by_seed(seeds), avg_by_seed(ref))


class TextRuns:
    """The finished runs arranged for the page.

    ``main_tag`` / ``cfg``: the main configuration's run tag and config; ``cells[(sampler,
    loss_key)][seed]``: the results table (runs of the main tag's size with the grid's sampler
    options); ``ablations``: runs of that size with other sampler options; ``base``: the
    ``default`` + MNRL row, every Δ's reference; ``order``: the table's rows; ``za``: the
    zero-shot model's 6-task Avg (NaN without it).
    """

    def __init__(self, runs: list[dict], zero: dict | None, plans: list[dict]) -> None:
        self.runs, self.zero, self.plans = runs, zero, plans
        self.groups: dict[str, list[dict]] = defaultdict(list)
        for r in runs:
            self.groups[r["tag"]].append(r)
        groups = self.groups
        # The main configuration: tags without an options hash first (runs with other options,
        # e.g. t 0.5, are rows or ablations beside it however many they are), then the most runs.
        self.main_tag = max(groups, key=lambda t: (r_base(t) == t, len(groups[t]),
                                                   groups[t][0]["config"]["num_sentences"]),
                            default=None)
        self.za = (statistics.mean(zero["tasks"][t]["spearman"] for t in TASKS
                                   if t in zero["tasks"]) if zero else math.nan)
        self.cfg = self.sel[0]["config"] if self.sel else {}
        # Same data size / steps as the main tag: runs with the grid's sampler options are rows
        # of the table (one row per sampler x loss setting); other sampler options are ablations.
        same_base = [r for t, g in groups.items() if self.main_tag and r_base(t) == r_base(
            self.main_tag) for r in g]
        grid_opts = {r["sampler"]: sampler_opts(r) for r in self.sel}
        self.cells: dict = defaultdict(dict)
        self.ablations: list[dict] = []
        for r in same_base:
            if sampler_opts(r) == grid_opts.get(r["sampler"], sampler_opts(r)):
                self.cells[(r["sampler"], loss_key(r))][r["seed"]] = r
            else:
                self.ablations.append(r)
        self.base_key = next((loss_key(r) for r in self.sel if r["sampler"] == "default"
                              and r["loss"] == "mnrl"), None)
        self.base = self.cells.get(("default", self.base_key), {})
        keys = sorted({k for _, k in self.cells}, key=lambda k: (LOSSES.index(k[0]), str(k[1:])))
        self.order = [(s, k) for k in keys for s in SAMPLERS if (s, k) in self.cells]

    @property
    def sel(self) -> list[dict]:
        """The runs of the main tag."""
        return self.groups.get(self.main_tag, [])

    def row_effects(self, s: str, k: tuple) -> tuple[PairedEffect | bool | None,
                                                     PairedEffect | bool | None, bool]:
        """A table row's paired effect (:func:`effect_of`) vs ``default`` + MNRL, its effect vs
        the ``default`` sampler with the same loss and options, and whether that reference is
        ``default`` + MNRL itself. Seed k of every row starts from the same model with the same
        training seed and is scored on the same STS test sets, so the rows pair by seed."""
        seeds = self.cells[(s, k)]
        d = effect_of(seeds, self.base if (s, k) != ("default", self.base_key) else None)
        # InfoNCE is MNRL (tested): its rows' same-loss reference is default + MNRL, same options.
        same_ref = self.cells.get(("default", k)) or (
            self.cells.get(("default", ("mnrl",) + k[1:]), {}) if k[0] == "infonce" else {})
        d_same = effect_of(seeds, same_ref if s != "default" else None)
        return d, d_same, same_ref is self.base


def load(results: Path, progress: Progress | None = None) -> TextRuns:
    """The SimCSE runs, the zero-shot evaluation and the plan-only runs under ``results``
    (other files are counted as skipped in ``progress``)."""
    runs, zero, plans = [], None, []
    for p, rec in read_json(results, progress):
        if not isinstance(rec, dict):
            if progress is not None:
                progress.skipped += 1
        elif p.name.startswith("zero_shot") and "tasks" in rec and not rec.get("limit"):
            zero = rec
        elif rec.get("benchmark") == "simcse" and "avg" in rec:
            rec["_file"] = p.name
            runs.append(rec)
        elif rec.get("benchmark") == "simcse-plan" and "plan_diagnostics" in rec:
            plans.append(rec)
        elif progress is not None and p.name != "debias_floor.json":  # (read by its section)
            progress.skipped += 1
    return TextRuns(runs, zero, plans)
