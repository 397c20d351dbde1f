"""What every run of a grid would otherwise recompute identically: the starting model's
embeddings of a training column (the samplers' teacher) and the mined hard negatives (mining
with the starting model is deterministic). Both are stored under
``$HARDBATCH_CACHE/codesearch`` (default ``~/.cache/hardbatch``), keyed by the model, the texts,
the token limit (and the mining options), together with the seconds they took to compute: a run
that reads them still charges that time (``time_s``), and says it was cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from ... import runs
from ..simcse.data import cache_dir
from .data import CodePairs
from .model import encode_texts, mine_negatives

__all__ = ["cache_folder", "mined_triplets", "teacher_embeddings"]


def cache_folder() -> Path:
    """``$HARDBATCH_CACHE/codesearch`` (default ``~/.cache/hardbatch/codesearch``)."""
    return cache_dir() / "codesearch"


def _key(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def teacher_embeddings(model, model_name: str, texts: list[str], max_length: int,
                       batch_size: int, use_cache: bool = True) -> tuple[np.ndarray, dict]:
    """Unit-norm ``[n, d]`` embeddings of ``texts`` under ``model`` (the starting model) at
    ``max_length`` tokens, and ``{"seconds": computing cost, "cached": bool, "read_s": ...}``."""
    t0 = time.perf_counter()
    path = cache_folder() / f"teacher_{_key(model_name, max_length, texts)}.npy"
    meta = path.with_suffix(".json")
    if use_cache and path.is_file() and meta.is_file():
        emb = np.load(path)
        info = json.loads(meta.read_text())
        return emb, {**info, "cached": True, "read_s": time.perf_counter() - t0}
    emb = encode_texts(model, texts, max_length, batch_size)
    info = {"seconds": time.perf_counter() - t0, "texts": len(texts), "max_length": max_length}
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.npy")
        np.save(tmp, emb)
        os.replace(tmp, path)
        runs.write_json_atomic(meta, info)
    return emb, {**info, "cached": False, "read_s": 0.0}


def mined_triplets(model, model_name: str, pairs: CodePairs, *, range_max: int,
                   relative_margin: float, max_length: int, batch_size: int,
                   use_cache: bool = True):
    """``(triplets, stats)`` of :func:`.model.mine_negatives` on ``pairs``, from the cache when
    it holds them (``stats["cached"]``; ``stats["seconds"]``: the mining's own cost). The cache
    stores, per triplet, the positions of its positive and negative pairs."""
    from datasets import Dataset

    t0 = time.perf_counter()
    options = {"range_max": range_max, "relative_margin": relative_margin,
               "max_length": max_length}
    path = cache_folder() / f"mined_{_key(model_name, options, pairs.queries, pairs.codes)}.json"
    if use_cache and path.is_file():
        stored = json.loads(path.read_text())
        rows = np.asarray(stored["rows"], np.int64).reshape(-1, 2)
        triplets = Dataset.from_dict({"anchor": [pairs.queries[i] for i in rows[:, 0]],
                                      "positive": [pairs.codes[i] for i in rows[:, 0]],
                                      "negative": [pairs.codes[i] for i in rows[:, 1]]})
        return triplets, {**stored["stats"], "cached": True, "read_s": time.perf_counter() - t0}
    train = Dataset.from_dict({"anchor": pairs.queries, "positive": pairs.codes})
    triplets, stats = mine_negatives(model, train, batch_size=batch_size, **options)
    if use_cache:
        pair_at = {qc: i for i, qc in enumerate(zip(pairs.queries, pairs.codes))}
        code_at = {code: i for i, code in enumerate(pairs.codes)}
        rows = [[pair_at[(a, p)], code_at[n]] for a, p, n in
                zip(triplets["anchor"], triplets["positive"], triplets["negative"])]
        runs.write_json_atomic(path, {"rows": rows, "stats": stats})
    return triplets, {**stats, "cached": False, "read_s": 0.0}
