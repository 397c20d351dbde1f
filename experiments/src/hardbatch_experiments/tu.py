"""TU graph-classification datasets from the raw TU-Dortmund format, as torch-geometric data.

A dataset ``NAME`` is a folder holding ``NAME_A.txt``, ``NAME_graph_indicator.txt``,
``NAME_graph_labels.txt`` and optionally ``NAME_node_labels.txt`` (any of them may be gzipped,
``.txt.gz``). The folder is looked for at ``DIR/tu/NAME`` and ``DIR/NAME`` where ``DIR`` is
resolved by :func:`hardbatch_experiments.datasets.data_root` (``--data-dir``, ``$HARDBATCH_DATA``,
``<repo>/../shared/data``).

Parsing uses pandas' C reader (``torch_geometric.io.read_tu_data`` parses line by line in Python,
minutes for COLLAB's 25M edges); the result matches ``read_tu_data`` (tests check it on MUTAG) and
is cached as tensors under a writable folder (``--cache-dir``, ``$HARDBATCH_CACHE``, else
``~/.cache/hardbatch/tu``), keyed by the raw files' sizes and mtimes. Nothing is ever written into
the data folder (it may be read-only).

Graphs are undirected: edges are symmetrised (whether a file lists an edge in one direction or
both) and coalesced; self-loops are removed (as ``read_tu_data`` does).

Node features, as in GraphCL's unsupervised TU code:

* ``"auto"`` (default): one-hot node labels where the dataset has them, else a constant
  feature (a single 1 per node), what GraphCL's released code uses for IMDB / COLLAB / REDDIT;
* ``"labels"``, ``"constant"``, ``"degree"`` (one-hot degree capped at ``degree_cap``; degrees
  above the cap share the last slot) force one kind.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from .datasets import DataNotFoundError, data_root

__all__ = ["TUGraphs", "find_tu_folder", "load_tu", "read_tu_raw", "tu_cache_dir"]

FEATURES = ("auto", "labels", "degree", "constant")
_CACHE_VERSION = 2  # 2: "auto" means constant (not degree) without node labels


def tu_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Writable cache folder: ``cache_dir``, ``$HARDBATCH_CACHE/tu`` or ``~/.cache/hardbatch/tu``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("HARDBATCH_CACHE"):
        return Path(os.environ["HARDBATCH_CACHE"]).expanduser() / "tu"
    return Path.home() / ".cache" / "hardbatch" / "tu"


def find_tu_folder(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The raw folder of TU dataset ``name`` (``DIR/tu/NAME``, ``DIR/NAME`` or ``DIR`` itself)."""
    root = data_root(data_dir)
    candidates = [root / "tu" / name, root / name, root]
    for folder in candidates:
        if _raw_file(folder, name, "A") is not None:
            return folder
    where = ", ".join(str(c) for c in candidates)
    raise DataNotFoundError(f"TU dataset {name}: {name}_A.txt(.gz) not found in {where}; pass "
                            "--data-dir pointing at a folder holding tu/NAME/ (raw TU format)")


def _raw_file(folder: Path, name: str, part: str) -> Path | None:
    for suffix in (".txt", ".txt.gz"):
        path = folder / f"{name}_{part}{suffix}"
        if path.is_file():
            return path
    return None


def _read_ints(path: Path, columns: int | None = None) -> np.ndarray:
    import pandas as pd

    frame = pd.read_csv(path, header=None, sep=",", engine="c", dtype=np.int64,
                        skipinitialspace=True, compression="infer")
    arr = frame.to_numpy()
    if columns is not None and arr.shape[1] < columns:
        raise ValueError(f"{path}: expected {columns} comma-separated columns, got {arr.shape[1]}")
    return arr


def read_tu_raw(folder: str | os.PathLike, name: str) -> dict:
    """Parse a raw TU folder: ``{edge_index [2,E] (0-based global ids), node_graph [n],
    graph_labels [G], node_labels [n] or None}`` as int64 tensors/arrays (edges symmetrised,
    coalesced, no self-loops)."""
    folder = Path(folder)
    a_path = _raw_file(folder, name, "A")
    gi_path = _raw_file(folder, name, "graph_indicator")
    gl_path = _raw_file(folder, name, "graph_labels")
    missing = [p for p, f in (("A", a_path), ("graph_indicator", gi_path),
                              ("graph_labels", gl_path)) if f is None]
    if missing:
        raise DataNotFoundError(f"TU dataset {name} in {folder}: missing "
                                + ", ".join(f"{name}_{m}.txt(.gz)" for m in missing))
    edges = _read_ints(a_path, 2)[:, :2] - 1
    node_graph = _read_ints(gi_path)[:, 0] - 1
    graph_labels = _read_ints(gl_path)[:, 0]
    nl_path = _raw_file(folder, name, "node_labels")
    node_labels = None
    if nl_path is not None:
        nl = _read_ints(nl_path)
        node_labels = nl[:, 0] if nl.shape[1] == 1 else nl
    n = node_graph.shape[0]
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"{a_path}: node ids outside [1, {n}] (the graph indicator's length)")
    # symmetrise, drop self-loops, coalesce (sorted by row then column, unique)
    src, dst = edges[:, 0], edges[:, 1]
    both = np.concatenate([np.stack([src, dst]), np.stack([dst, src])], axis=1)
    both = both[:, both[0] != both[1]]
    key = np.unique(both[0] * n + both[1])
    edge_index = np.stack([key // n, key % n])
    if (node_graph[edge_index[0]] != node_graph[edge_index[1]]).any():
        raise ValueError(f"{a_path}: an edge joins nodes of two different graphs")
    return {"edge_index": edge_index, "node_graph": node_graph, "graph_labels": graph_labels,
            "node_labels": node_labels}


def _one_hot(values: np.ndarray) -> np.ndarray:
    """One-hot of integer labels (each column of a 2-D array separately, concatenated),
    the encoding of ``read_tu_data``: value v -> slot v - min."""
    if values.ndim == 1:
        values = values[:, None]
    blocks = []
    for col in values.T:
        col = col - col.min()
        out = np.zeros((col.shape[0], int(col.max()) + 1), dtype=np.float32)
        out[np.arange(col.shape[0]), col] = 1.0
        blocks.append(out)
    return np.concatenate(blocks, axis=1)


def _features(raw: dict, features: str, degree_cap: int) -> tuple[np.ndarray, str]:
    n = raw["node_graph"].shape[0]
    kind = features
    if kind == "auto":
        kind = "labels" if raw["node_labels"] is not None else "constant"
    if kind == "labels":
        if raw["node_labels"] is None:
            raise ValueError("features='labels' but the dataset has no NAME_node_labels.txt; use "
                             "'degree' or 'constant'")
        return _one_hot(raw["node_labels"]), kind
    if kind == "degree":
        deg = np.bincount(raw["edge_index"][0], minlength=n)
        cap = int(min(degree_cap, deg.max() if n else 0))
        out = np.zeros((n, cap + 1), dtype=np.float32)
        out[np.arange(n), np.minimum(deg, cap)] = 1.0
        return out, kind
    if kind == "constant":
        return np.ones((n, 1), dtype=np.float32), kind
    raise ValueError(f"features={features!r} must be one of {FEATURES}")


class TUGraphs(torch.utils.data.Dataset):
    """A TU dataset held as one big CSR-like graph (a torch-geometric ``InMemoryDataset`` layout).

    ``dataset[i]`` is a ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y`` and
    ``idx`` (= i, so a collated ``Batch`` knows its graph ids: ``batch.idx``); Data objects are
    built once and cached. ``collate(ids)`` builds the ``Batch`` of graphs ``ids`` directly from
    the flat tensors (the fast path; same result as ``Batch.from_data_list``).

    Attributes: ``x`` [n, F], ``edge_index`` [2, E] (global ids, sorted by graph), ``node_ptr``
    [G+1], ``edge_ptr`` [G+1], ``y`` [G] (0..C-1), ``name``, ``feature_kind``,
    ``label_values`` (the original label of each class id).
    """

    def __init__(self, name: str, x: torch.Tensor, edge_index: torch.Tensor,
                 node_ptr: torch.Tensor, edge_ptr: torch.Tensor, y: torch.Tensor,
                 feature_kind: str, label_values: list) -> None:
        self.name, self.x, self.edge_index = name, x, edge_index
        self.node_ptr, self.edge_ptr, self.y = node_ptr, edge_ptr, y
        self.feature_kind, self.label_values = feature_kind, label_values
        self._cache: list | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1

    @property
    def num_nodes(self) -> torch.Tensor:
        return self.node_ptr[1:] - self.node_ptr[:-1]

    def __getitem__(self, i: int):
        if self._cache is None:
            self._cache = [None] * len(self)
        data = self._cache[i]
        if data is None:
            from torch_geometric.data import Data

            n0, n1 = int(self.node_ptr[i]), int(self.node_ptr[i + 1])
            e0, e1 = int(self.edge_ptr[i]), int(self.edge_ptr[i + 1])
            data = Data(x=self.x[n0:n1], edge_index=self.edge_index[:, e0:e1] - n0,
                        y=self.y[i:i + 1], idx=torch.tensor([i]), num_nodes=n1 - n0)
            self._cache[i] = data
        return data

    def collate(self, ids) -> torch_geometric.data.Batch:  # noqa: F821
        """``Batch`` of graphs ``ids`` built from the flat tensors (vectorised gathers)."""
        from torch_geometric.data import Batch

        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        nn = self.node_ptr[ids + 1] - self.node_ptr[ids]
        ne = self.edge_ptr[ids + 1] - self.edge_ptr[ids]
        node_src = _ranges(self.node_ptr[ids], nn)
        edge_src = _ranges(self.edge_ptr[ids], ne)
        new_ptr = torch.zeros(ids.numel() + 1, dtype=torch.int64)
        torch.cumsum(nn, 0, out=new_ptr[1:])
        shift = torch.repeat_interleave(new_ptr[:-1] - self.node_ptr[ids], ne)
        batch = Batch(x=self.x[node_src], edge_index=self.edge_index[:, edge_src] + shift,
                      y=self.y[ids], idx=ids,
                      batch=torch.repeat_interleave(torch.arange(ids.numel()), nn),
                      ptr=new_ptr)
        batch._num_graphs = int(ids.numel())
        return batch


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``arange(s, s + l)`` for each (s, l)."""
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    offs = torch.repeat_interleave(starts - (torch.cumsum(lengths, 0) - lengths), lengths)
    return torch.arange(total) + offs


def _fingerprint(folder: Path, name: str) -> str:
    parts = []
    for f in sorted(folder.glob(f"{name}_*")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def load_tu(name: str, data_dir: str | os.PathLike | None = None, *,
            cache_dir: str | os.PathLike | None = None, features: str = "auto",
            degree_cap: int = 64, use_cache: bool = True) -> TUGraphs:
    """Load TU dataset ``name`` (see the module docstring); cached as tensors after the first call.

    Raises:
        DataNotFoundError: the raw folder or one of its required files is missing.
    """
    if features not in FEATURES:
        raise ValueError(f"features={features!r} must be one of {FEATURES}")
    folder = find_tu_folder(name, data_dir)
    cache_path = None
    if use_cache:
        key = f"v{_CACHE_VERSION}-{_fingerprint(folder, name)}-{features}-{degree_cap}"
        cache_path = tu_cache_dir(cache_dir) / name / f"processed-{key}.pt"
        if cache_path.is_file():
            try:
                state = torch.load(cache_path, weights_only=True)  # tensors, str, ints only
                return TUGraphs(name, **state)
            except Exception:  # a torn or incompatible cache file: rebuild it
                pass
    raw = read_tu_raw(folder, name)
    x, kind = _features(raw, features, degree_cap)
    node_graph = raw["node_graph"]
    num_graphs = raw["graph_labels"].shape[0]
    if node_graph.size and (np.diff(node_graph) < 0).any():
        raise ValueError(f"{name}_graph_indicator: nodes must be grouped by graph (non-decreasing)")
    counts = np.bincount(node_graph, minlength=num_graphs)
    if counts.shape[0] != num_graphs:
        raise ValueError(f"{name}: graph indicator names {counts.shape[0]} graphs but "
                         f"graph_labels has {num_graphs}")
    node_ptr = np.concatenate([[0], np.cumsum(counts)])
    ei = raw["edge_index"]  # sorted by source node, hence grouped by graph
    edge_counts = np.bincount(node_graph[ei[0]], minlength=num_graphs)
    edge_ptr = np.concatenate([[0], np.cumsum(edge_counts)])
    values, y = np.unique(raw["graph_labels"], return_inverse=True)
    state = {
        "x": torch.from_numpy(x), "edge_index": torch.from_numpy(ei.astype(np.int64)),
        "node_ptr": torch.from_numpy(node_ptr.astype(np.int64)),
        "edge_ptr": torch.from_numpy(edge_ptr.astype(np.int64)),
        "y": torch.from_numpy(y.astype(np.int64)), "feature_kind": kind,
        "label_values": [int(v) for v in values],
    }
    if cache_path is not None:
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.tmp")
            torch.save(state, tmp)
            os.replace(tmp, cache_path)
            (cache_path.parent / "source.json").write_text(json.dumps({"folder": str(folder)}))
        except OSError:
            pass  # caching is an optimisation only
    return TUGraphs(name, **state)
