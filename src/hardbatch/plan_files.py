"""Batch plans as files: a sampler's batches for every (epoch, rank, step), written once and
replayed by any trainer (issue 44).

Trainers that do not run hardbatch's sampler in their loop (FlagEmbedding, tevatron, a loop of
one's own, a non-PyTorch stack) and multi-node jobs read the batches from a file, as TAS-B and
B3 ship theirs. :func:`write_plan` (the command: ``hardbatch plan``) runs a sampler of
:mod:`hardbatch.registry` over fixed embeddings for ``epochs`` epochs and ``world_size`` ranks
(:func:`write_batches`: the batches a sampler produced during a run, e.g. from the model);
:class:`PlanBatchSampler` replays it in a ``DataLoader`` (:func:`plan_batch_sampler`: in
``SentenceTransformerTrainer``); :func:`plan_order` / :func:`write_in_plan_order` give a rank's
rows in plan order to trainers that read rows sequentially.

Format: Parquet, through pyarrow. Every stack reads Parquet (pyarrow, pandas, polars, DuckDB,
Spark, Arrow for Rust / Java / Go / R), it is what B3 ships its batches as, row ids compress to
a few bytes, and the schema's key-value metadata makes the file self-describing. pyarrow comes
with ``datasets`` (so with sentence-transformers); else ``pip install "hardbatch[plans]"``. One
Parquet row per batch: ``epoch``, ``rank``, ``step`` (int32), ``rows`` (list of int64 row ids).
The schema metadata ``hardbatch.plan`` is JSON: ``format``, ``version``, ``sampler``,
``options``, ``seed``, ``epochs``, ``world_size``, ``batch_size``, ``steps_per_epoch``,
``num_rows``, ``embeddings_sha256`` (SHA-256 of the float32 ``[N, d]`` rows, by
``hardbatch._integrity.digest``), ``hardbatch_version`` and ``sha256`` (of the metadata and the
batches; :func:`read_plan` verifies it). Files are written atomically (a temporary file in the
same folder, flushed, then ``os.replace``): a plan file appears whole or not at all. Every
problem is a ``ValueError`` naming the file, the parameter and the fix. The table's writing and
checked reading live in ``hardbatch._plan_format``.
"""

from __future__ import annotations

import itertools
import json
import numbers
import warnings
from pathlib import Path

import numpy as np
from torch.utils.data import BatchSampler, Sampler, SequentialSampler

from ._integrity import digest, library_version, seal, verify
from ._plan_format import FORMAT, VERSION, Plan, atomic_write, batch_row_ids, jsonable_options, \
    load_embeddings, pyarrow_modules, read_plan, write_table
from ._validation import check_int, num_items_of, reject_sampler
from .distributed import get_rank_world
from .registry import canonical_sampler, make_sampler

__all__ = ["Plan", "PlanBatchSampler", "load_embeddings", "plan_batch_sampler", "plan_order",
           "read_plan", "write_batches", "write_in_plan_order", "write_plan"]

STATE_CHUNK = 256  # steps read back from one sampler state (below the samplers' 1024 lookback)
WRITERS = {".parquet": "to_parquet", ".jsonl": "to_json", ".json": "to_json", ".csv": "to_csv"}


# -- writing ---------------------------------------------------------------------------------
def _from_states(sampler, epochs: int, world: int):
    """Every rank's batches from rank 0's sampler alone: ``state_dict(consumed=k)`` holds the W
    batches of each step yielded since step k (a rank's state resumes every rank); checked
    against the batches rank 0 yielded, None where they differ (then each rank is built)."""
    out = {}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        steps, mine, table = len(sampler), [], []
        for batch in sampler:
            mine.append(list(batch))
            if len(mine) % STATE_CHUNK and len(mine) < steps:
                continue
            lag = len(mine) - len(table)
            flat = sampler.state_dict(consumed=len(mine) - lag).get("pending_plan")
            if flat is None or len(flat) < lag * world:
                return None
            got = [[flat[i * world + r].tolist() for r in range(world)] for i in range(lag)]
            if [g[0] for g in got] != mine[len(table):]:
                return None
            table += got
        out.update({(epoch, r): [g[r] for g in table] for r in range(world)})
    return out


def _sampler_batches(name, x, batch_size, options, seed, epochs, world) -> dict:
    """``{(epoch, rank): batches}`` of the sampler ``name`` over ``x`` (no training loop here:
    the warning that builds dominate one is moot)."""
    def make(rank):
        return make_sampler(name, x, batch_size, seed=seed, rank=rank, world_size=world,
                            **options)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*dominates training")
        out = _from_states(make(0), epochs, world) if world > 1 and not options.get(
            "global_batch") else None
        if out is None:
            out = {}
            for rank in range(world):
                sampler = make(rank)
                for epoch in range(epochs):
                    sampler.set_epoch(epoch)
                    out[epoch, rank] = [list(b) for b in sampler]
    return out


def write_plan(path, embeddings, sampler: str, batch_size: int, *, options: dict | None = None,
               epochs: int = 1, world_size: int = 1, seed: int = 0, column: str | None = None,
               model=None, encode_batch_size: int = 64) -> Plan:
    """Write the batches of the registry sampler ``sampler`` over ``embeddings``, every epoch
    and rank, to the Parquet file ``path`` (atomically); returns the :class:`Plan`.

    ``embeddings``, ``column``, ``model``, ``encode_batch_size``: see :func:`load_embeddings`.
    ``batch_size``: a rank's; ``epochs``: 0 .. epochs - 1; ``world_size``, ``seed``: the ranks,
    the sampler's seed. ``options``: the sampler's own (``drop_last``, ``candidates``, ...).
    The batches are exactly those the sampler yields on each rank.

    Example:
        >>> import tempfile, numpy as np
        >>> from hardbatch.plan_files import write_plan
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> tmp = tempfile.TemporaryDirectory()
        >>> plan = write_plan(f"{tmp.name}/plan.parquet", x, "knn", 8, epochs=2, world_size=2,
        ...                   options={"refresh_every": None})
        >>> plan.sampler, plan.steps_per_epoch, [len(b) for b in plan.batches(epoch=1, rank=1)]
        ('knn', 3, [8, 8, 8])
        >>> tmp.cleanup()
    """
    name = canonical_sampler(sampler)
    batch_size, epochs = check_int(batch_size, "batch_size", 1), check_int(epochs, "epochs", 1)
    world_size, seed = check_int(world_size, "world_size", 1), check_int(seed, "seed")
    options = dict(options or {})
    fixed = [k for k in ("seed", "rank", "world_size") if k in options]
    if fixed:
        raise ValueError(f"options hold {', '.join(fixed)}: pass seed= and world_size= to "
                         "write_plan itself (hardbatch plan --seed / --world-size)")
    pyarrow_modules()  # before the embeddings and the sampler's build
    x = load_embeddings(embeddings, column=column, model=model,
                        encode_batch_size=encode_batch_size)
    batches = _sampler_batches(name, x, batch_size, options, seed, epochs, world_size)
    meta = {"format": FORMAT, "version": VERSION, "sampler": name,
            "options": jsonable_options(options), "seed": seed, "epochs": epochs,
            "world_size": world_size, "batch_size": batch_size,
            "steps_per_epoch": len(batches[0, 0]), "num_rows": int(x.shape[0]),
            "embeddings_sha256": digest(x), "hardbatch_version": library_version()}
    write_table(path, meta, batches)
    return read_plan(path)


def write_batches(path, batches, *, num_rows: int, batch_size: int, sampler: str,
                  seed: int = 0, options: dict | None = None, embeddings=None,
                  run: dict | None = None) -> Plan:
    """Write batches a sampler *produced* (recorded during training) to the plan file ``path``
    (atomically); returns the :class:`Plan`. :func:`write_plan` reruns a registry sampler over
    fixed embeddings; this writes what no rerun gives back: the batches of a sampler refreshed
    from the model being trained, or of another library's sampler (sentence-transformers').

    ``batches``: one list of batches per epoch, each batch 1-D integer row ids (a list, array or
    tensor; other input is a ``ValueError``, an id twice in one batch a warning), every epoch
    the same number of batches (the format's ``steps_per_epoch``), for one process
    (``world_size=1``: the global plan that accelerate shards in ``SentenceTransformerTrainer``).
    ``num_rows``, ``batch_size``: N and the largest batch (each holds 1 to batch_size ids in
    0 .. N - 1). ``sampler``, ``seed``,
    ``options``: what produced them (stored as given). ``embeddings``: optional, those the
    sampler planned from (their SHA-256 is stored; else ``embeddings_sha256`` is None).
    ``run``: optional JSON-able facts about the run (stored under the metadata key ``run``,
    read back as ``plan.run``).

    Example:
        >>> import tempfile
        >>> from hardbatch.plan_files import PlanBatchSampler, write_batches
        >>> tmp = tempfile.TemporaryDirectory()
        >>> seen = [[[0, 3], [1, 2]], [[2, 0], [3, 1]]]  # two epochs of two batches, 4 rows
        >>> plan = write_batches(f"{tmp.name}/run.parquet", seen, num_rows=4, batch_size=2,
        ...                      sampler="knn", seed=5, run={"arm": "knn"})
        >>> plan.batches(epoch=1), plan.run, plan.embeddings_sha256
        ([[2, 0], [3, 1]], {'arm': 'knn'}, None)
        >>> replay = PlanBatchSampler(plan, rank=0, world_size=1)
        >>> [list(replay) for _ in range(2)] == seen
        True
        >>> tmp.cleanup()
    """
    num_rows, batch_size = check_int(num_rows, "num_rows", 1), check_int(batch_size,
                                                                          "batch_size", 1)
    epochs = [[batch_row_ids(b, e, s) for s, b in enumerate(epoch)]
              for e, epoch in enumerate(batches)]
    if not epochs or not epochs[0]:
        raise ValueError("batches holds no batch; pass one list of batches per epoch")
    steps = len(epochs[0])
    for e, epoch in enumerate(epochs):
        if len(epoch) != steps:
            raise ValueError(f"batches: epoch {e} holds {len(epoch)} batches but epoch 0 holds "
                             f"{steps}; a plan holds epochs of one length: pass whole epochs "
                             "(draw the rest of a last, partial one from its sampler)")
        for s, b in enumerate(epoch):
            if not 1 <= len(b) <= batch_size or b.min() < 0 or b.max() >= num_rows:
                raise ValueError(f"batches: epoch {e}, step {s} holds {len(b)} row ids in "
                                 f"{b.min(initial=0)}..{b.max(initial=0)}; a batch holds 1.."
                                 f"batch_size={batch_size} ids in 0..num_rows - 1={num_rows - 1}")
    meta = {"format": FORMAT, "version": VERSION, "sampler": str(sampler),
            "options": jsonable_options(dict(options or {})), "seed": check_int(seed, "seed"),
            "epochs": len(epochs), "world_size": 1, "batch_size": batch_size,
            "steps_per_epoch": steps, "num_rows": num_rows,
            "embeddings_sha256": None if embeddings is None else digest(
                load_embeddings(embeddings)), "hardbatch_version": library_version()}
    if run is not None:
        try:
            meta["run"] = json.loads(json.dumps(run))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"run must be JSON-able (numbers, strings, lists, dicts): {exc}"
                             ) from None
    write_table(path, meta, {(e, 0): epoch for e, epoch in enumerate(epochs)})
    return read_plan(path)


def _as_plan(plan) -> Plan:
    return plan if isinstance(plan, Plan) else read_plan(plan)


# -- replay ----------------------------------------------------------------------------------
class PlanBatchSampler(Sampler[list[int]]):
    """A ``BatchSampler`` replaying a plan exactly: rank ``rank``'s batches of the epoch set by
    ``set_epoch`` (a completed iteration advances it, as with the samplers).

    Args:
        plan: a :class:`Plan` or the path of a plan file.
        rank, world_size: default torch.distributed's (0 and 1 without it); ``world_size``
            must be the plan's.
        dataset: optional, a sized dataset (or N) whose length must be the plan's ``num_rows``.
        embeddings: optional, checked against the plan's ``embeddings_sha256``.
        interleave_ranks: yield every rank's batch of a step, in rank order, for a loader that
            shards batches across processes itself (accelerate: process r gets rank r's).
        batch_size, drop_last: optional checks, as a ``BatchSampler`` takes them: a
            ``ValueError`` unless they are the plan's (``None``: not checked).

    ``state_dict(consumed=k)`` / ``load_state_dict`` resume mid-epoch as the samplers' do (any
    rank's state resumes every rank).

    Example:
        >>> import tempfile, numpy as np
        >>> from torch.utils.data import DataLoader
        >>> from hardbatch.plan_files import PlanBatchSampler, write_plan
        >>> tmp = tempfile.TemporaryDirectory()
        >>> plan = write_plan(f"{tmp.name}/p.parquet", np.ones((40, 8)), "uniform", 8, epochs=2,
        ...                   world_size=2)
        >>> sampler = PlanBatchSampler(plan, rank=1, world_size=2, dataset=range(40))
        >>> sampler.set_epoch(1)
        >>> [b.tolist() for b in DataLoader(range(40), batch_sampler=sampler)] == plan.batches(1, 1)
        True
        >>> tmp.cleanup()
    """

    def __init__(self, plan, *, rank: int | None = None, world_size: int | None = None,
                 dataset=None, embeddings=None, interleave_ranks: bool = False,
                 batch_size: int | None = None, drop_last: bool | None = None) -> None:
        reject_sampler(plan, "plan", "a plan")  # Lightning DDP: type(bs)(sampler, batch_size=)
        self.plan = p = _as_plan(plan)
        here = get_rank_world()
        self.world_size = check_int(here[1] if world_size is None else world_size,
                                    "world_size", 1)
        if self.world_size != p.world_size:
            raise ValueError(f"{p.path} was written for world_size={p.world_size} but this job "
                             f"has world_size={self.world_size}; write the plan with "
                             f"world_size={self.world_size} (write_plan(world_size=...), "
                             f"hardbatch plan --world-size {self.world_size})")
        self.rank = check_int(here[0] if rank is None else rank, "rank", 0)
        p.batches(0, self.rank)  # a rank the plan lacks: ValueError
        n = None if dataset is None else num_items_of(dataset, "dataset")
        if n is not None and n != p.num_rows:
            raise ValueError(f"{p.path} plans batches of {p.num_rows} rows but the dataset has "
                             f"{n}; write the plan from this dataset's embeddings (one row per "
                             "dataset row, in its order)")
        got = None if embeddings is None else digest(load_embeddings(embeddings))
        if got is not None and p.embeddings_sha256 is None:
            raise ValueError(f"{p.path} holds no embeddings' SHA-256 (written by write_batches "
                             "without embeddings=) to check embeddings= against; leave it out")
        if got is not None and got != p.embeddings_sha256:
            raise ValueError(f"{p.path} was written from other embeddings (SHA-256 "
                             f"{p.embeddings_sha256[:16]}...) than embeddings= ({got[:16]}...); "
                             "pass the embeddings it was written from, or write a plan from these")
        self.interleave_ranks = bool(interleave_ranks)
        # None under interleave_ranks: accelerate then shards short batches by position too
        self.batch_size = None if self.interleave_ranks else p.batch_size
        self.drop_last = bool(p.options.get("drop_last", False))
        for name, want, have in (("batch_size", batch_size, p.batch_size),
                                 ("drop_last", drop_last, self.drop_last)):
            if want is not None and want != have and not (name == "drop_last" and want
                                                         and not p.short_batches):
                raise ValueError(f"{name}={want!r} but {p.path} was written with {name}={have!r}; "
                                 f"leave {name} out (the plan sets it) or write the plan with "
                                 f"{name}={want!r}")
        self.num_items, self.seed, self.epoch = p.num_rows, p.seed, 0
        self._start, self._yielded, self._active, self._finished = 0, 0, False, None

    def __len__(self) -> int:
        return self.plan.steps_per_epoch * (self.world_size if self.interleave_ranks else 1)

    def set_epoch(self, epoch: int) -> None:
        """Replay ``epoch`` on the next iteration (forgets a resume point of another epoch)."""
        epoch = check_int(epoch, "epoch", 0)
        if epoch != self.epoch:
            self._start = 0
        self.epoch, self._finished = epoch, None

    def __iter__(self):
        if self.interleave_ranks:
            ranks = [self.plan.batches(self.epoch, r) for r in range(self.world_size)]
            batches = [batch for step in zip(*ranks) for batch in step]
        else:
            batches = self.plan.batches(self.epoch, self.rank)
        start, self._start, self._finished = self._start, 0, None
        self._yielded, self._active = start, True
        for i in range(start, len(batches)):
            self._yielded = i + 1
            yield batches[i]
        self._active, self._finished = False, (self.epoch, len(batches))
        self.epoch += 1

    def state_dict(self, consumed: int | None = None) -> dict:
        """The position after ``consumed`` batches of the current epoch (default: all yielded;
        after a completed iteration ``consumed`` below the epoch's length refers to it)."""
        epoch, step = self.epoch, self._yielded if self._active else self._start
        if consumed is not None:
            step = check_int(consumed, "consumed", 0, len(self))
            if self._active and step > self._yielded:
                raise ValueError(f"consumed={step} must be between 0 and the {self._yielded} "
                                 "batches yielded so far; pass how many of them the loop "
                                 "trained on")
            if self._finished is not None and not self._active:
                epoch, step = (self._finished[0], step) if step < self._finished[1] \
                    else (self.epoch, 0)
        return seal({"kind": type(self).__name__, "plan_sha256": self.plan.sha256,
                     "world_size": self.world_size, "interleave_ranks": self.interleave_ranks,
                     "epoch": epoch, "step": step}, "sampler state")

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration yields the saved epoch's remaining batches."""
        if not isinstance(state, dict) or state.get("kind") != type(self).__name__ \
                or not verify(state, "sampler state"):
            raise ValueError("state is not a state_dict() of a PlanBatchSampler; pass the dict "
                             "its state_dict() returned")
        mine = {"plan_sha256": self.plan.sha256, "world_size": self.world_size,
                "interleave_ranks": self.interleave_ranks}
        diff = {k: state.get(k) for k, v in mine.items() if state.get(k) != v}
        if diff:
            raise ValueError(f"state was saved with {diff} but this sampler replays "
                             f"{self.plan.path} with {({k: mine[k] for k in diff})}; load it "
                             "into a sampler of the plan it was saved from")
        self.epoch, self._start, self._finished = int(state["epoch"]), int(state["step"]), None


class PlanSamplerFactory:
    """The ``batch_sampler=`` callable of :func:`plan_batch_sampler` (picklable, as the trainer
    saves its arguments: it keeps the plan's path and reads the plan again when unpickled)."""

    def __init__(self, plan, train_dataset=None) -> None:
        if isinstance(train_dataset, dict):  # a DatasetDict
            raise ValueError(f"train_dataset is a DatasetDict (splits {', '.join(train_dataset)})"
                             ": a plan holds the batches of one dataset; pass the split it was "
                             "written for (train_dataset=data['train'])")
        self.plan, self.train_dataset, self.samplers = _as_plan(plan), train_dataset, []
        self.path = self.plan.path

    def __call__(self, dataset, batch_size: int, drop_last: bool = False,
                 valid_label_columns=None, generator=None, seed: int = 0):
        if self.train_dataset is not None and dataset is not self.train_dataset:
            return BatchSampler(SequentialSampler(range(len(dataset))), batch_size, drop_last)
        self.plan = self.plan or read_plan(self.path)
        if batch_size != self.plan.batch_size:
            raise ValueError(f"{self.path} holds batches of batch_size={self.plan.batch_size} but "
                             f"the trainer asks for {batch_size}; set per_device_train_batch_size"
                             f"={self.plan.batch_size} (or write the plan with this batch size)")
        self.samplers.append(PlanBatchSampler(self.plan, dataset=dataset, interleave_ranks=True,
                                              drop_last=True if drop_last else None))
        from .integrations.sentence_transformers.resume import register_resume
        register_resume(self, dataset)  # a resumed run replays the trainer's epoch
        return self.samplers[-1]

    def __getstate__(self) -> dict:
        return dict(self.__dict__, plan=None, train_dataset=None, samplers=[])

    def __repr__(self) -> str:
        return f"plan_batch_sampler({self.path!r})"


def plan_batch_sampler(plan, *, train_dataset=None) -> PlanSamplerFactory:
    """``SentenceTransformerTrainingArguments(batch_sampler=plan_batch_sampler(path))``: the
    training batches are the plan's, in order, epoch by epoch; under multi-GPU training
    accelerate hands process r rank r's batches (the plan's world size must be the job's). With
    ``train_dataset`` (one dataset: a ``DatasetDict`` is a ``ValueError``), another dataset
    (evaluation) gets sequential batches. A resumed run (``resume_from_checkpoint``) replays the
    rest of its epoch: a callback the factory registers with the trainer sets the epoch.

    Example:
        >>> import tempfile, numpy as np
        >>> from hardbatch.plan_files import plan_batch_sampler, write_plan
        >>> tmp = tempfile.TemporaryDirectory()
        >>> plan = write_plan(f"{tmp.name}/p.parquet", np.ones((40, 8)), "uniform", 8)
        >>> make = plan_batch_sampler(plan)  # SentenceTransformerTrainingArguments(batch_sampler=)
        >>> list(make(range(40), batch_size=8, drop_last=False, seed=0)) == plan.batches(0)
        True
        >>> tmp.cleanup()
    """
    return PlanSamplerFactory(plan, train_dataset)


# -- rows in plan order ----------------------------------------------------------------------
def plan_order(plan, epoch: int = 0, rank: int = 0) -> np.ndarray:
    """Rank ``rank``'s row ids of ``epoch`` in plan order (its batches one after another).

    Example:
        >>> import tempfile, numpy as np
        >>> from hardbatch.plan_files import plan_order, write_plan
        >>> tmp = tempfile.TemporaryDirectory()
        >>> plan = write_plan(f"{tmp.name}/p.parquet", np.ones((40, 8)), "uniform", 8)
        >>> order = plan_order(plan, epoch=0, rank=0)
        >>> order.shape, order[:8].tolist() == plan.batches(0)[0]
        ((40,), True)
        >>> tmp.cleanup()
    """
    batches = _as_plan(plan).batches(epoch, rank)
    return np.fromiter(itertools.chain.from_iterable(batches), np.int64)


def write_in_plan_order(dataset, plan, path, *, epochs=None, rank: int = 0) -> np.ndarray:
    """Write ``dataset`` (a ``datasets.Dataset``) with its rows in rank ``rank``'s plan order of
    ``epochs`` (an int, a list; None: all), epoch after epoch, to ``path`` (``.parquet``,
    ``.jsonl`` / ``.json``, ``.csv``; atomically), for trainers that read rows in order, in
    batches of ``plan.batch_size``; returns the row ids. Only the file's last batch may be short.

    Example:
        >>> import tempfile, datasets, numpy as np
        >>> from hardbatch.plan_files import write_in_plan_order, write_plan
        >>> tmp = tempfile.TemporaryDirectory()
        >>> plan = write_plan(f"{tmp.name}/p.parquet", np.ones((40, 8)), "uniform", 8, epochs=2)
        >>> data = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(40)]})
        >>> order = write_in_plan_order(data, plan, f"{tmp.name}/train.jsonl")  # both epochs
        >>> len(order), len(open(f"{tmp.name}/train.jsonl").readlines())
        (80, 80)
        >>> tmp.cleanup()
    """
    plan = _as_plan(plan)
    epochs = range(plan.epochs) if epochs is None else [epochs] if isinstance(
        epochs, numbers.Integral) else list(epochs)
    if not epochs:
        raise ValueError("epochs is empty; pass an epoch, a list of epochs or None (all of the "
                         f"plan's {plan.epochs})")
    if len(dataset) != plan.num_rows:
        raise ValueError(f"{plan.path} plans batches of {plan.num_rows} rows but the dataset has "
                         f"{len(dataset)}; pass the dataset the plan was written for")
    method = WRITERS.get(Path(path).suffix.lower())
    if method is None:
        raise ValueError(f"path={str(path)!r}: write a {', '.join(WRITERS)} file")
    sizes = [len(b) for e in epochs for b in plan.batches(e, rank)]
    if any(n != plan.batch_size for n in sizes[:-1]):
        raise ValueError(f"{plan.path}: a batch before the end of epochs {list(epochs)} holds "
                         f"fewer than batch_size={plan.batch_size} rows, so a trainer reading "
                         "batches of that size would cut across the plan's; write one file per "
                         "epoch (epochs=e) or a plan with drop_last=True")
    order = np.concatenate([plan_order(plan, e, rank) for e in epochs])
    subset = dataset.select(order)
    atomic_write(path, lambda f: getattr(subset, method)(f))
    return order
