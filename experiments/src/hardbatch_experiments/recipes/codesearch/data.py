"""Code-search pairs (docstring summary -> function code): the checked loader of the
``code/{train,valid,test}.jsonl.gz`` files of the shared data (``shared/data/code/README.md``)
and of ``--eval-file`` files in the same format.

One JSON object per line with the string fields :data:`FIELDS`; ``.gz`` files are read through
gzip. Nothing is downloaded. Every problem is a :class:`CodePairsError` (a ``ValueError``) that
names the file and the line: a line that is not UTF-8 or not a JSON object, a missing or
non-string field, an empty (blank) ``query`` or ``code``, an ``id`` seen before (both lines
named), or fewer pairs than ``min_pairs`` (e.g. one training batch).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...datasets import DataNotFoundError, data_root

__all__ = ["FIELDS", "SPLITS", "CodePairs", "CodePairsError", "load_code_pairs", "split_path"]

#: The fields every pair must carry (strings).
FIELDS = ("id", "package", "version", "path", "name", "query", "code")
#: The splits of ``<data root>/code`` (split by package: no package is in two splits).
SPLITS = ("train", "valid", "test")


class CodePairsError(ValueError):
    """A pair file is malformed or too small (the message names the file and the line)."""


@dataclass(frozen=True)
class CodePairs:
    """The pairs of one file, in file order: ``ids``, ``packages``, ``queries``, ``codes``
    (lists of strings of equal length) and where they came from (``source``)."""

    source: str
    ids: list[str]
    packages: list[str]
    queries: list[str]
    codes: list[str]

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, rows) -> CodePairs:
        """The pairs at positions ``rows`` (in that order)."""
        rows = [int(i) for i in rows]
        return CodePairs(self.source, [self.ids[i] for i in rows],
                         [self.packages[i] for i in rows], [self.queries[i] for i in rows],
                         [self.codes[i] for i in rows])

    def head(self, n: int | None) -> CodePairs:
        """The first ``n`` pairs (all when ``n`` is None)."""
        return self if n is None or n >= len(self) else self.subset(range(n))

    def sample(self, n: int | None, seed: int) -> CodePairs:
        """``n`` pairs drawn without replacement with ``seed``, kept in file order (all when
        ``n`` is None or not smaller than the file): a subsample keeping the package mix."""
        if n is None or n >= len(self):
            return self
        rows = np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))
        return self.subset(rows)


def split_path(split: str, data_dir: str | os.PathLike | None = None) -> Path:
    """``<data root>/code/SPLIT.jsonl.gz`` (:func:`hardbatch_experiments.datasets.data_root`:
    ``data_dir``, else ``$HARDBATCH_DATA``, else ``../shared/data``); ``data_dir`` may also be the
    ``code`` folder itself."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    base = data_root(data_dir)
    for folder in (base / "code", base):
        for name in (f"{split}.jsonl.gz", f"{split}.jsonl"):
            if (folder / name).is_file():
                return folder / name
    raise DataNotFoundError(f"code-search split {split!r} not found: looked for "
                            f"{base / 'code' / f'{split}.jsonl.gz'}; pass --data-dir pointing at "
                            "shared/data (code/train.jsonl.gz, ...)")


def _lines(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        yield from enumerate(fh, 1)


def _error(path: Path, line: int, what: str) -> CodePairsError:
    return CodePairsError(f"{path} line {line}: {what}")


def load_code_pairs(path: str | os.PathLike, *, min_pairs: int = 1,
                    limit: int | None = None, what: str = "pairs") -> CodePairs:
    """The pairs of ``path`` (``.jsonl`` or ``.jsonl.gz``), checked line by line.

    ``limit``: keep the first ``limit`` pairs (the rest of the file is not read). ``min_pairs``:
    fewer pairs (after ``limit``) is an error, phrased with ``what`` (e.g. "one batch of 64").
    Blank lines are skipped.

    Raises:
        DataNotFoundError: ``path`` is not a file.
        CodePairsError: a malformed line (see the module docstring) or too few pairs.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"pair file {path} not found")
    cols: dict[str, list[str]] = {k: [] for k in ("id", "package", "query", "code")}
    seen: dict[str, int] = {}
    try:
        for line, raw in _lines(path):
            if limit is not None and len(cols["id"]) >= limit:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _error(path, line, f"not UTF-8 text (byte {exc.start}: "
                                         f"{raw[exc.start:exc.start + 1]!r})") from None
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise _error(path, line, f"not a JSON object ({exc})") from None
            if not isinstance(obj, dict):
                raise _error(path, line, f"not a JSON object (a {type(obj).__name__})")
            missing = [f for f in FIELDS if f not in obj]
            if missing:
                raise _error(path, line, f"missing field(s) {', '.join(missing)} (every pair "
                                         f"needs {', '.join(FIELDS)})")
            bad = [f for f in FIELDS if not isinstance(obj[f], str)]
            if bad:
                raise _error(path, line, f"field(s) {', '.join(bad)} must be strings")
            for field in ("query", "code"):
                if not obj[field].strip():
                    raise _error(path, line, f"empty {field}")
            if obj["id"] in seen:
                raise _error(path, line, f"duplicate id {obj['id']!r} (first on line "
                                         f"{seen[obj['id']]})")
            seen[obj["id"]] = line
            for key in cols:
                cols[key].append(obj[key])
    except (OSError, EOFError) as exc:  # a truncated or non-gzip .gz file
        raise CodePairsError(f"{path}: cannot be read ({exc})") from None
    n = len(cols["id"])
    if n < min_pairs:
        raise CodePairsError(f"{path}: {n} pairs, fewer than {what} ({min_pairs})")
    return CodePairs(str(path), cols["id"], cols["package"], cols["query"], cols["code"])
