"""GraphCL recipe: TU loading, batch augmentations, one tiny end-to-end run (MUTAG, 1 epoch)."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("sklearn")
pytest.importorskip("pandas")

from hardbatch_experiments.recipes import graphcl
from hardbatch_experiments.recipes.graphcl import AUGS, augment
from hardbatch_experiments.tu import load_tu


@pytest.fixture(scope="module")
def mutag(data_root, tmp_path_factory):
    return load_tu("MUTAG", data_root, cache_dir=tmp_path_factory.mktemp("tucache"))


def _undirected_keys(ei: torch.Tensor, n: int) -> set:
    return set((torch.minimum(ei[0], ei[1]) * n + torch.maximum(ei[0], ei[1])).tolist())


def test_tu_matches_read_tu_data(data_root, mutag):
    from torch_geometric.io import read_tu_data
    from torch_geometric.utils import to_undirected

    data, slices, *_ = read_tu_data(str(data_root / "tu" / "MUTAG"), "MUTAG")
    assert len(mutag) == 188 and mutag.num_classes == 2
    assert torch.equal(mutag.x, data.x[:, :mutag.x.shape[1]])  # one-hot node labels
    assert torch.equal(mutag.node_ptr, slices["x"])
    assert mutag.label_values == [-1, 1]
    assert torch.equal(mutag.y, (data.y > 0).long())
    for g in (0, 57, 187):
        e0, e1 = slices["edge_index"][g], slices["edge_index"][g + 1]
        ref = to_undirected(data.edge_index[:, e0:e1])
        d = mutag[g]
        assert torch.equal(d.edge_index, ref)
        assert d.num_nodes == int(slices["x"][g + 1] - slices["x"][g])


def test_tu_gz_and_cache(data_root, mutag, tmp_path):
    src = data_root / "tu" / "MUTAG"
    dst = tmp_path / "data" / "tu" / "MUTAG"
    dst.mkdir(parents=True)
    for f in src.glob("MUTAG_*.txt"):
        if f.name.endswith("_A.txt") or f.name.endswith("_graph_labels.txt"):
            with open(f, "rb") as fin, gzip.open(dst / (f.name + ".gz"), "wb") as fout:
                fout.write(fin.read())
        else:
            shutil.copy(f, dst / f.name)
    before = sorted(p.name for p in dst.iterdir())
    cache = tmp_path / "cache"
    ds = load_tu("MUTAG", tmp_path / "data", cache_dir=cache)
    assert sorted(p.name for p in dst.iterdir()) == before  # nothing written into the data dir
    assert list(cache.rglob("processed-*.pt"))
    again = load_tu("MUTAG", tmp_path / "data", cache_dir=cache)  # from the cache
    for other in (ds, again):
        for key in ("x", "edge_index", "node_ptr", "edge_ptr", "y"):
            assert torch.equal(getattr(other, key), getattr(mutag, key)), key


def test_fast_collate_matches_pyg(mutag):
    from torch_geometric.data import Batch

    ids = torch.tensor([5, 3, 187, 0, 42])
    ref = Batch.from_data_list([mutag[int(i)] for i in ids])
    fast = mutag.collate(ids)
    for key in ("x", "edge_index", "batch", "y", "idx", "ptr"):
        assert torch.equal(getattr(fast, key), getattr(ref, key)), key
    assert fast.num_graphs == 5


@pytest.mark.parametrize("kind", range(len(AUGS)))
def test_augment_invariants(mutag, kind):
    b = mutag.collate(torch.arange(64))
    g, n = b.num_graphs, b.x.shape[0]
    counts = torch.bincount(b.batch, minlength=g)
    ucount = torch.tensor([len(_undirected_keys(mutag[i].edge_index, 10**6)) for i in range(g)])
    gen = torch.Generator().manual_seed(kind)
    x, ei, bt, _ = augment(b.x, b.edge_index, b.batch, g, 0.2, gen,
                              choice=torch.full((g,), kind))
    name = AUGS[kind]
    m = x.shape[0]
    # valid, symmetric edges inside one graph; graph ids preserved and sorted
    assert ei.dtype == torch.int64 and ei.shape[0] == 2
    if ei.numel():
        assert int(ei.min()) >= 0 and int(ei.max()) < m
        assert torch.equal(bt[ei[0]], bt[ei[1]])
    keys = set((ei[0] * m + ei[1]).tolist())
    assert keys == set((ei[1] * m + ei[0]).tolist())
    assert bt.shape[0] == m and bool((bt[1:] >= bt[:-1]).all())
    new_counts = torch.bincount(bt, minlength=g)
    dropped = torch.floor(counts.double() * 0.2).long()
    assert bool((new_counts >= 1).all())
    if name == "dnodes":
        assert torch.equal(new_counts, counts - dropped)
    elif name == "subgraph":
        assert bool((new_counts <= counts - dropped).all())
        # a BFS subgraph is connected: check one graph
        sel = torch.nonzero(bt == 0).flatten()
        sub = ei[:, (bt[ei[0]] == 0)]
        reach, frontier = {int(sel[0])}, [int(sel[0])]
        adj = {}
        for a, c in sub.t().tolist():
            adj.setdefault(a, []).append(c)
        while frontier:
            v = frontier.pop()
            for w in adj.get(v, []):
                if w not in reach:
                    reach.add(w)
                    frontier.append(w)
        assert reach == set(sel.tolist())
    else:
        assert torch.equal(new_counts, counts)
    if name == "pedges":
        und = torch.tensor([len({k for k in _undirected_keys(ei[:, bt[ei[0]] == i], 10**6)})
                            for i in range(g)])
        assert torch.equal(und, ucount - torch.floor(ucount.double() * 0.2).long())
        assert torch.equal(x, b.x)
    if name == "mask_nodes":
        changed = (x != b.x).any(dim=1)
        per_graph = torch.bincount(b.batch[changed], minlength=g)
        assert bool((per_graph <= dropped).all()) and int(per_graph.sum()) >= int(dropped.sum()) - 2
        assert torch.equal(ei, b.edge_index)
    if name in ("dnodes", "subgraph"):  # kept nodes keep their features
        assert set(map(tuple, x.tolist())) <= set(map(tuple, b.x.tolist()))
    assert n >= m


def test_augment_random_mix_and_determinism(mutag):
    b = mutag.collate(torch.arange(128))
    out1 = augment(b.x, b.edge_index, b.batch, 128, 0.2, torch.Generator().manual_seed(3))
    out2 = augment(b.x, b.edge_index, b.batch, 128, 0.2, torch.Generator().manual_seed(3))
    for a, c in zip(out1[:3], out2[:3]):
        assert torch.equal(a, c)
    assert set(out1[3]["choice"].tolist()) == set(range(4))


def test_end_to_end_mutag_one_epoch(data_root, tmp_path, capsys):
    out = tmp_path / "res"
    argv = ["--dataset", "MUTAG", "--data-dir", str(data_root), "--cache-dir",
            str(tmp_path / "cache"), "--sampler", "proximity", "--loss", "infonce",
            "--seeds", "1", "--epochs", "1", "--out", str(out)]
    assert graphcl.main(argv) == 0
    files = sorted(out.glob("*.json"))
    assert [f.name for f in files] == ["MUTAG__proximity__infonce__seed0__e1.json"]
    rec = json.loads(files[0].read_text())
    assert rec["dataset"] == "MUTAG" and rec["sampler"] == "proximity" and rec["seed"] == 0
    assert 0.5 <= rec["accuracy"] <= 1.0 and len(rec["fold_accuracies"]) == 10
    assert rec["config"]["candidates"] == 100 and rec["config"]["neighbors"] == 50
    assert rec["steps"] == 2 and len(rec["trace"]["hardness"]) == 2
    assert all(0.0 <= v <= 1.0 for v in rec["trace"]["false_negative_rate"])
    # issue 22.5: the same batches in the untrained encoder's (centred) readout, every arm alike
    assert len(rec["trace"]["reference_hardness"]) == 2
    ref = rec["reference_diagnostics"]
    assert -1 <= ref["mean_hardness"] <= 1 and "untrained encoder" in ref["embedding"]
    assert rec["wall_time_s"] > 0 and "forward_backward" in rec["timings_s"]
    mtime = files[0].stat().st_mtime_ns
    capsys.readouterr()
    assert graphcl.main(argv) == 0  # rerun: skipped
    printed = capsys.readouterr().out
    assert "1/1 runs done, 0 to run" in printed
    assert "[graphcl] done: 0 ran, 1 skipped (finished before), 0 failed, 0 missing" in printed
    assert files[0].stat().st_mtime_ns == mtime
    assert not list(out.glob(".*"))  # no temp or lock files left behind


def test_parser_registration():
    import argparse

    top = argparse.ArgumentParser()
    sub = top.add_subparsers(dest="cmd")
    graphcl.add_graphcl_parser(sub)
    args = top.parse_args(["graphcl", "--dataset", "MUTAG", "--sampler", "all", "--loss", "all"])
    assert args.func is graphcl.run_graphcl and args.seeds == 5
    assert graphcl.gcbs_quantile(188, 128) == 0.5
    assert abs(graphcl.gcbs_quantile(4110, 128) - (1 - 256 / 4109)) < 1e-12
    assert np.isclose(graphcl.gcbs_quantile(10**7, 128), 0.999)


def test_svm_evaluation_matches_gridsearch():
    from sklearn.metrics.pairwise import rbf_kernel
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import SVC

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 90)
    emb = rng.standard_normal((90, 8)) + y[:, None] * 0.8
    grid = (0.1, 1.0, 10.0)
    res = graphcl.evaluate_embeddings(emb, y, seed=3, folds=4, inner_folds=3, c_grid=grid)
    gram = rbf_kernel(emb, gamma=1.0 / (emb.shape[1] * emb.var()))
    accs, cs = [], []
    for tr, te in StratifiedKFold(4, shuffle=True, random_state=3).split(emb, y):
        clf = GridSearchCV(SVC(kernel="precomputed"), {"C": list(grid)},
                           cv=StratifiedKFold(3, shuffle=True, random_state=3))
        clf.fit(gram[np.ix_(tr, tr)], y[tr])
        accs.append((clf.predict(gram[np.ix_(te, tr)]) == y[te]).mean())
        cs.append(clf.best_params_["C"])
    assert res["fold_accuracies"] == pytest.approx(accs) and res["chosen_C"] == cs
    assert 0.6 < res["accuracy"] <= 1.0
    ref = graphcl.evaluate_embeddings(emb, y, seed=3, folds=4, inner_folds=3, c_grid=grid,
                                      kernel="rbf")  # GraphCL's SVC() call
    assert abs(ref["accuracy"] - res["accuracy"]) < 0.1


def test_csr_message_passing_matches_edge_index(mutag):
    import torch.nn.functional as F
    from torch_geometric.nn import global_add_pool

    b = mutag.collate(torch.arange(40))
    x, ei, bt, _ = augment(b.x, b.edge_index, b.batch, 40, 0.2, torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    enc = graphcl.GraphCL(mutag.num_features).encoder
    ref, h = [], x
    for conv, bn in zip(enc.convs, enc.bns):
        h = bn(F.relu(conv(h, ei)))
        ref.append(global_add_pool(h, bt, size=40))
    expected = torch.cat(ref, 1)
    assert torch.allclose(enc(x, ei, bt, 40), expected, atol=1e-5)
    assert torch.allclose(enc(x, ei, bt, 40, undirected=False), expected, atol=1e-5)


# ------------------------------------------------------------- GraphCL's released augmentations
def _released_reference(graphs, rng):
    """Per-graph transcription of GraphCL's released ``TUDataset_aug.get`` (self-loops, one of
    ``drop_nodes`` / ``permute_edges`` / ``subgraph`` / ``mask_nodes`` via dense adjacency),
    then ``gsimclr.py``'s batch filter (nodes without edges removed, self-loops dropped)."""
    anchors, views = [], []
    for x, ei in graphs:
        x = x.clone()
        n = x.shape[0]
        node_num = int(ei.max()) if ei.numel() else 0
        sl = torch.tensor([[i, i] for i in range(node_num)], dtype=torch.int64).reshape(-1, 2).t()
        ei = torch.cat((ei, sl), dim=1)
        anchors.append(ei)
        c = rng.randint(4)
        e = ei.numpy()
        if c in (0, 2):
            if c == 0:
                idx_drop = rng.choice(n, int(n / 10), replace=False)
                idx_nondrop = [i for i in range(n) if i not in idx_drop]
            else:
                sub_num = int(n * 0.2)
                idx_sub = [rng.randint(n, size=1)[0]]
                idx_neigh = set([j for j in e[1][e[0] == idx_sub[0]]])
                count = 0
                while len(idx_sub) <= sub_num:
                    count = count + 1
                    if count > n:
                        break
                    if len(idx_neigh) == 0:
                        break
                    sample_node = rng.choice(list(idx_neigh))
                    if sample_node in idx_sub:
                        continue
                    idx_sub.append(sample_node)
                idx_nondrop = idx_sub
            adj = torch.zeros((n, n))
            adj[e[0], e[1]] = 1
            adj[idx_nondrop, :] = 0
            adj[:, idx_nondrop] = 0
            ea = adj.nonzero().t()
        elif c == 1:
            m = e.shape[1]
            ea = torch.tensor(e.T[rng.choice(m, m - int(m / 10), replace=False)]).t()
        else:
            idx_mask = rng.choice(n, int(n / 10), replace=False)
            x[idx_mask] = torch.tensor(rng.normal(loc=0.5, scale=0.5, size=(len(idx_mask),
                                                                             x.shape[1])),
                                       dtype=torch.float32)
            ea = ei
        views.append((x, ea, c))
    # collate, then gsimclr.py's filter on the whole batch
    offs = np.cumsum([0] + [g[0].shape[0] for g in graphs])
    x_all = torch.cat([v[0] for v in views])
    batch = torch.cat([torch.full((g[0].shape[0],), i) for i, g in enumerate(graphs)])
    edge_idx = torch.cat([v[1] + offs[i] for i, v in enumerate(views)], dim=1).numpy()
    node_num = x_all.shape[0]
    idx_not_missing = [i for i in range(node_num) if (i in edge_idx[0] or i in edge_idx[1])]
    idx_dict = {idx_not_missing[i]: i for i in range(len(idx_not_missing))}
    aug_edges = [[idx_dict[edge_idx[0, k]], idx_dict[edge_idx[1, k]]]
                 for k in range(edge_idx.shape[1]) if not edge_idx[0, k] == edge_idx[1, k]]
    anchor = torch.cat([a + offs[i] for i, a in enumerate(anchors)], dim=1)
    return (anchor, x_all[idx_not_missing], aug_edges, batch[idx_not_missing],
            [v[2] for v in views])


def test_augment_released_matches_released_code(mutag):
    ids = torch.arange(0, 188, 3)
    b = mutag.collate(ids)
    graphs = [(mutag[int(i)].x, mutag[int(i)].edge_index) for i in ids]
    for seed in range(4):
        anchor, xa, eia, ba, info = graphcl.augment_released(
            b.x, b.edge_index, b.batch, b.num_graphs, np.random.RandomState(seed))
        r_anchor, r_x, r_edges, r_batch, r_choice = _released_reference(
            graphs, np.random.RandomState(seed))
        assert info["choice"].tolist() == r_choice
        assert set(map(tuple, anchor.t().tolist())) == set(map(tuple, r_anchor.t().tolist()))
        assert anchor.shape == r_anchor.shape
        assert torch.equal(xa, r_x) and torch.equal(ba, r_batch)
        assert sorted(map(tuple, eia.t().tolist())) == sorted(map(tuple, r_edges))
    assert set(r_choice) == {0, 1, 2, 3}


def test_released_self_loops_rule():
    # graph 0: nodes 0-3, edges 0-1, 1-2 (node 3 isolated); graph 1: nodes 4-5, no edges
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    batch = torch.tensor([0, 0, 0, 0, 1, 1])
    out = graphcl.released_self_loops(ei, batch, 2)
    loops = out[:, 4:]
    assert loops.tolist() == [[0, 1], [0, 1]]  # local ids < max id 2; none for graph 1


def test_aug_style_released_run_and_tag(data_root, tmp_path, capsys):
    out = tmp_path / "res"
    argv = ["--dataset", "MUTAG", "--data-dir", str(data_root), "--cache-dir",
            str(tmp_path / "cache"), "--sampler", "uniform", "--loss", "infonce",
            "--seeds", "1", "--epochs", "1", "--aug-style", "released", "--out", str(out)]
    assert graphcl.main(argv) == 0
    (f,) = out.glob("*.json")
    assert f.name == "MUTAG__uniform__infonce__seed0__e1-augreleased.json"
    rec = json.loads(f.read_text())
    assert rec["config"]["aug_style"] == "released" and 0.5 <= rec["accuracy"] <= 1.0
    capsys.readouterr()
    assert graphcl.main(argv[:-2] + ["--aug-ratio", "0.1", "--out", str(out)]) == 2
    assert "error: --aug-style released" in capsys.readouterr().err


def test_tag_hashes_other_options():
    p = graphcl.build_parser()
    hyper = graphcl.hyper_for("MUTAG")
    base = p.parse_args(["--dataset", "MUTAG"])
    assert graphcl.run_tag(base, hyper) == ""  # the paper's configuration: no tag
    same = p.parse_args(["--dataset", "MUTAG", "--candidates", "100", "--temperature", "0.2"])
    assert graphcl.run_tag(same, hyper) == ""  # explicit paper values are the paper's config
    tags = {graphcl.run_tag(p.parse_args(["--dataset", "MUTAG"] + extra), hyper)
            for extra in (["--temperature", "0.5"], ["--tau-plus", "0.3"],
                          ["--candidates", "150"], ["--neighbors", "20"], ["--lr", "0.001"])}
    assert len(tags) == 5 and all(t.startswith("h") and len(t) == 7 for t in tags)
