import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_root() -> Path | None:
    env = os.environ.get("HARDBATCH_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("real data not found: set HARDBATCH_DATA to the shared/data folder")
    return root


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="session")
def mnist_pca(data_root):
    """MNIST train images projected to 64 PCA dims (fit on 10k images), unit rows; and labels."""
    from hardbatch.datasets import mnist_pca

    return mnist_pca(data_root)
