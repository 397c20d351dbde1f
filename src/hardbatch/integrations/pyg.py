"""PyTorch Geometric integration: hardbatch samplers over datasets of graphs.

A hardbatch sampler is a batch sampler over item ids, so it plugs straight into PyG's loader::

    from torch_geometric.loader import DataLoader
    from hardbatch.integrations.pyg import IndexedGraphDataset, augment_batch, tu_dataset

    data = IndexedGraphDataset(tu_dataset(root, "MUTAG"))   # adds data.item_id
    bank = hb.EmbeddingBank(len(data), dim=128)
    sampler = hb.ProximityGraphSampler(bank, batch_size=128, candidates=100, neighbors=50)
    loader = DataLoader(data, batch_sampler=sampler)          # batch_size / shuffle left unset
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            z1, z2 = model(augment_batch(batch)), model(augment_batch(batch))  # [num_graphs, d]
            loss = criterion(z1, z2)
            ...
            bank.update(batch.item_id, z1.detach())

:func:`tu_dataset` is PyG's ``TUDataset`` over the raw TU-Dortmund layout as distributed
(``ROOT/NAME/NAME_A.txt``, ``NAME_graph_indicator.txt``, ... without PyG's ``raw/`` folder,
possibly read-only, some files gzipped): it reads them in place and keeps PyG's processed
tensors in a writable cache. GraphCL's augmentations (node dropping, edge perturbation,
attribute masking, subgraph) are public in :mod:`hardbatch.integrations.pyg_augment` and
re-exported here (:func:`augment_batch` on a PyG ``Batch``, :func:`augment` on tensors).

``IndexedGraphDataset`` stores each graph's position as the graph-level attribute ``item_id``
(PyG batches it into a ``[num_graphs]`` tensor; the name avoids ``"index"``, which PyG would
offset by the node count). To refresh from a fresh encoding pass instead of a bank, pass
``embedding_source(model, dataset)`` as the sampler's embeddings.

torch_geometric is imported only inside the functions that need it.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .._device import resolve_device
from .pyg_augment import AUGMENTATIONS, augment, augment_batch, augment_released

__all__ = ["AUGMENTATIONS", "IndexedGraphDataset", "augment", "augment_batch",
           "augment_released", "embedding_source", "graph_embeddings", "tu_dataset",
           "update_bank"]

ITEM_KEY = "item_id"


class IndexedGraphDataset(torch.utils.data.Dataset):
    """Wraps a PyG dataset (or a list of ``Data``) so that graph ``i`` carries ``item_id = i``.

    Items are shallow copies: the wrapped dataset's graphs are not modified. ``key``: the
    attribute's name (default ``"item_id"``).

    Example:
        >>> import torch
        >>> from torch_geometric.data import Data
        >>> triangle = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])  # both directions
        >>> graphs = [Data(x=torch.ones(3, 8), edge_index=triangle) for _ in range(4)]
        >>> from hardbatch.integrations.pyg import IndexedGraphDataset
        >>> data = IndexedGraphDataset(graphs)
        >>> data[2].item_id
        tensor([2])
        >>> from torch_geometric.loader import DataLoader
        >>> batch = next(iter(DataLoader(data, batch_sampler=[[3, 0]])))  # a sampler's batch
        >>> batch.item_id, batch.num_graphs
        (tensor([3, 0]), 2)
    """

    def __init__(self, dataset, key: str = ITEM_KEY) -> None:
        if "index" in key or "face" in key:
            raise ValueError(
                f"key={key!r}: PyG offsets attributes whose name contains 'index' "
                "or 'face' when batching; use a name such as 'item_id'"
            )
        self.dataset = dataset
        self.key = key

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        if not isinstance(i, int):
            i = int(i)
        data = copy.copy(self.dataset[i])
        data[self.key] = torch.tensor([i], dtype=torch.long)
        return data


def update_bank(bank, batch, embeddings: torch.Tensor, key: str = ITEM_KEY) -> None:
    """``bank.update(batch.item_id, embeddings)`` for a PyG ``Batch`` of an indexed dataset
    (``key``: the ids' attribute, as given to :class:`IndexedGraphDataset`).

    Example:
        >>> import hardbatch as hb
        >>> from hardbatch.integrations.pyg import IndexedGraphDataset, update_bank
        >>> import torch
        >>> from torch_geometric.data import Data
        >>> triangle = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])  # both directions
        >>> graphs = [Data(x=torch.ones(3, 8), edge_index=triangle) for _ in range(4)]
        >>> from torch_geometric.loader import DataLoader
        >>> batch = next(iter(DataLoader(IndexedGraphDataset(graphs), batch_sampler=[[3, 0]])))
        >>> bank = hb.EmbeddingBank(4, 8)
        >>> update_bank(bank, batch, torch.ones(2, 8))  # rows 3 and 0
        >>> bank.filled
        0.5
    """
    if key not in batch:
        raise ValueError(
            f"the batch has no '{key}' attribute: wrap the dataset in "
            "IndexedGraphDataset so that graphs carry their ids"
        )
    bank.update(batch[key].reshape(-1), embeddings.detach().float())


@torch.no_grad()
def graph_embeddings(
    model: nn.Module,
    dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
) -> torch.Tensor:
    """Graph-level embeddings ``[N, d]`` of every graph in ``dataset``, in dataset order.

    ``model(batch)`` must return ``[num_graphs, d]`` for a PyG ``Batch``. Runs in eval mode
    (training mode restored) without gradients; returns a float32 CPU tensor. ``batch_size``
    graphs per forward pass, on ``device``, loaded by ``num_workers`` DataLoader workers.

    Example:
        >>> import torch
        >>> from torch_geometric.nn import global_mean_pool
        >>> class MeanPool(torch.nn.Module):  # model(batch) -> [num_graphs, d]
        ...     def forward(self, batch):
        ...         return global_mean_pool(batch.x, batch.batch)
        >>> from torch_geometric.data import Data
        >>> triangle = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])  # both directions
        >>> graphs = [Data(x=torch.ones(3, 8), edge_index=triangle) for _ in range(4)]
        >>> from hardbatch.integrations.pyg import graph_embeddings
        >>> graph_embeddings(MeanPool(), graphs, batch_size=3).shape
        torch.Size([4, 8])
    """
    from torch_geometric.loader import DataLoader

    device = resolve_device(device)
    was_training = model.training
    model.eval()
    try:
        out = []
        for batch in DataLoader(
            dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers
        ):
            z = model(batch.to(device))
            if z.ndim != 2 or z.shape[0] != batch.num_graphs:
                raise ValueError(
                    f"model(batch) must return [num_graphs, d] = "
                    f"[{batch.num_graphs}, d], got {tuple(z.shape)}"
                )
            out.append(z.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out)


def embedding_source(
    model: nn.Module, dataset, batch_size: int = 256, device: str | torch.device = "cpu"
) -> Callable[[], torch.Tensor]:
    """A callable embedding source for samplers: a fresh :func:`graph_embeddings` pass per call
    (``model``, ``dataset``, ``batch_size``, ``device``: as there).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> from torch_geometric.data import Data
        >>> triangle = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])  # both directions
        >>> graphs = [Data(x=torch.ones(3, 8), edge_index=triangle) for _ in range(4)]
        >>> from torch_geometric.nn import global_add_pool
        >>> class SumPool(torch.nn.Module):  # model(batch) -> [num_graphs, d]
        ...     def forward(self, batch):
        ...         return global_add_pool(batch.x, batch.batch)
        >>> from hardbatch.integrations.pyg import embedding_source
        >>> source = embedding_source(SumPool(), graphs)  # a fresh pass at every refresh
        >>> source().shape, len(hb.UniformBatchSampler(len(graphs), 2))
        (torch.Size([4, 8]), 2)
    """
    device = resolve_device(device)
    return lambda: graph_embeddings(model, dataset, batch_size, device)


def _tu_folder(root: Path, name: str) -> Path:
    for folder in (root / name, root / name / "raw", root):
        if any((folder / f"{name}_A{ext}").is_file() for ext in (".txt", ".txt.gz")):
            return folder
    raise FileNotFoundError(
        f"TU dataset {name}: {name}_A.txt(.gz) not found in {root / name}, {root / name / 'raw'} "
        f"or {root}; pass root= the folder holding {name}/ in the raw TU-Dortmund format "
        "(nothing is downloaded)")


def _source_cache(cache: Path, folder: Path, name: str) -> Path:
    """``cache/NAME/KEY``: the cache of the TU files in ``folder``, KEY a hash of the folder's
    path and its ``NAME_*`` files' names, sizes and modification times, so another dataset of
    the same name, or edited files, never read a stale cache."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for path in sorted(folder.glob(f"{name}_*")):
        stat = path.stat()
        h.update(f"|{path.name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return cache / name / h.hexdigest()[:16]


def _raw_dir(folder: Path, name: str, cache: Path) -> Path:
    """``folder`` when all its TU files are plain text; else a cache folder (``cache``, of
    :func:`_source_cache`) holding the plain files (symlinked) and the gzipped ones
    decompressed, built once."""
    gz = sorted(folder.glob(f"{name}_*.txt.gz"))
    if not gz:
        return folder
    raw = cache / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.glob(f"{name}_*.txt")) + gz:
        target = raw / path.name.removesuffix(".gz")
        if target.exists():
            continue
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            try:
                tmp.symlink_to(path.resolve())
            except OSError:  # no symlinks here: copy
                shutil.copyfile(path, tmp)
        os.replace(tmp, target)
    return raw


_TU_CLASS = None


def _tu_class():
    """PyG's ``TUDataset`` with its raw and processed folders chosen by :func:`tu_dataset`
    (built on first use, so importing this module does not import torch_geometric)."""
    global _TU_CLASS
    if _TU_CLASS is None:
        from torch_geometric.datasets import TUDataset

        class RawTUDataset(TUDataset):
            """``TUDataset`` reading raw files from ``raw_folder`` (no ``raw/`` layout), with
            processed tensors under ``cache/NAME/KEY/processed``; never downloads."""

            def __init__(self, raw_folder: str, cache: str, name: str, **kwargs) -> None:
                self._raw_folder, self._cache = raw_folder, cache
                super().__init__(cache, name, **kwargs)

            @property
            def raw_dir(self) -> str:
                return self._raw_folder

            @property
            def processed_dir(self) -> str:
                return os.path.join(self._cache, "processed")

            def download(self) -> None:
                raise FileNotFoundError(f"TU dataset {self.name}: raw files missing in "
                                        f"{self._raw_folder} (nothing is downloaded)")

        RawTUDataset.__module__ = __name__
        RawTUDataset.__qualname__ = "RawTUDataset"
        _TU_CLASS = RawTUDataset
    return _TU_CLASS


def __getattr__(name: str):  # pickling a dataset (DataLoader workers) finds the class by name
    if name == "RawTUDataset":
        return _tu_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tu_dataset(root: str | os.PathLike, name: str, cache_dir: str | os.PathLike | None = None,
               **kwargs):
    """PyG's ``TUDataset(root, name)`` over the raw TU-Dortmund layout as distributed.

    ``TUDataset`` expects ``ROOT/NAME/raw/NAME_A.txt`` and writes ``ROOT/NAME/processed``; the
    TU files as distributed (and as ``shared/data/tu`` holds them) lie in ``ROOT/NAME/``
    directly, may be read-only and may be gzipped (``NAME_A.txt.gz``). This reads them in
    place (gzipped files are decompressed once into the cache) and writes PyG's processed
    tensors into ``cache_dir/NAME/KEY/processed`` (KEY: a hash of the source folder and its
    files' names, sizes and modification times); nothing is written into ``root`` and nothing
    is downloaded. Graphs, features and labels are exactly ``TUDataset``'s (``read_tu_data``).

    Args:
        root: the folder holding ``NAME/`` (or ``NAME/raw/``, PyG's layout, or the files
            themselves).
        name: the dataset name, e.g. ``"MUTAG"``.
        cache_dir: writable folder for the processed tensors (default:
            ``$HARDBATCH_CACHE/pyg_tu``, else ``~/.cache/hardbatch/pyg_tu``).
        kwargs: ``TUDataset``'s options (``transform``, ``use_node_attr``, ...).

    The one-line alternative with plain PyG, for plain-text files in a writable folder:
    ``os.symlink(ROOT / NAME, ROOT / NAME / "raw")`` once, then ``TUDataset(ROOT, NAME)``.

    Example:
        >>> import pathlib, tempfile
        >>> import numpy as np
        >>> from hardbatch.integrations.pyg import tu_dataset
        >>> tmp = tempfile.TemporaryDirectory()
        >>> folder = pathlib.Path(tmp.name, "TOY")  # two triangles in the TU-Dortmund layout
        >>> folder.mkdir()
        >>> edges = [(a + g, b + g) for g in (0, 3) for a, b in ((1, 2), (2, 3), (3, 1))]
        >>> np.savetxt(folder / "TOY_A.txt", edges + [(b, a) for a, b in edges], fmt="%d",
        ...            delimiter=", ")
        >>> np.savetxt(folder / "TOY_graph_indicator.txt", [1, 1, 1, 2, 2, 2], fmt="%d")
        >>> np.savetxt(folder / "TOY_graph_labels.txt", [0, 1], fmt="%d")
        >>> dataset = tu_dataset(tmp.name, "TOY", cache_dir=pathlib.Path(tmp.name, "cache"))
        >>> len(dataset), dataset[0]
        (2, Data(edge_index=[2, 6], y=[1], num_nodes=3))
        >>> tmp.cleanup()
    """
    root = Path(root).expanduser()
    folder = _tu_folder(root, name)
    if cache_dir is None:
        base = os.environ.get("HARDBATCH_CACHE")
        cache_dir = (Path(base) if base else Path.home() / ".cache" / "hardbatch") / "pyg_tu"
    cache = _source_cache(Path(cache_dir).expanduser(), folder, name)
    raw = _raw_dir(folder, name, cache)
    return _tu_class()(str(raw), str(cache), name, **kwargs)
