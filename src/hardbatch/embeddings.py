"""Where samplers read item embeddings from: arrays, an :class:`EmbeddingBank`, or a callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import numpy as np
import torch

from ._device import check_dtype, resolve_device
from ._validation import check_int, embedding_tensor, l2_normalize_rows
from .distributed import is_distributed, sync_bank_update

__all__ = ["STALE_BANK_STEPS", "EmbeddingBank", "EmbeddingSource", "read_embeddings",
           "source_num_items", "unwritten_bank_warning"]


class EmbeddingBank:
    """Item embeddings collected from the training forward pass, with staleness tracking.

    The training loop already computes embeddings for the items of each batch;
    ``bank.update(indices, batch_embeddings)`` stores them (detached) so a
    sampler can rebuild its graph without an extra encoding pass. Items never
    updated keep their initial value: random unit vectors by default
    (``init="random"``), for which graph samplers behave like uniform sampling,
    or zeros.

    Args:
        num_items: N.
        dim: d, embedding width.
        init: ``"random"`` (seeded Gaussian, unit norm) or ``"zeros"``.
        seed: seed of the random init.
        dtype, device: storage of the [N, d] table (float32 on CPU by default).
        sync: under torch.distributed (DDP), all-gather the (indices, embeddings) of
            every rank in each :meth:`update`, so that every rank's bank holds the same
            table (:func:`hardbatch.distributed.sync_bank_update`; uneven batch sizes are
            fine). ``None`` (default) or True: on whenever torch.distributed is
            initialised with more than one rank in ``process_group`` (a no-op
            otherwise); False: each rank keeps only its own updates. ``update`` is then a collective:
            every rank must call it once per step, as DDP's backward.
        process_group: the group to synchronise over (default: the default group).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> bank = hb.EmbeddingBank(40, 8)
        >>> bank.update(torch.tensor([0, 5]), torch.ones(2, 8))
        >>> bank.staleness()[:6].tolist(), bank.filled
        ([1, -1, -1, -1, -1, 1], 0.05)
    """

    def __init__(self, num_items: int, dim: int, *, init: str = "random", seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 sync: bool | None = None, process_group=None) -> None:
        self.num_items = check_int(num_items, "num_items", low=1)
        self.dim = check_int(dim, "dim", low=1)
        if init == "random":
            gen = torch.Generator().manual_seed(int(seed))
            table = torch.randn(self.num_items, self.dim, generator=gen)
            table = l2_normalize_rows(table)
        elif init == "zeros":
            table = torch.zeros(self.num_items, self.dim)
        else:
            raise ValueError(f"init={init!r} must be 'random' or 'zeros'")
        self.embeddings = table.to(dtype=check_dtype(dtype), device=resolve_device(device))
        self.last_update = torch.full((self.num_items,), -1, dtype=torch.int64)
        self.step = 0
        self.rows_written = 0  # rows stored by update() so far, counted with repeats
        if sync not in (None, True, False):
            raise ValueError(f"sync={sync!r} must be True, False or None (automatic)")
        self.sync, self.process_group = sync, process_group

    @property
    def synchronized(self) -> bool:
        """Whether :meth:`update` all-gathers across ranks (see ``sync``)."""
        return self.sync is not False and is_distributed(self.process_group)

    def __len__(self) -> int:
        return self.num_items

    @torch.no_grad()
    def update(self, indices, batch_embeddings: torch.Tensor) -> None:
        """Store ``batch_embeddings`` [b, d] for items ``indices`` [b]; counts one step.

        An item listed twice keeps its last row (with synchronisation: the highest rank's),
        on every device.

        With synchronisation on (``sync``), the rows of all ranks are stored on
        every rank (collective call). ``indices`` must hold integers (the items' dataset
        indices); floats or booleans raise ``ValueError``.
        """
        idx = torch.as_tensor(indices.cpu() if isinstance(indices, torch.Tensor)
                              else np.asarray(indices))
        if idx.numel() and (idx.is_floating_point() or idx.is_complex()
                            or idx.dtype == torch.bool):
            raise ValueError(f"indices must be integer item indices, got dtype {idx.dtype}; "
                             "pass the items' dataset indices (e.g. the index a dataset "
                             "returns with each item), not values or a mask")
        idx = idx.to(torch.int64).reshape(-1)
        if not isinstance(batch_embeddings, torch.Tensor):
            batch_embeddings = torch.as_tensor(np.asarray(batch_embeddings))
        if batch_embeddings.ndim != 2 or batch_embeddings.shape[1] != self.dim:
            raise ValueError(f"batch_embeddings must have shape [b, {self.dim}], got "
                             f"{tuple(batch_embeddings.shape)}")
        if batch_embeddings.shape[0] != idx.numel():
            raise ValueError(f"indices has {idx.numel()} entries but batch_embeddings has "
                             f"{batch_embeddings.shape[0]} rows; pass one index per row")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_items):
            raise ValueError(f"indices must lie in [0, {self.num_items}); got values in "
                             f"[{int(idx.min())}, {int(idx.max())}]")
        values = batch_embeddings.detach().to(self.embeddings.dtype)
        if not torch.isfinite(values).all():  # one scan; which fault, only on a fault
            if not torch.isfinite(batch_embeddings).all():
                raise ValueError("batch_embeddings contains NaN or inf; the bank keeps only "
                                 "finite embeddings (check the encoder output)")
            raise ValueError(f"batch_embeddings overflow the bank's dtype {self.embeddings.dtype} "
                             "(a value beyond its range); normalise the rows first or use a "
                             "float32 bank")
        if self.synchronized:
            idx, values = sync_bank_update(idx, values, self.process_group)
            idx = idx.cpu()
        rows = int(idx.numel())
        uniq, where = torch.unique(idx, return_inverse=True)
        if len(uniq) < rows:  # an item twice: its last row, written once (a write with repeated
            last = torch.full_like(uniq, -1).scatter_reduce_(  # indices is undefined on CUDA)
                0, where, torch.arange(rows), "amax")
            idx, values = uniq, values[last.to(values.device)]
        self.embeddings[idx.to(self.embeddings.device)] = values.to(
            self.embeddings.device)
        self.last_update[idx] = self.step
        self.step += 1
        self.rows_written += rows

    def staleness(self) -> torch.Tensor:
        """Steps since each item was last updated, int64 [N]; -1 for items never updated."""
        age = self.step - self.last_update
        age[self.last_update < 0] = -1
        return age

    @property
    def filled(self) -> float:
        """Share of items updated at least once."""
        return float((self.last_update >= 0).double().mean())

    def snapshot(self) -> torch.Tensor:
        """A copy of the current [N, d] table."""
        return self.embeddings.detach().clone()

    def state_dict(self) -> dict:
        return {"embeddings": self.embeddings.cpu().clone(), "last_update": self.last_update.clone(),
                "step": self.step, "rows_written": self.rows_written}

    def load_state_dict(self, state: dict) -> None:
        emb = state["embeddings"]
        if tuple(emb.shape) != (self.num_items, self.dim):
            raise ValueError(f"state holds a bank of shape {tuple(emb.shape)}, this bank is "
                             f"{(self.num_items, self.dim)}")
        self.embeddings.copy_(emb)
        self.last_update.copy_(state["last_update"])
        self.step = int(state["step"])
        self.rows_written = int(state.get("rows_written", 0))


#: Sampler steps without any ``bank.update`` after which a refresh warns: more than any
#: DataLoader asks for ahead of training, so a prefetching loader never triggers it.
STALE_BANK_STEPS = 64


def unwritten_bank_warning(bank: EmbeddingBank, unchanged_steps: int) -> str | None:
    """Why a sampler rebuilding from ``bank`` now would draw uniform-like batches, or None.

    ``unchanged_steps``: sampler steps since ``bank.step`` last changed. The message when
    the bank was not written for :data:`STALE_BANK_STEPS` steps or more (a forgotten
    ``bank.update``), or when over half of its rows were never written although ``update``
    has stored at least N rows (given something other than the items' dataset indices, e.g.
    labels): such rows hold their random initial vectors.

    Example:
        >>> import hardbatch as hb
        >>> from hardbatch.embeddings import unwritten_bank_warning
        >>> print(unwritten_bank_warning(hb.EmbeddingBank(40, 8), 64)[:52])
        the EmbeddingBank was not written during the sampler
        >>> unwritten_bank_warning(hb.EmbeddingBank(40, 8), 0) is None
        True
    """
    never = float((bank.last_update < 0).double().mean())
    if unchanged_steps >= STALE_BANK_STEPS:
        return (f"the EmbeddingBank was not written during the sampler's last "
                f"{unchanged_steps} steps: 100% of its rows are unchanged ({never:.0%} never "
                "written), so the sampler rebuilds from the same (initially random) "
                "embeddings and its batches stay as uniform as before; call "
                "bank.update(indices, embeddings) with each training batch")
    if never > 0.5 and bank.rows_written >= bank.num_items:
        return (f"{never:.0%} of the EmbeddingBank's rows were never written although "
                f"bank.update stored {bank.rows_written} rows (N={bank.num_items}): those rows "
                "hold random vectors and make batches uniform; pass bank.update the items' "
                "dataset indices (not labels or positions within the batch)")
    return None


EmbeddingSource = Union[torch.Tensor, np.ndarray, EmbeddingBank, Callable[[], object]]


def _raw(source: EmbeddingSource):
    if isinstance(source, EmbeddingBank):
        return source.embeddings
    if callable(source):
        return source()
    return source


def read_embeddings(source: EmbeddingSource, name: str = "embeddings", *,
                    finite: bool = True) -> torch.Tensor:
    """The current rows of a source as a float32 ``[N, d]`` tensor on the source's device.

    An :class:`EmbeddingBank` is read in place (its table, not a copy: a CUDA bank stays on
    the GPU), an array as a CPU tensor sharing its memory where possible, a callable is
    called. Checked as :func:`hardbatch._validation.embedding_tensor` (``finite=False``
    leaves the values to the build that reads them).

    Example:
        >>> import hardbatch as hb
        >>> from hardbatch.embeddings import read_embeddings
        >>> bank = hb.EmbeddingBank(40, 8)
        >>> read_embeddings(bank).data_ptr() == bank.embeddings.data_ptr()
        True
    """
    return embedding_tensor(_raw(source), name, finite=finite)


def source_num_items(source: EmbeddingSource, name: str = "embeddings"):
    """(N, first read or None): N without encoding where possible; a callable is called once
    (its checked rows are kept for the first build).

    Example:
        >>> import numpy as np
        >>> from hardbatch.embeddings import source_num_items
        >>> source_num_items(np.ones((40, 8)))
        (40, None)
    """
    if isinstance(source, EmbeddingBank):
        return source.num_items, None
    x = read_embeddings(source, name)
    return x.shape[0], (x if callable(source) else None)
