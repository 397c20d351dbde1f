"""hardbatch.integrations.pyg (and pyg_augment): PyTorch Geometric loaders with hardbatch
samplers, the TU files, GraphCL's augmentations.

Each test skips when PyTorch Geometric is not installed.
"""

import os

import pytest
import torch

import hardbatch as hb

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download in tests


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- PyG


def _graphs(n=40):
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(0)
    graphs = []
    for i in range(n):
        nodes = 3 + i % 5
        chain = torch.stack([torch.arange(nodes - 1), torch.arange(1, nodes)])
        graphs.append(Data(x=torch.randn(nodes, 4, generator=gen),
                           edge_index=torch.cat([chain, chain.flip(0)], 1), y=torch.tensor([i % 2])))
    return graphs


class _MeanPoolEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 8)

    def forward(self, batch):
        from torch_geometric.nn import global_mean_pool

        return global_mean_pool(self.lin(batch.x), batch.batch)


def test_pyg_loader_with_hardbatch_sampler_and_bank():
    pytest.importorskip("torch_geometric")
    from torch_geometric.loader import DataLoader

    from hardbatch.integrations.pyg import (
        IndexedGraphDataset,
        embedding_source,
        graph_embeddings,
        update_bank,
    )

    graphs = _graphs()
    dataset = IndexedGraphDataset(graphs)
    model = _MeanPoolEncoder()
    bank = hb.EmbeddingBank(len(dataset), 8)
    sampler = hb.ProximityGraphSampler(bank, 8, candidates=20, neighbors=5, refresh_every=2)
    loader = DataLoader(dataset, batch_sampler=sampler)
    batches = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in loader:
            z = model(batch)
            update_bank(bank, batch, z)
            assert batch.num_graphs == 8 and batch.item_id.shape == (8,)
            batches.append(batch.item_id.tolist())
    assert len(batches) == 2 * len(sampler) and bank.step == len(batches)
    assert all(len(set(b)) == 8 for b in batches)
    assert sampler.refreshes == len(batches) // 2
    assert "item_id" not in graphs[0]  # the wrapped graphs are untouched
    # a fresh encoding pass, in dataset order, matches the embeddings of the last batch
    emb = graph_embeddings(model, dataset, batch_size=16)
    assert emb.shape == (40, 8)
    torch.testing.assert_close(emb[batches[-1]], z.detach())
    gcbs = hb.GCBSSampler(embedding_source(model, dataset), 8, quantile=0.9)
    drawn = sorted(i for b in DataLoader(dataset, batch_sampler=gcbs) for i in b.item_id.tolist())
    assert drawn == list(range(40))


def test_pyg_index_key_is_refused():
    from hardbatch.integrations.pyg import IndexedGraphDataset

    with pytest.raises(ValueError, match="index"):
        IndexedGraphDataset([], key="item_index")


def _plain_and_gzipped_mutag(data_root, tmp_path):
    """MUTAG as distributed (read from shared/data), and a copy with NAME_A.txt gzipped."""
    import gzip
    import shutil

    plain = data_root / "tu"
    gz = tmp_path / "gz"
    (gz / "MUTAG").mkdir(parents=True)
    for f in (plain / "MUTAG").glob("MUTAG_*.txt"):
        if f.name == "MUTAG_A.txt":
            with open(f, "rb") as fin, gzip.open(gz / "MUTAG" / "MUTAG_A.txt.gz", "wb") as fout:
                fout.write(fin.read())
        else:
            shutil.copy(f, gz / "MUTAG" / f.name)
    return plain, gz


def test_augment_batch_carries_edge_and_node_attributes_with_what_it_keeps():
    """edge_attr (here: each edge's global (src, dst) ids) follows the kept edges and a node
    attribute (pos: each node's id) the kept nodes, so both still describe the view's graph;
    graph-level y stays one row per graph. Before, edge_attr and pos were dropped."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Batch, Data

    from hardbatch.integrations.pyg_augment import augment_batch

    ring = torch.stack([torch.arange(10), (torch.arange(10) + 1) % 10])
    ring = torch.cat([ring, ring.flip(0)], dim=1)
    graphs = [Data(x=torch.ones(10, 3), edge_index=ring, y=torch.tensor([g]),
                   edge_weight=torch.rand(20)) for g in range(4)]
    batch = Batch.from_data_list(graphs)
    batch.edge_attr = batch.edge_index.t().float()  # [E, 2]: the edge's own endpoints
    batch.pos = torch.arange(batch.num_nodes).float()[:, None].repeat(1, 3)  # [n, 3]: node id
    for seed in range(6):
        view = augment_batch(batch, 0.2, torch.Generator().manual_seed(seed))
        old_id = view.pos[:, 0].long()  # the view's node i was input node old_id[i]
        assert view.pos.shape == (view.num_nodes, 3) and bool((old_id[1:] > old_id[:-1]).all())
        assert torch.equal(view.edge_attr.long(), old_id[view.edge_index].t())
        assert view.edge_weight.shape == (view.edge_index.shape[1],)
        assert torch.equal(view.y, batch.y) and view.num_graphs == 4


def test_pyg_tu_dataset_reads_the_distributed_layout(data_root, tmp_path):
    """issue 17.14: PyG's TUDataset conventions over tu/NAME/NAME_*.txt (no raw/ folder,
    read-only, gzipped files): the same graphs as read_tu_data, nothing written into root."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.io import read_tu_data

    from hardbatch.integrations.pyg import tu_dataset

    plain, gz = _plain_and_gzipped_mutag(data_root, tmp_path)
    before = sorted(p.name for p in (gz / "MUTAG").iterdir())
    data, slices, *_ = read_tu_data(str(plain / "MUTAG"), "MUTAG")
    for root in (plain, gz):
        ds = tu_dataset(root, "MUTAG", cache_dir=tmp_path / f"cache-{root.name}")
        assert len(ds) == 188 and ds.num_classes == 2
        for g in (0, 57, 187):
            e0, e1 = slices["edge_index"][g], slices["edge_index"][g + 1]
            assert torch.equal(ds[g].edge_index, data.edge_index[:, e0:e1])
            assert torch.equal(ds[g].x, data.x[slices["x"][g]:slices["x"][g + 1]])
            assert int(ds[g].y) == int(data.y[g])
    assert sorted(p.name for p in (gz / "MUTAG").iterdir()) == before  # root untouched
    assert [p.name for p in (tmp_path / "cache-gz" / "MUTAG").glob("*/processed")]
    with pytest.raises(FileNotFoundError, match="NOPE_A.txt"):
        tu_dataset(plain, "NOPE", cache_dir=tmp_path / "c")


def test_pyg_tu_datasets_of_one_name_never_share_a_cache(tmp_path):
    """Two datasets named TOY in different folders, then one of them edited, one cache_dir:
    each reads its own graphs (before, the processed tensors were cached by name alone and
    the second dataset was the first one's graphs)."""
    pytest.importorskip("torch_geometric")
    import numpy as np

    from hardbatch.integrations.pyg import tu_dataset

    def toy(root, sizes):  # rings of the given sizes in the TU-Dortmund layout
        folder = tmp_path / root / "TOY"
        folder.mkdir(parents=True, exist_ok=True)
        edges, graph, offset = [], [], 0
        for g, n in enumerate(sizes):
            edges += [(offset + a + 1, offset + (a + 1) % n + 1) for a in range(n)]
            graph += [g + 1] * n
            offset += n
        np.savetxt(folder / "TOY_A.txt", edges + [(b, a) for a, b in edges], fmt="%d",
                   delimiter=", ")
        np.savetxt(folder / "TOY_graph_indicator.txt", graph, fmt="%d")
        return tmp_path / root

    cache = tmp_path / "cache"
    for root, sizes in (("one", [3, 4]), ("two", [5, 6, 7]), ("one", [8, 9, 10, 11])):
        ds = tu_dataset(toy(root, sizes), "TOY", cache_dir=cache)
        assert [d.num_nodes for d in ds] == sizes, root


def test_pyg_graphcl_augmentations_are_public(data_root, tmp_path):
    """The GraphCL views live in the library (the recipe imports them from there):
    augment_batch keeps graph-level attributes and the graph count, same seed same view."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.loader import DataLoader

    from hardbatch.integrations import pyg, pyg_augment
    from hardbatch_experiments.recipes import graphcl

    assert graphcl.augment is pyg.augment is pyg_augment.augment
    dataset = pyg.IndexedGraphDataset(pyg.tu_dataset(data_root / "tu", "MUTAG", tmp_path))
    batch = next(iter(DataLoader(dataset, batch_size=32)))
    views = [pyg.augment_batch(batch, 0.2, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert views[0].num_graphs == 32 and torch.equal(views[0].item_id, batch.item_id)
    assert torch.equal(views[0].y, batch.y) and views[0].batch.max() == 31
    assert torch.equal(views[0].x, views[1].x) and torch.equal(views[0].edge_index,
                                                               views[1].edge_index)
    assert not torch.equal(views[0].edge_index, views[2].edge_index)
    assert views[0].num_nodes <= batch.num_nodes and views[0].ptr[-1] == views[0].num_nodes
    only_drop = pyg.augment_batch(batch, 0.2, torch.Generator().manual_seed(0), ("dnodes",))
    kept = torch.bincount(only_drop.batch, minlength=32)
    assert torch.equal(kept, batch.ptr[1:] - batch.ptr[:-1]
                       - ((batch.ptr[1:] - batch.ptr[:-1]) * 0.2).floor().long())
