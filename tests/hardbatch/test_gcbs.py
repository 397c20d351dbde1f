import numpy as np
import pytest
import scipy.sparse as sp
import torch
from support import unit_rows
from scipy.sparse.csgraph import reverse_cuthill_mckee

import hardbatch as hb
from hardbatch import _rng
from hardbatch.gcbs import similarity_threshold, thresholded_pairs


def dense_gcbs_reference(x, y, quantile, seed):
    """Dense NumPy GCBS: exact quantile of all off-diagonal cosines, threshold, RCM."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    n = len(x)
    s = x.astype(np.float64) @ y.T.astype(np.float64)
    off = s[~np.eye(n, dtype=bool)]
    k = int(np.ceil(quantile * off.size))
    thr = np.sort(off)[k - 1]
    np.fill_diagonal(s, -np.inf)
    a = (s > thr)
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.argsort(relabel)
    a = a[np.ix_(relabel, relabel)]  # row/col i of the relabelled matrix = item relabel[i]
    sym = sp.csr_matrix((a | a.T).astype(np.int8))
    order = reverse_cuthill_mckee(sym, symmetric_mode=True)
    return relabel[order], thr, inverse


@pytest.mark.parametrize("paired", [False, True])
def test_gcbs_matches_dense_reference(rng, paired):
    x = unit_rows(rng, 300, 8)
    y = x + 0.3 * unit_rows(rng, 300, 8) if paired else x
    perm = hb.gcbs_permutation(x, 0.98, paired=y if paired else None, seed=4)
    ref, _, _ = dense_gcbs_reference(x, y, 0.98, seed=4)
    assert perm.tolist() == ref.tolist()


def test_threshold_is_exact_when_all_rows_fit(rng):
    x = unit_rows(rng, 200, 6)
    thr = similarity_threshold(x, x, 0.99)
    _, ref_thr, _ = dense_gcbs_reference(x, x, 0.99, 0)
    assert thr == pytest.approx(ref_thr, abs=1e-5)


def test_threshold_estimate_from_sampled_rows(rng):
    x = unit_rows(rng, 3000, 6)
    exact = similarity_threshold(x, x, 0.995)
    estimate = similarity_threshold(x, x, 0.995, sample_size=600_000)  # ~200 of 3000 rows
    assert estimate == pytest.approx(exact, abs=0.01)


def test_ivf_pairs_are_a_subset_with_high_recall(rng):
    x = unit_rows(rng, 2000, 8)
    exact = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, 0.9)]))
    approx = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, 0.9, "ivf", nprobe=8)]))
    assert approx <= exact and len(approx) > 0.8 * len(exact)
    everything = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, 0.9, "ivf", nlist=10,
                                                                   nprobe=10)]))
    assert everything == exact  # probing every list is exact


def test_exact_pairs_match_dense(rng):
    x = unit_rows(rng, 150, 5)
    rows, cols = thresholded_pairs(x, x, 0.8)
    s = x @ x.T
    np.fill_diagonal(s, -np.inf)
    ref = set(zip(*np.nonzero(s > 0.8)))
    assert set(zip(rows.tolist(), cols.tolist())) == ref


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
    (dict(method="hnsw"), "method='hnsw' must be 'exact', 'ivf', 'faiss' or 'partition'"),
    (dict(paired=np.ones((5, 4), np.float32)), "paired has shape"),
    (dict(method="ivf", nlist=-1), "nlist=-1 must be >= 1"),
    (dict(method="ivf", nlist=0), "nlist=0 must be >= 1"),
    (dict(method="ivf", nlist=4.0), "nlist must be an integer"),
    (dict(method="ivf", nprobe=0), "nprobe=0 must be >= 1"),
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


def test_thresholded_pairs_checks_the_inverted_lists(rng):
    x = unit_rows(rng, 60, 4)
    with pytest.raises(ValueError, match="nlist=-1 must be >= 1"):
        thresholded_pairs(x, x, 0.5, "ivf", nlist=-1)
    with pytest.raises(ValueError, match="nprobe=-2 must be >= 1"):
        thresholded_pairs(x, x, 0.5, "ivf", nprobe=-2)
