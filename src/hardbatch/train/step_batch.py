"""How batches reach :meth:`hardbatch.train.Trainer.train_step`, when a step is skipped, and
what a step logs about its batch (:func:`batch_diagnostics`).

* tensor data: the sampler's ids index the ``[N, ...]`` tensor directly;
* a dataset: a ``DataLoader`` over the sampler (``batch_sampler=``). Items that are inputs (or
  ``(input, label, ...)`` tuples) are wrapped as ``IndexedDataset(data, views=1)``: ``(index,
  input)``; items that already carry their index, ``(index, view1, view2)`` (a
  :class:`hardbatch.IndexedDataset`, or any dataset whose items 0 and 1 start with 0 and 1),
  are used as they are: the views are the dataset's, and every batch is checked by
  :func:`hardbatch.indexed_batch` (a clear error when an item lacks its index).
* a batch of one item has no negative and is skipped. Under torch.distributed the decision is
  all-reduced (:func:`skip_on_every_rank`): if any rank's batch has one item, every rank skips
  the step, so DDP's gradient all-reduce and the synchronised bank update stay in step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..data import IndexedDataset, indexed_batch
from ..metrics import batch_false_negative_rate, batch_hardness, batch_stats

__all__ = ["REFERENCE_KEYS", "batch_diagnostics", "first_inputs",
           "loader_batches", "skip_on_every_rank"]

#: What a step logs about its batch in the reference embedding (``Trainer(reference=...)``).
REFERENCE_KEYS = ("reference_hardness", "reference_mean_negative_similarity",
                  "reference_near_duplicate_rate")


def first_inputs(data, indexed: bool, count: int = 2) -> torch.Tensor:
    """The inputs of the first ``count`` items of a dataset, stacked (the first view of
    ``indexed`` items, see :func:`hardbatch.data.looks_indexed`)."""
    if indexed:
        return torch.stack([torch.as_tensor(data[i][1]) for i in range(count)])
    wrapped = IndexedDataset(data, views=1)
    return torch.stack([torch.as_tensor(wrapped[i][1]) for i in range(count)])


def loader_batches(data, sampler, num_workers: int, generator: torch.Generator,
                   indexed: bool) -> Iterator[tuple[list[int], object, tuple]]:
    """Yield ``(ids, x, views)`` for one pass of ``sampler`` over the dataset ``data``:
    ``x`` the batch of inputs and ``views = ()``, or, for ``indexed`` items (decided once, by
    :func:`hardbatch.data.looks_indexed`) with two or more views, ``x = None`` and
    ``views = (view1, view2)``."""
    loader = torch.utils.data.DataLoader(
        data if indexed else IndexedDataset(data, views=1), batch_sampler=sampler,
        num_workers=num_workers, generator=generator)
    for batch in loader:
        if not indexed:
            idx, x = batch
            yield idx.tolist(), x, ()
            continue
        idx, *views = indexed_batch(batch)
        if len(views) >= 2:
            yield idx.tolist(), None, (views[0], views[1])
        else:
            yield idx.tolist(), views[0], ()


def skip_on_every_rank(skip: bool, device: torch.device) -> bool:
    """``skip`` of this rank, or-ed over the ranks of the default process group (one
    all-reduce of a flag; just ``skip`` without torch.distributed or with one rank)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return skip
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if skip else 0], dtype=torch.int32, device=on)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def batch_diagnostics(z1: torch.Tensor | None, idx: torch.Tensor, labels: torch.Tensor | None,
                      reference: torch.Tensor | None) -> dict:
    """A step's figures of its batch ``idx``: ``hardness`` (top-1 in-batch cosine of the anchor
    embeddings ``z1 [B, d]``), ``false_negative_rate`` (same-label pairs; NaN without labels)
    and, with a ``reference [N, d']``, the :data:`REFERENCE_KEYS` of the batch in it. ``z1 =
    None`` (a skipped step): every figure NaN."""
    nan = float("nan")
    if z1 is None:
        out = {"hardness": nan, "false_negative_rate": nan}
        return out if reference is None else {**out, **dict.fromkeys(REFERENCE_KEYS, nan)}
    out = {"hardness": batch_hardness(z1, torch.arange(len(idx))),
           "false_negative_rate": (batch_false_negative_rate(labels, idx)
                                   if labels is not None else nan)}
    if reference is not None:
        fixed = batch_stats(reference, idx, reference=reference)
        out.update({k: fixed[k] for k in REFERENCE_KEYS})
    return out
