"""The sampler contract: a global per-epoch plan of batches, split across ranks, resumable.

Every sampler of :mod:`hardbatch.samplers` is a :class:`PlanSampler`:

* An epoch is ``ceil(N / B)`` batches, the same number of steps as uniform sampling, so
  comparisons are step-for-step fair; with ``drop_last=True`` only full batches,
  ``floor(N / B)`` rounded down to a multiple of ``world_size``, so that every plan batch
  is served and every rank gets as many, as with ``DistributedSampler(drop_last=True)``.
  The partition samplers (uniform, GCBS, cluster, community) partition the items (the
  last batch may be short; with ``drop_last`` the items left out are a seeded random
  choice per epoch, not a fixed region); walk samplers always return B distinct items and
  draw their start nodes from items not yet seen this epoch (``coverage``).
* ``set_epoch(epoch)`` selects the epoch (iteration also advances it by one
  when an epoch completes); the same seed, epoch and rank give the same
  batches on any machine (given the same embeddings).
* ``state_dict()`` / ``load_state_dict()``: resuming mid-epoch yields exactly
  the remaining batches. With a prefetching ``DataLoader`` pass
  ``state_dict(consumed=steps_done_this_epoch)``, also after the sampler has yielded
  the whole epoch (the loader asked for its last batches) while the loop still trains
  it; ``consumed`` equal to the epoch's length (or omitted then) resumes at the next
  epoch. The state of any rank resumes every rank (it holds the pending batches of all
  ranks); it holds only tensors, numbers, strings, lists and dicts
  (``torch.load(weights_only=True)`` reads it), the sampler's kind (class name), the settings
  that shape its batches (``_settings``) and a SHA-256 checksum; loading a state of another
  kind or other settings, with missing keys, or whose checksum does not match (corrupted)
  raises ``ValueError``.
* Distributed: ``rank`` / ``world_size`` default to torch.distributed's when
  it is initialised. All ranks compute the same global plan of
  ``ceil(ceil(N/B) / W) * W`` batches (padded with extra batches, like
  ``DistributedSampler``; with ``drop_last`` ``floor(floor(N/B) / W) * W`` full batches,
  nothing padded and no planned batch left unserved) and rank r takes batches r, r + W,
  r + 2W, ...; an epoch needs at least W batches (else ``ValueError``), so the W batches
  of a step differ.
* ``global_batch=True``: each step is ONE plan batch of ``W * B`` items (the plan of
  a single process with batch size ``W * B``; an epoch is ``ceil(N / (W * B))`` steps)
  and rank r takes slice r of it (a short last batch is split as evenly as possible;
  one of fewer than W items is topped up from the epoch's first batch).
* ``duplicate_keys``: items with equal keys never share a plan batch
  (:mod:`hardbatch.keys`).
* Bad input raises ``ValueError`` naming the parameter and the fix.

This module holds the plan and its checkpoints only; the thread of ``prefetch`` is a composed
:class:`~hardbatch.samplers.prefetch.PrefetchThread`.
"""

from __future__ import annotations

import collections
import contextlib
import time
import warnings
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from .._integrity import INTEGRITY_KEY, digest, seal, stable_repr, verify
from .._validation import check_int
from ..data import warn_if_loader_items_lack_index
from ..distributed import resolve_rank_world
from ..keys.encode import DuplicateKeys, encode_keys
from ..keys.feasibility import check_partition_keys, check_walk_keys
from .prefetch import PrefetchThread, Step

LOOKBACK = 1024  # steps kept so that state_dict(consumed=...) can rewind a prefetching loader


def _setting(value):
    """A setting as recorded in a state: numbers, strings and None as they are, a schedule or
    another object by its ``repr`` (dataclasses: their fields), a device by its name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_setting(v) for v in value]
    if isinstance(value, torch.device):
        return str(value)
    if type(value).__repr__ is object.__repr__:
        return type(value).__name__
    return stable_repr(value)  # a function: its name (its repr holds an address)


def check_state_keys(state: dict, keys) -> None:
    """``ValueError`` naming the ``keys`` a sampler's saved ``state`` lacks."""
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"state is missing {', '.join(map(repr, missing))}: it is not a whole "
                         "state_dict() of a hardbatch sampler (or it is corrupted); pass the dict "
                         "that state_dict() returned (or a torch.load of it)")


def _shown(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


class PlanSampler(Sampler[list[int]]):
    """Base: a global per-epoch plan of batches, generated in order, split across ranks.

    Arguments: ``num_items`` (N) and ``batch_size`` (B), then the shared options
    (``drop_last``, ``seed``, ``rank``, ``world_size``, ``global_batch``, ``duplicate_keys``,
    ``prefetch``): :class:`~hardbatch.samplers.options.PlanOptions` and its module's table.

    Every rank generates all W batches of each of its steps (the plan is global), so
    the batches planned or yielded but not yet trained on are kept as whole steps: a
    checkpoint of any rank holds them for every rank.

    Subclasses implement :meth:`_generate` (plan batch ``index`` of the epoch) and, where
    they keep state across batches, :meth:`_begin_epoch`, :meth:`_generator_state` and
    :meth:`_load_generator_state`; :meth:`_on_step` and :meth:`_plannable` tie them to the
    loop's progress and to the prefetch thread (``prefetch`` > 0).

    Example:
        >>> import numpy as np
        >>> from hardbatch.samplers import PlanSampler
        >>> class Blocks(PlanSampler):  # batch i: items i*B .. i*B + B - 1
        ...     def _generate(self, index, global_step):
        ...         b = self.plan_batch_size
        ...         return np.arange(index * b, min(self.num_items, (index + 1) * b))
        >>> sampler = Blocks(40, 16)
        >>> [len(batch) for batch in sampler], sampler.epoch
        ([16, 16, 8], 1)
    """

    # Attributes that shape the batches: recorded in every state, which loads only into a sampler
    # of the same kind with equal values. Subclasses extend it with their options.
    _settings = ("num_items", "batch_size", "world_size", "seed", "drop_last", "global_batch",
                 "duplicate_keys_digest")
    _state_keys = ("kind", "epoch", "step", "generator")
    batches_partition = True  # whether an epoch's batches partition the items (else: walks, kNN)

    def __init__(self, num_items: int, batch_size: int, *, drop_last: bool = False,
                 seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 prefetch: int = 0, global_batch: bool = False, duplicate_keys=None) -> None:
        self.num_items = num_items
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.drop_last = bool(drop_last)
        self.seed = check_int(seed, "seed")
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.global_batch = bool(global_batch)
        w = self.world_size
        self.plan_batch_size = self.batch_size * w if self.global_batch else self.batch_size
        self.plan_width = 1 if self.global_batch else w  # plan batches per step
        self._check_geometry()
        self.duplicate_keys: DuplicateKeys | None = encode_keys(duplicate_keys, num_items)
        if self.duplicate_keys is not None:
            if self.batches_partition:
                check_partition_keys(self.duplicate_keys, num_items, self.plan_batch_size,
                                     self.drop_last, self.batches_per_epoch)
            else:
                check_walk_keys(self.duplicate_keys, self.plan_batch_size)
        self.epoch = 0
        self.sampler_seconds = 0.0  # time spent planning batches (graphs, walks)
        self._pending: list[Step] = []  # steps to replay after load_state_dict
        self._start_step = 0
        self._loaded: dict | None = None  # the loaded state, until an iteration takes it up
        self._recent: collections.deque[Step] = collections.deque(maxlen=LOOKBACK)  # yielded
        self._replay: collections.deque[Step] = collections.deque()  # loaded, not replayed yet
        self._yielded = 0
        self._active = False
        self._generation = 0  # counts iterations; an iterator older than the newest is stale
        self.prefetch = check_int(prefetch, "prefetch", low=0)
        self.prefetcher = PrefetchThread(self.prefetch) if self.prefetch else None
        self._finished: tuple[int, int] | None = None  # (epoch, steps) of an iteration just done

    @property
    def duplicate_keys_digest(self) -> str | None:
        """A digest of ``duplicate_keys`` (which items share a key), None without keys."""
        keys = self.duplicate_keys
        if keys is None or not keys.any:
            return None
        if getattr(self, "_keys_digest", None) is None:
            self._keys_digest = digest(torch.from_numpy(np.ascontiguousarray(keys.ids)))[:16]
        return self._keys_digest

    # -- plan geometry -------------------------------------------------
    def _check_geometry(self) -> None:
        n, b, w = self.num_items, self.batch_size, self.world_size
        if self.global_batch and self.plan_batch_size > n:
            raise ValueError(
                f"global_batch=True draws world_size * batch_size = {w} * {b} = "
                f"{self.plan_batch_size} items per step, more than the N={n} items; use "
                f"batch_size <= N // world_size = {n // w} or global_batch=False")
        if b > n:
            raise ValueError(f"batch_size={b} is larger than the number of items N={n}; use "
                             "batch_size <= N")
        if len(self) == 0:  # only with drop_last: fewer full batches than ranks
            fix = f"use batch_size <= N // world_size = {n // w} or " if n >= w else ""
            raise ValueError(
                f"drop_last=True leaves {n // b} full batch(es) of batch_size={b} for "
                f"world_size={w} ranks, so every rank would get no batch; {fix}pass "
                "drop_last=False")
        # with drop_last the plan is whole steps of full batches (checked above); without it
        # the padding of a last step would repeat a batch in that step
        if self.batches_per_epoch < self.plan_width:
            largest = -(-n // (w - 1)) - 1  # the largest batch_size giving ceil(N / b) >= w
            raise ValueError(
                f"world_size={w} needs at least {w} batches per epoch so that the ranks get "
                f"different batches, but N={n} items make {self.batches_per_epoch} of "
                f"batch_size={b}; use N >= {(w - 1) * b + 1} items, a smaller world_size" +
                (f", or batch_size <= {largest}" if largest >= 1 else ""))

    @property
    def batches_per_epoch(self) -> int:
        """Plan batches in one epoch: ceil(N / B'), where B' is the plan's batch size
        (``batch_size``, or ``world_size * batch_size`` with global_batch). With drop_last the
        full batches that whole steps serve: floor(N / B') rounded down to a multiple of the
        W' plan batches of a step (``plan_width``: world_size, 1 with global_batch), so the
        plan holds no batch that no rank is given.

        Example:
            >>> from hardbatch import UniformBatchSampler
            >>> [UniformBatchSampler(40, 8, drop_last=True, world_size=w, rank=0)
            ...  .batches_per_epoch for w in (1, 2, 3)]
            [5, 4, 3]
        """
        b, w = self.plan_batch_size, self.plan_width
        if self.drop_last:
            return self.num_items // b // w * w
        return -(-self.num_items // b)

    def __len__(self) -> int:
        return -(-self.batches_per_epoch // self.plan_width)  # exact with drop_last

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s plan on the next iteration (forgets a mid-epoch resume of another epoch).

        It also starts the loop's new epoch: ``state_dict(consumed=k)`` then counts its steps.
        """
        epoch = check_int(epoch, "epoch", low=0)
        if epoch != self.epoch:
            self._pending, self._start_step, self._loaded = [], 0, None
        self.epoch = epoch
        self._finished = None

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
        """Restore what :meth:`_generator_state` saved."""

    def _on_step(self, global_step: int) -> None:
        """Called in the training loop's thread just before batch ``global_step`` is handed out."""

    def _plannable(self, global_step: int) -> bool:
        """Whether the prefetch thread may generate ``global_step`` before the loop asks for it."""
        return True

    # -- iteration -----------------------------------------------------
    def _step_batches(self, step: int) -> Step:
        """All plan batches of local step ``step``: plan batches step*W .. step*W + W - 1, or
        the one global batch ``step`` (topped up to W items if shorter) with global_batch."""
        w, global_step = self.plan_width, self.epoch * len(self) + step
        plan = [self._generate(j, global_step) for j in range(step * w, step * w + w)]
        if self.global_batch and len(plan[0]) < self.world_size:
            plan[0] = self._top_up(plan[0], global_step)
        return plan

    def _top_up(self, batch: np.ndarray, global_step: int) -> np.ndarray:
        """A short global batch of fewer than W items, completed to W distinct items with items
        of the epoch's first batches (the first, then the next while short: with shuffled batch
        orders the short batch can be the first), as DistributedSampler pads; items whose keys
        it lacks first, others (with a warning) only where those run out."""
        w, taken = self.world_size, np.asarray(batch, np.int64)
        for free_of_keys in ((True, False) if self.duplicate_keys is not None else (False,)):
            for j in range(self.batches_per_epoch):
                cand = np.asarray(self._generate(j, global_step), np.int64)
                cand = cand[~np.isin(cand, taken)]
                if free_of_keys:
                    cand = self.duplicate_keys.compatible(cand, batch)
                taken = np.concatenate([taken, cand[:w - len(taken)]])
                if len(taken) == w:
                    if not free_of_keys and self.duplicate_keys is not None:
                        warnings.warn(f"duplicate_keys: the short global batch of step "
                                      f"{global_step} was topped up to world_size={w} items "
                                      "with items sharing its keys; use keys that tell more "
                                      "items apart", stacklevel=3)
                    return taken
        return taken  # N >= W * B (checked): not reached

    def _rank_batch(self, plan: Step) -> list[int]:
        """This rank's batch of a planned step (its slice of the global batch)."""
        if not self.global_batch:
            return plan[self.rank].tolist()
        batch, b = plan[0], self.batch_size
        if len(batch) == b * self.world_size:
            return batch[self.rank * b:(self.rank + 1) * b].tolist()
        return np.array_split(batch, self.world_size)[self.rank].tolist()

    def _hand_out(self, global_step: int) -> None:
        self._on_step(global_step)
        if self.prefetcher is not None:
            self.prefetcher.advance(global_step)

    def __iter__(self) -> Iterator[list[int]]:
        warn_if_loader_items_lack_index(self)  # a DataLoader over items without their index
        # A new iteration supersedes any earlier one: stop its prefetch thread first.
        if self.prefetcher is not None:
            self.prefetcher.begin()
        self._generation += 1
        generation = self._generation
        steps = len(self)
        self._finished = None
        self._begin_epoch(fresh=not (self._pending or self._start_step > 0))
        start = self._start_step
        self._replay = collections.deque(self._pending)
        self._pending, self._start_step, self._loaded = [], 0, None
        self._recent.clear()
        self._active = True
        base = self.epoch * steps
        step = start
        replay = self._replay  # this iteration's (state_dict reads it)
        while replay:
            self._hand_out(base + step)
            plan = replay.popleft()
            self._recent.append(plan)
            self._yielded = step + 1
            yield self._rank_batch(plan)
            step += 1
        run = None
        if self.prefetcher is not None and step < steps:
            run = self.prefetcher.start(range(base + step, base + steps),
                                     lambda g: self._step_batches(g - base), self._plannable)
        try:
            while step < steps:
                t0 = time.perf_counter()
                if run is not None and self._generation != generation:
                    raise RuntimeError("this iterator was superseded by a newer iteration of the "
                                       "sampler (e.g. a new DataLoader iterator), which stopped "
                                       "its prefetch thread; iterate the newest one")
                self._hand_out(base + step)
                plan = self.prefetcher.take(run) if run is not None else self._step_batches(step)
                self.sampler_seconds += time.perf_counter() - t0
                self._recent.append(plan)
                self._yielded = step + 1
                yield self._rank_batch(plan)
                step += 1
        finally:
            if run is not None:
                self.prefetcher.stop(run)  # this iteration's thread only
        self._active = False
        self._finished = (self.epoch, step)
        self.epoch += 1

    # -- checkpointing -------------------------------------------------
    def state_dict(self, consumed: int | None = None) -> dict:
        """Sampler state after ``consumed`` batches of the current epoch (default: all yielded).

        ``consumed`` may lag the batches already yielded by up to 1024 (a
        prefetching loader); those batches are replayed after loading. The
        state holds them for every rank (as whole plan steps), so the state of
        any one rank resumes every rank. After an iteration completed (the loader
        took the whole epoch) and before ``set_epoch`` or a new iteration, ``consumed``
        below the epoch's length refers to that epoch; ``consumed`` equal to it, or None,
        gives the next epoch's start. The state holds only tensors, numbers, strings,
        lists and dicts.
        """
        # With a prefetch thread: between two of its steps.
        with contextlib.nullcontext() if self.prefetcher is None else self.prefetcher.lock:
            return self._state_dict(consumed)

    def _state_dict(self, consumed: int | None) -> dict:
        if self._loaded is not None:
            # loaded, no iteration since (a checkpoint right after a restart): the loaded state
            start = self._start_step
            if consumed is not None and check_int(consumed, "consumed", low=0) != start:
                raise ValueError(f"consumed={consumed}: this sampler resumed at step {start} of "
                                 f"epoch {self.epoch} and has yielded nothing since; pass "
                                 f"consumed={start} or None")
            return seal(dict(self._loaded, rank=self.rank), "sampler state")
        yielded = self._yielded if self._active else 0
        given = consumed is not None
        consumed = check_int(consumed, "consumed", low=0) if given else yielded
        epoch, active = self.epoch, self._active
        if given and not active and self._finished is not None:
            if consumed < self._finished[1]:
                # the loop still trains the epoch whose batches the sampler has all yielded
                (epoch, yielded), active = self._finished, True
            elif consumed == self._finished[1]:  # that epoch is done: the next one's start
                consumed = 0
        if consumed > yielded or yielded - consumed > len(self._recent):
            raise ValueError(f"consumed={consumed} must be between {yielded - len(self._recent)} "
                             f"and the {yielded} batches yielded this epoch")
        lag = yielded - consumed
        steps = list(self._recent)[len(self._recent) - lag:] if lag else []
        # then the loaded steps not replayed yet and those planned ahead by the prefetch thread
        planned = self.prefetcher.planned() if self._active and self.prefetcher is not None else []
        planned = (list(self._replay) if self._active else []) + planned
        steps += planned
        state = {key: _setting(getattr(self, key)) for key in self._settings}
        state.update(kind=type(self).__name__, epoch=epoch, step=consumed, rank=self.rank,
                     generator=self._generator_state(
                         mid_epoch=bool(active and (yielded or planned))))
        # Plan batches consumed*W, consumed*W + 1, ...: rank r replays those = r (mod W).
        state["pending_plan"] = [torch.from_numpy(np.array(b, np.int64))
                                 for plan in steps for b in plan]
        return seal(state, "sampler state")

    def _check_state(self, state: dict) -> None:
        """``ValueError`` unless ``state`` is a whole, uncorrupted state of a sampler of this
        kind and settings."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be the dict of a sampler's state_dict(), got "
                             f"{type(state).__name__}")
        mine = type(self).__name__
        kind = state.get("kind", mine)
        if kind != mine and (not isinstance(kind, str)
                             or kind not in {c.__name__ for c in type(self).__mro__}):
            verify(state, "sampler state")  # a corrupted name is reported as such
            raise ValueError(f"state was saved by a {kind} but this sampler is a {mine}; load "
                             f"it into a {kind} constructed with the same options")
        check_state_keys(state, [*self._state_keys, "pending_plan", *self._settings, INTEGRITY_KEY])
        verify(state, "sampler state")
        diffs = [(key, state[key], _setting(getattr(self, key))) for key in self._settings
                 if key in state and state[key] != _setting(getattr(self, key))]
        if diffs:
            saved = ", ".join(f"{k}={_shown(v)}" for k, v, _ in diffs)
            have = ", ".join(f"{k}={_shown(v)}" for k, _, v in diffs)
            raise ValueError(f"state was saved with {saved} but this sampler has {have}; "
                             "construct it with the same value"
                             + ("s" if len(diffs) > 1 else ""))

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields exactly the remaining batches of the saved epoch.

        A state saved on any rank resumes any rank (same world size).
        """
        self._check_state(state)
        w = self.plan_width
        flat = [np.asarray(b, dtype=np.int64) for b in state["pending_plan"]]
        if len(flat) % w:
            raise ValueError(f"state['pending_plan'] holds {len(flat)} batches, not whole "
                             f"steps of world_size={w}; pass a state from state_dict()")
        pending = [flat[i:i + w] for i in range(0, len(flat), w)]
        if self.prefetcher is not None:  # a running iteration is superseded by the loaded state
            self.prefetcher.stop(self.prefetcher.run)
        self.epoch = int(state["epoch"])
        self._finished = None
        self._pending = pending
        self._start_step = int(state["step"])
        self._load_generator_state(state["generator"])
        self._loaded = {k: v for k, v in state.items() if k != INTEGRITY_KEY}
