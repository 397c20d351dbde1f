"""ClusterBatchSampler (TAS-B) and its building blocks in hardbatch.batching.communities: clusters per
batch, the counted fill at cluster ends, teacher (fixed) vs refreshed embeddings, bad input.

The sampler contract (partition, determinism, resume, ranks, global batches, checkpoints) runs
in test_contract.py, test_checkpoints.py and test_global_batch.py (kind ``cluster``)."""

import sys

import numpy as np
import pytest
import torch
from support import unit_rows

import hardbatch as hb
from hardbatch.batching import communities
from hardbatch.batching.communities import spherical_clusters
from hardbatch.neighbors import kmeans


def blobs(groups: int, size: int, d: int = 16, spread: float = 0.05, seed: int = 0):
    """``groups`` tight clusters of ``size`` unit rows each, items interleaved."""
    rng = np.random.default_rng(seed)
    centers = unit_rows(rng, groups, d)
    x = centers[np.arange(groups * size) % groups] + spread * rng.standard_normal(
        (groups * size, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True), np.arange(groups * size) % groups


def excess(batches, labels, c):
    """Clusters beyond c summed over the batches, and the batches holding more than c."""
    counts = np.array([len(set(labels[b].tolist())) for b in batches])
    return int(np.maximum(counts - c, 0).sum()), int((counts > c).sum())


def test_clusters_of_whole_batches_give_single_cluster_batches():
    pytest.importorskip("faiss")  # its k-means re-seeds empty clusters: it finds the 10 blobs
    x, truth = blobs(10, 64)  # 10 clusters of exactly B = 64 items
    sampler = hb.ClusterBatchSampler(x, 64, kmeans="faiss", seed=1)
    for _ in range(2):  # two epochs: reshuffled, the same clusters
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(640))
        assert all(len(set(truth[b].tolist())) == 1 for b in batches)
        assert sampler.fill_batches == 0


@pytest.mark.parametrize("c,kmeans", [(1, "torch"), (2, "auto"), (3, "torch")])
def test_batches_draw_from_c_clusters_except_the_counted_fill(emb, c, kmeans):
    sampler = hb.ClusterBatchSampler(emb, 64, 12, clusters_per_batch=c, kmeans=kmeans, seed=2)
    batches = list(sampler)
    labels = sampler.labels
    extra, mixed = excess(batches, labels, c)
    assert mixed == sampler.fill_batches
    assert extra <= sampler.num_clusters + c - 1  # at most one extra cluster per cluster end
    assert mixed < len(batches)  # batches of whole slots exist: the fill is not everything
    # a slot of a batch is one cluster's piece: each batch holds its c slots' clusters
    pure = [b for b in batches if len(set(labels[b].tolist())) <= c]
    assert len(pure) == len(batches) - mixed


def test_default_clusters_and_epochs_reshuffle(emb):
    sampler = hb.ClusterBatchSampler(emb, 64, seed=3)
    assert sampler.num_clusters == 16 and sampler.clusters is None  # ceil(1000 / 64)
    first, second = list(sampler), list(sampler)
    assert first != second and sorted(map(sorted, first)) != sorted(map(sorted, second))
    assert len(first[-1]) == 1000 % 64  # the short batch comes last


def test_fixed_teacher_embeddings_are_clustered_once(emb, monkeypatch):
    calls = []
    real = spherical_clusters

    def counting(*args, **kw):
        calls.append(kw["seed"])
        return real(*args, **kw)

    monkeypatch.setattr(sys.modules["hardbatch.samplers.cluster_sampler"], "spherical_clusters", counting)
    fixed = hb.ClusterBatchSampler(torch.from_numpy(emb), 64)
    for _ in range(3):
        list(fixed)
    assert len(calls) == 1
    reads = []

    def encode():  # a callable re-encodes the corpus: read and re-clustered every epoch
        reads.append(1)
        return emb

    live = hb.ClusterBatchSampler(encode, 64)
    for _ in range(3):
        list(live)
    # the read that learnt N serves the first epoch; a new k-means seed each epoch
    assert len(calls) == 4 and len(set(calls[1:])) == 3 and len(reads) == 3


def test_bank_is_reclustered_every_epoch(emb):
    bank = hb.EmbeddingBank(1000, 16, seed=0)
    sampler = hb.ClusterBatchSampler(bank, 64, seed=0)
    list(sampler)
    before = sampler.labels.copy()
    bank.update(torch.arange(1000), torch.from_numpy(emb))
    list(sampler)
    assert sampler.refreshes == 2 and not np.array_equal(before, sampler.labels)


def test_duplicate_keys_never_share_a_batch(emb):
    keys = np.arange(1000) % 500  # every key twice
    batches = list(hb.ClusterBatchSampler(emb, 64, duplicate_keys=keys.tolist()))
    assert all(len(set(keys[b].tolist())) == len(b) for b in batches)


def test_two_level_kmeans_above_256_clusters():
    x, truth = blobs(300, 10, d=32, spread=0.02)
    labels = spherical_clusters(x, 300, seed=0, backend="torch")
    assert labels.shape == (3000,) and labels.min() >= 0 and labels.max() < 300
    # nearly every true cluster lands in one k-means cluster
    pure = sum(len(set(labels[truth == g].tolist())) == 1 for g in range(300))
    assert pure >= 240, pure


def test_faiss_absent_falls_back_to_torch(emb, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    assert kmeans._faiss() is None
    batches = list(hb.ClusterBatchSampler(emb, 64, kmeans="auto"))
    assert sorted(i for b in batches for i in b) == list(range(1000))
    with pytest.raises(ImportError, match=r"kmeans='faiss' needs faiss; pip install "
                                          r"'hardbatch\[faiss\]' or use kmeans='torch'"):
        hb.ClusterBatchSampler(emb, 64, kmeans="faiss")  # at construction, named as passed
    assert len(list(hb.ClusterBatchSampler(emb, 64, kmeans="torch"))) == 16  # the advice


@pytest.mark.parametrize("kw,match", [
    (dict(clusters_per_batch=65), r"clusters_per_batch=65 must be at most the batch_size 64 "
                                  r"\(each group gives a batch at least one item\); use "
                                  r"clusters_per_batch <= 64"),
    (dict(clusters_per_batch=0), r"clusters_per_batch=0 must be >= 1"),
    (dict(clusters=1001), r"clusters=1001 must be at most the N=1000 items; use clusters <= "
                          r"1000 or None"),
    (dict(kmeans="sklearn"), r"unknown kmeans 'sklearn'; use one of 'auto', 'faiss', 'torch'"),
    (dict(iters=0), r"iters=0 must be >= 1"),
    (dict(clusters_per_batch=65, batch_size=32, rank=0, world_size=2, global_batch=True),
     r"clusters_per_batch=65 must be at most the world_size \* batch_size 64"),
])
def test_bad_input_names_the_parameter(emb, kw, match):
    kw = {"batch_size": 64, **kw}
    with pytest.raises(ValueError, match=match):
        hb.ClusterBatchSampler(emb, kw.pop("batch_size"), **kw)


def test_registry_builds_it(emb):
    sampler = hb.registry.make_sampler("cluster", emb, 64, clusters_per_batch=2)
    assert isinstance(sampler, hb.ClusterBatchSampler) and len(sampler) == 16


def test_state_records_the_cluster_options(emb):
    sampler = hb.ClusterBatchSampler(emb, 64, clusters_per_batch=2)
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="clusters_per_batch=2 but this sampler has "
                                         "clusters_per_batch=3"):
        hb.ClusterBatchSampler(emb, 64, clusters_per_batch=3).load_state_dict(state)
