"""gcbs_permutation (hardbatch.batching.gcbs): GCBS steps 1-3 composed, against a dense
reference, on clustered data, with its options and errors."""

import numpy as np
import pytest
import torch
from gcbs_support import dense_gcbs_reference
from support import unit_rows

import hardbatch as hb
from hardbatch.batching import gcbs
from hardbatch.batching.gcbs import similarity_threshold


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("min_partners", [0, 3, None])
def test_gcbs_matches_dense_reference(rng, paired, min_partners):
    x = unit_rows(rng, 300, 8)
    y = x + 0.3 * unit_rows(rng, 300, 8) if paired else x
    # quantile 0.995: ~1.5 pairs per item, so that many items need partners
    perm = hb.gcbs_permutation(x, 0.995, paired=y if paired else None, seed=4,
                               min_partners=min_partners)
    k = gcbs.DEFAULT_MIN_PARTNERS if min_partners is None else min_partners
    ref, _, _ = dense_gcbs_reference(x, y, 0.995, seed=4, min_partners=k)
    assert perm.tolist() == ref.tolist()
    if min_partners == 0:  # the paper's graph: the explicit exact method is the same order
        assert torch.equal(perm, hb.gcbs_permutation(x, 0.995, paired=y if paired else None,
                                                     seed=4, method="exact", min_partners=0))


def test_gcbs_groups_similar_items_and_handles_components():
    # Three well separated clusters of 40 items: sequential batches of 40 stay inside one cluster.
    r = np.random.default_rng(0)
    centers = np.eye(3, 8, dtype=np.float32) * 5
    x = np.concatenate([c + 0.3 * r.standard_normal((40, 8)).astype(np.float32) for c in centers])
    labels = np.repeat(np.arange(3), 40)
    perm = hb.gcbs_permutation(x, 0.7).numpy()  # keeps within-cluster pairs only
    assert sorted(perm.tolist()) == list(range(120))
    for b in range(3):
        assert len(set(labels[perm[b * 40:(b + 1) * 40]])) == 1


def test_gcbs_batches_harder_than_uniform_on_digits():
    digits = pytest.importorskip("sklearn.datasets").load_digits()
    x = digits.data.astype(np.float32)
    x = x - x.mean(0)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    gcbs = [b for b in hb.GCBSSampler(x, 64, quantile=0.99)]
    uni = [b for b in hb.UniformBatchSampler(len(x), 64)]

    def hardness(batches):
        vals = []
        for b in batches:
            s = xn[b] @ xn[b].T
            np.fill_diagonal(s, -np.inf)
            vals.append(s.max(1).mean())
        return float(np.mean(vals))

    assert hardness(gcbs) > hardness(uni) + 0.1


def test_gcbs_epochs_differ_through_seed(rng):
    x = unit_rows(rng, 400, 4)
    a = hb.gcbs_permutation(x, 0.99, seed=0)
    b = hb.gcbs_permutation(x, 0.99, seed=1)
    assert sorted(a.tolist()) == sorted(b.tolist()) and not torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ivf", "faiss"])
def test_gcbs_approximations_close_to_exact(mnist_pca, method):
    if method == "faiss":
        pytest.importorskip("faiss")
    xn = mnist_pca[0][:8000]
    exact = hb.gcbs_permutation(xn, 0.999, method="exact").numpy()
    approx = hb.gcbs_permutation(xn, 0.999, method=method).numpy()
    assert sorted(approx.tolist()) == list(range(len(xn)))

    def top1(perm):
        vals = []
        for s in range(0, len(perm), 64):
            b = perm[s:s + 64]
            m = xn[b] @ xn[b].T
            np.fill_diagonal(m, -np.inf)
            vals.append(m.max(1).mean())
        return np.mean(vals)

    assert abs(top1(approx) / top1(exact) - 1) < 0.03


@pytest.mark.parametrize("kwargs,match", [
    (dict(quantile=0.0), "quantile=0.0 must lie strictly between 0 and 1"),
    (dict(quantile=1.2), "quantile=1.2"),
    (dict(method="hnsw"), "method='hnsw' must be 'auto', 'exact', 'ivf', 'faiss' or "
                          "'partition'"),
    (dict(min_partners=-1), r"min_partners=-1 must lie in \[0, N - 1\] for N=50 items.*"
                            "or 0 for the paper's thresholded graph"),
    (dict(min_partners=50), r"min_partners=50 must lie in \[0, N - 1\] for N=50.*use e.g. "
                            "min_partners=16"),
    (dict(min_partners=2.0), "min_partners must be an integer"),
    (dict(min_partners=True), "min_partners must be an integer"),
    (dict(progress="yes"), "progress must be True, False or None"),
    (dict(paired=np.ones((5, 4), np.float32)), "paired has shape"),
    (dict(method="ivf", nlist=-1), "nlist=-1 must be >= 1"),
    (dict(method="ivf", nlist=0), "nlist=0 must be >= 1"),
    (dict(method="ivf", nlist=4.0), "nlist must be an integer"),
    (dict(method="ivf", nprobe=0), "nprobe=0 must be >= 1"),
    (dict(method="ivf", nlist=51, nprobe=51), "nlist=51 must be at most the N=50 items"),
    (dict(method="faiss", nlist=60), "nlist=60 must be at most the N=50 items"),
    (dict(method="exact", nlist=-3), "nlist=-3 must be >= 1"),
])
def test_gcbs_bad_input(rng, kwargs, match):
    with pytest.raises(ValueError, match=match):
        hb.gcbs_permutation(unit_rows(rng, 50, 4), **kwargs)


def test_gcbs_rejects_nan(rng):
    x = unit_rows(rng, 50, 4)
    x[3] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        hb.gcbs_permutation(x)


def test_min_partners_default_fits_tiny_inputs(rng):
    for n in (1, 2, 5):
        x = unit_rows(rng, n, 3)
        assert sorted(hb.gcbs_permutation(x).tolist()) == list(range(n))
    assert gcbs.check_min_partners(None, 5) == 4
    assert gcbs.check_min_partners(None, 10**6) == gcbs.DEFAULT_MIN_PARTNERS


def test_auto_method_picks_by_size(rng, monkeypatch):
    assert gcbs.resolve_method("auto", gcbs.AUTO_EXACT_MAX_ITEMS) == "exact"
    assert gcbs.resolve_method("auto", gcbs.AUTO_EXACT_MAX_ITEMS + 1) == "ivf"
    assert gcbs.resolve_method("auto", gcbs.AUTO_IVF_MAX_ITEMS + 1) == "partition"
    assert gcbs.resolve_method("faiss", 10) == "faiss"
    x = unit_rows(rng, 500, 6)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=1),
                       hb.gcbs_permutation(x, 0.99, seed=1, method="exact"))
    monkeypatch.setattr(gcbs.pairs, "AUTO_EXACT_MAX_ITEMS", 100)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=1),
                       hb.gcbs_permutation(x, 0.99, seed=1, method="ivf"))
    monkeypatch.setattr(gcbs.pairs, "AUTO_IVF_MAX_ITEMS", 200)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=1, partitions=3),
                       hb.gcbs_permutation(x, 0.99, seed=1, method="partition", partitions=3))


def _batch_hardness(x, order, b):
    e = x[order[:len(order) // b * b].reshape(-1, b)]
    s = np.einsum("nid,njd->nij", e, e)
    s[:, np.arange(b), np.arange(b)] = -np.inf
    return s.max(axis=2).mean(axis=1)


def test_min_partners_removes_the_random_tail():
    # Uneven clusters: the global quantile puts every pair inside the tight ones, so the
    # paper's graph leaves the items of the loose clusters alone at the end of the order.
    r = np.random.default_rng(0)
    centers = r.standard_normal((30, 16))
    spread = np.where(np.arange(30) < 6, 0.3, 1.2)
    labels = r.integers(0, 30, 4096)
    x = centers[labels] + spread[labels, None] * r.standard_normal((4096, 16))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    b = 64
    uniform = np.concatenate([_batch_hardness(x, r.permutation(4096), b) for _ in range(10)])
    p95 = np.quantile(uniform, 0.95)
    paper = _batch_hardness(x, hb.gcbs_permutation(x, 0.999, min_partners=0).numpy(), b)
    ours = _batch_hardness(x, hb.gcbs_permutation(x, 0.999).numpy(), b)
    assert np.mean(paper <= p95) > 0.3  # the paper's random tail
    assert paper[-8:].mean() < p95
    assert np.mean(ours <= p95) <= 0.1  # the target
    assert ours[-8:].mean() > p95 and ours.mean() > paper.mean()


def test_gcbs_permutation_interleave_option(rng):
    x = unit_rows(rng, 400, 6)
    plain = hb.gcbs_permutation(x, 0.99, seed=2)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=2, interleave=16),
                       torch.from_numpy(gcbs.interleave_chunks(plain, 16)))
    part = hb.gcbs_permutation(x, 0.99, seed=2, method="partition", partitions=2)
    assert torch.equal(hb.gcbs_permutation(x, 0.99, seed=2, method="partition", partitions=2,
                                           interleave=16),
                       torch.from_numpy(gcbs.interleave_chunks(part, 16)))
    with pytest.raises(ValueError, match="interleave=-1 must be >= 0"):
        hb.gcbs_permutation(x, interleave=-1)


def test_benchmark_measures_match_plain_references(rng):
    """The docs/gcbs.md figures: batch hardness and false-negative rate (bench_gcbs_tail), and
    the plain dense GCBS the speed target is measured against (bench_gcbs)."""
    import sys

    from support import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_gcbs import dense_reference, plain_threshold
    from bench_gcbs_tail import batch_stats

    x = unit_rows(rng, 70, 5)
    labels = rng.integers(0, 3, 70)
    order = rng.permutation(70)
    hard, fn = batch_stats(x, order, 16, labels)
    assert len(hard) == 4  # full batches only
    for i in range(4):
        b = order[16 * i:16 * (i + 1)]
        s = x[b].astype(np.float64) @ x[b].T
        np.fill_diagonal(s, -np.inf)
        assert hard[i] == pytest.approx(s.max(axis=1).mean(), abs=1e-6)
        same = sum(labels[p] == labels[q] for p in b for q in b if p != q)
        assert fn[i] == pytest.approx(same / (16 * 15))
    x = unit_rows(rng, 500, 6)
    thr = similarity_threshold(x, x, 0.99)
    s = x.astype(np.float64) @ x.T.astype(np.float64)
    np.fill_diagonal(s, -np.inf)
    assert ((s > plain_threshold(x, 0.99)) == (s > thr)).all()  # the same pairs pass
    assert torch.equal(dense_reference(x, 0.99, seed=3, rows=64, threshold=thr),
                       hb.gcbs_permutation(x, 0.99, seed=3, method="exact", min_partners=0))


def test_docs_gcbs_example_runs():
    """The first code block of docs/gcbs.md, run as written (in a subprocess: it configures
    logging), and its log line."""
    import subprocess
    import sys

    from support import REPO

    text = (REPO / "docs" / "gcbs.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("INFO:hardbatch.batching.gcbs:gcbs_permutation: N=3000 d=32 method=exact") == 3
