"""Keys computed from data rather than given: copies found in the values or the embeddings.

* :func:`shared_value_keys`: rows of several values (the texts of a row) that share any value,
  transitively, get one key (an equivalence; for sentence-transformers' "no value twice in a
  batch", which is pairwise, use key sets: :mod:`hardbatch.keys.encode`);
* :func:`near_duplicate_keys`: near-copies in an embedding (connected components of the pairs
  above a cosine threshold, found by GCBS's pair search) get one key;
* :func:`same_key_graph`: the graph joining the items that share a key id, for the pair
  separation of community batches (:func:`hardbatch.batching.pair_separation.separate_pairs`).

Pass the keys as any sampler's ``duplicate_keys=``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components

from .._logging import get_logger
from .._validation import as_embeddings, check_choice, check_real
from ..batching.gcbs import thresholded_pairs

__all__ = ["near_duplicate_keys", "same_key_graph", "shared_value_keys"]

_log = get_logger("keys")


def near_duplicate_keys(embeddings, threshold: float = 0.9, *,
                        method: str = "exact", nlist: int | None = None, nprobe: int = 8,
                        seed: int = 0, device=None) -> np.ndarray:
    """Keys that group near-duplicates: items joined by a chain of pairs with cosine above
    ``threshold`` get the same key (the connected components of the pair graph).

    Pass the result as ``duplicate_keys=`` to any sampler so that near-copies (paraphrases,
    re-crops, boilerplate with one word changed) never share a batch, best computed in a fixed,
    strong embedding. Grouping is transitive: a chain a~b~c joins a and c even when their own
    cosine is below the threshold, so a low threshold can join large groups (a sampler then
    raises its ``ValueError`` when no batch plan can keep them apart); the log reports the
    largest group. The threshold means what it means in
    :func:`hardbatch.metrics.batch_near_duplicate_rate` (default 0.9 there and here).

    Args:
        embeddings: ``[N, d]`` array or tensor (rows are L2-normalised here).
        threshold: cosine in ``[-1, 1)``; pairs with ``cos > threshold`` are near-duplicates.
        method, nlist, nprobe, seed, device: the pair search of
            :func:`hardbatch.batching.gcbs.thresholded_pairs` (``"exact"``: blocked dense
            products, O(N^2 d); ``"ivf"``: inverted lists, approximate, for large N).

    Returns:
        int64 ``[N]``: the smallest item index of each item's group (an item with no
        near-duplicate is its own key).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8))
        >>> x[7] = x[3] + 0.01  # a near-copy of item 3
        >>> keys = hb.near_duplicate_keys(x, threshold=0.99)
        >>> int(keys[7]), int((keys != np.arange(40)).sum())
        (3, 1)
    """
    x = as_embeddings(embeddings, "embeddings", normalize=True)
    t = check_real(threshold, "threshold", "a cosine in [-1, 1)")
    if not -1.0 <= t < 1.0:
        raise ValueError(f"threshold={threshold} must lie in [-1, 1): pairs with cosine above it "
                         "are near-duplicates (e.g. 0.9; no cosine exceeds 1)")
    check_choice("method", method, ("exact", "ivf", "faiss"))
    n = x.shape[0]
    rows, cols = thresholded_pairs(x, x, t, method, nlist=nlist, nprobe=nprobe, seed=seed,
                                   device=device)
    graph = coo_matrix((np.ones(len(rows), np.int8), (rows, cols)), shape=(n, n))
    _, labels = connected_components(graph, directed=True, connection="weak")
    first = np.full(labels.max() + 1, n, np.int64)
    np.minimum.at(first, labels, np.arange(n, dtype=np.int64))
    keys = first[labels]
    sizes = np.bincount(keys, minlength=n)
    grouped = int((sizes[keys] > 1).sum())
    _log.info("near_duplicate_keys: %d of %d items in %d groups of near-duplicates (cosine > "
                "%g), the largest %d items", grouped, n, int((sizes > 1).sum()), t,
                int(sizes.max()))
    return keys


def shared_value_keys(rows: Iterable[Sequence]) -> list[int]:
    """Keys for rows of values: rows sharing any value (transitively) get the same key (the
    equivalence rule; for "no value twice in a batch" use key sets,
    :func:`~hardbatch.keys.encode.key_sets`).

    ``rows``: for each item, its values (e.g. the texts of all columns of a row). Returns one
    int per row, the smallest row index of its group (union-find over equal values).

    Example:
        >>> from hardbatch.keys import shared_value_keys
        >>> shared_value_keys([("a", "b"), ("c", "d"), ("b", "e"), ("e", "f")])
        [0, 1, 0, 0]
    """
    parent: list[int] = []
    owner: dict = {}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, values in enumerate(rows):
        parent.append(i)
        for value in values:
            j = owner.setdefault(value, i)
            if j != i:
                a, b = root(i), root(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(parent))]


def same_key_graph(ids) -> csr_matrix:
    """The symmetric 0/1 graph joining the items that share a key id (``-1``: a key of its
    own), e.g. ``DuplicateKeys.ids``, to keep them apart with
    :func:`~hardbatch.batching.pair_separation.separate_pairs`.

    Example:
        >>> import numpy as np
        >>> from hardbatch.keys import same_key_graph
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
