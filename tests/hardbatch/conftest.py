"""Fixtures shared by the library tests (samplers, keys; plain helpers: ``tests/sampler_support.py``)."""

import numpy as np
import pytest
import torch
from support import unit_rows

from sampler_support import LIVE_D, LIVE_N, N


@pytest.fixture(scope="session")
def emb() -> np.ndarray:
    """Fixed unit embeddings [N, 16] of the contract tests."""
    return unit_rows(np.random.default_rng(0), N, 16)


@pytest.fixture(scope="session")
def base() -> torch.Tensor:
    """The embeddings [LIVE_N, LIVE_D] a simulated training loop writes into a live bank."""
    return torch.from_numpy(unit_rows(np.random.default_rng(0), LIVE_N, LIVE_D))
