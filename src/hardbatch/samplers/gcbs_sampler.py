"""Global Contrastive Batch Sampling (GCBS): each epoch's batches cut from a GCBS order.

:class:`GCBSOrderBuilder` builds (and checkpoints) an epoch's order; the sampler cuts it into
batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from .. import _rng
from .._device import check_precision, resolve_device
from .._logging import show_progress
from .._validation import check_int, check_real
from ..embeddings import EmbeddingSource, source_num_items
from ..batching.communities import dropped_last
from ..batching.gcbs import check_min_partners, check_search_args, default_interleave, gcbs_permutation, \
    interleave_chunks, resolve_method, sharded_gcbs_permutation
from .options import GCBSOptions, take_options
from .partition_sampler import PartitionSampler, served_order
from .refresh import PlanShape

if TYPE_CHECKING:
    from typing_extensions import Unpack

Order = tuple[np.ndarray, np.ndarray]  # (item order [N - drop], batch order [nb])


class GCBSOrderBuilder:
    """The :class:`~hardbatch.samplers.refresh.Builder` of :class:`GCBSSampler`: an epoch's
    item order (:func:`hardbatch.gcbs_permutation`, interleaved, the dropped items last, keys
    separated) and the order in which its batches are visited.

    Args:
        plan: the sampler's :class:`~hardbatch.samplers.refresh.PlanShape` (N, B', batches,
            drop, seed, keys).
        quantile, method, min_partners, interleave, shuffle_batches: as for the sampler.
        search: ``(nlist, nprobe, partitions)``, the options of the pair search methods.
        paired: whether a build reads a pair ``(x, y)``.
        device, precision, progress: where and how the products run; the bar of long builds.
        distributed: build sharded across the ranks of the group the policy passes.

    Example:
        >>> import torch
        >>> from hardbatch.samplers.gcbs_sampler import GCBSOrderBuilder
        >>> from hardbatch.samplers.refresh import PlanShape
        >>> builder = GCBSOrderBuilder(PlanShape(40, 8, 5, 0, 0, None), 0.9, method="exact",
        ...                            device=torch.device("cpu"))
        >>> order, batch_order = builder.build(torch.randn(40, 8), 0, None)
        >>> sorted(order.tolist()) == list(range(40)), batch_order.tolist(), builder.exact_build
        (True, [0, 1, 2, 3, 4], True)
    """

    def __init__(self, plan: PlanShape, quantile: float, *, method: str = "auto",
                 min_partners: int | None = None, search: tuple = (None, 8, None),
                 interleave: int = 0, shuffle_batches: bool = False, paired: bool = False,
                 device: torch.device, precision: str = "fp32", progress: bool | None = None,
                 distributed: bool = False) -> None:
        self.plan, self.quantile, self.method = plan, quantile, method
        self.min_partners, self.interleave = min_partners, interleave
        self.nlist, self.nprobe, self.partitions = search
        self.shuffle_batches, self.paired = shuffle_batches, paired
        self.device, self.precision, self.progress = device, precision, progress
        self.distributed = distributed

    @property
    def exact_build(self) -> bool:
        """Whether a build is the exact (quadratic) pair search (the refresh cost advice)."""
        return self.method == "exact"

    @property
    def cheaper_build(self) -> str:
        """The cost advice's cheaper option ("" when the pair search is approximate already)."""
        return "method='ivf' instead of the exact search" if self.exact_build else ""

    def build(self, x, epoch: int, group) -> Order:
        """Epoch ``epoch``'s item order and batch order, from embeddings ``x`` (a pair
        ``(x, y)`` with ``paired``; rows are normalised by the order's build)."""
        plan = self.plan
        x, y = x if self.paired else (x, None)
        build = sharded_gcbs_permutation if self.distributed else gcbs_permutation
        kw = {"group": group} if self.distributed else {"progress": self.progress}
        perm = build(x, self.quantile, y, method=self.method, min_partners=self.min_partners,
                     seed=_rng.derive_seed(plan.seed, epoch) & 0x7FFFFFFF,
                     nlist=self.nlist, nprobe=self.nprobe, partitions=self.partitions,
                     device=self.device, precision=self.precision, **kw)
        perm = interleave_chunks(perm.numpy(), self.interleave)
        # dropped: a random choice of positions, not always the order's tail
        perm = dropped_last(perm, plan.drop, _rng.derive_seed(plan.seed, epoch, 3))
        perm = served_order(perm, plan)
        batch_order = (_rng.permutation(plan.batches, _rng.derive_seed(plan.seed, epoch, 2))
                       if self.shuffle_batches else np.arange(plan.batches))
        return perm, batch_order

    @staticmethod
    def save_structure(order: Order) -> dict:
        """The item order and batch order as tensors."""
        return {"order": torch.from_numpy(order[0].copy()),
                "batch_order": torch.from_numpy(order[1].copy())}

    @staticmethod
    def load_structure(state: dict) -> Order | None:
        """The orders saved by :meth:`save_structure`, or None."""
        if "order" not in state:
            return None
        return np.asarray(state["order"], np.int64), np.asarray(state["batch_order"], np.int64)


class GCBSSampler(PartitionSampler):
    """Global Contrastive Batch Sampling: each epoch, batches cut from a GCBS permutation.

    At the start of every epoch the embedding source is read and
    :func:`hardbatch.gcbs_permutation` orders the items; batches are
    consecutive slices of that order (gcbs paper, Appendix F).

    Args:
        embeddings: [N, d] tensor/array, an :class:`EmbeddingBank`, or a callable returning one.
        batch_size: B.
        quantile: sparsification quantile (paper: 0.999).
        paired: the Y side of paired data (same kinds as ``embeddings``), or None.
        method: ``"auto"`` (default: ``"exact"`` up to 5,000 items, ``"ivf"`` up to 1M,
            ``"partition"`` beyond; measured in docs/gcbs.md), ``"exact"`` (the paper's),
            ``"ivf"``, ``"faiss"`` or ``"partition"`` (see gcbs_permutation).
        nlist, nprobe, partitions: options of those methods.
        shuffle_batches: visit the batches in random order (default False: the
            paper's sequential order).
        min_partners: each item also keeps its ``min_partners`` strongest pairs (see
            :func:`hardbatch.gcbs_permutation` and docs/gcbs.md: k >= 1 removes the random
            tail). Default None: ``min(16, N - 1)``; 0 is the paper's graph.
        interleave: chunk length c of :func:`hardbatch.batching.gcbs.interleave_chunks`: a batch holds
            about B / c chunks of the order from different regions, so no batch is a head of
            near-duplicates. Default None: :func:`hardbatch.batching.gcbs.default_interleave` of the
            plan's batch size (B / 8, at least 8; 0 below B = 16); 0 cuts batches straight
            from the GCBS order (the paper's). ``min_partners=0, method="exact",
            interleave=0`` is the paper's sampler.
        **options: the shared options (:mod:`hardbatch.samplers.options`) but ``prefetch``
            and ``normalize`` (the order normalises the rows itself). Here: ``device`` and
            ``precision`` are where and how the similarity products run (see
            :func:`hardbatch.gcbs_permutation`); ``refresh_lag`` L >= 1 builds the order of
            epoch e + 1 from the embeddings snapshotted L steps before the end of epoch e
            (default 0: read at the start of the epoch; 1 with ``background``, which builds it
            in a worker thread while epoch e finishes, with the same batches); ``distributed``
            shares the pair search across the ranks
            (:func:`hardbatch.batching.gcbs.sharded_gcbs_permutation`, the same order as one process);
            ``drop_last`` drops ``drop_count`` items each epoch (N mod B, and with W ranks the
            full batches that would not fill a last step), a seeded random choice of positions
            of the order (its tail holds the items without any strong pair); ``global_batch``:
            one slice of ``world_size * batch_size`` items per step; ``duplicate_keys``: a
            clashing item swaps places with an item of the nearest batch (in the order) that
            lacks its key; ``progress``: a bar over each order build's blocks once a build runs
            past 2 s (every build logs one INFO record on the ``hardbatch.batching.gcbs`` logger).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> batches = list(hb.GCBSSampler(x, 8, quantile=0.9))
        >>> [len(b) for b in batches], sorted(i for b in batches for i in b) == list(range(40))
        ([8, 8, 8, 8, 8], True)
    """

    _settings = PartitionSampler._settings + (
        "quantile", "method", "shuffle_batches", "nlist", "nprobe", "partitions", "min_partners",
        "interleave", "precision")

    Options = GCBSOptions

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, quantile: float = 0.999, *,
                 paired: EmbeddingSource | None = None,
                 method: Literal["auto", "exact", "ivf", "faiss", "partition"] = "auto",
                 shuffle_batches: bool = False, nlist: int | None = None, nprobe: int = 8,
                 partitions: int | None = None, min_partners: int | None = None,
                 interleave: int | None = None, **options: Unpack[GCBSOptions]) -> None:
        shared = take_options(type(self), options, normalize=False)
        device, precision, progress = (shared.pop(k) for k in ("device", "precision",
                                                                "progress"))
        super().__init__(embeddings, batch_size, paired=paired, **shared)
        n = self.num_items
        self.device = resolve_device(device)
        check_precision(precision)
        self.precision = precision
        if not 0.0 < check_real(quantile, "quantile", "a number in (0, 1)") < 1.0:
            raise ValueError(f"quantile={quantile} must lie strictly between 0 and 1")
        resolve_method(method, n)  # checks the name; "auto" resolves per build
        if paired is not None and not callable(paired):  # a callable is checked when read
            n_paired, _ = source_num_items(paired, "paired")
            if n_paired != n:
                raise ValueError(f"paired has {n_paired} rows but embeddings has N={n}; "
                                 "paired data needs one row of Y per row of X")
        self.min_partners = None if min_partners is None else check_min_partners(min_partners, n)
        self.interleave = (default_interleave(self.plan_batch_size) if interleave is None
                           else check_int(interleave, "interleave", low=0))
        self.partitions = partitions
        show_progress(progress)  # checks the value now, not at the first build
        self.progress = progress
        self.paired = paired
        self.quantile, self.method = float(quantile), method
        self.shuffle_batches = bool(shuffle_batches)
        self.nlist, self.nprobe = check_search_args(nlist, nprobe, n)
        if partitions is not None and check_int(partitions, "partitions", low=1) > n:
            raise ValueError(f"partitions={partitions} must be at most the N={n} items; use "
                             "partitions <= N or None")
        self.refresh_policy.builder = GCBSOrderBuilder(
            self._plan_shape(self.drop_count), self.quantile, method=method,
            min_partners=self.min_partners, search=(self.nlist, self.nprobe, partitions),
            interleave=self.interleave, shuffle_batches=self.shuffle_batches,
            paired=paired is not None, device=self.device, precision=precision,
            progress=progress, distributed=self.distributed)

    def draw(self, order: Order, index: int, seed: int, start: int | None) -> np.ndarray:
        """Plan batch ``index``: slice ``batch_order[index]`` of the item order."""
        b, size = int(order[1][index % self.batches_per_epoch]), self.plan_batch_size
        return order[0][b * size:(b + 1) * size]
