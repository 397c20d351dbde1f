"""A retrieval view of STS-B test: for every pair with gold score >= 4 (a paraphrase), rank all
distinct STS-B test second sentences for its first sentence by cosine; MRR@10 and recall@1.

Ranks are pessimistic on ties (rank = 1 + the number of other candidates scoring at least as
high as the target); the target is the pair's own second sentence (a text that occurs as the
second sentence of several pairs is one candidate)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["retrieval_scores", "stsb_retrieval"]


def retrieval_scores(queries: np.ndarray, corpus: np.ndarray, targets: Sequence[int],
                     k: int = 10) -> dict:
    """MRR@k and recall@1 of ``queries`` ``[q, d]`` against ``corpus`` ``[c, d]`` (cosine), query
    ``i``'s relevant item being ``corpus[targets[i]]``; also the ranks (1-based)."""
    q = np.asarray(queries, np.float64)
    c = np.asarray(corpus, np.float64)
    t = np.asarray(targets, np.int64)
    if q.ndim != 2 or c.ndim != 2 or q.shape[1] != c.shape[1] or len(t) != len(q):
        raise ValueError(f"queries {q.shape}, corpus {c.shape} and targets ({len(t)}) must be "
                         "[q, d], [c, d] and [q]")
    if len(t) and (t.min() < 0 or t.max() >= len(c)):
        raise ValueError("targets must index rows of corpus")
    if k < 1:
        raise ValueError(f"k={k} must be a positive integer")
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    sims = q @ c.T
    own = sims[np.arange(len(t)), t][:, None]
    ranks = (sims >= own).sum(1)  # includes the target itself
    rr = np.where(ranks <= k, 1.0 / ranks, 0.0)
    return {f"mrr@{k}": float(rr.mean()) if len(t) else float("nan"),
            "recall@1": float((ranks == 1).mean()) if len(t) else float("nan"),
            "queries": len(t), "corpus": len(c), "ranks": ranks.tolist()}


def stsb_retrieval(model, sts_sets: dict, min_score: float = 4.0, k: int = 10,
                   batch_size: int = 128) -> dict:
    """The retrieval view of the ``STSBenchmark`` test subset of ``sts_sets``
    (:func:`hardbatch_experiments.sts.load_sts` output) under ``model.encode``."""
    subsets = sts_sets.get("STSBenchmark")
    if not subsets:
        raise ValueError("sts_sets holds no STSBenchmark task (the STS-B test split)")
    s = subsets[0]
    corpus = list(dict.fromkeys(s.sentences2))
    where = {text: i for i, text in enumerate(corpus)}
    pairs = [i for i in range(len(s)) if s.scores[i] >= min_score]
    queries = [s.sentences1[i] for i in pairs]
    emb = model.encode(queries + corpus, batch_size=batch_size, convert_to_numpy=True,
                       normalize_embeddings=True, show_progress_bar=False)
    out = retrieval_scores(emb[: len(queries)], emb[len(queries):],
                           [where[s.sentences2[i]] for i in pairs], k)
    out["min_score"] = min_score
    return out
