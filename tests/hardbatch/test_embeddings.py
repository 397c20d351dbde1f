"""EmbeddingBank: updates, staleness, checkpoints and input checks."""

import warnings

import numpy as np
import pytest
import torch

import hardbatch as hb


def test_embedding_bank():
    bank = hb.EmbeddingBank(10, 4, seed=1)
    assert bank.filled == 0.0 and (bank.staleness() == -1).all()
    bank.update([1, 2], torch.ones(2, 4))
    bank.update(torch.tensor([2]), torch.zeros(1, 4))
    assert bank.filled == 0.2
    assert bank.staleness()[1] == 2 and bank.staleness()[2] == 1 and bank.staleness()[0] == -1
    assert torch.equal(bank.embeddings[2], torch.zeros(4))
    other = hb.EmbeddingBank(10, 4, seed=2)
    other.load_state_dict(bank.state_dict())
    assert torch.equal(other.embeddings, bank.embeddings) and other.step == 2
    with pytest.raises(ValueError, match="shape \\[b, 4\\]"):
        bank.update([1], torch.ones(1, 5))
    with pytest.raises(ValueError, match="one index per row"):
        bank.update([1, 2, 3], torch.ones(2, 4))
    with pytest.raises(ValueError, match="indices must lie in"):
        bank.update([10], torch.ones(1, 4))
    half = hb.EmbeddingBank(4, 2, dtype=torch.float16, init="zeros")  # 1e5 > fp16's 65504
    with pytest.raises(ValueError, match="overflow the bank's dtype torch.float16.*normalise"):
        half.update([0, 1], torch.tensor([[1e5, 1.0], [1.0, 1.0]]))
    assert half.step == 0 and not half.embeddings.any()  # nothing stored


def test_an_item_listed_twice_keeps_its_last_row_written_once(monkeypatch):
    """The contract (the highest rank's row under synchronisation) must not rest on the order in
    which one indexed write with repeated indices lands: undefined on CUDA. The bank writes
    each item once (checked here by recording the writes), with its last row."""
    bank = hb.EmbeddingBank(6, 2, init="zeros")
    rows = torch.tensor([[1.0, 0], [2, 0], [3, 0], [4, 0], [5, 0]])
    written = []
    table = bank.embeddings

    class Recorder(torch.Tensor):
        pass

    def spy(self, key, value):
        written.append(torch.as_tensor(key).clone())
        torch.Tensor.__setitem__(table, key, value)

    monkeypatch.setattr(bank, "embeddings", Recorder._make_subclass(Recorder, table))
    monkeypatch.setattr(Recorder, "__setitem__", spy)
    bank.update([3, 1, 3, 5, 3], rows)
    assert torch.equal(table[:, 0], torch.tensor([0.0, 2, 0, 5, 0, 4]))
    assert [k.tolist() for k in written] == [[1, 3, 5]]  # each item once
    assert bank.rows_written == 5 and bank.last_update.tolist() == [-1, 0, -1, 0, -1, 0]


@pytest.mark.parametrize("indices", [[1.7, 2.2], np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]),
                                     torch.tensor([True, False])])
def test_bank_update_rejects_non_integer_indices(indices):
    bank = hb.EmbeddingBank(10, 4)
    before = bank.embeddings.clone()
    with pytest.raises(ValueError, match="indices must be integer item indices, got dtype"):
        bank.update(indices, torch.ones(2, 4))
    assert torch.equal(bank.embeddings, before) and bank.step == 0
    bank.update(np.array([1, 2], np.int32), torch.ones(2, 4))  # integers of any width
    bank.update([], torch.ones(0, 4))  # an empty update is fine
    assert bank.step == 2 and bank.rows_written == 2


def refresh_warnings(sampler, steps, feed=None):
    """Warnings raised while iterating ``steps`` batches (feeding the bank if asked)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = 0
        while step < steps:
            for batch in sampler:
                if feed is not None:
                    feed(sampler.source, batch)
                step += 1
                if step == steps:
                    break
    return [str(w.message) for w in caught if "EmbeddingBank" in str(w.message)]


def test_a_bank_never_written_warns_once_per_refresh_after_64_steps():
    bank = hb.EmbeddingBank(200, 8)
    sampler = hb.ProximityGraphSampler(bank, 10, 50, 5, refresh_every=20)
    messages = refresh_warnings(sampler, 140)  # refreshes at 0, 20, ..., 120
    assert len(messages) == 3  # those at steps 80, 100, 120: 64 steps and more unchanged
    assert "not written during the sampler's last 80 steps: 100% of its rows are unchanged " \
        "(100% never written)" in messages[0]
    assert "bank.update(indices, embeddings)" in messages[0]


def test_labels_given_as_indices_warn_with_the_share_never_written():
    bank = hb.EmbeddingBank(200, 8)
    sampler = hb.KNNBatchSampler(bank, 10, refresh_every=5)
    labels = torch.arange(200) % 4

    def by_label(bank, batch):  # the mistake: labels instead of the items' indices
        bank.update(labels[batch], torch.randn(len(batch), 8))

    messages = refresh_warnings(sampler, 40, by_label)
    assert messages and all("98% of the EmbeddingBank's rows were never written although "
                            "bank.update stored" in m for m in messages)
    assert "not labels" in messages[0]


def test_a_fed_bank_and_a_prefetching_loader_do_not_warn():
    from torch.utils.data import DataLoader, TensorDataset

    bank = hb.EmbeddingBank(200, 8)
    sampler = hb.ProximityGraphSampler(bank, 10, 50, 5, refresh_every=2)
    assert not refresh_warnings(sampler, 60, lambda b, batch: b.update(
        batch, torch.randn(len(batch), 8)))
    # a loader asking for batches ahead of training: refreshes read a bank not yet written
    bank = hb.EmbeddingBank(200, 8)
    sampler = hb.ProximityGraphSampler(bank, 10, 50, 5, refresh_every=1)
    loader = DataLoader(TensorDataset(torch.arange(200)), batch_sampler=sampler, num_workers=2,
                        prefetch_factor=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for (idx,) in loader:
            bank.update(idx, torch.randn(len(idx), 8))
    assert not [w for w in caught if "EmbeddingBank" in str(w.message)]


def test_read_embeddings_is_torch_on_the_source_device_without_a_copy():
    from hardbatch.embeddings import read_embeddings, source_num_items
    bank = hb.EmbeddingBank(40, 8)
    x = read_embeddings(bank)
    assert isinstance(x, torch.Tensor) and x.data_ptr() == bank.embeddings.data_ptr()
    array = np.ones((40, 8), np.float32)
    assert read_embeddings(array).data_ptr() == array.ctypes.data  # a view of the array
    assert read_embeddings(lambda: array * 2).dtype == torch.float32
    assert source_num_items(array) == (40, None)
    n, first = source_num_items(lambda: torch.ones(40, 8, dtype=torch.float64))
    assert n == 40 and first.dtype == torch.float32
    with pytest.raises(ValueError, match="must hold numbers"):
        read_embeddings(torch.ones(40, 8, dtype=torch.bool))
