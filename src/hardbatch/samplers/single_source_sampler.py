"""Several sources (datasets), each batch from ONE of them: :class:`SingleSourceBatchSampler`.

Multi-task or multi-dataset training (a retrieval set, an NLI set, a code set) keeps each batch
within one source so that in-batch negatives come from the same task, and draws the sources by
weight: size-proportional (every source once per epoch, sentence-transformers'
``ProportionalBatchSampler``), temperature-scaled ``p_i ~ n_i^(1/T)`` (T > 1 lifts the small
sources, the multilingual-T5 recipe) or explicit weights. Inside a source any batch sampler
runs: hardbatch's (uniform, kNN, proximity, GCBS, ...; one per source, so a hard sampler sees
only its own source's embeddings) or sentence-transformers' own.

The class takes sentence-transformers' ``multi_dataset_batch_sampler`` call,
``(dataset: ConcatDataset, batch_samplers, generator, seed)``; :func:`single_source_batch_sampler`
binds the weights for ``SentenceTransformerTrainingArguments(multi_dataset_batch_sampler=...)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from torch.utils.data import Sampler

from .. import _rng
from .._integrity import INTEGRITY_KEY, seal, verify
from .._validation import check_generator, check_int
from ..distributed import resolve_rank_world
from .base import check_state_keys
from .uniform_sampler import UniformBatchSampler

__all__ = ["SingleSourceBatchSampler", "single_source_batch_sampler"]


def _source_ranges(dataset, sources) -> list[range]:
    """The index range of every source in the concatenation."""
    if dataset is not None and sources is not None:
        raise ValueError("pass either dataset= (a ConcatDataset) or sources=, not both")
    if dataset is not None:
        sizes = [len(d) for d in getattr(dataset, "datasets", [])]
        if not sizes:
            raise ValueError("dataset must be a torch.utils.data.ConcatDataset (its .datasets "
                             "are the sources); for sizes or ranges pass sources=")
        sources = sizes
    if sources is None or isinstance(sources, (str, bytes)) or not len(sources):
        raise ValueError("sources must list the sources: their sizes, index ranges of one "
                         "concatenation, or sized datasets")
    out, start = [], 0
    for i, s in enumerate(sources):
        if isinstance(s, range):
            if s.step != 1:
                raise ValueError(f"sources[{i}] = {s} must be a contiguous range (step 1)")
            out.append(s)
            start = s.stop
            continue
        n = check_int(s, f"sources[{i}]", low=0) if isinstance(s, (int, np.integer)) else None
        if n is None:
            if not hasattr(s, "__len__"):
                raise ValueError(f"sources[{i}] must be a size, a range or a sized dataset, got "
                                 f"{type(s).__name__}")
            n = len(s)
        out.append(range(start, start + n))
        start += n
    return out


def source_weights(sizes: Sequence[int], weights="proportional",
                   temperature: float | None = None) -> np.ndarray:
    """The probability of each source: ``n_i`` (``"proportional"``), ``n_i^(1/T)`` with
    ``temperature`` T, or the explicit ``weights``, normalised to sum 1.

    Example:
        >>> from hardbatch.samplers.single_source_sampler import source_weights
        >>> source_weights([900, 100]).tolist(), source_weights([900, 100], temperature=2).round(3)
        ([0.9, 0.1], array([0.75, 0.25]))
    """
    sizes = np.asarray(sizes, np.float64)
    if isinstance(weights, str):
        if weights != "proportional":
            raise ValueError(f"weights={weights!r}: use 'proportional' (by source size) or one "
                             "non-negative number per source")
        t = 1.0 if temperature is None else float(temperature)
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature={temperature!r} must be a positive number "
                             "(p_i ~ n_i^(1/T); 1: size-proportional, larger: flatter)")
        w = sizes ** (1.0 / t)
    else:
        if temperature is not None:
            raise ValueError("temperature= scales the sizes (weights='proportional'); with "
                             "explicit weights leave it out")
        w = np.asarray(weights, np.float64).ravel()
        if w.shape != sizes.shape:
            raise ValueError(f"weights has {w.size} values for {sizes.size} sources; pass one "
                             "weight per source")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError(f"weights={list(w)} must be finite and >= 0 (one per source)")
    if not w.sum() > 0:
        raise ValueError(f"weights={list(np.round(w, 6))} are all zero: no source could be "
                         "drawn; give at least one source a positive weight")
    return w / w.sum()


def _same(saved, have) -> bool:
    """Whether a recorded setting equals this sampler's (weights: up to rounding)."""
    if isinstance(have, list) and have and isinstance(have[0], float):
        return isinstance(saved, list) and len(saved) == len(have) and np.allclose(
            np.asarray(saved, np.float64), have, rtol=1e-9, atol=0)
    return saved == have and type(saved) is type(have)


def _shown(value) -> str:
    if isinstance(value, list) and value and isinstance(value[0], float):
        return str([round(v, 6) for v in value])
    return repr(value) if isinstance(value, str) else str(value)


def _largest_remainder(p: np.ndarray, total: int) -> np.ndarray:
    raw = p * total
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[:total - int(counts.sum())]] += 1
    return counts


class SingleSourceBatchSampler(Sampler[list[int]]):
    """Batches that each come from one source, the sources drawn by weight.

    Args:
        dataset: a ``torch.utils.data.ConcatDataset`` of the sources (what sentence-transformers
            passes), or None with ``sources=``.
        batch_samplers: one batch sampler per source, yielding the source's own indices
            (sentence-transformers passes them); None: built by ``sampler``.
        generator: accepted for sentence-transformers, unused (``seed`` decides).
        seed: the seed of the source order (and of the default samplers); the same on all ranks.
        sources: instead of ``dataset``: per source, its size, its index ``range`` in the
            concatenation, or a sized dataset (sources laid end to end).
        sampler: with no ``batch_samplers``: ``factory(index, source)`` returning the batch
            sampler of source ``index`` (``source``: the sub-dataset, else its size), or a list
            of such factories; None: ``UniformBatchSampler`` of ``batch_size``.
        batch_size, drop_last: of the default samplers; ``drop_last`` (the first source
            sampler's where it has one) also decides the schedule's tail with several ranks.
        weights: ``"proportional"`` (default) or one non-negative weight per source.
        temperature: T > 0 with ``weights="proportional"``: p_i ~ n_i^(1/T).
        num_batches: steps per epoch of the shared schedule (default: the sources' batches per
            epoch summed).
        rank, world_size: this process and the ranks sharing the schedule (None:
            torch.distributed's, else 0 and 1).

    An epoch is ``num_batches`` steps. Size-proportional without a temperature runs every
    source's sampler once, in a seeded random interleaving (sentence-transformers'
    ``ProportionalBatchSampler``); otherwise source i gets ``round(p_i * num_batches)`` steps
    (largest remainders), running its sampler again (next epoch of it) when it is exhausted, or
    stopping it part-way. Deterministic in (seed, epoch).

    Ranks: every rank computes the one schedule (the source samplers must not split across
    ranks themselves: build them with ``rank=0, world_size=1``, as the default ones are) and
    rank r yields its steps r, r + W, r + 2W, ..., so each rank draws every source sampler
    through all steps (the other ranks' batches too). Every rank gets ``len()`` batches: with
    ``drop_last`` the last ``num_batches mod W`` steps are dropped, else the schedule is padded
    to a multiple of W by repeating the sources of its first steps (their next batches), as
    ``DistributedSampler`` pads; an epoch needs ``num_batches >= W``. The sentence-transformers
    callable (:func:`single_source_batch_sampler`) passes ``rank=0, world_size=1``: accelerate
    shards the batches there.

    ``state_dict(consumed=k)`` / ``load_state_dict`` resume after this rank's first k batches
    (a source sampler with its own ``state_dict``, as hardbatch's, is restored exactly; others
    are replayed), also after the whole epoch was yielded (a prefetching ``DataLoader``) until
    ``set_epoch`` or the next iteration; a state of any rank resumes every rank.

    Example:
        >>> import hardbatch as hb
        >>> s = hb.SingleSourceBatchSampler(sources=[40, 20], batch_size=8, temperature=2.0)
        >>> batches = list(s)
        >>> len(batches), all(max(b) < 40 or min(b) >= 40 for b in batches)
        (8, True)
        >>> ranks = [hb.SingleSourceBatchSampler(sources=[40, 20], batch_size=8, rank=r,
        ...                                      world_size=2) for r in range(2)]
        >>> one = list(hb.SingleSourceBatchSampler(sources=[40, 20], batch_size=8, world_size=1))
        >>> [len(r) for r in ranks], [b for step in zip(*ranks) for b in step] == one
        ([4, 4], True)
    """

    def __init__(self, dataset=None, batch_samplers: Sequence | None = None, generator=None,
                 seed: int | None = 0, *, sources: Sequence | None = None,
                 sampler: Callable | Sequence[Callable] | None = None,
                 batch_size: int | None = None, drop_last: bool = False,
                 weights="proportional", temperature: float | None = None,
                 num_batches: int | None = None, rank: int | None = None,
                 world_size: int | None = None) -> None:
        self.ranges = _source_ranges(dataset, sources)
        self.seed = check_int(0 if seed is None else seed, "seed")
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.generator, self.epoch = check_generator(generator), 0
        sizes = [len(r) for r in self.ranges]
        subs = list(dataset.datasets) if dataset is not None else [
            n if isinstance(s, (int, np.integer, range)) else s for s, n in zip(sources, sizes)]
        given = batch_samplers is not None  # else built here, with this drop_last
        if batch_samplers is None:
            batch_samplers = self._build(subs, sizes, sampler, batch_size, drop_last)
        elif sampler is not None:
            raise ValueError("pass either batch_samplers= or sampler=, not both")
        if len(batch_samplers) != len(sizes):
            raise ValueError(f"{len(batch_samplers)} batch samplers for {len(sizes)} sources; "
                             "pass one batch sampler per source")
        self.batch_samplers = list(batch_samplers)
        self.p = source_weights(sizes, weights, temperature)
        self.temperature = (1.0 if temperature is None else float(temperature)) \
            if isinstance(weights, str) else None
        self.lengths = [len(s) for s in self.batch_samplers]
        first = self.batch_samplers[0]
        self.batch_size = getattr(first, "batch_size", batch_size)
        self.drop_last = bool(getattr(first, "drop_last", drop_last))
        for i, (n, steps) in enumerate(zip(sizes, self.lengths)):
            if steps == 0 and self.p[i] > 0:
                raise ValueError(
                    f"source {i} has {n} items, which give its sampler no batch (batch_size="
                    f"{self.batch_size}, drop_last={self.drop_last}); "
                    + (f"build source {i}'s sampler with drop_last=False or a batch_size <= {n}"
                       if given else f"use drop_last=False or a batch_size <= {n}")
                    + ", give it weight 0, or leave the source out")
        split = [i for i, sub in enumerate(self.batch_samplers)
                 if self.world_size > 1 and (getattr(sub, "world_size", None) or 1) > 1]
        if split:
            raise ValueError(
                f"source {split[0]}'s sampler is split across world_size="
                f"{self.batch_samplers[split[0]].world_size} ranks, and so is this sampler "
                f"(world_size={self.world_size}): each rank would see a fraction of each "
                "rank's steps; build the source samplers with rank=0, world_size=1 (this "
                "sampler splits the steps), or pass rank=0, world_size=1 here")
        self.exact = isinstance(weights, str) and temperature in (None, 1, 1.0) \
            and num_batches is None
        total = sum(self.lengths) if num_batches is None else check_int(
            num_batches, "num_batches", low=1)
        self.counts = np.array(self.lengths, np.int64) if self.exact else \
            _largest_remainder(self.p, total)
        self.num_batches = int(self.counts.sum())
        n, w = self.num_batches, self.world_size
        if n < w:
            raise ValueError(f"world_size={w} ranks need at least {w} steps per epoch, but the "
                             f"schedule has num_batches={n}; pass num_batches >= {w}, use a "
                             "smaller batch_size or fewer ranks")
        # steps of the shared schedule: a multiple of W, the tail dropped or padded
        self.total_steps = (n // w if self.drop_last else -(-n // w)) * w
        pad = max(self.total_steps - n, 0)  # < W <= num_batches
        # runs (local epochs) of each source's sampler per epoch, at most (padding included)
        self.runs_per_epoch = [max(1, -(-(int(c) + min(pad, int(c))) // max(length, 1)))
                               for c, length in zip(self.counts, self.lengths)]
        self._resume: dict | None = None  # a loaded state, until the next iteration
        self._live = None  # the last iteration's schedule, run per source, iterators, loaded
        self._consumed = self._start_step = 0  # this rank's steps yielded / resumed from
        self._finished = False  # whether the last iteration yielded its whole epoch

    def _build(self, subs, sizes, sampler, batch_size, drop_last) -> list:
        factories = sampler if isinstance(sampler, (list, tuple)) else [sampler] * len(sizes)
        if len(factories) != len(sizes):
            raise ValueError(f"{len(factories)} sampler factories for {len(sizes)} sources; "
                             "pass one factory, or one per source")
        if any(f is None for f in factories) and batch_size is None:
            raise ValueError("batch_size= is needed for the default (uniform) samplers; or pass "
                             "sampler=factory(index, source) / batch_samplers=")
        out = []
        for i, (f, n) in enumerate(zip(factories, sizes)):
            if f is not None:
                out.append(f(i, subs[i]))
            elif n < batch_size:
                raise ValueError(
                    f"source {i} has {n} items, fewer than batch_size={batch_size}"
                    f"{' with drop_last=True' if drop_last else ''}: it cannot fill a batch; "
                    "use a smaller batch_size, leave the source out, or pass its own sampler "
                    "(sampler=[...] or batch_samplers=) and weight 0")
            else:  # one plan shared by all ranks: the ranks split the steps, not the sources
                out.append(UniformBatchSampler(n, batch_size, drop_last=drop_last,
                                               seed=_rng.derive_seed(self.seed, i) & 0x7FFFFFFF,
                                               rank=0, world_size=1))
        return out

    def __len__(self) -> int:
        """This rank's batches per epoch (the same on every rank)."""
        return self.total_steps // self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s source order on the next iteration (the trainer calls it).

        It also starts the loop's new epoch: ``state_dict(consumed=k)`` then counts its steps.
        """
        epoch = check_int(epoch, "epoch", low=0)
        if epoch != self.epoch:
            self._resume = None
        if self._finished or epoch != self.epoch:
            self._live, self._finished, self._consumed = None, False, 0
        self.epoch = epoch

    def schedule(self, epoch: int) -> np.ndarray:
        """The source of every step of ``epoch``'s shared schedule, all ranks' (int64
        [total_steps]: ``num_batches`` steps, the tail dropped or padded to a multiple of W)."""
        order = _rng.permutation(self.num_batches, _rng.derive_seed(self.seed, epoch, 0x5115))
        seq = np.repeat(np.arange(len(self.counts)), self.counts)[order]
        if self.total_steps <= self.num_batches:
            return seq[:self.total_steps]
        return np.concatenate([seq, seq[:self.total_steps - self.num_batches]])

    def _position(self, seq: np.ndarray, steps: int) -> list[tuple[int, int]]:
        """Per source: (run, batches of that run) after the first ``steps`` global steps."""
        done = np.bincount(seq[:steps], minlength=len(self.lengths))
        return [divmod(int(c), max(n, 1)) for c, n in zip(done, self.lengths)]

    def _start(self, i: int, run: int, skip: int = 0, state=None):
        """An iterator over run ``run`` of source ``i``'s sampler: where its saved ``state``
        resumes it (loaded now, so that only the state of the last ``load_state_dict``
        counts), or from the start, ``skip`` batches replayed (samplers without state)."""
        sub = self.batch_samplers[i]
        if state is not None:
            sub.load_state_dict(state)
        elif hasattr(sub, "set_epoch"):
            sub.set_epoch(self.epoch * self.runs_per_epoch[i] + run)
        it = iter(sub)
        for _ in range(0 if state is not None else skip):
            next(it, None)
        return it

    def _draw(self, source: int, current_run: list[int], iters: list) -> list[int]:
        """The next batch of ``source``'s sampler (a fresh run: first use, or the last run is
        exhausted), as indices of the concatenation."""
        batch = next(iters[source], None) if iters[source] is not None else None
        if batch is None:
            if iters[source] is not None:
                current_run[source] += 1
            iters[source] = self._start(source, current_run[source])
            batch = next(iters[source], None)
            if batch is None:
                raise RuntimeError(f"the sampler of source {source} yields no batch (its len() "
                                   f"is {self.lengths[source]})")
        offset = self.ranges[source].start
        return [offset + int(k) for k in batch]

    def __iter__(self):
        seq = self.schedule(self.epoch)
        resume, self._resume = self._resume, None
        w = self.world_size
        start = resume["step"] if resume else 0  # this rank's steps; global steps start * W
        position = self._position(seq, start * w)
        current_run = [run for run, _ in position]
        iters = [None] * len(self.lengths)
        loaded = {}  # source -> (run, within, state) where its loaded state resumes it
        for i, (run, skip) in enumerate(position):
            if resume is not None and resume["sources"][i] is not None:
                loaded[i] = (run, skip, resume["sources"][i])
            if skip or i in loaded:
                iters[i] = self._start(i, run, skip, loaded[i][2] if i in loaded else None)
        self._live, self._finished = (seq, current_run, iters, loaded), False
        self._consumed = self._start_step = start
        for step in range(start, len(self)):
            # all W batches of the step, so that any rank's state holds the same positions
            batches = [self._draw(int(seq[g]), current_run, iters)
                       for g in range(step * w, step * w + w)]
            self._consumed = step + 1
            yield batches[self.rank]
        self._finished = True
        self.epoch += 1

    def _settings(self) -> dict:
        """What the schedule and its batches depend on, as recorded in a state."""
        return {"seed": self.seed, "world_size": self.world_size, "drop_last": self.drop_last,
                "sizes": [len(r) for r in self.ranges], "lengths": [int(n) for n in self.lengths],
                "weights": [float(v) for v in self.p], "temperature": self.temperature,
                "num_batches": self.num_batches, "counts": [int(c) for c in self.counts]}

    def state_dict(self, consumed: int | None = None) -> dict:
        """The state after this rank's first ``consumed`` batches of the epoch (default: all
        it yielded): kind, settings, epoch, step and, for each source whose sampler has a
        ``state_dict``, its state at that point (only numbers, strings, lists, dicts, None and
        tensors) and a checksum. After the sampler yielded its whole epoch and before
        ``set_epoch`` or the next iteration, ``consumed`` below ``len()`` refers to that epoch
        (a prefetching loader ran ahead of the training loop); ``consumed == len()``, or None,
        gives the next epoch's start."""
        n = len(self)
        k = None if consumed is None else check_int(consumed, "consumed", low=0)
        live, epoch, first = self._live, self.epoch, self._start_step
        if live is not None and self._finished:  # the sampler yielded all of epoch - 1
            if k is None or k == n:  # and the loop trained it: the next epoch's start
                live, yielded, k, first = None, 0, 0, 0
            else:
                epoch, yielded = epoch - 1, n
        elif live is not None:
            yielded = self._consumed
        else:  # not iterated since set_epoch / construction, or a loaded state not yet used
            yielded = first = self._resume["step"] if self._resume else 0
        k = yielded if k is None else k
        if not first <= k <= yielded:
            raise ValueError(f"consumed={k} must be between {first}"
                             f"{' (where this epoch was resumed)' if first else ''} and the "
                             f"{yielded} batches this rank's sampler yielded of epoch {epoch} "
                             f"({n} per epoch)")
        states = [None] * len(self.lengths)
        if live is not None:
            seq, current_run, _, loaded = live
            for i, (run, within) in enumerate(self._position(seq, k * self.world_size)):
                sub = self.batch_samplers[i]
                if not within or run != current_run[i]:
                    continue  # a run not begun (None), or one since left: replayed on resume
                if loaded.get(i, (None, None))[:2] == (run, within):  # not advanced since
                    states[i] = loaded[i][2]
                elif hasattr(sub, "state_dict"):
                    states[i] = sub.state_dict(within)
        elif self._resume is not None:
            states = list(self._resume["sources"])
        state = {"kind": type(self).__name__, "epoch": epoch, "step": k, "rank": self.rank,
                 "sources": states, **self._settings()}
        return seal(state, "sampler state")

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields this rank's remaining batches of the saved epoch.

        A state saved on any rank resumes any rank (same ``world_size``); a state of another
        kind of sampler, of other settings (weights, temperature, sources, ...), incomplete or
        corrupted raises ``ValueError``.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be the dict of a sampler's state_dict(), got "
                             f"{type(state).__name__}")
        mine, kind = type(self).__name__, state.get("kind")
        if kind != mine:
            verify(state, "sampler state")  # a corrupted name is reported as such
            saved = f"a {kind}" if isinstance(kind, str) else "a sampler without a recorded kind"
            raise ValueError(f"state was saved by {saved} but this sampler is a {mine}; load it "
                             f"into the sampler that saved it, or pass a {mine}'s state_dict()")
        settings = self._settings()
        check_state_keys(state, ["epoch", "step", "sources", *settings, INTEGRITY_KEY])
        verify(state, "sampler state")
        diffs = [(key, state[key], mine_) for key, mine_ in settings.items()
                 if not _same(state[key], mine_)]
        if diffs:
            raise ValueError(
                "state was saved with " + ", ".join(f"{k}={_shown(v)}" for k, v, _ in diffs)
                + " but this sampler has " + ", ".join(f"{k}={_shown(v)}" for k, _, v in diffs)
                + "; construct it with the same sources, source samplers, weights, temperature, "
                "num_batches, seed, world_size and drop_last")
        step, sources = check_int(state["step"], "state['step']", low=0, high=len(self)), \
            list(state["sources"])
        for i, (sub, saved) in enumerate(zip(self.batch_samplers, sources)):
            if saved is not None and not hasattr(sub, "load_state_dict"):
                raise ValueError(f"state holds a state of source {i}'s sampler, but this one "
                                 f"({type(sub).__name__}) has no load_state_dict; pass the "
                                 "source samplers the state was saved with")
        self.epoch = check_int(state["epoch"], "state['epoch']", low=0)
        self._resume = {"step": step, "sources": sources}
        self._live, self._finished, self._consumed = None, False, 0


def single_source_batch_sampler(weights="proportional", temperature: float | None = None,
                                num_batches: int | None = None) -> Callable:
    """``SentenceTransformerTrainingArguments(multi_dataset_batch_sampler=...)``: a picklable
    callable ``(dataset, batch_samplers, generator, seed)`` building a
    :class:`SingleSourceBatchSampler` with these weights (checked now where they can be) and
    ``rank=0, world_size=1``: accelerate shards the batches of the one schedule across ranks.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.single_source_sampler import single_source_batch_sampler
        >>> make = single_source_batch_sampler(temperature=2.0)
        >>> data = torch.utils.data.ConcatDataset([range(30), range(10)])
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> subs = [BatchSampler(SequentialSampler(d), 5, False) for d in data.datasets]
        >>> s = make(data, batch_samplers=subs, generator=None, seed=0)
        >>> len(s), sorted({min(b) >= 30 for b in s})
        (8, [False, True])
    """
    if not isinstance(weights, str):
        source_weights([1] * len(list(weights)), weights, temperature)
    else:
        source_weights([1], weights, temperature)
    if num_batches is not None:
        check_int(num_batches, "num_batches", low=1)
    return functools.partial(SingleSourceBatchSampler, weights=weights, temperature=temperature,
                             num_batches=num_batches, rank=0, world_size=1)

