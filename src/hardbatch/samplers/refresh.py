"""Refresh: when and how a sampler rebuilds its structure from an embedding source.

One :class:`RefreshPolicy` serves every sampler that reads embeddings: the proximity-graph
and kNN samplers (a graph or a snapshot, rebuilt every ``refresh_every`` steps) and the
partition samplers (an order, rebuilt every epoch). What is built and checkpointed is the
business of a :class:`Builder`, an object of its own that the sampler composes and injects
into its policy (the sampler draws its batches from what the builder built); the policy reads
the source (once per build, as a torch tensor on the source's device, L2-normalised there with
``normalize``), decides when, and times and logs every build.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .._logging import get_logger
from .._validation import l2_normalize_rows
from ..embeddings import EmbeddingBank, EmbeddingSource, read_embeddings, unwritten_bank_warning
from ..keys.encode import DuplicateKeys

Structure = object  # what a sampler draws batches from: a graph, a snapshot, an order
_log = get_logger("samplers")

# The refresh-cost warning (issue 34): builds that dominate the training loop.
FEW_STEPS = 10  # an exact build at most this many steps apart is "every few steps"
MIN_STEP_COST_S = 0.01  # ... and warned about when it costs this much per step
MIN_BUILD_S = 0.02  # builds shorter than this on average never warn (small data, tests)


class RefreshCostWarning(UserWarning):
    """A sampler's structure rebuilds take more time than the training steps between them."""


@dataclass(frozen=True)
class PlanShape:
    """What a :class:`Builder` knows of its sampler's plan (made by the sampler, once).

    Attributes:
        num_items: N.
        batch_size: B', the plan's batch size (``world_size * batch_size`` with
            ``global_batch``).
        batches: plan batches per epoch.
        drop: items an epoch leaves out (partition samplers with ``drop_last``), else 0.
        seed: the sampler's base seed.
        keys: the encoded ``duplicate_keys``, or None.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> hb.GCBSSampler(np.eye(40, 8), 16, drop_last=True).builder.plan
        PlanShape(num_items=40, batch_size=16, batches=2, drop=8, seed=0, keys=None)
    """

    num_items: int
    batch_size: int
    batches: int
    drop: int
    seed: int
    keys: DuplicateKeys | None


@runtime_checkable
class Builder(Protocol):
    """What a :class:`RefreshPolicy` builds a sampler's structure with: an object of its own,
    one per kind of structure, that the sampler composes and injects into its policy
    (``sampler.refresh_policy.builder``; the built-in ones: the proximity sampler's
    :class:`~hardbatch.samplers.proximity_sampler.ProximityGraphBuilder`, the kNN sampler's
    :class:`~hardbatch.samplers.knn_sampler.SnapshotBuilder`, GCBS's
    :class:`~hardbatch.samplers.gcbs_sampler.GCBSOrderBuilder`, the cluster sampler's
    :class:`~hardbatch.samplers.cluster_sampler.ClusterBuilder` and the community sampler's
    :class:`~hardbatch.samplers.community_sampler.CommunityBuilder`). The sampler draws its
    batches from the structures built.

    * ``build(x, key, group)``: the structure from the embeddings read at refresh ``key`` (the
      refresh step, or the epoch for partition samplers): ``x`` is a float32 ``[N, d]`` tensor
      on the source's device (unit rows with ``normalize``; a pair ``(x, y)`` with a paired
      source), unchecked for NaN / inf (the build checks what it reads); ``group`` is the
      process group of a distributed build, or None;
    * ``save_structure(structure)`` / ``load_structure(state)``: the structure as a dict of
      tensors for checkpoints, and back (None when ``state`` holds none);
    * ``exact_build`` and ``cheaper_build``, its cost estimate: whether a build is an exact,
      quadratic search, and the option that makes builds cheaper, the advice of the policy's
      warning when rebuilds dominate training.

    The policy times every build and logs one INFO record per build (what, key, N, seconds) on
    the ``hardbatch.samplers`` logger.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers import Builder
        >>> sampler = hb.KNNBatchSampler(np.eye(40, 8), 4, refresh_every=None, method="exact")
        >>> builder = sampler.refresh_policy.builder
        >>> isinstance(builder, Builder), type(builder).__name__, builder.exact_build
        (True, 'SnapshotBuilder', True)
        >>> builder.cheaper_build
        "method='faiss-ivf' instead of the exact search"
    """

    exact_build: bool
    cheaper_build: str

    def build(self, x, key: int, group) -> Structure: ...

    def save_structure(self, structure: Structure) -> dict: ...

    def load_structure(self, state: dict) -> Structure | None: ...


def _check_rows(x, num_items: int, name: str = "embedding source") -> None:
    """``ValueError`` unless a re-read source still has one row per item."""
    if x.shape[0] != num_items:
        raise ValueError(f"the {name} now has {x.shape[0]} items, the sampler was built for "
                         f"{num_items}; a source must keep one row per item for the sampler's "
                         "lifetime (construct a new sampler for a different set of items)")


def _resolve(structure):
    """A built structure, waiting for it if it is still being built in the background."""
    return structure.result() if isinstance(structure, concurrent.futures.Future) else structure


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

    Distributed build (``distributed``): ``builder.build`` receives a process group and builds
    the structure sharded across its ranks (:mod:`hardbatch.distributed`), equal to the
    single-process one. A background build uses a process group of its own (created here, a
    collective call), so its collectives never interleave with the training loop's.

    Args:
        source: the embedding source (an [N, d] array or tensor, an EmbeddingBank, a callable).
        builder: the :class:`Builder` that builds, saves and loads the structure (None until
            its sampler injects it, ``policy.builder = ...``, before the first build).
        num_items: N; every read must keep N rows.
        name: what the build records and the cost warning name (the sampler's class; None:
            the builder's).
        first: the construction-time read of a callable source (used by the first read), or None.
        paired: a second source read with the first (GCBS's ``paired``): builds get ``(x, y)``.
        normalize: L2-normalise the rows read (on the source's device; the result is a copy).
        every: steps between refreshes (None: once), or the steps of an epoch with ``per_epoch``.
        lag, background: pipelining (steps between a snapshot and its use; a worker thread).
        distributed, process_group: the resolved ``distributed`` flag and its group.
        threaded: builds that are not pipelined may run in the prefetch thread (``prefetch``).
        offers_background: whether the sampler takes ``background=`` (the cost warning
            advises it only then).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> sampler = hb.KNNBatchSampler(np.eye(40, 8), 4, refresh_every=3)
        >>> policy = sampler.refresh_policy
        >>> [policy.due(step) for step in range(7)], policy.refreshes
        ([0, 0, 0, 3, 3, 3, 6], 0)
        >>> _ = list(sampler)
        >>> policy.refreshes, policy.key
        (4, 9)
    """

    def __init__(self, source: EmbeddingSource, builder: Builder | None, num_items: int, *,
                 name: str | None = None, first: torch.Tensor | None = None,
                 paired: EmbeddingSource | None = None, normalize: bool = False,
                 every: int | None, lag: int, background: bool, distributed: bool,
                 process_group=None, per_epoch: bool = False, threaded: bool = False,
                 offers_background: bool = True) -> None:
        self.source, self.builder, self.num_items = source, builder, num_items
        self.offers_background = offers_background  # the sampler takes background= (advice)
        self.name = name
        self._first, self.paired, self.normalize = first, paired, normalize
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
        # the cost watch: loop seconds between consecutive steps, build seconds (all builds, and
        # those the loop waited for), builds, whether the one warning was given
        self._tick: tuple[int, float] | None = None
        self._cost = {"loop": 0.0, "build": 0.0, "waited": 0.0, "builds": 0, "warned": False}
        self._init_sync()

    def _init_sync(self) -> None:
        self._lock = threading.Lock()  # the next slot: the loop fills it, a prefetch may take it
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lock"] = state["_executor"] = None
        if state["_next"] is not None:  # a build still running in the background
            state["_next"] = (state["_next"][0], _resolve(state["_next"][1]))
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
        """The build input: the source's rows now, as a tensor on its device (normalised with
        ``normalize``; ``copy``: a snapshot that later writes to the source leave alone);
        ``step``: the sampler's global step (for the warning about a bank not fed)."""
        x = self._first if self._first is not None else read_embeddings(self.source, finite=False)
        self._first = None
        _check_rows(x, self.num_items)
        if isinstance(self.source, EmbeddingBank):
            self._check_bank(self.source, step)
        if self.normalize:
            x = l2_normalize_rows(x)  # a new tensor, so also a snapshot
        elif copy:
            x = x.clone()
        if self.paired is None:
            return x
        y = read_embeddings(self.paired, "paired", finite=False)
        _check_rows(y, self.num_items, "paired source")
        return x, (y.clone() if copy else y)

    def _check_bank(self, bank: EmbeddingBank, step: int) -> None:
        """Warn (once per refresh) when the bank is not fed (see unwritten_bank_warning)."""
        if self._bank_seen is None or self._bank_seen[0] != bank.step:
            self._bank_seen = (bank.step, step)
        message = unwritten_bank_warning(bank, step - self._bank_seen[1])
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=4)

    def _build(self, x, key: int, group, waited: bool = True) -> Structure:
        t0 = time.perf_counter()
        structure = self.builder.build(x, key, group)
        self.last_refresh_seconds = seconds = time.perf_counter() - t0
        what = self.name or type(self.builder).__name__
        _log.info("%s build (%s %s): N=%d, seconds=%.3f", what,
                  "epoch" if self.per_epoch else "refresh step", key, self.num_items, seconds,
                  extra={"build": what, "key": key, "n": self.num_items, "seconds": seconds})
        self._watch_cost(seconds, waited)
        return structure

    def _watch_cost(self, seconds: float, waited: bool) -> None:
        """Warn once when rebuilds dominate training: an exact build every few steps costing
        more than ``MIN_STEP_COST_S`` per step (at the first build), or builds taking more time
        than the training steps between them (measured from the second build on). A builder
        over fixed embeddings (``builder.fixed``: its groups are built once and reused) is not
        watched: its one costly build is not a rebuild to make rarer."""
        cost = self._cost
        past, past_waited = cost["build"], cost["waited"]
        cost["builds"] += 1
        cost["build"] += seconds
        cost["waited"] += seconds if waited else 0.0
        if cost["warned"] or self.every is None or getattr(self.builder, "fixed", False):
            return
        builder, every = self.builder, self.every
        exact = bool(builder.exact_build)
        if cost["builds"] == 1:
            if not (exact and every <= FEW_STEPS and seconds >= MIN_BUILD_S
                    and seconds / every >= MIN_STEP_COST_S):
                return
            found = (f"its first build took {seconds:.3g} s and it rebuilds every {every} "
                     f"steps: about {1e3 * seconds / every:.0f} ms of building per step")
            suggest = max(100, 10 * every)
        else:
            training = max(cost["loop"] - past_waited, 0.0)  # loop time less the builds it waited
            if past <= training or past < MIN_BUILD_S * (cost["builds"] - 1):
                return
            share = past / (past + training)
            found = (f"its {cost['builds'] - 1} builds so far took {past:.3g} s (the last "
                     f"{seconds:.3g} s, every {every} steps) against {training:.3g} s for the "
                     f"rest of the loop: building is about {share:.0%} of the run")
            suggest = every * min(1000, max(2, math.ceil(4 * past / max(training, 1e-3))))
        cost["warned"] = True
        what = self.name or type(builder).__name__
        steps = "every epoch" if self.per_epoch else f"every refresh_every={every} steps"
        fixes = [] if self.per_epoch else [f"raise refresh_every (e.g. refresh_every={suggest})"]
        fixes += [f"use {builder.cheaper_build}"] if builder.cheaper_build else []
        fixes += ["background=True (with refresh_lag) to build in a worker thread off the "
                  "training loop"] if self.offers_background and not self.background else []
        advice = f" To change it: {', or '.join(fixes)}" if fixes else ""
        warnings.warn(
            f"{what}: rebuilding its structure from the embeddings dominates training: {found} "
            f"({self.num_items} items, a rebuild {steps}).{advice}", RefreshCostWarning,
            stacklevel=2)

    def _install(self, key: int, structure: Structure) -> Structure:
        self.structure, self.key = structure, key
        self.refreshes += 1
        return structure

    def refresh(self, key: int) -> Structure:
        """Read the source and build the structure ``key`` now, in this thread, and use it."""
        # With a prefetch thread builds may run there: use the build group.
        group = (self.build_group if self.threaded else self.process_group) \
            if self.distributed else None
        step = key * self.every if self.per_epoch else key
        return self._install(key, self._build(self.read(copy=False, step=step), key, group))

    def before_step(self, global_step: int) -> None:
        """In the loop's thread, before batch ``global_step``: snapshot and build if scheduled."""
        now = time.perf_counter()
        if self._tick is not None and global_step == self._tick[0] + 1:
            self._cost["loop"] += now - self._tick[1]  # a step of the loop (and its builds)
        self._tick = (global_step, now)
        key = self._snapshot_key(global_step)
        if key is None or key <= self.key or (self._next is not None and key <= self._next[0]):
            return
        x = self.read(copy=True, step=global_step)
        if self.background:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="hardbatch-refresh")
            job = self._executor.submit(self._build, x, key,
                                        self.build_group if self.distributed else None, False)
        else:
            job = self._build(x, key, self.process_group if self.distributed else None)
        with self._lock:
            self._next = (key, job)

    def ready(self, global_step: int) -> bool:
        """Whether ``global_step`` can be planned now without reading the source: its structure
        is in use or scheduled (a prefetch thread reads the source only when the loop waits)."""
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
            return self._install(key, _resolve(nxt[1]))
        return self.refresh(key)

    # -- checkpoints ---------------------------------------------------
    def state_dict(self, current: bool = True) -> dict:
        """The structure in use (if ``current``) and the next build, for a checkpoint.

        Step schedule: the structure's tensors, ``built_step``, ``next`` and ``next_step``;
        epoch schedule: the structure's tensors, ``next_epoch`` and the next structure's
        tensors prefixed ``next_``.
        """
        save = self.builder.save_structure
        state = {}
        if current and self.structure is not None:
            state.update(save(self.structure))
            if not self.per_epoch:
                state["built_step"] = self.key
        if self._next is not None:  # built from a snapshot that a resume cannot retake
            key, structure = self._next[0], _resolve(self._next[1])
            self._next = (key, structure)
            if self.per_epoch:
                state["next_epoch"] = key
                state.update({"next_" + k: v for k, v in save(structure).items()})
            else:
                state.update(next=save(structure), next_step=key)
        return state

    def load_state_dict(self, state: dict, epoch: int) -> None:
        """Restore :meth:`state_dict` (``epoch``: the key of a saved per-epoch structure)."""
        load = self.builder.load_structure
        self.structure, self.key, self._next = None, -1, None
        structure = load(state)
        if structure is not None:
            self.structure = structure
            self.key = epoch if self.per_epoch else int(state["built_step"])
        if self.per_epoch and "next_epoch" in state:
            nxt = load({k[5:]: v for k, v in state.items()
                        if k.startswith("next_") and k != "next_epoch"})
            self._next = (int(state["next_epoch"]), nxt)
        elif "next" in state:
            self._next = (int(state["next_step"]), load(state["next"]))
        if self.structure is not None or self._next is not None:
            self._first = None  # the source is read afresh from now on
