"""GraphCL's model: a 3-layer GIN encoder (sum-pooled readout of every layer, concatenated)
and the projection head; :func:`embed_all` embeds a whole dataset for evaluation."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hardbatch.integrations.pyg_augment import released_self_loops

__all__ = ["GINEncoder", "GraphCL", "embed_all"]


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
