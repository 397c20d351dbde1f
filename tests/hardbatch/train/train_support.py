"""Helpers shared by the ``hardbatch.train`` tests (importable as ``train_support``: see
``conftest.py``): a tiny model, a noise augmentation, the samplers and a configured Trainer."""

import torch
from torch import nn

import hardbatch as hb
from hardbatch.losses import InfoNCE
from hardbatch.train import TrainConfig, Trainer


def noise_augment(x, generator=None):
    return x + 0.05 * torch.randn(x.shape, generator=generator)


def small_model(seed=0, d_in=64, d_out=8):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, d_out))


SAMPLERS = {
    "uniform": lambda bank: hb.UniformBatchSampler(bank.num_items, 32, seed=1),
    "proximity": lambda bank: hb.ProximityGraphSampler(
        bank, 32, candidates=50, neighbors=10, restart=hb.LinearDecay(0.2, 0.05),
        refresh_every=3, epochs=3, seed=1),
    "knn": lambda bank: hb.KNNBatchSampler(bank, 32, refresh_every=4, seed=1),
    "gcbs": lambda bank: hb.GCBSSampler(bank, 32, quantile=0.99, seed=1),
}


def make_trainer(x, y, sampler="proximity", seed=0, loss=None, **config):
    config = {"epochs": 3, "seed": 3, "progress": False, "probe_max_iter": 30, **config}
    return Trainer(small_model(seed), loss or InfoNCE(0.5), SAMPLERS[sampler], x, y,
                   augment=noise_augment, config=TrainConfig(**config))
