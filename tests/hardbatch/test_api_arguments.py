"""Every ``generator=`` / ``device=`` / ``dtype=`` parameter of the public API rejects a bad value
with an error naming the parameter (issue 34), and none is left out of this table."""

import importlib
import inspect
import pkgutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hardbatch as hb

X = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
A, P = torch.randn(8, 4), torch.randn(8, 4)
NET = torch.nn.Linear(8, 2)
PARAMETERS = ("generator", "device", "dtype")


def _pyg_batch():
    from torch_geometric.data import Batch, Data

    edge = torch.tensor([[0, 1], [1, 0]])
    return Batch.from_data_list([Data(x=torch.ones(2, 3), edge_index=edge) for _ in range(2)])


def _st_sampler(generator):
    from hardbatch.integrations.sentence_transformers import HardNegativeBatchSampler

    return HardNegativeBatchSampler([], 4, generator=generator, model=None, embeddings=X)


def _trainer(device):
    from hardbatch.train import TrainConfig, Trainer

    return Trainer(torch.nn.Linear(8, 4), hb.InfoNCE(0.5),
                   lambda bank: hb.UniformBatchSampler(bank.num_items, 8), torch.randn(40, 8),
                   config=TrainConfig(device=device, progress=False))


def _module(path):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


#: (public callable, parameter) -> a call passing the bad value to that parameter.
CALLS = {
    ("hardbatch.neighbors.knn_graph.knn_graph", "device"): lambda v: hb.knn_graph(X, 4, device=v),
    ("hardbatch.neighbors.knn_graph.KNNGraphLayout", "device"): lambda v: _module(
        "hardbatch.neighbors.knn_graph.KNNGraphLayout")(X, 4, "exact", v, "fp32", None, 8, 0),
    ("hardbatch.batching.gcbs.gcbs_permutation", "device"): lambda v: hb.gcbs_permutation(X, 0.9,
                                                                                 device=v),
    ("hardbatch.batching.gcbs.gcbs_setup", "device"): lambda v: _module("hardbatch.batching.gcbs.gcbs_setup")(
        X, None, 0.9, "exact", 0, None, 8, v, "fp32"),
    ("hardbatch.batching.gcbs.pairs.thresholded_pairs", "device"): lambda v: _module(
        "hardbatch.batching.gcbs.pairs.thresholded_pairs")(X, X, 0.5, device=v),
    ("hardbatch.batching.gcbs.pairs.PairSearchLayout", "device"): lambda v: _module(
        "hardbatch.batching.gcbs.pairs.PairSearchLayout")(X, X, 0.5, "exact", nlist=None, nprobe=8, seed=0,
                                              device=v, precision="fp32"),
    ("hardbatch.batching.gcbs.order.PartitionLayout", "device"): lambda v: _module(
        "hardbatch.batching.gcbs.order.PartitionLayout")(X, X, 0.5, 2, 0, v, "fp32"),
    ("hardbatch.batching.gcbs.threshold.similarity_threshold", "device"): lambda v: _module(
        "hardbatch.batching.gcbs.threshold.similarity_threshold")(X, X, 0.9, device=v),
    ("hardbatch.neighbors.proximity_graph.sharded_proximity_graph", "device"): lambda v: _module(
        "hardbatch.neighbors.proximity_graph.sharded_proximity_graph")(X, 10, 4, device=v),
    ("hardbatch.neighbors.knn_graph.sharded_knn_graph", "device"): lambda v: _module(
        "hardbatch.neighbors.knn_graph.sharded_knn_graph")(X, 4, device=v),
    ("hardbatch.batching.gcbs.sharded_gcbs_permutation", "device"): lambda v: _module(
        "hardbatch.batching.gcbs.sharded_gcbs_permutation")(X, 0.9, device=v),
    ("hardbatch.keys.derive.near_duplicate_keys", "device"): lambda v: hb.
    near_duplicate_keys(X, 0.9, device=v),
    ("hardbatch.samplers.proximity_sampler.ProximityGraphSampler", "device"): lambda v: hb.
    ProximityGraphSampler(X, 4, 10, 4, device=v),
    ("hardbatch.samplers.knn_sampler.KNNBatchSampler", "device"): lambda v: hb.KNNBatchSampler(
        X, 4, device=v),
    ("hardbatch.samplers.gcbs_sampler.GCBSSampler", "device"): lambda v: hb.GCBSSampler(
        X, 4, device=v),
    ("hardbatch.embeddings.EmbeddingBank", "device"): lambda v: hb.EmbeddingBank(40, 8,
                                                                                device=v),
    ("hardbatch.embeddings.EmbeddingBank", "dtype"): lambda v: hb.EmbeddingBank(40, 8, dtype=v),
    ("hardbatch.train.evaluation.embed", "device"): lambda v: hb.train.embed(
        NET, torch.randn(10, 8), device=v),
    ("hardbatch.train.evaluation.evaluate", "device"): lambda v: hb.train.evaluate(
        NET, torch.randn(10, 8), torch.arange(10) % 2, torch.randn(10, 8), torch.arange(10) % 2,
        k=3, device=v),
    ("hardbatch.train.config.TrainConfig", "device"): _trainer,
    ("hardbatch.losses.functional.sscl_loss", "generator"): lambda v: hb.sscl_loss(
        A, P, hardest=2, synthetic=2, generator=v),
    ("hardbatch.losses.functional.contrastive_loss", "generator"): lambda v: _module(
        "hardbatch.losses.functional.contrastive_loss")(A, P, hardest=2, synthetic=2,
                                                        generator=v),
    ("hardbatch.losses.modules.SSCLLoss", "generator"): lambda v: hb.SSCLLoss(
        hardest=2, synthetic=2, generator=v),
    ("hardbatch.losses.modules.SSCLLoss.Options", "generator"): lambda v: hb.SSCLLoss.Options(
        generator=v),
    ("hardbatch.losses.loss_options.SSCLOptions", "generator"): lambda v: _module(
        "hardbatch.losses.loss_options.SSCLOptions")(generator=v),
    ("hardbatch.integrations.pyg_augment.augment_batch", "generator"): lambda v: _module(
        "hardbatch.integrations.pyg_augment.augment_batch")(_pyg_batch(), generator=v),
    ("hardbatch.integrations.pyg.graph_embeddings", "device"): lambda v: _module(
        "hardbatch.integrations.pyg.graph_embeddings")(NET, [], device=v),
    ("hardbatch.integrations.pyg.embedding_source", "device"): lambda v: _module(
        "hardbatch.integrations.pyg.embedding_source")(NET, [], device=v),
    ("hardbatch.integrations.sentence_transformers.sampler.HardNegativeBatchSampler",
     "generator"): _st_sampler,
    ("hardbatch.neighbors.proximity_graph.proximity_graph", "device"): lambda v: _module(
        "hardbatch.neighbors.proximity_graph.proximity_graph")(X, 10, 4, device=v),
    ("hardbatch.neighbors.proximity_graph.ProximityGraphLayout", "device"): lambda v: _module(
        "hardbatch.neighbors.proximity_graph.ProximityGraphLayout")(X, 10, 4, 0, None, v, "fp32"),
    ("hardbatch.samplers.cluster_sampler.ClusterBatchSampler", "device"): lambda v: _module(
        "hardbatch.samplers.cluster_sampler.ClusterBatchSampler")(X, 4, device=v),
    ("hardbatch.samplers.community_sampler.CommunityBatchSampler", "device"): lambda v: _module(
        "hardbatch.samplers.community_sampler.CommunityBatchSampler")(X, 4, device=v),
    ("hardbatch.samplers.single_source_sampler.SingleSourceBatchSampler", "generator"): lambda v: _module(
        "hardbatch.samplers.single_source_sampler.SingleSourceBatchSampler")(sources=[40, 20],
                                                                     batch_size=8, generator=v),
}

#: Public names with such a parameter that take a value the library resolved itself (internal
#: plumbing between modules; the user-facing callers above check the user's value). Private
#: modules (``hardbatch._device``: the shared checks themselves) are not swept.
CALLS[("hardbatch.integrations.sentence_transformers.sampler.sampler_seed", "generator")] = \
    lambda v: _module("hardbatch.integrations.sentence_transformers.sampler.sampler_seed")(None, v)

INTERNAL = {
    ("hardbatch.losses.inputs.to_compute", "dtype"): "the dtype of compute_dtype()",
    ("hardbatch.losses.inputs.SaturatingCast.forward", "dtype"): "autograd Function of to_compute",
    ("hardbatch.losses.inputs.excluded_items", "device"): "the device of the loss's inputs",
    ("hardbatch.train.guide.check_guide", "device"): "the Trainer's resolved device",
    ("hardbatch.neighbors.index_search.resolve_knn_method", "device"): "knn_graph's resolved device",
    ("hardbatch.samplers.knn_sampler.sampler_index_kind", "device"): "KNNBatchSampler's resolved "
                                                               "device",
    ("hardbatch.samplers.proximity_sampler.ProximityGraphBuilder", "device"): "its sampler's "
                                                                          "resolved device",
    ("hardbatch.samplers.knn_sampler.SnapshotBuilder", "device"): "its sampler's resolved device",
    ("hardbatch.samplers.gcbs_sampler.GCBSOrderBuilder", "device"): "its sampler's resolved "
                                                                    "device",
    ("hardbatch.samplers.cluster_sampler.ClusterBuilder", "device"): "its sampler's resolved "
                                                                     "device",
    ("hardbatch.samplers.community_sampler.CommunityBuilder", "device"): "its sampler's "
                                                                         "resolved device",
    ("hardbatch.train.step_batch.loader_batches", "generator"): "the Trainer's own generator",
    ("hardbatch.train.step_batch.skip_on_every_rank", "device"): "the Trainer's resolved device",
    ("hardbatch.integrations.sentence_transformers.factory.HardNegativeBatchSamplerFactory"
     ".__call__", "generator"): "forwards to HardNegativeBatchSampler (checked there)",
}

BAD = {
    "device": ["gpu", 1.5, object(), "cuda:abc", [0], True],
    "generator": [123, "seed", np.random.default_rng(0), 1.5, torch.randn(2)],
    "dtype": ["float32", np.float32, torch.int64, torch.bool, 3],
}


def public_parameters() -> set[tuple[str, str]]:
    """(module.name, parameter) of every public callable (and method) with one of PARAMETERS."""
    found = set()
    for info in pkgutil.walk_packages(hb.__path__, "hardbatch."):
        if info.name.endswith("__main__") or "._" in info.name:
            continue
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")])
        for name in names:
            obj = getattr(module, name, None)
            if getattr(obj, "__module__", None) != info.name:
                continue  # documented where it is defined
            targets = [(name, obj)]
            if inspect.isclass(obj):
                targets = [(name, obj.__init__)] + [
                    (f"{name}.{k}", v) for k, v in vars(obj).items()
                    if callable(v) and (not k.startswith("_") or k == "__call__")]
            for qualified, fn in targets:
                try:
                    params = list(inspect.signature(fn).parameters)
                except (TypeError, ValueError):
                    continue
                if qualified == name and inspect.isclass(obj) and hasattr(obj, "Options"):
                    params += list(obj.Options.__annotations__)  # a sampler's shared options
                found |= {(f"{info.name}.{qualified}", p) for p in params if p in PARAMETERS}
    return found


def test_every_public_generator_device_dtype_parameter_is_checked_here():
    found = public_parameters()
    listed = set(CALLS) | set(INTERNAL)
    assert found - listed == set(), "add these to CALLS (a test call) or INTERNAL (why not)"
    assert listed - found == set(), "stale entries"
    assert len(CALLS) >= 30


@pytest.mark.parametrize("key", sorted(CALLS), ids=lambda k: f"{k[0].rsplit('.', 1)[-1]}-{k[1]}"
                         if isinstance(k, tuple) else str(k))
def test_bad_values_raise_naming_the_parameter(key):
    call, parameter = CALLS[key], key[1]
    for value in BAD[parameter]:
        with pytest.raises((ValueError, TypeError), match=parameter) as err:
            call(value)
        assert f"{parameter}=" in str(err.value) or f"{parameter} must" in str(err.value) or \
            f"{parameter} is" in str(err.value), (value, str(err.value))


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.integers(), st.text(max_size=6), st.floats(), st.binary(max_size=4),
                 st.lists(st.integers(), max_size=2)))
def test_any_non_generator_is_refused_by_the_losses(value):
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None"):
        hb.sscl_loss(A, P, hardest=2, synthetic=2, generator=value)


def test_loss_generator_set_as_an_attribute_is_checked():
    loss = hb.SSCLLoss(hardest=2, synthetic=2)
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        loss.generator = 123
    loss.generator = torch.Generator().manual_seed(0)
    assert torch.isfinite(loss(A, P))


def test_the_reported_cases_of_the_issue():
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        hb.losses.sscl_loss(A, P, generator=123)
    with pytest.raises(ValueError, match="state is missing 'kind', 'epoch'"):
        hb.UniformBatchSampler(10, 2).load_state_dict({})
