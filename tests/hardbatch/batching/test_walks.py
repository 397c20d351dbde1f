import collections
import random

import numpy as np
import pytest
import torch

import hardbatch as hb


def random_graph(n, k, seed=0):
    r = np.random.default_rng(seed)
    g = np.empty((n, k), np.int64)
    for v in range(n):
        others = r.choice(n - 1, k, replace=False)
        g[v] = others + (others >= v)
    return g


def check_batches(batches, n, b):
    batches = batches.numpy()
    assert batches.shape[1] == b
    for row in batches:
        assert len(set(row.tolist())) == b
        assert row.min() >= 0 and row.max() < n


@pytest.mark.parametrize("walk", ["rwr", "rw", "bfs", "dfs"])
def test_walk_batches_are_distinct_and_valid(walk):
    g = random_graph(500, 8)
    out = hb.walk_batches(g, 64, 10, walk=walk, restart=0.3, seed=1)
    check_batches(out, 500, 64)


@pytest.mark.parametrize("walk", ["rwr", "rw", "dfs"])
def test_every_item_is_reached_through_an_edge(walk):
    # On a strongly connected graph with B << N no jump is needed: each new item is a neighbour
    # of an item collected earlier (RWR/RW move along edges; DFS extends from the stack).
    g = random_graph(2000, 10, seed=3)
    out = hb.walk_batches(g, 64, 20, walk=walk, restart=0.3, seed=2).numpy()
    for row in out:
        for t in range(1, len(row)):
            assert any(row[t] in g[p] for p in row[:t])


def bfs_reference(g, start, b):
    batch, queue, seen = [start], collections.deque([start]), {start}
    while queue and len(batch) < b:
        v = queue.popleft()
        for w in g[v]:
            if w not in seen:
                seen.add(w)
                batch.append(int(w))
                queue.append(w)
                if len(batch) == b:
                    break
    return batch


def test_bfs_matches_plain_python_reference():
    g = random_graph(1000, 6, seed=4)
    out = hb.walk_batches(g, 50, 5, walk="bfs", seed=3).numpy()
    for row in out:
        assert row.tolist() == bfs_reference(g, int(row[0]), 50)


def rwr_reference(g, start, alpha, b, rnd):
    """BatchSampler Algorithm 3, literally."""
    s, v = [], start
    while len(s) < b:
        if v not in s:
            s.append(v)
        if rnd.random() < alpha:
            v = start
        else:
            v = int(g[v][rnd.randrange(len(g[v]))])
    return s


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8])
def test_rwr_visit_distribution_matches_algorithm3(alpha):
    # Same start node, many walks: how often each node joins the batch must agree with a
    # literal implementation of Algorithm 3 (fixed seeds; total variation distance).
    g = random_graph(60, 4, seed=5)
    b, runs = 12, 3000
    ours = hb.walk_batches(g, b, runs, walk="rwr", restart=alpha, seed=7,
                           starts=np.zeros(runs, np.int64)).numpy()
    freq_ours = np.bincount(ours.reshape(-1), minlength=60) / runs
    rnd = random.Random(0)
    ref = [rwr_reference(g, 0, alpha, b, rnd) for _ in range(runs)]
    freq_ref = np.bincount(np.concatenate(ref), minlength=60) / runs
    tv = 0.5 * np.abs(freq_ours - freq_ref).sum() / b
    assert tv < 0.03


def test_restart_controls_locality():
    # Higher alpha keeps the walk near the start: more of the batch are 1-hop neighbours.
    g = random_graph(5000, 20, seed=6)
    share = []
    for alpha in (0.05, 0.3, 0.7):
        out = hb.walk_batches(g, 40, 50, walk="rwr", restart=alpha, seed=0).numpy()
        share.append(np.mean([np.isin(row[1:], g[row[0]]).mean() for row in out]))
    assert share[0] < share[1] < share[2]


def test_starts_avoid_items_already_seen():
    g = random_graph(400, 5)
    out = hb.walk_batches(g, 20, 20, walk="rwr", seed=0).numpy()  # 400 items, 20x20 draws
    seen = set()
    for row in out:
        assert row[0] not in seen
        seen.update(row.tolist())


@pytest.mark.parametrize("walk", ["rwr", "rw", "bfs", "dfs"])
@pytest.mark.parametrize("graph", ["no_edges", "self_loops", "star", "pairs", "padded"])
def test_walks_terminate_on_pathological_graphs(walk, graph):
    n = 40
    if graph == "no_edges":
        g = np.full((n, 3), -1, np.int64)
    elif graph == "self_loops":
        g = np.arange(n)[:, None].repeat(3, 1)
    elif graph == "star":
        g = np.zeros((n, 3), np.int64)
        g[0] = [1, 2, 3]
    elif graph == "pairs":
        g = (np.arange(n) ^ 1)[:, None].repeat(2, 1)
    else:
        g = random_graph(n, 4)
        g[::2, 2:] = -1
    for b in (7, n):  # B = N: every item must be collected
        out = hb.walk_batches(g, b, 3, walk=walk, restart=0.2, seed=1)
        check_batches(out, n, b)


def test_walks_are_deterministic():
    g = random_graph(300, 6)
    a = hb.walk_batches(g, 30, 5, seed=9)
    assert torch.equal(a, hb.walk_batches(torch.from_numpy(g), 30, 5, seed=9))
    assert not torch.equal(a, hb.walk_batches(g, 30, 5, seed=10))


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=11), "batch_size=11 is larger than the number of items N=10"),
    (dict(batch_size=0), "batch_size=0 must be >= 1"),
    (dict(walk="levy"), "walk='levy' is not one of"),
    (dict(restart=1.5), "restart=1.5 must lie in"),
    (dict(restart=1.0), r"restart=1.0 must lie in \[0, 1\).*never leaves its start node.*"
                        "KNNBatchSampler"),
    (dict(restart=float("nan")), r"restart=nan must lie in \[0, 1\)"),
    (dict(restart=True), "restart must be a number in \\[0, 1\\), got True"),
    (dict(restart="0.2"), "restart must be a number"),
    (dict(restart=torch.tensor([0.2])), "restart must be a number"),
    (dict(starts=[1, 2]), "starts must be 1 integer item ids"),
])
def test_walk_bad_arguments(kwargs, match):
    g = random_graph(10, 3)
    args = dict(batch_size=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        hb.walk_batches(g, **args)


@pytest.mark.parametrize("bad,match", [
    (np.array([[1, -1, 2], [0, 2, -1], [0, 1, -1]]), "row 0 is malformed"),
    (np.array([[1, 2], [0, 5], [0, 1]]), "row 1 is malformed"),
    (np.array([[1.0, 2.0], [0.0, 2.0], [0.0, 1.0]]), "integer item ids"),
])
def test_malformed_graphs_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        hb.walk_batches(bad, 2)


@pytest.mark.parametrize("alpha", [np.float32(0.35), torch.tensor(0.35, dtype=torch.float64),
                                   np.array(0.35, np.float32), torch.tensor(0)])
def test_restart_accepts_numpy_and_0d_tensor_scalars(alpha):
    g = random_graph(300, 6)
    ref = hb.walk_batches(g, 30, 4, restart=float(alpha), seed=2)
    assert torch.equal(hb.walk_batches(g, 30, 4, restart=alpha, seed=2), ref)


# -- duplicate keys inside the walk kernels -------------------------------------------------

def key_clashes(out, key_ids):
    return [row for row in out.numpy() if len({int(key_ids[v]) for v in row if key_ids[v] >= 0})
            < int((key_ids[row] >= 0).sum())]


@pytest.mark.parametrize("walk", ["rwr", "rw", "bfs", "dfs"])
def test_walks_never_add_an_item_whose_key_is_in_the_batch(walk):
    g = random_graph(600, 8, seed=2)
    key_ids = np.full(600, -1)
    key_ids[:300] = np.arange(300) % 60  # 60 keys held by 5 items each
    out = hb.walk_batches(g, 64, 12, walk=walk, restart=0.3, seed=4, key_ids=key_ids)
    check_batches(out, 600, 64)
    assert not key_clashes(out, key_ids)


@pytest.mark.parametrize("walk", ["rwr", "rw", "dfs"])
def test_walks_with_keys_still_move_along_edges(walk):
    # Passing over a key-mate is an idle step, not a jump: on a strongly connected graph with
    # a few keys every new item is a neighbour of an item collected earlier (DFS), or of an
    # item collected earlier or passed over for its key (RW / RWR walk through those).
    g = random_graph(2000, 10, seed=3)
    key_ids = np.where(np.arange(2000) < 400, np.arange(2000) % 100, -1)
    out = hb.walk_batches(g, 64, 20, walk=walk, restart=0.3, seed=2, key_ids=key_ids).numpy()
    for row in out:
        for t in range(1, len(row)):
            held = {int(key_ids[v]) for v in row[:t] if key_ids[v] >= 0}
            via = set(row[:t].tolist())
            if walk != "dfs":
                via |= {v for v in range(2000) if key_ids[v] in held}
            assert any(row[t] in g[p] for p in via)


@pytest.mark.parametrize("walk", ["rwr", "rw", "bfs", "dfs"])
@pytest.mark.parametrize("keys", ["neighbours_share_one", "all_but_few", "pairs"])
def test_walks_with_keys_terminate_on_adversarial_graphs(walk, keys):
    # star-like graph whose reachable items are blocked by the start's key: the walk must
    # jump instead of waiting; B = the number of distinct keys: every key collected once.
    n = 40
    g = np.zeros((n, 3), np.int64)
    g[:, 0], g[:, 1], g[:, 2] = 1, 2, 3
    g[1:4] = [[0, 2, 3], [0, 1, 3], [0, 1, 2]]
    if keys == "neighbours_share_one":
        key_ids = np.full(n, -1)
        key_ids[:4] = 7
    elif keys == "all_but_few":
        key_ids = np.where(np.arange(n) < 35, 0, -1)  # 35 items of one key + 5 unique
    else:
        key_ids = np.arange(n) // 2
    classes = len(set(key_ids[key_ids >= 0].tolist())) + int((key_ids < 0).sum())
    for b in (min(5, classes), classes):
        out = hb.walk_batches(g, b, 3, walk=walk, restart=0.2, seed=1, key_ids=key_ids)
        check_batches(out, n, b)
        assert not key_clashes(out, key_ids)


def test_walk_key_ids_bad_input():
    g = random_graph(10, 3)
    with pytest.raises(ValueError, match="key_ids must be 10 integers >= -1"):
        hb.walk_batches(g, 4, key_ids=np.zeros(9, np.int64))
    with pytest.raises(ValueError, match="key_ids must be 10 integers"):
        hb.walk_batches(g, 4, key_ids=np.zeros(10))
    with pytest.raises(ValueError, match="key_ids hold 3 distinct keys, fewer than "
                                         "batch_size=4; use batch_size <= 3"):
        hb.walk_batches(g, 4, key_ids=np.arange(10) % 3)
