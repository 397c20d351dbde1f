"""Exact k-nearest-neighbour search by row blocks of inner products.

The one implementation behind ``knn_graph(method="exact")`` (:class:`hardbatch.neighbors.knn_graph.KNNGraphLayout`)
and the exact parts of :mod:`hardbatch.neighbors.index_search` (the recall truth of a tuned index, the
rows it leaves short, its exact fallback); :func:`item_neighbors` is the same search for one item
by one matrix-vector product (the kNN sampler's anchor, once per batch; a vector product's bits
may differ from those of a block's row, so it is a function of its own). Arrays in, arrays out;
no logging.

Two selections of the ``k`` largest similarities of each row of a block, the same neighbours:

- ``"topk"``: one ``torch.topk`` over the whole row (``N`` columns). The CPU's choice; on a GPU
  its radix selection over ``N`` costs several times the products themselves.
- ``"grouped"``: the row's columns in groups of ``C`` (:func:`group_size`); the maximum of each
  group (one streaming pass); the ``k`` groups of largest maxima; the ``k`` largest among their
  ``k * C`` columns. The ``k``-th largest group maximum ``b`` is at most the row's ``k``-th
  largest similarity ``t`` (``k`` distinct columns reach ``b``), so every neighbour lies in a
  group whose maximum reaches ``b``: when exactly ``k`` groups reach ``b`` (no tie there) and
  no candidate left out equals ``t``, the answer is exact. A row where either check fails is
  redone once the block is done, from the same products (recomputed by the same call, so the
  same bits), over every group that reaches ``b``, by a stable sort. The checks stay on the
  device: no synchronisation per block, one per call.

Ties: ``"grouped"`` orders equal similarities by increasing column (the order of a stable sort
of the row). ``"topk"`` keeps ``torch.topk``'s order: on CUDA for ``32 < k <= 4096`` the same
(its selection gathers in column order and its sort of the ``k`` is stable); on the CPU an
order the kernel does not define (a heap), so on rows with equal similarities inside the top
``k`` or at its ``k``-th place the CPU may list other indices among equal ones (the same
similarities at each place).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from .._device import matmul_fp32

__all__ = ["exact_neighbors", "group_size", "grouped_topk", "item_neighbors"]

Selection = Literal["auto", "topk", "grouped"]
_CANDIDATES = 1 << 22  # candidate columns sorted at once by a redo (bounds its memory)


def exact_neighbors(x: torch.Tensor, rows: torch.Tensor, k: int, block_rows: int = 1024,
                    selection: Selection = "auto", group: int | None = None) -> torch.Tensor:
    """The ``k`` items of ``x`` with the largest inner product with each item of ``rows``,
    the item itself excluded.

    Args:
        x: ``[N, d]`` embeddings (unit rows for cosine).
        rows: ``[R]`` int64 item ids (on ``x``'s device).
        k: neighbours per row, ``k < N``.
        block_rows: rows per product (memory: ``block_rows x N`` similarities).
        selection: ``"topk"``, ``"grouped"`` (module docstring) or ``"auto"``: ``"grouped"`` on
            CUDA, ``"topk"`` elsewhere.
        group: columns per group of ``"grouped"`` (default :func:`group_size`).

    Returns:
        ``[R, k]`` int64 on ``x``'s device, by decreasing similarity (ties: module docstring).

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.exact_search import exact_neighbors
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, -0.5]])
        >>> exact_neighbors(x, torch.tensor([0, 2]), 2).tolist()
        [[1, 2], [1, 0]]
        >>> exact_neighbors(x, torch.tensor([0, 2]), 2, selection="grouped").tolist()
        [[1, 2], [1, 0]]
    """
    if selection == "auto":
        selection = "grouped" if x.device.type == "cuda" else "topk"
    if selection not in ("topk", "grouped"):
        raise ValueError(f"selection={selection!r} must be 'auto', 'topk' or 'grouped'")
    group = group_size(x.shape[0], k) if group is None else int(group)
    if group < 1:
        raise ValueError(f"group={group} must be a positive number of columns")
    out = torch.empty((len(rows), k), dtype=torch.int64, device=x.device)
    redo = []
    for s in range(0, len(rows), block_rows):
        sims = _similarities(x, rows[s:s + block_rows])
        if selection == "topk":
            out[s:s + len(sims)] = sims.topk(k, dim=1, sorted=True).indices
        else:
            out[s:s + len(sims)], flags = grouped_topk(sims, k, group)
            redo.append(flags)
    if redo:
        _redo(x, rows, k, block_rows, group, out, torch.cat(redo))
    return out


def item_neighbors(x: torch.Tensor, item: int, k: int) -> torch.Tensor:
    """The ``k`` rows of ``x`` [N, d] with the largest inner product with row ``item``, the item
    itself excluded: int64 [k] on ``x``'s device, by decreasing similarity (``torch.topk``; ties
    as in the module docstring's ``"topk"``), from one product ``x @ x[item]``.

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.exact_search import item_neighbors
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, -0.5]])
        >>> item_neighbors(x, 0, 2).tolist()
        [1, 2]
    """
    sims = x @ x[item]
    sims[item] = -torch.inf
    return sims.topk(k, sorted=True).indices


def group_size(n: int, k: int) -> int:
    """Columns per group of the ``"grouped"`` selection over rows of ``n`` columns: the power of
    two nearest ``sqrt(n / k) / 2``, at least 1 (``n = 10^6, k = 100``: 64), which keeps both
    the top-k of the ``n / C`` group maxima and the ``k * C`` candidates small.

    Example:
        >>> from hardbatch.neighbors.exact_search import group_size
        >>> group_size(1_000_000, 100), group_size(100_000, 100), group_size(50, 10)
        (64, 16, 1)
    """
    return 1 << max(0, round(math.log2(max(1.0, math.sqrt(n / max(1, k)) / 2))))


def grouped_topk(sims: torch.Tensor, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"grouped"`` selection of one block ``sims`` ``[R, N]`` (``k < N``): column indices
    ``[R, k]`` by decreasing value then increasing column, and a bool ``[R]`` marking the rows
    whose answer is not certain (ties at the bounds; redo them with :func:`_wide_topk`). No
    synchronisation with the device.

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.exact_search import grouped_topk
        >>> sims = torch.tensor([[0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0, 0.5]])
        >>> cols, redo = grouped_topk(sims, 3, group=2)
        >>> cols.tolist(), redo.tolist()
        ([[1, 3, 5]], [False])
    """
    r, n = sims.shape
    gmax = _group_maxima(sims, group)
    if gmax.shape[1] <= k:  # short rows: the whole row
        return _stable_top(sims, k), torch.zeros(r, dtype=torch.bool, device=sims.device)
    top = gmax.topk(k, dim=1, sorted=False)
    redo = (gmax >= top.values.amin(1, keepdim=True)).sum(1) != k  # NaN: 0, redone
    cols, vals = _candidates(sims, top.indices, group)
    best = vals.topk(k, dim=1, sorted=False)
    # more than k candidates reach the k-th largest: a tie at the k-th place (NaN: fewer)
    redo |= (vals >= best.values.amin(1, keepdim=True)).sum(1) != k
    # The k in canonical order: by candidate position (= column), then stably by value.
    pos, perm = best.indices.sort(dim=1)
    order = best.values.gather(1, perm).sort(dim=1, descending=True, stable=True).indices
    return cols.gather(1, pos.gather(1, order)), redo


def _similarities(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The block ``[len(r), N]`` of inner products, each row's own column at -inf. The same
    call on the same rows gives the same bits."""
    sims = matmul_fp32(x[r], x.T)
    sims[torch.arange(len(r), device=x.device), r] = -torch.inf
    return sims


def _group_maxima(sims: torch.Tensor, group: int) -> torch.Tensor:
    """``[R, ceil(N / group)]``: the maximum of each group of ``group`` columns (the last group
    may be short)."""
    r, n = sims.shape
    full = n // group
    parts = [sims[:, :full * group].view(r, full, group).amax(2)] if full else []
    if n % group:
        parts.append(sims[:, full * group:].amax(1, keepdim=True))
    return torch.cat(parts, 1) if len(parts) > 1 else parts[0]


def _candidates(sims: torch.Tensor, groups: torch.Tensor,
                group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns of ``groups`` ``[R, g]`` in increasing order and their similarities
    ``[R, g * group]`` (the short last group's missing columns at -inf, past ``N``)."""
    n = sims.shape[1]
    groups = groups.sort(dim=1).values
    cols = (groups[:, :, None] * group + torch.arange(group, device=sims.device)).flatten(1)
    if n % group == 0:
        return cols, sims.gather(1, cols)
    return cols, sims.gather(1, cols.clamp(max=n - 1)).masked_fill_(cols >= n, -torch.inf)


def _stable_top(vals: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``k`` largest of each row, by decreasing value then position."""
    return vals.sort(dim=1, descending=True, stable=True).indices[:, :k]


def _wide_topk(sims: torch.Tensor, k: int, group: int) -> torch.Tensor:
    """The exact canonical top-``k`` of rows with ties at the bounds: the candidates of every
    group whose maximum reaches the ``k``-th largest maximum, stably sorted."""
    gmax = _group_maxima(sims, group)
    num = gmax.shape[1]
    if num <= k:
        return _stable_top(sims, k)
    reach = (gmax >= gmax.topk(k, dim=1, sorted=False).values.amin(1, keepdim=True)).sum(1)
    wide = num if bool((reach < k).any()) else int(reach.max())  # reach < k: NaN, all groups
    out = torch.empty((len(sims), k), dtype=torch.int64, device=sims.device)
    step = max(1, _CANDIDATES // (wide * group))
    for s in range(0, len(sims), step):
        groups = gmax[s:s + step].topk(wide, dim=1, sorted=False).indices
        cols, vals = _candidates(sims[s:s + step], groups, group)
        out[s:s + step] = cols.gather(1, _stable_top(vals, k))
    return out


def _redo(x: torch.Tensor, rows: torch.Tensor, k: int, block_rows: int, group: int,
          out: torch.Tensor, flags: torch.Tensor) -> None:
    """Redo the flagged rows of ``out`` with :func:`_wide_topk`, each from its block's
    products computed again by the same call (one synchronisation; none when nothing tied)."""
    ids = flags.nonzero().squeeze(1)
    if len(ids) == 0:
        return
    for b in torch.unique(ids // block_rows).tolist():
        s = b * block_rows
        local = ids[(ids >= s) & (ids < s + block_rows)] - s
        sims = _similarities(x, rows[s:s + block_rows])
        out[s + local] = _wide_topk(sims[local], k, group)
