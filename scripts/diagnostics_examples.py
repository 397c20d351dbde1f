#!/usr/bin/env python3
"""Regenerate the example outputs of docs/diagnostics.md: the Python example's printout and
the `hardbatch inspect` tables on digits and on the MNIST test set.

    python scripts/diagnostics_examples.py                 # all three; write out/diagnostics/
    python scripts/diagnostics_examples.py --only digits   # one of python, digits, mnist
    python scripts/diagnostics_examples.py --in-place      # also rewrite the page's outputs

Each output goes to ``out/diagnostics/NAME.md`` and is printed; with ``--in-place`` it also
replaces the text between ``<!-- diagnostics_examples.py:NAME -->`` and
``<!-- /diagnostics_examples.py:NAME -->`` in docs/diagnostics.md (``--doc`` picks another
file), ending with the command, seed, machine and wall time. The Python example is the page's
first ```python block under "## Example (Python)", run as it stands. Data: scikit-learn's
digits (bundled) and MNIST from ``$HARDBATCH_DATA`` / ``../shared/data``; nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

EXAMPLES = ("python", "digits", "mnist")
SAMPLERS = ["--sampler", "uniform,knn,proximity,gcbs"]  # the page's four (all: six, two extras)
DIGITS_ARGS = ["--labels", "digits_y.npy", *SAMPLERS, "--batch-size", "128", "--candidates",
               "500", "--neighbors", "50", "--batches", "15", "--loss-gap", "--temperature", "0.1"]
MNIST_ARGS = ["--labels", "mnist_test_labels.npy", "--batches", "20", *SAMPLERS, "--loss-gap"]


def machine() -> str:
    import torch

    return (f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"python {platform.python_version()}")


def python_example(doc: Path) -> str:
    """Run the page's Python example and return what it prints."""
    text = doc.read_text()
    section = text[text.index("## Example (Python)"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{doc}:Example (Python)", "exec"),  # noqa: S102 - the page's own
             {"__name__": "__main__"})                            # example, as a reader runs it
    return "```\n" + out.getvalue() + "```"


def inspect_table(embeddings: str, args: list[str], cwd: Path) -> str:
    """``hardbatch inspect`` on files in ``cwd``: its header (as a code block) and table."""
    from hardbatch import inspect_cli

    out = io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            code = inspect_cli.main([embeddings, *args, "--out", "inspect"])
    finally:
        os.chdir(here)
    if code != 0:
        raise SystemExit(f"hardbatch inspect failed (exit {code})")
    lines = out.getvalue().splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    header = [ln for ln in lines[:lines.index(table[0])] if ln.strip()]
    return "```\n" + "\n".join(header) + "\n```\n\n" + "\n".join(table)


def digits_files(folder: Path) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    np.save(folder / "digits_x.npy", (x - x.mean(0)).astype(np.float32))
    np.save(folder / "digits_y.npy", y)


def mnist_files(folder: Path) -> None:
    """64 PCA dimensions of the 10,000 MNIST test images (PCA fit on the same images)."""
    from hardbatch_experiments.datasets import load_mnist

    images, labels = load_mnist(split="test")
    x = images.reshape(len(images), -1).numpy().astype(np.float32) / 255.0
    x -= x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    np.save(folder / "mnist_test_pca64.npy", (x @ vt[:64].T).astype(np.float32))
    np.save(folder / "mnist_test_labels.npy", labels.numpy())


def run(name: str, doc: Path, folder: Path) -> str:
    if name == "python":
        return python_example(doc)
    if name == "digits":
        digits_files(folder)
        return inspect_table("digits_x.npy", DIGITS_ARGS, folder)
    mnist_files(folder)
    return inspect_table("mnist_test_pca64.npy", MNIST_ARGS, folder)


def replace_section(text: str, name: str, body: str) -> str:
    start, end = f"<!-- diagnostics_examples.py:{name} -->", \
        f"<!-- /diagnostics_examples.py:{name} -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"the page needs one {start} ... {end} pair around the {name} output")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(EXAMPLES),
                    help=f"comma-separated subset of {', '.join(EXAMPLES)} (default: all)")
    ap.add_argument("--out", default="out/diagnostics", help="folder for files and outputs")
    ap.add_argument("--doc", default="docs/diagnostics.md", help="the page (default %(default)s)")
    ap.add_argument("--in-place", action="store_true", help="rewrite the page's outputs")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(EXAMPLES))
    if unknown or not names:
        ap.error(f"--only takes names of {', '.join(EXAMPLES)}, got {args.only!r}")
    doc, out = Path(args.doc).resolve(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    page = doc.read_text()
    for name in names:
        print(f"[diagnostics_examples] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        body = run(name, doc, out.resolve())
        body += (f"\n\n(`python scripts/diagnostics_examples.py --only {name}`, seed 0; "
                 f"{machine()}; {time.perf_counter() - t0:.0f} s wall, on a machine shared "
                 "with other jobs.)")
        (out / f"{name}.md").write_text(body + "\n")
        print(body, flush=True)
        page = replace_section(page, name, body)
    if args.in_place:
        doc.write_text(page)
        print(f"[diagnostics_examples] rewrote {doc}", file=sys.stderr)
    print(f"[diagnostics_examples] done: {len(names)} outputs in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
