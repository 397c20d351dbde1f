"""Sampler factories and a simulated training loop shared by the sampler tests.

Importable as ``sampler_support`` from any test module (``tests/`` is on pytest's ``pythonpath``).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import hardbatch as hb

N, B = 1000, 64  # contract tests: fixed embeddings

# Every sampler configuration of the contract suite: each walk, both graphs, kNN, GCBS.
KINDS = ["uniform", "knn", "proximity", "proximity_decay", "bfs", "dfs", "rw", "knn_graph", "gcbs",
         "cluster", "community"]
PARTITIONS = {"uniform", "gcbs", "cluster", "community"}  # samplers whose epoch partitions items
PREFETCH_KINDS = [k for k in KINDS if k not in PARTITIONS]  # samplers with a prefetch thread


def make(kind: str, emb, refresh_every=5, batch_size: int = B, **kw):
    """A sampler of configuration ``kind`` over the fixed embeddings ``emb``."""
    if kind == "uniform":
        return hb.UniformBatchSampler(N, batch_size, **kw)
    if kind == "knn":
        return hb.KNNBatchSampler(emb, batch_size, refresh_every=refresh_every, **kw)
    if kind == "proximity":
        return hb.ProximityGraphSampler(emb, batch_size, candidates=200, neighbors=20,
                                        refresh_every=refresh_every, **kw)
    if kind == "proximity_decay":
        return hb.ProximityGraphSampler(emb, batch_size, candidates=200, neighbors=20,
                                        refresh_every=refresh_every,
                                        restart=hb.LinearDecay(0.2, 0.05), epochs=3, **kw)
    if kind in ("bfs", "dfs", "rw"):
        return hb.ProximityGraphSampler(emb, batch_size, candidates=200, neighbors=20,
                                        walk=kind, **kw)
    if kind == "knn_graph":
        return hb.ProximityGraphSampler(emb, batch_size, neighbors=20, graph="knn", **kw)
    if kind == "gcbs":
        return hb.GCBSSampler(emb, batch_size, quantile=0.99, **kw)
    if kind == "cluster":
        return hb.ClusterBatchSampler(emb, batch_size, clusters_per_batch=2, **kw)
    if kind == "community":
        return hb.CommunityBatchSampler(emb, batch_size, 4, skip=2, window=10, **kw)
    raise AssertionError(kind)


def make_ranked(kind: str, emb, rank: int, world_size: int, prefetch: int = 0):
    """A sampler of ``kind`` for one rank, refreshing every 3 steps where it refreshes."""
    return make(kind, emb, refresh_every=3, seed=3, rank=rank, world_size=world_size,
                **({"prefetch": prefetch} if prefetch else {}))


# -- a live EmbeddingBank fed by a simulated training loop ------------------------------------

LIVE_N, LIVE_D, LIVE_B = 800, 16, 32


def feed(bank: hb.EmbeddingBank, batch, base: torch.Tensor, step: int) -> None:
    """The bank update of a training step: the batch's rows, moved with the step."""
    idx = torch.tensor(batch)
    bank.update(idx, base[idx] + 0.5 * torch.cos(idx[:, None] * 0.1 + step
                                                 + torch.arange(base.shape[1])).float())


def run(sampler, base: torch.Tensor, epochs: int = 2, stop_after: int | None = None) -> list:
    """A training loop feeding the sampler's bank; returns the batches (and stops early if asked)."""
    out, step = [], 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            out.append(batch)
            feed(sampler.source, batch, base, step)
            step += 1
            if stop_after is not None and step == stop_after:
                return out
    return out


def finish_epoch(sampler, base: torch.Tensor, step: int) -> list:
    """The rest of a resumed epoch, from global step ``step``."""
    out = []
    for batch in sampler:
        out.append(batch)
        feed(sampler.source, batch, base, step)
        step += 1
    return out


def live_graph(background: bool, lag: int, graph: str = "proximity", **kw):
    """A proximity-graph sampler over a fresh live bank, refreshing every 4 steps."""
    bank = hb.EmbeddingBank(LIVE_N, LIVE_D, seed=3)
    return hb.ProximityGraphSampler(bank, LIVE_B, 100, 10, graph=graph, refresh_every=4,
                                    refresh_lag=lag, background=background, seed=1, **kw)


def live_gcbs(background: bool, lag: int, **kw):
    """A GCBS sampler over a fresh live bank (25 steps per epoch)."""
    return hb.GCBSSampler(hb.EmbeddingBank(LIVE_N, LIVE_D, seed=3), LIVE_B, quantile=0.99,
                          refresh_lag=lag, background=background, seed=1, **kw)


# -- key sets (conflicts): mined-style rows ---------------------------------------------------

def chain_sets(n=N, k=2, seed=0):
    """Mined-style rows: row i holds texts a_i, p_i and k negatives that are other rows'
    anchors (a_{i+1}, and random others)."""
    r = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        negs = {f"a{(i + 1) % n}"} | {f"a{j}" for j in r.integers(0, n, k - 1)}
        rows.append(frozenset({f"a{i}", f"p{i}"} | negs))
    return rows


def conflicts(batches, sets) -> int:
    return sum(bool(sets[i] & sets[j]) for b in batches for i, j in itertools.combinations(b, 2))


def near_conflicts(emb, sets):
    """Embeddings where conflicting rows are near each other (so hard batches gather them)."""
    x = emb.copy()
    for i in range(1, len(sets), 2):  # pairs (i - 1, i) of rows that conflict
        if sets[i] & sets[i - 1]:
            x[i] = emb[i - 1] + 0.05 * np.cos(i + np.arange(x.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
