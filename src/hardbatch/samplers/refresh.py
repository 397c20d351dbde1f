"""Refresh: when and how a sampler rebuilds its structure from an embedding source.

One :class:`RefreshPolicy` serves every sampler that reads embeddings: the proximity-graph
and kNN samplers (a graph or a snapshot, rebuilt every ``refresh_every`` steps) and GCBS (an
order, rebuilt every epoch). :class:`RefreshingSampler` wires a policy into the plan of
:class:`~hardbatch.samplers.base.PlanSampler`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

from .. import distributed as hbdist
from .._validation import check_int
from ..embeddings import EmbeddingBank, EmbeddingSource, read_embeddings, unwritten_bank_warning
from .base import PlanSampler

Structure = object  # what a sampler draws batches from: a graph, a snapshot, an order


def check_rows(x: np.ndarray, num_items: int, name: str = "embedding source") -> None:
    """``ValueError`` unless a re-read source still has one row per item."""
    if x.shape[0] != num_items:
        raise ValueError(f"the {name} now has {x.shape[0]} items, the sampler was built for "
                         f"{num_items}; a source must keep one row per item for the sampler's "
                         "lifetime (construct a new sampler for a different set of items)")


def resolve(structure):
    """A built structure, waiting for it if it is still being built in the background."""
    if isinstance(structure, concurrent.futures.Future):
        return structure.result()
    return structure


def check_pipelining(background: bool, refresh_lag: int | None, meaning: str) -> tuple[bool, int]:
    """(background, refresh_lag) checked: the lag defaults to 1 with ``background``, else 0."""
    background = bool(background)
    lag = check_int((1 if background else 0) if refresh_lag is None else refresh_lag,
                    "refresh_lag", low=0)
    if background and lag == 0:
        raise ValueError(f"background=True needs refresh_lag >= 1 ({meaning}); "
                         "pass refresh_lag=1")
    return background, lag


def resolve_distributed(distributed: bool | None, group, rank: int, world_size: int) -> bool:
    """``distributed`` resolved: None means "torch.distributed is on and these are its ranks"."""
    if distributed is None:
        return hbdist.is_distributed(group) and (rank, world_size) == hbdist.get_rank_world(group)
    if distributed and not hbdist.is_distributed(group):
        raise ValueError("distributed=True needs torch.distributed initialised with more "
                         "than one rank (torchrun); pass distributed=False otherwise")
    return bool(distributed)


class RefreshPolicy:
    """Rebuilds a sampler's structure from its embedding source on a schedule.

    Schedule: with ``per_epoch=False`` the structure is rebuilt at every multiple s of
    ``every`` (the paper's t), counted in global steps over the whole run (per rank), so a
    sampler started at any epoch builds the same structure for the same embeddings; ``every``
    None builds once. A structure is known by its key: its refresh step s. With
    ``per_epoch=True`` (GCBS) it is rebuilt for every epoch (``every``: the steps of an
    epoch) and its key is the epoch.

    Pipelined refresh (``lag`` L >= 1): the source is snapshotted (copied) in the training
    loop's thread at step s (step schedule; the new structure comes into use at s + L, steps
    s .. s + L - 1 keep the previous one) or L steps before the end of an epoch (epoch
    schedule; the order of the next epoch). With ``background=True`` the build runs in a
    worker thread (torch products and the numba kernels release the GIL), so the loop only
    waits if a build takes longer than L steps; the batches are the same as with
    ``background=False`` and the same L (the build then runs at once in the calling thread).
    One such build waits for its use at a time (the "next" slot); ``lag`` 0 reads the source
    when the structure is needed.

    Distributed build (``distributed``): ``build`` receives a process group and builds the
    structure sharded across its ranks (:mod:`hardbatch.distributed`), equal to the
    single-process one. A background build uses a process group of its own (created here, a
    collective call), so its collectives never interleave with the training loop's.

    Args:
        source: the embedding source (an [N, d] array or tensor, an EmbeddingBank, a callable).
        first: the construction-time read of a callable source (used by the first read), or None.
        num_items: N; every read must keep N rows.
        prepare: ``prepare(x, copy)``: the build input from a read [N, d] array; ``copy``: a
            snapshot, which must not change with the source while the build runs.
        build: ``build(input, key, group)``: the structure (``group``: a process group when
            distributed, else None).
        save, load: a structure as a dict of tensors for checkpoints, and back (``load``
            returns None when the dict holds none).
        every: steps between refreshes (None: once), or the steps of an epoch with ``per_epoch``.
        lag, background: pipelining (checked by :func:`check_pipelining`).
        distributed, process_group: the resolved ``distributed`` flag and its group.
        threaded: builds that are not pipelined may run in the planner thread (``prefetch``).
    """

    def __init__(self, source: EmbeddingSource, first: np.ndarray | None, num_items: int, *,
                 prepare: Callable[[np.ndarray, bool], object],
                 build: Callable[[object, int, object], Structure],
                 save: Callable[[Structure], dict], load: Callable[[dict], Structure | None],
                 every: int | None, lag: int, background: bool, distributed: bool,
                 process_group=None, per_epoch: bool = False, threaded: bool = False) -> None:
        self.source, self._first, self.num_items = source, first, num_items
        self.prepare, self.build, self.save, self.load = prepare, build, save, load
        self.every, self.lag, self.per_epoch = every, lag, per_epoch
        self.background, self.distributed = background, distributed
        self.process_group, self.threaded = process_group, threaded
        self.build_group = process_group
        if distributed and background:  # a group of the builds' own, created collectively
            ranks = None if process_group is None else \
                torch.distributed.get_process_group_ranks(process_group)
            self.build_group = torch.distributed.new_group(
                ranks=ranks, backend=torch.distributed.get_backend(process_group))
        self.structure: Structure | None = None
        self.key = -1  # key of the structure in use
        self._next: tuple[int, object] | None = None  # (key, structure or its Future)
        self.refreshes = 0
        self.last_refresh_seconds = 0.0
        self._bank_seen: tuple[int, int] | None = None  # (bank.step, sampler step first seen)
        self._init_sync()

    def _init_sync(self) -> None:
        self._lock = threading.Lock()  # the next slot: the loop fills it, a planner may take it
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lock"] = state["_executor"] = None
        if state["_next"] is not None:  # a build still running in the background
            state["_next"] = (state["_next"][0], resolve(state["_next"][1]))
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_sync()

    @property
    def next_key(self) -> int | None:
        """Key of the pipelined build waiting for its use (maybe still building), or None."""
        nxt = self._next
        return None if nxt is None else nxt[0]

    # -- schedule ------------------------------------------------------
    def due(self, global_step: int) -> int:
        """Key of the structure in use at ``global_step``."""
        if self.per_epoch:
            return global_step // self.every
        if self.every is None:
            return 0
        s = global_step - global_step % self.every
        return s if s == 0 or global_step - s >= self.lag else s - self.every

    def _snapshot_key(self, global_step: int) -> int | None:
        """Key of the pipelined build whose source is snapshotted at ``global_step``, if any."""
        if not self.lag:
            return None
        if self.per_epoch:
            ahead = global_step + self.lag
            return ahead // self.every if ahead % self.every == 0 else None
        if self.every is None or global_step == 0 or global_step % self.every:
            return None
        return global_step

    # -- building ------------------------------------------------------
    def read(self, copy: bool, step: int = 0):
        """The build input from the source now (``copy``: a snapshot for a later build);
        ``step``: the sampler's global step (for the warning about a bank not fed)."""
        x = self._first if self._first is not None else read_embeddings(self.source)
        self._first = None
        check_rows(x, self.num_items)
        if isinstance(self.source, EmbeddingBank):
            self._check_bank(self.source, step)
        return self.prepare(x, copy)

    def _check_bank(self, bank: EmbeddingBank, step: int) -> None:
        """Warn (once per refresh) when the bank is not fed (see unwritten_bank_warning)."""
        if self._bank_seen is None or self._bank_seen[0] != bank.step:
            self._bank_seen = (bank.step, step)
        message = unwritten_bank_warning(bank, step - self._bank_seen[1])
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=4)

    def _build(self, x, key: int, group) -> Structure:
        t0 = time.perf_counter()
        structure = self.build(x, key, group)
        self.last_refresh_seconds = time.perf_counter() - t0
        return structure

    def _install(self, key: int, structure: Structure) -> Structure:
        self.structure, self.key = structure, key
        self.refreshes += 1
        return structure

    def refresh(self, key: int) -> Structure:
        """Read the source and build the structure ``key`` now, in this thread, and use it."""
        # With a planner thread (prefetch) builds may run there: use the build group.
        group = (self.build_group if self.threaded else self.process_group) \
            if self.distributed else None
        step = key * self.every if self.per_epoch else key
        return self._install(key, self._build(self.read(copy=False, step=step), key, group))

    def before_step(self, global_step: int) -> None:
        """In the loop's thread, before batch ``global_step``: snapshot and build if scheduled."""
        key = self._snapshot_key(global_step)
        if key is None or key <= self.key or (self._next is not None and key <= self._next[0]):
            return
        x = self.read(copy=True, step=global_step)
        if self.background:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="hardbatch-refresh")
            job = self._executor.submit(self._build, x, key,
                                        self.build_group if self.distributed else None)
        else:
            job = self._build(x, key, self.process_group if self.distributed else None)
        with self._lock:
            self._next = (key, job)

    def ready(self, global_step: int) -> bool:
        """Whether ``global_step`` can be planned now without reading the source: its structure
        is in use or scheduled (a planner reads the source itself only when the loop waits)."""
        due = self.due(global_step)
        nxt = self._next
        return self.key == due or (nxt is not None and nxt[0] == due)

    def use(self, key: int, rebuild: bool = False) -> Structure:
        """The structure ``key``: the one in use, else the next build if it is ``key``'s,
        else built now (``rebuild``: not the one in use). With the epoch schedule, starting an
        epoch also drops a next build of another epoch (it can never be used)."""
        if self.key == key and not rebuild:
            return self.structure
        with self._lock:
            nxt = self._next
            if nxt is not None and (nxt[0] == key or self.per_epoch):
                self._next = None
        if nxt is not None and nxt[0] == key:
            return self._install(key, resolve(nxt[1]))
        return self.refresh(key)

    # -- checkpoints ---------------------------------------------------
    def state_dict(self, current: bool = True) -> dict:
        """The structure in use (if ``current``) and the next build, for a checkpoint.

        Step schedule: the structure's tensors, ``built_step``, ``next`` and ``next_step``;
        epoch schedule: the structure's tensors, ``next_epoch`` and the next structure's
        tensors prefixed ``next_``.
        """
        state = {}
        if current and self.structure is not None:
            state.update(self.save(self.structure))
            if not self.per_epoch:
                state["built_step"] = self.key
        if self._next is not None:  # built from a snapshot that a resume cannot retake
            key, structure = self._next[0], resolve(self._next[1])
            self._next = (key, structure)
            if self.per_epoch:
                state["next_epoch"] = key
                state.update({"next_" + k: v for k, v in self.save(structure).items()})
            else:
                state.update(next=self.save(structure), next_step=key)
        return state

    def load_state_dict(self, state: dict, epoch: int) -> None:
        """Restore :meth:`state_dict` (``epoch``: the key of a saved per-epoch structure)."""
        self.structure, self.key, self._next = None, -1, None
        structure = self.load(state)
        if structure is not None:
            self.structure = structure
            self.key = epoch if self.per_epoch else int(state["built_step"])
        if self.per_epoch and "next_epoch" in state:
            nxt = self.load({k[5:]: v for k, v in state.items()
                             if k.startswith("next_") and k != "next_epoch"})
            self._next = (int(state["next_epoch"]), nxt)
        elif "next" in state:
            self._next = (int(state["next_step"]), self.load(state["next"]))
        if self.structure is not None or self._next is not None:
            self._first = None  # the source is read afresh from now on


def _forwarded(name: str, doc: str) -> property:
    """A read-only sampler attribute that is the refresh policy's ``name``."""
    return property(lambda self: getattr(self.refresh_policy, name), doc=doc)


class RefreshingSampler(PlanSampler):
    """A plan sampler whose batches come from a structure that a :class:`RefreshPolicy`
    (``refresh_policy``, set by the subclass) rebuilds from its embedding source."""

    refresh_policy: RefreshPolicy

    def _on_step(self, global_step: int) -> None:
        # The snapshot of a pipelined refresh is taken here, in the training loop's thread,
        # when batch ``global_step`` is requested, also when a planner thread runs ahead.
        self.refresh_policy.before_step(global_step)

    def _plannable(self, global_step: int) -> bool:
        return self.refresh_policy.ready(global_step)

    source = _forwarded("source", "The embedding source.")
    refresh_lag = _forwarded("lag", "Steps between a snapshot and the use of its structure.")
    background = _forwarded("background", "Whether pipelined builds run in a worker thread.")
    distributed = _forwarded("distributed", "Whether builds are sharded across ranks.")
    process_group = _forwarded("process_group", "The torch.distributed group of the builds.")
    refreshes = _forwarded("refreshes", "Structures built or taken into use so far.")
    last_refresh_seconds = _forwarded(
        "last_refresh_seconds", "Time of the last build (not counting the read of the source).")
