"""Fixtures of the ``hardbatch.metrics`` tests; their plain-Python references are in
``metrics_reference.py`` (next to this file, put on ``sys.path`` here: under
``--import-mode=importlib`` a test module cannot import its neighbours otherwise)."""

import sys
from pathlib import Path

import numpy as np
import pytest

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((12, 5)) * rng.uniform(0.5, 3.0, size=(12, 1))  # unnormalised rows
    labels = rng.integers(0, 3, size=12)
    return x.astype(np.float32), labels


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    x = x.astype(np.float32)
    x -= x.mean(axis=0)  # centred pixels: cosine similarity is then informative
    return x, y.astype(np.int64)


@pytest.fixture(scope="module")
def reference(tiny):
    rng = np.random.default_rng(11)
    return rng.standard_normal((len(tiny[0]), 3)).astype(np.float32)  # another embedding
