"""A results page = hand-written Markdown with generated table blocks.

``docs/results/NAME.md`` is written by hand except between the markers::

    <!-- table: KEY -->
    | generated | table |
    <!-- /table -->

which ``scripts/report_NAME.py`` fills with the table ``KEY`` built from the run JSONs under
``results/NAME`` (``--in-place`` rewrites the tracked page and its figures; by default the
filled page goes to ``out/reports/NAME.md``, figures to ``out/reports/figures/``). Every effect
the hand-written text quotes (``+x.xx [lo, hi]``) must stand in a table of the page
(``experiments/tests/test_results_pages.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["EFFECT", "TRACKED", "effects", "fill", "handwritten", "md", "mean", "ms", "pyplot",
           "read_runs", "report_main", "save", "tables_of"]

TRACKED = Path("docs/results")
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)
#: a quoted effect: signed mean and interval, two decimals
EFFECT = re.compile(r"[+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]")


def tables_of(text: str) -> dict[str, str]:
    """``{key: table text}`` of a page's generated blocks."""
    return {m[2]: m[3] for m in BLOCK.finditer(text)}


def handwritten(text: str) -> str:
    """The page without its generated blocks."""
    return BLOCK.sub("", text)


def effects(text: str) -> set[str]:
    """Every ``+x.xx [lo, hi]`` in ``text`` (line breaks inside one read as spaces)."""
    return set(EFFECT.findall(re.sub(r"\s+", " ", text)))


def fill(text: str, tables: dict[str, str]) -> str:
    """``text`` with every block's content replaced by its table; a block without a table or
    a table without a block is an error."""
    keys = set(tables_of(text))
    if keys != set(tables):
        raise ValueError(f"blocks without a table: {sorted(keys - set(tables))}; tables "
                         f"without a block: {sorted(set(tables) - keys)}")
    return BLOCK.sub(lambda m: m[1] + tables[m[2]].rstrip("\n") + "\n" + m[4], text)


def md(header: Iterable, rows: Iterable[Iterable]) -> str:
    """A Markdown table."""
    header = [str(h) for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def _finite(values: Iterable) -> list[float]:
    return [v for v in values if v is not None and v == v]


def ms(values: Iterable, digits: int = 2, scale: float = 1.0) -> str:
    """``mean ± std`` (sample std) of the finite ``values`` times ``scale``; one value alone;
    ``—`` for none."""
    v = _finite(values)
    if not v:
        return "—"
    m = f"{statistics.fmean(v) * scale:.{digits}f}"
    return m if len(v) == 1 else f"{m} ± {statistics.stdev(v) * scale:.{digits}f}"


def mean(values: Iterable, fmt: str = "{:.3f}") -> str:
    """The mean of the finite ``values`` formatted by ``fmt``; ``—`` for none."""
    v = _finite(values)
    return fmt.format(statistics.fmean(v)) if v else "—"


def read_runs(folder: Path, keep: Callable[[dict], bool]) -> list[dict]:
    """The readable ``*.json`` records of ``folder`` that ``keep`` accepts, by file name, each
    with its name under ``_file``."""
    out = []
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):  # a run still writing
            continue
        if isinstance(rec, dict) and keep(rec):
            out.append({**rec, "_file": path.name})
    return out


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> int:
    """Lay out ``fig``, write it to ``path`` (110 dpi) and close it; 1 (one figure drawn)."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return 1


def report_main(name: str, build: Callable[[Path], dict[str, str]],
                draw: Callable[[Path, Path], int], argv: list[str] | None = None) -> int:
    """The command line of ``scripts/report_NAME.py``: fill the page's blocks from ``--results``
    (``build(results)``) and draw its figures (``draw(results, fig_dir)``)."""
    ap = argparse.ArgumentParser(description=f"Fill the tables of {TRACKED}/{name}.md")
    ap.add_argument("--results", default=f"results/{name}", help="folder of the run JSONs")
    ap.add_argument("--out", default=None, help=f"default out/reports/{name}.md")
    ap.add_argument("--in-place", action="store_true", help=f"rewrite {TRACKED}/{name}.md")
    ap.add_argument("--no-figures", action="store_true")
    args = ap.parse_args(argv)
    page = TRACKED / f"{name}.md"
    if args.in_place and args.out and Path(args.out).resolve() != page.resolve():
        ap.error(f"--in-place writes {page}; drop --out")
    out = page if args.in_place else Path(args.out or f"out/reports/{name}.md")
    text = fill(page.read_text(), build(Path(args.results)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    figs = 0 if args.no_figures else draw(Path(args.results), out.parent / "figures")
    print(f"wrote {out} ({len(tables_of(text))} tables, {figs} figures)")
    return 0
