"""Options and result of :class:`hardbatch.train.Trainer`: :class:`TrainConfig` and
:class:`TrainResult`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["TrainConfig", "TrainResult"]


@dataclass
class TrainConfig:
    """Options of :class:`Trainer` (all have defaults).

    Attributes:
        epochs: training epochs (an epoch is ``len(sampler)`` steps).
        lr, weight_decay: of the default optimiser (Adam), ignored when an optimiser is given.
        seed: seeds torch / numpy / random at the start of a fresh run, the augmentation
            generator and the evaluation split.
        eval_every: steps between evaluations (None: only at the end of training).
        knn_k, knn_temperature: weighted kNN monitor (InstDisc / SimCLR: 200 and 0.1).
        probe_weight_decay, probe_max_iter: L2 penalty and L-BFGS iterations of the linear probe.
        eval_fraction: share of the training items that are the evaluation queries when the
            trainer has labels but no ``eval_data``: held out from the kNN / probe fit only,
            they are still in contrastive training (without their labels unless
            ``loss_labels``).
        log_path: JSONL file receiving one record per step (``"kind": "step"``) and per
            evaluation (``"kind": "eval"``); rewritten from the checkpoint on resume.
        checkpoint_path: file for checkpoints; written every ``checkpoint_every`` steps,
            at the end of every epoch and when training stops. If it exists when ``fit()``
            starts and ``resume`` is True, training continues from it.
        checkpoint_every: steps between checkpoints (None: epoch ends and the end only).
        resume: continue from ``checkpoint_path`` if it exists.
        max_steps: stop after this many steps in total (e.g. a time budget, or to simulate
            an interruption); None runs all epochs.
        progress: show a tqdm progress bar (if tqdm is installed).
        num_workers: DataLoader workers when ``data`` is a ``Dataset`` (tensor data is indexed
            directly). Exact resume is guaranteed for ``num_workers=0``.
        loss_labels: pass the batch's labels to the loss (supervised false-negative masking);
            default False: self-supervised, labels only feed the diagnostics.
        device: where the model and batches live (the bank stays on the CPU).
        eval_batch_size: rows per forward pass when embedding for evaluation.
        amp: mixed precision for the training forward pass: ``"bf16"`` or ``"fp16"``
            (``torch.autocast`` on ``device``; fp16 adds a ``GradScaler``), None: float32. The
            loss is computed in float32 on the cast-back embeddings.
        channels_last: train (and feed 4-d image batches) in ``torch.channels_last`` memory
            format, the fast layout for convolutions with tensor cores.
        probe_every_eval: fit the linear probe at every evaluation; False: kNN only at the
            intermediate ones and the probe at the last (a probe on 50k features is slow on CPU).
        reference: path of a fixed ``[N, d']`` reference embedding (``.npy`` / ``.npz`` /
            ``.pt``) in which every step's batch is also measured (``reference_*`` entries of
            the history); :class:`Trainer`'s ``reference=`` takes an array or tensor too.
        guide: path of a fixed ``[N, d']`` guide embedding of the items: the loss gets
            ``false_negatives=guided_mask(g[idx], g[idx], guide_margin)``, i.e. item j is not
            a negative of anchor i when ``cos(g_i, g_j) > 1 - guide_margin`` (GISTEmbed's rule
            with a per-item guide); :class:`Trainer`'s ``guide=`` also takes an array, a
            tensor or a guide model applied to the two views.
        guide_margin: the margin of that rule, in [0, 2]; a per-item guide needs it > 0.

    Example:
        >>> from hardbatch.train import TrainConfig
        >>> config = TrainConfig(epochs=5, lr=3e-4, checkpoint_path="run.pt")
        >>> config.epochs, config.seed, config.amp
        (5, 0, None)
        >>> TrainConfig(amp="fp8")
        Traceback (most recent call last):
            ...
        ValueError: amp='fp8' must be None, 'bf16' or 'fp16'
    """

    epochs: int = 10
    lr: float = 1e-3
    weight_decay: float = 1e-6
    seed: int = 0
    eval_every: int | None = None
    knn_k: int = 200
    knn_temperature: float = 0.1
    probe_weight_decay: float = 1e-4
    probe_max_iter: int = 100
    eval_fraction: float = 0.2
    log_path: str | None = None
    checkpoint_path: str | None = None
    checkpoint_every: int | None = None
    resume: bool = True
    max_steps: int | None = None
    progress: bool = True
    num_workers: int = 0
    loss_labels: bool = False
    device: str = "cpu"
    eval_batch_size: int = 1024
    amp: str | None = None
    channels_last: bool = False
    probe_every_eval: bool = True
    reference: str | None = None
    guide: str | None = None
    guide_margin: float = 0.0

    def __post_init__(self) -> None:
        if self.amp not in (None, "bf16", "fp16"):
            raise ValueError(f"amp={self.amp!r} must be None, 'bf16' or 'fp16'")
        for name in ("epochs", "knn_k", "probe_max_iter", "eval_batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("eval_every", "checkpoint_every", "max_steps"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise ValueError(f"{name}={value} must be >= 1 (or None)")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be positive")
        if not self.knn_temperature > 0:
            raise ValueError(f"knn_temperature={self.knn_temperature} must be positive")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction={self.eval_fraction} must lie strictly between 0 and 1")
        if self.num_workers < 0:
            raise ValueError(f"num_workers={self.num_workers} must be >= 0")
        if not 0.0 <= float(self.guide_margin) <= 2.0:  # NaN fails too
            raise ValueError(f"guide_margin={self.guide_margin} must lie in [0, 2] (a cosine "
                             "margin), e.g. 0.1")


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns.

    Attributes:
        history: one dict per step: ``step``, ``epoch``, ``loss``, ``hardness``,
            ``false_negative_rate`` (NaN without labels), ``sampler_seconds``, ``step_seconds``,
            ``refreshes`` (graphs / orders the sampler built so far, for samplers that count);
            with a reference embedding also ``reference_hardness``,
            ``reference_mean_negative_similarity`` and ``reference_near_duplicate_rate``.
        evals: one dict per evaluation: ``step``, ``epoch``, ``knn_accuracy``,
            ``linear_probe_accuracy``, ``seconds``.
        steps: steps done in total; epochs: epochs completed.
        sampler_seconds, step_seconds: totals over ``history`` (sampler time, including graph
            rebuilds, is part of step time); ``sampler_share`` is their ratio.
        last_epoch_batches: the batches (item ids) of the last epoch trained.
        stopped_early: training stopped at ``max_steps`` before the last epoch ended.

    Example:
        >>> from hardbatch.train import TrainResult
        >>> result = TrainResult(history=[{"loss": 2.0}, {"loss": 1.0}], steps=2, epochs=1,
        ...                      evals=[{"step": 2, "knn_accuracy": 0.5}],
        ...                      sampler_seconds=0.5, step_seconds=2.0)
        >>> result.mean("loss"), result.mean("loss", last=1), result.sampler_share
        (1.5, 1.0, 0.25)
        >>> result.final
        {'step': 2, 'knn_accuracy': 0.5}
    """

    history: list[dict]
    evals: list[dict]
    steps: int
    epochs: int
    sampler_seconds: float
    step_seconds: float
    last_epoch_batches: list[list[int]] = field(default_factory=list)
    stopped_early: bool = False

    @property
    def sampler_share(self) -> float:
        return self.sampler_seconds / self.step_seconds if self.step_seconds > 0 else math.nan

    @property
    def final(self) -> dict:
        """The last evaluation (empty without labels)."""
        return dict(self.evals[-1]) if self.evals else {}

    def mean(self, key: str, last: int | None = None) -> float:
        """Mean of ``history[key]`` over all steps or the ``last`` ones (NaN-skipping)."""
        rows = self.history[-last:] if last else self.history
        values = np.array([r[key] for r in rows if key in r], dtype=np.float64)
        values = values[~np.isnan(values)]
        return float(values.mean()) if values.size else math.nan
