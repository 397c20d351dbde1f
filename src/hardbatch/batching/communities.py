"""Groups of items for batches: spherical k-means clusters (TAS-B) and graph communities (B3).

Arrays in, arrays out; the samplers :class:`~hardbatch.samplers.ClusterBatchSampler` and
:class:`~hardbatch.samplers.CommunityBatchSampler` compose them:

* :func:`spherical_clusters`: item labels of spherical k-means
  (:func:`hardbatch.neighbors.kmeans.kmeans_labels`: faiss's ``faiss.Kmeans(spherical=True)``
  when installed, else the torch :func:`~hardbatch.neighbors.kmeans.spherical_kmeans`);
  above 256 clusters in two levels (coarse cells, then clusters within each cell);
* :func:`rank_graph`: the symmetric sparse graph of the kNN ranks ``first .. last - 1``;
* :func:`community_labels`: B3's partition step: the graph of ranks ``skip + 1 .. skip +
  window``, cut into ``parts`` balanced communities by METIS (:mod:`hardbatch.batching.metis_partition`),
  in one run or one run per cell (``cells``), or, without the extra, spherical k-means
  clusters of the embeddings (``partitioner="kmeans"``);
* :func:`community_cells`: the cells of a local build (spherical k-means, about
  ``CELL_BATCHES`` batches each) and :func:`cell_order`, one epoch's batches cut within them:
  what rounding noise changes in one cell (a kNN rank swapped at a window's end, so a new METIS
  run) then changes that cell's batches only;
* :func:`trimmed_order`: B3's authors' batches: parts trimmed and filled to exactly B items;
* :func:`group_order`: one epoch's partition into batches of whole groups: groups in random
  order, each batch drawing from ``groups_per_batch`` groups; a group that runs out mid-batch is
  continued by the next group of the order (the fill);
* :func:`dropped_last`: which items ``drop_last`` leaves out (a seeded random choice), the one
  rule of :func:`group_order`, :func:`trimmed_order` and GCBS's orders;
* :func:`separate_pairs` (:mod:`hardbatch.batching.pair_separation`): moves one item of every pair of a
  sparse graph (B3's skipped top ranks) that shares a batch to another batch;
  :func:`pairs_in_batches` counts such pairs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.sparse import csr_matrix

from .. import _rng
from .._validation import check_choice, check_int, l2_normalize_rows
from ..neighbors.kmeans import check_kmeans_backend, kmeans_labels
from ..neighbors.kmeans_tree import apportion
from .metis_partition import check_imbalance, metis_output_caught, metis_parts, \
    require_metis
from .pair_separation import pairs_in_batches, separate_pairs

__all__ = ["cell_order", "community_cells", "community_labels", "dropped_last", "group_order",
           "groups_per_batch", "pairs_in_batches", "rank_graph", "require_metis",
           "separate_pairs", "spherical_clusters", "trimmed_order"]

FLAT_CLUSTERS = 256  # above: two-level k-means (coarse cells of about sqrt(k) clusters each)
PARTITIONERS = ("metis", "kmeans")
EDGES = ("union", "mutual")  # ours; B3's authors' (spectral_clustering4_ibn.py)
CELL_BATCHES = 2  # community_cells: cells of about 2 batches (what one noisy edge moves)


def dropped_last(order, drop: int, seed: int) -> np.ndarray:
    """``order`` with a seeded random choice of ``drop`` of its places moved to its end, the
    others in their order: the items ``drop_last`` leaves out of an epoch (the places: the
    first ``drop`` of the portable permutation of ``len(order)`` for ``seed``; a new seed per
    epoch gives a new choice). ``order`` itself when ``drop`` is 0.

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import dropped_last
        >>> out = dropped_last(np.arange(10), 3, seed=0)
        >>> sorted(out.tolist()) == list(range(10)), bool((np.diff(out[:7]) > 0).all())
        (True, True)
    """
    order = np.asarray(order)
    drop = check_int(drop, "drop", low=0, high=len(order))
    if not drop:
        return order
    keep = np.ones(len(order), bool)
    keep[_rng.permutation(len(order), seed)[:drop]] = False
    return np.concatenate([order[keep], order[~keep]])


def _check_groups_per_batch(value, batch_size: int) -> int:
    value = check_int(value, "groups_per_batch", low=1)
    if value > batch_size:
        raise ValueError(f"groups_per_batch={value} must be <= {batch_size}, the batch_size "
                         "(each group gives a batch at least one item); use groups_per_batch "
                         f"<= {batch_size}")
    return value


def spherical_clusters(embeddings, k: int, *, seed: int = 0, iters: int = 10,
                       backend: str = "auto") -> np.ndarray:
    """Spherical k-means labels of the rows of ``embeddings`` (cosine; rows normalised here).

    ``backend``: ``"faiss"`` (``faiss.Kmeans(spherical=True)``, trained on at most 64 rows per
    centroid), ``"torch"`` (:func:`hardbatch.neighbors.kmeans.spherical_kmeans`, the same sample
    size) or ``"auto"`` (faiss when installed; in the calling thread alone for small problems)
    (:func:`hardbatch.neighbors.kmeans.kmeans_labels`). Up to
    256 clusters one k-means; beyond, ``ceil(sqrt(k))`` coarse cells, then each cell's share of
    the ``k`` clusters (proportional to its items) within it: ``O(N d sqrt(k))`` per iteration,
    not ``O(N d k)``. Deterministic for a seed and backend; a cluster may end up empty.

    Returns:
        int64 ``[N]`` labels in ``[0, k)``.

    Example:
        >>> import torch
        >>> from hardbatch.batching.communities import spherical_clusters
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 groups
        >>> labels = spherical_clusters(x, 4, backend="torch")
        >>> labels.shape, len(set(zip(labels.tolist(), (torch.arange(40) % 4).tolist())))
        ((40,), 4)
    """
    check_kmeans_backend(backend)
    x = l2_normalize_rows(torch.as_tensor(embeddings).float())
    n = x.shape[0]
    k = check_int(k, "k", low=1, high=n)

    def small(k: int) -> bool:  # one k-means iteration of at most 2^31 multiply-adds
        return min(n, 64 * k) * k * x.shape[1] < 2**31

    if k <= FLAT_CLUSTERS:
        return kmeans_labels(x, k, seed, iters, backend, small(k))
    cells = math.ceil(math.sqrt(k))
    coarse = kmeans_labels(x, cells, _rng.derive_seed(seed, 1), iters, backend, small(cells))
    counts = np.bincount(coarse, minlength=cells)
    share = apportion(counts, k)
    members = np.argsort(coarse, kind="stable")
    labels = np.empty(n, np.int64)
    start, base = 0, 0
    for cell in range(cells):
        rows = members[start:start + counts[cell]]
        start += counts[cell]
        if len(rows):
            sub = kmeans_labels(x[torch.from_numpy(rows)], int(share[cell]),
                                _rng.derive_seed(seed, 2, cell), iters, backend, one_thread=True)
            labels[rows] = base + sub
            base += int(share[cell])
    return labels


def rank_graph(neighbors, first: int, last: int, mutual: bool = False) -> csr_matrix:
    """The symmetric 0/1 graph joining item i and its neighbours of ranks ``first .. last - 1``
    (columns of a kNN table, rank 0 the nearest; self-loops dropped): i and j are joined when
    either lists the other (the union), or with ``mutual`` only when both do (B3's authors').

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import rank_graph
        >>> nbrs = np.array([[1, 2], [0, 2], [1, 0], [2, 1]])  # 4 items, 2 neighbours each
        >>> g = rank_graph(nbrs, 1, 2)  # rank 1 only: 0-2, 1-2, 2-0, 3-1
        >>> g.shape, g.nnz, sorted(g[2].indices.tolist())
        ((4, 4), 6, [0, 1])
        >>> rank_graph(nbrs, 0, 2, mutual=True).nnz  # 0-1, 0-2, 1-2; 3 lists 2, 2 not 3
        6
    """
    nbrs = np.asarray(neighbors, np.int64)
    n = nbrs.shape[0]
    cols = nbrs[:, first:last].ravel()
    rows = np.repeat(np.arange(n, dtype=np.int64), last - first)
    keep = (cols != rows) & (cols >= 0)
    g = csr_matrix((np.ones(int(keep.sum()), np.int8), (rows[keep], cols[keep])), shape=(n, n))
    g = ((g.multiply(g.T) if mutual else g + g.T) > 0).astype(np.int8).tocsr()
    g.sort_indices()
    return g


def community_cells(embeddings, batch_size: int, *, seed: int = 0,
                    cell_batches: int = CELL_BATCHES, max_cells: int | None = None) -> np.ndarray:
    """Cells of a local community build: spherical k-means (``backend="torch"``, the same with
    or without faiss) of the unit rows in ``round(N / (cell_batches * batch_size))`` cells (at
    least one, at most ``max_cells``: the communities that the cells will share), so about
    ``cell_batches`` batches each. The cells move only where the
    embeddings move a k-means boundary; :func:`community_labels` (``cells=``) and
    :func:`cell_order` then keep what changes in one cell inside it.

    Example:
        >>> import torch
        >>> from hardbatch.batching.communities import community_cells
        >>> noise = torch.randn(400, 8, generator=torch.Generator().manual_seed(0))
        >>> x = torch.eye(8)[torch.arange(400) % 4] + 0.05 * noise  # 4 groups of 100
        >>> cells = community_cells(x, 25, seed=0, cell_batches=4)  # 400 / (4 * 25) = 4 cells
        >>> cells.shape, sorted(set(cells.tolist()))
        ((400,), [0, 1, 2, 3])
    """
    x = l2_normalize_rows(torch.as_tensor(embeddings).float())
    n = x.shape[0]
    b = check_int(batch_size, "batch_size", low=1)
    k = max(1, min(n, round(n / (check_int(cell_batches, "cell_batches", low=1) * b))))
    if max_cells is not None:
        k = min(k, check_int(max_cells, "max_cells", low=1))
    return spherical_clusters(x, k, seed=seed, backend="torch")


def _per_cell(g: csr_matrix, parts: int, cells: np.ndarray, seed: int,
              imbalance: float) -> np.ndarray:
    """METIS in every cell: the graph's edges within it, ``parts`` shared out by cell size."""
    n = g.shape[0]
    counts = np.bincount(cells)
    if parts < np.count_nonzero(counts):
        raise ValueError(f"cells= holds {np.count_nonzero(counts)} non-empty cells but "
                         f"parts={parts}; pass at least one part per cell")
    share = apportion(counts, parts)
    members = np.argsort(cells, kind="stable")  # each cell's items in item order
    start = np.concatenate([[0], np.cumsum(counts)])
    local = np.empty(n, np.int64)
    local[members] = np.arange(n) - start[cells[members]]
    e = g.tocoo()
    keep = cells[e.row] == cells[e.col]
    cell, row, col = cells[e.row[keep]], local[e.row[keep]], local[e.col[keep]]
    by = np.lexsort((col, row, cell))
    cell, row, col = cell[by], row[by], col[by]
    bounds = np.searchsorted(cell, np.arange(len(counts) + 1))
    labels = np.empty(n, np.int64)
    offset = 0
    with metis_output_caught():  # one warning for all the cells' runs
        for c in np.flatnonzero(counts):
            a, z, size = bounds[c], bounds[c + 1], counts[c]
            sub = csr_matrix((np.ones(z - a, np.int8), (row[a:z], col[a:z])),
                             shape=(size, size))
            labels[members[start[c]:start[c + 1]]] = offset + metis_parts(
                sub, int(share[c]), seed=_rng.derive_seed(seed, int(c)), imbalance=imbalance)
            offset += int(share[c])
    return labels


def community_labels(neighbors, parts: int, *, skip: int, window: int,
                     partitioner: str = "metis", seed: int = 0, embeddings=None,
                     imbalance: float = 1.03, edges: str = "union",
                     cells=None) -> np.ndarray:
    """B3's partition step: communities of the graph of kNN ranks ``skip + 1 .. skip + window``.

    ``neighbors`` is an ``[N, >= skip + window]`` kNN table (rank 0 the nearest, self
    excluded), as :func:`hardbatch.knn_graph` returns. The ranks make a sparse graph
    (:func:`rank_graph`: ``edges="union"`` or B3's authors' ``"mutual"``), cut in ``parts``:

    * ``"metis"`` (B3's): METIS k-way (``pymetis``; ``pip install 'hardbatch[metis]'``;
      :func:`hardbatch.batching.metis_partition.metis_parts`) with the balance tolerance ``imbalance``
      in [1, 2] (METIS's ``ufactor``: no community above ``imbalance * N / parts`` items, up to
      METIS's rounding). One run over the whole graph, or with ``cells`` (int64 ``[N]`` cell
      ids, e.g. :func:`community_cells`) one run per cell on the edges within it, the ``parts``
      shared out by cell size (at least one per cell). METIS is chaotic in its graph: one edge
      more or less (two kNN ranks swapped by rounding noise at the window's end) moves every
      part of its run, so in cells it moves only those of its cell;
    * ``"kmeans"``: no extra needed: :func:`spherical_clusters` of ``embeddings`` (the graph is
      not used; clusters are not balanced, the batches' fill absorbs that; ``cells`` unused).

    Returns:
        int64 ``[N]`` community labels in ``[0, parts)``.

    Example:
        >>> import numpy as np, torch
        >>> import hardbatch as hb
        >>> from hardbatch.batching.communities import community_labels
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator()
        ...                                   .manual_seed(0)), dim=1)
        >>> nbrs = hb.knn_graph(x, 8).numpy()
        >>> labels = community_labels(nbrs, 4, skip=2, window=6)
        >>> labels.shape, len(np.unique(labels)), int(np.bincount(labels).max()) <= 12
        ((40,), 4, True)
        >>> cells = (x[:, 0] > 0).long().numpy()  # two cells, the 4 parts shared by size
        >>> labels = community_labels(nbrs, 4, skip=2, window=6, cells=cells)
        >>> len(set(labels.tolist())), all(len(set(cells[labels == c])) == 1 for c in range(4))
        (4, True)
    """
    check_choice("partitioner", partitioner, PARTITIONERS)
    check_choice("edges", edges, EDGES)
    nbrs = np.asarray(neighbors, np.int64)
    n = nbrs.shape[0]
    parts = check_int(parts, "parts", low=1, high=n)
    if skip + window > nbrs.shape[1]:
        raise ValueError(f"skip + window = {skip + window} ranks but neighbors holds "
                         f"{nbrs.shape[1]} per item; pass a kNN table of at least "
                         f"{skip + window} neighbours")
    if partitioner == "kmeans":
        if embeddings is None:
            raise ValueError("partitioner='kmeans' clusters the embeddings; pass embeddings=")
        return spherical_clusters(embeddings, parts, seed=seed)
    imbalance = check_imbalance(imbalance)
    require_metis()
    g = rank_graph(nbrs, skip, skip + window, mutual=edges == "mutual")
    if cells is None:
        return metis_parts(g, parts, seed=seed, imbalance=imbalance)
    cells = np.asarray(cells, np.int64)
    if cells.shape != (n,) or (n and cells.min() < 0):
        raise ValueError(f"cells must hold one cell id >= 0 per item ({n}), got shape "
                         f"{cells.shape}")
    return _per_cell(g, parts, cells, seed, imbalance)


def cell_order(labels, cells, batch_size: int, groups_per_batch: int = 1, *, seed: int = 0,
               drop: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One epoch's order of B3's batches, each piece of a batch cut within one cell.

    Each cell's items are ordered by :func:`group_order` with ``batch_size // groups_per_batch``
    (q) for the batch size (its groups, ``labels``, in a random order, a group's whole pieces
    first) and cut into pieces of q items; the cells' last ``n_cell mod q`` items (the
    leftovers, following the cells in a random order) are cut into pieces in turn. A batch is
    ``groups_per_batch`` pieces drawn at random (so groups of any cells: the pieces in the
    order of a random key of (cell, piece index)), then ``batch_size mod groups_per_batch``
    items of the unused pieces; their rest makes the short last batch
    (N mod B items). ``drop`` leaves out the order's last ``drop`` items (N mod B: that
    batch, and with W ranks the last full batches). A cell's pieces depend on its items and labels alone, so new labels in one
    cell (a new METIS run) change the batches holding its pieces or leftovers, not the others
    (a cell that gains or loses a piece shifts the pieces after its key).

    Returns:
        (int64 ``[N]`` order: batch i is ``order[i * B:(i + 1) * B]`` of the first ``N -
        drop``; int64 ``[N - drop]`` the block of each place: its piece's cell, or the number
        of cells for the leftovers' pieces and the rest, for :func:`separate_pairs`).

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import cell_order
        >>> cells = np.arange(44) // 22  # two cells of 22 items: 5 pieces of 4 each, 2 left
        >>> order, blocks = cell_order(np.arange(44) // 4, cells, 8, 2, seed=0)  # 5 batches
        >>> sorted(order.tolist()) == list(range(44)), len(blocks), int((blocks < 2).sum())
        (True, 44, 36)
        >>> all(len(set(cells[order[blocks == c]])) == 1 for c in (0, 1))  # pieces in a cell
        True
    """
    labels, cells = np.asarray(labels, np.int64), np.asarray(cells, np.int64)
    n, b = labels.shape[0], check_int(batch_size, "batch_size", low=1)
    k = _check_groups_per_batch(groups_per_batch, b)
    q, extra, full = b // k, b % k, n // b
    counts = np.bincount(cells, minlength=1)
    members = np.argsort(cells, kind="stable")
    start = np.concatenate([[0], np.cumsum(counts)])
    pieces, owner, keys, rest = [np.empty((0, q), np.int64)], [], [], []

    def add(items: np.ndarray, cell: int) -> np.ndarray:  # its whole pieces; the rest back
        cut = len(items) // q
        pieces.append(items[:cut * q].reshape(cut, q))
        owner.extend([cell] * cut)
        keys.extend(_rng.derive_seed(seed, 2, cell, j) for j in range(cut))
        return items[cut * q:]

    for c in _rng.permutation(len(counts), _rng.derive_seed(seed, 0)):
        items = members[start[c]:start[c + 1]]
        if len(items):
            rest.append(add(items[group_order(labels[items], q, seed=_rng.derive_seed(
                seed, 1, int(c)))], int(c)))
    rest = add(np.concatenate(rest) if rest else np.empty(0, np.int64), len(counts))
    pieces, owner = np.concatenate(pieces), np.array(owner, np.int64)
    pick = np.argsort(np.array(keys, np.uint64), kind="stable")  # a random order, by (cell, j)
    used, spare = pick[:full * k], pick[full * k:]
    tail = np.concatenate([pieces[spare].ravel(), rest])  # the extras, then the last batch
    order = np.concatenate([pieces[used].reshape(full, k * q),
                            tail[:full * extra].reshape(full, extra)], axis=1)
    blocks = np.concatenate([np.repeat(owner[used], q).reshape(full, k * q),
                             np.full((full, extra), len(counts), np.int64)], axis=1)
    order = np.concatenate([order.ravel(), tail[full * extra:]])
    blocks = np.concatenate([blocks.ravel(), np.full(n - full * b, len(counts), np.int64)])
    return order, blocks[:n - check_int(drop, "drop", low=0, high=n)]


def _slot_sizes(size: int, slots: int) -> np.ndarray:
    return np.array([size // slots + (j < size % slots) for j in range(slots)], np.int64)


def group_order(labels, batch_size: int, groups_per_batch: int = 1, *, seed: int = 0,
                drop: int = 0) -> np.ndarray:
    """One epoch's order of the items: batches of whole groups, cut every ``batch_size``.

    The groups are visited in a random order, their items shuffled, and the stream cut into
    ``groups_per_batch`` lanes (c); slot j of every batch (about B / c items) comes from lane j,
    so a batch draws from c groups. Within a lane the whole slots of each group come first, and
    the groups' leftovers (fewer than a slot) after them: a leftover that runs out mid-slot is
    continued by the next group of the lane (the fill), so only the batches cut from leftovers
    hold more than c groups (at most one extra group per group end). The full batches are then
    visited in random order and the short last batch (N mod B items) comes last. ``drop``
    items (a random choice, :func:`dropped_last`) are left out and placed at the end
    (``drop_last``). ``groups_per_batch`` is at most ``batch_size``.

    Returns:
        int64 ``[N]``: a permutation; batch i is ``order[i * B:(i + 1) * B]`` of the first
        ``N - drop``.

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import group_order, groups_per_batch
        >>> labels = np.arange(40) // 8  # 5 groups of 8
        >>> order = group_order(labels, 8, seed=0)
        >>> sorted(order.tolist()) == list(range(40)), groups_per_batch(order, labels, 8).tolist()
        (True, [1, 1, 1, 1, 1])
    """
    labels = np.asarray(labels, np.int64)
    n = labels.shape[0]
    b = check_int(batch_size, "batch_size", low=1)
    c = _check_groups_per_batch(groups_per_batch, b)
    items = dropped_last(np.arange(n, dtype=np.int64), drop, _rng.derive_seed(seed, 3))
    dropped, items = items[n - drop:], items[:n - drop]
    items = items[_rng.permutation(len(items), _rng.derive_seed(seed, 1))]
    rank = _rng.permutation(int(labels.max()) + 1, _rng.derive_seed(seed, 0))
    stream = items[np.argsort(rank[labels[items]], kind="stable")]
    kept = len(stream)
    full, last = divmod(kept, b)
    s, t = _slot_sizes(b, c), _slot_sizes(last, c)
    lengths = full * s + t
    starts = np.concatenate([[0], np.cumsum(lengths)])
    batch_of = np.empty(kept, np.int64)  # plan batch and position within it, per stream slot
    place = np.empty(kept, np.int64)
    slot_at = np.concatenate([[0], np.cumsum(s)])
    tail_at = np.concatenate([[0], np.cumsum(t)])
    for j in range(c):
        lane = stream[starts[j]:starts[j + 1]]
        lab = labels[lane]
        run = np.concatenate([[0], np.flatnonzero(lab[1:] != lab[:-1]) + 1, [len(lane)]])
        whole = np.zeros(len(lane), bool)
        for a, e in zip(run[:-1], run[1:]):
            whole[a:a + (e - a) // s[j] * s[j]] = True
        stream[starts[j]:starts[j + 1]] = np.concatenate([lane[whole], lane[~whole]])
        p = np.arange(len(lane))
        in_full = p < full * s[j]
        batch_of[starts[j]:starts[j + 1]] = np.where(in_full, p // s[j], full)
        place[starts[j]:starts[j + 1]] = np.where(in_full, slot_at[j] + p % s[j],
                                                  tail_at[j] + p - full * s[j])
    visit = np.empty(full + 1, np.int64)
    visit[_rng.permutation(full, _rng.derive_seed(seed, 2))] = np.arange(full)
    visit[full] = full
    order = np.empty(n, np.int64)
    order[visit[batch_of] * b + place] = stream
    order[kept:] = dropped
    return order


def trimmed_order(labels, size: int, *, seed: int | None = None, drop: int = 0) -> np.ndarray:
    """Chunks of exactly ``size`` items from parts of about ``size``, as B3's authors cut them.

    The parts, largest first (ties: the one with the smallest item first), give their items
    beyond ``size`` (their highest-numbered) to a pool; a part under ``size`` takes the pool's
    last items. The chunks follow in the order of their smallest items (``seed=None``, the
    authors' file order) or a random order (``seed``); then the pool (``N mod size`` items for
    ``N // size`` parts; at most that many parts). Returns an int64 ``[N]`` order: chunk i is
    ``order[i * size:(i + 1) * size]``, the short rest last. ``drop`` (``drop_last``; needs
    ``seed``): that many items, a random choice (:func:`dropped_last`), are left out before
    the trimming and placed at the end; the other ``N - drop`` items are trimmed as above
    (at most ``(N - drop) // size`` parts among them).

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import trimmed_order
        >>> trimmed_order(np.array([0, 0, 0, 0, 1, 1, 0]), 3).tolist()  # parts of 5 and 2
        [0, 1, 2, 4, 5, 3, 6]
    """
    labels, size = np.asarray(labels, np.int64), check_int(size, "size", low=1)
    drop = check_int(drop, "drop", low=0, high=labels.shape[0])
    if drop and seed is None:
        raise ValueError(f"drop={drop} leaves out a seeded random choice of the items; pass "
                         "seed= (a new one per epoch) or drop=0")
    every = dropped_last(np.arange(labels.shape[0], dtype=np.int64), drop,
                         _rng.derive_seed(seed, 3) if drop else 0)
    kept, dropped = every[:len(every) - drop], every[len(every) - drop:]  # kept: ascending
    labels = labels[kept] if drop else labels
    n, counts = labels.shape[0], np.bincount(labels, minlength=1)
    members, start = np.argsort(labels, kind="stable"), np.concatenate([[0], np.cumsum(counts)])
    if len(parts := np.flatnonzero(counts)) > n // size:
        kept_n = f"N - drop = {n}" if drop else f"N={n}"
        fill = "(N - drop) // size" if drop else "N // size"
        raise ValueError(f"labels hold {len(parts)} parts but {kept_n} items fill only {fill} "
                         f"= {n // size} chunks of size={size}; pass at most {fill} parts")
    chunks, pool = [], []
    for p in parts[np.lexsort((members[start[parts]], -counts[parts]))]:
        items = members[start[p]:start[p + 1]].tolist()
        pool += items[size:][::-1]  # the authors' list.pop() from the end
        take = len(pool) - min(max(0, size - len(items)), len(pool))
        chunks.append(items[:size] + pool[take:][::-1])
        del pool[take:]
    chunks.sort(key=min)
    visit = range(len(chunks)) if seed is None else _rng.permutation(len(chunks), seed)
    order = np.array([i for c in visit for i in chunks[c]] + pool, np.int64)
    return np.concatenate([kept[order], dropped]) if drop else order


def groups_per_batch(order, labels, batch_size: int, kept: int | None = None) -> np.ndarray:
    """Distinct groups (``labels``) in each batch of ``order`` (cut every ``batch_size``,
    ``order[:kept]``).

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.communities import groups_per_batch
        >>> groups_per_batch(np.arange(6), np.array([0, 0, 1, 1, 1, 2]), 3).tolist()
        [2, 2]
    """
    order = np.asarray(order, np.int64)[:kept]
    labels = np.asarray(labels, np.int64)
    width = int(labels.max()) + 1
    batch = np.arange(len(order)) // batch_size
    pairs = np.unique(batch * width + labels[order])
    return np.bincount(pairs // width, minlength=-(-len(order) // batch_size))
