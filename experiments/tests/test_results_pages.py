"""The results pages keep their written numbers honest: every effect quoted by hand
(``+x.xx [lo, hi]``) stands in a generated table, and the generated tables are what the run
JSONs give today.

docs/results/{graphs,text,vision}.md are hand-written around ``<!-- table: KEY -->`` blocks that
``scripts/report_*.py`` fill from ``results/``; docs/results/README.md, the repository README
and docs/samplers.md ("Which sampler for which job") quote the pages, so their effects must
stand in some page's tables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("scipy")

from hardbatch_experiments.reports import code_search, graphs, text, vision
from hardbatch_experiments.reports.page import effects, handwritten, tables_of

REPO = Path(__file__).resolve().parents[2]
PAGES = {"graphs": graphs, "text": text, "vision": vision, "code_search": code_search}
#: pages whose runs are pilots only so far: they may quote no effect yet
PILOTS_ONLY: set[str] = set()


def page(name: str) -> str:
    return (REPO / "docs" / "results" / f"{name}.md").read_text()


def unsupported(written: str, tables: str) -> list[str]:
    """Effects quoted in ``written`` that no table in ``tables`` holds."""
    return sorted(effects(written) - effects(tables))


def table_text(name: str) -> str:
    return "\n".join(tables_of(page(name)).values())


@pytest.mark.parametrize("name", PAGES)
def test_every_written_effect_stands_in_the_pages_tables(name):
    text_ = page(name)
    assert tables_of(text_), f"{name}.md has no generated tables"
    assert name in PILOTS_ONLY or effects(handwritten(text_)), f"{name}.md quotes no effect"
    assert unsupported(handwritten(text_), table_text(name)) == []


@pytest.mark.parametrize("quoting", ["docs/results/README.md", "README.md", "docs/samplers.md"])
def test_summaries_quote_only_effects_of_the_pages_tables(quoting):
    written = (REPO / quoting).read_text()
    assert effects(written)
    assert unsupported(written, "\n".join(table_text(n) for n in PAGES)) == []


def test_an_altered_written_number_is_caught(tmp_path):
    original = page("vision")
    quoted = sorted(effects(handwritten(original)))[0]
    altered = quoted[:3] + str((int(quoted[3]) + 1) % 10) + quoted[4:]  # +2.47 -> +2.48
    assert altered not in effects(table_text("vision"))
    copy = tmp_path / "vision.md"
    copy.write_text(_replace_outside_tables(original, quoted, altered))
    changed = copy.read_text()
    assert unsupported(handwritten(changed), "\n".join(tables_of(changed).values())) == [altered]


def _replace_outside_tables(text_: str, old: str, new: str) -> str:
    """``text_`` with the first ``old`` that lies outside every generated block replaced."""
    start = 0
    while True:
        i = text_.index(old, start)
        before = text_[:i]
        if before.count("<!-- table: ") == before.count("<!-- /table -->"):
            return before + new + text_[i + len(old):]
        start = i + 1


@pytest.mark.parametrize("name", PAGES)
def test_regenerated_tables_equal_the_committed_ones(name):
    results = REPO / "results" / name
    if not results.is_dir():
        pytest.skip(f"{results} not present")
    committed = tables_of(page(name))
    regenerated = {k: v.rstrip("\n") + "\n" for k, v in PAGES[name].tables(results).items()}
    assert set(regenerated) == set(committed)
    for key in committed:
        assert regenerated[key] == committed[key], f"{name}.md table {key} is stale"
