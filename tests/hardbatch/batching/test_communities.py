"""hardbatch.batching.communities against references written here (plain Python and NumPy):
the rank graph of a kNN window (union and mutual edges), one epoch's batch orders of groups
(group_order) and of cells (cell_order), B3's authors' trimmed chunks (trimmed_order),
groups_per_batch, and the METIS partition step (community_labels, pymetis), plus bad input.

Spherical k-means (spherical_clusters, community_cells, partitioner="kmeans") is not tested
here. The samplers composing these functions are tested in tests/hardbatch/samplers/
(test_community_sampler.py, test_community_sampler_authors.py, test_cluster_sampler.py)."""

import math

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch.batching.communities import cell_order, community_labels, dropped_last, \
    group_order, groups_per_batch, rank_graph, trimmed_order

# ---------------------------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------------------------


def ref_rank_pairs(nbrs, first: int, last: int, mutual: bool) -> set:
    """Ordered pairs (i, j) of the graph of ranks first .. last - 1: i lists j or j lists i
    (the union), or both (mutual); no self-pairs, no -1 entries."""
    lists = [{j for j in row[first:last] if j >= 0 and j != i}
             for i, row in enumerate(np.asarray(nbrs).tolist())]
    listed = {(i, j) for i, js in enumerate(lists) for j in js}
    if mutual:
        return {(i, j) for i, j in listed if (j, i) in listed}
    return listed | {(j, i) for i, j in listed}


def graph_pairs(g) -> set:
    coo = g.tocoo()
    return set(zip(coo.row.tolist(), coo.col.tolist()))


def ref_groups_per_batch(order, labels, batch_size: int, kept: int | None = None) -> list:
    """Distinct labels in each batch of ``order[:kept]`` cut every ``batch_size``."""
    order = list(order)[:kept]
    return [len({int(labels[i]) for i in order[s:s + batch_size]})
            for s in range(0, len(order), batch_size)]


def knn_table(x: np.ndarray, k: int) -> np.ndarray:
    """Exact cosine kNN of unit rows, self excluded, nearest first (ties: lower index)."""
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def blobs(rng: np.random.Generator, groups: int, size: int, d: int = 16,
          spread: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``groups`` tight clusters of ``size`` unit rows, items shuffled; rows and true groups."""
    truth = rng.permutation(np.repeat(np.arange(groups), size))
    x = np.eye(d)[truth] + spread * rng.standard_normal((groups * size, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True), truth


def cut_edges(pairs: set, labels: np.ndarray) -> int:
    return sum(labels[i] != labels[j] for i, j in pairs if i < j)


# ---------------------------------------------------------------------------------------------
# rank_graph
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mutual", [False, True])
@pytest.mark.parametrize("first,last", [(0, 1), (0, 6), (2, 5), (5, 6), (3, 3)])
def test_rank_graph_joins_the_window_ranks_union_or_mutual(first, last, mutual):
    rng = np.random.default_rng(10 * first + last)
    n, k = 30, 6
    nbrs = np.array([rng.choice(n, k, replace=False) for _ in range(n)])  # may list itself
    nbrs[rng.random((n, k)) < 0.1] = -1  # no neighbour at that rank
    g = rank_graph(nbrs, first, last, mutual=mutual)
    assert g.shape == (n, n) and g.format == "csr" and g.has_sorted_indices
    assert set(g.data.tolist()) <= {1}  # 0/1: a pair listed twice is still one edge
    assert graph_pairs(g) == ref_rank_pairs(nbrs, first, last, mutual)


def test_rank_graph_of_a_dense_knn_table_mutual_within_union():
    nbrs = knn_table(unit(np.random.default_rng(0), 80, 8), 10)
    union, mutual = rank_graph(nbrs, 0, 10), rank_graph(nbrs, 0, 10, mutual=True)
    assert graph_pairs(mutual) < graph_pairs(union)  # kNN is not symmetric: strictly fewer
    assert graph_pairs(union) == ref_rank_pairs(nbrs, 0, 10, False)
    assert graph_pairs(mutual) == ref_rank_pairs(nbrs, 0, 10, True)


# ---------------------------------------------------------------------------------------------
# trimmed_order
# ---------------------------------------------------------------------------------------------
def test_trimmed_order_of_a_small_case_worked_by_hand():
    # part 0 = {0, 1, 2, 3, 6} (largest first) keeps 0, 1, 2 and gives 3, 6 to the pool; part 1
    # = {4, 5} takes the pool's last given, 3; chunks by smallest item, then the pool: 6
    assert trimmed_order(np.array([0, 0, 0, 0, 1, 1, 0]), 3).tolist() == [0, 1, 2, 4, 5, 3, 6]


@pytest.mark.parametrize("n,size,values,seed", [
    (50, 5, range(10), None),  # N // size parts: one chunk each, no pool
    (53, 5, range(10), None),  # a pool of N mod size
    (61, 7, range(5), None),  # fewer parts than N // size: a larger pool
    (61, 7, range(5), 3),  # the same chunks in a random order
    (40, 4, (0, 3, 7), None),  # labels with gaps (empty parts)
    (40, 4, (0,), 1),  # one part
])
def test_trimmed_order_cuts_one_chunk_of_exactly_size_items_per_part(n, size, values, seed):
    rng = np.random.default_rng(n + size)
    labels = rng.choice(np.array(values), n)  # uneven part sizes
    order = trimmed_order(labels, size, seed=seed)
    assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(n))
    present = sorted(set(labels.tolist()))
    chunks = [order[c * size:(c + 1) * size].tolist() for c in range(len(present))]
    pool = order[len(present) * size:].tolist()
    assert all(len(c) == size for c in chunks) and len(pool) == n - len(present) * size
    owners = []
    for p in present:  # a part's lowest-numbered min(count, size) items: all in one chunk
        head = sorted(i for i in range(n) if labels[i] == p)[:size]
        holding = [c for c, chunk in enumerate(chunks) if set(head) <= set(chunk)]
        assert len(holding) == 1, p
        owners.append(holding[0])
        assert sum(labels[i] == p for i in chunks[holding[0]]) == len(head)  # the rest: others'
    assert sorted(owners) == list(range(len(present)))  # each part once
    plain = trimmed_order(labels, size)
    if seed is None:  # the authors' file order: chunks by their smallest item
        assert [min(c) for c in chunks] == sorted(min(c) for c in chunks)
    else:
        assert sorted(map(sorted, chunks)) == sorted(
            sorted(plain[c * size:(c + 1) * size].tolist()) for c in range(len(present)))
        assert pool == plain[len(present) * size:].tolist()
        assert np.array_equal(order, trimmed_order(labels, size, seed=seed))


@pytest.mark.parametrize("n,size,drop", [(53, 5, 3), (53, 5, 8), (61, 7, 12), (40, 4, 4)])
def test_trimmed_order_with_drop_trims_the_items_kept(n, size, drop):
    """``drop`` random items (drop_last) go last; the rest is the trimming of the kept items
    alone (their parts, chunks of exactly ``size``), a new choice for a new seed."""
    rng = np.random.default_rng(n + drop)
    labels = rng.integers(0, (n - drop) // size, n)  # at most (N - drop) // size parts
    order = trimmed_order(labels, size, seed=4, drop=drop)
    assert sorted(order.tolist()) == list(range(n))
    left_out = order[n - drop:]
    kept = np.setdiff1d(np.arange(n), left_out)  # ascending: the kept items' own numbering
    assert np.array_equal(order[:n - drop], kept[trimmed_order(labels[kept], size, seed=4)])
    assert np.array_equal(order, trimmed_order(labels, size, seed=4, drop=drop))
    others = {frozenset(trimmed_order(labels, size, seed=s, drop=drop)[n - drop:].tolist())
              for s in range(5, 10)}
    assert len(others | {frozenset(left_out.tolist())}) > 1  # not the same items every seed
    assert np.array_equal(trimmed_order(labels, size, seed=4, drop=0),
                          trimmed_order(labels, size, seed=4))


# ---------------------------------------------------------------------------------------------
# dropped_last: which items drop_last leaves out
# ---------------------------------------------------------------------------------------------
def test_dropped_last_moves_a_random_choice_to_the_end_keeping_the_order():
    order = np.random.default_rng(0).permutation(50)
    out = dropped_last(order, 7, seed=3)
    assert sorted(out.tolist()) == list(range(50))
    kept, left_out = out[:43].tolist(), set(out[43:].tolist())
    assert kept == [i for i in order.tolist() if i not in left_out]  # the others in order
    assert np.array_equal(out, dropped_last(order, 7, seed=3))
    choices = {frozenset(dropped_last(order, 7, seed=s)[43:].tolist()) for s in range(20)}
    assert len(choices) == 20  # a new seed (epoch), a new choice
    spread = np.concatenate([np.flatnonzero(np.isin(order, list(c))) for c in choices])
    assert spread.max() - spread.min() > 40  # anywhere in the order, not its tail
    assert dropped_last(order, 0, seed=3) is order
    more = set(dropped_last(order, 12, seed=3)[38:].tolist())
    assert left_out <= more  # a larger drop leaves out more of the same


# ---------------------------------------------------------------------------------------------
# group_order
# ---------------------------------------------------------------------------------------------
def test_group_order_batches_of_one_whole_group_each():
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(5), 8))  # 5 groups of 8, items shuffled
    order = group_order(labels, 8, seed=0)
    assert sorted(order.tolist()) == list(range(40))
    batches = [set(order[s:s + 8].tolist()) for s in range(0, 40, 8)]
    groups = [set(np.flatnonzero(labels == g).tolist()) for g in range(5)]
    assert sorted(map(sorted, batches)) == sorted(map(sorted, groups))


@pytest.mark.parametrize("c", [1, 2, 4])
def test_group_order_draws_each_batch_from_groups_per_batch_groups(c):
    rng = np.random.default_rng(c)
    labels = rng.permutation(np.repeat(np.arange(6), 16))  # groups of 16: whole slots of 16 / c
    order = group_order(labels, 16, c, seed=c)
    assert sorted(order.tolist()) == list(range(96))
    assert ref_groups_per_batch(order, labels, 16) == [c] * 6
    assert np.array_equal(order, group_order(labels, 16, c, seed=c))  # fixed seed, same order
    assert not np.array_equal(order, group_order(labels, 16, c, seed=c + 1))


@pytest.mark.parametrize("c,drop", [(1, 0), (3, 0), (3, 17), (2, 5)])
def test_group_order_uneven_groups_one_extra_group_at_most_per_group_end(c, drop):
    rng = np.random.default_rng(7 + c + drop)
    sizes = rng.integers(1, 60, 12)
    labels = rng.permutation(np.repeat(np.arange(12), sizes))
    n, b = len(labels), 24
    order = group_order(labels, b, c, seed=2, drop=drop)
    assert sorted(order.tolist()) == list(range(n))
    kept = n - drop
    counts = ref_groups_per_batch(order, labels, b, kept)
    full = counts[:kept // b]  # the short last batch (kept mod B items) is cut from leftovers
    assert sum(max(0, k - c) for k in full) <= len(sizes)  # the fill: one per group end
    assert np.mean(full) <= c + 1
    if drop:  # the dropped items last; the batches, cut from the rest, are the same kind
        assert len(set(order[kept:].tolist())) == drop
        again = group_order(labels, b, c, seed=2, drop=drop)
        assert np.array_equal(order, again)


# moved from tests/hardbatch/samplers/test_cluster_sampler.py (it tests group_order alone)
def test_group_order_lanes_and_drop():
    labels = np.repeat(np.arange(7), [30, 5, 64, 17, 40, 1, 43])  # 200 items
    order = group_order(labels, 32, 2, seed=4, drop=200 % 32)
    kept = 200 - 200 % 32
    assert sorted(order.tolist()) == list(range(200)) and len(order) == 200
    counts = groups_per_batch(order, labels, 32, kept)
    assert len(counts) == kept // 32
    assert np.maximum(counts - 2, 0).sum() <= 7 + 1
    again = group_order(labels, 32, 2, seed=4, drop=200 % 32)
    assert np.array_equal(order, again) and not np.array_equal(order, group_order(
        labels, 32, 2, seed=5, drop=200 % 32))


# ---------------------------------------------------------------------------------------------
# cell_order
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,k,drop", [(32, 4, 0), (30, 4, 0), (32, 1, 0), (32, 4, 8)])
def test_cell_order_pieces_lie_within_one_cell(b, k, drop):
    rng = np.random.default_rng(b + k + drop)
    n, cells_n = 1000, 8
    cells, labels = rng.integers(0, cells_n, n), rng.integers(0, 60, n)
    order, blocks = cell_order(labels, cells, b, k, seed=1, drop=drop)
    assert sorted(order.tolist()) == list(range(n))
    assert blocks.shape == (n - drop,) and blocks.min() >= 0 and blocks.max() <= cells_n
    q, full = b // k, n // b
    for i in range(full):
        batch, where = order[i * b:(i + 1) * b], blocks[i * b:(i + 1) * b]
        for j in range(k):  # k pieces of q places, each from one block
            piece = slice(j * q, (j + 1) * q)
            assert len(set(where[piece].tolist())) == 1
        assert (where[k * q:] == cells_n).all()  # the b mod k extra places: no cell's piece
        inside = where < cells_n
        assert (cells[batch[inside]] == where[inside]).all()  # a cell's piece holds its items
    assert (blocks[full * b:] == cells_n).all()  # the short last batch
    assert np.array_equal(order, cell_order(labels, cells, b, k, seed=1, drop=drop)[0])
    assert not np.array_equal(order, cell_order(labels, cells, b, k, seed=2, drop=drop)[0])


def test_cell_order_of_whole_pieces_holds_groups_per_batch_groups():
    rng = np.random.default_rng(3)
    # 4 cells of 64 items, each of 4 groups of 16: every piece of 16 / 2 = 8 items is one group
    cells = rng.permutation(np.repeat(np.arange(4), 64))
    labels = np.empty(256, np.int64)
    for c in range(4):
        mine = np.flatnonzero(cells == c)
        labels[mine] = 4 * c + rng.permutation(np.repeat(np.arange(4), 16))
    order, blocks = cell_order(labels, cells, 16, 2, seed=0)
    counts = ref_groups_per_batch(order, labels, 16)
    assert len(counts) == 16 and max(counts) <= 2  # two pieces: two groups or, by chance, one
    assert (blocks < 4).all()  # no leftovers: every place is a cell's piece


# moved from tests/hardbatch/samplers/test_community_sampler.py (it tests cell_order alone)
def test_new_labels_in_one_cell_change_only_its_batches():
    rng = np.random.default_rng(0)
    cells, labels = rng.integers(0, 8, 1000), rng.integers(0, 60, 1000)
    order, blocks = cell_order(labels, cells, 32, 4, seed=1)
    assert sorted(order.tolist()) == list(range(1000))
    assert all(set(cells[order[blocks == c]].tolist()) <= {c} for c in range(8))
    moved = labels.copy()
    moved[cells == 3] = rng.integers(0, 60, (cells == 3).sum())  # a new METIS run in cell 3
    other, _ = cell_order(moved, cells, 32, 4, seed=1)
    batch = np.arange(1000) // 32
    touched = set(batch[np.isin(order, np.flatnonzero(cells == 3))].tolist())
    same = [i for i in range(32) if np.array_equal(order[batch == i], other[batch == i])]
    assert set(range(32)) - touched <= set(same) and len(same) >= 32 - len(touched)
    assert len(touched) <= (cells == 3).sum() // 8 + 2  # its pieces of 8, its leftovers
    kept, kept_blocks = cell_order(labels, cells, 32, 4, seed=1, drop=1000 % 32)
    assert np.array_equal(kept, order) and len(kept_blocks) == 1000 - 1000 % 32


# ---------------------------------------------------------------------------------------------
# groups_per_batch
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,b,kept", [(100, 10, None), (103, 10, None), (103, 10, 100),
                                      (50, 7, 45), (5, 8, None)])
def test_groups_per_batch_counts_distinct_labels_per_batch(n, b, kept):
    rng = np.random.default_rng(n + b)
    order, labels = rng.permutation(n), rng.integers(0, 9, n)
    got = groups_per_batch(order, labels, b, kept)
    assert got.tolist() == ref_groups_per_batch(order, labels, b, kept)


# ---------------------------------------------------------------------------------------------
# community_labels (METIS)
# ---------------------------------------------------------------------------------------------
def test_community_labels_find_disconnected_clusters():
    x, truth = blobs(np.random.default_rng(0), 4, 40)
    nbrs = knn_table(x, 12)  # every item's 12 nearest lie in its own cluster of 40
    assert (truth[nbrs] == truth[:, None]).all()
    labels = community_labels(nbrs, 4, skip=2, window=10, seed=0)
    assert sorted(len(set(labels[truth == g].tolist())) for g in range(4)) == [1, 1, 1, 1]
    assert len(set(labels.tolist())) == 4  # one community per cluster


@pytest.mark.parametrize("parts,imbalance,edges", [(4, 1.03, "union"), (10, 1.03, "union"),
                                                   (7, 1.3, "union"), (6, 1.03, "mutual")])
def test_community_labels_are_balanced_and_follow_the_rank_graph(parts, imbalance, edges):
    rng = np.random.default_rng(parts)
    n, skip, window = 300, 2, 10
    nbrs = knn_table(unit(rng, n, 8), skip + window)
    labels = community_labels(nbrs, parts, skip=skip, window=window, seed=1,
                              imbalance=imbalance, edges=edges)
    assert labels.dtype == np.int64 and labels.shape == (n,)
    assert labels.min() >= 0 and labels.max() < parts
    sizes = np.bincount(labels, minlength=parts)
    assert sizes.min() > 0 and sizes.max() <= math.ceil(imbalance * n / parts) + 1  # + rounding
    pairs = ref_rank_pairs(nbrs, skip, skip + window, edges == "mutual")
    random_cut = np.mean([cut_edges(pairs, rng.permutation(labels)) for _ in range(3)])
    assert cut_edges(pairs, labels) < 0.75 * random_cut  # communities, not arbitrary parts
    again = community_labels(nbrs, parts, skip=skip, window=window, seed=1,
                             imbalance=imbalance, edges=edges)
    assert np.array_equal(labels, again)  # a fixed seed: the same communities


def test_community_labels_read_only_the_window_and_mutual_equals_union_when_symmetric():
    rng = np.random.default_rng(4)
    n = 120
    # a ring: i lists i +- 1, i +- 2 (every relation mutual), then ranks outside the window
    ring = np.array([[(i + s) % n for s in (1, -1, 2, -2)] for i in range(n)])
    skipped, beyond = rng.integers(0, n, (n, 2)), rng.integers(0, n, (n, 3))
    nbrs = np.concatenate([skipped, ring, beyond], axis=1)
    labels = community_labels(nbrs, 4, skip=2, window=4, seed=0)
    other = np.concatenate([rng.integers(0, n, (n, 2)), ring, rng.integers(0, n, (n, 3))], 1)
    assert np.array_equal(labels, community_labels(other, 4, skip=2, window=4, seed=0))
    assert np.array_equal(labels, community_labels(nbrs, 4, skip=2, window=4, seed=0,
                                                   edges="mutual"))
    # a ring in 4 balanced parts: 4 arcs, so 4 cut ring edges or a few more
    assert cut_edges(ref_rank_pairs(ring, 0, 2, False), labels) <= 8


def test_community_labels_in_cells_keep_each_community_in_its_cell():
    rng = np.random.default_rng(5)
    n = 300
    nbrs = knn_table(unit(rng, n, 8), 10)
    cells = rng.integers(0, 3, n)
    labels = community_labels(nbrs, 9, skip=0, window=10, cells=cells, seed=2)
    assert set(labels.tolist()) == set(range(9))
    for g in range(9):
        assert len(set(cells[labels == g].tolist())) == 1
    per_cell = [len(set(labels[cells == c].tolist())) for c in range(3)]
    assert sum(per_cell) == 9 and min(per_cell) >= 1  # the parts shared out among the cells


# moved from tests/hardbatch/samplers/test_community_sampler.py (it tests the partition step
# and rank_graph alone)
def test_partition_step_alone_is_deterministic_and_uses_the_window_only():
    x = torch.nn.functional.normalize(torch.randn(300, 8, generator=torch.Generator()
                                                  .manual_seed(0)), dim=1)
    nbrs = hb.knn_graph(x, 12).numpy()
    a = community_labels(nbrs, 10, skip=2, window=10, seed=5)
    assert np.array_equal(a, community_labels(nbrs, 10, skip=2, window=10, seed=5))
    assert a.shape == (300,) and set(a.tolist()) == set(range(10))
    shuffled = nbrs.copy()
    shuffled[:, :2] = shuffled[:, [1, 0]]  # the skipped ranks do not enter the graph
    assert np.array_equal(a, community_labels(shuffled, 10, skip=2, window=10, seed=5))
    g = rank_graph(nbrs, 2, 12)
    assert (g != g.T).nnz == 0 and g.diagonal().sum() == 0
    with pytest.raises(ValueError, match="skip \\+ window = 14 ranks but neighbors holds 12"):
        community_labels(nbrs, 10, skip=4, window=10)


# ---------------------------------------------------------------------------------------------
# bad input: a ValueError naming the parameter
# ---------------------------------------------------------------------------------------------
NBRS = knn_table(unit(np.random.default_rng(9), 40, 8), 8)
LABELS = np.arange(40) % 5


@pytest.mark.parametrize("call, match", [
    (lambda: trimmed_order(LABELS, 0), r"size=0 must be >= 1"),
    (lambda: trimmed_order(LABELS, 9), r"labels hold 5 parts but N=40 .* size=9"),
    (lambda: group_order(LABELS, 0), r"batch_size=0 must be >= 1"),
    (lambda: group_order(LABELS, 8, 0), r"groups_per_batch=0 must be >= 1"),
    (lambda: group_order(LABELS, 8.0), r"batch_size must be an integer"),
    (lambda: group_order(np.arange(10) // 2, 2, 3), r"groups_per_batch=3 must be <= 2, the "
                                                    r"batch_size .*use groups_per_batch <= 2"),
    (lambda: group_order(LABELS, 8, drop=41), r"drop=41 must be <= 40"),
    (lambda: trimmed_order(LABELS, 4, drop=3), r"drop=3 leaves out a seeded random choice .* "
                                               r"pass seed="),
    (lambda: trimmed_order(np.arange(12) % 3, 4, seed=0, drop=4),
     r"labels hold 3 parts but N - drop = 8 items fill only \(N - drop\) // size = 2 chunks"),
    (lambda: dropped_last(np.arange(5), 6, seed=0), r"drop=6 must be <= 5"),
    (lambda: cell_order(LABELS, LABELS % 2, 0), r"batch_size=0 must be >= 1"),
    (lambda: cell_order(LABELS, LABELS % 2, 8, 9), r"groups_per_batch=9 must be <= 8"),
    (lambda: cell_order(LABELS, LABELS % 2, 8, 2, drop=41), r"drop=41 must be <= 40"),
    (lambda: community_labels(NBRS, 0, skip=0, window=4), r"parts=0 must be >= 1"),
    (lambda: community_labels(NBRS, 41, skip=0, window=4), r"parts=41 must be <= 40"),
    (lambda: community_labels(NBRS, 4, skip=4, window=6), r"skip \+ window = 10 ranks but "
                                                          r"neighbors holds 8"),
    (lambda: community_labels(NBRS, 4, skip=0, window=4, partitioner="spectral"),
     r"partitioner"),
    (lambda: community_labels(NBRS, 4, skip=0, window=4, edges="both"), r"edges"),
    (lambda: community_labels(NBRS, 4, skip=0, window=4, imbalance=3.0),
     r"imbalance=3.0 is outside"),
    (lambda: community_labels(NBRS, 4, skip=0, window=4, cells=np.zeros(39, np.int64)),
     r"cells must hold one cell id >= 0 per item \(40\)"),
    (lambda: community_labels(NBRS, 2, skip=0, window=4, cells=np.arange(40) % 3),
     r"cells= holds 3 non-empty cells but parts=2"),
    (lambda: community_labels(NBRS, 4, skip=0, window=4, partitioner="kmeans"),
     r"partitioner='kmeans' .* pass embeddings="),
])
def test_bad_input_is_a_value_error_naming_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()
