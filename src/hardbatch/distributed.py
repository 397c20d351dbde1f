"""torch.distributed glue: sharded graph construction and embedding-bank synchronisation.

hardbatch scales with the engine training already uses (DDP launched by
``torchrun``), not a home-made one. Every function here takes an optional
process ``group`` (default: the default group) and is a plain single-process
call when torch.distributed is not initialised or the group has one rank, so
the same code runs with and without ``torchrun``. Collectives run on the
device the backend needs: CUDA for ``nccl`` (``torch.cuda.current_device()``),
CPU for ``gloo``.

- :func:`all_gather_rows`: concatenation over ranks of tensors with equal
  trailing shape and *uneven* row counts (counts first, then a padded
  ``all_gather``, padding stripped), in rank order.
  :func:`all_gather_rows_with_grad` is the same concatenation with a gradient:
  its backward sums the gradient of the whole concatenation over the ranks
  (``all_reduce``) and hands each rank the rows it contributed, so a loss of
  gathered embeddings back-propagates into every rank's encoder (the gathered
  negatives of ``gather=True`` in :mod:`hardbatch.losses`).
  :func:`all_gather_ints` gathers a few integers per rank (shapes, flags) in
  one fixed-size collective, so that every rank can check every rank's inputs
  before any variable-size collective.
- :func:`proximity_graph` / :func:`knn_graph`: each rank computes the cheap,
  seeded candidate-pool table in full (the same on every rank), builds the
  rows of its contiguous range of blocks of groups (rows for the kNN graph)
  on its own ``device``, and the rows are all-gathered: the result equals the
  single-process :func:`hardbatch.proximity_graph` / :func:`hardbatch.knn_graph`
  bit for bit (same blocks, same products), with 1/W of the work per rank.
- :func:`gcbs_permutation`: the threshold is estimated on every rank (same
  seeded sample), the search for pairs above it is shared (row blocks or
  inverted lists), the pairs are all-gathered and every rank runs the same
  reverse Cuthill-McKee: the same order as the single-process call (for
  ``"ivf"`` on CUDA, k-means with atomic adds may differ in the last bits
  between ranks; the order is still the same on every rank).
- :func:`sync_bank_update`: the (indices, embeddings) every rank computed this
  step, all-gathered, so that every rank's :class:`~hardbatch.EmbeddingBank`
  holds the same table (``EmbeddingBank(sync=True)`` calls it in ``update``).

Memory per rank: the pool table N*M/g int32 (g items share a pool; 100 MB at
N = 1.28M, M = 1000, g = 50), the embeddings N*d, one block, and the full
[N, K] int64 graph after the gather (the walks need all of it), plus a
receive buffer of W * max-rows-per-rank * K during the gather.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ._device import Precision, shard_range
from ._validation import check_int
from .batching.gcbs import (PairSearchPlan, PartitionPlan, gcbs_setup, interleave_chunks, rcm_order,
                   resolve_build)
from .neighbors.knn_graph import KNNGraphPlan, ProximityGraphPlan

__all__ = ["all_gather_ints", "all_gather_rows", "all_gather_rows_with_grad", "gcbs_permutation",
           "get_rank_world", "is_distributed", "knn_graph", "proximity_graph",
           "sync_bank_update"]


def is_distributed(group=None) -> bool:
    """True when torch.distributed is initialised and ``group`` has more than one rank.

    Example:
        >>> from hardbatch.distributed import is_distributed
        >>> is_distributed()  # no process group initialised (under torchrun: True for 2+ ranks)
        False
    """
    return (dist.is_available() and dist.is_initialized()
            and dist.get_world_size(group) > 1)


def get_rank_world(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) when torch.distributed is not initialised.

    Example:
        >>> from hardbatch.distributed import get_rank_world
        >>> get_rank_world()  # one process
        (0, 1)
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _comm_device(group=None) -> torch.device:
    """CUDA (current device) for nccl, CPU otherwise (gloo)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_ints(values: list[int], group=None) -> list[list[int]]:
    """Every rank's list of ``len(values)`` integers (same length on every rank), in rank order.

    One fixed-size ``all_gather``: it cannot hang on mismatched shapes, so it is the first
    collective of a call whose later collectives depend on every rank's sizes. ``[values]``
    when not distributed.

    Example:
        >>> from hardbatch.distributed import all_gather_ints
        >>> all_gather_ints([40, 8])  # one process: its own list; W ranks: W lists, in rank order
        [[40, 8]]
    """
    if not is_distributed(group):
        return [list(values)]
    dev = _comm_device(group)
    mine = torch.tensor(values, dtype=torch.int64, device=dev)
    parts = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return [p.tolist() for p in parts]


def _gather_padded(tensor: torch.Tensor, counts: list[int], group) -> torch.Tensor:
    """``all_gather`` of ``tensor`` padded to ``max(counts)`` rows; padding dropped."""
    dev = _comm_device(group)
    padded = torch.zeros((max(counts), *tensor.shape[1:]), dtype=tensor.dtype, device=dev)
    padded[:tensor.shape[0]] = tensor.detach().to(dev)
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:c] for p, c in zip(parts, counts)]).to(tensor.device)


def all_gather_rows(tensor: torch.Tensor, group=None, counts: list[int] | None = None
                    ) -> torch.Tensor:
    """Concatenate ``tensor`` [n_r, ...] of every rank along dim 0, in rank order.

    Ranks may hold different row counts n_r (e.g. a short last batch): counts
    are gathered first (or taken from ``counts``, every rank's n_r, when the
    caller knows them), every rank pads to the largest, and the padding is
    dropped. The result lives on ``tensor``'s device and has no gradient
    (:func:`all_gather_rows_with_grad` has one). Returns ``tensor`` itself when
    not distributed.

    Example:
        >>> import torch
        >>> from hardbatch.distributed import all_gather_rows
        >>> rows = torch.arange(6).reshape(3, 2)
        >>> all_gather_rows(rows) is rows  # one process; W ranks: [sum of n_r, 2], in rank order
        True
    """
    if not is_distributed(group):
        return tensor
    if counts is None:
        counts = [c[0] for c in all_gather_ints([tensor.shape[0]], group)]
    return _gather_padded(tensor, counts, group)


class _AllGatherRows(torch.autograd.Function):
    """Padded ``all_gather`` forward; backward: ``all_reduce`` (sum) of the gradient, own rows."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, counts: list[int], group) -> torch.Tensor:
        rank = dist.get_rank(group)
        ctx.group, ctx.start, ctx.count = group, sum(counts[:rank]), counts[rank]
        return _gather_padded(tensor, counts, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        dev = _comm_device(ctx.group)
        total = grad.to(dev, copy=True).contiguous()
        # Each rank's loss puts a gradient on every gathered row; a row's full gradient is the
        # sum over the ranks, and the rank that contributed the row keeps it.
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)
        own = total[ctx.start:ctx.start + ctx.count].to(grad.device)
        return own, None, None


def all_gather_rows_with_grad(tensor: torch.Tensor, group=None,
                              counts: list[int] | None = None) -> torch.Tensor:
    """:func:`all_gather_rows` with a gradient flowing back to every rank's rows.

    The backward is a collective (an ``all_reduce`` of the ``[sum n_r, ...]`` gradient):
    every rank must back-propagate through the result (as under DDP, where every rank calls
    ``loss.backward()``), in the same order as the other ranks. Under DDP, which averages the
    parameter gradients over the W ranks, a loss of gathered embeddings gives the gradient of
    the sum of the ranks' losses divided by W. Returns ``tensor`` itself when not distributed.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> from hardbatch.distributed import all_gather_rows_with_grad
        >>> _ = torch.manual_seed(0)
        >>> z1 = torch.randn(8, 4, requires_grad=True)
        >>> z2 = torch.randn(8, 4)
        >>> negatives = all_gather_rows_with_grad(z1)  # every rank's z1 (one process: z1 itself)
        >>> hb.InfoNCE(0.5)(z1, z2, negatives=negatives).backward()
        >>> z1.grad.shape
        torch.Size([8, 4])
    """
    if not is_distributed(group):
        return tensor
    if counts is None:
        counts = [c[0] for c in all_gather_ints([tensor.shape[0]], group)]
    return _AllGatherRows.apply(tensor, list(counts), group)


def proximity_graph(embeddings, candidates: int = 1000, neighbors: int = 100, seed: int = 0, *,
                    group_size: int | None = None, device: str | torch.device | None = None,
                    precision: Precision = "fp32", group=None) -> torch.Tensor:
    """:func:`hardbatch.proximity_graph`, built by all ranks of ``group`` together.

    Every rank must call it with the same embeddings and arguments (as after
    :func:`sync_bank_update`). Rank r builds the rows of blocks
    ``[r*nb/W, (r+1)*nb/W)`` of the block layout (whole groups sharing a
    candidate pool, BatchSampler eq. 3) on its ``device``; the rows are
    all-gathered, so every rank returns the full [N, K] graph, identical to the
    single-process one.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> from hardbatch import distributed
        >>> x = torch.randn(40, 8)
        >>> graph = distributed.proximity_graph(x, candidates=20, neighbors=5, seed=0)
        >>> graph.shape, torch.equal(graph, hb.proximity_graph(x, 20, 5, seed=0))  # one process
        (torch.Size([40, 5]), True)
    """
    plan = ProximityGraphPlan(embeddings, candidates, neighbors, seed, group_size, device, precision)
    rank, world = get_rank_world(group) if is_distributed(group) else (0, 1)
    start, end = shard_range(plan.num_blocks, rank, world)
    return plan.assemble(all_gather_rows(plan.rows(start, end), group))


def knn_graph(embeddings, neighbors: int = 100, *, method: str = "exact",
              device: str | torch.device | None = None, precision: Precision = "fp32",
              nlist: int | None = None, nprobe: int = 16, seed: int = 0,
              group=None) -> torch.Tensor:
    """:func:`hardbatch.knn_graph`, rows sharded by contiguous row blocks across ``group``.

    Example:
        >>> import torch
        >>> from hardbatch import distributed, knn_graph
        >>> x = torch.randn(40, 8)
        >>> torch.equal(distributed.knn_graph(x, 5), knn_graph(x, 5))  # one process: the same
        True
    """
    plan = KNNGraphPlan(embeddings, neighbors, method, device, precision, nlist, nprobe, seed)
    rank, world = get_rank_world(group) if is_distributed(group) else (0, 1)
    start, end = shard_range(plan.num_blocks, rank, world)
    return all_gather_rows(plan.rows(start, end), group)


def gcbs_permutation(embeddings, quantile: float = 0.999, paired=None, *, method: str = "auto",
                     min_partners: int | None = None, seed: int = 0, nlist: int | None = None,
                     nprobe: int = 8,
                     partitions: int | None = None, device: str | torch.device | None = None,
                     precision: Precision = "fp32", interleave: int = 0,
                     group=None) -> torch.Tensor:
    """:func:`hardbatch.gcbs_permutation` with the pair search (GCBS eq. 5) shared across ``group``.

    The same arguments and the same order as the single-process function (``method="auto"``
    resolves by N on every rank alike); ``group`` is the process group (None: the default).

    ``method="partition"``: rank 0's cells and chain are broadcast (k-means on
    CUDA may differ in the last bits between ranks), every rank orders a
    contiguous range of the chain of about equal cost (sum of squared cell
    sizes), and the ranges are all-gathered in chain order.

    Example:
        >>> import torch
        >>> from hardbatch import distributed, gcbs_permutation
        >>> x = torch.randn(40, 8)
        >>> order = distributed.gcbs_permutation(x, quantile=0.9, seed=0)
        >>> len(order), torch.equal(order, gcbs_permutation(x, quantile=0.9, seed=0))
        (40, True)
    """
    x, y, threshold, nlist, nprobe = gcbs_setup(embeddings, paired, quantile, method, seed, nlist,
                                                nprobe, device, precision)
    n = x.shape[0]
    if threshold is None:
        return torch.zeros(1, dtype=torch.int64)
    method, k, partitions = resolve_build(method, min_partners, partitions, n)
    interleave = check_int(interleave, "interleave", low=0)
    return torch.from_numpy(interleave_chunks(
        _shared_order(x, y, threshold, method, k, seed, nlist, nprobe, partitions, device,
                      precision, group), interleave))


def _shared_order(x, y, threshold, method, k, seed, nlist, nprobe, partitions, device,
                  precision, group) -> np.ndarray:
    """The GCBS order of :func:`gcbs_permutation` (before interleaving), work shared by rank."""
    n = x.shape[0]
    if method == "partition":
        part = PartitionPlan(x, y, threshold, partitions, seed, device, precision, k)
        if not is_distributed(group):
            return part.order(0, len(part.chain))
        dev = _comm_device(group)
        cell, chain = part.cell.to(dev), torch.tensor(part.chain, dtype=torch.int64, device=dev)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast(cell, src, group=group)
        dist.broadcast(chain, src, group=group)
        part.adopt(cell.cpu(), chain.cpu())
        rank, world = get_rank_world(group)
        mine = torch.from_numpy(part.order(*part.shard(rank, world)))
        return all_gather_rows(mine, group).numpy()
    plan = PairSearchPlan(x, y, threshold, method, nlist=nlist, nprobe=nprobe, seed=seed,
                          device=device, precision=precision, min_partners=k)
    rank, world = get_rank_world(group) if is_distributed(group) else (0, 1)
    rows, cols = plan.pairs(*shard_range(plan.num_units, rank, world))
    pairs = all_gather_rows(torch.from_numpy(np.stack([rows, cols], axis=1)), group).numpy()
    return np.asarray(rcm_order(pairs[:, 0], pairs[:, 1], n, seed))


def sync_bank_update(indices: torch.Tensor, embeddings: torch.Tensor,
                     group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """All ranks' (indices [b_r], embeddings [b_r, d]) of this step, concatenated in rank order.

    Batch sizes may differ between ranks (the last batch of an epoch). Every
    rank must call it once per step (it is a collective, like DDP's gradient
    all-reduce). Writing the result in order makes all banks identical; an
    item updated by several ranks in one step keeps the highest rank's value.

    Example:
        >>> import torch
        >>> from hardbatch import EmbeddingBank
        >>> from hardbatch.distributed import sync_bank_update
        >>> bank = EmbeddingBank(40, 8)
        >>> idx, z = torch.tensor([3, 7]), torch.ones(2, 8)
        >>> all_idx, all_z = sync_bank_update(idx, z)  # every rank's rows (one process: these)
        >>> all_idx.tolist(), tuple(all_z.shape)
        ([3, 7], (2, 8))
        >>> bank.update(all_idx, all_z)  # what EmbeddingBank(sync=True) does in update
    """
    idx = all_gather_rows(indices.reshape(-1).to(torch.int64), group)
    emb = all_gather_rows(embeddings, group)
    return idx, emb
