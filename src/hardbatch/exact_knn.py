"""Exact k-nearest-neighbour search by row blocks of inner products.

The one implementation behind ``knn_graph(method="exact")`` (:class:`hardbatch.graph.KNNGraphPlan`)
and the exact parts of :mod:`hardbatch.neighbor_index` (the recall truth of a tuned index, the
rows it leaves short, its exact fallback). Arrays in, arrays out; no logging.
"""

from __future__ import annotations

import torch

from ._device import matmul_fp32

__all__ = ["exact_neighbors"]


def exact_neighbors(x: torch.Tensor, rows: torch.Tensor, k: int,
                    block_rows: int = 1024) -> torch.Tensor:
    """The ``k`` items of ``x`` with the largest inner product with each item of ``rows``,
    the item itself excluded.

    Args:
        x: ``[N, d]`` embeddings (unit rows for cosine).
        rows: ``[R]`` int64 item ids (on ``x``'s device).
        k: neighbours per row, ``k < N``.
        block_rows: rows per product (memory: ``block_rows x N`` similarities).

    Returns:
        ``[R, k]`` int64 on ``x``'s device, by decreasing similarity (ties: torch.topk's order).

    Example:
        >>> import torch
        >>> from hardbatch.exact_knn import exact_neighbors
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, -0.5]])
        >>> exact_neighbors(x, torch.tensor([0, 2]), 2).tolist()
        [[1, 2], [1, 0]]
    """
    out = torch.empty((len(rows), k), dtype=torch.int64, device=x.device)
    for s in range(0, len(rows), block_rows):
        r = rows[s:s + block_rows]
        sims = matmul_fp32(x[r], x.T)
        sims[torch.arange(len(r), device=x.device), r] = -torch.inf
        out[s:s + len(r)] = sims.topk(k, dim=1, sorted=True).indices
    return out
