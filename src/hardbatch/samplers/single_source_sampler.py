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
from .._validation import check_generator, check_int
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
        seed: the seed of the source order (and of the default samplers).
        sources: instead of ``dataset``: per source, its size, its index ``range`` in the
            concatenation, or a sized dataset (sources laid end to end).
        sampler: with no ``batch_samplers``: ``factory(index, source)`` returning the batch
            sampler of source ``index`` (``source``: the sub-dataset, else its size), or a list
            of such factories; None: ``UniformBatchSampler`` of ``batch_size``.
        batch_size, drop_last: of the default samplers.
        weights: ``"proportional"`` (default) or one non-negative weight per source.
        temperature: T > 0 with ``weights="proportional"``: p_i ~ n_i^(1/T).
        num_batches: steps per epoch (default: the sources' batches per epoch summed).

    An epoch is ``num_batches`` steps. Size-proportional without a temperature runs every
    source's sampler once, in a seeded random interleaving (sentence-transformers'
    ``ProportionalBatchSampler``); otherwise source i gets ``round(p_i * num_batches)`` steps
    (largest remainders), running its sampler again (next epoch of it) when it is exhausted, or
    stopping it part-way. Deterministic in (seed, epoch); ``state_dict`` / ``load_state_dict``
    resume mid-epoch (a source sampler with its own ``state_dict``, as hardbatch's, is restored
    exactly; others are replayed).

    Example:
        >>> import hardbatch as hb
        >>> s = hb.SingleSourceBatchSampler(sources=[40, 20], batch_size=8, temperature=2.0)
        >>> batches = list(s)
        >>> len(batches), all(max(b) < 40 or min(b) >= 40 for b in batches)
        (8, True)
    """

    def __init__(self, dataset=None, batch_samplers: Sequence | None = None, generator=None,
                 seed: int | None = 0, *, sources: Sequence | None = None,
                 sampler: Callable | Sequence[Callable] | None = None,
                 batch_size: int | None = None, drop_last: bool = False,
                 weights="proportional", temperature: float | None = None,
                 num_batches: int | None = None) -> None:
        self.ranges = _source_ranges(dataset, sources)
        self.seed = check_int(0 if seed is None else seed, "seed")
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
        self.exact = isinstance(weights, str) and temperature in (None, 1, 1.0) \
            and num_batches is None
        total = sum(self.lengths) if num_batches is None else check_int(
            num_batches, "num_batches", low=1)
        self.counts = np.array(self.lengths, np.int64) if self.exact else \
            _largest_remainder(self.p, total)
        self.num_batches = int(self.counts.sum())
        # runs (local epochs) of each source's sampler per epoch
        self.runs = [max(1, -(-int(c) // max(n, 1))) for c, n in zip(self.counts, self.lengths)]
        self._resume: dict | None = None
        self._consumed = 0

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
                    "use a smaller batch_size, weight 0 for it, or leave the source out")
            else:
                out.append(UniformBatchSampler(n, batch_size, drop_last=drop_last,
                                               seed=_rng.derive_seed(self.seed, i) & 0x7FFFFFFF,
                                               rank=0, world_size=1))
        return out

    def __len__(self) -> int:
        return self.num_batches

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s source order on the next iteration (the trainer calls it)."""
        epoch = check_int(epoch, "epoch", low=0)
        if epoch != self.epoch:
            self._resume = None
        self.epoch = epoch

    def schedule(self, epoch: int) -> np.ndarray:
        """The source of every step of ``epoch`` (int64 [num_batches])."""
        order = _rng.permutation(self.num_batches, _rng.derive_seed(self.seed, epoch, 0x5115))
        return np.repeat(np.arange(len(self.counts)), self.counts)[order]

    def _position(self, seq: np.ndarray, steps: int) -> list[tuple[int, int]]:
        """Per source: (run, batches of that run) after the first ``steps`` steps."""
        done = np.bincount(seq[:steps], minlength=len(self.lengths))
        return [divmod(int(c), max(n, 1)) for c, n in zip(done, self.lengths)]

    def _start(self, i: int, run: int, skip: int = 0, state=None):
        sub = self.batch_samplers[i]
        if state is not None:
            sub.load_state_dict(state)
        elif hasattr(sub, "set_epoch"):
            sub.set_epoch(self.epoch * self.runs[i] + run)
        it = iter(sub)
        for _ in range(0 if state is not None else skip):  # replay (samplers without state)
            next(it, None)
        return it

    def __iter__(self):
        seq = self.schedule(self.epoch)
        resume, self._resume = self._resume, None
        start = resume["step"] if resume else 0
        position = self._position(seq, start)
        runs = [p[0] for p in position]
        iters = [None] * len(self.lengths)
        for i, (run, skip) in enumerate(position):
            saved = resume["sources"][i] if resume else None
            if skip or saved is not None:
                iters[i] = self._start(i, run, skip, saved)
        self._live = (seq, runs, iters)
        for step in range(start, self.num_batches):
            i = int(seq[step])
            batch = next(iters[i], None) if iters[i] is not None else None
            while batch is None:  # a fresh run: first use, or the last one is exhausted
                if iters[i] is not None:
                    runs[i] += 1
                iters[i] = self._start(i, runs[i])
                batch = next(iters[i], None)
                if batch is None and self.lengths[i] == 0:
                    raise RuntimeError(f"the sampler of source {i} yields no batch")
            self._consumed = step + 1
            offset = self.ranges[i].start
            yield [offset + int(k) for k in batch]
        self._live = None
        self._consumed = 0
        self.epoch += 1

    def state_dict(self, consumed: int | None = None) -> dict:
        """The epoch, the steps consumed and, for each source whose sampler has a
        ``state_dict``, its state at that point (only tensors, numbers, lists, dicts, None)."""
        live = getattr(self, "_live", None)
        consumed = self._consumed if consumed is None else check_int(consumed, "consumed",
                                                                      low=0)
        if consumed > self._consumed:
            raise ValueError(f"consumed={consumed} exceeds the {self._consumed} batches yielded "
                             "this epoch")
        states = [None] * len(self.lengths)
        if live is not None:
            seq, runs, _ = live
            for i, (run, within) in enumerate(self._position(seq, consumed)):
                sub = self.batch_samplers[i]
                if within and run == runs[i] and hasattr(sub, "state_dict"):
                    states[i] = sub.state_dict(within)
        return {"epoch": self.epoch, "step": consumed, "seed": self.seed,
                "num_batches": self.num_batches, "sources": states}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields the remaining batches of the saved epoch."""
        for key in ("seed", "num_batches"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state was saved with {key}={state[key]} but this sampler has "
                                 f"{key}={getattr(self, key)}; construct it with the same value")
        if len(state["sources"]) != len(self.lengths):
            raise ValueError(f"state holds {len(state['sources'])} sources, this sampler "
                             f"{len(self.lengths)}")
        self.epoch = int(state["epoch"])
        self._resume = {"step": int(state["step"]), "sources": list(state["sources"])}


def single_source_batch_sampler(weights="proportional", temperature: float | None = None,
                                num_batches: int | None = None) -> Callable:
    """``SentenceTransformerTrainingArguments(multi_dataset_batch_sampler=...)``: a picklable
    callable ``(dataset, batch_samplers, generator, seed)`` building a
    :class:`SingleSourceBatchSampler` with these weights (checked now where they can be).

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
                             num_batches=num_batches)

