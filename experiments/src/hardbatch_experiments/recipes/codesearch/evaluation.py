"""Code-search metrics (pure functions of embeddings and query texts; no model here).

Relevance: a query text that occurs more than once in a split has every code paired with that
exact text as relevant (copied helpers and repeated docstrings such as "Initialize the
weights" are common); a code is relevant to a query iff its pair's query is the same string.

* **CodeSearchNet MRR** (``csn_mrr``, Husain et al. 2019): for every pair, its code is ranked
  among ``distractors`` (999) codes of the same split drawn uniformly without replacement from
  the codes *not* relevant to its query (:func:`distractor_pools`: fixed by a seed, so every arm
  and model sees the same pools); reciprocal rank averaged over pairs.
* **Full-split retrieval** (``mrr@10``, ``ndcg@10``, ``recall@1``): every distinct query text
  ranks all codes of the split. ``mrr@10``: 1 / rank of the first relevant code when it is in
  the top 10, else 0; ``ndcg@10``: binary-relevance DCG of the top 10 (``1 / log2(rank + 1)`` per
  relevant code) over the ideal DCG (``min(#relevant, 10)`` relevant codes on top);
  ``recall@1``: share of queries whose top-ranked code is relevant (success@1; recall@1 when a
  query has one relevant code). Averaged over distinct queries.
* **Per package**: the same averages over the pairs (CodeSearchNet MRR) and the distinct queries
  (retrieval) of each package, against the whole split (a query text occurring in several
  packages counts in each).

Similarities are cosines (float64); ties are ranked pessimistically: a non-relevant code scoring
the same as a relevant one ranks before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["PROTOCOL", "code_search_metrics", "distractor_pools", "pool_ranks", "query_groups",
           "ranking_metrics"]

#: The protocol in words, stored in every run's JSON.
PROTOCOL = {
    "relevance": "a code is relevant to a query iff its pair has exactly the same query text "
                 "(queries occurring more than once in a split have every such code relevant)",
    "csn_mrr": "CodeSearchNet: each pair's code ranked among D distractor codes of the same "
               "split, drawn uniformly without replacement from the codes not relevant to its "
               "query with a fixed seed (independent of the arm); mean reciprocal rank over pairs",
    "retrieval": "every distinct query ranks all codes of the split by cosine; mrr@10 (first "
                 "relevant code in the top 10), ndcg@10 (binary relevance), recall@1 (top code "
                 "relevant); means over distinct queries",
    "per_package": "the same means over the pairs / distinct queries of each package, against "
                   "the whole split",
    "ties": "pessimistic: a non-relevant code with the same score ranks first",
}


def query_groups(queries: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct query texts (in order of first occurrence) and, for every pair, the
    position of its query among them (``[n]`` int64)."""
    where: dict[str, int] = {}
    of = np.fromiter((where.setdefault(q, len(where)) for q in queries), np.int64,
                     count=len(queries))
    return list(where), of


def distractor_pools(queries: Sequence[str], distractors: int = 999, seed: int = 0,
                     source: str = "the split") -> np.ndarray:
    """``[n, distractors]`` code positions: for pair ``i``, ``distractors`` pairs whose query
    differs from pair ``i``'s, drawn without replacement by ``numpy.random.default_rng(seed)``
    (pair by pair, in order). ``ValueError`` naming ``source`` when some query has fewer
    non-relevant codes than that."""
    if distractors < 1:
        raise ValueError(f"distractors={distractors} must be a positive integer")
    _, of = query_groups(queries)
    n = len(of)
    counts = np.bincount(of, minlength=int(of.max()) + 1 if n else 0)
    available = n - int(counts.max()) if n else 0
    if available < distractors:
        raise ValueError(f"{source}: pools of {distractors} distractors need at least "
                         f"{distractors} codes not relevant to each query, but it holds {n} "
                         f"pairs and its most repeated query leaves {available}; use a larger "
                         f"file or --distractors {max(available, 1)} or fewer")
    rng = np.random.default_rng(seed)
    pools = np.empty((n, distractors), np.int64)
    others = {}
    for i in range(n):
        g = int(of[i])
        if g not in others:
            others[g] = np.flatnonzero(of != g)
        pools[i] = rng.choice(others[g], size=distractors, replace=False)
    return pools


def _unit(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be [n, d], got shape {x.shape}")
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _check(query_emb: np.ndarray, code_emb: np.ndarray, query_of: np.ndarray) -> None:
    if query_emb.shape[1] != code_emb.shape[1]:
        raise ValueError(f"query embeddings {query_emb.shape} and code embeddings "
                         f"{code_emb.shape} differ in dimension")
    if len(query_of) != len(code_emb):
        raise ValueError(f"query_of has {len(query_of)} entries for {len(code_emb)} codes")
    if len(query_of) and (query_of.min() < 0 or query_of.max() >= len(query_emb)):
        raise ValueError("query_of must index rows of query_emb")


def pool_ranks(query_emb, code_emb, query_of, pools) -> np.ndarray:
    """1-based rank of every pair's code among itself and its pool (``pools[i]``, code
    positions), scored by cosine with the pair's query ``query_emb[query_of[i]]``
    (``query_emb``: one row per distinct query)."""
    q, c = _unit(query_emb), _unit(code_emb)
    query_of, pools = np.asarray(query_of, np.int64), np.asarray(pools, np.int64)
    _check(q, c, query_of)
    qi = q[query_of]
    own = np.einsum("nd,nd->n", qi, c)
    ranks = np.empty(len(own), np.int64)
    for i in range(len(own)):
        ranks[i] = 1 + int((c[pools[i]] @ qi[i] >= own[i]).sum())
    return ranks


def ranking_metrics(query_emb, code_emb, query_of, k: int = 10) -> dict[str, np.ndarray]:
    """Per distinct query (rows of ``query_emb``; ``query_of[j]``: the query of code ``j``):
    ``mrr@k``, ``ndcg@k`` and ``recall@1`` (see the module docstring) over all codes, as arrays
    ``[u]``. A query without a relevant code scores 0."""
    if k < 1:
        raise ValueError(f"k={k} must be a positive integer")
    q, c = _unit(query_emb), _unit(code_emb)
    query_of = np.asarray(query_of, np.int64)
    _check(q, c, query_of)
    sims = q @ c.T
    u = len(q)
    rr, ndcg, hit = np.zeros(u), np.zeros(u), np.zeros(u)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    for i in range(u):
        rel = query_of == i
        if not rel.any():
            continue
        s = sims[i]
        rel_scores = np.sort(s[rel])[::-1]  # relevant codes, best first
        nonrel = np.sort(s[~rel])
        # pessimistic: every non-relevant code scoring >= a relevant one ranks before it
        before = len(nonrel) - np.searchsorted(nonrel, rel_scores, side="left")
        ranks = before + np.arange(1, len(rel_scores) + 1)
        top = ranks[ranks <= k]
        rr[i] = 1.0 / ranks[0] if ranks[0] <= k else 0.0
        ndcg[i] = discount[top - 1].sum() / discount[: min(len(ranks), k)].sum()
        hit[i] = float(ranks[0] == 1)
    return {f"mrr@{k}": rr, f"ndcg@{k}": ndcg, "recall@1": hit}


def _means(values: dict[str, np.ndarray], rows) -> dict[str, float]:
    return {name: float(v[rows].mean()) if len(rows) else float("nan")
            for name, v in values.items()}


def code_search_metrics(query_emb, code_emb, query_of, packages: Sequence[str], pools,
                        k: int = 10) -> dict:
    """Every metric of the module docstring for one split.

    ``query_emb``: ``[u, d]`` embeddings of the distinct queries (:func:`query_groups` order);
    ``code_emb``: ``[n, d]`` the pairs' codes; ``query_of``: ``[n]`` each pair's distinct query;
    ``packages``: each pair's package; ``pools``: :func:`distractor_pools`.

    Returns ``{"pairs", "queries", "distractors", "csn_mrr", "mrr@k", "ndcg@k", "recall@1",
    "per_package": {package: {the same}}}``.
    """
    query_of = np.asarray(query_of, np.int64)
    pools = np.asarray(pools, np.int64)
    packages = np.asarray(list(packages), dtype=object)
    if len(packages) != len(query_of) or len(pools) != len(query_of):
        raise ValueError(f"packages ({len(packages)}), pools ({len(pools)}) and query_of "
                         f"({len(query_of)}) must have one entry per pair")
    rr_pool = 1.0 / pool_ranks(query_emb, code_emb, query_of, pools)
    per_query = ranking_metrics(query_emb, code_emb, query_of, k)

    def block(pair_rows, query_rows) -> dict:
        return {"pairs": int(len(pair_rows)), "queries": int(len(query_rows)),
                "csn_mrr": float(rr_pool[pair_rows].mean()) if len(pair_rows) else float("nan"),
                **_means(per_query, query_rows)}

    out = block(np.arange(len(query_of)), np.arange(len(query_emb)))
    out["distractors"] = int(pools.shape[1]) if pools.ndim == 2 else 0
    out["per_package"] = {}
    for pkg in sorted(set(packages.tolist())):
        rows = np.flatnonzero(packages == pkg)
        out["per_package"][pkg] = block(rows, np.unique(query_of[rows]))
    return out
