"""The common core of the samplers that read item embeddings: :class:`EmbeddingSampler`.

Its batches are drawn (``draw``) from a structure (a graph, an embedding snapshot, an order)
that a composed :class:`~hardbatch.samplers.refresh.RefreshPolicy` rebuilds from the embedding
source with the :class:`~hardbatch.samplers.refresh.Builder` the sampler injects into it
(``build``, ``save_structure``, ``load_structure`` and the build's cost estimate). Two kinds
build on it, one module each:
:class:`~hardbatch.samplers.walk_sampler.WalkSampler` (a batch grows around a start item; the
structure is rebuilt every ``refresh_every`` steps) and
:class:`~hardbatch.samplers.partition_sampler.PartitionSampler` (an epoch is cut into batches;
the structure is rebuilt for every epoch).
"""

from __future__ import annotations

from .. import distributed as hbdist
from .._validation import check_int
from ..embeddings import EmbeddingSource, source_num_items
from .base import PlanSampler
from .refresh import PlanShape, RefreshPolicy


def _forwarded(name: str, doc: str) -> property:
    """A read-only sampler attribute that is the refresh policy's ``name``."""
    return property(lambda self: getattr(self.refresh_policy, name), doc=doc)


def built(name: str, doc: str) -> property:
    """A read-only sampler attribute that is its builder's ``name`` (what the last build
    found: its groups, its counts).

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> sampler = hb.ClusterBatchSampler(np.eye(40, 8), 8, kmeans="torch")
        >>> type(sampler).labels.__doc__, sampler.labels is None
        ('The clusters of the last build (None before it).', True)
    """
    return property(lambda self: getattr(self.refresh_policy.builder, name), doc=doc)


class EmbeddingSampler(PlanSampler):
    """A plan sampler whose batches come from a structure rebuilt from an embedding source.

    Not used directly: subclass :class:`~hardbatch.samplers.WalkSampler` or
    :class:`~hardbatch.samplers.PartitionSampler`, which say when the structure is rebuilt
    (``_schedule``) and how an epoch's batches are drawn from it; a concrete sampler injects
    its builder into the policy at the end of its constructor
    (``self.refresh_policy.builder = ...``).

    Args:
        embeddings: the source: an [N, d] tensor / array, an EmbeddingBank or a callable.
        batch_size: B.
        paired: a second source read with the first (GCBS's ``paired``), or None.
        every: the kind's refresh period (steps between rebuilds; None: once).
        normalize, refresh_lag, background, distributed, process_group: the shared options of
            :mod:`hardbatch.samplers.options`; the rest (``drop_last``, ``seed``, ranks,
            ``prefetch``, ``duplicate_keys``) go to :class:`~hardbatch.samplers.PlanSampler`.

    Example:
        >>> import numpy as np
        >>> import hardbatch as hb
        >>> from hardbatch.samplers import EmbeddingSampler, PartitionSampler, WalkSampler
        >>> x = np.random.default_rng(0).standard_normal((40, 8))
        >>> knn, gcbs = hb.KNNBatchSampler(x, 4), hb.GCBSSampler(x, 8, quantile=0.9)
        >>> [isinstance(s, EmbeddingSampler) for s in (knn, gcbs)]
        [True, True]
        >>> isinstance(knn, WalkSampler), isinstance(gcbs, PartitionSampler)
        (True, True)
        >>> knn.refresh_every, gcbs.refresh_every  # an epoch's 5 steps: rebuilt every epoch
        (100, 5)
    """

    _settings = PlanSampler._settings + ("normalize", "refresh_lag")
    _per_epoch = False  # the refresh schedule: every ``every`` steps, or every epoch
    _lag_meaning = "steps between the snapshot and the use of the new structure"

    def __init__(self, embeddings: EmbeddingSource, batch_size: int, *,
                 paired: EmbeddingSource | None = None, every: int | None = None,
                 normalize: bool = True, refresh_lag: int | None = None,
                 background: bool = False, distributed: bool | None = None, process_group=None,
                 **plan) -> None:
        n, first = source_num_items(embeddings)
        super().__init__(n, batch_size, **plan)
        background = bool(background)
        lag = check_int((1 if background else 0) if refresh_lag is None else refresh_lag,
                        "refresh_lag", low=0)
        if background and lag == 0:
            raise ValueError(f"background=True needs refresh_lag >= 1 ({self._lag_meaning}); "
                             "pass refresh_lag=1")
        every = self._schedule(every, lag)
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
        options_type = getattr(type(self), "Options", None)  # a subclass's own: all options
        self.refresh_policy = RefreshPolicy(  # its builder: injected by the concrete sampler
            embeddings, None, n, name=type(self).__name__, first=first, paired=paired,
            normalize=self.normalize, every=every, lag=lag, background=background,
            distributed=bool(distributed), process_group=process_group,
            per_epoch=self._per_epoch, threaded=bool(self.prefetch),
            offers_background=options_type is None or "background" in options_type.__annotations__)

    def _schedule(self, every: int | None, lag: int) -> int | None:
        """The refresh period the policy uses, checked against ``lag``."""
        raise NotImplementedError

    def _plan_shape(self, drop: int = 0) -> PlanShape:
        """What the builder knows of the plan (``drop``: items an epoch leaves out)."""
        return PlanShape(self.num_items, self.plan_batch_size, self.batches_per_epoch, drop,
                         self.seed, self.duplicate_keys)

    source = _forwarded("source", "The embedding source.")
    builder = _forwarded("builder", "The :class:`~hardbatch.samplers.refresh.Builder` of the "
                                    "structure (its build, checkpoints and cost estimate).")
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

    # -- the plan (PlanSampler's hooks) ------------------------------------
    def _on_step(self, global_step: int) -> None:
        # The snapshot of a pipelined refresh is taken here, in the training loop's thread,
        # when batch ``global_step`` is requested, also when a prefetch thread runs ahead.
        self.refresh_policy.before_step(global_step)

    def _plannable(self, global_step: int) -> bool:
        return self.refresh_policy.ready(global_step)

    def _load_generator_state(self, state: dict) -> None:
        self.refresh_policy.load_state_dict(state, self.epoch)
