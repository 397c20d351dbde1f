"""hardbatch_experiments.datasets: digits, MNIST (IDX layouts), the data root and its errors.

CIFAR-10 is tested with the vision recipe (test_vision.py)."""

import gzip
import struct

import numpy as np
import pytest
import torch

from hardbatch_experiments.datasets import DataNotFoundError, data_root, load_digits, load_mnist


def test_load_digits():
    x, y = load_digits()
    assert x.shape == (1797, 64) and x.dtype == torch.float32
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert y.dtype == torch.int64 and sorted(y.unique().tolist()) == list(range(10))


def _write_idx(path, array, compress):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


@pytest.mark.parametrize("compress,layout", [(True, "images/mnist"), (False, "."),
                                             (True, "MNIST/raw")])
def test_load_mnist_layouts(tmp_path, monkeypatch, compress, layout):
    folder = tmp_path / layout
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28))
    labels = np.array([3, 1, 4, 1, 5])
    suffix = ".gz" if compress else ""
    _write_idx(folder / f"t10k-images-idx3-ubyte{suffix}", images, compress)
    _write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", labels, compress)
    x, y = load_mnist(tmp_path, split="test")
    assert x.dtype == torch.uint8 and x.shape == (5, 28, 28)
    np.testing.assert_array_equal(x.numpy(), images)
    assert y.dtype == torch.int64 and y.tolist() == labels.tolist()
    monkeypatch.setenv("HARDBATCH_DATA", str(tmp_path))
    assert torch.equal(load_mnist(split="test")[1], y)


def test_missing_data_errors_name_the_env_var(tmp_path, monkeypatch):
    with pytest.raises(DataNotFoundError, match="HARDBATCH_DATA"):
        load_mnist(tmp_path, split="train")
    monkeypatch.setenv("HARDBATCH_DATA", str(tmp_path / "nope"))
    with pytest.raises(DataNotFoundError, match="HARDBATCH_DATA"):
        data_root()
    with pytest.raises(ValueError, match="split"):
        load_mnist(tmp_path, split="validation")
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"not an idx file")
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"not an idx file")
    with pytest.raises(ValueError, match="IDX"):
        load_mnist(tmp_path)


def test_data_root_resolution(tmp_path, monkeypatch):
    assert data_root(tmp_path) == tmp_path
    monkeypatch.setenv("HARDBATCH_DATA", str(tmp_path))
    assert data_root() == tmp_path


def test_load_real_mnist(data_root):
    x, y = load_mnist(data_root, split="test")
    assert x.shape == (10000, 28, 28) and x.dtype == torch.uint8
    assert torch.bincount(y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
