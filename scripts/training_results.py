#!/usr/bin/env python3
"""Regenerate the measured demo numbers of docs/training.md from `hardbatch demo` runs.

    python scripts/training_results.py                      # run seeds 0 1 2, write the JSONs
    python scripts/training_results.py --in-place           # ... and rewrite the page's block
    python scripts/training_results.py --render-only --in-place   # the block from the JSONs

Each seed runs ``hardbatch demo --sampler uniform,knn,proximity,gcbs --seed S`` in this process
(``hardbatch_experiments.demo.run_demo``, all other options at their defaults) and its numbers
go to ``results/demo/digits_seed<S>.json``: the command, the table's rows (without the per-step
curves and histograms of the demo's own ``results.json``), wall and CPU seconds, the machine and
its load average. The page quotes these files only through the text between
``<!-- training_results.py:demo -->`` and ``<!-- /training_results.py:demo -->``, which
:func:`render` builds from them; ``experiments/tests/test_demo.py`` fails when that text is not
what the files say. About 1.5 minutes per seed on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results" / "demo"
DOC = REPO / "docs" / "training.md"
SEEDS = (0, 1, 2)
SAMPLERS = "uniform,knn,proximity,gcbs"  # the four samplers the page discusses
MARK = "training_results.py:demo"
#: Per-sampler numbers of a row that the page quotes (besides the table's own columns).
KEPT = ("sampler", "knn_accuracy", "linear_probe_accuracy", "hardness",
        "mean_negative_similarity", "false_negative_rate", "coverage", "sampler_seconds",
        "step_seconds", "sampler_share", "refreshes", "steps", "wall_seconds", "final_loss")


def result_path(seed: int, folder: Path = RESULTS) -> Path:
    return folder / f"digits_seed{seed}.json"


def run_seed(seed: int, samplers: str = SAMPLERS) -> dict:
    """One ``hardbatch demo`` run (plots off, nothing written): the record kept for the page."""
    import torch

    from hardbatch_experiments.demo import DemoConfig, markdown_table, run_demo

    load_before = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    out = run_demo(DemoConfig(seed=seed, samplers=tuple(samplers.split(",")), out=None,
                              plots=False))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = [{k: r[k] for k in KEPT} for r in out["results"]]
    return {
        "command": f"hardbatch demo --sampler {samplers} --seed {seed}",
        "seed": seed, "config": out["config"], "data": out["data"], "results": rows,
        "table": markdown_table(rows, legend=False),
        "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "machine": (f"{platform.machine()} CPU, {os.cpu_count()} cores, torch "
                    f"{torch.__version__}, python {platform.python_version()}"),
        "date": time.strftime("%Y-%m-%d"),
    }


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}-{fmt.format(hi)}"


def render(records: list[dict]) -> str:
    """The page's generated text: each seed's table, then the spread over the seeds."""
    from hardbatch_experiments.demo import SAMPLER_TITLES, markdown_table

    records = sorted(records, key=lambda r: r["seed"])
    lines = []
    for rec in records:
        lo, hi = rec["load_average"]
        lines += [f"`{rec['command']}` ({rec['date']}; {rec['wall_seconds']:.0f} s wall, "
                  f"{rec['cpu_seconds']:.0f} s CPU; load average {lo:g} -> {hi:g} on "
                  f"{rec['machine']}):", "", markdown_table(rec["results"], legend=False), ""]
    names = [r["sampler"] for r in records[0]["results"]]
    lines += [f"Spread over seeds {', '.join(str(r['seed']) for r in records)} (min-max):", "",
              "| sampler | kNN acc | linear acc | mean cos | false-neg rate | coverage "
              "| sampler / step time |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        rows = [next(r for r in rec["results"] if r["sampler"] == name) for rec in records]
        cells = [_span([r[k] for r in rows], "{:.3f}") for k in
                 ("knn_accuracy", "linear_probe_accuracy", "mean_negative_similarity",
                  "false_negative_rate", "coverage")]
        cells.append(_span([100 * r["sampler_share"] for r in rows], "{:.1f}%"))
        lines.append(f"| {SAMPLER_TITLES.get(name, name)} | " + " | ".join(cells) + " |")
    lines += ["", "(`python scripts/training_results.py --in-place` from "
              + ", ".join(f"`results/demo/{result_path(r['seed']).name}`" for r in records)
              + ")"]
    return "\n".join(lines)


def replace_section(text: str, body: str) -> str:
    start, end = f"<!-- {MARK} -->", f"<!-- /{MARK} -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"the page needs one {start} ... {end} pair")
    head, rest = text.split(start)
    return f"{head}{start}\n{body}\n{end}{rest.split(end)[1]}"


def section(text: str) -> str:
    """The generated text now on the page."""
    start, end = f"<!-- {MARK} -->", f"<!-- /{MARK} -->"
    return text.split(start)[1].split(end)[0].strip("\n")


def load(seeds, folder: Path = RESULTS) -> list[dict]:
    return [json.loads(result_path(s, folder).read_text()) for s in seeds]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="default 0,1,2")
    ap.add_argument("--render-only", action="store_true",
                    help="no run: build the page's text from the JSON files as they are")
    ap.add_argument("--in-place", action="store_true", help="rewrite the page's block")
    ap.add_argument("--doc", default=str(DOC), help="the page (default docs/training.md)")
    ap.add_argument("--results", default=str(RESULTS), help="the JSON folder (results/demo)")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    folder = Path(args.results)
    if not args.render_only:
        folder.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            record = run_seed(seed)
            result_path(seed, folder).write_text(json.dumps(record, indent=1) + "\n")
            print(f"wrote {result_path(seed, folder)}", flush=True)
    body = render(load(seeds, folder))
    print(body)
    if args.in_place:
        doc = Path(args.doc)
        doc.write_text(replace_section(doc.read_text(), body))
        print(f"rewrote the {MARK} block of {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
