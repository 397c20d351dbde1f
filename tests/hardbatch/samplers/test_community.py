"""CommunityBatchSampler (B3) and its partition step (hardbatch.communities.community_labels):
the skipped top ranks kept apart, balanced communities, K communities per batch, teacher vs
refreshed embeddings, the METIS extra and bad input.

The sampler contract (partition, determinism, resume, ranks, global batches, checkpoints) runs
in test_contract.py, test_checkpoints.py and test_global_batch.py (kind ``community``)."""

import sys

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch.communities import community_labels, group_order, pairs_in_batches, rank_graph


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
    sampler = hb.CommunityBatchSampler(emb, 64, k, skip=0, window=16, seed=2)  # no separation
    batches = list(sampler)
    labels = sampler.groups[0]
    sizes = np.bincount(labels, minlength=sampler.parts)
    assert sampler.parts == round(1000 * k / 64) == len(sizes)
    assert sizes.max() <= np.ceil(1.03 * 1000 / sampler.parts) + 1  # METIS's tolerance
    per_batch = [len(set(labels[b].tolist())) for b in batches[:-1]]
    assert np.mean(per_batch) <= k + 1.5 and max(per_batch) <= k + 2  # + the cut ends
    assert sampler.separated == 0


def test_partition_step_alone_is_deterministic_and_uses_the_window_only():
    x = torch.nn.functional.normalize(torch.randn(300, 8, generator=torch.Generator()
                                                  .manual_seed(0)), dim=1)
    nbrs = hb.knn_graph(x, 12).numpy()
    a = community_labels(nbrs, 10, skip=2, window=10, seed=5)
    assert np.array_equal(a, community_labels(nbrs, 10, skip=2, window=10, seed=5))
    assert a.shape == (300,) and set(a.tolist()) == set(range(10))
    shuffled = nbrs.copy()
    shuffled[:, :2] = shuffled[:, [1, 0]]  # the skipped ranks do not enter the graph
    assert np.array_equal(a, community_labels(shuffled, 10, skip=2, window=10, seed=5))
    g = rank_graph(nbrs, 2, 12)
    assert (g != g.T).nnz == 0 and g.diagonal().sum() == 0
    with pytest.raises(ValueError, match="skip \\+ window = 14 ranks but neighbors holds 12"):
        community_labels(nbrs, 10, skip=4, window=10)


def test_fixed_teacher_embeddings_build_once_a_bank_every_epoch(emb, monkeypatch):
    module = sys.modules["hardbatch.samplers.community"]
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
    (dict(imbalance=0.9), r"imbalance=0.9 must be >= 1"),
])
def test_bad_input_names_the_parameter(emb, kw, match):
    with pytest.raises(ValueError, match=match):
        hb.CommunityBatchSampler(emb, 64, **kw)


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
