"""The contrastive training loop: :class:`Trainer` and :func:`train` (see
:mod:`hardbatch.train`)."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from .._device import resolve_device
from ..data import looks_indexed
from ..embeddings import EmbeddingBank
from ..metrics import load_reference
from .step_batch import batch_diagnostics, first_inputs, loader_batches, skip_on_every_rank
from .checkpoint import (
    load_trainer_state,
    read_checkpoint,
    seed_everything,
    trainer_state,
    write_checkpoint,
)
from .config import TrainConfig, TrainResult
from .evaluation import evaluate
from .guide import check_guide, guide_mask

__all__ = ["Trainer", "train"]


def _identity(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    return x


class Trainer:
    """Contrastive training with a hardbatch sampler; see the module docstring.

    Args:
        encoder: ``nn.Module`` mapping a batch of inputs to features (used for evaluation).
        loss: a hardbatch loss module, called as ``loss(z1, z2)`` (``labels=`` too when
            ``config.loss_labels``).
        sampler: a batch sampler over the N training items, or a factory
            ``sampler(bank) -> sampler`` that receives the trainer's :class:`EmbeddingBank`
            (how graph samplers and GCBS read the embeddings of the training forward pass).
            A sampler whose ``source`` is an ``EmbeddingBank`` has that bank fed.
        data: ``[N, ...]`` tensor of inputs, or a map-style ``Dataset`` whose items are
            inputs (or tuples whose first entry is the input), or whose items carry their
            index and views, ``(index, view1, view2)`` (a :class:`hardbatch.IndexedDataset`:
            its views are used instead of ``augment``; see :mod:`hardbatch.train.step_batch`).
        labels: optional ``[N]`` int labels: false-negative rate and evaluation only.
        head: optional projection head applied after ``encoder`` for the loss.
        augment: ``augment(x, generator) -> view``, called twice per batch on the batch tensor
            with the trainer's seeded ``torch.Generator`` (None: identity, e.g. SimCSE's
            dropout views).
        optimizer: an optimiser over the model's parameters, or a factory
            ``optimizer(params) -> optimiser``; default Adam(lr, weight_decay).
        eval_data: ``(x_test, y_test)`` for evaluation; default when ``labels`` are given: a
            share of the training items (``config.eval_fraction``) as the queries, held out
            from the kNN / probe fit only (still in contrastive training, without labels).
        config: :class:`TrainConfig`; keyword arguments override its fields.
        bank: the bank to feed (default: a new one, dimension from one forward pass).
        reference: a fixed ``[N, d']`` reference embedding of the items (array, tensor or
            ``.npy`` / ``.npz`` / ``.pt`` file; default ``config.reference``): every step also
            logs ``reference_hardness``, ``reference_mean_negative_similarity`` and
            ``reference_near_duplicate_rate`` of its batch in it, so runs with different
            samplers compare in one coordinate system (e.g. the starting model's embeddings,
            the same for every run).
        guide: guided false-negative masks (GISTEmbed; :func:`hardbatch.guided_mask`): a
            fixed ``[N, d']`` guide embedding of the items (array, tensor or file; default
            ``config.guide``), or an ``nn.Module`` guide applied without gradient to the two
            views. The loss is called with ``false_negatives=guided_mask(guide_1, guide_2,
            config.guide_margin, form=, gather=, group=)`` (the loss's options: with
            ``gather=True`` under DDP the ``[b, B_global]`` mask of the global batch). With a
            per-item embedding both views share the item's row, so j is masked for anchor i when
            ``cos(g_i, g_j) > 1 - guide_margin`` (``guide_margin`` must then be > 0). The loss
            must accept ``false_negatives=`` (every hardbatch loss does).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> _ = torch.manual_seed(0)
        >>> x, y = torch.randn(40, 8), torch.arange(40) % 4  # N = 40 items, d = 8, 4 classes
        >>> from hardbatch.train import Trainer
        >>> trainer = Trainer(torch.nn.Linear(8, 4), hb.InfoNCE(0.5),
        ...                   lambda bank: hb.KNNBatchSampler(bank, 8), x, y,
        ...                   augment=lambda v, g: v + 0.1 * torch.randn(v.shape, generator=g),
        ...                   epochs=2, knn_k=5, progress=False)
        >>> result = trainer.fit()
        >>> result.steps, result.epochs, len(result.last_epoch_batches)
        (10, 2, 5)
        >>> sorted(result.history[0])
        ['epoch', 'false_negative_rate', 'hardness', 'kind', 'loss', 'refreshes',
         'sampler_seconds', 'step', 'step_seconds']
        >>> sorted(result.final)
        ['epoch', 'kind', 'knn_accuracy', 'linear_probe_accuracy', 'seconds', 'step']
    """

    def __init__(self, encoder: nn.Module, loss: nn.Module, sampler, data, labels=None, *,
                 head: nn.Module | None = None,
                 augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
                 optimizer=None, eval_data: tuple[torch.Tensor, torch.Tensor] | None = None,
                 config: TrainConfig | None = None, bank: EmbeddingBank | None = None,
                 reference=None, guide=None, **overrides) -> None:
        config = config or TrainConfig()
        if overrides:
            unknown = sorted(set(overrides) - set(TrainConfig.__dataclass_fields__))
            if unknown:
                raise TypeError(f"unknown option(s) {unknown}; see TrainConfig")
            config = TrainConfig(**{**asdict(config), **overrides})
        self.config = config
        self.device = resolve_device(config.device)
        self.encoder = encoder.to(self.device)
        self.head = head.to(self.device) if head is not None else None
        self.model = nn.Sequential(self.encoder, self.head) if self.head is not None else self.encoder
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[config.amp]
        self.scaler = (torch.amp.GradScaler(self.device.type) if config.amp == "fp16" else None)
        self.loss = loss
        self.augment = augment or _identity
        self._warned_skip = False

        self.data = data
        self.tensor_data = isinstance(data, torch.Tensor)
        # items (index, view1, view2)? probed once, here, before any seeding
        self.indexed = not self.tensor_data and looks_indexed(data)
        n = len(data)
        if n < 2:
            raise ValueError(f"data has {n} items; contrastive training needs at least 2")
        self.num_items = n
        self.labels = None
        if labels is not None:
            self.labels = torch.as_tensor(labels).long().reshape(-1).cpu()
            if self.labels.numel() != n:
                raise ValueError(f"labels has {self.labels.numel()} entries but data has {n} "
                                 "items; pass one label per item")
        if reference is None:
            reference = config.reference
        self.reference = (None if reference is None
                          else torch.from_numpy(load_reference(reference, n)))
        self.guide = check_guide(config.guide if guide is None else guide, n,
                                 config.guide_margin, self.device)

        # the bank fed from the forward pass, and the sampler reading it
        if bank is None and isinstance(getattr(sampler, "source", None), EmbeddingBank):
            bank = sampler.source
        if bank is None:
            bank = EmbeddingBank(n, self._embedding_dim(), seed=config.seed)
        if bank.num_items != n:
            raise ValueError(f"the bank holds {bank.num_items} items but data has {n}")
        self.bank = bank
        if callable(sampler) and (isinstance(sampler, type) or not hasattr(sampler, "__iter__")):
            sampler = sampler(self.bank)
        if not hasattr(sampler, "__iter__") or not hasattr(sampler, "__len__"):
            raise ValueError("sampler must be a batch sampler (iterable of index lists with "
                             "len) or a factory taking an EmbeddingBank")
        num = getattr(sampler, "num_items", None)
        if num is not None and num != n:
            raise ValueError(f"the sampler was built for N={num} items but data has {n}")
        self.sampler = sampler

        params = list(self.model.parameters())
        if optimizer is None:
            optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
        elif callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(params)
        self.optimizer = optimizer

        self.eval_data = self._eval_split(eval_data)
        self.generator = torch.Generator().manual_seed(config.seed)

        # progress of the run (all saved in checkpoints)
        self.global_step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.epoch_batches: list[list[int]] = []
        self._log_file = None

    # -- setup helpers -------------------------------------------------
    @torch.no_grad()
    def _embedding_dim(self) -> int:
        """Output width of ``head(encoder(x))`` from one eval-mode forward of two items."""
        x = self.data[:2] if self.tensor_data else first_inputs(self.data, self.indexed)
        was = self.model.training
        self.model.eval()
        try:
            out = self.model(x.to(self.device))
        finally:
            self.model.train(was)
        if out.ndim != 2:
            raise ValueError(f"the model must return [B, d] embeddings, got shape {tuple(out.shape)}")
        return int(out.shape[1])

    def _eval_split(self, eval_data):
        if eval_data is not None:
            x_test, y_test = eval_data
            if self.labels is None:
                raise ValueError("eval_data needs training labels too (kNN / linear probe are "
                                 "fitted on the training items): pass labels=...")
            if not self.tensor_data:
                raise ValueError("evaluation needs tensor training data")
            return (self.data, self.labels, x_test, torch.as_tensor(y_test).long())
        if self.labels is None or not self.tensor_data:
            return None
        gen = torch.Generator().manual_seed(self.config.seed + 0x5EED)
        perm = torch.randperm(self.num_items, generator=gen)
        n_test = max(1, round(self.config.eval_fraction * self.num_items))
        test, train = perm[:n_test].sort().values, perm[n_test:].sort().values
        return (self.data[train], self.labels[train], self.data[test], self.labels[test])

    @property
    def total_steps(self) -> int:
        planned = self.config.epochs * len(self.sampler)
        return min(planned, self.config.max_steps) if self.config.max_steps else planned

    # -- one step ------------------------------------------------------
    def _forward_loss(self, idx: torch.Tensor, x: torch.Tensor | None, pair: tuple = ()):
        if pair:  # the dataset's own views (IndexedDataset)
            v1, v2 = (v.to(self.device) for v in pair)
        else:
            v1 = self.augment(x, self.generator)
            v2 = self.augment(x, self.generator)
        views = torch.cat([v1, v2])
        if self.config.channels_last and views.ndim == 4:
            views = views.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=self.amp_dtype,
                            enabled=self.amp_dtype is not None):
            z = self.model(views)
        z = z.float()
        if not bool(torch.isfinite(z).all()):  # before the loss, whose message would not fit
            raise FloatingPointError(
                f"the model's embeddings contain NaN or inf at step {self.global_step}: training "
                f"diverged; lower the learning rate (lr={self.config.lr:g}) or check the inputs")
        z1, z2 = z[:len(idx)], z[len(idx):]
        kw = {}
        if self.config.loss_labels and self.labels is not None:
            kw["labels"] = self.labels[idx].to(self.device)
        if self.guide is not None:
            kw["false_negatives"] = guide_mask(self.guide, idx, v1, v2, self.config.guide_margin,
                                               self.loss).to(z1.device)
        return self.loss(z1, z2, **kw), z1

    def train_step(self, batch, x: torch.Tensor | None = None, views: tuple = ()) -> dict:
        """One optimisation step on ``batch`` (item ids); returns the step's log record.

        ``x`` is the batch's input when it was already loaded (DataLoader path); ``views``
        the batch's two views when the dataset made them (indexed items).
        """
        t0 = time.perf_counter()
        idx = torch.as_tensor(batch, dtype=torch.int64)
        if skip_on_every_rank(len(idx) < 2, self.device):
            return self._skip_step(idx, t0)
        if views:
            x = None
        elif x is None:
            x = self.data[idx]
        if x is not None:
            x = x.to(self.device)
        self.model.train()
        loss, z1 = self._forward_loss(idx, x, views)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {float(loss)} at step {self.global_step}; lower "
                                     "the learning rate or raise the temperature")
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:  # fp16: scaled backward, skipped steps on overflow
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        z1 = z1.detach()
        self.bank.update(idx, z1)
        step_seconds = time.perf_counter() - t0
        return {"kind": "step", "step": self.global_step + 1, "epoch": self.epoch,
                "loss": float(loss.detach()), **batch_diagnostics(z1, idx, self.labels,
                                                                  self.reference),
                "step_seconds": step_seconds}

    def _skip_step(self, idx: torch.Tensor, t0: float) -> dict:
        """A batch of one item (the short last batch when ``N % B == 1``): nothing to contrast.

        As ``drop_last`` would, the step makes no update (an Adam step on a zero loss would still
        move the weights through its momentum); it is logged with loss 0 (MultipleNegatives-
        RankingLoss's value for one pair) and ``"skipped": True``. Under torch.distributed
        every rank skips when any rank's batch has one item
        (:func:`~hardbatch.train.step_batch.skip_on_every_rank`).
        """
        if not self._warned_skip:
            who = "a batch of 1 item has" if len(idx) < 2 else "another rank's batch of 1 item has"
            warnings.warn(
                f"step {self.global_step + 1}: {who} no negative and the step is skipped (no "
                "update); use drop_last=True in the sampler or a batch size that does not leave "
                "one item over", stacklevel=3)
            self._warned_skip = True
        return {"kind": "step", "step": self.global_step + 1, "epoch": self.epoch, "loss": 0.0,
                **batch_diagnostics(None, idx, self.labels, self.reference),
                "step_seconds": time.perf_counter() - t0, "skipped": True}

    # -- evaluation ----------------------------------------------------
    def evaluate(self, probe: bool = True) -> dict:
        """kNN and (with ``probe``) linear-probe accuracy now ({} without labels)."""
        if self.eval_data is None:
            return {}
        t0 = time.perf_counter()
        c = self.config
        out = evaluate(self.encoder, *self.eval_data, k=c.knn_k, temperature=c.knn_temperature,
                       probe_weight_decay=c.probe_weight_decay, probe_max_iter=c.probe_max_iter,
                       batch_size=c.eval_batch_size, device=self.device, probe=probe)
        return {"kind": "eval", "step": self.global_step, "epoch": self.epoch, **out,
                "seconds": time.perf_counter() - t0}

    # -- checkpoints ---------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue the run exactly (see :func:`.checkpoint.trainer_state`)."""
        return trainer_state(self)

    def load_state_dict(self, state: dict) -> None:
        load_trainer_state(self, state)

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write :meth:`state_dict` to ``path`` (default ``config.checkpoint_path``) atomically."""
        return write_checkpoint(self.state_dict(), path or self.config.checkpoint_path)

    def load_checkpoint(self, path: str | os.PathLike | None = None) -> None:
        self.load_state_dict(read_checkpoint(path or self.config.checkpoint_path))

    # -- logging -------------------------------------------------------
    def _log(self, record: dict) -> None:
        if self._log_file is not None:
            self._log_file.write(json.dumps(record) + "\n")
            self._log_file.flush()

    def _open_log(self) -> None:
        if self.config.log_path is None:
            return
        path = Path(self.config.log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by fit())
        done = sorted(self.history + self.evals, key=lambda r: (r["step"], r["kind"] != "step"))
        for record in done:
            self._log(record)

    # -- the loop ------------------------------------------------------
    def _batches(self):
        """Yield ``(batch_ids, x or None, views)`` for the rest of the current epoch."""
        if self.tensor_data:
            for batch in self.sampler:
                yield batch, None, ()
            return
        yield from loader_batches(self.data, self.sampler, self.config.num_workers,
                                  torch.Generator().manual_seed(self.config.seed + self.epoch),
                                  self.indexed)

    def _maybe_checkpoint(self, force: bool = False) -> None:
        c = self.config
        if c.checkpoint_path is None:
            return
        if force or (c.checkpoint_every and self.global_step % c.checkpoint_every == 0):
            self.save_checkpoint()

    def fit(self) -> TrainResult:
        """Train (resuming from ``config.checkpoint_path`` if it exists) and return the result."""
        c = self.config
        if c.checkpoint_path and c.resume and Path(c.checkpoint_path).is_file():
            self.load_checkpoint()
        elif self.global_step == 0:
            seed_everything(c.seed)
            self.generator.manual_seed(c.seed)
        self._open_log()
        bar = None
        if c.progress:
            try:
                from tqdm.auto import tqdm
                bar = tqdm(total=self.total_steps, initial=min(self.global_step, self.total_steps),
                           desc="train", unit="step", leave=False)
            except ImportError:  # pragma: no cover - tqdm is optional
                bar = None
        stopped = False
        steps_per_epoch = len(self.sampler)
        try:
            while self.epoch < c.epochs:
                if self.step_in_epoch >= steps_per_epoch:  # the current epoch is done
                    if self.epoch + 1 >= c.epochs:
                        break
                    self.epoch, self.step_in_epoch, self.epoch_batches = self.epoch + 1, 0, []
                if hasattr(self.sampler, "set_epoch"):
                    self.sampler.set_epoch(self.epoch)
                batches = self._batches()
                while True:
                    if c.max_steps is not None and self.global_step >= c.max_steps:
                        stopped = True
                        break
                    sampler_before = getattr(self.sampler, "sampler_seconds", None)
                    t0 = time.perf_counter()
                    try:
                        batch, x, views = next(batches)
                    except StopIteration:
                        break
                    fetch = time.perf_counter() - t0
                    record = self.train_step(batch, x, views)
                    if self.tensor_data or sampler_before is None:
                        # all the time the sampler took to hand over the batch
                        record["sampler_seconds"] = fetch
                    else:  # the loader's fetch includes data loading: the sampler's own clock
                        record["sampler_seconds"] = self.sampler.sampler_seconds - sampler_before
                    record["step_seconds"] += fetch
                    if hasattr(self.sampler, "refreshes"):  # graphs / orders built so far
                        record["refreshes"] = int(self.sampler.refreshes)
                    self.global_step += 1
                    self.step_in_epoch += 1
                    self.epoch_batches.append([int(i) for i in batch])
                    self.history.append(record)
                    self._log(record)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{record['loss']:.3f}", epoch=self.epoch)
                    if c.eval_every and self.global_step % c.eval_every == 0:
                        self._record_eval(final=self.global_step >= self.total_steps)
                    self._maybe_checkpoint()
                if stopped:
                    break
                self.step_in_epoch = steps_per_epoch
                self._maybe_checkpoint(force=True)
            if stopped:
                self._maybe_checkpoint(force=True)
            if self.eval_data is not None and (
                    not self.evals or self.evals[-1]["step"] != self.global_step
                    or "linear_probe_accuracy" not in self.evals[-1]):
                if self.evals and self.evals[-1]["step"] == self.global_step:
                    self.evals.pop()  # the kNN-only evaluation at this step: redo with the probe
                self._record_eval(final=True)
        finally:
            if bar is not None:
                bar.close()
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        return self.result(stopped_early=stopped and self.global_step < c.epochs * steps_per_epoch)

    def _record_eval(self, final: bool = False) -> None:
        record = self.evaluate(probe=final or self.config.probe_every_eval)
        if record:
            self.evals.append(record)
            self._log(record)

    def result(self, stopped_early: bool = False) -> TrainResult:
        return TrainResult(
            history=list(self.history), evals=list(self.evals), steps=self.global_step,
            epochs=self.epoch + (1 if self.step_in_epoch >= len(self.sampler) else 0),
            sampler_seconds=float(sum(r["sampler_seconds"] for r in self.history)),
            step_seconds=float(sum(r["step_seconds"] for r in self.history)),
            last_epoch_batches=[list(b) for b in self.epoch_batches],
            stopped_early=stopped_early)


def train(encoder: nn.Module, loss: nn.Module, sampler, data, labels=None,
          config: TrainConfig | None = None, **kwargs) -> TrainResult:
    """``Trainer(encoder, loss, sampler, data, labels, config=config, **kwargs).fit()``.

    Keyword arguments are :class:`Trainer`'s (``head``, ``augment``, ``optimizer``,
    ``eval_data``, ``bank``) or :class:`TrainConfig` fields.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> from hardbatch.train import train
        >>> x = torch.randn(40, 8)  # N = 40 items, d = 8, no labels
        >>> result = train(torch.nn.Linear(8, 4), hb.InfoNCE(0.5), hb.UniformBatchSampler(40, 8),
        ...                x, epochs=1, progress=False)
        >>> result.steps, result.evals  # no labels: no evaluation
        (5, [])
    """
    return Trainer(encoder, loss, sampler, data, labels, config=config, **kwargs).fit()
