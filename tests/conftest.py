"""Fixtures shared by the whole suite; plain helpers live in ``support.py``."""

from pathlib import Path

import numpy as np
import pytest
from support import shared_data_root


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("real data not found: set HARDBATCH_DATA to the shared/data folder")
    return root


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def mnist_pca(data_root):
    """MNIST train images projected to 64 PCA dims (fit on 10k images), unit rows; and labels."""
    from hardbatch.datasets import mnist_pca

    return mnist_pca(data_root)
