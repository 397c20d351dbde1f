"""torch.distributed glue: the collectives of sharded builds, losses and the embedding bank.

hardbatch scales with the engine training already uses (DDP launched by
``torchrun``), not a home-made one. Every function here takes an optional
process ``group`` (default: the default group) and is a plain single-process
call when torch.distributed is not initialised or the group has one rank, so
the same code runs with and without ``torchrun``. Collectives run on the
device the backend needs: CUDA for ``nccl`` (``torch.cuda.current_device()``),
CPU for ``gloo``. This module imports nothing of the builds: they import it.

- :func:`all_gather_rows`: concatenation over ranks of tensors with equal
  trailing shape and *uneven* row counts (first one small gather of every rank's row
  count, trailing shape and dtype, and ``counts`` when given, so that a mismatch raises
  the same ``ValueError`` on every rank; then a padded ``all_gather``, padding stripped),
  in rank order.
  :func:`all_gather_rows_with_grad` is the same concatenation with a gradient:
  its backward sums the gradient of the whole concatenation over the ranks
  (``all_reduce``) and hands each rank the rows it contributed, so a loss of
  gathered embeddings back-propagates into every rank's encoder (the gathered
  negatives of ``gather=True`` in :mod:`hardbatch.losses`).
  :func:`all_gather_ints` gathers a few integers per rank (shapes, flags) in
  one fixed-size collective, so that every rank can check every rank's inputs
  before any variable-size collective.
- :func:`rank_share` (a rank's contiguous range of a build's units) and
  :func:`broadcast_from_first` (rank 0's values on every rank): what the sharded
  builds beside their builds use, with :func:`all_gather_rows`:
  :func:`hardbatch.neighbors.proximity_graph.sharded_proximity_graph`,
  :func:`hardbatch.neighbors.knn_graph.sharded_knn_graph` and
  :func:`hardbatch.batching.gcbs.sharded_gcbs_permutation`, each equal to its
  single-process build bit for bit with 1/W of the work per rank
  (docs/distributed.md).
- :func:`sync_bank_update`: the (indices, embeddings) every rank computed this
  step, all-gathered, so that every rank's :class:`~hardbatch.EmbeddingBank`
  holds the same table (``EmbeddingBank(sync=True)`` calls it in ``update``).
"""

from __future__ import annotations

import operator
import warnings

import torch
import torch.distributed as dist

from ._device import shard_range
from ._validation import check_int

__all__ = ["all_gather_ints", "all_gather_rows", "all_gather_rows_with_grad",
           "broadcast_from_first", "get_rank_world", "is_distributed", "rank_share",
           "resolve_rank_world", "sync_bank_update"]


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


def resolve_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """A sampler's ``(rank, world_size)`` checked; None takes torch.distributed's
    (:func:`get_rank_world`: 0 and 1 without it).

    Example:
        >>> from hardbatch.distributed import resolve_rank_world
        >>> resolve_rank_world(), resolve_rank_world(1, 4)
        ((0, 1), (1, 4))
    """
    if rank is None and world_size is not None and not (dist.is_available()
                                                        and dist.is_initialized()):
        if check_int(world_size, "world_size", low=1) > 1:
            warnings.warn(f"world_size={world_size} without rank, and torch.distributed is not "
                          "initialised: this process takes rank 0, as would every process "
                          "constructed so (each then trains rank 0's share); pass rank= (or "
                          "construct the sampler after init_process_group)", stacklevel=3)
    if rank is None or world_size is None:
        dist_rank, dist_world = get_rank_world()
        rank = dist_rank if rank is None else rank
        world_size = dist_world if world_size is None else world_size
    world_size = check_int(world_size, "world_size", low=1)
    rank = check_int(rank, "rank", low=0)
    if rank >= world_size:
        raise ValueError(f"rank={rank} must be smaller than world_size={world_size}")
    return rank, world_size


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


_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_TRAILING = 6  # trailing dims sent as they are (more: the rest folded into the last slot)


def _layout(tensor: torch.Tensor) -> list[int]:
    """``[rows, ndim, *trailing dims (-1 padded), dtype code]``: the same length on every rank."""
    trailing = list(tensor.shape[1:])
    if len(trailing) > _TRAILING:
        folded = 0
        for size in trailing[_TRAILING - 1:]:
            folded = (folded * 1_000_003 + size + 1) % (1 << 61)
        trailing = trailing[:_TRAILING - 1] + [folded]
    code = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
    return [tensor.shape[0] if tensor.ndim else -1, tensor.ndim,
            *trailing, *[-1] * (_TRAILING - len(trailing)), code]


def _describe(layout: list[int]) -> str:
    dims = ["n", *map(str, layout[2:2 + min(max(layout[1] - 1, 0), _TRAILING)])]
    dtype = _DTYPES[layout[-1]] if 0 <= layout[-1] < len(_DTYPES) else "?"
    return f"[{', '.join(dims[:max(layout[1], 0)])}] {dtype}"


def _valid_counts(counts, world: int) -> bool:
    try:
        return len(counts) == world and all(operator.index(c) >= 0 for c in counts)
    except TypeError:
        return False


def _checked_rows(tensor: torch.Tensor, counts, group, name: str) -> list[int]:
    """Every rank's row count, from one :func:`all_gather_ints` of every rank's row count,
    trailing shape, dtype and ``counts`` (when given): a mismatch raises the same
    ``ValueError`` on every rank before the data collective, so that no rank waits alone."""
    world = dist.get_world_size(group)
    given = 0 if counts is None else 1 if _valid_counts(counts, world) else 2
    sent = [operator.index(c) for c in counts] if given == 1 else [0] * world
    width = _TRAILING + 3
    infos = all_gather_ints([*_layout(tensor), given, *sent], group)
    layouts, rows = [i[:width] for i in infos], [i[0] for i in infos]
    flat = [r for r, lay in enumerate(layouts) if lay[1] == 0]
    if flat:
        raise ValueError(f"{name} needs tensors with a row dimension (ndim >= 1), got a 0-dim "
                         f"tensor on rank(s) {flat}; pass tensor.reshape(1, ...) or [n, ...]")
    if len({tuple(lay[1:]) for lay in layouts}) > 1:
        got = ", ".join(f"rank {r}: {_describe(lay)}" for r, lay in enumerate(layouts))
        raise ValueError(f"{name} needs the same trailing shape and dtype on every rank, got "
                         f"{got}; reshape or cast every rank's tensor to one [n_r, ...] and dtype")
    for r, info in enumerate(infos):
        if info[width] == 2 or (info[width] == 1 and info[width + 1:] != rows):
            got = f"={info[width + 1:]}" if info[width] == 1 else f" of {world} ints expected"
            raise ValueError(
                f"{name}: counts{got} on rank {r} must list every rank's tensor.shape[0] in "
                f"rank order, here {rows}; pass those, or counts=None to have them gathered")
    return rows


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

    Ranks may hold different row counts n_r (e.g. a short last batch): one small
    :func:`all_gather_ints` first exchanges every rank's n_r, trailing shape and dtype
    (and ``counts``, every rank's n_r in rank order, when the caller passes them: they
    are checked, not trusted), every rank pads to the largest n_r, and the padding is
    dropped. A different trailing shape or dtype on some rank, or ``counts`` that are
    not the n_r, raise the same ``ValueError`` on every rank before the data is
    gathered (no rank is left waiting). The result lives on ``tensor``'s device and
    has no gradient (:func:`all_gather_rows_with_grad` has one). Returns ``tensor``
    itself when not distributed.

    Example:
        >>> import torch
        >>> from hardbatch.distributed import all_gather_rows
        >>> rows = torch.arange(6).reshape(3, 2)
        >>> all_gather_rows(rows) is rows  # one process; W ranks: [sum of n_r, 2], in rank order
        True
    """
    if not is_distributed(group):
        return tensor
    return _gather_padded(tensor, _checked_rows(tensor, counts, group, "all_gather_rows"), group)


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
    """:func:`all_gather_rows` with a gradient flowing back to every rank's rows (the same
    checks of every rank's shape, dtype and ``counts`` first, raised on every rank).

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
    rows = _checked_rows(tensor, counts, group, "all_gather_rows_with_grad")
    return _AllGatherRows.apply(tensor, rows, group)


def rank_share(num_units: int, group=None) -> tuple[int, int]:
    """This rank's contiguous share ``[start, end)`` of ``num_units`` work units in ``group``
    (rank r of W: ``[r * n / W, (r + 1) * n / W)``); ``(0, num_units)`` when not distributed.

    The units of a sharded build (blocks of a graph, units of a pair search): every rank
    builds its share and :func:`all_gather_rows` concatenates the shares in rank order.

    Example:
        >>> from hardbatch.distributed import rank_share
        >>> rank_share(10)  # one process: all of them; rank 1 of 2 would get (5, 10)
        (0, 10)
    """
    rank, world = get_rank_world(group) if is_distributed(group) else (0, 1)
    return shard_range(num_units, rank, world)


def broadcast_from_first(tensors: list[torch.Tensor], group=None) -> list[torch.Tensor]:
    """Rank 0's values of ``tensors`` (of ``group``; same shapes and dtypes on every rank),
    copies on each tensor's own device; the tensors themselves when not distributed.

    For a value that every rank computes but that may differ in the last bits between ranks
    (k-means with atomic adds on CUDA): every rank then uses rank 0's.

    Example:
        >>> import torch
        >>> from hardbatch.distributed import broadcast_from_first
        >>> cells = torch.tensor([0, 1, 1])
        >>> broadcast_from_first([cells])[0] is cells  # one process: the tensor itself
        True
    """
    if not is_distributed(group):
        return list(tensors)
    dev = _comm_device(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    out = []
    for tensor in tensors:
        sent = tensor.to(dev, copy=True)
        dist.broadcast(sent, src, group=group)
        out.append(sent.to(tensor.device))
    return out


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
