"""Offline dataset loaders: scikit-learn's bundled digits and MNIST from local IDX files.

Nothing here downloads. Files are looked up under a data root resolved by
:func:`data_root`: an explicit ``path``, else the ``HARDBATCH_DATA``
environment variable, else ``<repo>/../shared/data`` when it exists (the
layout described in that folder's README: ``images/mnist/*.gz``, ...).

All loaders return torch tensors.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import torch

__all__ = ["ENV_VAR", "DataNotFoundError", "data_root", "load_digits", "load_mnist", "mnist_pca"]

ENV_VAR = "HARDBATCH_DATA"

_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class DataNotFoundError(FileNotFoundError):
    """A dataset file or folder is missing (the message says where it was looked for)."""


def _repo_default() -> Path:
    # src/hardbatch/datasets.py -> <repo>; the shared data folder sits next to the repo.
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def data_root(path: str | os.PathLike | None = None) -> Path:
    """The folder holding hardbatch's datasets.

    Resolution order: ``path`` if given, else ``$HARDBATCH_DATA``, else
    ``<repo>/../shared/data`` if that folder exists.

    Raises:
        DataNotFoundError: the chosen folder does not exist, or nothing was configured.
    """
    if path is not None:
        root, origin = Path(path).expanduser(), "the path given"
    elif os.environ.get(ENV_VAR):
        root, origin = Path(os.environ[ENV_VAR]).expanduser(), f"${ENV_VAR}"
    else:
        root = _repo_default()
        if root.is_dir():
            return root
        raise DataNotFoundError(
            f"no data folder configured: pass root=... or set the environment variable {ENV_VAR} "
            f"to a folder laid out like shared/data (images/mnist/...); looked for {root}")
    if not root.is_dir():
        raise DataNotFoundError(f"data folder {root} ({origin}) does not exist; set {ENV_VAR} to "
                                "a folder laid out like shared/data, or pass root=...")
    return root


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits (no download).

    Returns:
        ``(x, y)``: float32 features ``[1797, 64]`` scaled to ``[0, 1]`` (pixel / 16)
        and int64 labels ``[1797]`` in ``0..9``.
    """
    try:
        from sklearn.datasets import load_digits as _sk_load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("load_digits needs scikit-learn: pip install 'hardbatch[demo]'") from exc
    bunch = _sk_load_digits()
    x = torch.from_numpy(np.asarray(bunch.data, dtype=np.float32) / 16.0)
    y = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    return x, y


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number); expected the MNIST "
                         "files as distributed (optionally gzipped)")
    dtype, ndim = np.dtype(_IDX_DTYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    count = int(np.prod(shape)) if shape else 0
    if len(data) - header < count * dtype.itemsize:
        raise ValueError(f"{path} is truncated: header says shape {shape} but the file holds "
                         f"{len(data) - header} bytes of data")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def _find(folder_candidates: list[Path], stem: str) -> Path | None:
    for folder in folder_candidates:
        for name in (stem + ".gz", stem):
            if (folder / name).is_file():
                return folder / name
    return None


def load_mnist(root: str | os.PathLike | None = None,
               split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST from the raw IDX files (torchvision file names, gzipped or not).

    The files are looked for in ``<root>/images/mnist``, ``<root>/MNIST/raw``
    (torchvision's layout) and ``<root>`` itself, where ``root`` is resolved by
    :func:`data_root` (argument, ``$HARDBATCH_DATA``, ``<repo>/../shared/data``).

    Args:
        root: data folder, or the folder holding the IDX files.
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000).

    Returns:
        ``(images, labels)``: uint8 ``[N, 28, 28]`` and int64 ``[N]``.
    """
    if split not in _MNIST_FILES:
        raise ValueError(f"split={split!r} must be 'train' or 'test'")
    base = data_root(root)
    folders = [base / "images" / "mnist", base / "MNIST" / "raw", base]
    image_stem, label_stem = _MNIST_FILES[split]
    paths = []
    for stem in (image_stem, label_stem):
        found = _find(folders, stem)
        if found is None:
            where = ", ".join(str(f) for f in folders)
            raise DataNotFoundError(
                f"MNIST file {stem}(.gz) not found in {where}; put the IDX files there or point "
                f"root=... / ${ENV_VAR} at a folder holding images/mnist/")
        paths.append(found)
    images, labels = _read_idx(paths[0]), _read_idx(paths[1])
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(f"MNIST files disagree: images {images.shape} and labels {labels.shape} "
                         f"({paths[0]}, {paths[1]})")
    return (torch.from_numpy(images.astype(np.uint8, copy=False)),
            torch.from_numpy(labels.astype(np.int64)))


def mnist_pca(root: str | os.PathLike | None = None, dims: int = 64,
              fit_size: int = 10000) -> tuple[np.ndarray, np.ndarray]:
    """MNIST train images in ``dims`` PCA dimensions (fitted on the first ``fit_size``), unit rows.

    The embedding used by the sampler statistics test and benchmarks (the
    BatchSampler paper's Fig. 4 setting on real data). Returns float32
    [60000, dims] and int64 labels.
    """
    images, labels = load_mnist(root, split="train")
    x = images.reshape(len(images), -1).numpy().astype(np.float32) / 255.0
    x -= x.mean(axis=0)
    _, _, vt = np.linalg.svd(x[:fit_size], full_matrices=False)
    z = x @ vt[:dims].T
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return np.ascontiguousarray(z, np.float32), labels.numpy()
