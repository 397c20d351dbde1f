"""``hardbatch demo code``: what a hard batch holds on real code-search data, as text.

The first thing a retrieval user should see: ``pairs`` docstring-summary -> function-code pairs
drawn (seeded) from ``shared/data/code/train``, their queries embedded once by the starting
model (all-MiniLM-L6-v2, offline weights), then one epoch of batches from a hard sampler
(GCBS by default) and from the uniform sampler over the same pairs, both with ``duplicate_keys``
= the queries (an identical query is a false negative for MNRL, so no batch holds one twice).
It prints, for both samplers and measured in that one embedding, the mean batch hardness (top-1
negative cosine per anchor), packages per batch and queries per batch that another query of the
batch repeats word for word (with and without the keys); then the queries of the batch of median
hardness of each, side by side; then the
measured effect of such batches on fine-tuning, computed from the result files of
``docs/results/code_search.md`` when the repository's ``results/code_search/confirm`` is at hand.

Pure functions (:func:`epoch_batches`, :func:`batch_summary`, :func:`repeated_queries`,
:func:`median_batch`, :func:`side_by_side`, :func:`measured_effects`) and one runner (:func:`run_code_demo`); no training happens here.
"""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

import hardbatch as hb
from hardbatch.metrics import batch_hardness

from .data import load_code_pairs, split_path

__all__ = ["add_code_demo_arguments", "batch_summary", "epoch_batches", "measured_effects",
           "median_batch", "repeated_queries", "run_code_demo", "side_by_side"]

#: The result folder of the pre-registered confirmation, relative to the repository root.
CONFIRM = Path("results") / "code_search" / "confirm"
PAGE = "docs/results/code_search.md"


def epoch_batches(sampler_name: str, embeddings: np.ndarray, batch_size: int, seed: int,
                  keys: Sequence[str] | None = None) -> list[np.ndarray]:
    """Epoch 0 of registry sampler ``sampler_name`` over ``embeddings`` ([N, d]) at
    ``batch_size`` (``drop_last``), with ``duplicate_keys=keys`` when given, as id arrays."""
    options = {"seed": seed, "drop_last": True}
    if keys is not None:
        options["duplicate_keys"] = list(keys)
    sampler = hb.registry.make_sampler(sampler_name, embeddings, batch_size, **options)
    return [np.asarray(b, dtype=np.int64) for b in sampler]


def repeated_queries(batches: Sequence[np.ndarray], queries: Sequence[str]) -> np.ndarray:
    """Per batch, the queries whose exact text another query of the batch has (in-batch false
    negatives for MNRL)."""
    return np.asarray([sum(c for c in Counter(queries[i] for i in b).values() if c > 1)
                       for b in batches])


def batch_summary(embeddings: np.ndarray, batches: Sequence[np.ndarray],
                  queries: Sequence[str], packages: Sequence[str]) -> dict:
    """Over ``batches``: ``hardness`` (per batch, :func:`hardbatch.metrics.batch_hardness` in
    ``embeddings``), ``packages`` (distinct packages per batch), ``repeated``
    (:func:`repeated_queries`) and ``batches``; means in ``mean_*``."""
    hard = np.asarray([batch_hardness(embeddings, b) for b in batches])
    pk = np.asarray([len({packages[i] for i in b}) for b in batches])
    rep = repeated_queries(batches, queries)
    return {"hardness": hard, "packages": pk, "repeated": rep, "batches": len(batches),
            "mean_hardness": float(np.mean(hard)), "mean_packages": float(np.mean(pk)),
            "mean_repeated": float(np.mean(rep))}


def median_batch(hardness: np.ndarray) -> int:
    """Index of the batch of median hardness (the lower middle one for an even count): a
    typical batch, not the best one."""
    order = np.argsort(hardness, kind="stable")
    return int(order[(len(order) - 1) // 2])


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def side_by_side(left: Sequence[str], right: Sequence[str], titles: tuple[str, str],
                 width: int = 58) -> str:
    """Two columns of one-line texts (clipped to ``width``) under ``titles``."""
    rows = [f"  {titles[0]:<{width}} | {titles[1]}", f"  {'-' * width}-+-{'-' * width}"]
    for i in range(max(len(left), len(right))):
        a = _clip(left[i], width) if i < len(left) else ""
        b = _clip(right[i], width) if i < len(right) else ""
        rows.append(f"  {a:<{width}} | {b}")
    return "\n".join(rows)


def measured_effects(folder: Path, arms: Sequence[tuple[str, str]] = (
        ("gcbs", "default"), ("mined", "default"), ("community", "default"),
        ("community+mined", "mined"))) -> list[str]:
    """One line per ``(arm, baseline)`` of the code-search confirmation in ``folder``: test
    MRR@10 x 100, the mean per-seed difference with its 95% t-interval (n stated), or that no
    paired seed exists yet. Empty when ``folder`` holds no run."""
    from ...reports.code_search import paired_metric, runs_by_arm
    from ...reports.paired import effect_text

    by = runs_by_arm(folder) if folder.is_dir() else {}
    if not by:
        return []
    lines = []
    for arm, base in arms:
        e = paired_metric(by.get(arm, {}), by.get(base, {}), "test", "mrr@10")
        lines.append(f"  {arm} - {base}: {effect_text(e, 2, 100.0, missing='no paired seed yet')}")
    return lines


def _repo_confirm() -> Path:
    """``results/code_search/confirm`` of the checkout this package runs from (editable
    install), else of the working directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "experiments").is_dir():
            return parent / CONFIRM
    return Path.cwd() / CONFIRM


def add_code_demo_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``hardbatch demo code`` (on the demo's own parser)."""
    p.add_argument("--pairs", type=int, default=4096, metavar="N",
                   help="training pairs drawn from shared/data/code/train (default 4096)")
    p.add_argument("--hard-sampler", default="gcbs", metavar="NAME",
                   help="the hard sampler shown against uniform (default gcbs; any embedding "
                        "sampler of the registry: knn, proximity, cluster, community)")
    p.add_argument("--show", type=int, default=16, metavar="K",
                   help="queries of each batch printed (default 16)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="shared/data (default $HARDBATCH_DATA or ../shared/data)")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="code-search confirmation results (default the checkout's "
                        "results/code_search/confirm)")
    p.add_argument("--model", default="all-MiniLM-L6-v2",
                   help="starting model (default all-MiniLM-L6-v2, offline weights)")


def run_code_demo(args: argparse.Namespace) -> int:
    """Print what a hard batch and a uniform batch hold (see the module docstring)."""
    from ...sts import resolve_model_path
    from .model import encode_texts

    b = args.batch_size
    if b < 2:
        raise ValueError(f"--batch-size {b} must be at least 2 for the code demo")
    if args.pairs < 2 * b:
        raise ValueError(f"--pairs {args.pairs} must be at least two batches (2 x --batch-size "
                         f"= {2 * b}); raise --pairs or lower --batch-size")
    if args.show < 1:
        raise ValueError(f"--show {args.show} must be at least 1")
    hard_name = hb.registry.canonical_sampler(args.hard_sampler)
    if hard_name == "uniform":
        raise ValueError("--hard-sampler uniform is the baseline itself; pick gcbs, knn, "
                         "proximity, cluster or community")
    t0 = time.perf_counter()
    path = split_path("train", args.data_dir)
    pairs = load_code_pairs(path).sample(args.pairs, args.seed)
    if len(pairs) < args.pairs:
        raise ValueError(f"--pairs {args.pairs} exceeds the {len(pairs)} pairs of {path}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_model_path(args.model), device="cpu")
    print(f"[demo code] {len(pairs)} docstring -> code pairs of {path} (seed {args.seed}); "
          f"embedding the queries with {args.model} ...", flush=True)
    emb = encode_texts(model, pairs.queries, max_length=64)
    t_enc = time.perf_counter() - t0
    names = ("uniform", hard_name)
    plans = {n: epoch_batches(n, emb, b, args.seed, pairs.queries) for n in names}
    stats = {n: batch_summary(emb, plans[n], pairs.queries, pairs.packages) for n in names}
    bare = {n: float(np.mean(repeated_queries(epoch_batches(n, emb, b, args.seed),
                                              pairs.queries))) for n in names}
    print(f"\nhardbatch demo code: B = {b}, {stats['uniform']['batches']} batches per epoch, "
          f"measured in the starting model's query embedding ({t_enc:.0f} s to load and "
          f"embed)\n")
    w = max(len(hard_name), 7)
    print(f"  {'per batch, mean over the epoch':<52} {'uniform':>{w}} {hard_name:>{w}}")
    rows = (("batch hardness (top-1 negative cosine)",
             {n: stats[n]["mean_hardness"] for n in names}),
            ("packages per batch", {n: stats[n]["mean_packages"] for n in names}),
            ("queries with a word-for-word twin in the batch", bare),
            ("  the same with duplicate_keys=queries (shown)",
             {n: stats[n]["mean_repeated"] for n in names}))
    for what, value in rows:
        print(f"  {what:<52} {value['uniform']:>{w}.3f} {value[hard_name]:>{w}.3f}")
    k = min(args.show, b)
    pick = {n: plans[n][median_batch(stats[n]["hardness"])] for n in names}
    print(f"\nThe batch of median hardness of each ({k} of its {b} queries; package in "
          "brackets):\n")
    cols = {n: [f"[{pairs.packages[i]}] {pairs.queries[i]}" for i in pick[n][:k]]
            for n in names}
    print(side_by_side(cols["uniform"], cols[hard_name], ("uniform", hard_name)))
    folder = Path(args.results) if args.results else _repo_confirm()
    lines = measured_effects(folder)
    print()
    if lines:
        print(textwrap.fill(
            "What such batches do to fine-tuning (all-MiniLM-L6-v2, MNRL, 150 steps at B = 64; "
            f"test MRR@10 x 100, mean per-seed difference, 95% t-interval; from {folder}):",
            100))
        print("\n".join(lines))
    else:
        print(f"No code-search results found under {folder}.")
    print(f"See {PAGE} for the protocol, every arm and its cost.")
    return 0
