"""Property tests (hypothesis, fixed seed, bounded examples; issue 17's target): for random N,
B, K, M, walk, drop_last, world size, global batches and duplicate keys, every sampler either
raises a ValueError naming a parameter or yields the contract, and terminates."""

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hardbatch as hb

PARAMETERS = ("batch_size", "world_size", "global_batch", "duplicate_keys", "candidates",
              "neighbors", "drop_last", "group_size", "N=")


@st.composite
def configs(draw):
    n = draw(st.integers(2, 36))
    cfg = {
        "kind": draw(st.sampled_from(["uniform", "knn", "proximity", "gcbs"])),
        "n": n,
        "b": draw(st.integers(1, n + 1)),
        "world": draw(st.integers(1, 4)),
        "global_batch": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "walk": draw(st.sampled_from(["rwr", "rw", "bfs", "dfs"])),
        "graph": draw(st.sampled_from(["proximity", "knn"])),
        "m": draw(st.integers(1, n)),
        "k": draw(st.integers(1, n)),
        "seed": draw(st.integers(0, 3)),
    }
    distinct = draw(st.integers(1, n))
    cfg["keys"] = draw(st.none() | st.lists(st.integers(0, distinct - 1), min_size=n,
                                           max_size=n))
    return cfg


def build(cfg, rank):
    x = np.random.default_rng(cfg["n"]).standard_normal((cfg["n"], 4)).astype(np.float32)
    common = dict(drop_last=cfg["drop_last"], seed=cfg["seed"], rank=rank,
                  world_size=cfg["world"], global_batch=cfg["global_batch"],
                  duplicate_keys=cfg["keys"])
    kind, b = cfg["kind"], cfg["b"]
    if kind == "uniform":
        return hb.UniformBatchSampler(cfg["n"], b, **common)
    if kind == "knn":
        return hb.KNNBatchSampler(x, b, refresh_every=2, **common)
    if kind == "gcbs":
        return hb.GCBSSampler(x, b, quantile=0.8, **common)
    return hb.ProximityGraphSampler(x, b, candidates=cfg["m"], neighbors=cfg["k"],
                                    walk=cfg["walk"], graph=cfg["graph"], refresh_every=2,
                                    **common)


def check_epoch(cfg, ranks):
    n, b, w = cfg["n"], cfg["b"], cfg["world"]
    keys = cfg["keys"] if cfg["keys"] is not None else list(range(n))
    per_rank = [list(s) for s in ranks]
    steps = len(ranks[0])
    assert all(len(p) == steps for p in per_rank)
    plan_b = w * b if cfg["global_batch"] else b
    nb = n // plan_b if cfg["drop_last"] else math.ceil(n / plan_b)
    assert steps == (nb if cfg["global_batch"] else (nb // w if cfg["drop_last"]
                                                     else math.ceil(nb / w)))
    for batches in per_rank:
        for batch in batches:
            assert batch and len(set(batch)) == len(batch) and 0 <= min(batch) <= max(batch) < n
    if cfg["global_batch"]:
        plan = [sum((p[s] for p in per_rank), []) for s in range(steps)]
        topped = not cfg["drop_last"] and 0 < n % plan_b < w  # last batch topped up to W
    else:
        plan = [per_rank[r][s] for s in range(steps) for r in range(w)][:nb]
        topped = False
        for s in range(steps):  # no two ranks get the same batch in a step
            assert len({tuple(p[s]) for p in per_rank}) == w
    for batch in plan:
        assert len({keys[i] for i in batch}) == len(batch)  # no key twice in a plan batch
    if cfg["kind"] in ("uniform", "gcbs"):
        drawn = list(itertools.chain.from_iterable(plan[:-1] if topped else plan))
        if topped:
            drawn += plan[-1][:n % plan_b]
        expect = len(plan) * plan_b if cfg["drop_last"] else n  # whole steps only
        assert len(drawn) == len(set(drawn)) == expect
        assert all(len(x) == plan_b for x in plan[:-1])
    else:
        assert all(len(x) == plan_b for x in plan)


@settings(derandomize=True, deadline=None, max_examples=200,
          suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_every_sampler_raises_a_named_error_or_keeps_the_contract(cfg):
    try:
        ranks = [build(cfg, r) for r in range(cfg["world"])]
    except ValueError as err:
        assert any(p in str(err) for p in PARAMETERS), str(err)
        return
    for _ in range(2):  # two epochs
        check_epoch(cfg, ranks)
