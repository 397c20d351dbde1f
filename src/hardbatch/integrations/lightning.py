"""PyTorch Lightning integration: a callback that feeds an :class:`~hardbatch.EmbeddingBank`.

Lightning is imported lazily (``lightning.pytorch``, else ``pytorch_lightning``), so importing
this module never requires it.

The contract with your ``LightningModule``:

* the training ``DataLoader`` uses a hardbatch sampler as ``batch_sampler`` and its dataset
  returns each item's index with the item, e.g. ``(index, x)``;
* ``training_step`` returns a dict with ``"loss"`` plus ``"indices"`` (``[B]`` item ids of the
  batch) and ``"embeddings"`` (``[B, d]``, typically the anchor view's projection: the same
  tensors the loss used, no extra forward pass). The callback stores them, detached, in the bank
  after every training batch (``on_train_batch_end``), which is where graph samplers rebuild
  their graph from (``refresh_every``) and GCBS re-orders the items from (every epoch);
* at every epoch start (``on_train_epoch_start``) it calls ``sampler.set_epoch(epoch)``
  (Lightning itself only calls ``set_epoch`` on ``DataLoader.sampler`` and
  ``batch_sampler.sampler``, not on the batch sampler).

The bank and the sampler's place in its epoch are saved in Lightning checkpoints
(``state_dict`` / ``load_state_dict`` of the callback): resuming from a mid-epoch checkpoint
trains exactly the rest of the epoch's batches (Lightning, restarting mid-epoch, calls no
``on_train_epoch_start``; the loaded sampler state carries the epoch). For multi-GPU runs pass
``use_distributed_sampler=False`` to the ``Trainer``: hardbatch samplers split batches across
ranks themselves.

::

    from hardbatch.integrations.lightning import EmbeddingBankCallback

    bank = hb.EmbeddingBank(len(dataset), dim=128)
    sampler = hb.ProximityGraphSampler(bank, batch_size=256, candidates=1000, neighbors=100)
    loader = DataLoader(dataset, batch_sampler=sampler)
    trainer = L.Trainer(max_epochs=100, callbacks=[EmbeddingBankCallback(bank, sampler)])
    trainer.fit(module, loader)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..embeddings import EmbeddingBank

# EmbeddingBankCallback is built on first access (module __getattr__), importing Lightning then
__all__ = ["EmbeddingBankCallback", "embedding_bank_callback_class"]  # noqa: F822

_CLASSES: dict[str, type] = {}


def _lightning_module(package: str | None):
    import importlib

    names = [package] if package else ["lightning.pytorch", "pytorch_lightning"]
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(
        "the Lightning integration needs lightning: pip install lightning (or pytorch-lightning)"
    )


class _BankFeeder:
    """Lightning-independent logic of the callback."""

    def __init__(
        self,
        bank: EmbeddingBank,
        sampler=None,
        *,
        indices_key: str = "indices",
        embeddings_key: str = "embeddings",
        strict: bool = True,
    ) -> None:
        if not isinstance(bank, EmbeddingBank):
            raise TypeError(f"bank must be a hardbatch.EmbeddingBank, got {type(bank).__name__}")
        self.bank = bank
        self.sampler = sampler
        self.indices_key = indices_key
        self.embeddings_key = embeddings_key
        self.strict = strict
        self.updates = 0
        self.consumed = 0  # batches of the current epoch trained (for the sampler's state)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.consumed = 0
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(int(trainer.current_epoch))

    def _feed(self, outputs: Any) -> None:
        if (
            not isinstance(outputs, Mapping)
            or self.indices_key not in outputs
            or self.embeddings_key not in outputs
        ):
            if self.strict:
                raise ValueError(
                    f"EmbeddingBankCallback: training_step must return a dict with "
                    f"'{self.indices_key}' ([B] item ids) and '{self.embeddings_key}' ([B, d]) "
                    f"besides 'loss'; got {type(outputs).__name__}"
                    + (f" with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else "")
                )
            return
        embeddings = outputs[self.embeddings_key]
        self.bank.update(outputs[self.indices_key], embeddings.detach().float())
        self.updates += 1

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._feed(outputs)
        self.consumed = int(batch_idx) + 1

    def state_dict(self) -> dict:
        state = {"bank": self.bank.state_dict(), "updates": self.updates,
                 "consumed": self.consumed}
        if hasattr(self.sampler, "state_dict"):  # where the epoch's batches stand
            state["sampler"] = self.sampler.state_dict(consumed=self.consumed)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self.bank.load_state_dict(state_dict["bank"])
        self.updates = int(state_dict.get("updates", 0))
        self.consumed = int(state_dict.get("consumed", 0))
        if "sampler" in state_dict and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state_dict["sampler"])
            if int(state_dict["sampler"]["step"]) >= len(self.sampler):  # saved at an epoch's
                self.sampler.set_epoch(self.sampler.epoch + 1)  # last batch: Lightning goes on
                # with the next epoch, and calls no on_train_epoch_start to say so


def embedding_bank_callback_class(package: str | None = None) -> type:
    """The callback class for ``package`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``;
    default: whichever is installed, ``lightning.pytorch`` first).

    Example:
        >>> import lightning.pytorch as L
        >>> from hardbatch.integrations.lightning import embedding_bank_callback_class
        >>> callback_class = embedding_bank_callback_class("lightning.pytorch")
        >>> callback_class.__name__, issubclass(callback_class, L.Callback)
        ('EmbeddingBankCallback', True)
    """
    module = _lightning_module(package)
    key = module.__name__
    if key not in _CLASSES:
        _CLASSES[key] = type(
            "EmbeddingBankCallback",
            (_BankFeeder, module.Callback),
            {"__doc__": _CALLBACK_DOC, "__module__": __name__},
        )
    return _CLASSES[key]


_CALLBACK_DOC = """Feeds an EmbeddingBank from ``training_step`` outputs; calls ``sampler.set_epoch``.

Args:
    bank: the :class:`hardbatch.EmbeddingBank` the sampler reads.
    sampler: the hardbatch batch sampler of the training DataLoader (for ``set_epoch``), or None.
    indices_key, embeddings_key: keys of the ``training_step`` output dict.
    strict: raise when an output lacks the keys (default); False skips such batches.

Example:
    >>> import torch
    >>> import lightning.pytorch as L
    >>> import hardbatch as hb
    >>> from hardbatch.integrations.lightning import EmbeddingBankCallback
    >>> class Module(L.LightningModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.encoder, self.loss = torch.nn.Linear(8, 4), hb.InfoNCE(0.5)
    ...     def training_step(self, batch, batch_idx):
    ...         idx, view1, view2 = batch
    ...         z1, z2 = self.encoder(view1), self.encoder(view2 + 0.1 * torch.randn_like(view2))
    ...         return {"loss": self.loss(z1, z2), "indices": idx, "embeddings": z1}
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    >>> _ = torch.manual_seed(0)
    >>> bank = hb.EmbeddingBank(40, 4)
    >>> sampler = hb.KNNBatchSampler(bank, 8)
    >>> loader = torch.utils.data.DataLoader(hb.IndexedDataset(torch.randn(40, 8)),
    ...                                      batch_sampler=sampler)
    >>> callback = EmbeddingBankCallback(bank, sampler)
    >>> trainer = L.Trainer(max_epochs=2, callbacks=[callback], accelerator="cpu", logger=False,
    ...                     enable_checkpointing=False, enable_progress_bar=False,
    ...                     enable_model_summary=False)
    >>> trainer.fit(Module(), loader)
    >>> callback.updates, bank.step  # 2 epochs of 5 batches, each stored in the bank
    (10, 10)
"""

# doctest finds the lazily built class's examples here (it only looks at the module's dict)
__test__ = {"EmbeddingBankCallback": _CALLBACK_DOC}


def __getattr__(name: str):
    if name == "EmbeddingBankCallback":
        return embedding_bank_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
