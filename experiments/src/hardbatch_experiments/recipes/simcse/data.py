"""SimCSE's inputs and batch diagnostics: the training sentences, the starting model's
embeddings of them (cached), and the hardness / near-duplicate rates of batches under those
embeddings."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import torch

from hardbatch.metrics import batch_hardness, negative_similarities

__all__ = ["PAIR_THRESHOLDS", "RecordingSampler", "batch_diagnostics", "cache_dir",
           "read_sentences", "starting_embeddings"]


def cache_dir() -> Path:
    """``$HARDBATCH_CACHE``, default ``~/.cache/hardbatch``."""
    return Path(os.environ.get("HARDBATCH_CACHE", Path.home() / ".cache" / "hardbatch"))


def read_sentences(data_dir: str | None, num_sentences: int) -> list[str]:
    """The first ``num_sentences`` lines of ``<data root>/text/wiki_sentences_100k.txt``
    (``data_dir`` may also be that file or the folder holding it)."""
    from ...datasets import data_root

    base = data_root(data_dir)
    path = base if base.is_file() else base / "text" / "wiki_sentences_100k.txt"
    if not path.is_file() and (base / "wiki_sentences_100k.txt").is_file():
        path = base / "wiki_sentences_100k.txt"
    if not path.is_file():
        raise FileNotFoundError(f"training sentences not found at {path}; pass --data-dir "
                                "pointing at shared/data (text/wiki_sentences_100k.txt)")
    with open(path, encoding="utf-8") as fh:
        lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
    if num_sentences > len(lines):
        raise ValueError(f"--num-sentences {num_sentences} exceeds the {len(lines)} sentences of "
                         f"{path}; use at most {len(lines)}")
    return lines[:num_sentences]


def starting_embeddings(model, texts: list[str], model_name: str, path: str | None = None,
                        batch_size: int = 128) -> tuple[np.ndarray, str]:
    """Unit-norm ``[N, d]`` float32 embeddings of ``texts`` under the starting model.

    From ``path`` (first N rows of a ``.npy``) if given, else from a cache keyed by the model
    name and a hash of the texts, else by encoding (then cached). Returns ``(emb, origin)``.
    """
    n = len(texts)
    if path:
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2 or arr.shape[0] < n:
            raise ValueError(f"--start-embeddings {path} has shape {arr.shape}; expected [>= {n}, "
                             "d] rows in the order of the training sentences")
        x = np.asarray(arr[:n], np.float32)
        origin = f"file {path}"
    else:
        key = hashlib.sha1(("\n".join(texts) + "|" + model_name).encode()).hexdigest()[:12]
        cache = cache_dir() / "simcse" / f"start_{n}_{key}.npy"
        if cache.is_file():
            x, origin = np.load(cache).astype(np.float32), f"cache {cache}"
        else:
            with torch.no_grad():
                x = np.asarray(model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                            normalize_embeddings=True, show_progress_bar=False),
                               np.float32)
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.npy")
            np.save(tmp, x)
            os.replace(tmp, cache)
            origin = "encoded (starting model)"
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(x, np.float32), origin


PAIR_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)


def batch_diagnostics(embeddings: np.ndarray, batches: list[list[int]], texts: list[str],
                      near_duplicate: float = 0.9) -> dict:
    """Hardness and false-negative proxies of ``batches`` under fixed ``[N, d]`` embeddings.

    Per batch: ``hardness`` (mean top-1 negative cosine), ``mean_negative_similarity``,
    ``near_duplicate_rate`` (share of the B(B-1)/2 in-batch pairs with cosine > near_duplicate)
    and ``identical_text_rate`` (share of pairs with the same text). Returns the means over
    batches, ``mean_pairs_above`` (share of in-batch pairs with cosine above each of
    :data:`PAIR_THRESHOLDS`, averaged over batches) and the per-batch lists.
    """
    emb = torch.from_numpy(np.ascontiguousarray(embeddings, np.float32))
    out = {"hardness": [], "mean_negative_similarity": [], "near_duplicate_rate": [],
           "identical_text_rate": []}
    above: dict[str, list[float]] = {f"{t:g}": [] for t in PAIR_THRESHOLDS}
    for b in batches:
        ids = np.asarray(b, np.int64)
        if ids.size < 2:
            continue
        sims = negative_similarities(emb, ids)
        out["hardness"].append(batch_hardness(emb, ids))
        out["mean_negative_similarity"].append(float(sims.mean()))
        out["near_duplicate_rate"].append(float((sims > near_duplicate).double().mean()))
        for t in PAIR_THRESHOLDS:
            above[f"{t:g}"].append(float((sims > t).double().mean()))
        bt = [texts[i] for i in ids]
        same = sum(c * (c - 1) // 2 for c in _counts(bt))
        out["identical_text_rate"].append(same / (ids.size * (ids.size - 1) / 2))
    means = {f"mean_{k}": (float(np.mean(v)) if v else math.nan) for k, v in out.items()}
    pairs_above = {k: (float(np.mean(v)) if v else math.nan) for k, v in above.items()}
    return {**means, "mean_pairs_above": pairs_above, "near_duplicate_threshold": near_duplicate,
            "per_batch": out}


def _counts(items: list[str]) -> list[int]:
    seen: dict[str, int] = {}
    for t in items:
        seen[t] = seen.get(t, 0) + 1
    return list(seen.values())


class RecordingSampler(torch.utils.data.Sampler):
    """Wraps a batch sampler and records the batches it yields (for the diagnostics)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.batches: list[list[int]] = []

    def __iter__(self):
        for b in self.inner:
            b = [int(i) for i in b]
            self.batches.append(b)
            yield b

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __getattr__(self, name):  # delegate everything else (hard_sampler, refreshes ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
