"""Offline dataset loaders: scikit-learn's bundled digits, MNIST (IDX) and CIFAR-10 (JPEG zip or
torchvision's pickled batches).

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

__all__ = ["CIFAR10_CLASSES", "ENV_VAR", "DataNotFoundError", "data_root", "load_cifar10",
           "load_digits", "load_mnist", "mnist_pca"]

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
    # experiments/src/hardbatch_experiments/datasets.py -> <repo>; the shared data folder sits beside it.
    return Path(__file__).resolve().parents[3].parent / "shared" / "data"


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
        raise ImportError("load_digits needs scikit-learn: pip install scikit-learn (a dependency of hardbatch-experiments)") from exc
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


# ------------------------------------------------------------------------------------ CIFAR-10
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
_CIFAR_ZIP = "cifar10_jpg.zip"
_CIFAR_PY = "cifar-10-batches-py"
_CIFAR_PY_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hardbatch"


def _cifar_zip_arrays(path: Path, cache_dir: Path | None) -> dict[str, np.ndarray]:
    """Decode every JPEG of the zip once (PIL) into uint8 [N, 3, 32, 32] per split; cached as
    ``cache_dir/cifar10_uint8_<size>_<mtime>.npz`` (keyed by the zip's size and mtime)."""
    stat = path.stat()
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"cifar10_uint8_{stat.st_size}_{int(stat.st_mtime)}.npz"
        if cache.is_file():
            try:
                with np.load(cache) as z:
                    return {k: z[k] for k in z.files}
            except (OSError, ValueError):  # a damaged cache file: decode again
                pass
    import io
    import zipfile

    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading CIFAR-10 JPEGs needs Pillow: pip install pillow") from exc
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as zf:
        names = sorted(n for n in zf.namelist() if n.lower().endswith((".jpg", ".jpeg", ".png")))
        for split in ("train", "test"):
            members = [n for n in names if n.split("/")[-3:-2] == [split]]
            images = np.empty((len(members), 32, 32, 3), dtype=np.uint8)
            labels = np.empty(len(members), dtype=np.int64)
            for i, name in enumerate(members):
                cls = name.split("/")[-2]
                if cls not in CIFAR10_CLASSES:
                    raise ValueError(f"{path}: {name} is in an unknown class folder {cls!r}; "
                                     f"expected one of {CIFAR10_CLASSES}")
                with Image.open(io.BytesIO(zf.read(name))) as im:
                    arr = np.asarray(im.convert("RGB"))
                if arr.shape != (32, 32, 3):
                    raise ValueError(f"{path}: {name} is {arr.shape[1]}x{arr.shape[0]}, "
                                     "CIFAR-10 images are 32x32")
                images[i] = arr
                labels[i] = CIFAR10_CLASSES.index(cls)
            out[f"{split}_x"] = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
            out[f"{split}_y"] = labels
    if not len(out["train_y"]) and not len(out["test_y"]):
        raise ValueError(f"{path} holds no train/<class>/*.jpg or test/<class>/*.jpg images")
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp.npz")
            np.savez(tmp, **out)
            os.replace(tmp, cache)
        except OSError:  # read-only home: no cache, still works
            pass
    return out


def _cifar_pickles(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    import pickle

    xs, ys = [], []
    for name in _CIFAR_PY_FILES[split]:
        f = folder / name
        if not f.is_file():
            raise DataNotFoundError(f"CIFAR-10 batch {f} is missing (torchvision's "
                                    f"{_CIFAR_PY} layout has data_batch_1..5 and test_batch)")
        with open(f, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        data = np.asarray(d[b"data"] if b"data" in d else d["data"], dtype=np.uint8)
        labels = d.get(b"labels", d.get("labels"))
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(np.asarray(labels, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def load_cifar10(root: str | os.PathLike | None = None, split: str = "train", *,
                 cache_dir: str | os.PathLike | None | bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10 (Krizhevsky 2009) from local files; never downloads.

    Looked for, in order, under the data root (:func:`data_root`: ``root``,
    ``$HARDBATCH_DATA``, ``<repo>/../shared/data``): ``images/cifar10/cifar10_jpg.zip``,
    ``cifar10/cifar10_jpg.zip``, ``cifar10_jpg.zip`` (JPEGs as ``train|test/<class>/NNNN.jpg``),
    then torchvision's ``cifar-10-batches-py`` folder (pickled batches) in ``images/cifar10``,
    ``cifar10`` or the root. ``root`` may also be the zip file or the pickle folder itself.

    The zip is decoded once (about 20 s for 60,000 JPEGs) and cached as uint8 arrays in
    ``cache_dir`` (default ``~/.cache/hardbatch``; False: no cache), keyed by the zip's size
    and modification time.

    Args:
        root: data folder, the zip, or the ``cifar-10-batches-py`` folder.
        split: ``"train"`` (50,000 images) or ``"test"`` (10,000).

    Returns:
        ``(images, labels)``: uint8 ``[N, 3, 32, 32]`` and int64 ``[N]`` (classes in
        :data:`CIFAR10_CLASSES` order, torchvision's). Zip images are ordered by class folder,
        then file name.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} must be 'train' or 'test'")
    if cache_dir is True:
        cache: Path | None = _default_cache_dir()
    elif cache_dir in (False, None):
        cache = None
    else:
        cache = Path(cache_dir)
    given = Path(root).expanduser() if root is not None else None
    if given is not None and given.is_file():
        arrays = _cifar_zip_arrays(given, cache)
        return (torch.from_numpy(arrays[f"{split}_x"]), torch.from_numpy(arrays[f"{split}_y"]))
    if given is not None and given.name == _CIFAR_PY and given.is_dir():
        x, y = _cifar_pickles(given, split)
        return torch.from_numpy(x), torch.from_numpy(y)
    base = data_root(root)
    zips = [base / "images" / "cifar10" / _CIFAR_ZIP, base / "cifar10" / _CIFAR_ZIP,
            base / _CIFAR_ZIP]
    for z in zips:
        if z.is_file():
            arrays = _cifar_zip_arrays(z, cache)
            return (torch.from_numpy(arrays[f"{split}_x"]),
                    torch.from_numpy(arrays[f"{split}_y"]))
    folders = [base / "images" / "cifar10" / _CIFAR_PY, base / "cifar10" / _CIFAR_PY,
               base / _CIFAR_PY]
    for f in folders:
        if f.is_dir():
            x, y = _cifar_pickles(f, split)
            return torch.from_numpy(x), torch.from_numpy(y)
    where = ", ".join(str(p) for p in zips + folders)
    raise DataNotFoundError(f"CIFAR-10 not found (looked for {where}); point root=... or "
                            f"${ENV_VAR} at a folder holding images/cifar10/{_CIFAR_ZIP}")
