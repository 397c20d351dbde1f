"""hardbatch.integrations.lightning: the callback that feeds the bank and sets the epoch.

Each test skips when Lightning is not installed.
"""

import os

import pytest
import torch

import hardbatch as hb
from hardbatch.losses import InfoNCE

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download in tests


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- Lightning


class _IndexedTensors(torch.utils.data.Dataset):
    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i]


def _lightning_module(L, return_dict=True):
    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 4)
            self.loss = InfoNCE(0.5)

        def training_step(self, batch, batch_idx):
            idx, x = batch
            z1 = self.net(x + 0.1 * torch.randn_like(x))
            z2 = self.net(x + 0.1 * torch.randn_like(x))
            loss = self.loss(z1, z2)
            if not return_dict:
                return loss
            return {"loss": loss, "indices": idx, "embeddings": z1.detach()}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


def _lightning_trainer(L, callback, **kw):
    return L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[callback], **kw)


def test_lightning_callback_feeds_bank_and_sets_epoch():
    L = pytest.importorskip("lightning.pytorch")
    from hardbatch.integrations.lightning import EmbeddingBankCallback

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    bank = hb.EmbeddingBank(64, 4)
    sampler = hb.ProximityGraphSampler(bank, 16, candidates=20, neighbors=5, refresh_every=3)
    callback = EmbeddingBankCallback(bank, sampler)
    assert isinstance(callback, L.Callback)
    epochs_seen = []
    original = sampler.set_epoch
    sampler.set_epoch = lambda e: (epochs_seen.append(e), original(e))[1]
    trainer = _lightning_trainer(L, callback)
    trainer.fit(_lightning_module(L),
                torch.utils.data.DataLoader(_IndexedTensors(x), batch_sampler=sampler))
    assert trainer.global_step == 8
    assert callback.updates == bank.step == 8
    assert bank.filled > 0.5
    assert epochs_seen == [0, 1]
    assert sampler.refreshes == 3  # steps 0, 3, 6: the graph was rebuilt from the fed bank
    # the bank travels in Lightning checkpoints
    state = callback.state_dict()
    fresh_bank = hb.EmbeddingBank(64, 4, seed=5)
    EmbeddingBankCallback(fresh_bank).load_state_dict(state)
    assert torch.equal(fresh_bank.embeddings, bank.embeddings)


def test_lightning_callback_contract_error():
    L = pytest.importorskip("lightning.pytorch")
    from hardbatch.integrations.lightning import EmbeddingBankCallback

    x = torch.randn(32, 8)
    bank = hb.EmbeddingBank(32, 4)
    sampler = hb.UniformBatchSampler(32, 8)
    trainer = _lightning_trainer(L, EmbeddingBankCallback(bank, sampler), max_steps=1)
    with pytest.raises(ValueError, match="'indices'"):
        trainer.fit(_lightning_module(L, return_dict=False),
                    torch.utils.data.DataLoader(_IndexedTensors(x), batch_sampler=sampler))


@pytest.mark.parametrize("kind,stop", [("uniform", 3), ("uniform", 5), ("knn", 7), ("knn", 10)])
def test_lightning_mid_epoch_resume_trains_the_batches_of_the_uninterrupted_run(tmp_path, kind,
                                                                               stop):
    """A checkpoint taken mid-epoch (ModelCheckpoint(every_n_train_steps)) carries the
    sampler's place: the resumed run trains exactly the rest of the uninterrupted run's batches
    (before, the callback saved no sampler state and Lightning, restarting mid-epoch, calls no
    on_train_epoch_start: the rest of epoch 1 was drawn from epoch 0's plan). Stops 5 and 10: a
    checkpoint at an epoch's last batch, after which Lightning goes on with the next epoch."""
    L = pytest.importorskip("lightning.pytorch")
    from hardbatch.integrations.lightning import EmbeddingBankCallback

    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))

    def run(max_steps=-1, ckpt_path=None, every=None):
        torch.manual_seed(0)
        bank = hb.EmbeddingBank(40, 4)
        sampler = (hb.UniformBatchSampler(40, 8, seed=3) if kind == "uniform" else
                   hb.KNNBatchSampler(bank, 8, 3, seed=3))
        module, seen = _lightning_module(L), []
        step = module.training_step
        module.training_step = lambda batch, batch_idx: (  # the views' noise: seeded by step
            seen.append(batch[0].tolist()), torch.manual_seed(module.global_step),
            step(batch, batch_idx))[2]
        checkpoints = [L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=every,
                                                   save_top_k=-1)] if every else []
        trainer = L.Trainer(max_epochs=3, max_steps=max_steps, accelerator="cpu", devices=1,
                            logger=False, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=bool(every),
                            callbacks=[EmbeddingBankCallback(bank, sampler), *checkpoints])
        trainer.fit(module, torch.utils.data.DataLoader(_IndexedTensors(x), batch_sampler=sampler),
                    ckpt_path=ckpt_path)
        return seen

    full = run()
    first = run(max_steps=stop, every=stop)
    (checkpoint,) = tmp_path.glob("*.ckpt")
    rest = run(ckpt_path=checkpoint, every=100)
    assert len(full) == 15 and len(first) == stop and first + rest == full
