"""Groups of items for batches: spherical k-means clusters (TAS-B) and graph communities (B3).

Arrays in, arrays out; the samplers :class:`~hardbatch.samplers.ClusterBatchSampler` and
:class:`~hardbatch.samplers.CommunityBatchSampler` compose them:

* :func:`spherical_clusters`: item labels of spherical k-means, with faiss
  (``faiss.Kmeans(spherical=True)``) when installed, else :func:`hardbatch.gcbs.spherical_kmeans`;
  above 256 clusters in two levels (coarse cells, then clusters within each cell);
* :func:`rank_graph`: the symmetric sparse graph of the kNN ranks ``first .. last - 1``;
* :func:`community_labels`: B3's partition step: the graph of ranks ``skip + 1 .. skip +
  window``, cut into ``parts`` balanced communities by METIS (``pymetis``), or, without the
  extra, spherical k-means clusters of the embeddings (``partitioner="kmeans"``);
* :func:`trimmed_order`: B3's authors' batches: parts trimmed and filled to exactly B items;
* :func:`group_order`: one epoch's partition into batches of whole groups: groups in random
  order, each batch drawing from ``groups_per_batch`` groups; a group that runs out mid-batch is
  continued by the next group of the order (the fill);
* :func:`separate_pairs`: moves one item of every pair of a sparse graph (B3's skipped top
  ranks) that shares a batch to another batch; :func:`pairs_in_batches` counts such pairs.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import torch
from numba import njit
from scipy.sparse import csr_matrix

from . import _rng
from ._validation import check_choice, check_int
from .gcbs import spherical_kmeans

__all__ = ["community_labels", "group_order", "groups_per_batch", "pairs_in_batches",
           "rank_graph", "require_metis", "same_key_graph", "separate_pairs",
           "spherical_clusters", "trimmed_order"]

FLAT_CLUSTERS = 256  # above: two-level k-means (coarse cells of about sqrt(k) clusters each)
KMEANS_BACKENDS = ("auto", "faiss", "torch")
PARTITIONERS = ("metis", "kmeans")
EDGES = ("union", "mutual")  # ours; B3's authors' (spectral_clustering4_ibn.py)
METIS_EXTRA = "pip install 'hardbatch[metis]'"


def _faiss():
    try:
        return importlib.import_module("faiss")
    except ImportError:
        return None


def _flat(x: torch.Tensor, k: int, seed: int, iters: int, backend: str,
          one_thread: bool = False) -> np.ndarray:
    """Labels of one spherical k-means with ``k <= len(x)`` clusters; ``one_thread``: faiss in
    this thread only (small problems: OpenMP's threads cost 40x on a loaded 2-core CPU)."""
    if k == 1:
        return np.zeros(x.shape[0], np.int64)
    faiss = _faiss() if backend != "torch" else None
    if faiss is not None:
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        threads = faiss.omp_get_max_threads()
        if one_thread:
            faiss.omp_set_num_threads(1)  # OpenMP: the calling thread's setting
        try:
            km = faiss.Kmeans(rows.shape[1], k, niter=iters, spherical=True,
                              seed=seed & 0x7FFFFFFF, max_points_per_centroid=64,
                              min_points_per_centroid=1, verbose=False)
            km.train(rows)
            return km.index.search(rows, 1)[1][:, 0].astype(np.int64)
        finally:
            faiss.omp_set_num_threads(threads)
    cent = spherical_kmeans(x, k, seed, iters)
    step = max(1, (1 << 22) // k)
    return torch.cat([(x[i:i + step].float() @ cent.T).argmax(1)
                      for i in range(0, x.shape[0], step)]).cpu().numpy().astype(np.int64)


def _apportion(counts: np.ndarray, k: int) -> np.ndarray:
    """``k`` clusters shared among cells of ``counts`` items: about proportional, each cell
    with items at least one and at most its count (largest remainders)."""
    total = int(counts.sum())
    quota = counts * (k / total)
    share = np.minimum(counts, np.maximum(np.floor(quota), counts > 0)).astype(np.int64)
    rest = quota - share
    while share.sum() != k:  # a few rounds: at most one cluster per cell each
        more = share.sum() < k
        room = (share < counts) if more else (share > 1)
        pick = np.flatnonzero(room)[np.argsort(-rest[room] if more else rest[room],
                                               kind="stable")]
        pick = pick[:abs(k - int(share.sum()))]
        share[pick] += 1 if more else -1
        rest[pick] -= 1 if more else -1
    return share


def spherical_clusters(embeddings, k: int, *, seed: int = 0, iters: int = 10,
                       backend: str = "auto") -> np.ndarray:
    """Spherical k-means labels of the rows of ``embeddings`` (cosine; rows normalised here).

    ``backend``: ``"faiss"`` (``faiss.Kmeans(spherical=True)``, trained on at most 64 rows per
    centroid), ``"torch"`` (:func:`hardbatch.gcbs.spherical_kmeans`, the same sample size) or
    ``"auto"`` (faiss when installed; in the calling thread alone for small problems). Up to
    256 clusters one k-means; beyond, ``ceil(sqrt(k))`` coarse cells, then each cell's share of
    the ``k`` clusters (proportional to its items) within it: ``O(N d sqrt(k))`` per iteration,
    not ``O(N d k)``. Deterministic for a seed and backend; a cluster may end up empty.

    Returns:
        int64 ``[N]`` labels in ``[0, k)``.

    Example:
        >>> import torch
        >>> from hardbatch.communities import spherical_clusters
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 groups
        >>> labels = spherical_clusters(x, 4, backend="torch")
        >>> labels.shape, len(set(zip(labels.tolist(), (torch.arange(40) % 4).tolist())))
        ((40,), 4)
    """
    check_choice("backend", backend, KMEANS_BACKENDS)
    if backend == "faiss" and _faiss() is None:
        raise ImportError("backend='faiss' needs faiss; pip install 'hardbatch[faiss]' or use "
                          "backend='torch'")
    x = torch.nn.functional.normalize(torch.as_tensor(embeddings).float(), dim=1)
    n = x.shape[0]
    k = check_int(k, "k", low=1, high=n)

    def small(k: int) -> bool:  # one k-means iteration of at most 2^31 multiply-adds
        return min(n, 64 * k) * k * x.shape[1] < 2**31

    if k <= FLAT_CLUSTERS:
        return _flat(x, k, seed, iters, backend, small(k))
    cells = math.ceil(math.sqrt(k))
    coarse = _flat(x, cells, _rng.derive_seed(seed, 1), iters, backend, small(cells))
    counts = np.bincount(coarse, minlength=cells)
    share = _apportion(counts, k)
    members = np.argsort(coarse, kind="stable")
    labels = np.empty(n, np.int64)
    start, base = 0, 0
    for cell in range(cells):
        rows = members[start:start + counts[cell]]
        start += counts[cell]
        if len(rows):
            sub = _flat(x[torch.from_numpy(rows)], int(share[cell]),
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
        >>> from hardbatch.communities import rank_graph
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


def same_key_graph(ids) -> csr_matrix:
    """The symmetric 0/1 graph joining the items that share a key id (``-1``: a key of its
    own), e.g. ``DuplicateKeys.ids``, to keep them apart with :func:`separate_pairs`.

    Example:
        >>> import numpy as np
        >>> from hardbatch.communities import same_key_graph
        >>> g = same_key_graph(np.array([0, -1, 0, 1, 1, 1]))
        >>> g.nnz, sorted(g[3].indices.tolist())
        (8, [4, 5])
    """
    ids = np.asarray(ids, np.int64)
    n, keyed = ids.shape[0], np.flatnonzero(ids >= 0)
    member = csr_matrix((np.ones(len(keyed), np.int32), (keyed, ids[keyed])),
                        shape=(n, int(ids.max(initial=-1)) + 1))  # item x key incidence
    g = (member @ member.T).tocoo()
    off = g.row != g.col
    g = csr_matrix((np.ones(int(off.sum()), np.int8), (g.row[off], g.col[off])), shape=(n, n))
    g.sort_indices()
    return g


def require_metis():
    """The ``pymetis`` module, or an ``ImportError`` naming the extra and the fallback.

    Example:
        >>> from hardbatch.communities import require_metis
        >>> require_metis().__name__
        'pymetis'
    """
    try:
        return importlib.import_module("pymetis")
    except ImportError:
        raise ImportError(f"partitioner='metis' needs pymetis; {METIS_EXTRA}, or pass "
                          "partitioner='kmeans' (spherical k-means of the embeddings, no "
                          "extra needed)") from None


def community_labels(neighbors, parts: int, *, skip: int, window: int,
                     partitioner: str = "metis", seed: int = 0, embeddings=None,
                     imbalance: float = 1.03, edges: str = "union") -> np.ndarray:
    """B3's partition step: communities of the graph of kNN ranks ``skip + 1 .. skip + window``.

    ``neighbors`` is an ``[N, >= skip + window]`` kNN table (rank 0 the nearest, self
    excluded), as :func:`hardbatch.knn_graph` returns. The ranks make a sparse graph
    (:func:`rank_graph`: ``edges="union"`` or B3's authors' ``"mutual"``), cut in ``parts``:

    * ``"metis"`` (B3's): METIS k-way (``pymetis``; ``pip install 'hardbatch[metis]'``) with
      the balance tolerance ``imbalance`` (METIS's ``ufactor``: no community above
      ``imbalance * N / parts`` items, up to METIS's rounding);
    * ``"kmeans"``: no extra needed: :func:`spherical_clusters` of ``embeddings`` (the graph is
      not used; clusters are not balanced, the batches' fill absorbs that).

    Returns:
        int64 ``[N]`` community labels in ``[0, parts)``.

    Example:
        >>> import numpy as np, torch
        >>> import hardbatch as hb
        >>> from hardbatch.communities import community_labels
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator()
        ...                                   .manual_seed(0)), dim=1)
        >>> nbrs = hb.knn_graph(x, 8).numpy()
        >>> labels = community_labels(nbrs, 4, skip=2, window=6)
        >>> labels.shape, len(np.unique(labels)), int(np.bincount(labels).max()) <= 12
        ((40,), 4, True)
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
    metis = require_metis()
    if parts == 1:
        return np.zeros(n, np.int64)
    g = rank_graph(nbrs, skip, skip + window, mutual=edges == "mutual")
    options = metis.Options(seed=int(seed & 0x7FFFFFFF),
                            ufactor=max(1, round((float(imbalance) - 1.0) * 1000)))
    ptr, adj = g.indptr.astype(np.int64), g.indices.astype(np.int64)
    if hasattr(metis, "CSRAdjacency"):  # pymetis >= 2025.2 (xadj= / adjncy= deprecated there)
        _, labels = metis.part_graph(parts, metis.CSRAdjacency(ptr, adj), options=options)
    else:
        _, labels = metis.part_graph(parts, xadj=ptr, adjncy=adj, options=options)
    return np.asarray(labels, np.int64)


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
    items (a random choice) are left out and placed at the end (``drop_last``).

    Returns:
        int64 ``[N]``: a permutation; batch i is ``order[i * B:(i + 1) * B]`` of the first
        ``N - drop``.

    Example:
        >>> import numpy as np
        >>> from hardbatch.communities import group_order, groups_per_batch
        >>> labels = np.arange(40) // 8  # 5 groups of 8
        >>> order = group_order(labels, 8, seed=0)
        >>> sorted(order.tolist()) == list(range(40)), groups_per_batch(order, labels, 8).tolist()
        (True, [1, 1, 1, 1, 1])
    """
    labels = np.asarray(labels, np.int64)
    n = labels.shape[0]
    b, c = check_int(batch_size, "batch_size", low=1), check_int(groups_per_batch,
                                                                 "groups_per_batch", low=1)
    keep = np.ones(n, bool)
    if drop:
        keep[_rng.permutation(n, _rng.derive_seed(seed, 3))[:drop]] = False
    items = np.flatnonzero(keep)
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
    order[kept:] = np.flatnonzero(~keep)
    return order


def trimmed_order(labels, size: int, *, seed: int | None = None) -> np.ndarray:
    """Chunks of exactly ``size`` items from parts of about ``size``, as B3's authors cut them.

    The parts, largest first (ties: the one with the smallest item first), give their items
    beyond ``size`` (their highest-numbered) to a pool; a part under ``size`` takes the pool's
    last items. The chunks follow in the order of their smallest items (``seed=None``, the
    authors' file order) or a random order (``seed``); then the pool (``N mod size`` items for
    ``N // size`` parts; at most that many parts). Returns an int64 ``[N]`` order: chunk i is
    ``order[i * size:(i + 1) * size]``, the short rest last.

    Example:
        >>> import numpy as np
        >>> from hardbatch.communities import trimmed_order
        >>> trimmed_order(np.array([0, 0, 0, 0, 1, 1, 0]), 3).tolist()  # parts of 5 and 2
        [0, 1, 2, 4, 5, 3, 6]
    """
    labels, size = np.asarray(labels, np.int64), check_int(size, "size", low=1)
    n, counts = labels.shape[0], np.bincount(labels, minlength=1)
    members, start = np.argsort(labels, kind="stable"), np.concatenate([[0], np.cumsum(counts)])
    if len(parts := np.flatnonzero(counts)) > n // size:
        raise ValueError(f"labels hold {len(parts)} parts but N={n} items fill only N // size = "
                         f"{n // size} chunks of size={size}; pass at most N // size parts")
    chunks, pool = [], []
    for p in parts[np.lexsort((members[start[parts]], -counts[parts]))]:
        items = members[start[p]:start[p + 1]].tolist()
        pool += items[size:][::-1]  # the authors' list.pop() from the end
        take = len(pool) - min(max(0, size - len(items)), len(pool))
        chunks.append(items[:size] + pool[take:][::-1])
        del pool[take:]
    chunks.sort(key=min)
    visit = range(len(chunks)) if seed is None else _rng.permutation(len(chunks), seed)
    return np.array([i for c in visit for i in chunks[c]] + pool, np.int64)


def groups_per_batch(order, labels, batch_size: int, kept: int | None = None) -> np.ndarray:
    """Distinct groups (``labels``) in each batch of ``order`` (cut every ``batch_size``,
    ``order[:kept]``).

    Example:
        >>> import numpy as np
        >>> from hardbatch.communities import groups_per_batch
        >>> groups_per_batch(np.arange(6), np.array([0, 0, 1, 1, 1, 2]), 3).tolist()
        [2, 2]
    """
    order = np.asarray(order, np.int64)[:kept]
    labels = np.asarray(labels, np.int64)
    width = int(labels.max()) + 1
    batch = np.arange(len(order)) // batch_size
    pairs = np.unique(batch * width + labels[order])
    return np.bincount(pairs // width, minlength=-(-len(order) // batch_size))


@njit(cache=True)
def _partner_in(i, batch, indptr, indices, pos_of, kept, b, skip_item):
    for e in range(indptr[i], indptr[i + 1]):
        j = indices[e]
        if j != skip_item and pos_of[j] < kept and pos_of[j] // b == batch:
            return True
    return False


@njit(cache=True)
def _separate(order, kept, b, indptr, indices, near, x):
    n = order.shape[0]
    nb = (kept + b - 1) // b
    pos_of = np.empty(n, np.int64)
    for p in range(n):
        pos_of[order[p]] = p
    moved, forced = 0, 0
    for p in range(kept):
        i = order[p]
        home = p // b
        if not _partner_in(i, home, indptr, indices, pos_of, kept, b, -1):
            continue
        done = False
        for r in range(near.shape[1] + min(nb, 64)):  # batches of its near items, then the next
            if r < near.shape[1]:
                q = pos_of[near[i, r]]
                if q >= kept:
                    continue
                other = q // b
            else:
                other = (home + 1 + r - near.shape[1]) % nb
            if other == home or _partner_in(i, other, indptr, indices, pos_of, kept, b, -1):
                continue
            best, best_sim = -1, -np.inf
            for q in range(other * b, min(kept, other * b + b)):
                u = order[q]
                if _partner_in(u, home, indptr, indices, pos_of, kept, b, i):
                    continue
                sim = 0.0
                for d in range(x.shape[1]):
                    sim += x[u, d] * x[i, d]
                if sim > best_sim:
                    best, best_sim = q, sim
            if best >= 0:
                u = order[best]
                order[p], order[best] = u, i
                pos_of[u], pos_of[i] = p, best
                moved += 1
                done = True
                break
        if not done:
            forced += 1
    return moved, forced


def separate_pairs(order, kept: int, batch_size: int, pairs: csr_matrix, embeddings,
                   near=None) -> tuple[np.ndarray, int, int]:
    """``order`` with no edge of ``pairs`` inside a batch where a swap can avoid it.

    An item whose partner (an edge of the symmetric sparse graph ``pairs``, e.g. the skipped
    top-p ranks of :func:`rank_graph`) sits in its batch swaps places with an item u of another
    batch: the batches of its ``near`` items first (e.g. its window neighbours, where it stays
    hard), then the following batches; u is the item of that batch most similar to it
    (``embeddings``, unit rows) among those with no partner in its batch, and it has no partner
    in u's batch, so a swap never creates a pair. Deterministic.

    Returns:
        (the repaired order, swaps made, items whose pair could not be separated: forced).

    Example:
        >>> import numpy as np
        >>> from hardbatch.communities import pairs_in_batches, rank_graph, separate_pairs
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((40, 8)).astype(np.float32)
        >>> x /= np.linalg.norm(x, axis=1, keepdims=True)
        >>> nbrs = np.argsort(-(x @ x.T), axis=1)[:, 1:4]  # 3 nearest, self excluded
        >>> pairs = rank_graph(nbrs, 0, 1)  # every item and its nearest
        >>> order = np.argsort(nbrs[:, 0], kind="stable")  # nearest pairs close together
        >>> fixed, swaps, forced = separate_pairs(order.copy(), 40, 8, pairs, x, nbrs)
        >>> pairs_in_batches(fixed, 40, 8, pairs), forced, sorted(fixed) == list(range(40))
        (0, 0, True)
    """
    order = np.ascontiguousarray(order, np.int64)
    x = np.ascontiguousarray(torch.as_tensor(embeddings).detach().cpu().float().numpy())
    near = np.zeros((len(order), 0), np.int64) if near is None else \
        np.ascontiguousarray(near, np.int64)
    moved, forced = _separate(order, kept, batch_size, pairs.indptr.astype(np.int64),
                              pairs.indices.astype(np.int64), near, x)
    return order, int(moved), int(forced)


def pairs_in_batches(order, kept: int, batch_size: int, pairs: csr_matrix) -> int:
    """Edges of the symmetric graph ``pairs`` whose two items share a batch of ``order``.

    Example:
        >>> import numpy as np
        >>> from hardbatch.communities import pairs_in_batches, rank_graph
        >>> pairs = rank_graph(np.array([[1], [0], [3], [2]]), 0, 1)  # 0-1 and 2-3
        >>> pairs_in_batches(np.array([0, 2, 1, 3]), 4, 2, pairs)  # batches {0, 2}, {1, 3}
        0
    """
    order = np.asarray(order, np.int64)
    batch = np.full(pairs.shape[0], -1, np.int64)
    batch[order[:kept]] = np.arange(kept) // batch_size
    g = pairs.tocoo()
    same = (batch[g.row] >= 0) & (batch[g.row] == batch[g.col]) & (g.row < g.col)
    return int(same.sum())
