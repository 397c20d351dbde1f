"""CommunityBatchSampler (B3) and its partition step (hardbatch.batching.communities.community_labels):
the skipped top ranks kept apart, balanced communities within cells, K communities per batch,
changes kept in their cell, teacher vs refreshed embeddings, the METIS extra, METIS's console
output and bad input (plans under noise: test_plan_stability.py).

The sampler contract (partition, determinism, resume, ranks, global batches, checkpoints) runs
in test_contract.py, test_checkpoints.py and test_global_batch.py (kind ``community``)."""

import os
import sys
import warnings

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch.batching.communities import community_labels, group_order, pairs_in_batches, \
    rank_graph, separate_pairs
from hardbatch.batching.metis_partition import MetisOutputWarning, metis_output_caught


def top_pairs(x: np.ndarray, p: int) -> set:
    """Pairs (i, j), i < j, where one is among the other's p nearest (cosine, exact)."""
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    nearest = np.argsort(-sims, axis=1, kind="stable")[:, :p]
    return {(min(i, j), max(i, j)) for i in range(len(x)) for j in nearest[i].tolist()}


def shared(batches, pairs: set) -> int:
    batch_of = {i: k for k, b in enumerate(batches) for i in b}
    return sum(batch_of.get(i, -1) == batch_of.get(j, -2) for i, j in pairs)


@pytest.mark.parametrize("skip,window", [(3, 20), (8, 24)])
def test_skipped_top_ranks_never_share_a_batch(emb, skip, window):
    sampler = hb.CommunityBatchSampler(emb, 64, 4, skip=skip, window=window, seed=1)
    pairs = top_pairs(emb, skip)
    labels, graph, _ = (None, None, None)
    for _ in range(2):
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(1000))
        labels, graph, _ = sampler.groups
        assert shared(batches, pairs) == sampler.forced_pairs <= 2  # forced: none or nearly
    # without the separation many of them would: the communities gather near neighbours
    plain = group_order(labels, 64, seed=0)
    assert pairs_in_batches(plain, 1000, 64, graph) > 50 * max(1, sampler.forced_pairs)
    assert sampler.separated > 0


@pytest.mark.parametrize("k", [1, 4])
def test_communities_are_balanced_and_batches_hold_about_k(emb, k):
    sampler = hb.CommunityBatchSampler(emb, 64, k, skip=0, window=16, seed=2,  # no separation
                                       cells=hb.CommunityCells(batches=2))  # opt-in local
    batches = list(sampler)
    labels, cells = sampler.groups[0], sampler.cell_labels
    sizes = np.bincount(labels, minlength=sampler.parts)
    assert sampler.parts == round(1000 * k / 64) == len(sizes)
    assert len(np.unique(cells)) == round(1000 / (2 * 64))  # cells of about 2 batches
    for c in np.unique(cells):  # METIS's tolerance within each cell
        mine = np.unique(labels[cells == c])
        assert (cells[np.isin(labels, mine)] == c).all()  # a community stays in its cell
        assert sizes[mine].max() <= np.ceil(1.03 * (cells == c).sum() / len(mine)) + 1
    per_batch = [len(set(labels[b].tolist())) for b in batches[:-1]]  # K pieces of B / K,
    assert np.mean(per_batch) <= 1.5 * k + 0.5 and max(per_batch) <= 4 * k  # + the fill
    assert sampler.separated == 0


def test_one_metis_run_without_cells(emb):
    sampler = hb.CommunityBatchSampler(emb, 64, skip=2, window=10, seed=2)
    assert sampler.cells == hb.CommunityCells()  # the default, B3's: one METIS run over it all
    batches = list(sampler)
    assert sampler.cell_labels is None
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert len(np.unique(sampler.groups[0])) == sampler.parts == 62


def test_separation_swaps_within_blocks(emb):
    nbrs = hb.knn_graph(emb, 4).numpy()
    pairs = rank_graph(nbrs, 0, 2)
    order = np.argsort(nbrs[:, 0], kind="stable")  # nearest items close together
    blocks = np.arange(1000) % 64 // 16  # four blocks of 16 places in every batch
    fixed, swaps, forced = separate_pairs(order.copy(), 1000, 64, pairs, emb, nbrs, blocks)
    assert swaps > 0 and forced == 0 and pairs_in_batches(fixed, 1000, 64, pairs) == 0
    for blk in range(4):
        assert sorted(fixed[blocks == blk]) == sorted(order[blocks == blk])
    with pytest.raises(ValueError, match="blocks must hold a block id >= 0 for each of the "
                                         "kept=1000 places"):
        separate_pairs(order.copy(), 1000, 64, pairs, emb, nbrs, blocks[:10])


def test_fixed_teacher_embeddings_build_once_a_bank_every_epoch(emb, monkeypatch):
    module = sys.modules["hardbatch.samplers.community_sampler"]
    calls = []
    real = module.knn_graph

    def recording(x, k, **kw):
        calls.append(kw.get("method"))
        return real(x, k, **kw)

    monkeypatch.setattr(module, "knn_graph", recording)
    teacher = hb.CommunityBatchSampler(emb, 64, skip=2, window=10, knn_method="exact")
    epochs = [list(teacher) for _ in range(3)]
    assert calls == ["exact"] and epochs[0] != epochs[1]  # built once, reshuffled per epoch
    bank = hb.EmbeddingBank(1000, 16, seed=0)
    live = hb.CommunityBatchSampler(bank, 64, skip=2, window=10)
    list(live)
    bank.update(torch.arange(1000), torch.from_numpy(emb))
    list(live)
    assert calls[1:] == [None, None] and live.refreshes == 2


def test_kmeans_partitioner_needs_no_metis(emb, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # not installed
    with pytest.raises(ImportError, match=r"partitioner='metis' needs pymetis; pip install "
                                          r"'hardbatch\[metis\]', or pass partitioner='kmeans'"):
        hb.CommunityBatchSampler(emb, 64)
    sampler = hb.CommunityBatchSampler(emb, 64, partitioner="kmeans", skip=3, window=10)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert len(np.unique(sampler.groups[0])) > 1  # communities, not one uniform group
    assert shared(batches, top_pairs(emb, 3)) == sampler.forced_pairs <= 2


def test_duplicate_keys_and_pairs_together(emb):
    keys = np.arange(1000) % 400
    sampler = hb.CommunityBatchSampler(emb, 64, skip=2, window=10, duplicate_keys=keys.tolist())
    batches = list(sampler)
    assert all(len(set(keys[b].tolist())) == len(b) for b in batches)
    assert shared(batches, top_pairs(emb, 2)) == sampler.forced_pairs <= 5


@pytest.mark.parametrize("kw,match", [
    (dict(communities_per_batch=65), r"communities_per_batch=65 must be at most the "
                                     r"batch_size 64"),
    (dict(window=997), r"window=997 with skip=3 needs skip \+ window = 1000 neighbours per "
                       r"item but N=1000 items have 999; use window <= 996"),
    (dict(skip=-1), r"skip=-1 must be >= 0"),
    (dict(window=0), r"window=0 must be >= 1"),
    (dict(partitioner="louvain"), r"unknown partitioner 'louvain'; use one of 'metis', "
                                  r"'kmeans'"),
    (dict(imbalance=0.9), r"imbalance=0.9 is outside METIS's working range \[1, 2\]"),
    (dict(imbalance=100.0), r"imbalance=100.0 is outside METIS's working range \[1, 2\]: .*"
                            r"use e.g. 1.03 \(the default\)"),
])
def test_bad_input_names_the_parameter(emb, kw, match):
    with pytest.raises(ValueError, match=match):
        hb.CommunityBatchSampler(emb, 64, **kw)


def test_knn_method_checked_at_construction_and_ignored_in_cells_with_a_warning(emb):
    with pytest.raises(ValueError, match=r"unknown knn_method 'ivf'; use one of 'auto', 'exact', "
                                         r"'faiss', 'faiss-ivf', 'hnsw'"):
        hb.CommunityBatchSampler(emb, 64, knn_method="ivf")
    with pytest.warns(UserWarning, match=r"knn_method='exact' is not used: .* cells of 250 items "
                                         r"\(cells.items\)"):
        hb.CommunityBatchSampler(emb, 64, knn_method="exact", cells=hb.CommunityCells(items=250))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the global build uses it: no warning
        hb.CommunityBatchSampler(emb, 64, knn_method="exact")


def test_imbalance_is_metis_only(emb):
    """The imbalance message's advice, partitioner='kmeans', is followable with any imbalance."""
    with pytest.raises(ValueError, match="or partitioner='kmeans' for groups of any size"):
        hb.CommunityBatchSampler(emb, 64, imbalance=3.0)
    with pytest.warns(UserWarning, match=r"imbalance=3.0 is METIS's balance tolerance; "
                                         r"partitioner='kmeans' has none and ignores it"):
        sampler = hb.CommunityBatchSampler(emb, 64, imbalance=3.0, partitioner="kmeans")
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(emb)))


def test_device_default_is_what_the_options_table_says(emb):
    """options.py: device None is the CPU, but the cluster sampler's torch k-means runs on the
    source's device (its builder keeps None: the rows' device)."""
    table = " ".join(hb.samplers.options.__doc__.split())
    assert "None: the CPU; the cluster sampler's torch k-means: the source's device" in table
    community = hb.CommunityBatchSampler(emb, 64, skip=2, window=8)
    assert community.builder.device == torch.device("cpu")
    assert hb.ClusterBatchSampler(emb, 64, kmeans="torch").builder.device is None


def test_registry_builds_it(emb):
    sampler = hb.registry.make_sampler("community", emb, 64, communities_per_batch=2, window=8)
    assert isinstance(sampler, hb.CommunityBatchSampler) and sampler.parts == 31


def test_state_records_the_graph_options(emb):
    sampler = hb.CommunityBatchSampler(emb, 64, skip=2, window=10)
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="skip=2 but this sampler has skip=3"):
        hb.CommunityBatchSampler(emb, 64, skip=3, window=10).load_state_dict(state)


def test_metis_console_output_becomes_one_warning(emb, capfd, monkeypatch):
    monkeypatch.setattr("hardbatch.batching.metis_partition.IMBALANCE_RANGE", (1.0, 1000.0))
    nbrs = hb.knn_graph(emb, 23).numpy()  # far outside the range: METIS prints its errors
    with pytest.warns(MetisOutputWarning, match=r"METIS printed \d+ line\(s\) \(caught\): "
                                                r"\*\*\*Cannot bisect a graph with 0 vertices!"
                                                ) as seen:
        labels = community_labels(nbrs, 250, skip=3, window=20, imbalance=100.0)
    assert len([w for w in seen if w.category is MetisOutputWarning]) == 1
    assert labels.shape == (1000,) and "***" not in capfd.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no METIS line: no warning; other output passes
        with metis_output_caught():
            os.write(1, b"the training loop's own line\n")
    assert capfd.readouterr().out == "the training loop's own line\n"
