"""Plans under tiny relative noise in the embeddings (issue 45): two machines' matrix kernels
differ by about 1e-6 relative, so the same sampler seed should give the same batches.

Every sampler keeps all its batches at 1e-7 on clean data. The community sampler (B3) keeps at
least 90% of them at 1e-6 where kNN ranks are tied at a window's end (copied rows: noise decides
which of the two is inside), which moves every part of one METIS run over the whole graph (the
single run keeps at most 10% here); the benchmark: ``benchmarks/bench_plan_stability.py``."""

import numpy as np
import pytest

import hardbatch as hb

N, D, B = 2000, 16, 32
SAMPLERS = ("uniform", "knn", "proximity", "gcbs", "cluster", "community")


def unit_rows(seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((N, D))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def noisy(x: np.ndarray, eps: float, seed: int) -> np.ndarray:
    """``x * (1 + eps * N(0, 1))`` per entry, float32."""
    return (x * (1 + eps * np.random.default_rng(seed).standard_normal(x.shape))).astype(
        np.float32)


def plan(name: str, x: np.ndarray, cell_batches: int | None = None) -> list[list[int]]:
    extra = {} if cell_batches is None else {"cells": hb.CommunityCells(batches=cell_batches)}
    sampler = hb.registry.make_sampler(name, x, B, seed=0, **extra)
    return [list(map(int, b)) for b in sampler]


def identical(a: list, b: list) -> float:
    """Share of plan positions holding the same batch (same items, same order)."""
    assert len(a) == len(b)
    return sum(p == q for p, q in zip(a, b)) / len(a)


@pytest.fixture(scope="module")
def tied() -> np.ndarray:
    """Unit rows where item t's last window neighbour (rank skip + window = 23) has a copy
    (t = 0, 1): the two tie at the end of t's window."""
    x = unit_rows(1)
    nbrs = hb.knn_graph(x, 23).numpy()
    for t in range(2):
        x[N - 1 - t] = x[nbrs[t, 22]]
    return x


@pytest.mark.filterwarnings("ignore::hardbatch.samplers.refresh.RefreshCostWarning")
@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_keeps_its_plan_at_1e7(name):
    x = unit_rows(0)
    assert identical(plan(name, x), plan(name, noisy(x, 1e-7, 1))) == 1.0


@pytest.mark.filterwarnings("ignore::hardbatch.samplers.refresh.RefreshCostWarning")
def test_community_keeps_90_percent_at_1e6_where_one_metis_run_keeps_none(tied):
    base, one_run = plan("community", tied, cell_batches=2), plan("community", tied)
    local, single = [], []
    for seed in (1, 2, 3):
        x = noisy(tied, 1e-6, seed)
        local.append(identical(base, plan("community", x, cell_batches=2)))
        single.append(identical(one_run, plan("community", x)))  # the default: one run
    assert np.mean(local) >= 0.9  # measured: 1.0
    assert np.mean(single) <= 0.1  # the data does swap ranks: one METIS run moves every part
