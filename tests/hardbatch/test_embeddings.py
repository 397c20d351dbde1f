"""EmbeddingBank: updates, staleness, checkpoints and input checks."""

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
