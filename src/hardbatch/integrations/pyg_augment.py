"""GraphCL's graph augmentations (You et al., NeurIPS 2020) on a collated batch of graphs: the
paper's (:func:`augment`, :func:`augment_batch` for a PyG ``Batch``) and the released
``unsupervised_TU`` code's (:func:`augment_released`, :func:`released_self_loops`).

They act on plain tensors (node features ``x [n, F]``, ``edge_index [2, E]`` with both
directions of every undirected edge, the node-to-graph vector ``batch [n]``), one compiled pass
over the whole batch; every random choice comes from the given generator, so the same seed
gives the same views on any machine. torch_geometric is needed only by :func:`augment_batch`
(imported there). The GraphCL recipe (``hardbatch bench graphcl``) trains with these functions.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

from .._rng import rand_below
from .._validation import check_generator

__all__ = ["AUGMENTATIONS", "AUGS", "augment", "augment_batch", "augment_released",
           "released_self_loops"]

#: The four augmentations, in the order of ``augment``'s ``choice`` codes: node dropping, edge
#: perturbation, attribute masking, subgraph.
AUGMENTATIONS = ("dnodes", "pedges", "mask_nodes", "subgraph")
AUGS = AUGMENTATIONS  # the recipe's short name


@njit(cache=True)
def _push_neighbours(v, rowptr, col, node_keep, in_pool, scratch, pool):
    """Append v's neighbours that are neither kept nor pooled to ``scratch[pool:]``; new pool size."""
    for e in range(rowptr[v], rowptr[v + 1]):
        w = col[e]
        if not node_keep[w] and not in_pool[w]:
            in_pool[w] = True
            scratch[pool] = w
            pool += 1
    return pool


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
            # scratch[:pool]: candidate neighbours of the kept set
            pool = _push_neighbours(start, rowptr, col, node_keep, in_pool, scratch, 0)
            while kept < target and pool > 0:
                j = rand_below(state, pool)
                v = scratch[j]
                pool -= 1
                scratch[j] = scratch[pool]
                in_pool[v] = False
                node_keep[v] = True
                kept += 1
                pool = _push_neighbours(v, rowptr, col, node_keep, in_pool, scratch, pool)
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
        ``info = {"choice": [G], "node_keep": bool [n], "edge_keep": bool [E]}`` (the input's
        nodes and edges kept, in input order: for other node / edge attributes).

    Example:
        >>> from hardbatch.integrations.pyg_augment import augment
        >>> import torch
        >>> ring = torch.stack([torch.arange(10), (torch.arange(10) + 1) % 10])  # a cycle of 10
        >>> ring = torch.cat([ring, ring.flip(0)], dim=1)  # both directions of every edge
        >>> edge_index = torch.cat([ring + 10 * g for g in range(4)], dim=1)  # 4 graphs
        >>> x, batch = torch.ones(40, 8), torch.arange(40) // 10  # 40 nodes, d = 8
        >>> gen = torch.Generator().manual_seed(0)
        >>> x2, edges2, batch2, info = augment(x, edge_index, batch, 4, 0.2, gen,
        ...                                    choice=torch.tensor([0, 1, 2, 3]))
        >>> torch.bincount(batch2, minlength=4).tolist()  # nodes dropped / kept / kept / subgraph
        [8, 10, 10, 8]
        >>> int((x2 != 1).any(dim=1).sum())  # graph 2: 2 nodes' features masked
        2
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
    return x_out[keep], ei, batch[keep], {"choice": choice, "node_keep": keep,
                                          "edge_keep": edge_keep}


def released_self_loops(edge_index: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
    """The self-loops GraphCL's released ``TUDataset_aug.get`` adds to every graph.

    ``get`` appends ``(i, i)`` for the local node ids ``i < edge_index.max()`` of the graph, so
    the node with the largest id that has an edge (and any later, isolated node) gets none, and
    a graph without edges gets none. The anchor view and the evaluated graphs of the released
    code carry these loops (GIN then weights a node's own features twice); its augmented view
    drops them again. Args: edge_index [2, E], batch [n] (sorted), G. Returns [2, E + loops].

    Example:
        >>> import torch
        >>> from hardbatch.integrations.pyg_augment import released_self_loops
        >>> edge_index = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])  # 0-1-2 and 3-4
        >>> loops = released_self_loops(edge_index, torch.tensor([0, 0, 0, 1, 1]), 2)
        >>> loops[:, 6:].tolist()  # no loop on the last node with an edge of each graph
        [[0, 1, 3], [0, 1, 3]]
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

    Example:
        >>> import numpy as np
        >>> import torch
        >>> ring = torch.stack([torch.arange(10), (torch.arange(10) + 1) % 10])  # a cycle of 10
        >>> ring = torch.cat([ring, ring.flip(0)], dim=1)  # both directions of every edge
        >>> edge_index = torch.cat([ring + 10 * g for g in range(4)], dim=1)  # 4 graphs
        >>> x, batch = torch.ones(40, 8), torch.arange(40) // 10  # 40 nodes, d = 8
        >>> from hardbatch.integrations.pyg_augment import augment_released
        >>> anchor, x2, edges2, batch2, info = augment_released(x, edge_index, batch, 4,
        ...                                                     np.random.RandomState(0))
        >>> anchor.shape, x2.shape[1], info["choice"].tolist()  # anchor: 9 loops per graph
        (torch.Size([2, 116]), 8, [0, 0, 3, 1])
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


def augment_batch(batch, ratio: float = 0.2, generator: torch.Generator | None = None,
                  augmentations: tuple[str, ...] = AUGMENTATIONS):
    """One GraphCL view of a PyG ``Batch``: :func:`augment` of its nodes and edges, graph-level
    attributes (``y``, ``item_id`` of :class:`~hardbatch.integrations.pyg.IndexedGraphDataset`,
    ...) kept as they are, so ``model(augment_batch(batch))`` returns one row per graph in
    the batch's order. Edge attributes (``edge_attr``, ``edge_weight``, ...) follow the kept
    edges and other node attributes (``pos``, ``z``, ...) the kept nodes, as PyG's
    ``Data.subgraph`` tells them apart (``is_edge_attr`` / ``is_node_attr``; a tensor of one
    row per graph counts as graph-level unless its name says ``edge``).

    Args:
        batch: a ``torch_geometric.data.Batch`` with ``x``, ``edge_index`` (undirected: both
            directions) and ``batch``.
        ratio: share of nodes / edges each augmentation changes (GraphCL: 0.2).
        generator: drives every random choice (default: a generator seeded from torch's
            global one, so ``torch.manual_seed`` makes views reproducible).
        augmentations: the augmentations to draw from, one per graph.

    Example:
        >>> import torch
        >>> from torch_geometric.data import Batch, Data
        >>> from hardbatch.integrations.pyg_augment import augment_batch
        >>> ring = torch.stack([torch.arange(10), (torch.arange(10) + 1) % 10])  # a cycle of 10
        >>> ring = torch.cat([ring, ring.flip(0)], dim=1)  # both directions of every edge
        >>> graphs = [Data(x=torch.ones(10, 8), edge_index=ring, y=torch.tensor([g % 2]),
        ...                item_id=torch.tensor([g])) for g in range(4)]
        >>> batch = Batch.from_data_list(graphs)
        >>> view = augment_batch(batch, ratio=0.2, generator=torch.Generator().manual_seed(0))
        >>> view.num_graphs, view.item_id.tolist(), view.y.tolist()  # graph-level: unchanged
        (4, [0, 1, 2, 3], [0, 1, 0, 1])
        >>> view.num_nodes <= batch.num_nodes
        True
    """
    from torch_geometric.data import Batch

    if check_generator(generator) is None:
        generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,))))
    if batch.x is None:
        raise ValueError("augment_batch needs node features batch.x (e.g. one-hot node labels or "
                         "a constant 1 per node)")
    g = int(batch.num_graphs)
    x, edge_index, node_graph, info = augment(batch.x, batch.edge_index, batch.batch, g,
                                              ratio, generator, augmentations)
    out = Batch(x=x, edge_index=edge_index, batch=node_graph)
    ptr = torch.zeros(g + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(node_graph, minlength=g), 0, out=ptr[1:])
    out.ptr = ptr
    for key in batch.keys():  # noqa: SIM118 - a PyG Batch: keys() lists its attributes
        value = batch[key]
        if key in ("x", "edge_index", "batch", "ptr") or not torch.is_tensor(value) or \
                value.ndim == 0 or batch.__cat_dim__(key, value) != 0:
            continue
        if batch.is_edge_attr(key) and (len(value) != g or "edge" in key):
            out[key] = value[info["edge_keep"]]
        elif len(value) == g:  # graph-level attributes (y, item_id)
            out[key] = value
        elif batch.is_node_attr(key):
            out[key] = value[info["node_keep"]]
    out._num_graphs = g
    return out
