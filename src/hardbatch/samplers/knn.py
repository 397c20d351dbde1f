"""The kNN sampler (BatchSampler's baseline): an anchor plus its B-1 nearest neighbours."""

from __future__ import annotations

import numpy as np
import torch

from .._device import resolve_device
from .._validation import embedding_tensor
from ..embeddings import EmbeddingSource
from .embedding_sampler import EmbeddingSampler


class KNNBatchSampler(EmbeddingSampler):
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
        refresh_lag: steps between a snapshot and its use (default 0).
        prefetch: batches planned ahead in a prefetch thread (see ProximityGraphSampler).
        device: where the per-batch product runs (the snapshot lives there; a source on this
            device is read, normalised and copied there, never through the host).
        global_batch: each step is one anchor plus its ``world_size * batch_size - 1``
            nearest rows, rank r taking slice r (see :class:`~hardbatch.samplers.PlanSampler`).
        duplicate_keys: N hashable keys (e.g. the texts); a batch takes the next nearest
            neighbour instead of an item whose key it already holds. Needs at least B
            distinct keys. No key shared: the same batches as without keys.
        normalize, drop_last, seed, rank, world_size: as in every sampler.

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

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 refresh_every: int | None = 100, *, drop_last: bool = False, seed: int = 0,
                 normalize: bool = True, refresh_lag: int | None = None, prefetch: int = 0,
                 device: str | torch.device | None = None, rank: int | None = None,
                 world_size: int | None = None, global_batch: bool = False,
                 duplicate_keys=None) -> None:
        super().__init__(embeddings, batch_size, refresh_every=refresh_every,
                         drop_last=drop_last, seed=seed, normalize=normalize, rank=rank,
                         world_size=world_size, refresh_lag=refresh_lag, distributed=False,
                         prefetch=prefetch, global_batch=global_batch,
                         duplicate_keys=duplicate_keys)
        self.device = resolve_device(device)
        if self.plan_batch_size >= self.num_items:
            name = ("world_size * batch_size = " if self.global_batch else "batch_size=") + \
                str(self.plan_batch_size)
            raise ValueError(f"{name} must be smaller than N={self.num_items} for the kNN "
                             "sampler (anchor plus B-1 neighbours)")

    def build(self, x: torch.Tensor, step: int, group) -> torch.Tensor:
        """The snapshot [N, d] on ``device`` (checked for NaN / inf)."""
        # Normalised rows are a new tensor already; without normalize ``x`` may be the live
        # source (an EmbeddingBank), and the snapshot must stay as it was at its refresh step.
        return embedding_tensor(x).to(self.device, copy=not self.normalize)

    def draw(self, structure: torch.Tensor, index: int, seed: int,
             start: int | None = None) -> np.ndarray:
        """The anchor (``start``, else the walk state's next start) and its nearest rows."""
        state, b = self.walk_state, self.plan_batch_size
        anchor = state.next_start(seed) if start is None else start
        sims = structure @ structure[anchor]
        sims[anchor] = -torch.inf
        keys = self.duplicate_keys
        if keys is None or not keys.any:
            nearest = sims.topk(b - 1, sorted=True).indices.cpu().numpy()
            batch = np.concatenate([[anchor], nearest]).astype(np.int64)
        else:  # the nearest rows, passing over those whose key the batch holds
            k = min(self.num_items - 1, b - 1 + max(16, b // 8))
            while True:
                nearest = sims.topk(k, sorted=True).indices.cpu().numpy()
                batch = state.key_free(anchor, nearest, b)
                if len(batch) == b or k == self.num_items - 1:
                    break
                k = min(self.num_items - 1, 2 * k)
        state.seen[batch] = 1
        return batch

    def save_structure(self, structure: torch.Tensor) -> dict:
        """The snapshot on the CPU."""
        return {"snapshot": structure.cpu().clone()}

    def load_structure(self, state: dict) -> torch.Tensor | None:
        """The snapshot saved by :meth:`save_structure` on ``device``, or None."""
        if "snapshot" not in state:
            return None
        return torch.as_tensor(state["snapshot"], dtype=torch.float32).to(self.device)
