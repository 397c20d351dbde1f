"""Fixtures of the ``hardbatch.train`` tests; their helpers are in ``train_support.py`` (next to
this file, put on ``sys.path`` here: under ``--import-mode=importlib`` a test module cannot
import its neighbours otherwise)."""

import sys
from pathlib import Path

import pytest
from hardbatch_experiments.datasets import load_digits

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits()
    return x[:160], y[:160]
