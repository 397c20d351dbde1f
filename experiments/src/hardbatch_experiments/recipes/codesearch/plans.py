"""Plan files of code-search runs (issue 45): the exact batches of a run, to train on them again
on another machine.

``--write-plan [DIR]`` records the batches that every arm's batch sampler yielded to the trainer
(sentence-transformers' ``NoDuplicatesBatchSampler`` for ``default`` / ``mined``, hardbatch's
samplers, teacher or model refreshed) and writes them, with the run's identity (arm, seed, run
tag, the SHA-256 of the training rows, the settings that shape training, the command), to a
plan file beside the run's JSON: ``codesearch__ARM__seedS__TAG.plan.parquet``, through
:func:`hardbatch.plan_files.write_batches` (the library's format). ``--replay-plan FILE``
trains from that file instead of building the sampler (``plan_batch_sampler``): a rerun
anywhere feeds the trainer the same batches, so only the encoder's floating point differs.

A run ends part-way into an epoch when ``--steps`` stops it (the usual case) or with fractional
``--epochs``. The plan then holds what the sampler yielded of that epoch (the trained batches
and the one the loader fetched ahead); when whole epochs came before it, the rest of the last
epoch is drawn from the sampler after training (the format holds epochs of one length; with
``--refresh model`` that re-encodes). The replay reports the sampler's own epoch length to the
trainer, so its epoch and learning-rate arithmetic is the original run's.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from torch.utils.data import Sampler

from hardbatch.plan_files import plan_batch_sampler, read_plan, write_batches

from ..simcse.data import RecordingSampler

__all__ = ["PLAN_SUFFIX", "TRAINING_KEYS", "EpochRecorder", "ReplaySampler", "data_sha256",
           "plan_identity", "recording_trainer", "replay_sampler", "training_settings",
           "write_run_plan"]

#: The plan file's name: the run's JSON name with this suffix instead of ``.json``.
PLAN_SUFFIX = ".plan.parquet"
#: The options that shape training: a replay must have the plan's.
TRAINING_KEYS = ("model", "train_limit", "steps", "epochs", "batch_size", "lr", "warmup_ratio",
                 "scale", "max_seq_length", "max_query_length", "freeze_layers", "precision")


class EpochRecorder(RecordingSampler):
    """Wraps the trainer's batch sampler: records the batches of each iteration (an epoch) and
    keeps the iteration, whose rest :meth:`whole_epochs` can draw after training."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.steps_per_epoch = len(inner)
        self.epochs: list[list[list[int]]] = []
        self._live = None

    def __iter__(self):
        epoch: list[list[int]] = []
        self.epochs.append(epoch)
        self._live = iter(self.inner)
        for batch in self._live:
            epoch.append([int(i) for i in batch])
            yield batch

    def whole_epochs(self) -> tuple[list, int]:
        """``(epochs, batches drawn now)``: the recorded epochs; a last, partial one after whole
        ones completed from the sampler (one partial epoch alone stays as it is)."""
        epochs = [e for e in self.epochs if e]
        drawn = 0
        if len(epochs) > 1 and len(epochs[-1]) < self.steps_per_epoch and self._live:
            for batch in self._live:
                epochs[-1].append([int(i) for i in batch])
                drawn += 1
        return epochs, drawn


def recording_trainer(trainer_class, recorders: list):
    """``trainer_class`` whose training batch sampler (whatever ``batch_sampler=`` built it) is
    wrapped in an :class:`EpochRecorder`, appended to ``recorders``."""

    class Recording(trainer_class):
        def get_batch_sampler(self, *args, **kwargs):
            sampler = super().get_batch_sampler(*args, **kwargs)
            recorders.append(EpochRecorder(sampler))
            return recorders[-1]

    return Recording


def data_sha256(train) -> str:
    """SHA-256 of the training rows (a ``datasets.Dataset``): every column's texts, in order."""
    h = hashlib.sha256()
    for column in train.column_names:
        h.update(f"{column}\0{len(train)}\0".encode())
        for text in train[column]:
            data = str(text).encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def training_settings(args, arm, loss: dict) -> dict:
    """The options of :data:`TRAINING_KEYS` and the arm's loss options (hardness)."""
    return {**{k: getattr(args, k, None) for k in TRAINING_KEYS}, "loss": dict(loss),
            "mined": arm.mined}


def plan_file(args, result: Path) -> Path:
    """Where ``--write-plan`` writes a run's plan: DIR, else the run JSON's folder."""
    return Path(args.write_plan or result.parent) / (result.name.removesuffix(".json")
                                                     + PLAN_SUFFIX)


def write_run_plan(args, arm, seed: int, result: Path, train, recorder: EpochRecorder,
                   identity: dict, embeddings=None) -> dict:
    """Write the recorded batches of a run to its plan file; returns the run record's ``plan``."""
    t0 = time.perf_counter()
    recorded = [len(e) for e in recorder.epochs if e]  # fed (with the loader's lookahead)
    epochs, drawn = recorder.whole_epochs()
    path = plan_file(args, result)
    path.parent.mkdir(parents=True, exist_ok=True)
    run = {**identity, "benchmark": "codesearch", "arm": arm.name, "seed": seed,
           "data_sha256": data_sha256(train), "rows": len(train),
           "steps_per_epoch": recorder.steps_per_epoch,
           "recorded_steps": recorded, "drawn_after_training": drawn}
    plan = write_batches(path, epochs, num_rows=len(train), batch_size=args.batch_size,
                         sampler=arm.sampler, seed=seed, run=run, embeddings=embeddings,
                         options={"refresh": args.refresh, "refresh_every": args.refresh_every,
                                  "embed_column": args.embed_column} if arm.encodes else {})
    return {"written": str(path), "sha256": plan.sha256, "epochs": plan.epochs,
            "steps_per_epoch": plan.steps_per_epoch, "drawn_after_training": drawn,
            "seconds": time.perf_counter() - t0}


def plan_identity(args) -> None:
    """``--replay-plan``: the arm and seed are the plan's (``--arm`` / ``--seed-list`` left at
    their defaults take them; others must name them)."""
    run = _run_of(read_plan(args.replay_plan), args.replay_plan)
    arm, seed = run["arm"], str(run["seed"])
    if (args.arm, args.seed_list, args.seeds) == ("default", None, 1):
        args.arm, args.seed_list = arm, seed
    elif args.arm.strip().lower() != arm or (args.seed_list or "0").strip() != seed:
        raise ValueError(f"--replay-plan {args.replay_plan} holds the run of arm {arm!r}, seed "
                         f"{seed}; drop --arm / --seed-list / --seeds (they default to the "
                         f"plan's) or pass --arm {arm} --seed-list {seed}")


def _run_of(plan, path) -> dict:
    run = getattr(plan, "meta", {}).get("run")
    if not isinstance(run, dict) or run.get("benchmark") != "codesearch":
        raise ValueError(f"--replay-plan {path} is not a plan of a code-search run (written by "
                         "hardbatch bench codesearch --write-plan); replay one of those")
    return run


class ReplaySampler(Sampler[list[int]]):
    """A plan's batches with the original sampler's epoch length (the trainer's epoch and
    learning-rate arithmetic); asking past the plan's batches of an epoch is an error."""

    def __init__(self, inner, steps_per_epoch: int, path) -> None:
        self.inner, self.steps, self.path = inner, int(steps_per_epoch), path

    def __getattr__(self, name):  # the plan sampler's (plan, epoch, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self):
        epoch, count = self.inner.epoch, 0
        for count, batch in enumerate(self.inner, 1):  # noqa: B007 (read after the loop)
            yield batch
        if count < self.steps:
            raise RuntimeError(f"the trainer asks for batch {count + 1} of epoch {epoch} but "
                               f"{self.path} holds {count}: the replay trains longer than the "
                               "run that wrote it")


def replay_sampler(args, arm, seed: int, train, settings: dict):
    """``(batch_sampler, the run record's plan)`` of ``--replay-plan``, after checking that the
    plan holds this arm, seed, training rows and settings."""
    path = args.replay_plan
    plan = read_plan(path)
    run = _run_of(plan, path)
    want = {"arm": arm.name, "seed": seed, "rows": len(train), "data_sha256": data_sha256(train),
            **{f"training.{k}": v for k, v in settings.items()}}
    have = {**run, **{f"training.{k}": v for k, v in run.get("training", {}).items()}}
    diff = [k for k in want if have.get(k) != want[k]]
    if diff:
        said = "; ".join(f"{k}: {have.get(k)!r} in the plan, {want[k]!r} here" for k in diff)
        raise ValueError(f"--replay-plan {path} was written by another run ({said}); replay it "
                         f"with the data and options of its command: {run.get('command')}")
    make = plan_batch_sampler(plan, train_dataset=train)

    def batch_sampler(dataset, *a, **kw):
        inner = make(dataset, *a, **kw)
        return ReplaySampler(inner, run["steps_per_epoch"], path) if inner in make.samplers \
            else inner

    return batch_sampler, {"replayed": str(path), "sha256": plan.sha256,
                           "epochs": plan.epochs, "steps_per_epoch": plan.steps_per_epoch}
