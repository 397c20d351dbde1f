"""Batch samplers: ``DataLoader(dataset, batch_sampler=sampler)`` yields ``list[int]`` batches.

Every sampler here shares one contract:

* An epoch is ``ceil(N / B)`` batches (``floor`` with ``drop_last=True``),
  the same number of steps as uniform sampling, so comparisons are
  step-for-step fair. Uniform and GCBS partition the items (the last batch
  may be short); walk samplers always return B distinct items and draw
  their start nodes from items not yet seen this epoch (``coverage``).
* ``set_epoch(epoch)`` selects the epoch (iteration also advances it by one
  when an epoch completes); the same seed, epoch and rank give the same
  batches on any machine (given the same embeddings).
* ``state_dict()`` / ``load_state_dict()``: resuming mid-epoch yields exactly
  the remaining batches. With a prefetching ``DataLoader`` pass
  ``state_dict(consumed=steps_done_this_epoch)``. The state of any rank resumes
  every rank (it holds the pending batches of all ranks).
* Distributed: ``rank`` / ``world_size`` default to torch.distributed's when
  it is initialised. All ranks compute the same global plan of
  ``ceil(ceil(N/B) / W) * W`` batches (padded with extra batches, like
  ``DistributedSampler``) and rank r takes batches r, r + W, r + 2W, ...
* Bad input raises ``ValueError`` naming the parameter and the fix.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Sampler

from . import _rng
from . import distributed as hbdist
from ._validation import check_int, num_items_of
from .embeddings import EmbeddingSource, read_embeddings, source_num_items
from .gcbs import check_search_args, gcbs_permutation
from ._device import check_precision, resolve_device
from .graph import check_graph_sizes, check_group_size, knn_graph, proximity_graph
from .schedules import LinearDecay
from .walks import WALKS, WalkState, check_restart, default_patience, prepare_graph

__all__ = ["GCBSSampler", "KNNBatchSampler", "ProximityGraphSampler", "UniformBatchSampler"]

_LOOKBACK = 1024  # batches kept so that state_dict(consumed=...) can rewind a prefetching loader


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    world_size = check_int(world_size, "world_size", low=1)
    rank = check_int(rank, "rank", low=0)
    if rank >= world_size:
        raise ValueError(f"rank={rank} must be smaller than world_size={world_size}")
    return rank, world_size


def _resolve_distributed(distributed: bool | None, group, rank: int, world_size: int) -> bool:
    """``distributed`` resolved: None means "torch.distributed is on and these are its ranks"."""
    if distributed is None:
        return hbdist.is_distributed(group) and (rank, world_size) == hbdist.get_rank_world(group)
    if distributed and not hbdist.is_distributed(group):
        raise ValueError("distributed=True needs torch.distributed initialised with more "
                         "than one rank (torchrun); pass distributed=False otherwise")
    return bool(distributed)


def _build_group_for(distributed: bool, background: bool, process_group):
    """The process group of background builds: a group of their own, so that their collectives
    never interleave with the training loop's (created collectively, at construction)."""
    if not (distributed and background):
        return process_group
    ranks = None if process_group is None else \
        torch.distributed.get_process_group_ranks(process_group)
    return torch.distributed.new_group(ranks=ranks,
                                       backend=torch.distributed.get_backend(process_group))


def _check_pipelining(background: bool, refresh_lag: int | None, meaning: str) -> tuple[bool, int]:
    """(background, refresh_lag) checked: the lag defaults to 1 with ``background``, else 0."""
    background = bool(background)
    lag = check_int((1 if background else 0) if refresh_lag is None else refresh_lag,
                    "refresh_lag", low=0)
    if background and lag == 0:
        raise ValueError(f"background=True needs refresh_lag >= 1 ({meaning}); "
                         "pass refresh_lag=1")
    return background, lag


def _check_rows(x: np.ndarray, num_items: int, name: str = "embedding source") -> None:
    """``ValueError`` unless a re-read source still has one row per item."""
    if x.shape[0] != num_items:
        raise ValueError(f"the {name} now has {x.shape[0]} items, the sampler was built for "
                         f"{num_items}; a source must keep one row per item for the sampler's "
                         "lifetime (construct a new sampler for a different set of items)")


def _resolve(structure):
    """A built structure, waiting for it if it is still being built in the background."""
    if isinstance(structure, concurrent.futures.Future):
        return structure.result()
    return structure


class _PlanRun:
    """One iteration's planner thread (``prefetch`` > 0) and its queue of planned steps.

    Every ``__iter__`` gets its own: an abandoned iterator (a DataLoader iterator
    replaced by a new one) stops only its own planner, never the next one's.
    """

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()  # plans of whole steps (W batches)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.stop = False

    def __getstate__(self) -> dict:  # a copy never runs: keep what was planned
        return {"queue": collections.deque(self.queue), "thread": None, "error": None,
                "stop": True}


class _PlanSampler(Sampler[list[int]]):
    """Base: a global per-epoch plan of batches, generated in order, split across ranks.

    Every rank generates all W batches of each of its steps (the plan is global), so
    the batches planned or yielded but not yet trained on are kept as whole steps: a
    checkpoint of any rank holds them for every rank.
    """

    _settings = ("num_items", "batch_size", "world_size", "seed", "drop_last")

    def __init__(self, num_items: int, batch_size: int, *, drop_last: bool, seed: int,
                 rank: int | None, world_size: int | None, prefetch: int = 0) -> None:
        self.num_items = num_items
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        if self.batch_size > num_items:
            raise ValueError(f"batch_size={batch_size} is larger than the number of items "
                             f"N={num_items}; use batch_size <= N")
        self.drop_last = bool(drop_last)
        self.seed = check_int(seed, "seed")
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        if len(self) == 0:  # only with drop_last: fewer full batches than ranks
            fix = (f"use batch_size <= N // world_size = {num_items // self.world_size} or "
                   if num_items >= self.world_size else "")
            raise ValueError(
                f"drop_last=True leaves {self.batches_per_epoch} full batch(es) of batch_size="
                f"{self.batch_size} for world_size={self.world_size} ranks, so every rank would "
                f"get no batch; {fix}pass drop_last=False")
        self.epoch = 0
        self.sampler_seconds = 0.0  # time spent planning batches (graphs, walks)
        self._pending: list[list] = []  # steps (W batches each) to replay after load_state_dict
        self._start_step = 0
        self._recent: collections.deque = collections.deque(maxlen=_LOOKBACK)  # steps yielded
        self._replay: collections.deque = collections.deque()  # loaded steps not yet replayed
        self._yielded = 0
        self._active = False
        self._generation = 0  # counts iterations; an iterator older than the newest is stale
        self.prefetch = check_int(prefetch, "prefetch", low=0)
        self._run: _PlanRun | None = None  # the newest iteration's planner (prefetch > 0)
        self._next: tuple | None = None  # a build for later use: (key, result or its Future)
        self._init_sync()

    def _init_sync(self) -> None:
        # Planner thread (prefetch > 0): it generates steps into its run's queue; the training
        # loop's thread only takes them and marks its progress (``_consumer_step``).
        # Lock order: _plan_lock (held while a step is generated), then _cv.
        self._cv = threading.Condition()
        self._plan_lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._consumer_step = -1

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_cv", "_plan_lock", "_executor"):
            state[key] = None
        if state.get("_next") is not None:  # a build still running in the background
            state["_next"] = (state["_next"][0], _resolve(state["_next"][1]))
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_sync()

    # -- plan geometry -------------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        """Global batches in one epoch: ceil(N/B), or floor with drop_last."""
        if self.drop_last:
            return self.num_items // self.batch_size
        return -(-self.num_items // self.batch_size)

    def __len__(self) -> int:
        total = self.batches_per_epoch
        if self.drop_last:
            return total // self.world_size
        return -(-total // self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s plan on the next iteration (forgets a mid-epoch resume of another epoch)."""
        epoch = check_int(epoch, "epoch", low=0)
        if epoch != self.epoch:
            self._pending, self._start_step = [], 0
        self.epoch = epoch

    # -- subclass hooks ------------------------------------------------
    def _begin_epoch(self, fresh: bool) -> None:
        """Prepare the epoch's plan; ``fresh`` is False when resuming from a loaded state."""

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        """Global plan batch ``index`` of the current epoch (called for every index, in order)."""
        raise NotImplementedError

    def _generator_state(self, mid_epoch: bool) -> dict:
        """What it takes to continue the plan exactly (the walk state, the current graph, ...)."""
        return {}

    def _load_generator_state(self, state: dict) -> None:
        pass

    def _before_step(self, global_step: int) -> None:
        """Called in the training loop's thread just before batch ``global_step`` is handed out."""
        with self._cv:
            self._consumer_step = global_step
            self._cv.notify_all()

    def _submit(self, fn, *args):
        """Run ``fn(*args)`` in the background build thread; returns its Future."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="hardbatch-refresh")
        return self._executor.submit(fn, *args)

    def _ready(self, global_step: int) -> bool:
        """Whether the planner thread may generate ``global_step`` now (called under ``_cv``)."""
        return True

    # -- iteration -----------------------------------------------------
    def _plan_step(self, step: int, steps: int) -> list[np.ndarray]:
        """All W global batches of local step ``step`` (plan batches step*W .. step*W + W - 1)."""
        w = self.world_size
        return [self._generate(j, self.epoch * steps + step) for j in range(step * w, step * w + w)]

    def __iter__(self) -> Iterator[list[int]]:
        # A new iteration supersedes any earlier one: stop its planner before the plan moves.
        self._stop_planner(self._run)
        self._generation += 1
        generation = self._generation
        steps = len(self)
        self._begin_epoch(fresh=not (self._pending or self._start_step > 0))
        start = self._start_step
        self._replay = collections.deque(self._pending)
        self._pending, self._start_step = [], 0
        self._recent.clear()
        self._run = None
        with self._cv:
            self._consumer_step = -1
        self._active = True
        base = self.epoch * steps
        step = start
        replay = self._replay  # this iteration's (state_dict reads it)
        while replay:
            self._before_step(base + step)
            plan = replay.popleft()
            self._recent.append(plan)
            self._yielded = step + 1
            yield plan[self.rank].tolist()
            step += 1
        run = self._start_planner(step, steps) if self.prefetch and step < steps else None
        try:
            while step < steps:
                t0 = time.perf_counter()
                if run is not None and self._generation != generation:
                    raise RuntimeError("this iterator was superseded by a newer iteration of the "
                                       "sampler (e.g. a new DataLoader iterator), which stopped "
                                       "its planner thread; iterate the newest one")
                self._before_step(base + step)
                plan = self._take_planned(run) if run is not None else self._plan_step(step, steps)
                self.sampler_seconds += time.perf_counter() - t0
                self._recent.append(plan)
                self._yielded = step + 1
                yield plan[self.rank].tolist()
                step += 1
        finally:
            self._stop_planner(run)  # this iteration's planner only
        self._active = False
        self.epoch += 1

    # -- background planning (prefetch > 0) ----------------------------
    def _start_planner(self, step: int, steps: int) -> _PlanRun:
        run = _PlanRun()
        run.thread = threading.Thread(target=self._plan_loop, args=(run, step, steps),
                                      name="hardbatch-planner", daemon=True)
        self._run = run
        run.thread.start()
        return run

    def _plan_loop(self, run: _PlanRun, step: int, steps: int) -> None:
        try:
            base = self.epoch * steps
            for s in range(step, steps):
                with self._cv:
                    while not run.stop and (
                            len(run.queue) >= self.prefetch or not self._ready(base + s)):
                        self._cv.wait(0.5)
                    if run.stop:
                        return
                with self._plan_lock:
                    if run.stop:  # superseded while waiting for the lock: leave the plan be
                        return
                    plan = self._plan_step(s, steps)
                    with self._cv:
                        run.queue.append(plan)
                        self._cv.notify_all()
        except BaseException as err:  # handed to the training loop by _take_planned
            with self._cv:
                run.error = err
                self._cv.notify_all()

    def _take_planned(self, run: _PlanRun) -> list[np.ndarray]:
        with self._cv:
            while not run.queue:
                if run.error is not None:
                    raise run.error
                if run.thread is None or not run.thread.is_alive():
                    raise RuntimeError("the batch planner thread stopped unexpectedly")
                self._cv.wait(0.5)
            plan = run.queue.popleft()
            self._cv.notify_all()
            return plan

    def _stop_planner(self, run: _PlanRun | None) -> None:
        """Stop ``run``'s planner thread (if any) and wait for it; its queue is kept."""
        if run is None or run.thread is None:
            return
        with self._cv:
            run.stop = True
            self._cv.notify_all()
        run.thread.join()
        run.thread = None

    # -- checkpointing -------------------------------------------------
    def state_dict(self, consumed: int | None = None) -> dict:
        """Sampler state after ``consumed`` batches of the current epoch (default: all yielded).

        ``consumed`` may lag the batches already yielded by up to 1024 (a
        prefetching loader); those batches are replayed after loading. The
        state holds them for every rank (as whole plan steps), so the state of
        any one rank resumes every rank.
        """
        with self._plan_lock:  # the planner thread (prefetch) is between steps
            return self._state_dict(consumed)

    def _state_dict(self, consumed: int | None) -> dict:
        yielded = self._yielded if self._active else 0
        consumed = yielded if consumed is None else check_int(consumed, "consumed", low=0)
        if consumed > yielded or yielded - consumed > len(self._recent):
            raise ValueError(f"consumed={consumed} must be between {yielded - len(self._recent)} "
                             f"and the {yielded} batches yielded this epoch")
        lag = yielded - consumed
        steps = list(self._recent)[len(self._recent) - lag:] if lag else []
        with self._cv:
            planned = list(self._run.queue) if self._active and self._run is not None else []
        # then the loaded steps not replayed yet and those planned ahead by the planner thread
        planned = (list(self._replay) if self._active else []) + planned
        steps += planned
        state = {key: getattr(self, key) for key in self._settings}
        state.update(epoch=self.epoch, step=consumed, rank=self.rank,
                     generator=self._generator_state(
                         mid_epoch=bool(self._active and (yielded or planned))))
        if all(b is not None for plan in steps for b in plan):
            # Plan batches consumed*W, consumed*W + 1, ...: rank r replays those = r (mod W).
            state["pending_plan"] = [torch.from_numpy(np.array(b, np.int64))
                                     for plan in steps for b in plan]
        else:  # replaying a checkpoint of an older version, which held this rank's batches only
            state["pending"] = [torch.from_numpy(np.array(plan[self.rank], np.int64))
                                for plan in steps]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields exactly the remaining batches of the saved epoch.

        A state saved on any rank resumes any rank (same world size).
        """
        for key in self._settings:
            if key not in state:  # saved before this setting was recorded
                continue
            if state[key] != getattr(self, key):
                raise ValueError(f"state was saved with {key}={state[key]} but this sampler has "
                                 f"{key}={getattr(self, key)}; construct it with the same value")
        w = self.world_size
        if "pending_plan" in state:
            flat = [np.asarray(b, dtype=np.int64) for b in state["pending_plan"]]
            if len(flat) % w:
                raise ValueError(f"state['pending_plan'] holds {len(flat)} batches, not whole "
                                 f"steps of world_size={w}; pass a state from state_dict()")
            pending = [flat[i:i + w] for i in range(0, len(flat), w)]
        else:  # this rank's batches only (saved by an older version, or replaying one)
            saved = state.get("rank")
            if saved is not None and saved != self.rank and len(state["pending"]):
                raise ValueError(
                    f"state holds the pending batches of rank {saved} only but this sampler has "
                    f"rank={self.rank}; load the state_dict() that rank {self.rank} saved")
            pending = [[np.asarray(b, dtype=np.int64) if r == self.rank else None
                        for r in range(w)] for b in state["pending"]]
        self._stop_planner(self._run)  # a running iteration is superseded by the loaded state
        self.epoch = int(state["epoch"])
        self._pending = pending
        self._start_step = int(state["step"])
        self._load_generator_state(state["generator"])


class UniformBatchSampler(_PlanSampler):
    """Uniform sampling without replacement: a fresh random permutation each epoch, cut into batches.

    Args:
        n_or_dataset: number of items N or a sized dataset.
        batch_size: B.
        drop_last: drop the last short batch.
        seed: base seed; the permutation depends on (seed, epoch) only.
        rank, world_size: distributed split (defaults from torch.distributed).
    """

    def __init__(self, n_or_dataset, batch_size: int, *, drop_last: bool = False, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__(num_items_of(n_or_dataset), batch_size, drop_last=drop_last, seed=seed,
                         rank=rank, world_size=world_size)

    def _begin_epoch(self, fresh: bool) -> None:
        self._order = _rng.permutation(self.num_items, _rng.derive_seed(self.seed, self.epoch, 1))

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        index %= self.batches_per_epoch
        return self._order[index * self.batch_size:(index + 1) * self.batch_size]

    @property
    def coverage(self) -> float:
        return 1.0


class GCBSSampler(_PlanSampler):
    """Global Contrastive Batch Sampling: each epoch, batches cut from a GCBS permutation.

    At the start of every epoch the embedding source is read and
    :func:`hardbatch.gcbs_permutation` orders the items; batches are
    consecutive slices of that order (gcbs paper, Appendix F).

    Args:
        embeddings: [N, d] tensor/array, an :class:`EmbeddingBank`, or a callable returning one.
        batch_size: B.
        quantile: sparsification quantile (paper: 0.999).
        paired: the Y side of paired data (same kinds as ``embeddings``), or None.
        method: ``"exact"``, ``"ivf"``, ``"faiss"`` or ``"partition"`` (see gcbs_permutation).
        nlist, nprobe, partitions: options of those methods.
        shuffle_batches: visit the batches in random order (default False: the
            paper's sequential order).
        device, precision: where and in which precision the similarity products run
            (see :func:`hardbatch.gcbs_permutation`).
        refresh_lag: L >= 1 pipelines the epochs: the order of epoch e + 1 is built from
            the embeddings snapshotted L steps before the end of epoch e (default 0: read
            at the start of the epoch; 1 with ``background``).
        background: build that order in a worker thread while epoch e finishes, so the
            training loop does not wait for it at the epoch boundary; the same batches as
            ``background=False`` with the same ``refresh_lag``.
        distributed: share the pair search across the ranks of ``process_group``
            (:func:`hardbatch.distributed.gcbs_permutation`; the same order as one
            process). None (default): on when torch.distributed is initialised and
            ``rank`` / ``world_size`` are its own.
        drop_last: drop N mod B items each epoch so that every batch is full: a
            seeded random choice of positions of the epoch's order (its tail holds the
            items without any strong pair, which would otherwise be dropped every epoch).
        seed, rank, world_size: as in every sampler.
    """

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, quantile: float = 0.999, *,
                 paired: EmbeddingSource | None = None,
                 method: Literal["exact", "ivf", "faiss", "partition"] = "exact",
                 shuffle_batches: bool = False, drop_last: bool = False, seed: int = 0,
                 nlist: int | None = None, nprobe: int = 8, partitions: int | None = None,
                 device: str | torch.device | None = None,
                 precision: Literal["fp32", "bf16", "fp16"] = "fp32",
                 refresh_lag: int | None = None, background: bool = False,
                 distributed: bool | None = None, process_group=None,
                 rank: int | None = None, world_size: int | None = None) -> None:
        n, self._first = source_num_items(embeddings)
        super().__init__(n, batch_size, drop_last=drop_last, seed=seed, rank=rank,
                         world_size=world_size)
        self.background, self.refresh_lag = _check_pipelining(
            background, refresh_lag, "steps before the end of an epoch at which the next "
            "epoch's order is snapshotted")
        if self.refresh_lag > len(self):
            raise ValueError(f"refresh_lag={self.refresh_lag} must be at most the {len(self)} "
                             "steps of an epoch")
        self.device = resolve_device(device)
        check_precision(precision)
        self.precision = precision
        self.process_group = process_group
        self.distributed = _resolve_distributed(distributed, process_group, self.rank,
                                                self.world_size)
        self._build_group = _build_group_for(self.distributed, self.background, process_group)
        if not 0.0 < float(quantile) < 1.0:
            raise ValueError(f"quantile={quantile} must lie strictly between 0 and 1")
        if method not in ("exact", "ivf", "faiss", "partition"):
            raise ValueError(f"method={method!r} must be 'exact', 'ivf', 'faiss' or 'partition'")
        if paired is not None and not callable(paired):  # a callable is checked when read
            n_paired, _ = source_num_items(paired, "paired")
            if n_paired != n:
                raise ValueError(f"paired has {n_paired} rows but embeddings has N={n}; "
                                 "paired data needs one row of Y per row of X")
        self.partitions = partitions
        self.source, self.paired = embeddings, paired
        self.quantile, self.method = float(quantile), method
        self.shuffle_batches = bool(shuffle_batches)
        self.nlist, self.nprobe = check_search_args(nlist, nprobe)
        self._order: np.ndarray | None = None
        self._batch_order: np.ndarray | None = None
        self.last_refresh_seconds = 0.0

    def _snapshot(self, copy: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """The embeddings now (a copy when the source may change before they are used)."""
        x = self._first if self._first is not None else read_embeddings(self.source)
        self._first = None
        _check_rows(x, self.num_items)
        y = None if self.paired is None else read_embeddings(self.paired, "paired")
        if y is not None:
            _check_rows(y, self.num_items, "paired source")
        if copy:
            x, y = np.array(x, np.float32), None if y is None else np.array(y, np.float32)
        return x, y

    def _build_order(self, x: np.ndarray, y: np.ndarray | None, epoch: int,
                     group) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s item order and batch order, from embeddings ``x`` (and ``y``)."""
        t0 = time.perf_counter()
        build = hbdist.gcbs_permutation if self.distributed else gcbs_permutation
        kw = {"group": group} if self.distributed else {}
        perm = build(x, self.quantile, y, method=self.method,
                     seed=_rng.derive_seed(self.seed, epoch) & 0x7FFFFFFF,
                     nlist=self.nlist, nprobe=self.nprobe, partitions=self.partitions,
                     device=self.device, precision=self.precision, **kw)
        perm = perm.numpy()
        extra = self.num_items % self.batch_size if self.drop_last else 0
        if extra:  # dropped: a random choice of positions, not always the order's tail
            drop = _rng.permutation(self.num_items, _rng.derive_seed(self.seed, epoch, 3))
            perm = np.delete(perm, drop[:extra])
        nb = self.batches_per_epoch
        batch_order = (_rng.permutation(nb, _rng.derive_seed(self.seed, epoch, 2))
                       if self.shuffle_batches else np.arange(nb))
        self.last_refresh_seconds = time.perf_counter() - t0
        return perm, batch_order

    def _before_step(self, global_step: int) -> None:
        super()._before_step(global_step)
        steps = len(self)
        epoch = (global_step + self.refresh_lag) // steps  # the next epoch
        if self.refresh_lag and (global_step + self.refresh_lag) % steps == 0 and not (
                self._next is not None and self._next[0] == epoch):
            x, y = self._snapshot(copy=True)
            if self.background:
                job = self._submit(self._build_order, x, y, epoch, self._build_group)
            else:
                job = self._build_order(x, y, epoch, self.process_group)
            self._next = (epoch, job)

    def _begin_epoch(self, fresh: bool) -> None:
        if not fresh and self._order is not None:
            return
        t0 = time.perf_counter()
        if self._next is not None and self._next[0] == self.epoch:
            self._order, self._batch_order = _resolve(self._next[1])
        else:  # the first epoch, or refresh_lag=0: the embeddings as they are now
            x, y = self._snapshot(copy=False)
            self._order, self._batch_order = self._build_order(x, y, self.epoch,
                                                               self.process_group)
        self._next = None
        self.sampler_seconds += time.perf_counter() - t0

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        b = int(self._batch_order[index % self.batches_per_epoch])
        return self._order[b * self.batch_size:(b + 1) * self.batch_size]

    def _generator_state(self, mid_epoch: bool) -> dict:
        state = {}
        if mid_epoch:
            state = {"order": torch.from_numpy(self._order.copy()),
                     "batch_order": torch.from_numpy(self._batch_order.copy())}
        if self._next is not None:  # built from a snapshot that a resume cannot retake
            order, batch_order = _resolve(self._next[1])
            state.update(next_epoch=self._next[0], next_order=torch.from_numpy(order),
                         next_batch_order=torch.from_numpy(batch_order))
        return state

    def _load_generator_state(self, state: dict) -> None:
        self._order = self._batch_order = self._next = None
        if "order" in state:
            self._order = np.asarray(state["order"], np.int64)
            self._batch_order = np.asarray(state["batch_order"], np.int64)
        if "next_order" in state:
            self._next = (int(state["next_epoch"]),
                                (np.asarray(state["next_order"], np.int64),
                                 np.asarray(state["next_batch_order"], np.int64)))

    @property
    def coverage(self) -> float:
        return 1.0


class _RefreshingSampler(_PlanSampler):
    """Base of samplers that rebuild a structure (a graph, an embedding snapshot) from a source.

    The structure in use at step s is the one scheduled at the last multiple of
    ``refresh_every`` (counted over the whole run, per rank), so a sampler
    started at any epoch builds the same structure for the same embeddings.
    Start nodes / anchors come from a per-epoch :class:`WalkState`.

    Pipelined refresh (``refresh_lag`` L >= 1): at a refresh step s > 0 the
    source is snapshotted (copied) and the new structure built from that
    snapshot comes into use at step s + L; steps s .. s + L - 1 still use the
    previous one. With ``background=True`` the build runs in a worker thread
    (torch products and the numba kernels release the GIL), so the training
    loop only waits if a build takes longer than L steps; the batches are the
    same as with ``background=False`` and the same L (the build then simply
    runs at step s in the calling thread).

    Distributed build (``distributed``): the rows of the graph are built in
    shards, one per rank, and all-gathered (:mod:`hardbatch.distributed`); the
    graph equals the single-process one. A background build uses a process
    group of its own (created at construction, a collective call), so its
    collectives never interleave with the training loop's.
    """

    _settings = _PlanSampler._settings + ("refresh_every",)

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, *,
                 refresh_every: int | None, drop_last: bool, seed: int, normalize: bool,
                 rank: int | None, world_size: int | None, refresh_lag: int | None = None,
                 background: bool = False, distributed: bool | None = None,
                 process_group=None, prefetch: int = 0) -> None:
        n, self._first = source_num_items(embeddings)
        super().__init__(n, batch_size, drop_last=drop_last, seed=seed, rank=rank,
                         world_size=world_size, prefetch=prefetch)
        self.refresh_every = None if refresh_every is None else check_int(
            refresh_every, "refresh_every", low=1)
        self.source = embeddings
        self.normalize = bool(normalize)
        self.background, self.refresh_lag = _check_pipelining(
            background, refresh_lag, "steps between the snapshot and the use of the new graph")
        if self.refresh_lag and self.refresh_every is not None and \
                self.refresh_lag >= self.refresh_every:
            raise ValueError(f"refresh_lag={self.refresh_lag} must be smaller than "
                             f"refresh_every={self.refresh_every}")
        self.process_group = process_group
        self.distributed = _resolve_distributed(distributed, process_group, self.rank,
                                                self.world_size)
        if self.distributed and self.prefetch and not self.background:
            raise ValueError("prefetch > 0 under torch.distributed needs background=True (graph "
                             "builds then use a process group of their own, off the training "
                             "loop's thread); pass background=True or prefetch=0")
        self._build_group = _build_group_for(self.distributed, self.background, process_group)
        self._structure = None
        self._built_step = -1
        self._walk_state: WalkState | None = None
        self.last_refresh_seconds = 0.0
        self.refreshes = 0

    # -- subclass hooks ------------------------------------------------
    def _rebuild(self, x: np.ndarray, seed: int, group) -> object:
        """Build the structure from normalised embeddings ``x``; ``group``: distributed build or None."""
        raise NotImplementedError

    def _install(self, structure) -> None:
        """Make ``structure`` the one batches are drawn from."""
        self._structure = structure

    def _draw(self, index: int, seed: int) -> np.ndarray:
        raise NotImplementedError

    def _payload(self, structure) -> dict:
        """A built structure, for checkpoints."""
        raise NotImplementedError

    def _load_payload(self, state: dict) -> object:
        """The structure saved by :meth:`_payload`."""
        raise NotImplementedError

    # -- shared machinery ----------------------------------------------
    def _read(self, copy: bool) -> np.ndarray:
        x = self._first if self._first is not None else read_embeddings(self.source)
        self._first = None
        _check_rows(x, self.num_items)
        if self.normalize:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        elif copy:
            x = x.copy()  # a snapshot: the bank keeps changing while the build runs
        return np.ascontiguousarray(x, np.float32)

    def _build(self, x: np.ndarray, global_step: int, group) -> object:
        t0 = time.perf_counter()
        structure = self._rebuild(x, _rng.derive_seed(self.seed, global_step, 0x6A), group)
        self.last_refresh_seconds = time.perf_counter() - t0
        return structure

    def refresh(self, global_step: int = 0) -> None:
        """Re-read the embedding source and rebuild (as scheduled at ``global_step``)."""
        # With a planner thread (prefetch) builds may run there: use the build group.
        group = (self._build_group if self.prefetch else self.process_group) \
            if self.distributed else None
        self._install(self._build(self._read(copy=False), global_step, group))
        self._built_step = global_step
        self.refreshes += 1

    def _schedule(self, global_step: int) -> None:
        """Snapshot the source now; build (in the background thread if enabled) for later use."""
        x = self._read(copy=True)
        if self.background:
            group = self._build_group if self.distributed else None
            nxt = (global_step, self._submit(self._build, x, global_step, group))
        else:
            group = self.process_group if self.distributed else None
            nxt = (global_step, self._build(x, global_step, group))
        with self._cv:
            self._next = nxt
            self._cv.notify_all()

    def _resolve_next(self):
        step, structure = self._next
        structure = _resolve(structure)
        self._next = (step, structure)
        return structure

    def _due(self, global_step: int) -> int:
        """Refresh step whose structure is in use at ``global_step``."""
        if self.refresh_every is None:
            return 0
        s = global_step - global_step % self.refresh_every
        return s if s == 0 or global_step - s >= self.refresh_lag else s - self.refresh_every

    @property
    def coverage(self) -> float:
        """Share of items drawn so far this epoch (all ranks)."""
        return 0.0 if self._walk_state is None else self._walk_state.coverage

    def _begin_epoch(self, fresh: bool) -> None:
        if fresh or self._walk_state is None:
            self._walk_state = WalkState(self.num_items, self.seed, self.epoch)

    def _before_step(self, global_step: int) -> None:
        # The snapshot of a pipelined refresh is taken here, in the training loop's thread,
        # when batch ``global_step`` is requested, also when a planner thread runs ahead.
        super()._before_step(global_step)
        t = self.refresh_every
        if self.refresh_lag and t is not None and global_step % t == 0 and global_step > 0 \
                and global_step > self._built_step and \
                (self._next is None or global_step > self._next[0]):
            self._schedule(global_step)

    def _ready(self, global_step: int) -> bool:
        # The planner may use a built or scheduled structure; it reads the source itself only
        # when the training loop is waiting for exactly this step (the synchronous timing).
        due = self._due(global_step)
        return (self._built_step == due or (self._next is not None and self._next[0] == due)
                or self._consumer_step >= global_step)

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        due = self._due(global_step)
        if self._built_step != due:
            with self._cv:
                nxt = self._next
                if nxt is not None and nxt[0] == due:
                    self._next = None
            if nxt is not None and nxt[0] == due:
                self._install(_resolve(nxt[1]))
                self._built_step = due
                self.refreshes += 1
            else:
                self.refresh(due)
        return self._draw(index, _rng.derive_seed(self.seed, self.epoch, index, 0xB))

    def _generator_state(self, mid_epoch: bool) -> dict:
        # The structure outlives epochs until its next refresh.
        state = {} if self._structure is None else dict(self._payload(self._structure))
        if state:
            state["built_step"] = self._built_step
        if self._next is not None:
            state["next"] = self._payload(self._resolve_next())
            state["next_step"] = self._next[0]
        if mid_epoch:
            state["walk"] = self._walk_state.state_dict()
        return state

    def _load_generator_state(self, state: dict) -> None:
        self._walk_state = None
        if "walk" in state:
            self._walk_state = WalkState(self.num_items, self.seed, self.epoch)
            self._walk_state.load_state_dict(state["walk"])
        if "built_step" in state:
            self._install(self._load_payload(state))
            self._built_step = int(state["built_step"])
            self._first = None
        self._next = None
        if "next" in state:
            self._next = (int(state["next_step"]), self._load_payload(state["next"]))


class ProximityGraphSampler(_RefreshingSampler):
    """BatchSampler (Yang et al., KDD 2023): batches are walks on a proximity graph.

    Every ``refresh_every`` steps the sampler re-reads its embedding source
    and rebuilds the graph (:func:`hardbatch.proximity_graph`, or the exact
    :func:`hardbatch.knn_graph` with ``graph="knn"``); each batch is a walk of
    B distinct items from a start node not yet seen this epoch
    (:mod:`hardbatch.walks`).

    Args:
        embeddings: [N, d] tensor/array, an :class:`EmbeddingBank` fed by the
            training loop, or a callable returning [N, d] (a fresh encoding pass).
        batch_size: B.
        candidates: M, candidate pool per item (paper: 500-1000).
        neighbors: K, neighbours kept (paper: 100; 50 for MUTAG, 500 for text).
        restart: RWR restart probability alpha in [0, 1), a number or a schedule such
            as ``LinearDecay(0.2, 0.05)`` (the paper's best). (alpha = 1 would never
            leave the start node; ``KNNBatchSampler`` gives an anchor's nearest items.)
        walk: ``"rwr"`` (default), ``"rw"``, ``"bfs"`` or ``"dfs"``.
        graph: ``"proximity"`` or ``"knn"`` (ablation: exact K nearest).
        refresh_every: steps between graph rebuilds (paper's t), counted over
            the whole run; None builds the graph once.
        epochs: planned epochs, for schedules of ``restart``.
        normalize: L2-normalise embeddings first (cosine similarity); default True.
        group_size: candidate-pool sharing of :func:`proximity_graph` (checked here).
        patience: RWR/RW steps without a new item before jumping to a fresh start.
        device: where the graph is built (``"cuda"``: products and top-k on the GPU;
            the candidate pools, hence the graph up to floating-point near-ties, are
            the same on every device). Walks run on the CPU.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"`` products with
            fp32 accumulation (see :func:`hardbatch.proximity_graph`).
        refresh_lag: steps between the snapshot of the embeddings at a refresh step
            and the use of the graph built from it (default 0, or 1 with
            ``background``); see "Background planning" in docs/distributed.md.
        background: build the next graph in a worker thread from the snapshot, so
            the training loop does not wait for it; same batches as
            ``background=False`` with the same ``refresh_lag``.
        prefetch: plan up to this many batches (walks) ahead in a planner thread
            (default 0: walks run when a batch is requested). Same batches as
            ``prefetch=0``; snapshots are still taken in the training loop's thread
            when the refresh step's batch is requested, so the planner runs ahead by
            at most ``refresh_every + refresh_lag - 1`` steps past a refresh step.
        distributed: build the graph sharded across the ranks of ``process_group``
            and all-gather it (identical to the single-process graph). None
            (default): on when torch.distributed is initialised and ``rank`` /
            ``world_size`` are its own. Every rank must then iterate the sampler.
        process_group: torch.distributed group (default: the default group).
        drop_last, seed, rank, world_size: as in every sampler.
    """

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, candidates: int = 1000,
                 neighbors: int = 100, restart=0.2, walk: str = "rwr",
                 graph: Literal["proximity", "knn"] = "proximity",
                 refresh_every: int | None = 100, *, epochs: int | None = None,
                 drop_last: bool = False, seed: int = 0, normalize: bool = True,
                 group_size: int | None = None, patience: int | None = None,
                 device: str | torch.device | None = None,
                 precision: Literal["fp32", "bf16", "fp16"] = "fp32",
                 refresh_lag: int | None = None, background: bool = False,
                 prefetch: int = 0, distributed: bool | None = None, process_group=None,
                 rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__(embeddings, batch_size, refresh_every=refresh_every,
                         drop_last=drop_last, seed=seed, normalize=normalize, rank=rank,
                         world_size=world_size, refresh_lag=refresh_lag, background=background,
                         distributed=distributed, process_group=process_group,
                         prefetch=prefetch)
        self.device = resolve_device(device)
        check_precision(precision)
        self.precision = precision
        if walk not in WALKS:
            raise ValueError(f"walk={walk!r} must be one of {sorted(WALKS)}")
        if not callable(restart):
            restart = check_restart(restart, expected="a number in [0, 1) or a schedule such "
                                    "as LinearDecay(0.2, 0.05)")
        else:
            if isinstance(restart, LinearDecay):  # any other schedule is checked per batch
                check_restart(restart.start, "restart=LinearDecay(...) start")
                check_restart(restart.end, "restart=LinearDecay(...) end")
            if getattr(restart, "total_steps", None) is None and epochs is None:
                raise ValueError("restart is a schedule: pass epochs=... (training length) to "
                                 "the sampler, or total_steps=... to the schedule")
        self.epochs = None if epochs is None else check_int(epochs, "epochs", low=1)
        self.walk, self.restart = walk, restart
        self.patience = None if patience is None else check_int(patience, "patience", low=1)
        self._graph: np.ndarray | None = None
        self._deg: np.ndarray | None = None
        self.candidates = check_int(candidates, "candidates", low=1)
        self.neighbors = check_int(neighbors, "neighbors", low=1)
        if graph not in ("proximity", "knn"):
            raise ValueError(f"graph={graph!r} must be 'proximity' or 'knn'")
        self.graph_kind = graph
        n = self.num_items
        if graph == "proximity":
            check_graph_sizes(self.candidates, self.neighbors, n)
            group_size = check_group_size(group_size, self.candidates, n)
        elif self.neighbors >= n:
            raise ValueError(f"neighbors={neighbors} must be smaller than N={n}")
        self.group_size = group_size

    @property
    def graph(self) -> torch.Tensor | None:
        """The current neighbour table [N, K] (None before the first batch)."""
        return None if self._graph is None else torch.from_numpy(self._graph)

    def _rebuild(self, x: np.ndarray, seed: int, group) -> tuple[np.ndarray, np.ndarray]:
        kw = {"device": self.device, "precision": self.precision}
        if group is None and not self.distributed:
            if self.graph_kind == "knn":
                graph = knn_graph(x, self.neighbors, **kw)
            else:
                graph = proximity_graph(x, self.candidates, self.neighbors, seed,
                                        group_size=self.group_size, **kw)
        elif self.graph_kind == "knn":
            graph = hbdist.knn_graph(x, self.neighbors, group=group, **kw)
        else:
            graph = hbdist.proximity_graph(x, self.candidates, self.neighbors, seed,
                                           group_size=self.group_size, group=group, **kw)
        return prepare_graph(graph, self.num_items)

    def _install(self, structure) -> None:
        self._structure = structure
        self._graph, self._deg = structure

    def _restart_at(self, epoch: int, index: int) -> float:
        """Alpha for global plan batch ``index`` of ``epoch``.

        Progress is plan batches over planned ones (``epochs * ceil(N/B)``), the
        same for any world size; with ``LinearDecay(total_steps=T)`` it is
        steps of this rank over T.
        """
        if isinstance(self.restart, float):
            return self.restart
        total_steps = getattr(self.restart, "total_steps", None)
        if total_steps:
            progress = (epoch * len(self) + index // self.world_size) / total_steps
        else:
            per_epoch = self.batches_per_epoch
            progress = (epoch * per_epoch + index) / (self.epochs * per_epoch)
        return check_restart(float(self.restart(progress)),
                             f"restart (schedule value at progress {progress:.4g})")

    def _draw(self, index: int, seed: int) -> np.ndarray:
        patience = self.patience or default_patience(self._graph.shape[1])
        return self._walk_state.walk(self._graph, self._deg, self.batch_size, WALKS[self.walk],
                                     np.array([self._restart_at(self.epoch, index)]),
                                     np.array([seed], np.uint64), patience)[0]

    def _payload(self, structure) -> dict:
        return {"graph": torch.from_numpy(structure[0].astype(
            np.int32 if self.num_items < 2**31 else np.int64))}

    def _load_payload(self, state: dict):
        return prepare_graph(np.asarray(state["graph"], np.int64), self.num_items)


class KNNBatchSampler(_RefreshingSampler):
    """kNN sampler (the paper's baseline): a random anchor plus its B-1 nearest neighbours.

    Anchors are drawn from items not yet seen this epoch. Every
    ``refresh_every`` steps the sampler snapshots its embedding source; each
    batch then costs one [N, d] x [d] product and a top-(B-1) selection
    (exactly the anchor's row of ``knn_graph(x, B - 1)``, without building the
    whole graph).

    Args:
        embeddings: as for :class:`ProximityGraphSampler`.
        batch_size: B (< N).
        refresh_every: steps between snapshots; None reads the source once.
        refresh_lag: steps between a snapshot and its use (default 0).
        prefetch: batches planned ahead in a planner thread (see ProximityGraphSampler).
        device: where the per-batch product runs (the snapshot lives there).
        normalize, drop_last, seed, rank, world_size: as in every sampler.

    Under DDP every rank needs the same snapshot for the plans to agree:
    feed it from an :class:`EmbeddingBank` (synchronised across ranks) or a
    fixed table.
    """

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 refresh_every: int | None = 100, *, drop_last: bool = False, seed: int = 0,
                 normalize: bool = True, refresh_lag: int | None = None, prefetch: int = 0,
                 device: str | torch.device | None = None, rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__(embeddings, batch_size, refresh_every=refresh_every,
                         drop_last=drop_last, seed=seed, normalize=normalize, rank=rank,
                         world_size=world_size, refresh_lag=refresh_lag, distributed=False,
                         prefetch=prefetch)
        self.device = resolve_device(device)
        if self.batch_size >= self.num_items:
            raise ValueError(f"batch_size={batch_size} must be smaller than N={self.num_items} "
                             "for the kNN sampler (anchor plus B-1 neighbours)")
        self._snapshot: torch.Tensor | None = None

    def _rebuild(self, x: np.ndarray, seed: int, group) -> torch.Tensor:
        # A copy: ``x`` may be a view of the live source (an EmbeddingBank, normalize=False),
        # and the snapshot must stay as it was at its refresh step.
        return torch.from_numpy(x).to(self.device, copy=True)

    def _install(self, structure) -> None:
        self._structure = self._snapshot = structure

    def _draw(self, index: int, seed: int) -> np.ndarray:
        anchor = self._walk_state.next_start(seed)
        sims = self._snapshot @ self._snapshot[anchor]
        sims[anchor] = -torch.inf
        nearest = sims.topk(self.batch_size - 1, sorted=True).indices.cpu().numpy()
        batch = np.concatenate([[anchor], nearest]).astype(np.int64)
        self._walk_state.seen[batch] = 1
        return batch

    def _payload(self, structure) -> dict:
        return {"snapshot": structure.cpu().clone()}

    def _load_payload(self, state: dict) -> torch.Tensor:
        return torch.as_tensor(state["snapshot"], dtype=torch.float32).to(self.device)
