"""KNNBatchSampler: an anchor plus its nearest items, from a snapshot taken at refresh steps."""

import itertools

import numpy as np
import pytest
import torch
from sampler_support import B, N
from support import unit_rows

import hardbatch as hb


def test_knn_sampler_is_anchor_plus_nearest(emb):
    s = hb.KNNBatchSampler(emb, 32)
    x = emb.astype(np.float64)
    for batch in itertools.islice(s, 5):
        sims = x @ x[batch[0]]
        sims[batch[0]] = -np.inf
        assert set(batch[1:]) == set(np.argsort(-sims)[:31].tolist())


def test_knn_snapshot_does_not_follow_the_bank_between_refreshes():
    bank = hb.EmbeddingBank(N, 16, seed=4)
    s = hb.KNNBatchSampler(bank, 32, refresh_every=4, normalize=False, seed=2)
    gen = np.random.default_rng(8)
    snapshot = None
    for step, batch in enumerate(itertools.islice(s, 10)):
        if step % 4 == 0:  # the batch of a refresh step is drawn from the bank as it is now
            snapshot = bank.embeddings.numpy().astype(np.float64).copy()
        sims = snapshot @ snapshot[batch[0]]
        sims[batch[0]] = -np.inf
        assert set(batch[1:]) == set(np.argsort(-sims)[:31].tolist()), step
        bank.update(torch.arange(N), torch.from_numpy(gen.standard_normal((N, 16))).float())


def test_knn_sampler_accepts_a_device(rng):
    x = unit_rows(rng, 400, 16)
    knn = list(hb.KNNBatchSampler(x, 16, refresh_every=None, device="cpu"))
    assert knn == list(hb.KNNBatchSampler(x, 16, refresh_every=None))


def test_batch_size_must_leave_a_neighbour(emb):
    with pytest.raises(ValueError, match="must be smaller than N"):
        hb.KNNBatchSampler(emb, N)
    hb.KNNBatchSampler(emb, B)  # accepted


def test_sampler_auto_index_rule():
    pytest.importorskip("faiss")
    from hardbatch.neighbors.index_search import AUTO_EXACT_MAX_ITEMS
    from hardbatch.samplers.knn_sampler import AUTO_SAMPLER_MIN_STEPS
    from hardbatch.samplers.knn_sampler import sampler_index_kind as kind

    n = AUTO_EXACT_MAX_ITEMS + 1
    assert kind("auto", n, None) == "ivf" and kind("auto", n, AUTO_SAMPLER_MIN_STEPS) == "ivf"
    assert kind("auto", n, 100) is None  # a snapshot of 100 steps: exact products
    assert kind("auto", n, None, world_size=2) is None
    assert kind("auto", n - 1, None) is None and kind("exact", n, None) is None
