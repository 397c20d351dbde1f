"""Fixtures shared by the whole suite (tests/ and experiments/tests/); plain helpers live in
``tests/support.py``."""

from pathlib import Path

import numpy as np
import pytest
import torch
from support import shared_data_root


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("real data not found: set HARDBATCH_DATA to the shared/data folder")
    return root


@pytest.fixture
def one_thread():
    """One torch thread for tiny models: more only add overhead (and collapse on a busy
    machine). Modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def mnist_pca(data_root):
    """MNIST train images projected to 64 PCA dims (fit on 10k images), unit rows; and labels."""
    from hardbatch_experiments.datasets import mnist_pca

    return mnist_pca(data_root)


@pytest.fixture
def cli(capsys):
    """``cli(*argv)`` runs the ``hardbatch`` command line in-process and returns ``(exit code,
    stdout, stderr)``; argparse's ``SystemExit`` becomes the exit code."""
    from hardbatch.cli import main

    def call(*argv):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return call
