"""ClusterBatchSampler at scale (issue 46): the k-means tree (``kmeans_levels``), its plan for a
seed, and a k-means that would not fit memory failing before it allocates."""

import numpy as np
import pytest

import hardbatch as hb
from hardbatch import _memory
from hardbatch.samplers import cluster_sampler

B = 32


def batches(sampler) -> list[list[int]]:
    return [list(map(int, b)) for b in sampler]


def test_cluster_tree_is_a_deterministic_partition(emb):
    sampler = hb.ClusterBatchSampler(emb, B, kmeans_levels=3, seed=1)
    plan = batches(sampler)
    assert sorted(i for b in plan for i in b) == list(range(1000))
    assert len(np.unique(sampler.labels)) >= 0.9 * sampler.num_clusters
    assert plan == batches(hb.ClusterBatchSampler(emb, B, kmeans_levels=3, seed=1))
    default = hb.ClusterBatchSampler(emb, B, seed=1)
    assert default.kmeans_levels is None and len(batches(default)) == len(plan)
    with pytest.raises(ValueError, match="kmeans_levels"):
        hb.ClusterBatchSampler(emb, B, kmeans_levels=0)
    with pytest.raises(ValueError, match="kmeans_levels=3"):  # in the sampler's state
        default.load_state_dict(sampler.state_dict())


def test_cluster_build_that_does_not_fit_fails_before_it_allocates(emb, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the k-means ran")

    monkeypatch.setattr(cluster_sampler, "spherical_clusters", never)
    monkeypatch.setattr(_memory, "available_bytes", lambda: 1000)
    with pytest.raises(ValueError, match=r"N=1000, d=16 needs about .*kmeans_levels=3"):
        list(hb.ClusterBatchSampler(emb, B, kmeans="torch"))
