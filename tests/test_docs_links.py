"""Every relative link of README.md and docs/ (results pages included) leads somewhere: the file
exists and a ``#anchor`` names a heading of it (GitHub's slugs); every repository path quoted in
backticks (``scripts/...``, ``src/...``, ...) exists. A renamed heading or a moved file fails
here instead of in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import REPO

PAGES = [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
#: Backticked paths from the repository root, e.g. `scripts/setup.sh`, `src/hardbatch/cli.py`.
ROOT_PATH = re.compile(r"`((?:src|scripts|benchmarks|tests|experiments|docs|results|\.ci)/"
                       r"[\w./+@-]*[\w/])(?:::\w+)?`")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped but ``-`` and
    ``_``, spaces to ``-``.

    >>> slug("GCBS permutation, N = 100,000")
    'gcbs-permutation-n--100000'
    """
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


def outside_code(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


def test_slug_follows_github():
    assert slug("At the limit on 2 CPU cores (issue 33)") == "at-the-limit-on-2-cpu-cores-issue-33"
    assert slug("Key sets: conflicts, no text twice") == "key-sets-conflicts-no-text-twice"
    assert slug("`hardbatch.registry`: names") == "hardbatchregistry-names"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = []
    for target in LINK.findall(outside_code(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest.relative_to(REPO) if REPO in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not bad, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(bad)


SCRIPTS_TEXT = "\n".join(p.read_text() for p in sorted((REPO / "scripts").glob("*.sh")))


def planned_output(path: str) -> bool:
    """A result folder a script of scripts/ writes, before its first run (e.g. the full epoch's
    ``results/code_search/epoch``): the path or its ``results/<recipe>/<folder>`` prefix is
    named in a script."""
    parts = path.rstrip("/").split("/")
    return parts[0] == "results" and any(
        "/".join(parts[:k]) in SCRIPTS_TEXT for k in range(3, len(parts) + 1))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_repository_paths_exist(page):
    missing = set()
    for paragraph in outside_code(page).split("\n\n"):
        if "github.com/" in paragraph:  # another repository's paths
            continue
        for p in ROOT_PATH.findall(paragraph):
            placeholder = any(c in p for c in "*<{") or re.search(r"\b[A-Z]{3,}\b", p)
            if not placeholder and not (REPO / p).exists() and not planned_output(p):
                missing.add(p)
    assert not missing, f"{page.relative_to(REPO)} quotes paths that do not exist: {sorted(missing)}"


def test_a_missing_path_fails():
    page = REPO / "docs" / "architecture.md"
    assert not planned_output("results/nowhere/at/all")
    assert ROOT_PATH.findall("see `scripts/no_such_script.sh` and `tests/test_x.py::test_y`") == [
        "scripts/no_such_script.sh", "tests/test_x.py"]
    assert "#no-such-heading" not in {f"#{a}" for a in anchors(page)}
