"""The proximity-graph sampler (BatchSampler, Yang et al., KDD 2023): walks on a proximity graph.

:class:`ProximityGraphBuilder` builds the graph (and checkpoints it); the sampler draws its
walks on it.
"""

from __future__ import annotations

import warnings

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from .. import _rng
from .._device import check_precision, resolve_device
from .._logging import show_progress
from .._validation import check_int
from ..embeddings import EmbeddingSource
from ..neighbors.knn_graph import check_graph_sizes, check_group_size, knn_graph, proximity_graph
from ..neighbors.knn_graph import sharded_knn_graph, sharded_proximity_graph
from ..schedules import LinearDecay
from ..batching.walks import WALKS, check_restart, default_patience, prepare_graph
from .options import ProximityOptions, take_options
from .refresh import PlanShape
from .walk_sampler import WalkSampler

if TYPE_CHECKING:
    from typing_extensions import Unpack


class ProximityGraphBuilder:
    """The :class:`~hardbatch.samplers.refresh.Builder` of :class:`ProximityGraphSampler`: the
    proximity graph (:func:`hardbatch.proximity_graph`; the exact :func:`hardbatch.knn_graph`
    with ``kind="knn"``) of each refresh, as the walks' neighbour table and row degrees.

    Args:
        plan: the sampler's :class:`~hardbatch.samplers.refresh.PlanShape` (N, seed).
        candidates, neighbors: M and K.
        kind: ``"proximity"`` or ``"knn"``.
        group_size: candidate-pool sharing of :func:`hardbatch.proximity_graph`.
        device, precision, progress: where and how the products run; the bar of long builds.
        distributed: build sharded across the ranks of the group the policy passes.

    Example:
        >>> import numpy as np
        >>> import torch
        >>> from hardbatch.samplers.proximity_sampler import ProximityGraphBuilder
        >>> from hardbatch.samplers.refresh import PlanShape
        >>> builder = ProximityGraphBuilder(PlanShape(40, 8, 5, 0, 0, None), 20, 5, "proximity",
        ...                                 None, device=torch.device("cpu"))
        >>> graph, degrees = builder.build(torch.eye(40, 8), 0, None)
        >>> graph.shape, builder.exact_build, builder.load_structure({}) is None
        ((40, 5), False, True)
    """

    def __init__(self, plan: PlanShape, candidates: int, neighbors: int,
                 kind: Literal["proximity", "knn"], group_size: int | None, *,
                 device: torch.device, precision: str = "fp32", progress: bool | None = None,
                 distributed: bool = False) -> None:
        self.plan, self.candidates, self.neighbors = plan, candidates, neighbors
        self.kind, self.group_size = kind, group_size
        self.device, self.precision, self.progress = device, precision, progress
        self.distributed = distributed

    @property
    def exact_build(self) -> bool:
        """Whether a build is the exact (quadratic) kNN graph (the refresh cost advice)."""
        return self.kind == "knn"

    @property
    def cheaper_build(self) -> str:
        """The cost advice's cheaper option ("" when the graph is already the approximate one)."""
        return "graph='proximity' (the approximate proximity graph) instead of the exact " \
            "graph='knn'" if self.exact_build else ""

    def build(self, x: torch.Tensor, step: int, group) -> tuple[np.ndarray, np.ndarray]:
        """The neighbour table and row degrees of the graph of ``x`` (built on ``device``; only
        the table becomes NumPy, for the walks' numba kernels)."""
        seed = _rng.derive_seed(self.plan.seed, step, 0x6A)
        kw = {"device": self.device, "precision": self.precision}
        if group is None and not self.distributed:
            if self.kind == "knn":
                graph = knn_graph(x, self.neighbors, progress=self.progress, **kw)
            else:
                graph = proximity_graph(x, self.candidates, self.neighbors, seed,
                                        group_size=self.group_size, progress=self.progress, **kw)
        elif self.kind == "knn":
            graph = sharded_knn_graph(x, self.neighbors, group=group, **kw)
        else:
            graph = sharded_proximity_graph(x, self.candidates, self.neighbors, seed,
                                            group_size=self.group_size, group=group, **kw)
        return prepare_graph(graph, self.plan.num_items)

    def save_structure(self, structure) -> dict:
        """The neighbour table as a tensor (int32 below 2**31 items)."""
        return {"graph": torch.from_numpy(structure[0].astype(
            np.int32 if self.plan.num_items < 2**31 else np.int64))}

    def load_structure(self, state: dict):
        """The graph saved by :meth:`save_structure`, or None."""
        if "graph" not in state:
            return None
        return prepare_graph(np.asarray(state["graph"], np.int64), self.plan.num_items)


class ProximityGraphSampler(WalkSampler):
    """BatchSampler (Yang et al., KDD 2023): batches are walks on a proximity graph.

    Every ``refresh_every`` steps the sampler re-reads its embedding source
    and rebuilds the graph (:func:`hardbatch.proximity_graph`, or the exact
    :func:`hardbatch.knn_graph` with ``graph="knn"``); each batch is a walk of
    B distinct items from a start node not yet seen this epoch
    (:mod:`hardbatch.batching.walks`).

    Args:
        embeddings: [N, d] tensor/array, an :class:`EmbeddingBank` fed by the
            training loop, or a callable returning [N, d] (a fresh encoding pass).
        batch_size: B.
        candidates: M, candidate pool per item (paper: 500-1000).
        neighbors: K, neighbours kept (paper: 100; 50 for MUTAG, 500 for text).
        restart: RWR restart probability alpha in [0, 1), a number or a schedule such
            as ``LinearDecay(0.2, 0.05)`` (the paper's best) or ``EpochStepDecay()`` (the
            released code's 0.2 - 0.02 * epoch, floored at 0.05). (alpha = 1 would never
            leave the start node; ``KNNBatchSampler`` gives an anchor's nearest items.)
        walk: ``"rwr"`` (default), ``"rw"``, ``"bfs"`` or ``"dfs"``.
        graph: ``"proximity"`` or ``"knn"`` (ablation: exact K nearest).
        refresh_every: steps between graph rebuilds (paper's t), counted over
            the whole run; None builds the graph once.
        epochs: planned epochs, for schedules of ``restart``.
        group_size: candidate-pool sharing of :func:`proximity_graph` (checked here).
        patience: RWR/RW steps without a new item before jumping to a fresh start.
        **options: the shared options (:mod:`hardbatch.samplers.options`), all of them. Here:
            ``device="cuda"`` builds the graph's products and top-k on the GPU (the candidate
            pools, hence the graph up to floating-point near-ties, are the same on every
            device; walks run on the CPU; a source on that device is read and normalised
            there, only the [N, K] table reaches the host); ``precision`` as for
            :func:`hardbatch.proximity_graph`; ``background`` builds the next graph from the
            snapshot in a worker thread (same batches as without, for the same
            ``refresh_lag``; docs/distributed.md); ``prefetch`` plans walks ahead, running at
            most ``refresh_every + refresh_lag - 1`` steps past a refresh step; ``distributed``
            builds the graph sharded across the ranks and all-gathers it (identical to one
            process; every rank must iterate the sampler); ``global_batch``: one walk of
            ``world_size * batch_size`` items per step; ``duplicate_keys``: a walk never adds
            an item whose key its batch holds (it walks on through it; needs B distinct keys);
            ``progress``: a bar over each build's blocks once a build runs past 2 s (every
            build logs one INFO record on the ``hardbatch`` logger).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
        >>> sampler = hb.ProximityGraphSampler(x, 8, candidates=20, neighbors=5)
        >>> batches = list(sampler)
        >>> len(batches), [len(set(b)) for b in batches], tuple(sampler.graph.shape)
        (5, [8, 8, 8, 8, 8], (40, 5))
    """

    _settings = WalkSampler._settings + ("candidates", "neighbors", "restart", "walk",
                                              "graph_kind", "group_size", "patience",
                                              "precision")

    Options = ProximityOptions

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, candidates: int = 1000,
                 neighbors: int = 100, restart=0.2, walk: str = "rwr",
                 graph: Literal["proximity", "knn"] = "proximity",
                 refresh_every: int | None = 100, *, epochs: int | None = None,
                 group_size: int | None = None, patience: int | None = None,
                 **options: Unpack[ProximityOptions]) -> None:
        shared = take_options(type(self), options)
        device, precision, progress = (shared.pop(k) for k in ("device", "precision",
                                                                "progress"))
        super().__init__(embeddings, batch_size, refresh_every, **shared)
        self.device = resolve_device(device)
        check_precision(precision)
        self.precision = precision
        show_progress(progress)  # checks the value now, not at the first build
        self.progress = progress
        if walk not in WALKS:
            raise ValueError(f"walk={walk!r} must be one of {sorted(WALKS)}")
        per_epoch = getattr(restart, "per_epoch", False)  # EpochStepDecay: checked when built
        if not per_epoch and not callable(restart):
            restart = check_restart(restart, expected="a number in [0, 1) or a schedule such "
                                    "as LinearDecay(0.2, 0.05) or EpochStepDecay()")
        elif not per_epoch:
            if isinstance(restart, LinearDecay):  # any other schedule is checked per batch
                check_restart(restart.start, "restart=LinearDecay(...) start")
                check_restart(restart.end, "restart=LinearDecay(...) end")
            if getattr(restart, "total_steps", None) is None and epochs is None:
                raise ValueError("restart is a schedule: pass epochs=... (training length) to "
                                 "the sampler, or total_steps=... to the schedule")
        self.epochs = None if epochs is None else check_int(epochs, "epochs", low=1)
        self.walk, self.restart = walk, restart
        self.patience = None if patience is None else check_int(patience, "patience", low=1)
        self.candidates = check_int(candidates, "candidates", low=1)
        self.neighbors = check_int(neighbors, "neighbors", low=1)
        if graph not in ("proximity", "knn"):
            raise ValueError(f"graph={graph!r} must be 'proximity' or 'knn'")
        self.graph_kind = graph
        n = self.num_items
        if graph == "proximity":
            check_graph_sizes(self.candidates, self.neighbors, n)
            group_size = check_group_size(group_size, self.candidates, n)
        elif self.neighbors >= n:
            raise ValueError(f"neighbors={neighbors} must be smaller than N={n}")
        else:
            for name, value, default in (("group_size", group_size, None),
                                         ("candidates", candidates, 1000)):
                if value != default:
                    warnings.warn(f"{name}={value} shapes the candidate pools of "
                                  f"graph='proximity'; graph='knn' has none and ignores it "
                                  f"(drop {name})", stacklevel=2)
        self.group_size = group_size
        self.refresh_policy.builder = ProximityGraphBuilder(
            self._plan_shape(), self.candidates, self.neighbors, graph, group_size,
            device=self.device, precision=precision, progress=progress,
            distributed=self.distributed)

    @property
    def graph(self) -> torch.Tensor | None:
        """The current neighbour table [N, K] (None before the first batch)."""
        structure = self.refresh_policy.structure
        return None if structure is None else torch.from_numpy(structure[0])

    def restart_at(self, epoch: int, index: int) -> float:
        """Alpha for global plan batch ``index`` of ``epoch``.

        Progress is plan batches over planned ones (``epochs * batches_per_epoch``:
        ceil(N / B'), B' the plan's batch size, the same for any world size; with
        ``drop_last`` the full batches served, floor(N / B') rounded down to a multiple of
        ``plan_width``, W or 1 with ``global_batch``); with ``LinearDecay(total_steps=T)`` it
        is steps of this rank over T.
        """
        if isinstance(self.restart, float):
            return self.restart
        if getattr(self.restart, "per_epoch", False):  # e.g. EpochStepDecay
            return check_restart(float(self.restart.at_epoch(epoch)),
                                 f"restart (schedule value at epoch {epoch})")
        total_steps = getattr(self.restart, "total_steps", None)
        if total_steps:
            progress = (epoch * len(self) + index // self.plan_width) / total_steps
        else:
            per_epoch = self.batches_per_epoch
            progress = (epoch * per_epoch + index) / (self.epochs * per_epoch)
        return check_restart(float(self.restart(progress)),
                             f"restart (schedule value at progress {progress:.4g})")

    def draw(self, structure, index: int, seed: int, start: int | None = None) -> np.ndarray:
        """A walk of ``plan_batch_size`` items on the graph (from ``start``, if given)."""
        graph, deg = structure
        patience = self.patience or default_patience(graph.shape[1])
        return self.walk_state.walk(graph, deg, self.plan_batch_size, WALKS[self.walk],
                                     np.array([self.restart_at(self.epoch, index)]),
                                     np.array([seed], np.uint64), patience,
                                     None if start is None else np.array([start]))[0]
