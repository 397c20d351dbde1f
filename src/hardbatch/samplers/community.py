"""B3 (Thirukovalluru et al., NeurIPS 2025): batches of K communities of a kNN rank graph."""

from __future__ import annotations

import numpy as np
import torch

from .. import _rng
from .._device import resolve_device
from .._validation import check_choice, check_int, check_real
from ..communities import PARTITIONERS, community_labels, group_order, pairs_in_batches, \
    rank_graph, require_metis, same_key_graph, separate_pairs
from ..embeddings import EmbeddingSource
from ..graph import knn_graph
from .cluster import check_per_batch, drop_count, fixed_source, load_order, save_order, \
    slice_batch
from .duplicates import separate_keys
from .embedding_sampler import EmbeddingSampler

__all__ = ["CommunityBatchSampler"]

NEAR_CANDIDATES = 16  # window neighbours whose batches a separated item tries first


class CommunityBatchSampler(EmbeddingSampler):
    """B3, "Breaking the Batch Barrier" (Thirukovalluru et al., NeurIPS 2025): each batch is
    ``communities_per_batch`` (K) communities of about B / K items of a sparse kNN rank graph;
    an epoch is a partition of the items.

    Build: the ``skip + window`` nearest neighbours of every item (:func:`hardbatch.knn_graph`,
    ``method=knn_method``); ranks ``skip + 1 .. skip + window`` (strong negatives) symmetrised
    into a sparse graph and cut by METIS into ``ceil(N K / B')`` balanced communities
    (:func:`hardbatch.communities.community_labels`); the top ``skip`` ranks (likely
    positives or near-duplicates: false negatives) are left out of the graph. Each epoch
    (:func:`hardbatch.communities.group_order`): the communities in a random order, their items
    shuffled, cut every B items, so a batch holds about K communities (a community that runs
    out mid-batch is continued by the next one); the batches in random order, the short last
    one last. Then no pair of the skipped ranks shares a batch
    (:func:`hardbatch.communities.separate_pairs`: one item of the pair swaps with the most
    similar item of a batch holding its window neighbours, where it stays hard), except pairs
    no swap can separate (``forced_pairs`` counts what is left; ``separated`` the swaps).
    Every item once per epoch; deterministic given ``seed``, the epoch and the embeddings.

    Refresh and cost: fixed embeddings (an array or tensor, e.g. computed once by a teacher
    model, as B3 does) build the graph and communities once; each epoch then shuffles and
    separates (O(N skip)). An :class:`~hardbatch.EmbeddingBank` (fed by the training loop) or a
    callable (re-encodes the whole corpus at each call) is read and rebuilt at the start of
    every epoch (``refresh_lag`` / ``background`` as for GCBS; not every t steps). A build is
    a kNN graph of ``skip + window`` neighbours (exact: O(N^2 d); see ``knn_method``) and one
    METIS run on about ``2 N window`` edges.

    Args:
        embeddings: [N, d] tensor / array (fixed), an :class:`~hardbatch.EmbeddingBank`, or a
            callable returning one (cosine: rows are L2-normalised).
        batch_size: B.
        communities_per_batch: K (default 4): communities of about B' / K items; at most B'.
        skip: p, the nearest ranks left out and kept apart (default 3; 0: none).
        window: m, the ranks after them that make the graph (default 20); ``skip + window``
            must be below N.
        partitioner: ``"metis"`` (default, B3's: ``pip install 'hardbatch[metis]'``) or
            ``"kmeans"`` (no extra: spherical k-means clusters of the embeddings, not balanced
            and blind to the graph; the skipped ranks are still kept apart).
        knn_method: the ``method`` of :func:`hardbatch.knn_graph`, passed through (None: its
            default; ``"exact"`` costs O(N^2 d), ``"faiss-ivf"`` / ``"hnsw"`` are approximate).
        imbalance: METIS's balance tolerance (default 1.03: no community above 1.03 N / parts).
        device: where the kNN graph is computed (default: the CPU).
        refresh_lag, background: read the source ``refresh_lag`` steps before an epoch ends and
            build for the next epoch (in a worker thread with ``background``), as for GCBS.
        drop_last: leave out N mod B items (a random choice per epoch) so every batch is full.
        duplicate_keys: items with equal keys never share a batch: kept apart by the pair
            separation, then (what it could not separate) repaired as for GCBS.
        seed, rank, world_size, global_batch: as in every sampler.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> sampler = hb.CommunityBatchSampler(x, 8, 2, skip=1, window=6)
        >>> batches = list(sampler)
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([8, 8, 8, 8, 8], True)
        >>> sampler.parts, sampler.forced_pairs
        (10, 0)
    """

    _settings = EmbeddingSampler._settings[:-1] + (  # no refresh_every: one order per epoch
        "communities_per_batch", "skip", "window", "partitioner", "knn_method", "imbalance")
    batches_partition = True

    def __init__(
        self,
        embeddings: EmbeddingSource,
        batch_size: int,
        communities_per_batch: int = 4,
        *,
        skip: int = 3,
        window: int = 20,
        partitioner: str = "metis",
        knn_method: str | None = None,
        imbalance: float = 1.03,
        device: str | torch.device | None = None,
        refresh_lag: int | None = None,
        background: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        global_batch: bool = False,
        duplicate_keys=None,
    ) -> None:
        super().__init__(embeddings, batch_size, normalize=True, distributed=False,
                         refresh_lag=refresh_lag, background=background, drop_last=drop_last,
                         seed=seed, rank=rank, world_size=world_size,
                         global_batch=global_batch, duplicate_keys=duplicate_keys)
        n = self.num_items
        k = check_per_batch(self, communities_per_batch, "communities_per_batch")
        self.communities_per_batch = k
        self.skip = check_int(skip, "skip", low=0)
        self.window = check_int(window, "window", low=1)
        if self.skip + self.window >= n:
            raise ValueError(f"window={window} with skip={skip} needs skip + window = "
                             f"{self.skip + self.window} neighbours per item but N={n} items "
                             f"have {n - 1}; use window <= {max(0, n - 1 - self.skip)}")
        check_choice("partitioner", partitioner, PARTITIONERS)
        if partitioner == "metis":
            require_metis()  # ImportError now, naming the extra, not at the first epoch
        self.partitioner, self.knn_method = partitioner, knn_method
        self.imbalance = check_real(imbalance, "imbalance", "a number >= 1 (e.g. 1.03)")
        if self.imbalance < 1.0:
            raise ValueError(f"imbalance={imbalance} must be >= 1 (METIS's tolerance: "
                             "largest community / average; e.g. 1.03)")
        self.parts = min(n, max(1, round(n * k / self.plan_batch_size)))
        self.device = resolve_device(device)
        self.fixed = fixed_source(embeddings)
        self.groups: tuple | None = None  # (labels, skipped pairs, near items) of the last build
        self.separated = 0  # swaps of the last built epoch
        self.forced_pairs = 0  # skipped-rank pairs sharing a batch in the last built epoch

    def communities(self, x: torch.Tensor, epoch: int) -> tuple:
        """(community labels, skipped-rank pairs, window neighbours) of the unit rows ``x``;
        built once for fixed embeddings."""
        if self.fixed and self.groups is not None:
            return self.groups
        seed = _rng.derive_seed(self.seed, 0xB3) if self.fixed else \
            _rng.derive_seed(self.seed, epoch, 0xB3)
        method = {} if self.knn_method is None else {"method": self.knn_method}
        nbrs = knn_graph(x, self.skip + self.window, device=self.device,
                         seed=seed & 0x7FFFFFFF, **method).numpy()
        labels = community_labels(nbrs, self.parts, skip=self.skip, window=self.window,
                                  partitioner=self.partitioner, seed=seed, embeddings=x,
                                  imbalance=self.imbalance)
        pairs = rank_graph(nbrs, 0, self.skip)
        near = np.ascontiguousarray(nbrs[:, self.skip:self.skip + NEAR_CANDIDATES])
        self.groups = (labels, pairs, near)
        return self.groups

    def build(self, x: torch.Tensor, epoch: int, group) -> np.ndarray:
        """Epoch ``epoch``'s item order (batch i: slice i), from the unit rows ``x``."""
        labels, pairs, near = self.communities(x, epoch)
        b, drop = self.plan_batch_size, drop_count(self)
        kept = self.num_items - drop
        order = group_order(labels, b, 1, drop=drop, seed=_rng.derive_seed(self.seed, epoch, 0xB4))
        keys = self.duplicate_keys
        apart = pairs if keys is None or not keys.any else \
            (pairs + same_key_graph(keys.ids)).tocsr()  # copies kept apart in the same pass
        if apart.nnz:
            order, self.separated, _ = separate_pairs(order, kept, b, apart, x, near)
        order = separate_keys(order, kept, b, keys)[:kept]
        self.forced_pairs = pairs_in_batches(order, kept, b, pairs)
        return order

    def draw(self, order: np.ndarray, index: int, seed: int, start: int | None) -> np.ndarray:
        """Plan batch ``index``: slice ``index`` of the epoch's order."""
        return slice_batch(self, order, index)

    save_structure = staticmethod(save_order)
    load_structure = staticmethod(load_order)
