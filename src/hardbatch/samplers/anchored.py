"""Base of the proximity-graph and kNN samplers: batches grown from start nodes (anchors)."""

from __future__ import annotations

import numpy as np

from .. import _rng
from .._validation import check_int
from ..embeddings import EmbeddingSource, source_num_items
from ..walks import WalkState
from .base import PlanSampler
from .refresh import RefreshingSampler, RefreshPolicy, Structure, check_pipelining, \
    resolve_distributed


class AnchoredSampler(RefreshingSampler):
    """Batches grown from start nodes over a structure refreshed every ``refresh_every`` steps.

    The structure (a graph, an embedding snapshot) is built by :meth:`_build` from the
    normalised embeddings of the source, on the step schedule of a :class:`RefreshPolicy`
    (its docstring: pipelined, background and distributed builds); each batch is drawn by
    :meth:`_draw` from a start node / anchor of a per-epoch :class:`WalkState`, which starts
    from items not yet seen this epoch (``coverage``).
    """

    _settings = PlanSampler._settings + ("refresh_every",)
    batches_partition = False

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, *,
                 refresh_every: int | None, drop_last: bool, seed: int, normalize: bool,
                 rank: int | None, world_size: int | None, refresh_lag: int | None = None,
                 background: bool = False, distributed: bool | None = None,
                 process_group=None, prefetch: int = 0, global_batch: bool = False,
                 duplicate_keys=None) -> None:
        n, first = source_num_items(embeddings)
        super().__init__(n, batch_size, drop_last=drop_last, seed=seed, rank=rank,
                         world_size=world_size, prefetch=prefetch, global_batch=global_batch,
                         duplicate_keys=duplicate_keys)
        every = None if refresh_every is None else check_int(refresh_every, "refresh_every",
                                                             low=1)
        self.normalize = bool(normalize)
        background, lag = check_pipelining(
            background, refresh_lag, "steps between the snapshot and the use of the new graph")
        if lag and every is not None and lag >= every:
            raise ValueError(f"refresh_lag={lag} must be smaller than refresh_every={every}")
        distributed = resolve_distributed(distributed, process_group, self.rank, self.world_size)
        if distributed and self.prefetch and not background:
            raise ValueError("prefetch > 0 under torch.distributed needs background=True (graph "
                             "builds then use a process group of their own, off the training "
                             "loop's thread); pass background=True or prefetch=0")
        self.refresh_policy = RefreshPolicy(
            embeddings, first, n, prepare=self._prepare, build=self._build, save=self._save,
            load=self._load, every=every, lag=lag, background=background,
            distributed=distributed, process_group=process_group, threaded=bool(self.prefetch))
        self._walk_state: WalkState | None = None
        self._step_starts: list[int] = []

    # -- subclass hooks ------------------------------------------------
    def _build(self, x: np.ndarray, step: int, group) -> Structure:
        """The structure from normalised embeddings ``x`` [N, d] for refresh step ``step``;
        ``group``: the process group of a distributed build, or None."""
        raise NotImplementedError

    def _draw(self, structure: Structure, index: int, seed: int,
              start: int | None = None) -> np.ndarray:
        """Plan batch ``index`` of the epoch, drawn from ``structure`` with stream ``seed``,
        from start node / anchor ``start`` (None: the walk state's next start); the start
        node is the batch's first item."""
        raise NotImplementedError

    def _save(self, structure: Structure) -> dict:
        """A built structure as tensors, for checkpoints."""
        raise NotImplementedError

    def _load(self, state: dict) -> Structure | None:
        """The structure :meth:`_save` wrote into ``state`` (None if it holds none)."""
        raise NotImplementedError

    # -- refresh and plan ------------------------------------------------
    @property
    def refresh_every(self) -> int | None:
        """Steps between rebuilds (the paper's t); None builds once."""
        return self.refresh_policy.every

    def refresh(self, global_step: int = 0) -> None:
        """Re-read the embedding source and rebuild (as scheduled at ``global_step``)."""
        self.refresh_policy.refresh(global_step)

    def _prepare(self, x: np.ndarray, copy: bool) -> np.ndarray:
        if self.normalize:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        elif copy:
            x = x.copy()  # a snapshot: the bank keeps changing while the build runs
        return np.ascontiguousarray(x, np.float32)

    @property
    def coverage(self) -> float:
        """Share of items drawn so far this epoch (all ranks)."""
        return 0.0 if self._walk_state is None else self._walk_state.coverage

    def _begin_epoch(self, fresh: bool) -> None:
        if fresh or self._walk_state is None:
            self._walk_state = self._new_walk_state()

    def _new_walk_state(self) -> WalkState:
        keys = self.duplicate_keys
        return WalkState(self.num_items, self.seed, self.epoch,
                         None if keys is None or not keys.any else keys.ids)

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        policy = self.refresh_policy
        structure = policy.use(policy.due(global_step))
        if index % self.plan_width == 0:
            self._step_starts = []  # start nodes of this step's batches so far
        start = None
        if index >= self.batches_per_epoch and self._walk_state.seen.all():
            # padding of the last step once every item was seen: a start node that no other
            # batch of the step began with, so that the step's batches differ
            used = set(self._step_starts)
            start = next(int(v) for v in self._walk_state.start_order if int(v) not in used)
        batch = self._draw(structure, index, _rng.derive_seed(self.seed, self.epoch, index, 0xB),
                           start)
        self._step_starts.append(int(batch[0]))
        return batch

    def _generator_state(self, mid_epoch: bool) -> dict:
        # The structure outlives epochs until its next refresh.
        state = self.refresh_policy.state_dict()
        if mid_epoch:
            state["walk"] = self._walk_state.state_dict()
        return state

    def _load_generator_state(self, state: dict) -> None:
        self._walk_state = None
        if "walk" in state:
            self._walk_state = self._new_walk_state()
            self._walk_state.load_state_dict(state["walk"])
        self.refresh_policy.load_state_dict(state, self.epoch)
