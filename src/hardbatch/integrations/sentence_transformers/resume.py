"""Resuming a ``SentenceTransformerTrainer`` run with the batches of the uninterrupted run.

On ``trainer.train(resume_from_checkpoint=...)`` the trainer loads the checkpoint's weights
*before* it builds its training loader, then skips the batches of the interrupted epoch that
were trained already (it iterates the batch sampler and drops the first ones). A sampler that
plans from the model being trained would plan that epoch again, from the checkpoint's weights
instead of those the epoch began with, and the skip would cut into another plan: rows trained
twice, rows never trained. So the sampler's state travels with the checkpoint:

* :func:`resume_callback` is a ``transformers.TrainerCallback`` that the factory registers
  with the trainer calling it (first in its list, so that a later callback that raises in
  ``on_save`` cannot keep it from writing). ``on_save`` writes ``hardbatch_sampler.pt``
  (:data:`RESUME_FILE`) into the checkpoint folder: the sampler's ``state_dict`` at the
  trainer's position (the pending batches and the structure of the epoch), the rows trained so
  far this epoch and what it was made for (sampler, batch size, rows, a hash of each row's
  text), checksummed and readable with ``torch.load(weights_only=True)``.
* ``on_train_begin`` of a resumed run loads it: the sampler yields the batches the trainer
  skips as placeholders (never loaded) and then exactly the batches of the uninterrupted run.
  A checkpoint of another sampler, batch size or dataset raises ``ValueError`` before training.
* Where the state cannot be loaded (written by another hardbatch, some rows' texts changed,
  another gradient accumulation) the rest of the epoch is planned afresh from the rows not yet
  trained (:func:`rest_of_epoch`), so a partition sampler's epoch still trains every row once;
  a checkpoint without the file: the epoch is planned anew and the trainer skips into it. One
  warning says why the batches differ from those of the uninterrupted run.
* Several datasets (a ``DatasetDict``; the trainer's ``multi_dataset_batch_sampler`` draws
  from one sampler per dataset): each dataset's sampler logs the batches it yields, in the
  order the combining sampler draws them (:attr:`EpochProgress.log`, one list per epoch), so
  that a checkpoint holds each dataset's state at its own position (:func:`sources_state`)
  and a resume restores each one (:func:`restore_sources`). Exact when every dataset's
  sampler runs once per epoch, as the trainer's round-robin and proportional samplers and
  hardbatch's size-proportional single-source sampler run them.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import inspect
import os
import sys

import numpy as np
import torch

from ..._integrity import library_version, seal, verify
from ..._logging import get_logger
from ...samplers.base import LOOKBACK
from ...keys.repair import separate_keys
from .texts import column_texts

__all__ = ["RESUME_FILE", "EpochProgress", "checkpoint_state", "register_resume",
           "restore_sources", "resume_callback", "rest_of_epoch", "restore", "sources_state",
           "trainer_position"]

RESUME_FILE = "hardbatch_sampler.pt"  # beside the trainer's files in each checkpoint folder
FORMAT = 1  # of the file's content
SOURCES = "datasets"  # the kind of a multi-dataset run's file: one state per dataset
_log = get_logger("integrations.sentence_transformers")
_WHAT = "the hardbatch sampler state"


class EpochProgress:
    """What a :class:`~.sampler.HardNegativeBatchSampler` yields in the epoch it iterates (to
    know the rows trained at a checkpoint) and a resume waiting for its epoch.

    ``pending`` is ``(epoch, skip, trained, replan, only)``: yield ``skip`` placeholder batches
    (the trainer drops them), then the sampler's own batches, or with ``replan`` the rest of the
    epoch planned afresh from the rows not in ``trained`` (a bool ``[N]`` array or None); with
    ``only`` nothing after them (the epoch was trained; the sampler holds the next one's state).
    ``log``, shared by the samplers of a multi-dataset run, gets ``(progress, epoch, index)``
    for every batch yielded.
    """

    def __init__(self) -> None:
        self.epoch, self.start, self.yielded = -1, 0, 0
        self.base: np.ndarray | None = None  # rows trained before ``start`` (a resume's)
        self.counts: np.ndarray | None = None  # batches holding each row, yielded from ``start``
        self.recent: collections.deque = collections.deque(maxlen=LOOKBACK)  # loader's prefetch
        self.exact = True  # False while an epoch planned afresh runs
        self.pending: tuple[int, int, np.ndarray | None, bool] | None = None
        self.hashes: torch.Tensor | None = None  # of the rows' texts, computed once
        self.log: list | None = None
        self.whole = False  # every batch of ``epoch`` yielded, the iterator not run to its end

    def keeps(self, epoch: int) -> bool:
        """Whether ``epoch`` is a resumed one whose batches were all trained (the sampler then
        keeps its loaded state, the next epoch's, through ``set_epoch(epoch)``)."""
        return self.pending is not None and self.pending[4] and self.pending[0] == epoch

    def iterate(self, sampler):
        hard = sampler.hard_sampler
        only = self.keeps(sampler.epoch)
        epoch = sampler.epoch if only else int(getattr(hard, "epoch", sampler.epoch))
        pending, self.pending = self.pending, None
        skip, trained, replan = 0, None, False
        if pending is not None and pending[0] == epoch:
            _, skip, trained, replan, _ = pending
        self.epoch, self.start, self.yielded, self.base = epoch, skip, 0, trained
        self.whole = False
        steps = len(sampler)
        self.counts = np.zeros(len(sampler.dataset), np.int32)
        self.recent.clear()
        self.exact = not replan
        placeholder = list(range(min(sampler.batch_size, len(sampler.dataset))))
        for index in range(skip):
            self._logged(epoch, index)
            self.whole = index + 1 >= steps
            yield list(placeholder)
        batches = [] if only else rest_of_epoch(sampler, epoch, skip, trained) if replan else hard
        for batch in batches:
            rows = np.asarray(batch, np.int64)
            np.add.at(self.counts, rows, 1)
            self.recent.append(rows)
            self._logged(epoch, skip + self.yielded)
            self.yielded += 1
            self.whole = skip + self.yielded >= steps
            yield rows.tolist()
        self.whole = False  # run to its end: the sampler moved on to the next epoch itself

    def _logged(self, epoch: int, index: int) -> None:
        if self.log is not None:
            self.log.append((self, epoch, index))

    def trained(self, num_items: int, epoch: int, consumed: int) -> np.ndarray:
        """The rows of the first ``consumed`` batches of ``epoch`` (bool ``[N]``; those yielded
        after them, up to 1024, are the loader's prefetch, not trained yet)."""
        mask = np.zeros(num_items, bool)
        if epoch != self.epoch or self.counts is None:
            return mask
        counts = self.counts.copy()
        ahead = min(max(self.start + self.yielded - consumed, 0), len(self.recent))
        for rows in list(self.recent)[len(self.recent) - ahead:]:
            np.subtract.at(counts, rows, 1)
        mask |= counts > 0
        if self.base is not None:
            mask |= self.base
        return mask


def rest_of_epoch(sampler, epoch: int, done: int, trained: np.ndarray | None) -> list:
    """Batches ``done`` .. of ``epoch`` planned afresh from the rows not in ``trained``.

    The sampler plans the epoch as usual (from the model as it is now); its rows, in the order of
    that plan, less those trained, are cut into the epoch's remaining batches (no key twice in a
    batch where the sampler has duplicate keys). Partition samplers get each row not yet trained
    once (a short last batch, left out with ``drop_last``); walk samplers (batches of B rows that
    may overlap) are topped up with trained rows.

    Example:
        >>> import datasets, numpy as np
        >>> from hardbatch.integrations.sentence_transformers import HardNegativeBatchSampler
        >>> data = datasets.Dataset.from_dict({"anchor": [f"t{i}" for i in range(20)]})
        >>> s = HardNegativeBatchSampler(data, 8, model=None, sampler="uniform")
        >>> trained = np.zeros(20, bool); trained[next(iter(s))] = True  # batch 0 trained
        >>> rest = rest_of_epoch(s, 0, 1, trained)  # batches 1, 2 of epoch 0: the 12 others
        >>> [len(b) for b in rest], bool(trained[np.concatenate(rest)].any())
        ([8, 4], False)
    """
    hard = sampler.hard_sampler
    n, size = len(sampler.dataset), sampler.batch_size
    hard.set_epoch(epoch)
    plan = [np.asarray(b, np.int64) for b in hard]
    order = np.concatenate(plan) if plan else np.empty(0, np.int64)
    _, first = np.unique(order, return_index=True)
    order = np.concatenate([order[np.sort(first)], np.setdiff1d(np.arange(n), order)])
    done_rows = np.zeros(n, bool) if trained is None else trained
    rest = order[~done_rows[order]]
    slots = max(len(sampler) - done, 0) * size
    kept = min(len(rest), slots) if getattr(hard, "batches_partition", True) else min(n, slots)
    if sampler.drop_last:  # as the sampler: no short batch
        kept -= kept % size
    order = np.concatenate([rest, order[done_rows[order]]])
    try:
        order = separate_keys(order, kept, size, getattr(hard, "duplicate_keys", None))
    except ValueError:  # keys that cannot be kept apart in what is left: keep the plan's order
        pass
    return [order[i:min(i + size, kept)] for i in range(0, kept, size)]


def trainer_position(args, state, loader) -> tuple[int, int] | None:
    """(epoch, the sampler's batches consumed in it) at ``state.global_step``, as the trainer
    counts them when it resumes (``gradient_accumulation_steps`` batches per update step, on
    each of ``world_size`` processes); None for a loader without a length."""
    try:
        steps = len(loader)
    except TypeError:
        return None
    accumulate = max(int(getattr(args, "gradient_accumulation_steps", 1)), 1)
    per_epoch = max(steps // accumulate + int(steps % accumulate > 0), 1)
    epoch, done = divmod(int(state.global_step), per_epoch)
    return epoch, done * accumulate * max(int(getattr(args, "world_size", 1)), 1)


def _text_hashes(sampler) -> torch.Tensor:
    """A 64-bit hash of each row's text (of the embedded column), computed once."""
    progress = sampler.progress
    if progress.hashes is None:
        texts = sampler.source.texts if sampler.source is not None else \
            column_texts(sampler.dataset, sampler.text_column)
        progress.hashes = torch.tensor([int.from_bytes(hashlib.blake2b(
            t.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little", signed=True)
            for t in texts], dtype=torch.int64)
    return progress.hashes


def _made_for(sampler) -> dict:
    return {"kind": sampler.kind, "num_items": len(sampler.dataset),
            "batch_size": sampler.batch_size, "drop_last": sampler.drop_last}


def checkpoint_state(sampler, epoch: int, consumed: int, at: int | None = None) -> dict:
    """The content of :data:`RESUME_FILE` after ``consumed`` batches of ``epoch`` (``at``: the
    sampler's ``state_dict`` argument, default ``consumed`` or None at an epoch's start)."""
    hard, progress = sampler.hard_sampler, sampler.progress
    state, note = {}, ""
    if not progress.exact:
        note = "it was written in an epoch that was itself planned afresh"
    elif callable(getattr(hard, "state_dict", None)):
        try:
            state = hard.state_dict(consumed or None if at is None else at)
        except ValueError as err:  # e.g. a loader far ahead of the loop
            note = f"the sampler could not save its state ({err})"
    trained = progress.trained(len(sampler.dataset), epoch, consumed)
    return seal({**_made_for(sampler), "format": FORMAT, "epoch": epoch, "consumed": consumed,
                 "texts": _text_hashes(sampler), "trained": torch.from_numpy(trained),
                 "sampler": state, "exact": not note, "note": note}, _WHAT)


def _check_made_for(sampler, saved: dict, path: str) -> int:
    """``ValueError`` naming ``path`` unless it was made for this sampler, batch size and
    dataset; the number of rows whose text changed (a minority) otherwise."""
    have = _made_for(sampler)
    diffs = [k for k in have if saved.get(k) != have[k]]
    fix = ("; resume with the same dataset, sampler and batch size "
           "(per_device_train_batch_size), or train afresh without resume_from_checkpoint")
    if diffs:
        was = ", ".join(f"{k}={saved.get(k)!r}" for k in diffs)
        now = ", ".join(f"{k}={have[k]!r}" for k in diffs)
        raise ValueError(f"checkpoint {path} was written with {was} but this run has {now}{fix}")
    hashes = saved.get("texts")
    if not isinstance(hashes, torch.Tensor) or hashes.shape != (have["num_items"],):
        return 0  # not this format: told by the caller
    changed = int((hashes != _text_hashes(sampler)).sum())
    if 2 * changed > have["num_items"]:
        raise ValueError(f"checkpoint {path} was written for another dataset: {changed} of its "
                         f"{have['num_items']} rows' texts differ from this run's{fix}")
    return changed


def restore(sampler, saved: dict, path: str, epoch: int, consumed: int) -> str | None:
    """Load a checkpoint's :data:`RESUME_FILE` content into ``sampler`` for a resume after
    ``consumed`` batches of ``epoch``: None if the run continues with the batches of the
    uninterrupted run, else why it cannot (the rest of the epoch is then planned afresh)."""
    verify(saved, f"{_WHAT} in {path}")
    if saved.get("kind") == SOURCES:
        raise ValueError(f"checkpoint {path} was written by a run on several datasets (a "
                         "DatasetDict) but this run trains on one; resume with its datasets")
    changed = _check_made_for(sampler, saved, path)
    writer = (saved.get("integrity") or {}).get("library", "?")
    by = "" if writer == library_version() else f" (it was written by hardbatch {writer})"
    where = (saved.get("epoch"), saved.get("consumed"))
    state = saved.get("sampler") or {}
    why = None
    if saved.get("format") != FORMAT:
        why = f"its format {saved.get('format')} is not this hardbatch's {FORMAT}{by}"
    elif changed:
        why = f"{changed} of the dataset's {len(sampler.dataset)} rows changed their text"
    elif where != (epoch, consumed):
        why = (f"it was written after {where[1]} batches of epoch {where[0]} but the trainer "
               f"resumes after {consumed} batches of epoch {epoch} (another "
               "gradient_accumulation_steps or number of processes?)")
    elif not saved.get("exact", False):
        why = saved.get("note") or "it holds no sampler state"
    elif state:
        try:
            sampler.hard_sampler.load_state_dict(state)
        except ValueError as err:
            why = f"its sampler state does not load into this sampler ({err}){by}"
    trained = np.asarray(saved["trained"], bool) if where[0] == epoch else None
    if why is None:  # placeholders for the skipped batches, then the sampler's own
        sampler.progress.pending = (epoch, consumed, trained, False,
                                    consumed >= len(sampler)) if state else None
    elif consumed:
        sampler.progress.pending = (epoch, consumed, trained, True, False)
    if sampler.progress.pending is not None:  # (several processes: no set_epoch reaches it)
        sampler.set_epoch(epoch)
    return why


def _mine(sampler, samplers) -> bool:
    return any(sampler is s for s in samplers) and hasattr(sampler, "progress")


def sources_state(combined, samplers, log: list, epoch: int, consumed: int) -> dict:
    """The content of :data:`RESUME_FILE` for a multi-dataset run after ``consumed`` batches of
    ``epoch`` of ``combined`` (the trainer's multi-dataset sampler): the state of each of its
    samplers (those of ``samplers``, the factory's) at its own position, found in ``log``."""
    log = log if consumed else []  # at an epoch's start the log is the last epoch's
    out = []
    for sub in combined.batch_samplers:
        if not _mine(sub, samplers):
            out.append({})
            continue
        done = [(e, k + 1) for p, e, k in log[:consumed] if p is sub.progress]
        ahead = [(e, 0) for p, e, k in log[consumed:] if p is sub.progress]
        if done or ahead:  # drawn this epoch: trained up to there (or fetched ahead only)
            out.append(checkpoint_state(sub, *(done or ahead)[-1 if done else 0],
                                        at=None if done else 0))
        else:  # not drawn yet this epoch: its state at the end of the last one
            out.append(checkpoint_state(sub, int(getattr(sub.hard_sampler, "epoch",
                                                         sub.epoch)), 0))
    return seal({"format": FORMAT, "kind": SOURCES, "epoch": epoch, "consumed": consumed,
                 "sources": out}, _WHAT)


def restore_sources(combined, samplers, saved: dict, path: str, epoch: int,
                    consumed: int) -> str | None:
    """Load a multi-dataset run's :data:`RESUME_FILE` content into the samplers of
    ``combined``: None if the run continues with the batches of the uninterrupted run, else
    why not (each dataset's sampler whose state does not load plans the rest of its epoch
    afresh, from its rows not yet trained)."""
    verify(saved, f"{_WHAT} in {path}")
    subs, states = list(combined.batch_samplers), saved.get("sources")
    if saved.get("kind") != SOURCES or not isinstance(states, list) or len(states) != len(subs):
        was = f"{len(states)} datasets" if isinstance(states, list) else "one dataset"
        raise ValueError(f"checkpoint {path} was written by a run on {was} but this run trains "
                         f"on {len(subs)}; resume with the same datasets (train_dataset), or "
                         "train afresh without resume_from_checkpoint")
    where = (saved.get("epoch"), saved.get("consumed"))
    if where != (epoch, consumed):
        return (f"it was written after {where[1]} batches of epoch {where[0]} but the trainer "
                f"resumes after {consumed} batches of epoch {epoch} (another "
                "gradient_accumulation_steps or number of processes?)")
    why = []
    for i, (sub, state) in enumerate(zip(subs, states)):
        at = (int(state["epoch"]), int(state["consumed"])) if state else None
        if at is None or not _mine(sub, samplers):
            continue
        said = (f"its sampler ran its own epoch {at[0]} in epoch {epoch} (the multi-dataset "
                "sampler runs it several times an epoch)") if at[1] and at[0] != epoch else \
            restore(sub, state, path, *at)
        why += [f"dataset {i}: {said}"] if said else []
    return "; ".join(why) or None


@functools.lru_cache(maxsize=None)
def _callback_class(base: type) -> type:
    return type("HardbatchResumeCallback", (ResumeHooks, base), {
        "__doc__": ResumeHooks.__doc__, "__module__": __name__})


def resume_callback(factory=None):
    """A ``transformers.TrainerCallback`` that saves the training sampler's state of ``factory``
    (a :class:`~.factory.HardNegativeBatchSamplerFactory`) with every checkpoint and restores
    it when a run resumes. The factory registers one with the trainer that calls it; pass it as
    ``callbacks=[...]`` (or ``trainer.add_callback``) where something else builds the loader."""
    try:
        from transformers import TrainerCallback
    except ImportError as exc:  # pragma: no cover - transformers is there with the trainer
        raise ImportError("resuming hard-negative batches needs transformers' TrainerCallback "
                          "(transformers >= 4, with sentence-transformers >= 3)") from exc
    return _callback_class(TrainerCallback)(factory)


class ResumeHooks:
    """Saves the hardbatch training sampler's state with each checkpoint (``on_save``:
    ``hardbatch_sampler.pt`` in ``output_dir/checkpoint-{global_step}``) and restores it when
    the trainer resumes from a checkpoint (``on_train_begin``; a plan's replay,
    :func:`~hardbatch.plan_files.plan_batch_sampler`, gets the trainer's epoch only)."""

    def __init__(self, factory=None) -> None:
        self.factory = factory
        self.checkpoint: str | None = None  # what the trainer resumes from, seen by the factory
        self.pulls: list = []  # a multi-dataset run's EpochProgress.log of the current epoch
        self._said: set[str] = set()

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            _log.warning(message)

    def _sampler(self, loader):
        """The factory's sampler that ``loader`` draws from (through accelerate's and the
        trainer's wrappers), or the multi-dataset sampler drawing from the factory's."""
        mine = [] if self.factory is None else self.factory.samplers
        obj = loader
        for _ in range(8):
            obj = getattr(obj, "batch_sampler", None)
            if obj is None:
                return None
            if any(obj is s for s in mine):
                return obj
            if hasattr(obj, "batch_samplers"):
                return obj if any(_mine(s, mine) for s in obj.batch_samplers) else None
        return None

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.pulls.clear()  # each dataset's batches drawn this epoch, in order

    def on_save(self, args, state, control, **kwargs):
        loader = kwargs.get("train_dataloader")
        sampler = self._sampler(loader)
        where = trainer_position(args, state, loader)
        if sampler is None or where is None or not getattr(args, "should_save", True) or not \
                hasattr(sampler, "progress") and not hasattr(sampler, "batch_samplers"):
            return  # (a plan's replay has no state: its batches are the plan's)
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(folder):
            self._say(f"hardbatch: no checkpoint folder {folder} to save the sampler state in")
            return
        path = os.path.join(folder, RESUME_FILE)
        torch.save(sources_state(sampler, self.factory.samplers, self.pulls, *where)
                   if hasattr(sampler, "batch_samplers") else checkpoint_state(sampler, *where),
                   path + ".tmp")
        os.replace(path + ".tmp", path)

    def on_train_begin(self, args, state, control, **kwargs):
        loader = kwargs.get("train_dataloader")
        sampler = self._sampler(loader)
        where = trainer_position(args, state, loader)
        subs = [s for s in getattr(sampler, "batch_samplers", [])
                if _mine(s, self.factory.samplers)]
        for sub in subs:  # a multi-dataset run: its samplers log what they yield
            sub.progress.log = self.pulls
        if sampler is None or where is None or not state.global_step:
            return  # a fresh run
        epoch, consumed = where
        # The trainer's set_epoch does not reach it through accelerate's wrappers in a resumed
        # epoch of several processes; a multi-dataset sampler passes it on to its datasets'.
        sampler.set_epoch(epoch)
        if not subs and not hasattr(sampler, "progress"):
            return  # a plan's replay (PlanBatchSampler): the trainer's skip finds its place
        folder = self.checkpoint or os.path.join(args.output_dir,
                                                 f"checkpoint-{state.global_step}")
        path = os.path.join(folder, RESUME_FILE)
        if getattr(args, "ignore_data_skip", False):
            why = "ignore_data_skip=True: the trainer restarts the epoch's data"
        elif not os.path.isfile(path):
            why = f"{folder} holds no {RESUME_FILE} (written without hardbatch's resume support)"
        elif subs:
            why = restore_sources(sampler, subs, torch.load(path, weights_only=True), folder,
                                  epoch, consumed)
        else:
            why = restore(sampler, torch.load(path, weights_only=True), folder, epoch, consumed)
        if why is None:
            _log.info("resuming from %s: the sampler continues epoch %d after %d batches as "
                      "planned", folder, epoch, consumed)
            return
        rest = "planned afresh from the rows not yet trained" if any(
            s.progress.pending and s.progress.pending[3] for s in subs or [sampler]) else \
            "planned from the model as it is now"
        self._say(f"resuming from {folder}: {why}; the rest of epoch {epoch} is {rest}, so its "
                  "batches may differ from those of the uninterrupted run")


def _calling_trainer(depth: int = 40):
    """The ``transformers.Trainer`` whose method is on the call stack, and the checkpoint its
    ``train`` resumes from (its ``resume_from_checkpoint``), or None."""
    module = sys.modules.get("transformers")
    trainer_class = getattr(module, "Trainer", None) if module is not None else None
    if trainer_class is None:
        return None, None
    frame, trainer, checkpoint = inspect.currentframe(), None, None
    try:
        while frame is not None and depth:
            local = frame.f_locals
            if isinstance(local.get("self"), trainer_class):
                trainer = trainer or local["self"]
                resume = local.get("resume_from_checkpoint")
                if checkpoint is None and isinstance(resume, (str, os.PathLike)):
                    checkpoint = os.fspath(resume)
            frame, depth = frame.f_back, depth - 1
    finally:
        del frame
    return trainer, checkpoint


def register_resume(factory, dataset) -> None:
    """Called by the factory for each dataset it batches: when a trainer builds its training
    loader, make sure the trainer has the factory's resume callback (first in its list) and
    tell the callback which checkpoint the run resumes from."""
    trainer, checkpoint = _calling_trainer()
    train = getattr(trainer, "train_dataset", None)
    datasets = list(train.values()) if isinstance(train, dict) else [train]
    if trainer is None or not any(dataset is d for d in datasets):
        return
    callbacks = trainer.callback_handler.callbacks
    hooks = next((c for c in callbacks if isinstance(c, ResumeHooks) and c.factory is factory),
                 None)
    if hooks is None:
        hooks = resume_callback(factory)
        callbacks.insert(0, hooks)
    hooks.checkpoint = checkpoint
