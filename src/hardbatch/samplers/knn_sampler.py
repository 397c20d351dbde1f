"""The kNN sampler (BatchSampler's baseline): an anchor plus its B-1 nearest neighbours.

The sampler's policy lives here too: which index, if any, a snapshot gets
(:func:`sampler_index_kind`), and its builder, :class:`SnapshotBuilder` (a snapshot of the
embeddings per refresh, indexed or not); the searches themselves are
:mod:`hardbatch.neighbors`' (the anchor's exact nearest rows,
:func:`~hardbatch.neighbors.exact_search.item_neighbors`; an index's,
:class:`~hardbatch.neighbors.index_search.NeighborIndex`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .._device import resolve_device
from .._validation import embedding_tensor
from ..embeddings import EmbeddingSource
from ..neighbors.exact_search import item_neighbors
from ..neighbors.index_search import (RECALL_MARGIN, RECALL_TARGET, NeighborIndex,
                                      import_index_library, resolve_knn_method)
from .options import KNNOptions, take_options
from .refresh import PlanShape
from .walk_sampler import WalkSampler

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AUTO_SAMPLER_MIN_STEPS", "KNNBatchSampler", "SAMPLER_METHODS", "SnapshotBuilder",
           "sampler_index_kind"]

#: KNNBatchSampler(method="auto") indexes a snapshot only if it serves at least this many steps:
#: an IVF build costs about as much as 500 exact per-batch products (bench_knn_index.py --sampler).
AUTO_SAMPLER_MIN_STEPS = 500
SAMPLER_METHODS = ("auto", "exact", "faiss-ivf", "hnsw")


def sampler_index_kind(method: str, num_items: int, refresh_every: int | None,
                       device: torch.device | None = None, world_size: int = 1) -> str | None:
    """The index of :class:`KNNBatchSampler`'s ``method``: None (an exact product per batch),
    ``"ivf"`` or ``"hnsw"``.

    ``"auto"`` picks the IVF only on the CPU, in one process (ranks on other machines could
    build other indexes, hence other batches), above
    :data:`~hardbatch.neighbors.index_search.AUTO_EXACT_MAX_ITEMS` items and when a snapshot
    serves at least :data:`AUTO_SAMPLER_MIN_STEPS` steps (``refresh_every`` None or that
    large); ``ValueError`` for a name outside :data:`SAMPLER_METHODS`, ``ImportError`` naming
    the extra for a missing index package.

    Example:
        >>> from hardbatch.samplers.knn_sampler import sampler_index_kind
        >>> sampler_index_kind("auto", 300, None), sampler_index_kind("auto", 10**6, 100)
        (None, None)
        >>> sampler_index_kind("faiss-ivf", 300, 100)
        'ivf'
    """
    if not isinstance(method, str) or method not in SAMPLER_METHODS:
        raise ValueError(f"method={method!r} must be one of {list(SAMPLER_METHODS)}")
    if method in ("faiss-ivf", "hnsw"):
        kind = "ivf" if method == "faiss-ivf" else "hnsw"
        import_index_library(kind)
        return kind
    serves = refresh_every is None or refresh_every >= AUTO_SAMPLER_MIN_STEPS
    if method == "exact" or world_size > 1 or not serves:
        return None
    return "ivf" if resolve_knn_method(method, num_items, device) == "auto-ivf" else None


class SnapshotBuilder:
    """The :class:`~hardbatch.samplers.refresh.Builder` of :class:`KNNBatchSampler`: a snapshot
    of the embeddings on ``device`` per refresh, with its tuned index for an index method.

    Args:
        plan: the sampler's :class:`~hardbatch.samplers.refresh.PlanShape` (seed, B').
        method: the sampler's ``method`` (``"auto"`` keeps the exact product where an index
            misses its recall target).
        index_kind: None (an exact product per batch), ``"ivf"`` or ``"hnsw"``
            (:func:`sampler_index_kind`).
        device: where the snapshot lives (the per-batch products run there).
        normalize: whether the rows read are already a new (normalised) tensor; else the build
            copies them, so that later writes to the source leave the snapshot alone.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.knn_sampler import SnapshotBuilder
        >>> from hardbatch.samplers.refresh import PlanShape
        >>> builder = SnapshotBuilder(PlanShape(40, 4, 10, 0, 0, None), "exact", None,
        ...                           device=torch.device("cpu"))
        >>> snapshot = builder.build(torch.eye(40, 8), 0, None)
        >>> tuple(snapshot.shape), builder.exact_build, sorted(builder.save_structure(snapshot))
        ((40, 8), True, ['snapshot'])
    """

    def __init__(self, plan: PlanShape, method: str, index_kind: str | None, *,
                 device: torch.device, normalize: bool = True) -> None:
        self.plan, self.method, self.index_kind = plan, method, index_kind
        self.device, self.normalize = device, normalize

    @property
    def exact_build(self) -> bool:
        """Whether every batch is an exact product (``method="exact"``; the cost advice)."""
        return self.method == "exact"

    @property
    def cheaper_build(self) -> str:
        """The cost advice's cheaper option ("" when the search is an index already)."""
        return "method='faiss-ivf' instead of the exact search" if self.exact_build else ""

    def build(self, x: torch.Tensor, step: int, group) -> torch.Tensor:
        """The snapshot [N, d] on ``device`` (checked for NaN / inf)."""
        # Normalised rows are a new tensor already; without normalize ``x`` may be the live
        # source (an EmbeddingBank), and the snapshot must stay as it was at its refresh step.
        snapshot = embedding_tensor(x).to(self.device, copy=not self.normalize)
        return self._indexed(snapshot)

    def _indexed(self, snapshot: torch.Tensor):
        """The snapshot (checked), or (snapshot, its tuned index) for an index method."""
        if self.index_kind is None:
            return snapshot
        index = NeighborIndex(snapshot, self.index_kind, seed=self.plan.seed,
                              check_finite=False)  # build() checked it
        if index.tune(self.plan.batch_size - 1) < RECALL_TARGET + RECALL_MARGIN and \
                self.method == "auto":
            return snapshot  # data without cluster structure: the exact product per batch
        return snapshot, index

    def save_structure(self, structure) -> dict:
        """The snapshot on the CPU (an index is rebuilt from it on load)."""
        snapshot = structure[0] if isinstance(structure, tuple) else structure
        return {"snapshot": snapshot.cpu().clone()}

    def load_structure(self, state: dict):
        """The snapshot saved by :meth:`save_structure` on ``device``, or None."""
        if "snapshot" not in state:
            return None
        return self._indexed(embedding_tensor(state["snapshot"], "the state's snapshot")
                             .to(self.device))


class KNNBatchSampler(WalkSampler):
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
        method: ``"exact"`` (the product above), ``"faiss-ivf"`` or ``"hnsw"`` (an index of
            each snapshot, :class:`~hardbatch.neighbors.index_search.NeighborIndex`, tuned to
            recall@(B-1) >= 0.95; one query per batch) or ``"auto"`` (default): an IVF index
            only where it pays for its build (CPU, one process, N above 50,000 and
            ``refresh_every`` None or at least 500 steps; :func:`sampler_index_kind`), else
            exact.
        **options: the shared options (:mod:`hardbatch.samplers.options`) but
            ``background``, ``distributed``, ``process_group``, ``precision`` and ``progress``
            (a snapshot is a copy, made in one process). Here: ``device`` is where the
            per-batch product runs (the snapshot lives there; a source on that device is read,
            normalised and copied there, never through the host); ``global_batch``: one anchor
            plus its ``world_size * batch_size - 1`` nearest rows per step;
            ``duplicate_keys``: a batch takes the next nearest neighbour instead of an item
            whose key it holds (needs B distinct keys).

    Under DDP every rank needs the same snapshot for the plans to agree:
    feed it from an :class:`EmbeddingBank` (synchronised across ranks) or a
    fixed table.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> batch = next(iter(hb.KNNBatchSampler(x, 4, refresh_every=None)))
        >>> u = x / np.linalg.norm(x, axis=1, keepdims=True)
        >>> sims = u @ u[batch[0]]
        >>> sims[batch[0]] = -2
        >>> sorted(batch[1:]) == sorted(np.argsort(-sims)[:3].tolist())
        True
    """

    _settings = WalkSampler._settings + ("method",)  # an index's neighbours may differ

    Options = KNNOptions

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 refresh_every: int | None = 100, *, method: str = "auto",
                 **options: Unpack[KNNOptions]) -> None:
        shared = take_options(type(self), options, distributed=False)
        device = shared.pop("device")
        super().__init__(embeddings, batch_size, refresh_every, **shared)
        self.device = resolve_device(device)
        self.method = method
        self.index_kind = sampler_index_kind(method, self.num_items, self.refresh_every,
                                             self.device, self.world_size)
        if self.plan_batch_size >= self.num_items:
            name = ("world_size * batch_size = " if self.global_batch else "batch_size=") + \
                str(self.plan_batch_size)
            raise ValueError(f"{name} must be smaller than N={self.num_items} for the kNN "
                             "sampler (anchor plus B-1 neighbours)")
        self.refresh_policy.builder = SnapshotBuilder(self._plan_shape(), method,
                                                      self.index_kind, device=self.device,
                                                      normalize=self.normalize)

    def _nearest(self, structure, anchor: int, k: int) -> np.ndarray:
        """The k items nearest to ``anchor``, nearest first (by the index where there is one)."""
        if isinstance(structure, tuple):
            snapshot, index = structure
            if k < self.num_items - 1:
                return index.neighbors_of(np.array([anchor]), k)[0]
            structure = snapshot
        return item_neighbors(structure, anchor, k).cpu().numpy()

    def draw(self, structure: torch.Tensor, index: int, seed: int,
             start: int | None = None) -> np.ndarray:
        """The anchor (``start``, else the walk state's next start) and its nearest rows."""
        state, b = self.walk_state, self.plan_batch_size
        anchor = state.next_start(seed) if start is None else start
        keys = self.duplicate_keys
        if keys is None or not keys.any:
            nearest = self._nearest(structure, anchor, b - 1)
            batch = np.concatenate([[anchor], nearest]).astype(np.int64)
        else:  # the nearest rows, passing over those whose key the batch holds
            # key sets block more candidates: start with twice the batch (one top-k, mostly)
            k = min(self.num_items - 1, (2 * b if keys.sets else b - 1) + max(16, b // 8))
            while True:
                nearest = self._nearest(structure, anchor, k)
                batch = state.key_free(anchor, nearest, b)
                if len(batch) == b or k == self.num_items - 1:
                    break
                k = min(self.num_items - 1, 2 * k)
        state.seen[batch] = 1
        return batch
