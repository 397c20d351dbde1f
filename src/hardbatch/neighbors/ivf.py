"""An inverted-file (IVF) search in torch: k-means lists, each compared with the lists it probes.

Spherical k-means (:mod:`hardbatch.neighbors.kmeans`) puts the columns ``y`` (and the rows
``x``) in ``nlist`` inverted lists; list c probes the ``nprobe`` lists whose centroids are
nearest its own (itself first). :func:`inverted_lists` builds them; :func:`probed_blocks`
hands out, list by list, the rows of a list and the columns of the lists it probes: one dense
product per list compares them, about ``nprobe / nlist`` of the exact cost (N = 100k,
d = 768: ~10 s instead of ~4 min on 2 cores; docs/benchmarks.md). With ``nprobe = nlist``
every row meets every column: the exact search. The lists are independent units, so ranks
can share them. Its caller: GCBS's pair search ``method="ivf"``
(:class:`hardbatch.batching.gcbs.pairs.PairSearchLayout`); the faiss and hnswlib indexes are in
:mod:`hardbatch.neighbors.index_search`.

Tensors in, tensors out, on the inputs' device; no logging.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import torch

from .kmeans import nearest_centroid, spherical_kmeans

__all__ = ["InvertedLists", "inverted_lists", "probed_blocks"]


class InvertedLists(NamedTuple):
    """The lists of an IVF search: ``probe`` int64 [nlist, nprobe] (CPU), the lists each list
    probes; the columns and the rows, each as (ids sorted by list, int64 [nlist + 1] CPU
    starts of the lists in that order).

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.ivf import inverted_lists
        >>> u = torch.nn.functional.normalize(torch.eye(2)[torch.arange(6) % 2] + 0.1, dim=1)
        >>> lists = inverted_lists(u, u, nlist=2, nprobe=1, seed=0)
        >>> sorted(lists.col_order[lists.col_start[c]:lists.col_start[c + 1]].tolist()
        ...        for c in range(2))  # the items of each list
        [[0, 2, 4], [1, 3, 5]]
    """

    probe: torch.Tensor
    col_order: torch.Tensor
    col_start: torch.Tensor
    row_order: torch.Tensor
    row_start: torch.Tensor


def _lists(labels: torch.Tensor, nlist: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(labels, stable=True)
    start = torch.zeros(nlist + 1, dtype=torch.int64)
    start[1:] = torch.bincount(labels, minlength=nlist).cumsum(0).cpu()
    return order, start


def inverted_lists(x: torch.Tensor, y: torch.Tensor, nlist: int, nprobe: int,
                   seed: int) -> InvertedLists:
    """Spherical k-means lists of the columns ``y`` [N, d] (centroids from a seeded sample of
    ``y``), the rows ``x`` [N, d] in the list of their nearest centroid (``y``'s own lists when
    ``x is y``), each list probing its ``nprobe`` nearest lists (clipped to [1, nlist]).

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.ivf import inverted_lists
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> u = torch.nn.functional.normalize(x, dim=1)
        >>> lists = inverted_lists(u, u, nlist=4, nprobe=2, seed=0)
        >>> lists.probe.shape, lists.col_start.tolist()  # 4 lists of 10 items
        (torch.Size([4, 2]), [0, 10, 20, 30, 40])
        >>> bool((lists.probe[:, 0] == torch.arange(4)).all())  # each list probes itself first
        True
    """
    nprobe = int(min(max(1, nprobe), nlist))
    cent = spherical_kmeans(y, nlist, seed)
    col_list = nearest_centroid(y, cent)
    row_list = col_list if x is y else nearest_centroid(x, cent)
    probe = (cent @ cent.T).topk(nprobe, dim=1).indices.cpu()
    return InvertedLists(probe, *_lists(col_list, nlist), *_lists(row_list, nlist))


def probed_blocks(lists: InvertedLists, start: int, end: int
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each list c in [start, end): (rows of list c, columns of the lists it probes,
    ``self_col``: each row's position among those columns, -1 where its own item is not one).

    Positions index the block ``x[rows] @ y[cols].T``; ids are those of ``x`` and ``y``. An
    empty list gives three empty tensors.

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.ivf import inverted_lists, probed_blocks
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> u = torch.nn.functional.normalize(x, dim=1)
        >>> lists = inverted_lists(u, u, nlist=4, nprobe=4, seed=0)  # every list probed
        >>> blocks = list(probed_blocks(lists, 0, 4))
        >>> sorted(torch.cat([rows for rows, _, _ in blocks]).tolist()) == list(range(40))
        True
        >>> all(sorted(cols.tolist()) == list(range(40)) for _, cols, _ in blocks)
        True
        >>> rows, cols, self_col = blocks[0]
        >>> bool((cols[self_col] == rows).all())
        True
    """
    probe, col_order, col_start, row_order, row_start = lists
    n = max(len(col_order), len(row_order))
    where = torch.full((n,), -1, dtype=torch.int64, device=col_order.device)
    for c in range(start, end):
        r_ids = row_order[row_start[c]:row_start[c + 1]]
        if r_ids.numel() == 0:
            yield r_ids, r_ids, r_ids.cpu()
            continue
        c_ids = torch.cat([col_order[col_start[p]:col_start[p + 1]] for p in probe[c].tolist()])
        where[c_ids] = torch.arange(len(c_ids), device=where.device)
        self_col = where[r_ids].cpu()
        where[c_ids] = -1
        yield r_ids, c_ids, self_col
