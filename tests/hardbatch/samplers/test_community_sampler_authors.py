"""B3 as its authors build it (``CommunityBatchSampler.authors``: mutual rank edges, the rank
window 30 .. 129 of a ranking that starts with the item itself, parts trimmed and filled to
exactly B), checked against a deliberately plain re-implementation (loops, sets, dicts) of the
authors' procedure (github.com/raghavlite/B3, ``data_processing/spectral_clustering4_ibn.py``:
``create_adjacency_list``, then steps 4 and 5 of ``main``). METIS itself is not re-implemented:
the batches are checked against the reference trimming of the sampler's own parts.

The one documented difference: the authors pad their short last chunk to B with other items
(copies); here the ``N mod B`` leftover items are the short last batch (the plan is a
partition), or dropped with ``drop_last``."""

import numpy as np
import pytest

import hardbatch as hb
from hardbatch.batching.communities import community_labels, rank_graph, trimmed_order

N, D, B = 205, 16, 10  # 20 parts of 10, 5 items left over
START, WIDTH = 30, 100  # the authors' START_POINT and nmax


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    rows = np.random.default_rng(0).standard_normal((N, D))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def teacher_ranking(x: np.ndarray) -> list[list[int]]:
    """Every item's ranking of all N items by cosine, itself first (the authors' rank file)."""
    sims = x.astype(np.float64) @ x.astype(np.float64).T
    rankings = []
    for i in range(len(x)):
        rankings.append(sorted(range(len(x)), key=lambda j: -sims[i, j]))
        scores = sorted(sims[i], reverse=True)  # the window's ends are not near-ties
        assert min(scores[START - 1] - scores[START],
                   scores[START + WIDTH - 1] - scores[START + WIDTH]) > 1e-5
    return rankings


def reference_edges(x: np.ndarray, mutual: bool) -> set:
    """Pairs (i, j), i < j: j at positions START .. START + WIDTH - 1 of i's ranking and (mutual)
    i at those of j's, or (union) either; no self-loops."""
    listed = set()
    for i, ranking in enumerate(teacher_ranking(x)):
        for j in ranking[START:START + WIDTH]:
            if j != i:
                listed.add((i, j))
    if mutual:
        return {(i, j) for i, j in listed if i < j and (j, i) in listed}
    return {(min(i, j), max(i, j)) for i, j in listed}


def reference_trim(labels, size: int) -> tuple[list, list]:
    """The authors' step 4 and 5: parts largest first, popped down to ``size``, filled from
    the pool (last in, first out), sorted by their smallest item; and the pool left over."""
    parts = {}
    for item, label in enumerate(labels):
        parts.setdefault(int(label), []).append(item)
    final, pool = [], []
    for part in sorted(parts.values(), key=len, reverse=True):
        part = list(part)
        while len(part) > size:
            pool.append(part.pop())
        while len(part) < size and pool:
            part.append(pool.pop())
        final.append(part)
    final.sort(key=min)
    return final, pool


def pairs_of(graph) -> set:
    g = graph.tocoo()
    return {(int(i), int(j)) for i, j in zip(g.row, g.col) if i < j}


def test_authors_settings():
    s = hb.CommunityBatchSampler.authors(np.eye(N, D, dtype=np.float32), B)
    assert dict(hb.CommunityBatchSampler.AUTHORS) == {
        "edges": "mutual", "batching": "trim", "skip": START - 1, "window": WIDTH,
        "communities_per_batch": 1}
    assert (s.edges, s.batching, s.skip, s.window, s.communities_per_batch, s.parts) == \
        ("mutual", "trim", 29, 100, 1, N // B)
    assert hb.CommunityBatchSampler.authors(np.eye(N, D), B, skip=69, window=100).skip == 69


@pytest.mark.parametrize("mutual", [True, False])
def test_library_graph_is_the_reference_graph(x, mutual):
    s = hb.CommunityBatchSampler.authors(x, B, edges="mutual" if mutual else "union")
    nbrs = hb.knn_graph(x, s.skip + s.window).numpy()
    graph = rank_graph(nbrs, s.skip, s.skip + s.window, mutual=s.edges == "mutual")
    assert (graph != graph.T).nnz == 0 and graph.diagonal().sum() == 0
    assert pairs_of(graph) == reference_edges(x, mutual)


@pytest.mark.filterwarnings("ignore::hardbatch.samplers.refresh.RefreshCostWarning")
def test_batches_are_the_reference_trimming_of_the_parts(x):
    s = hb.CommunityBatchSampler.authors(x, B, seed=3)
    seen = []
    for epoch in range(2):
        s.set_epoch(epoch)
        batches = [list(b) for b in s]
        labels = s.groups[0]
        assert len(np.unique(labels)) <= N // B
        final, pool = reference_trim(labels, B)
        assert [len(b) for b in batches] == [B] * (N // B) + [N % B]
        assert {frozenset(b) for b in batches[:-1]} == {frozenset(c) for c in final}
        assert set(batches[-1]) == set(pool)
        seen.append([min(b) for b in batches[:-1]])
    assert seen[0] != seen[1]  # the same parts, visited in a new order each epoch
    assert s.separated == 0  # the authors separate nothing


def kept_chunks(labels, batches, size: int) -> tuple[set, list]:
    """The reference trimming of the items served (``drop_last``: the others were left out
    before the trimming), as chunks of item ids, and its pool."""
    kept = sorted(i for b in batches for i in b)
    final, pool = reference_trim(np.asarray(labels)[kept], size)
    return {frozenset(kept[i] for i in c) for c in final}, pool


def test_two_parts_per_batch_and_drop_last(x):
    s = hb.CommunityBatchSampler.authors(x, B, communities_per_batch=2, drop_last=True)
    batches = [list(b) for b in s]
    # 205 mod 10 = 5 items left out; the 200 kept make 40 parts and 40 chunks of 5, no rest
    assert s.drop_count == N % B and s.parts == (N - N % B) // (B // 2) == 40
    chunks, pool = kept_chunks(s.groups[0], batches, B // 2)
    assert not pool and len(chunks) == 40
    assert [len(b) for b in batches] == [B] * (N // B)
    assert len({i for b in batches for i in b}) == N - N % B
    for b in batches:
        assert frozenset(b[:B // 2]) in chunks and frozenset(b[B // 2:]) in chunks


@pytest.mark.filterwarnings("ignore::hardbatch.samplers.refresh.RefreshCostWarning")
def test_drop_last_leaves_out_a_random_choice_each_epoch_not_the_pool(x):
    s = hb.CommunityBatchSampler.authors(x, B, drop_last=True, seed=1)  # fixed embeddings
    left_out = []
    for epoch in range(6):
        s.set_epoch(epoch)
        batches = [list(b) for b in s]
        assert [len(b) for b in batches] == [B] * (N // B)  # 20 full batches, every one served
        served = {i for b in batches for i in b}
        assert len(served) == N - N % B == N - s.drop_count
        chunks, pool = kept_chunks(s.groups[0], batches, B)  # the kept items' trimming
        assert not pool and {frozenset(b) for b in batches} == chunks
        left_out.append(frozenset(range(N)) - served)
    _, pool = reference_trim(s.groups[0], B)  # what a trimming of all N would leave over
    assert len(set(left_out)) == 6 and set(pool) not in [set(d) for d in left_out]
    assert len(frozenset().union(*left_out)) > 3 * (N % B)  # spread over the items


def test_drop_last_with_ranks_serves_every_planned_part(x):
    # 20 full batches of 10 for 3 ranks: 6 steps of 3, 18 parts served, 25 items left out
    ranks = [list(hb.CommunityBatchSampler.authors(x, B, drop_last=True, world_size=3, rank=r))
             for r in range(3)]
    s = hb.CommunityBatchSampler.authors(x, B, drop_last=True, world_size=3, rank=0)
    items = [i for r in ranks for b in r for i in b]
    assert [len(r) for r in ranks] == [6] * 3 and len(items) == len(set(items)) == 180
    assert s.parts == 18 and s.drop_count == N - 180 == 25
    assert s.coverage == pytest.approx(180 / N)


def test_trimmed_order_is_the_reference_on_uneven_parts():
    rng = np.random.default_rng(1)
    for size, n in [(10, 205), (7, 300), (4, 4)]:
        labels = rng.integers(0, n // size, n)  # uneven sizes, some parts possibly empty
        final, pool = reference_trim(labels, size)
        order = trimmed_order(labels, size)
        assert order.tolist() == [i for c in final for i in c] + pool
        shuffled = trimmed_order(labels, size, seed=5)
        cut = len(final) * size
        assert sorted(shuffled.tolist()) == list(range(n))
        assert sorted(min(shuffled[i:i + size]) for i in range(0, cut, size)) == \
            [min(c) for c in final] and shuffled[cut:].tolist() == pool


@pytest.mark.parametrize("first,last", [(0, 5), (29, 129), (3, 23)])
def test_mutual_edges_are_a_subset_of_union_edges(x, first, last):
    nbrs = hb.knn_graph(x, last).numpy()
    union, mutual = pairs_of(rank_graph(nbrs, first, last)), \
        pairs_of(rank_graph(nbrs, first, last, mutual=True))
    assert mutual <= union and len(mutual) < len(union)
    lists = [set(row[first:last].tolist()) for row in nbrs]
    assert mutual == {(i, j) for i, j in union if j in lists[i] and i in lists[j]}


def test_bad_input_names_the_parameter_and_the_fix(x):
    with pytest.raises(ValueError, match=r"window=100 with skip=29 .* use window <= 70"):
        hb.CommunityBatchSampler.authors(x[:100], B)  # the window beyond N
    with pytest.raises(ValueError, match=r"unknown edges 'both'; use one of 'union', 'mutual'"):
        hb.CommunityBatchSampler(x, B, edges="both")
    with pytest.raises(ValueError, match=r"unknown batching 'exact'; use one of 'fill', 'trim'"):
        hb.CommunityBatchSampler(x, B, batching="exact")
    with pytest.raises(ValueError, match=r"communities_per_batch that divides 10"):
        hb.CommunityBatchSampler.authors(x, B, communities_per_batch=3)
    with pytest.raises(ValueError, match=r"pass at most N // size parts"):
        trimmed_order(np.arange(12) % 4, 4)  # 4 parts of 3 fill only 3 chunks of 4
    with pytest.raises(ValueError, match=r"unknown edges"):
        community_labels(hb.knn_graph(x, 8).numpy(), 4, skip=2, window=6, edges="Mutual")
