"""GraphCL on TU datasets with hardbatch's samplers and losses (BatchSampler paper, Table 3 / E.2).

One run = (dataset, sampler, loss, seed): train GraphCL (You et al. 2020, unsupervised TU setting)
with batches from the chosen sampler, embed every graph with the frozen encoder (the 96-d
concatenated sum-pooled readout of a 3-layer GIN), and score the embeddings with an RBF SVM
(C chosen by 5-fold inner CV over 1e-3..1e3) under 10-fold stratified CV, as GraphCL's
``evaluate_embedding``. Each run writes one JSON (atomically); an existing JSON means the run is
done and is skipped, so a grid can be completed in pieces.

Model and training follow GraphCL's ``unsupervised_TU`` code: GIN layers
``relu(GINConv(MLP)) -> BatchNorm``, hidden 32, sum pooling of every layer, concatenated (96-d);
projection head ``Linear-ReLU-Linear`` (96-96-96); Xavier-uniform init; Adam lr 0.01;
temperature 0.2. Views (``--views``): ``orig+aug`` (default, GraphCL's released code: the anchor
is the original graph, the positive one augmentation drawn per graph from the four) or
``aug+aug`` (both views augmented independently, the paper's description). Augmentations
(``--aug-style paper``, default) follow the GraphCL paper's description at ratio 0.2: node
dropping, edge perturbation (removal of undirected edges, as the released code only removes),
attribute masking with N(0.5, 0.5) noise (the released code's), subgraph = random expansion
keeping 80% of the nodes; applied to a whole collated batch at once (:func:`augment`).
``--aug-style released`` reproduces the released ``unsupervised_TU`` code instead, which differs
(:func:`augment_released`: 10% ratios, node dropping that keeps only the chosen nodes' edges, a
subgraph that removes the start node's neighbourhood, self-loops on the anchor and evaluated
graphs).

Samplers read an :class:`hardbatch.EmbeddingBank` of the anchor view's readout, updated (detached)
at every training step. The bank starts from one encoding pass of the untrained encoder
(``--bank-init encode``, like the initial ``get_embeddings`` of GraphCL's script), so the first
graph of a sampler is built from real (if untrained) embeddings; ``--bank-init random`` keeps the
bank's random init.

Usage::

    python -m hardbatch.recipes.graphcl --dataset MUTAG --sampler all --loss infonce --seeds 5 \
        --out results/graphs/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit
from torch import Tensor, nn

from .._rng import rand_below
from . import _runs

__all__ = [
    "DEFAULTS",
    "GINEncoder",
    "GraphCL",
    "add_graphcl_parser",
    "augment",
    "augment_released",
    "build_parser",
    "evaluate_embeddings",
    "main",
    "released_self_loops",
    "result_path",
    "run_graphcl",
    "run_one",
]

SAMPLERS = ("uniform", "knn", "proximity", "gcbs")
LOSSES = ("infonce", "dcl", "hcl")
AUGS = ("dnodes", "pedges", "mask_nodes", "subgraph")


@dataclass(frozen=True)
class Hyper:
    batch_size: int
    epochs: int
    refresh_every: int
    candidates: int
    neighbors: int


# BatchSampler paper, Table 15: B / epochs / t / M / K
DEFAULTS = {
    "IMDB-BINARY": Hyper(256, 100, 25, 500, 100),
    "COLLAB": Hyper(128, 20, 50, 1000, 100),
    "REDDIT-BINARY": Hyper(128, 50, 50, 500, 100),
    "PROTEINS": Hyper(128, 20, 50, 500, 100),
    "MUTAG": Hyper(128, 20, 50, 100, 50),
    "NCI1": Hyper(128, 20, 50, 1000, 100),
    "IMDB-MULTI": Hyper(128, 50, 25, 500, 100),
}
FALLBACK = Hyper(128, 20, 50, 1000, 100)
ALIASES = {"IMDB-B": "IMDB-BINARY", "IMDB-M": "IMDB-MULTI", "REDDIT-B": "REDDIT-BINARY"}


# ------------------------------------------------------------------------------- augmentations
@njit(cache=True)
def _augment_kernel(ptr, rowptr, col, choice, ratio, seed):
    """Per graph g (nodes ptr[g]..ptr[g+1], CSR rows sorted by column): choice 0 drops
    floor(ratio n) nodes, 1 removes floor(ratio m) of the m undirected edges, 2 masks
    floor(ratio n) nodes, 3 keeps n - floor(ratio n) nodes grown by random expansion from a random
    node (GraphCL's subgraph: repeatedly add a uniformly random neighbour of the current set).
    Returns (node_keep, edge_keep, masked)."""
    n = rowptr.shape[0] - 1
    e_total = col.shape[0]
    node_keep = np.ones(n, dtype=np.bool_)
    edge_keep = np.ones(e_total, dtype=np.bool_)
    masked = np.zeros(n, dtype=np.bool_)
    state = np.empty(1, dtype=np.uint64)
    state[0] = np.uint64(seed)
    scratch = np.empty(max(n, e_total), dtype=np.int64)
    in_pool = np.zeros(n, dtype=np.bool_)
    for g in range(ptr.shape[0] - 1):
        a, b = ptr[g], ptr[g + 1]
        cnt = b - a
        if cnt == 0:
            continue
        k = np.int64(np.floor(cnt * ratio))
        c = choice[g]
        if c == 0 or c == 2:
            for i in range(cnt):
                scratch[i] = a + i
            for i in range(k):  # partial Fisher-Yates: scratch[:k] is a random k-subset
                j = i + rand_below(state, cnt - i)
                t = scratch[i]
                scratch[i] = scratch[j]
                scratch[j] = t
                if c == 0:
                    node_keep[scratch[i]] = False
                else:
                    masked[scratch[i]] = True
        elif c == 1:
            m = 0
            for u in range(a, b):
                for e in range(rowptr[u], rowptr[u + 1]):
                    if col[e] >= u:
                        scratch[m] = e
                        m += 1
            kd = np.int64(np.floor(m * ratio))
            for i in range(kd):
                j = i + rand_below(state, m - i)
                t = scratch[i]
                scratch[i] = scratch[j]
                scratch[j] = t
                e = scratch[i]
                edge_keep[e] = False
                # the row u of e (rowptr[u] <= e < rowptr[u + 1]), then the reverse edge (v, u)
                lo, hi = a, b - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if rowptr[mid] <= e:
                        lo = mid
                    else:
                        hi = mid - 1
                u = lo
                v = col[e]
                if v != u:
                    lo, hi = rowptr[v], rowptr[v + 1] - 1
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if col[mid] < u:
                            lo = mid + 1
                        else:
                            hi = mid
                    if lo <= rowptr[v + 1] - 1 and col[lo] == u:
                        edge_keep[lo] = False
        else:
            target = cnt - k
            for i in range(a, b):
                node_keep[i] = False
            start = a + rand_below(state, cnt)
            node_keep[start] = True
            kept = 1
            pool = 0  # scratch[:pool]: candidate neighbours of the kept set
            for e in range(rowptr[start], rowptr[start + 1]):
                v = col[e]
                if not node_keep[v] and not in_pool[v]:
                    in_pool[v] = True
                    scratch[pool] = v
                    pool += 1
            while kept < target and pool > 0:
                j = rand_below(state, pool)
                v = scratch[j]
                pool -= 1
                scratch[j] = scratch[pool]
                in_pool[v] = False
                node_keep[v] = True
                kept += 1
                for e in range(rowptr[v], rowptr[v + 1]):
                    w = col[e]
                    if not node_keep[w] and not in_pool[w]:
                        in_pool[w] = True
                        scratch[pool] = w
                        pool += 1
            for i in range(pool):
                in_pool[scratch[i]] = False
    return node_keep, edge_keep, masked


def augment(x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int, ratio: float,
            gen: torch.Generator, augs: tuple[str, ...] = AUGS,
            choice: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, dict]:
    """GraphCL's augmentations on a collated batch, one drawn per graph from ``augs``.

    Node dropping removes ``floor(ratio * n_g)`` random nodes of graph g (and their edges); edge
    perturbation removes ``floor(ratio * m_g)`` of its ``m_g`` undirected edges (both
    directions); attribute masking replaces the features of ``floor(ratio * n_g)`` nodes by
    N(0.5, 0.5) noise; subgraph keeps ``n_g - floor(ratio * n_g)`` nodes grown by random
    expansion from a random node (fewer if that node's component is smaller). One compiled pass
    over the batch (:func:`_augment_kernel`, O(n + E)), then vectorised relabelling.

    Args:
        x [n, F], edge_index [2, E] (undirected: both directions present), batch [n] graph ids
        (sorted), num_graphs G, ratio, a torch generator (drives every random choice), the
        augmentations to draw from, or ``choice`` [G] (indices into ``augs``) to force them.

    Returns:
        ``(x, edge_index, batch, info)``: the augmented batch (nodes relabelled 0..n'-1, graph
        ids unchanged, so graph g of the output is graph g of the input) and
        ``info = {"choice": [G]}``.
    """
    n = batch.numel()
    if choice is None:
        choice = torch.randint(len(augs), (num_graphs,), generator=gen)
    codes = torch.tensor([AUGS.index(a) for a in augs], dtype=torch.int64)[choice]
    counts = torch.bincount(batch, minlength=num_graphs)
    ptr = torch.zeros(num_graphs + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=ptr[1:])
    src, dst = edge_index
    order = None
    key = src * max(n, 1) + dst  # the reverse-edge lookup needs rows sorted by column too
    if key.numel() > 1 and not bool((key[1:] >= key[:-1]).all()):
        order = torch.argsort(key)
        src, dst = src[order], dst[order]
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(src, minlength=n), 0, out=rowptr[1:])
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    nk, ek, mk = _augment_kernel(ptr.numpy(), rowptr.numpy(), dst.contiguous().numpy(),
                                 codes.numpy(), float(ratio), seed)
    keep, edge_keep, masked = torch.from_numpy(nk), torch.from_numpy(ek), torch.from_numpy(mk)
    if order is not None:
        edge_keep = edge_keep[torch.argsort(order)]
    x_out = x
    n_masked = int(masked.sum())
    if n_masked:
        x_out = x.clone()
        noise = torch.randn(n_masked, x.shape[1], generator=gen) * 0.5 + 0.5
        x_out[masked] = noise.to(x.dtype)
    edge_keep &= keep[edge_index[0]] & keep[edge_index[1]]
    new_id = torch.cumsum(keep.long(), 0) - 1
    ei = new_id[edge_index[:, edge_keep]]
    return x_out[keep], ei, batch[keep], {"choice": choice}


def released_self_loops(edge_index: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
    """The self-loops GraphCL's released ``TUDataset_aug.get`` adds to every graph.

    ``get`` appends ``(i, i)`` for the local node ids ``i < edge_index.max()`` of the graph, so
    the node with the largest id that has an edge (and any later, isolated node) gets none, and
    a graph without edges gets none. The anchor view and the evaluated graphs of the released
    code carry these loops (GIN then weights a node's own features twice); its augmented view
    drops them again. Args: edge_index [2, E], batch [n] (sorted), G. Returns [2, E + loops].
    """
    n = batch.numel()
    if edge_index.shape[1] == 0 or n == 0:
        return edge_index
    top = torch.full((num_graphs,), -1, dtype=torch.int64)
    top = top.scatter_reduce(0, batch[edge_index[0]], edge_index.max(0).values, "amax")
    node = torch.arange(n)
    loops = node[node < top[batch]]
    return torch.cat([edge_index, torch.stack([loops, loops])], dim=1)


def augment_released(x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int,
                     rng: np.random.RandomState) -> tuple[Tensor, Tensor, Tensor, Tensor, dict]:
    """GraphCL's released ``unsupervised_TU`` views (``aug.py`` + ``gsimclr.py``, ``aug=random4``).

    Reproduces the released code, which differs from the GraphCL paper's description; the
    numbers of the BatchSampler paper's GraphCL rows come from that code. Per graph (n nodes,
    edges with :func:`released_self_loops`), one of four drawn uniformly:

    - ``drop_nodes``: ``int(n / 10)`` random nodes are chosen, and the edges *among them* are
      kept (the released code zeroes the adjacency of the nodes it does not drop);
    - ``permute_edges``: ``int(E / 10)`` of the E directed entries (self-loops included) are
      removed, independently per direction, nothing is added;
    - ``subgraph``: a random start node plus up to ``int(0.2 n)`` distinct random neighbours
      *of the start node* (the neighbour set never grows) are chosen, and the edges among the
      other nodes are kept;
    - ``mask_nodes``: the features of ``int(n / 10)`` random nodes become N(0.5, 0.5) noise.

    Then, as ``gsimclr.py`` does for the whole batch: nodes without any remaining edge
    (self-loops count) are removed and self-loops are dropped. The view is directed in general
    (edge perturbation), so it must be aggregated along ``edge_index`` (source -> target).

    Args:
        x [n, F], edge_index [2, E] (undirected, no self-loops, grouped by graph), batch [n]
        (sorted), G, a NumPy ``RandomState`` (drives every draw, in the released code's order).

    Returns:
        ``(anchor_edge_index, x_aug, edge_index_aug, batch_aug, info)``: the anchor's edges with
        the released self-loops (its nodes and features are unchanged), the augmented view
        (graph ids unchanged), ``info = {"choice": [G]}`` (0..3 in the order above).
    """
    anchor = released_self_loops(edge_index, batch, num_graphs)
    counts = np.bincount(batch.numpy(), minlength=num_graphs)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    edge_graph = batch.numpy()[anchor[0].numpy()]
    order = np.argsort(edge_graph, kind="stable")
    ei = anchor.numpy()[:, order]
    eptr = np.searchsorted(edge_graph[order], np.arange(num_graphs + 1))
    x_aug = x.clone()
    present = np.zeros(batch.numel(), dtype=bool)
    kept_edges, choice = [], np.empty(num_graphs, dtype=np.int64)
    for g in range(num_graphs):
        a, n = int(ptr[g]), int(counts[g])
        e = ei[:, eptr[g]:eptr[g + 1]] - a
        c = choice[g] = rng.randint(4)
        if n == 0:
            continue
        if c == 0:
            chosen = rng.choice(n, int(n / 10), replace=False)
            keep = np.isin(e[0], chosen) & np.isin(e[1], chosen)
        elif c == 1:
            m = e.shape[1]
            keep = np.zeros(m, dtype=bool)
            keep[rng.choice(m, m - int(m / 10), replace=False)] = True
        elif c == 2:
            sub_num = int(n * 0.2)
            idx_sub = [rng.randint(n, size=1)[0]]
            idx_neigh = set(e[1][e[0] == idx_sub[0]])
            count = 0
            while len(idx_sub) <= sub_num:
                count += 1
                if count > n or not idx_neigh:
                    break
                node = rng.choice(list(idx_neigh))
                if node not in idx_sub:
                    idx_sub.append(node)
            keep = ~np.isin(e[0], idx_sub) & ~np.isin(e[1], idx_sub)
        else:
            chosen = rng.choice(n, int(n / 10), replace=False)
            noise = rng.normal(loc=0.5, scale=0.5, size=(len(chosen), x.shape[1]))
            x_aug[torch.from_numpy(a + chosen)] = torch.from_numpy(noise).to(x.dtype)
            keep = np.ones(e.shape[1], dtype=bool)
        kept = e[:, keep]
        if c in (0, 2):  # adjacency-matrix round trip: duplicates merged, rows sorted
            kept = np.unique(kept[0] * n + kept[1])
            kept = np.stack([kept // n, kept % n])
        kept = kept + a
        present[kept[0]] = True
        present[kept[1]] = True
        kept_edges.append(kept[:, kept[0] != kept[1]])
    keep_t = torch.from_numpy(present)
    new_id = torch.cumsum(keep_t.long(), 0) - 1
    eo = (torch.from_numpy(np.concatenate(kept_edges, axis=1)) if kept_edges
          else torch.zeros(2, 0, dtype=torch.int64))
    return anchor, x_aug[keep_t], new_id[eo], batch[keep_t], {"choice": torch.from_numpy(choice)}


# ------------------------------------------------------------------------------- model
class GINEncoder(nn.Module):
    """GraphCL's ``gin.Encoder``: ``relu(GINConv(MLP)) -> BatchNorm`` per layer; readout is the
    concatenation of every layer's sum-pooled node features (``layers * hidden``)."""

    def __init__(self, in_dim: int, hidden: int = 32, layers: int = 3) -> None:
        super().__init__()
        from torch_geometric.nn import GINConv

        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        for i in range(layers):
            mlp = nn.Sequential(nn.Linear(in_dim if i == 0 else hidden, hidden), nn.ReLU(),
                                nn.Linear(hidden, hidden))
            self.convs.append(GINConv(mlp))
            self.bns.append(nn.BatchNorm1d(hidden))
        self.out_dim = hidden * layers

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int,
                undirected: bool = True) -> Tensor:
        from torch_geometric.nn import global_add_pool

        adj = _adjacency_csr(edge_index, x.shape[0], undirected)
        pooled = []
        for conv, bn in zip(self.convs, self.bns):
            x = bn(F.relu(conv(x, adj)))
            pooled.append(global_add_pool(x, batch, size=num_graphs))
        return torch.cat(pooled, dim=1)


def _adjacency_csr(edge_index: Tensor, n: int, undirected: bool = True) -> Tensor:
    """``adj_t`` as a torch sparse CSR matrix (row = target, column = source) for GINConv.

    Sum aggregation as one sparse-dense product instead of gathering a message per edge and
    scattering it back: 2.5x faster forward + backward on CPU for COLLAB-size batches, with the
    same result. For ``undirected`` graphs (both directions present, the case of every TU
    graph and of :func:`augment`'s output) ``adj_t = adj``, so the edges, already grouped by
    source, are used as they are; otherwise they are sorted by target.
    """
    src, dst = edge_index[0], edge_index[1]
    rows, cols = (src, dst) if undirected else (dst, src)
    if rows.numel() > 1 and not bool((rows[1:] >= rows[:-1]).all()):
        order = torch.argsort(rows, stable=True)
        rows, cols = rows[order], cols[order]
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=n), 0, out=rowptr[1:])
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(rowptr, cols, torch.ones(cols.numel()), (n, n),
                                       check_invariants=False)


class GraphCL(nn.Module):
    """Encoder plus GraphCL's projection head ``Linear-ReLU-Linear`` (width = readout width)."""

    def __init__(self, in_dim: int, hidden: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.encoder = GINEncoder(in_dim, hidden, layers)
        d = self.encoder.out_dim
        self.proj_head = nn.Sequential(nn.Linear(d, d), nn.ReLU(inplace=True), nn.Linear(d, d))
        for m in self.modules():  # GraphCL's init_emb
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x, edge_index, batch, num_graphs,
                undirected: bool = True) -> tuple[Tensor, Tensor]:
        h = self.encoder(x, edge_index, batch, num_graphs, undirected)
        return h, self.proj_head(h)


@torch.no_grad()
def embed_all(model: GraphCL, dataset, batch_size: int = 512, self_loops: bool = False) -> Tensor:
    """Readout [G, 96] of every graph, in dataset order (eval mode: BatchNorm running stats);
    ``self_loops``: with :func:`released_self_loops` (``--aug-style released``)."""
    was = model.training
    model.eval()
    out = []
    for s in range(0, len(dataset), batch_size):
        b = dataset.collate(torch.arange(s, min(len(dataset), s + batch_size)))
        ei = released_self_loops(b.edge_index, b.batch, b.num_graphs) if self_loops \
            else b.edge_index
        out.append(model.encoder(b.x, ei, b.batch, b.num_graphs))
    model.train(was)
    return torch.cat(out)


# ------------------------------------------------------------------------------- evaluation
C_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)


def evaluate_embeddings(emb: np.ndarray, y: np.ndarray, seed: int, folds: int = 10,
                        inner_folds: int = 5, c_grid=C_GRID, kernel: str = "precomputed") -> dict:
    """GraphCL's ``svc_classify(search=True)`` test part: per outer stratified fold, an RBF SVC
    with C picked by ``inner_folds``-fold grid search on the training part; accuracy per fold.

    ``kernel="precomputed"`` (default) computes the RBF Gram matrix once, with sklearn's
    ``gamma="scale"`` value ``1 / (d * var(X))`` taken over all graphs (unsupervised; sklearn
    takes it over each training split, a <1% difference in gamma), and fits every SVC on slices
    of it: the same classifier family, about 3x faster. ``kernel="rbf"`` is GraphCL's exact
    ``SVC()`` call.
    """
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import SVC

    outer = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    if kernel == "precomputed":
        from sklearn.metrics.pairwise import rbf_kernel

        var = float(emb.var())
        gamma = 1.0 / (emb.shape[1] * var) if var > 0 else 1.0
        gram = rbf_kernel(emb, gamma=gamma)
    elif kernel != "rbf":
        raise ValueError(f"kernel={kernel!r} must be 'precomputed' or 'rbf'")
    accs, chosen = [], []
    for tr, te in outer.split(emb, y):
        inner = StratifiedKFold(n_splits=inner_folds, shuffle=True, random_state=seed)
        if kernel == "precomputed":
            # GridSearchCV's selection (mean inner accuracy, first best C), without its
            # per-fit overhead (clone, scorer, joblib: ~20 ms a fit, most of MUTAG's time)
            ytr = y[tr]
            splits = list(inner.split(tr, ytr))
            scores = np.zeros(len(c_grid))
            for itr, iva in splits:
                k_tr = gram[np.ix_(tr[itr], tr[itr])]
                k_va = gram[np.ix_(tr[iva], tr[itr])]
                for ci, c in enumerate(c_grid):
                    svc = SVC(C=c, kernel="precomputed").fit(k_tr, ytr[itr])
                    scores[ci] += float((svc.predict(k_va) == ytr[iva]).mean())
            best = int(np.argmax(scores / len(splits)))
            svc = SVC(C=c_grid[best], kernel="precomputed").fit(gram[np.ix_(tr, tr)], ytr)
            pred = svc.predict(gram[np.ix_(te, tr)])
            c_best = c_grid[best]
        else:
            clf = GridSearchCV(SVC(kernel=kernel), {"C": list(c_grid)}, cv=inner,
                               scoring="accuracy", n_jobs=1)
            clf.fit(emb[tr], y[tr])
            pred = clf.predict(emb[te])
            c_best = clf.best_params_["C"]
        accs.append(float((pred == y[te]).mean()))
        chosen.append(float(c_best))
    return {"accuracy": float(np.mean(accs)), "fold_accuracies": accs, "chosen_C": chosen}


# ------------------------------------------------------------------------------- one run
def _canonical(name: str) -> str:
    return ALIASES.get(name, name)


def hyper_for(name: str) -> Hyper:
    return DEFAULTS.get(_canonical(name), FALLBACK)


def gcbs_quantile(n: int, batch_size: int) -> float:
    """Quantile keeping about 2B pairs per row: 1 - 2B / (N - 1), clipped to [0.5, 0.999]."""
    return float(min(0.999, max(0.5, 1.0 - 2.0 * batch_size / max(1, n - 1))))


def _tag(args, hyper: Hyper) -> str:
    """'' for the paper's configuration, else a short suffix naming what differs."""
    parts = []
    if args.epochs is not None and args.epochs != hyper.epochs:
        parts.append(f"e{args.epochs}")
    if args.batch_size is not None and args.batch_size != hyper.batch_size:
        parts.append(f"b{args.batch_size}")
    if args.views != "orig+aug":
        parts.append("augaug")
    if args.features != "auto":
        parts.append(f"f{args.features}")
    if args.bank_init != "encode":
        parts.append("bankrand")
    if getattr(args, "svm_kernel", "precomputed") != "precomputed":
        parts.append("svmrbf")
    if args.aug_ratio != _CLI_DEFAULTS["aug_ratio"]:
        parts.append(f"r{args.aug_ratio:g}")
    if _aug_style(args) != "paper":
        parts.append(f"aug{_aug_style(args)}")
    # any other non-default option: a short hash, so a sweep never reuses (or is taken for) the
    # paper configuration's result files
    changed = {k: getattr(args, k) for k in _HASHED
               if getattr(args, k, _CLI_DEFAULTS[k]) != _CLI_DEFAULTS[k]}
    for key, paper in (("refresh_every", hyper.refresh_every), ("candidates", hyper.candidates),
                       ("neighbors", hyper.neighbors)):
        value = getattr(args, key, None)
        if value is not None and value != paper:
            changed[key] = value
    if changed:
        digest = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:6]
        parts.append(f"h{digest}")
    return "-".join(parts)


# Defaults of the CLI options that have no per-dataset value (the parser reads them from here)
_CLI_DEFAULTS = {"temperature": 0.2, "lr": 0.01, "tau_plus": 0.1, "beta": 1.0, "aug_ratio": 0.2,
                 "degree_cap": 64}
# those of them whose change the tag does not name otherwise: it adds the options hash
_HASHED = ("temperature", "lr", "tau_plus", "beta", "degree_cap")


def _aug_style(args) -> str:
    return getattr(args, "aug_style", "paper")


def result_path(out: Path, dataset: str, sampler: str, loss: str, seed: int, tag: str = "") -> Path:
    return _runs.result_path(out, dataset, sampler, loss, seed=seed, tag=tag)


def _make_loss(name: str, temperature: float, tau_plus: float, beta: float):
    from ..losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE

    if name == "infonce":
        return InfoNCE(temperature=temperature, form="simcse")
    if name == "dcl":
        return DebiasedInfoNCE(temperature=temperature, tau_plus=tau_plus, form="simcse")
    if name == "hcl":
        return HardNegativeInfoNCE(temperature=temperature, tau_plus=tau_plus, beta=beta,
                                   form="simcse")
    raise ValueError(f"loss={name!r} must be one of {LOSSES}")


def _make_sampler(name: str, bank, n: int, hp: dict, seed: int):
    from .. import (
        GCBSSampler,
        KNNBatchSampler,
        LinearDecay,
        ProximityGraphSampler,
        UniformBatchSampler,
    )

    b = hp["batch_size"]
    if name == "uniform":
        return UniformBatchSampler(n, b, seed=seed)
    if name == "knn":
        return KNNBatchSampler(bank, b, refresh_every=hp["refresh_every"], seed=seed)
    if name == "proximity":
        return ProximityGraphSampler(bank, b, candidates=hp["candidates"],
                                     neighbors=hp["neighbors"], restart=LinearDecay(0.2, 0.05),
                                     refresh_every=hp["refresh_every"], epochs=hp["epochs"],
                                     seed=seed)
    if name == "gcbs":
        return GCBSSampler(bank, b, quantile=hp["gcbs_quantile"], seed=seed)
    raise ValueError(f"sampler={name!r} must be one of {SAMPLERS}")


def run_one(args, dataset, sampler_name: str, loss_name: str, seed: int, path: Path,
            log=print) -> dict:
    """Train and evaluate one configuration; writes ``path`` (JSON) and returns the record."""
    from ..embeddings import EmbeddingBank
    from ..metrics import batch_false_negative_rate, batch_hardness

    t_start = time.perf_counter()
    c_start = time.process_time()
    name = dataset.name
    hyper = hyper_for(name)
    n = len(dataset)
    bsz = args.batch_size or hyper.batch_size
    if bsz >= n:
        bsz = max(2, n // 2)
    epochs = args.epochs or hyper.epochs
    cands = min(args.candidates or hyper.candidates, n - 1)
    neigh = min(args.neighbors or hyper.neighbors, cands - 1)
    hp = {"batch_size": bsz, "epochs": epochs,
          "refresh_every": args.refresh_every or hyper.refresh_every,
          "candidates": cands, "neighbors": neigh,
          "restart": {"schedule": "LinearDecay", "start": 0.2, "end": 0.05},
          "gcbs_quantile": gcbs_quantile(n, bsz), "temperature": args.temperature,
          "lr": args.lr, "hidden": 32, "layers": 3, "aug_ratio": args.aug_ratio,
          "augmentations": list(AUGS), "aug_style": _aug_style(args), "views": args.views,
          "loss_form": "simcse",
          "tau_plus": args.tau_plus if loss_name in ("dcl", "hcl") else None,
          "beta": args.beta if loss_name == "hcl" else None,
          "features": dataset.feature_kind, "num_features": dataset.num_features,
          "bank_init": args.bank_init, "loader": args.loader, "message_passing": "csr-spmm",
          "threads": torch.get_num_threads(),
          "eval": {"classifier": "SVC(rbf)", "kernel_impl": args.svm_kernel,
                   "C_grid": list(C_GRID), "outer_folds": 10, "inner_folds": 5}}
    torch.manual_seed(seed)
    np.random.seed(seed)
    gen = torch.Generator().manual_seed(seed + 7919)
    released = _aug_style(args) == "released"
    np_rng = np.random.RandomState(seed + 7919)
    model = GraphCL(dataset.num_features)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = _make_loss(loss_name, args.temperature, args.tau_plus, args.beta)
    timings = {"bank_init": 0.0, "data": 0.0, "augment": 0.0, "forward_backward": 0.0,
               "metrics": 0.0, "sampler": 0.0, "eval_embed": 0.0, "eval_svm": 0.0}
    bank = EmbeddingBank(n, model.encoder.out_dim, seed=seed)
    if args.bank_init == "encode" and sampler_name != "uniform":
        t0 = time.perf_counter()
        bank.embeddings.copy_(embed_all(model, dataset, self_loops=released))
        timings["bank_init"] = time.perf_counter() - t0
    sampler = _make_sampler(sampler_name, bank, n, hp, seed)
    if args.loader == "pyg":
        from torch_geometric.loader import DataLoader as PygLoader

        loader = PygLoader(dataset, batch_sampler=sampler)
    else:
        loader = torch.utils.data.DataLoader(_IndexDataset(n), batch_sampler=sampler,
                                             collate_fn=dataset.collate)
    labels = dataset.y.numpy()
    trace = {"step": [], "epoch": [], "loss": [], "hardness": [], "false_negative_rate": []}
    step = 0
    epoch_wall, epoch_cpu = [], []
    model.train()
    for epoch in range(epochs):
        e_wall, e_cpu = time.perf_counter(), time.process_time()
        sampler.set_epoch(epoch)
        it = iter(loader)
        epoch_loss, epoch_steps = 0.0, 0
        while True:
            t0 = time.perf_counter()
            try:
                data = next(it)
            except StopIteration:
                timings["data"] += time.perf_counter() - t0
                break
            t1 = time.perf_counter()
            timings["data"] += t1 - t0
            g = data.num_graphs
            if released:
                oei, ax, aei, ab, _ = augment_released(data.x, data.edge_index, data.batch, g,
                                                       np_rng)
                ox, ob = data.x, data.batch
            else:
                ax, aei, ab, _ = augment(data.x, data.edge_index, data.batch, g, args.aug_ratio,
                                         gen)
                if args.views == "aug+aug":
                    ox, oei, ob = augment(data.x, data.edge_index, data.batch, g,
                                          args.aug_ratio, gen)[:3]
                else:
                    ox, oei, ob = data.x, data.edge_index, data.batch
            t2 = time.perf_counter()
            timings["augment"] += t2 - t1
            h1, z1 = model(ox, oei, ob, g)
            _, z2 = model(ax, aei, ab, g, undirected=not released)
            loss = loss_fn(z1, z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            ids = data.idx
            bank.update(ids, h1.detach())
            t3 = time.perf_counter()
            timings["forward_backward"] += t3 - t2
            lv = float(loss.detach())
            if not math.isfinite(lv):
                raise FloatingPointError(f"loss became {lv} at step {step}")
            if step % args.log_every == 0:
                idn = ids.numpy()
                trace["step"].append(step)
                trace["epoch"].append(epoch)
                trace["loss"].append(lv)
                trace["hardness"].append(batch_hardness(bank.embeddings, idn))
                trace["false_negative_rate"].append(batch_false_negative_rate(labels, idn))
            timings["metrics"] += time.perf_counter() - t3
            epoch_loss += lv
            epoch_steps += 1
            step += 1
        epoch_wall.append(time.perf_counter() - e_wall)
        epoch_cpu.append(time.process_time() - e_cpu)
        if args.verbose:
            log(f"  epoch {epoch + 1}/{epochs} loss {epoch_loss / max(1, epoch_steps):.4f} "
                f"({time.perf_counter() - t_start:.1f}s)")
    timings["sampler"] = float(getattr(sampler, "sampler_seconds", 0.0))
    timings["data"] -= timings["sampler"]  # data = collation only
    t0 = time.perf_counter()
    emb = embed_all(model, dataset, self_loops=released).numpy().astype(np.float64)
    timings["eval_embed"] = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    ev = evaluate_embeddings(emb, labels, seed, kernel=args.svm_kernel)
    timings["eval_svm"] = time.perf_counter() - t0
    eval_cpu = time.process_time() - c0
    train_time = sum(timings[k] for k in ("bank_init", "data", "augment", "forward_backward",
                                           "metrics", "sampler"))
    record = {
        "dataset": name, "sampler": sampler_name, "loss": loss_name, "seed": seed,
        "tag": _tag(args, hyper), "config": hp, "num_graphs": n,
        "num_classes": dataset.num_classes, "steps": step,
        "accuracy": ev["accuracy"], "fold_accuracies": ev["fold_accuracies"],
        "chosen_C": ev["chosen_C"],
        "wall_time_s": time.perf_counter() - t_start, "train_time_s": train_time,
        "cpu_time_s": time.process_time() - c_start, "eval_svm_cpu_s": eval_cpu,
        "epoch_wall_s": epoch_wall, "epoch_cpu_s": epoch_cpu,
        "timings_s": timings,
        "trace": trace,
        "trace_note": ("per logged step: hardness = mean top-1 negative cosine and "
                       "false_negative_rate = share of same-label pairs, of the batch's bank "
                       "embeddings right after this step's update (anchor readout)"),
        "mean_hardness": float(np.nanmean(trace["hardness"])) if trace["hardness"] else None,
        "mean_false_negative_rate": (float(np.nanmean(trace["false_negative_rate"]))
                                     if trace["false_negative_rate"] else None),
        "env": _runs.env_record(),
    }
    _runs.write_json_atomic(path, record)
    return record


class _IndexDataset(torch.utils.data.Dataset):
    """Yields indices; with ``__getitems__`` the loader hands the whole id list to collate."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, ids):
        return list(ids)


# ------------------------------------------------------------------------------- CLI
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, action="append",
                   help="TU dataset name (raw folder DIR/tu/NAME or DIR/NAME); repeatable")
    p.add_argument("--data-dir", default=None,
                   help="data folder (default: $HARDBATCH_DATA, else ../shared/data)")
    p.add_argument("--cache-dir", default=None,
                   help="writable cache for parsed datasets (default ~/.cache/hardbatch/tu)")
    p.add_argument("--sampler", default="all", help=f"one of {SAMPLERS}, a comma list, or 'all'")
    p.add_argument("--loss", default="infonce", help=f"one of {LOSSES}, a comma list, or 'all'")
    p.add_argument("--seeds", type=int, default=5, help="run seeds 0..SEEDS-1 (default 5)")
    p.add_argument("--seed-list", default=None, help="explicit comma-separated seeds")
    p.add_argument("--epochs", type=int, default=None, help="default: the paper's per dataset")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--refresh-every", type=int, default=None, help="t (steps)")
    p.add_argument("--candidates", type=int, default=None, help="M")
    p.add_argument("--neighbors", type=int, default=None, help="K")
    p.add_argument("--temperature", type=float, default=_CLI_DEFAULTS["temperature"])
    p.add_argument("--lr", type=float, default=_CLI_DEFAULTS["lr"])
    p.add_argument("--tau-plus", type=float, default=_CLI_DEFAULTS["tau_plus"])
    p.add_argument("--beta", type=float, default=_CLI_DEFAULTS["beta"])
    p.add_argument("--aug-ratio", type=float, default=_CLI_DEFAULTS["aug_ratio"])
    p.add_argument("--views", choices=("orig+aug", "aug+aug"), default="orig+aug")
    p.add_argument("--aug-style", choices=("paper", "released"), default="paper",
                   help="paper: the GraphCL paper's augmentations at --aug-ratio (default); "
                        "released: GraphCL's released unsupervised_TU code (10%% drops, its "
                        "subgraph and self-loops; see augment_released)")
    p.add_argument("--features", choices=("auto", "labels", "degree", "constant"), default="auto")
    p.add_argument("--degree-cap", type=int, default=_CLI_DEFAULTS["degree_cap"])
    p.add_argument("--bank-init", choices=("encode", "random"), default="encode")
    p.add_argument("--loader", choices=("fast", "pyg"), default="fast",
                   help="fast: vectorised collate from flat tensors; pyg: "
                        "torch_geometric.loader.DataLoader(dataset, batch_sampler=sampler)")
    p.add_argument("--svm-kernel", choices=("precomputed", "rbf"), default="precomputed",
                   help="precomputed: RBF Gram matrix computed once (fast); rbf: SVC() as GraphCL")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--log-every", type=int, default=1, help="steps between trace entries")
    _runs.add_grid_arguments(p, out="results/graphs")
    p.add_argument("--verbose", action="store_true", help="print the loss every epoch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hardbatch.recipes.graphcl",
                                description="GraphCL on TU datasets with hardbatch samplers "
                                            "(BatchSampler paper, Table 3)")
    _add_arguments(p)
    return p


def add_graphcl_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``graphcl`` on an argparse subparsers object (``hardbatch bench graphcl``)."""
    p = subparsers.add_parser("graphcl", help="GraphCL on TU datasets with every sampler and loss",
                              description=build_parser().description)
    _add_arguments(p)
    p.set_defaults(func=run_graphcl)
    return p


def run_graphcl(args) -> int:
    """Run every (dataset, sampler, loss, seed) of ``args``; returns a process exit code."""
    from .tu import load_tu

    torch.set_num_threads(max(1, int(args.threads)))
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (lock cleanup)
    samplers = _runs.expand_choices(args.sampler, SAMPLERS, "sampler")
    losses = _runs.expand_choices(args.loss, LOSSES, "loss")
    seeds = _runs.seeds_of(args)
    if _aug_style(args) == "released" and (args.views != "orig+aug"
                                           or args.aug_ratio != _CLI_DEFAULTS["aug_ratio"]):
        raise ValueError("--aug-style released reproduces the released code's fixed ratios and "
                         "its original + augmented views: drop --aug-ratio and --views aug+aug, "
                         "or use --aug-style paper")
    out = Path(args.out)
    failures = 0
    for raw_name in args.dataset:
        name = _canonical(raw_name)
        hyper = hyper_for(name)
        if name not in DEFAULTS:
            print(f"[graphcl] {name}: not in the paper's Table 15; using B {hyper.batch_size}, "
                  f"{hyper.epochs} epochs, t {hyper.refresh_every}, M {hyper.candidates}, "
                  f"K {hyper.neighbors} (override with --batch-size / --epochs / "
                  "--refresh-every / --candidates / --neighbors)", flush=True)
        tag = _tag(args, hyper)
        todo = [(s, l, seed) for l in losses for s in samplers for seed in seeds
                if args.force or not _runs.finished(result_path(out, name, s, l, seed, tag))]
        total = len(samplers) * len(losses) * len(seeds)
        print(f"[graphcl] {name}: {total - len(todo)}/{total} runs done, {len(todo)} to run "
              f"-> {out}", flush=True)
        if args.dry_run or not todo:
            continue
        t0 = time.perf_counter()
        dataset = load_tu(name, args.data_dir, cache_dir=args.cache_dir, features=args.features,
                          degree_cap=args.degree_cap)
        print(f"[graphcl] loaded {name}: {len(dataset)} graphs, {dataset.num_features} "
              f"{dataset.feature_kind} features, {dataset.num_classes} classes "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)
        for s, l, seed in todo:
            path = result_path(out, name, s, l, seed, tag)
            rec, failed = _runs.run_exclusive(
                path, lambda: run_one(args, dataset, s, l, seed, path),  # noqa: B023 (called now)
                key="accuracy", force=args.force, prefix="[graphcl]")
            failures += failed
            if rec is None:
                continue
            tm = rec["timings_s"]
            print(f"[graphcl] {name} {s} {l} seed {seed}: acc {100 * rec['accuracy']:.2f} "
                  f"wall {rec['wall_time_s']:.1f}s (fwd/bwd {tm['forward_backward']:.1f}, "
                  f"aug {tm['augment']:.1f}, data {tm['data']:.1f}, sampler {tm['sampler']:.1f}, "
                  f"metrics {tm['metrics']:.1f}, svm {tm['eval_svm']:.1f}) "
                  f"fnr {rec['mean_false_negative_rate']:.3f} hard {rec['mean_hardness']:.3f}",
                  flush=True)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    return run_graphcl(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
