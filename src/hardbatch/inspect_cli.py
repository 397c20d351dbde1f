"""``hardbatch inspect``: compare batch samplers on a set of embeddings, without training.

Draws ``--batches`` batches from each requested sampler configuration, computes the diagnostics
of :mod:`hardbatch.metrics` (hardness, false-negative rate when labels are given, duplicate
rate, coverage of the drawn batches, mean in-batch similarity, sampler time; optionally the
global-vs-batch NT-Xent loss gap), prints a markdown table, a legend of its columns
(:data:`LEGEND`) and notes on reading it, and writes ``inspect.json`` (with the legend and
notes), ``inspect.md`` and ``similarity_histograms.png`` (log density: the samplers differ in
the high-similarity tail) into ``--out``. By default each sampler draws one epoch, ``ceil(N /
B)`` batches, so coverage is that of one epoch. With ``--reference FILE`` the
similarity figures are measured in that fixed embedding too (``ref.`` columns,
``reference_similarity_histograms.png``): batches built from one embedding (or by samplers run
on different ones) compare in one coordinate system.

``hardbatch.cli`` wires it in with :func:`add_inspect_parser`; ``python -m
hardbatch.inspect_cli EMBEDDINGS ...`` runs it standalone. Input problems (missing file,
unknown extension, wrong shape, label count mismatch, invalid sampler parameters) exit with
code 2 and a one-line message on stderr. Samplers are built by :mod:`hardbatch.registry`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from ._inspect_report import LEGEND, fmt, jsonable, legend_of, markdown_table, reading_notes
from .cli_types import open_probability, positive_int, restart_probability, temperature
from .neighbors.knn_graph import check_graph_sizes
from .metrics.files import load_reference, read_embeddings_file, read_labels_file
from .registry import make_sampler, parse_names, sampler_names

__all__ = ["LEGEND", "add_inspect_parser", "build_parser", "main", "run_inspect"]

DEFAULT_BATCH_SIZE, DEFAULT_CANDIDATES, DEFAULT_NEIGHBORS = 512, 1000, 100

DESCRIPTION = """\
Compare hard-negative batch samplers on fixed embeddings (no training): draws one epoch of
batches (or --batches) from each sampler and reports hardness (mean top-1 in-batch cosine), mean
in-batch cosine, false-negative rate (with --labels), duplicate rate, coverage and sampler time,
as a markdown table followed by a legend of its columns and notes, plus inspect.json, inspect.md
and similarity_histograms.png (log density) in --out. --reference FILE
measures the same batches in a fixed reference embedding too (one coordinate system for
every sampler: e.g. a pretrained encoder's embeddings of the same N items)."""

EPILOG = """\
EMBEDDINGS: .npy, .npz (array 'embeddings' if present, else the first), .pt/.pth (a tensor or a
dict with key 'embeddings'); shape [N, d]. --labels: .npy/.npz/.pt (key 'labels' if a dict or
npz holds it) or .txt/.csv with one label per line; N entries. --reference: like EMBEDDINGS,
[N, d'] with one row per item in the same order (d' may differ).
--batch-size, --candidates and --neighbors left at their defaults are lowered to fit small N.
example: hardbatch inspect emb.npy --labels labels.npy --sampler uniform,proximity --out report"""


class InspectError(Exception):
    """A user-facing input problem: reported on stderr, exit code 2."""


# ---------------------------------------------------------------------------------------------
# parser
# ---------------------------------------------------------------------------------------------
def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("embeddings", metavar="EMBEDDINGS",
                        help="item embeddings [N, d]: .npy, .npz or .pt")
    parser.add_argument("--labels", metavar="FILE", default=None,
                        help="class labels [N] (.npy/.npz/.pt/.txt) for the false-negative rate")
    parser.add_argument("--reference", metavar="FILE", default=None,
                        help="fixed reference embedding [N, d'] (.npy/.npz/.pt) in which "
                             "hardness, mean similarity, near-duplicate rate and loss gap are "
                             "measured too (ref. columns)")
    parser.add_argument("--sampler", default="all", metavar="NAME[,NAME]",
                        help=f"samplers to compare: {', '.join(sampler_names())} or all; "
                             "several comma-separated, e.g. uniform,gcbs (default: all)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help=f"batch size (default {DEFAULT_BATCH_SIZE}, lowered for small N)")
    parser.add_argument("--candidates", type=positive_int, default=None, metavar="M",
                        help="proximity: candidate pool per item "
                             f"(default {DEFAULT_CANDIDATES}, must be < N)")
    parser.add_argument("--neighbors", type=positive_int, default=None, metavar="K",
                        help=f"proximity: neighbours kept (default {DEFAULT_NEIGHBORS}, "
                             "must be < candidates)")
    parser.add_argument("--restart", type=restart_probability, default=0.2,
                        metavar="ALPHA", help="proximity: restart probability (default 0.2)")
    parser.add_argument("--walk", choices=("rwr", "rw", "bfs", "dfs"), default="rwr",
                        help="proximity: walk (default rwr)")
    parser.add_argument("--quantile", type=open_probability, default=0.999, metavar="Q",
                        help="gcbs: similarity quantile kept as edges (default 0.999)")
    parser.add_argument("--batches", type=positive_int, default=None, metavar="NUM",
                        help="batches drawn per sampler (default: one epoch, ceil(N / B); more "
                             "continue into the next epoch, and coverage then counts them all)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--bins", type=positive_int, default=50,
                        help="histogram bins (default 50)")
    parser.add_argument("--loss-gap", action="store_true",
                        help="also compute the global-vs-batch NT-Xent loss gap of the drawn "
                             "batches (O(N^2 d); about a minute at N = 100k on 2 cores)")
    parser.add_argument("--temperature", type=temperature, default=0.5, metavar="T",
                        help="temperature of --loss-gap (default 0.5; each item is its own "
                             "positive, so below about 0.1 every loss and gap is near 0)")
    parser.add_argument("--out", default="hardbatch-inspect", metavar="DIR",
                        help="output folder (default ./hardbatch-inspect)")


def add_inspect_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``inspect`` on an ``argparse`` subparsers object (``set_defaults(func=run_inspect)``).

    Example:
        >>> import argparse
        >>> from hardbatch.inspect_cli import add_inspect_parser
        >>> parser = argparse.ArgumentParser(prog="mytool")
        >>> _ = add_inspect_parser(parser.add_subparsers(dest="command"))
        >>> args = parser.parse_args(["inspect", "emb.npy", "--batches", "5"])
        >>> args.command, args.embeddings, args.batches, args.func.__name__
        ('inspect', 'emb.npy', 5, 'run_inspect')
    """
    parser = subparsers.add_parser(
        "inspect", help="compare batch samplers on fixed embeddings (hardness, false negatives)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    parser.set_defaults(func=run_inspect)
    return parser


def build_parser(prog: str = "hardbatch inspect") -> argparse.ArgumentParser:
    """A standalone parser with the same arguments (for ``python -m hardbatch.inspect_cli``).

    Example:
        >>> from hardbatch.inspect_cli import build_parser
        >>> args = build_parser().parse_args(["emb.npy", "--sampler", "uniform,knn", "--seed", "1"])
        >>> args.sampler, args.seed, args.quantile, args.out
        ('uniform,knn', 1, 0.999, 'hardbatch-inspect')
    """
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    parser.set_defaults(func=run_inspect)
    return parser


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def load_embeddings(path: str) -> np.ndarray:
    """[N, d] float32 embeddings from .npy / .npz / .pt (see the module docstring)."""
    return read_embeddings_file(path)


def load_labels(path: str, num_items: int) -> np.ndarray:
    """[N] labels from .npy / .npz / .pt / .txt (one per line)."""
    return read_labels_file(path, num_items)


# ---------------------------------------------------------------------------------------------
# sampler configurations
# ---------------------------------------------------------------------------------------------
def _resolve_parameters(args, n: int, samplers: list[str]) -> tuple[dict, list[str]]:
    """Fill defaults for N and check explicit values; returns (params, notes)."""
    notes = []
    b = args.batch_size
    if b is None:
        b = DEFAULT_BATCH_SIZE
        limit = n - 1 if "knn" in samplers else n
        if b > limit:
            b = max(1, min(limit, n // 4) if n >= 8 else limit)
            notes.append(f"--batch-size lowered from {DEFAULT_BATCH_SIZE} to {b} for N={n} "
                         "items (default)")
    else:
        if b > n:
            raise InspectError(f"--batch-size {b} is larger than the number of items N={n}; "
                               f"use --batch-size {max(1, n // 4)} or less")
        if "knn" in samplers and b >= n:
            raise InspectError(f"--batch-size {b} must be smaller than N={n} for the knn "
                               f"sampler (anchor plus B-1 neighbours); use --batch-size "
                               f"{max(1, n // 4)}")
    params = {"batch_size": b}
    if "proximity" in samplers:
        m, k = args.candidates, args.neighbors
        if m is None:
            m = DEFAULT_CANDIDATES
            if m >= n:
                m = n // 2
                notes.append(f"--candidates lowered from {DEFAULT_CANDIDATES} to {m} for "
                             f"N={n} items (default)")
        if k is None:
            k = DEFAULT_NEIGHBORS
            if k >= m:
                k = max(1, m // 5)
                notes.append(f"--neighbors lowered from {DEFAULT_NEIGHBORS} to {k} (must be "
                             f"< candidates={m}) (default)")
        if m < 2:
            raise InspectError(f"N={n} items are too few for the proximity sampler (needs "
                               "candidates < N and neighbors < candidates); drop it from "
                               "--sampler")
        check_graph_sizes(m, k, n, flags=True)
        params.update(candidates=m, neighbors=k, restart=args.restart, walk=args.walk)
    if "gcbs" in samplers:
        params["quantile"] = args.quantile
    return params, notes


def _sampler_config(name: str, params: dict) -> dict:
    """The options of sampler ``name`` that its row label and JSON entry show."""
    keys = {"proximity": ("candidates", "neighbors", "restart", "walk"),
            "gcbs": ("quantile",)}.get(name, ())
    return {k: params[k] for k in keys}


def _make_sampler(name: str, x: np.ndarray, params: dict, seed: int):
    """``(sampler, config)``: the sampler over fixed embeddings (graphs built once)."""
    config = _sampler_config(name, params)
    fixed = {"refresh_every": None} if name in ("knn", "proximity") else {}
    return make_sampler(name, x, params["batch_size"], seed=seed, **config, **fixed), config


def _warm_up(name: str, dim: int, params: dict) -> None:
    """Draw from a tiny random set first, so sampler time excludes numba's one-off JIT/cache load."""
    tiny = np.random.default_rng(0).standard_normal((64, dim)).astype(np.float32)
    small = {"batch_size": 8, "candidates": 16, "neighbors": 4,
             "restart": params.get("restart", 0.2), "walk": params.get("walk", "rwr"),
             "quantile": params.get("quantile", 0.999)}
    with contextlib.suppress(Exception):  # a warm-up failure only affects the timing column
        _draw(_make_sampler(name, tiny, small, 0)[0], 2)


def _draw(sampler, count: int) -> list[list[int]]:
    """``count`` batches, continuing into later epochs when one epoch is shorter."""
    batches: list[list[int]] = []
    while len(batches) < count:
        before = len(batches)
        for batch in sampler:  # an epoch; the sampler advances its epoch when it completes
            batches.append(batch)
            if len(batches) >= count:
                break
        if len(batches) == before:  # pragma: no cover - an empty epoch (drop_last, tiny N)
            break
    return batches


def _label(name: str, config: dict) -> str:
    if name == "proximity":
        return (f"proximity ({config['walk']}, M={config['candidates']}, K={config['neighbors']}, "
                f"alpha={config['restart']:g})")
    if name == "gcbs":
        return f"gcbs (q={config['quantile']:g})"
    return name


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------
def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _inspect(args) -> int:
    from .metrics import LossGap, plan_stats
    from .plots import plot_similarity_histograms

    samplers = parse_names(args.sampler, "sampler")
    x = load_embeddings(args.embeddings)
    n, d = x.shape
    labels = None if args.labels is None else load_labels(args.labels, n)
    ref = None if args.reference is None else load_reference(args.reference, n, "--reference")
    params, notes = _resolve_parameters(args, n, samplers)
    for note in notes:
        _progress(f"note: {note}")
    num_batches = args.batches or math.ceil(n / params["batch_size"])  # default: one epoch
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InspectError(f"cannot create --out folder {args.out}: {exc.strerror}") from None

    # every sampler built (and checked) before any long computation: a missing extra or a bad
    # option fails now, not after the loss gap and the other samplers' draws
    made = []
    every = [v.strip().lower() for v in str(args.sampler).split(",")] == ["all"]
    for name in samplers:
        try:
            made.append((name, *_make_sampler(name, x, params, args.seed)))
        except ImportError as exc:
            if not every:
                raise InspectError(f"{name} sampler: {exc} (otherwise drop {name} from "
                                   "--sampler)") from None
            notes.append(f"{name} left out of --sampler all: {exc}")
            _progress(f"note: {notes[-1]}")
        except ValueError as exc:  # its fix may name an option with no flag
            raise InspectError(f"{name} sampler: {exc} (this command sets only its flags, "
                               f"hardbatch inspect --help; otherwise drop {name} from "
                               "--sampler)") from None

    gap = None
    if args.loss_gap:
        _progress(f"loss gap: global NT-Xent term over N={n} items (t={args.temperature:g}) ...")
        gap = LossGap(x, args.temperature, reference=ref)
        gap.global_losses  # noqa: B018 - computed now, under the progress message above
        if gap.reference is not None:
            gap.reference.global_losses  # noqa: B018

    rows, results, histograms, ref_histograms = [], {}, {}, {}
    for name, sampler, config in made:
        label = _label(name, config)
        _progress(f"drawing {num_batches} batches of {params['batch_size']} from {label} ...")
        _warm_up(name, d, params)
        t0 = time.perf_counter()
        batches = _draw(sampler, num_batches)
        seconds = time.perf_counter() - t0
        stats = plan_stats(x, batches, labels, bins=args.bins, reference=ref)
        counts, edges = stats.pop("histogram")
        histograms[label] = (counts, edges)
        extra = {}
        if ref is not None:
            ref_histograms[label] = stats.pop("reference_histogram")
            extra["reference_histogram"] = {"counts": ref_histograms[label][0].tolist(),
                                            "edges": ref_histograms[label][1].tolist()}
        row = {"sampler": name, "label": label, "batch_size": params["batch_size"],
               **config, **stats, "sampler_seconds": seconds,
               "seconds_per_batch": seconds / max(1, len(batches))}
        if gap is not None:
            plan_gap = gap(batches)
            row.update(loss_gap=plan_gap["gap"], global_loss=plan_gap["global_loss"],
                       batch_loss=plan_gap["batch_loss"])
            if ref is not None:
                row.update(reference_loss_gap=plan_gap["reference_gap"],
                           reference_global_loss=plan_gap["reference_global_loss"],
                           reference_batch_loss=plan_gap["reference_batch_loss"])
        rows.append(row)
        results[name] = {**row, "histogram": {"counts": counts.tolist(),
                                              "edges": edges.tolist()}, **extra}

    table = markdown_table(rows, labels is not None, gap is not None, ref is not None)
    header = [f"# hardbatch inspect: {args.embeddings}", "",
              f"N = {n} items, d = {d}, {num_batches} batches per sampler, seed {args.seed}"]
    chance = None
    if labels is not None:
        _, cnt = np.unique(labels, return_counts=True)
        cnt = cnt.astype(np.float64)
        chance = float((cnt * (cnt - 1)).sum() / (n * (n - 1)))
        header.append(f"labels: {len(cnt)} classes; FN rate of random pairs (uniform "
                      f"expectation): {chance:.3f}")
    if ref is not None:
        header.append(f"reference: {args.reference} (d = {ref.shape[1]}); ref. columns measure "
                      "the same batches in it (near-dup: pairs with cosine > 0.9)")
    if gap is not None:
        header.append(f"loss gap: mean over drawn items of global minus in-batch NT-Xent loss "
                      f"(t = {args.temperature:g}); global loss = "
                      f"{fmt(rows[0]['global_loss'], None)}")
    legend = legend_of(table)
    notes = notes + reading_notes(args, n, params["batch_size"], num_batches, rows, chance)
    files = {"table": str(out_dir / "inspect.md")}
    try:  # the figures need the plots extra; without it the numbers are still written
        files["plot"] = str(plot_similarity_histograms(
            histograms, out_dir / "similarity_histograms.png", log=True,
            title=f"In-batch cosine similarity, log density (N={n}, B={params['batch_size']}, "
                  f"{num_batches} batches)"))
        if ref is not None:
            files["reference_plot"] = str(plot_similarity_histograms(
                ref_histograms, out_dir / "reference_similarity_histograms.png", log=True,
                title=f"In-batch cosine similarity in the reference, log density "
                      f"({Path(args.reference).name})"))
    except ImportError as exc:
        notes.append(f"no figures: {exc}")
    report = ("\n".join(header) + "\n\n" + table + "\n\n"
              + "\n".join(f"- {name}: {meaning}" for name, meaning in legend.items()) + "\n\n"
              + "\n".join(f"note: {note}" for note in notes) + "\n")
    summary = {
        "embeddings": str(args.embeddings), "labels": args.labels, "reference": args.reference,
        "num_items": n, "dim": d, "num_classes": None if labels is None else len(np.unique(labels)),
        "chance_false_negative_rate": chance,
        "parameters": {**params, "batches": num_batches, "seed": args.seed, "bins": args.bins,
                       "temperature": args.temperature if args.loss_gap else None},
        "legend": legend, "notes": notes, "samplers": results,
        "files": files,
    }
    (out_dir / "inspect.md").write_text(report)
    with open(out_dir / "inspect.json", "w") as fh:
        json.dump(jsonable(summary), fh, indent=2)
    print(report, end="")
    print(f"\nwrote {out_dir / 'inspect.json'}, {', '.join(files.values())}")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    """Run ``hardbatch inspect`` with parsed ``args``; returns the exit code (0, or 2 on bad input).

    Example:
        >>> import contextlib, io, pathlib, tempfile
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> tmp = tempfile.TemporaryDirectory()
        >>> emb, labels = pathlib.Path(tmp.name, "emb.npy"), pathlib.Path(tmp.name, "labels.npy")
        >>> np.save(emb, rng.standard_normal((40, 8)).astype("float32"))  # N = 40, d = 8
        >>> np.save(labels, np.arange(40) % 4)
        >>> from hardbatch.inspect_cli import build_parser, run_inspect
        >>> args = build_parser().parse_args([str(emb), "--labels", str(labels), "--sampler",
        ...                                   "uniform,knn", "--batches", "5", "--out", tmp.name])
        >>> out = io.StringIO()
        >>> with contextlib.redirect_stdout(out):  # the markdown table, and the files written
        ...     code = run_inspect(args)
        >>> code, "| knn | 5 | 10 |" in out.getvalue()
        (0, True)
        >>> sorted(p.name for p in pathlib.Path(tmp.name).glob("*.json"))
        ['inspect.json']
        >>> tmp.cleanup()
    """
    try:
        return _inspect(args)
    except InspectError as exc:
        print(f"hardbatch inspect: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # library validation (hardbatch raises ValueError naming the fix)
        print(f"hardbatch inspect: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # writing into --out failed (permissions, disk full)
        print(f"hardbatch inspect: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        print("hardbatch inspect: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m hardbatch.inspect_cli EMBEDDINGS [options]``.

    Example:
        >>> import contextlib, io, pathlib, tempfile
        >>> import numpy as np
        >>> from hardbatch.inspect_cli import main
        >>> tmp = tempfile.TemporaryDirectory()
        >>> emb = np.random.default_rng(0).standard_normal((40, 8)).astype("float32")  # N = 40
        >>> np.save(pathlib.Path(tmp.name, "emb.npy"), emb)
        >>> with contextlib.redirect_stdout(io.StringIO()):
        ...     code = main([str(pathlib.Path(tmp.name, "emb.npy")), "--sampler", "gcbs",
        ...                  "--batches", "4", "--out", tmp.name])
        >>> code, sorted(p.name for p in pathlib.Path(tmp.name).glob("inspect.*"))
        (0, ['inspect.json', 'inspect.md'])
        >>> main(["missing.npy"])  # 'hardbatch inspect: error: ...' on stderr
        2
        >>> tmp.cleanup()
    """
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
