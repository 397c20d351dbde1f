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
    from hardbatch.datasets import load_mnist

    images, labels = load_mnist(data_root, split="train")
    x = images.reshape(len(images), -1).numpy().astype(np.float32) / 255.0
    x -= x.mean(axis=0)
    _, _, vt = np.linalg.svd(x[:10000], full_matrices=False)
    z = x @ vt[:64].T
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return np.ascontiguousarray(z, np.float32), labels.numpy()
