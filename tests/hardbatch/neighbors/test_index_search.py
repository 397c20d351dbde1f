"""kNN graph indexes (hardbatch.neighbors.index_search): recall, method="auto", determinism, errors."""

import sys

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch.neighbors import index_search as ni
from hardbatch.neighbors.index_search import NeighborIndex, index_knn_graph, resolve_knn_method

pytest.importorskip("faiss")


def needs(method):
    """Skip a case of ``method="hnsw"`` where hnswlib (an sdist: needs a compiler) is absent."""
    if "hnsw" in str(method):
        pytest.importorskip("hnswlib")


K = 10


def mixture(n=3000, d=32, components=30, seed=0):
    """Unit rows of a Gaussian mixture (clusters, as real embeddings have)."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((components, d))[r.integers(0, components, n)]
    x += 0.7 * r.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall(got, ref):
    return np.mean([len(set(a) & set(b)) / ref.shape[1] for a, b in zip(got, ref)])


@pytest.fixture(scope="module")
def data():
    x = mixture()
    return x, hb.knn_graph(x, K, method="exact").numpy()


@pytest.mark.parametrize("method", ["hnsw", "auto-ivf"])
def test_index_graph_recall_against_exact(data, method):
    needs(method)
    x, ref = data
    got = index_knn_graph(x, K, method, seed=3).numpy()
    assert got.shape == ref.shape and (got != np.arange(len(x))[:, None]).all()
    assert (np.sort(got, axis=1)[:, 1:] != np.sort(got, axis=1)[:, :-1]).all()  # distinct
    assert recall(got, ref) >= 0.95


def test_auto_is_exact_up_to_the_switch(data, monkeypatch):
    x, ref = data
    assert torch.equal(hb.knn_graph(x, K), torch.from_numpy(ref))  # N = 3000: exact
    n = ni.AUTO_EXACT_MAX_ITEMS
    assert resolve_knn_method("auto", n) == "exact"
    assert resolve_knn_method("auto", n + 1) == "auto-ivf"
    assert resolve_knn_method("auto", n + 1, precision="bf16") == "exact"
    assert resolve_knn_method("auto", n + 1, device=torch.device("meta")) == "exact"
    with monkeypatch.context() as m:  # several ranks: every rank must build the same graph
        m.setattr(torch.distributed, "is_initialized", lambda: True)
        m.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
        assert resolve_knn_method("auto", n + 1) == "exact"
    monkeypatch.setattr(ni, "AUTO_EXACT_MAX_ITEMS", 1000)
    got = hb.knn_graph(x, K).numpy()  # now the tuned IVF
    assert recall(got, ref) >= 0.95 and not np.array_equal(got, ref)


def test_auto_falls_back_to_exact_without_cluster_structure(monkeypatch):
    x = torch.nn.functional.normalize(torch.randn(3000, 64, generator=torch.Generator()
                                                  .manual_seed(0)), dim=1)
    monkeypatch.setattr(ni, "AUTO_EXACT_MAX_ITEMS", 1000)
    ref = hb.knn_graph(x, K, method="exact").numpy()
    assert recall(hb.knn_graph(x, K).numpy(), ref) == 1.0


def test_auto_without_faiss_runs_exact(data, monkeypatch, caplog):
    x, ref = data
    monkeypatch.setattr(ni, "AUTO_EXACT_MAX_ITEMS", 1000)
    monkeypatch.setitem(sys.modules, "faiss", None)
    monkeypatch.setattr(ni, "_WARNED", set())
    with caplog.at_level("WARNING", logger="hardbatch.neighbors"):
        assert torch.equal(hb.knn_graph(x, K), torch.from_numpy(ref))
    assert "hardbatch[ann]" in caplog.text


@pytest.mark.parametrize("method", ["hnsw", "auto-ivf"])
def test_same_seed_same_graph_for_any_thread_count(data, method):
    needs(method)
    import faiss

    x, _ = data
    first = index_knn_graph(x, K, method, seed=1)
    threads = faiss.omp_get_max_threads(), torch.get_num_threads()
    try:
        faiss.omp_set_num_threads(1)
        torch.set_num_threads(1)
        assert torch.equal(index_knn_graph(x, K, method, seed=1), first)
    finally:
        faiss.omp_set_num_threads(threads[0])
        torch.set_num_threads(threads[1])
    assert torch.equal(index_knn_graph(x, K, method, seed=1), first)


def test_tuning_reaches_the_target_and_search_checks_dims(data):
    x, _ = data
    index = NeighborIndex(x, "ivf", seed=0)
    assert index.tune(K) >= 0.96 and 1 <= index.breadth <= index.nlist // 16
    assert index.search(x[:3], 4).shape == (3, 4)
    assert index.tune(0) == 1.0 and index.breadth == 1  # no neighbour to find (B = 1): was NaN,
    # and the tuning walked to the largest breadth
    with pytest.raises(ValueError, match="queries have d=8 but the index was built on d=32"):
        index.search(x[:3, :8], 4)
    with pytest.raises(ValueError, match="queries contains NaN"):
        index.search(np.full((2, 32), np.nan, np.float32), 4)


@pytest.mark.parametrize("method", ["annoy", "HNSW", None, 3])
def test_unknown_method_names_the_choices(data, method):
    x, _ = data
    with pytest.raises(ValueError, match=r"method=.* must be one of \['auto', 'exact', 'faiss', "
                                         r"'faiss-ivf', 'hnsw'\]"):
        hb.knn_graph(x[:50], K, method=method)
    with pytest.raises(ValueError, match=r"must be one of \['auto', 'exact', 'faiss-ivf', 'hnsw'"):
        hb.KNNBatchSampler(x[:50], 4, method=method)


@pytest.mark.parametrize("module,method", [("hnswlib", "hnsw"), ("faiss", "faiss-ivf")])
def test_missing_index_package_names_the_extra(data, monkeypatch, module, method):
    x, _ = data
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r"needs .*pip install 'hardbatch\[ann\]'"):
        if method == "hnsw":
            hb.knn_graph(x[:50], K, method=method)
        else:
            NeighborIndex(x[:50], "ivf")
    with pytest.raises(ImportError, match=r"hardbatch\[ann\]"):
        hb.KNNBatchSampler(x[:50], 4, method=method)


@pytest.mark.parametrize("method", ["hnsw", "auto-ivf"])
def test_index_graph_bad_inputs(data, method):
    needs(method)
    x, _ = data
    with pytest.raises(ValueError, match="neighbors=50 must be smaller than the number of items"):
        index_knn_graph(x[:50], 50, method)
    bad = x[:100].copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match="embeddings contains NaN or inf .*row 7"):
        index_knn_graph(bad, K, method)
    with pytest.raises(ValueError, match="2-D"):
        index_knn_graph(x[0], K, method)
    if method == "hnsw":
        with pytest.raises(ValueError, match="NaN or inf .*row 7"):
            hb.knn_graph(bad, K, method="hnsw")


def test_auto_checks_the_embeddings_once(data, monkeypatch):
    """knn_graph(method="auto") on the IVF path: one NaN / inf pass over the rows, not one per
    layer (knn_graph, index_knn_graph, NeighborIndex); check_finite=False skips it."""
    x, _ = data
    passes = []
    aminmax = torch.aminmax  # embedding_tensor's one pass: the smallest and largest value
    monkeypatch.setattr(torch, "aminmax", lambda t: passes.append(t.shape) or aminmax(t))
    monkeypatch.setattr(ni, "AUTO_EXACT_MAX_ITEMS", 1000)
    hb.knn_graph(x, K)
    assert passes.count(x.shape) == 1
    passes.clear()
    index_knn_graph(x, K, "auto-ivf")
    assert passes.count(x.shape) == 1
    passes.clear()
    bad = x.copy()
    bad[5, 0] = np.inf
    assert NeighborIndex(bad, "ivf", nlist=4, check_finite=False).num_items == len(x)
    assert passes == []
    with pytest.raises(ValueError, match="embeddings contains NaN or inf .*row 5"):
        NeighborIndex(bad, "ivf", nlist=4)


def test_knn_sampler_with_an_index(data):
    x, _ = data
    exact = hb.KNNBatchSampler(x, 16, refresh_every=None, seed=0, method="exact")
    auto = hb.KNNBatchSampler(x, 16, refresh_every=None, seed=0)  # N = 3000: exact
    assert auto.index_kind is None and list(auto) == list(exact)
    methods = ("hnsw", "faiss-ivf")
    try:
        import hnswlib  # noqa: F401
    except ImportError:
        methods = ("faiss-ivf",)
    for method in methods:
        approx = hb.KNNBatchSampler(x, 16, refresh_every=None, seed=0, method=method)
        batches = list(approx)
        again = hb.KNNBatchSampler(x, 16, refresh_every=None, seed=0, method=method)
        assert list(again) == batches  # deterministic
        hits = []
        for batch in batches[:50]:  # the anchor and its nearest rows
            sims = x @ x[batch[0]]
            sims[batch[0]] = -2
            assert batch[0] not in batch[1:] and len(set(batch)) == 16
            hits.append(len(set(batch[1:]) & set(np.argsort(-sims)[:15])) / 15)
        assert np.mean(hits) >= 0.9
        state = approx.state_dict()  # mid-run checkpoint: the index is rebuilt on load
        resumed = hb.KNNBatchSampler(x, 16, refresh_every=None, seed=0, method=method)
        resumed.load_state_dict(state)
        assert list(resumed) == list(again)
