"""Walk samplers: each batch grows around a start item on a structure rebuilt every t steps.

:class:`WalkSampler` is the base of the proximity-graph and kNN samplers: the structure (a
graph, an embedding snapshot) is rebuilt every ``refresh_every`` steps, counted over the whole
run, and each batch grows from a start node / anchor of a per-epoch
:class:`~hardbatch.batching.walks.WalkState`, which starts from items not yet seen this epoch
(``coverage``); the start node is the batch's first item.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import _rng
from .._validation import check_int
from ..embeddings import EmbeddingSource
from ..batching.walks import WalkState
from .embedding_sampler import EmbeddingSampler


class WalkSampler(EmbeddingSampler):
    """An embedding sampler whose batches grow from start items on a structure rebuilt every
    ``refresh_every`` steps.

    Subclasses implement ``draw(structure, index, seed, start)`` (a batch from a start item,
    marking its items in ``walk_state.seen``) and inject the
    :class:`~hardbatch.samplers.refresh.Builder` of their structure into the refresh policy
    in their constructor (``self.refresh_policy.builder = ...``); the policy builds it from
    the embeddings of every refresh step s.

    Args:
        embeddings: the source: an [N, d] tensor / array, an EmbeddingBank or a callable.
        batch_size: B.
        refresh_every: steps between rebuilds (None: once).
        **options: the shared options (:mod:`hardbatch.samplers.options`).

    Example:
        >>> import numpy as np, torch
        >>> from hardbatch.samplers import WalkSampler
        >>> class OrderBuilder:  # the items in the order of x[:, 0]
        ...     exact_build, cheaper_build = False, "a smaller N"
        ...     def build(self, x, key, group):
        ...         return torch.argsort(x[:, 0]).numpy()
        ...     def save_structure(self, order):
        ...         return {"order": torch.from_numpy(order)}
        ...     def load_structure(self, state):
        ...         return state["order"].numpy() if "order" in state else None
        >>> class ByFirstFeature(WalkSampler):  # a start item and those after it in the order
        ...     def __init__(self, embeddings, batch_size, **options):
        ...         super().__init__(embeddings, batch_size, **options)
        ...         self.refresh_policy.builder = OrderBuilder()
        ...     def draw(self, order, index, seed, start):
        ...         start = self.walk_state.next_start(seed) if start is None else start
        ...         batch = np.roll(order, -np.argmax(order == start))[:self.plan_batch_size]
        ...         self.walk_state.seen[batch] = 1
        ...         return batch
        >>> sampler = ByFirstFeature(np.random.default_rng(0).random((40, 8)), 8, normalize=False)
        >>> [len(set(b)) for b in sampler], sampler.refreshes
        ([8, 8, 8, 8, 8], 1)
    """

    _settings = EmbeddingSampler._settings + ("refresh_every",)
    batches_partition = False

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 refresh_every: int | None = None, **options) -> None:
        super().__init__(embeddings, batch_size, every=refresh_every, **options)
        self.walk_state: WalkState | None = None  # the epoch's start nodes and seen items
        self._step_starts: list[int] = []
        self._warned_epoch: int | None = None  # the epoch whose key fallback was reported

    def draw(self, structure, index: int, seed: int, start: int | None) -> np.ndarray:
        """Plan batch ``index`` of the epoch, grown with stream ``seed`` from ``start`` (None:
        the walk state's next start) on the structure in use."""
        raise NotImplementedError

    def _schedule(self, every: int | None, lag: int) -> int | None:
        every = None if every is None else check_int(every, "refresh_every", low=1)
        if lag and every is not None and lag >= every:
            raise ValueError(f"refresh_lag={lag} must be smaller than refresh_every={every}")
        if lag and every is None:
            warnings.warn(f"refresh_lag={lag} (or background=True) pipelines the refreshes, but "
                          "refresh_every=None never refreshes: the walks use the first "
                          "embeddings' graph, and the option does nothing (drop it, or set "
                          "refresh_every)", stacklevel=4)
        return every

    @property
    def coverage(self) -> float:
        """Share of items drawn so far this epoch (all ranks)."""
        return 0.0 if self.walk_state is None else self.walk_state.coverage

    def _begin_epoch(self, fresh: bool) -> None:
        if fresh or self.walk_state is None:
            self.walk_state = self._new_walk_state()

    def _new_walk_state(self) -> WalkState:
        keys = self.duplicate_keys
        return WalkState(self.num_items, self.seed, self.epoch,
                         key_sets=None if keys is None or not keys.any else (keys.ptr, keys.idx))

    def _generate(self, index: int, global_step: int) -> np.ndarray:
        policy = self.refresh_policy
        structure = policy.use(policy.due(global_step))
        if index % self.plan_width == 0:
            self._step_starts = []  # start nodes of this step's batches so far
        start = None
        if index >= self.batches_per_epoch and self.walk_state.seen.all():
            # padding of the last step once every item was seen: a start node that no other
            # batch of the step began with, so that the step's batches differ
            used = set(self._step_starts)
            start = next(int(v) for v in self.walk_state.start_order if int(v) not in used)
        taken = int(self.walk_state.fallbacks[0])
        batch = self.draw(structure, index, _rng.derive_seed(self.seed, self.epoch, index, 0xB),
                          start)
        if self.walk_state.fallbacks[0] > taken and self._warned_epoch != self.epoch:
            self._warned_epoch = self.epoch  # once per epoch
            warnings.warn(
                f"duplicate_keys: batch {index} of epoch {self.epoch} holds items that share a "
                f"key: its items' key sets (anchor: item {int(batch[0])}) meet so many others "
                "that no item free of their keys was left to complete it; use a smaller "
                "batch_size or keys that tell more items apart",
                stacklevel=2)
        self._step_starts.append(int(batch[0]))
        return batch

    def _generator_state(self, mid_epoch: bool) -> dict:
        # A step-schedule structure outlives epochs until its next refresh.
        state = self.refresh_policy.state_dict(current=True)
        if mid_epoch and self.walk_state is not None:
            state["walk"] = self.walk_state.state_dict()
        return state

    def _load_generator_state(self, state: dict) -> None:
        self.walk_state = None
        if "walk" in state:
            self.walk_state = self._new_walk_state()
            self.walk_state.load_state_dict(state["walk"])
        super()._load_generator_state(state)
