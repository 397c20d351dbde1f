"""Topic-aware sampling (TAS-B): batches drawn from few spherical k-means clusters."""

from __future__ import annotations

import numpy as np
import torch

from .. import _rng
from .._device import resolve_device
from .._validation import check_choice, check_int
from ..communities import KMEANS_BACKENDS, group_order, groups_per_batch, spherical_clusters
from ..embeddings import EmbeddingSource
from .duplicates import separate_keys
from .embedding_sampler import EmbeddingSampler

__all__ = ["ClusterBatchSampler", "check_per_batch", "drop_count", "fixed_source", "load_order",
           "save_order", "slice_batch"]


def fixed_source(embeddings) -> bool:
    """Whether a source is a fixed table (an array or tensor: its groups are built once).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers.cluster import fixed_source
        >>> fixed_source(np.ones((40, 8))), fixed_source(hb.EmbeddingBank(40, 8))
        (True, False)
    """
    return isinstance(embeddings, (np.ndarray, torch.Tensor))


def drop_count(sampler: EmbeddingSampler) -> int:
    """Items an epoch of a partition sampler leaves out (N mod B' with drop_last, else 0).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers.cluster import drop_count
        >>> x = np.random.default_rng(0).standard_normal((40, 8))
        >>> drop_count(hb.ClusterBatchSampler(x, 16, drop_last=True, kmeans="torch"))
        8
    """
    return sampler.num_items % sampler.plan_batch_size if sampler.drop_last else 0


def check_per_batch(sampler: EmbeddingSampler, value, name: str) -> int:
    """``value`` of option ``name`` (groups per batch) checked: an int in [1, B'].

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers.cluster import check_per_batch
        >>> sampler = hb.ClusterBatchSampler(np.eye(40, 8), 8, kmeans="torch")
        >>> check_per_batch(sampler, 2, "clusters_per_batch")
        2
        >>> check_per_batch(sampler, 9, "clusters_per_batch")
        Traceback (most recent call last):
            ...
        ValueError: clusters_per_batch=9 must be at most the batch_size 8 (each group gives a ...
    """
    value, b = check_int(value, name, low=1), sampler.plan_batch_size
    if value > b:
        size = "world_size * batch_size" if sampler.global_batch else "batch_size"
        raise ValueError(f"{name}={value} must be at most the {size} {b} (each group gives a "
                         f"batch at least one item); use {name} <= {b}")
    return value


def slice_batch(sampler: EmbeddingSampler, order: np.ndarray, index: int) -> np.ndarray:
    """Plan batch ``index`` of an epoch's order: its slice ``index`` (padding batches of the
    last step, ``index >= batches_per_epoch``, repeat the epoch's first batches).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers.cluster import slice_batch
        >>> x = np.random.default_rng(0).standard_normal((40, 8))
        >>> sampler = hb.ClusterBatchSampler(x, 16, kmeans="torch")
        >>> [len(slice_batch(sampler, np.arange(40), i)) for i in range(4)]
        [16, 16, 8, 16]
    """
    size, index = sampler.plan_batch_size, index % sampler.batches_per_epoch
    return order[index * size:(index + 1) * size]


def save_order(order: np.ndarray) -> dict:
    """An epoch's item order as a checkpoint payload (a tensor).

    Example:
        >>> import numpy as np
        >>> from hardbatch.samplers.cluster import load_order, save_order
        >>> load_order(save_order(np.arange(4))).tolist(), load_order({})
        ([0, 1, 2, 3], None)
    """
    return {"order": torch.from_numpy(np.array(order, np.int64))}


def load_order(state: dict) -> np.ndarray | None:
    """The order saved by :func:`save_order`, or None.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.cluster import load_order
        >>> load_order({"order": torch.arange(3)}).tolist()
        [0, 1, 2]
    """
    return np.asarray(state["order"], np.int64) if "order" in state else None


class ClusterBatchSampler(EmbeddingSampler):
    """TAS-B (Hofstätter et al., SIGIR 2021): each batch drawn from ``clusters_per_batch``
    spherical k-means clusters of the embeddings; an epoch is a partition of the items.

    Build (:func:`hardbatch.communities.spherical_clusters`): spherical k-means with
    ``clusters`` centroids (faiss ``Kmeans(spherical=True)`` when installed, else
    :func:`hardbatch.gcbs.spherical_kmeans`; two levels above 256 clusters). Each epoch
    (:func:`hardbatch.communities.group_order`): the clusters in a random order, their items
    shuffled, split into c = ``clusters_per_batch`` lanes; slot j of a batch (B / c items) comes
    from lane j, whole slots of a cluster first. A cluster that runs out mid-batch is continued
    by the next cluster of its lane (the fill): only the batches cut from the clusters'
    leftovers hold more than c clusters, at most one extra per cluster end (``fill_batches``
    counts them; with the default ``clusters`` = N / B and uneven k-means clusters that is
    about half the batches, with fewer, larger clusters few). The full batches are visited in
    random order, the short last one (N mod B items) last. Every item once per epoch;
    deterministic given ``seed``, the epoch and the embeddings.

    Refresh and cost: fixed embeddings (an array or tensor, e.g. computed once by a teacher
    model) are clustered once, at the first epoch; each epoch then only re-shuffles (O(N)). An
    :class:`~hardbatch.EmbeddingBank` (fed by the training loop, no extra encoding) or a
    callable (re-encodes the whole corpus at each call) is read and re-clustered at the start
    of every epoch (``refresh_lag`` / ``background`` as for GCBS; not every t steps). One
    clustering of N rows in d dims costs about ``iters * d * N * sqrt(clusters)`` (two levels)
    multiply-adds plus an ``N x clusters`` assignment for up to 256 clusters.

    Args:
        embeddings: [N, d] tensor / array (fixed), an :class:`~hardbatch.EmbeddingBank`, or a
            callable returning one (cosine: rows are L2-normalised).
        batch_size: B.
        clusters: k (default None: ``ceil(N / B')``, B' the plan's batch size; the value used
            is ``num_clusters``); at most N.
        clusters_per_batch: c, clusters a batch draws from (default 1); at most B'.
        iters: k-means iterations (default 10).
        kmeans: ``"auto"`` (faiss when installed), ``"faiss"`` or ``"torch"``.
        device: where the torch k-means runs (default: the source's device).
        refresh_lag, background: read the source ``refresh_lag`` steps before an epoch ends and
            cluster for the next epoch (in a worker thread with ``background``), as for GCBS.
        drop_last: leave out N mod B items (a random choice per epoch) so every batch is full.
        duplicate_keys: items with equal keys never share a batch (a clashing item swaps with
            the nearest batch lacking its key, as for GCBS; this may add a cluster to a batch).
        seed, rank, world_size, global_batch: as in every sampler.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> sampler = hb.ClusterBatchSampler(x, 8, kmeans="torch")
        >>> batches = list(sampler)
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([8, 8, 8, 8, 8], True)
        >>> sampler.num_clusters, sampler.fill_batches <= sampler.num_clusters
        (5, True)
    """

    _settings = EmbeddingSampler._settings[:-1] + (  # no refresh_every: one order per epoch
        "clusters", "clusters_per_batch", "iters", "kmeans")
    batches_partition = True

    def __init__(self, embeddings: EmbeddingSource, batch_size: int,
                 clusters: int | None = None, *, clusters_per_batch: int = 1, iters: int = 10,
                 kmeans: str = "auto", device: str | torch.device | None = None,
                 refresh_lag: int | None = None, background: bool = False,
                 drop_last: bool = False, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, global_batch: bool = False,
                 duplicate_keys=None) -> None:
        super().__init__(embeddings, batch_size, normalize=True, drop_last=drop_last, seed=seed,
                         rank=rank, world_size=world_size, refresh_lag=refresh_lag,
                         background=background, distributed=False, global_batch=global_batch,
                         duplicate_keys=duplicate_keys)
        n, b = self.num_items, self.plan_batch_size
        self.clusters_per_batch = check_per_batch(self, clusters_per_batch, "clusters_per_batch")
        self.clusters = None if clusters is None else check_int(clusters, "clusters", low=1)
        self.num_clusters = -(-n // b) if clusters is None else self.clusters  # k
        if self.num_clusters > n:
            raise ValueError(f"clusters={clusters} must be at most the N={n} items; use "
                             f"clusters <= {n} or None (default ceil(N / B) = {-(-n // b)})")
        check_choice("kmeans", kmeans, KMEANS_BACKENDS)
        self.kmeans, self.iters = kmeans, check_int(iters, "iters", low=1)
        self.device = None if device is None else resolve_device(device)
        self.fixed = fixed_source(embeddings)
        self.labels: np.ndarray | None = None  # the clusters of the last build
        self.fill_batches = 0  # batches of the last built epoch holding more than c clusters

    def cluster(self, x: torch.Tensor, epoch: int) -> np.ndarray:
        """Cluster labels of the rows ``x``; fixed embeddings are clustered once."""
        if self.fixed and self.labels is not None:
            return self.labels
        if self.device is not None:
            x = x.to(self.device)
        seed = _rng.derive_seed(self.seed, 0xC1) if self.fixed else \
            _rng.derive_seed(self.seed, epoch, 0xC1)
        self.labels = spherical_clusters(x, self.num_clusters, seed=seed, iters=self.iters,
                                         backend=self.kmeans)
        return self.labels

    def build(self, x: torch.Tensor, epoch: int, group) -> np.ndarray:
        """Epoch ``epoch``'s item order (batch i: slice i), from the unit rows ``x``."""
        labels = self.cluster(x, epoch)
        b, drop = self.plan_batch_size, drop_count(self)
        order = group_order(labels, b, self.clusters_per_batch, drop=drop,
                            seed=_rng.derive_seed(self.seed, epoch, 0xC2))
        kept = self.num_items - drop
        order = separate_keys(order, kept, b, self.duplicate_keys)[:kept]
        self.fill_batches = int((groups_per_batch(order, labels, b) >
                                 self.clusters_per_batch).sum())
        return order

    def draw(self, order: np.ndarray, index: int, seed: int, start: int | None) -> np.ndarray:
        """Plan batch ``index``: slice ``index`` of the epoch's order."""
        return slice_batch(self, order, index)

    save_structure = staticmethod(save_order)
    load_structure = staticmethod(load_order)
