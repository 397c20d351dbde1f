"""Base of the samplers that read item embeddings: :class:`EmbeddingSampler`.

Its batches are drawn from a structure (a graph, an embedding snapshot, an order) that a
composed :class:`~hardbatch.samplers.refresh.RefreshPolicy` rebuilds from the embedding source;
the sampler itself is the policy's :class:`~hardbatch.samplers.refresh.Builder` (``build``,
``draw``, ``save_structure``, ``load_structure``).
"""

from __future__ import annotations

import time

import numpy as np

from .. import _rng
from .. import distributed as hbdist
from .._validation import check_int
from ..embeddings import EmbeddingSource, source_num_items
from ..walks import WalkState
from .base import PlanSampler
from .refresh import RefreshPolicy


def _forwarded(name: str, doc: str) -> property:
    """A read-only sampler attribute that is the refresh policy's ``name``."""
    return property(lambda self: getattr(self.refresh_policy, name), doc=doc)


class EmbeddingSampler(PlanSampler):
    """A plan sampler whose batches come from a structure rebuilt from an embedding source.

    Subclasses implement the :class:`~hardbatch.samplers.refresh.Builder` protocol (``build``,
    ``draw``, ``save_structure``, ``load_structure``); the base reads the source through its
    :class:`~hardbatch.samplers.refresh.RefreshPolicy` (``refresh_policy``: pipelined,
    background and distributed builds) and plans the epoch. Two kinds, by the class attribute
    ``batches_partition``:

    * False (proximity graph, kNN): the structure is rebuilt every ``refresh_every`` steps,
      counted over the whole run, and each batch grows from a start node / anchor of a
      per-epoch :class:`~hardbatch.walks.WalkState`, which starts from items not yet seen this
      epoch (``coverage``); the start node is the batch's first item;
    * True (GCBS): the structure is rebuilt for every epoch (``refresh_lag`` steps before it
      with a lag) and batch i is ``draw(structure, i, ...)``, a part of a partition.

    Args:
        embeddings: the source: an [N, d] tensor / array, an EmbeddingBank or a callable.
        batch_size, drop_last, seed, rank, world_size, prefetch, global_batch, duplicate_keys:
            as for :class:`~hardbatch.samplers.PlanSampler`.
        refresh_every: steps between rebuilds (None: once); ignored with ``batches_partition``.
        normalize: L2-normalise the rows read (cosine similarities), once per read, on the
            source's device.
        paired: a second source read with the first (GCBS's ``paired``), or None.
        refresh_lag, background, distributed, process_group: see ``RefreshPolicy``.

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch.samplers import EmbeddingSampler
        >>> class ByFirstFeature(EmbeddingSampler):  # a start item and those after it in x[:, 0]
        ...     def build(self, x, key, group):
        ...         return torch.argsort(x[:, 0]).numpy()
        ...     def draw(self, order, index, seed, start):
        ...         start = self.walk_state.next_start(seed) if start is None else start
        ...         batch = np.roll(order, -np.argmax(order == start))[:self.plan_batch_size]
        ...         self.walk_state.seen[batch] = 1
        ...         return batch
        ...     def save_structure(self, order):
        ...         return {"order": torch.from_numpy(order)}
        ...     def load_structure(self, state):
        ...         return state["order"].numpy() if "order" in state else None
        >>> sampler = ByFirstFeature(np.random.default_rng(0).random((40, 8)), 8, normalize=False,
        ...                          drop_last=False, seed=0, rank=None, world_size=None)
        >>> [len(set(b)) for b in sampler], sampler.refreshes
        ([8, 8, 8, 8, 8], 1)
    """

    # refresh_every last: GCBSSampler (one order per epoch) leaves it out
    _settings = PlanSampler._settings + ("normalize", "refresh_lag", "refresh_every")
    batches_partition = False

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, *,
                 refresh_every: int | None = None, normalize: bool, drop_last: bool, seed: int,
                 rank: int | None, world_size: int | None, paired: EmbeddingSource | None = None,
                 refresh_lag: int | None = None, background: bool = False,
                 distributed: bool | None = None, process_group=None, prefetch: int = 0,
                 global_batch: bool = False, duplicate_keys=None) -> None:
        n, first = source_num_items(embeddings)
        super().__init__(n, batch_size, drop_last=drop_last, seed=seed, rank=rank,
                         world_size=world_size, prefetch=prefetch, global_batch=global_batch,
                         duplicate_keys=duplicate_keys)
        per_epoch, background = self.batches_partition, bool(background)
        lag = check_int((1 if background else 0) if refresh_lag is None else refresh_lag,
                        "refresh_lag", low=0)
        if background and lag == 0:
            meaning = ("steps before the end of an epoch at which the next epoch's order is "
                       "snapshotted" if per_epoch else
                       "steps between the snapshot and the use of the new graph")
            raise ValueError(f"background=True needs refresh_lag >= 1 ({meaning}); pass "
                             "refresh_lag=1")
        if per_epoch:
            every = len(self)
            if lag > every:
                raise ValueError(f"refresh_lag={lag} must be at most the {every} steps of an "
                                 "epoch")
        else:
            every = None if refresh_every is None else check_int(refresh_every,
                                                                 "refresh_every", low=1)
            if lag and every is not None and lag >= every:
                raise ValueError(f"refresh_lag={lag} must be smaller than refresh_every={every}")
        if distributed is None:  # on when torch.distributed is on and these are its ranks
            distributed = hbdist.is_distributed(process_group) and \
                (self.rank, self.world_size) == hbdist.get_rank_world(process_group)
        elif distributed and not hbdist.is_distributed(process_group):
            raise ValueError("distributed=True needs torch.distributed initialised with more "
                             "than one rank (torchrun); pass distributed=False otherwise")
        if distributed and self.prefetch and not background:
            raise ValueError("prefetch > 0 under torch.distributed needs background=True (graph "
                             "builds then use a process group of their own, off the training "
                             "loop's thread); pass background=True or prefetch=0")
        self.normalize = bool(normalize)
        self.refresh_policy = RefreshPolicy(
            embeddings, self, n, first=first, paired=paired, normalize=self.normalize,
            every=every, lag=lag, background=background, distributed=bool(distributed),
            process_group=process_group, per_epoch=per_epoch, threaded=bool(self.prefetch))
        self.walk_state: WalkState | None = None  # the epoch's start nodes and seen items
        self._step_starts: list[int] = []

    source = _forwarded("source", "The embedding source.")
    refresh_every = _forwarded("every", "Steps between rebuilds (the paper's t; None: once; "
                                        "the steps of an epoch for partition samplers).")
    refresh_lag = _forwarded("lag", "Steps between a snapshot and the use of its structure.")
    background = _forwarded("background", "Whether pipelined builds run in a worker thread.")
    distributed = _forwarded("distributed", "Whether builds are sharded across ranks.")
    process_group = _forwarded("process_group", "The torch.distributed group of the builds.")
    refreshes = _forwarded("refreshes", "Structures built or taken into use so far.")
    last_refresh_seconds = _forwarded(
        "last_refresh_seconds", "Time of the last build (not counting the read of the source).")

    def refresh(self, global_step: int = 0) -> None:
        """Re-read the embedding source and rebuild (as scheduled at ``global_step``)."""
        self.refresh_policy.refresh(global_step)

    @property
    def coverage(self) -> float:
        """Share of items drawn so far this epoch (all ranks; 1.0 for partitions)."""
        if self.batches_partition:
            return 1.0
        return 0.0 if self.walk_state is None else self.walk_state.coverage

    # -- the plan (PlanSampler's hooks) ------------------------------------
    def _on_step(self, global_step: int) -> None:
        # The snapshot of a pipelined refresh is taken here, in the training loop's thread,
        # when batch ``global_step`` is requested, also when a prefetch thread runs ahead.
        self.refresh_policy.before_step(global_step)

    def _plannable(self, global_step: int) -> bool:
        return self.refresh_policy.ready(global_step)

    def _begin_epoch(self, fresh: bool) -> None:
        if self.batches_partition:  # the loaded structure mid-epoch, else the next one or a build
            t0 = time.perf_counter()
            self.refresh_policy.use(self.epoch, rebuild=fresh)
            self.sampler_seconds += time.perf_counter() - t0
        elif fresh or self.walk_state is None:
            self.walk_state = self._new_walk_state()

    def _new_walk_state(self) -> WalkState:
        keys = self.duplicate_keys
        return WalkState(self.num_items, self.seed, self.epoch,
                         key_sets=None if keys is None or not keys.any else (keys.ptr, keys.idx))

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        policy = self.refresh_policy
        structure = policy.use(policy.due(global_step))
        if self.batches_partition:
            return self.draw(structure, index, 0, None)
        if index % self.plan_width == 0:
            self._step_starts = []  # start nodes of this step's batches so far
        start = None
        if index >= self.batches_per_epoch and self.walk_state.seen.all():
            # padding of the last step once every item was seen: a start node that no other
            # batch of the step began with, so that the step's batches differ
            used = set(self._step_starts)
            start = next(int(v) for v in self.walk_state.start_order if int(v) not in used)
        batch = self.draw(structure, index, _rng.derive_seed(self.seed, self.epoch, index, 0xB),
                          start)
        self._step_starts.append(int(batch[0]))
        return batch

    def _generator_state(self, mid_epoch: bool) -> dict:
        # A step-schedule structure outlives epochs until its next refresh; an epoch's does not.
        state = self.refresh_policy.state_dict(current=mid_epoch or not self.batches_partition)
        if mid_epoch and self.walk_state is not None:
            state["walk"] = self.walk_state.state_dict()
        return state

    def _load_generator_state(self, state: dict) -> None:
        self.walk_state = None
        if "walk" in state:
            self.walk_state = self._new_walk_state()
            self.walk_state.load_state_dict(state["walk"])
        self.refresh_policy.load_state_dict(state, self.epoch)
