"""hardbatch.data: a DataLoader whose items carry no index is named at the first batch (issue 35.7).

``for idx, x1, x2 in DataLoader(tensor, batch_sampler=sampler)`` fails with Python's bare "too
many values to unpack (expected 3)"; the samplers find the loader's dataset on the call stack
when it asks for the first batch and warn, naming ``IndexedDataset``, before that error.
"""

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import hardbatch as hb
from hardbatch.data import IndexedDataset, unindexed_items, warn_if_loader_items_lack_index

N, B = 60, 10


def _samplers():
    bank = hb.EmbeddingBank(N, 8, seed=0)
    return [hb.UniformBatchSampler(N, B, seed=0),
            hb.ProximityGraphSampler(bank, B, candidates=20, neighbors=5, seed=0),
            hb.KNNBatchSampler(bank, B, seed=0), hb.GCBSSampler(bank, B, seed=0)]


@pytest.mark.parametrize("sampler", _samplers(), ids=lambda s: type(s).__name__)
def test_a_loop_over_items_without_index_is_warned_at_the_first_batch(sampler):
    data = torch.randn(N, 8)
    with pytest.warns(UserWarning, match=r"over a torch.float32 tensor of shape \[60, 8\]: its "
                                         r"items carry no index.*IndexedDataset\(data"):
        with pytest.raises(ValueError, match="too many values to unpack"):
            for _idx, _x1, _x2 in DataLoader(data, batch_sampler=sampler):
                pass
    with warnings.catch_warnings():  # the fix: no warning, (index, view1, view2) batches
        warnings.filterwarnings("error", message=".*carry no index")
        idx, x1, x2 = next(iter(DataLoader(IndexedDataset(data), batch_sampler=sampler)))
    assert idx.shape == (len(x1),) and x1.shape == x2.shape


def test_indexed_or_unknown_datasets_are_not_warned_about():
    x = torch.randn(N, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for data in (torch.arange(N), TensorDataset(torch.arange(N), x), IndexedDataset(x),
                     [(i, x[i], x[i]) for i in range(N)], list(range(N)), np.arange(N)):
            list(DataLoader(data, batch_sampler=hb.UniformBatchSampler(N, B, seed=0)))
        list(hb.UniformBatchSampler(N, B))  # no DataLoader at all
        assert warn_if_loader_items_lack_index(None) is False


def test_with_workers_and_pairs_the_warning_names_the_first_item():
    pairs = [(torch.randn(8), i % 3) for i in range(N)]  # (input, label), as torchvision gives
    loader = DataLoader(pairs, batch_sampler=hb.UniformBatchSampler(N, B, seed=0), num_workers=1)
    with pytest.warns(UserWarning, match=r"a list of 60 items whose item 0 starts with a "
                                         r"torch.float32 tensor of shape \[8\]"):
        with pytest.raises(ValueError, match="not enough values to unpack"):
            for _idx, _x1, _x2 in loader:
                pass


def test_unindexed_items_judges_only_what_it_can_see():
    assert unindexed_items(np.zeros((5, 2), np.float32)) == \
        "a numpy float32 array of shape [5, 2]"
    assert "TensorDataset whose first tensor is a torch.float32" in unindexed_items(
        TensorDataset(torch.zeros(5, 2), torch.arange(5)))
    assert unindexed_items(["a sentence", "another"]).startswith("a list of 2 items whose item 0 is")

    class Opaque(torch.utils.data.Dataset):  # its items are never read
        def __len__(self):
            return 3

        def __getitem__(self, i):
            raise AssertionError("read")

    assert unindexed_items(Opaque()) is None and unindexed_items([]) is None
