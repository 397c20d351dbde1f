import numpy as np
import pytest
import scipy.sparse as sp
import torch
from support import unit_rows
from scipy.sparse.csgraph import reverse_cuthill_mckee

import hardbatch as hb
from hardbatch import _rng
from hardbatch.batching import gcbs
from hardbatch.batching.gcbs import similarity_threshold, thresholded_pairs


def dense_pairs_reference(x, y, thr, min_partners):
    """Float64 adjacency [N, N]: s_ij > thr, plus each row's ``min_partners`` largest s_ij."""
    s = x.astype(np.float64) @ y.T.astype(np.float64)
    np.fill_diagonal(s, -np.inf)
    a = s > thr
    if min_partners:
        top = np.argsort(-s, axis=1, kind="stable")[:, :min_partners]
        a[np.arange(len(x))[:, None], top] = True
    return a


def dense_gcbs_reference(x, y, quantile, seed, min_partners=0):
    """Dense NumPy GCBS: exact quantile of all off-diagonal cosines, threshold (plus each
    item's ``min_partners`` strongest pairs), RCM."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    n = len(x)
    s = x.astype(np.float64) @ y.T.astype(np.float64)
    off = s[~np.eye(n, dtype=bool)]
    k = int(np.ceil(quantile * off.size))
    thr = np.sort(off)[k - 1]
    a = dense_pairs_reference(x, y, thr, min_partners)
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.argsort(relabel)
    a = a[np.ix_(relabel, relabel)]  # row/col i of the relabelled matrix = item relabel[i]
    sym = sp.csr_matrix((a | a.T).astype(np.int8))
    order = reverse_cuthill_mckee(sym, symmetric_mode=True)
    return relabel[order], thr, inverse


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


@pytest.mark.parametrize("k", [1, 5])
def test_min_partners_pairs_match_dense_reference(rng, k):
    x = unit_rows(rng, 400, 6)
    y = unit_rows(rng, 400, 6)
    for other in (x, y):
        rows, cols = thresholded_pairs(x, other, 0.9, min_partners=k)
        got = set(zip(rows.tolist(), cols.tolist()))
        want = set(zip(*np.nonzero(dense_pairs_reference(x, other, 0.9, k))))
        assert got == want and len(got) == len(rows)  # no pair twice
        assert np.bincount(rows, minlength=400).min() >= k  # every item has k partners


def test_strongest_partners_only_for_rows_short_of_pairs():
    sims = torch.tensor([[-torch.inf, 0.9, 0.8, 0.1, 0.0],  # two pairs above 0.5: enough
                         [0.9, -torch.inf, 0.3, 0.2, 0.4],  # one: adds its next strongest
                         [0.1, 0.2, -torch.inf, 0.3, -0.5]])  # none: its two strongest
    hit_rows = torch.nonzero(sims > 0.5, as_tuple=True)[0]
    r, c = gcbs.strongest_partners(sims, hit_rows, 2, 0.5)
    assert sorted(zip(r.tolist(), c.tolist())) == [(1, 4), (2, 1), (2, 3)]


def test_min_partners_leaves_no_item_alone_with_every_method(rng):
    pytest.importorskip("faiss")
    x = unit_rows(rng, 1500, 8)
    thr = similarity_threshold(x, x, 0.999)
    for method in ("exact", "ivf", "faiss"):
        rows, _ = thresholded_pairs(x, x, thr, method, nlist=12, nprobe=2, min_partners=4)
        assert np.bincount(rows, minlength=1500).min() >= 4, method
        assert (rows != _).all()
        plain = thresholded_pairs(x, x, thr, method, nlist=12, nprobe=2)
        assert set(zip(*plain)) <= set(zip(rows.tolist(), _.tolist())), method
    exact = set(zip(*[a.tolist() for a in thresholded_pairs(x, x, thr, min_partners=4)]))
    everything = set(zip(*[a.tolist() for a in thresholded_pairs(
        x, x, thr, "ivf", nlist=12, nprobe=12, min_partners=4)]))
    assert everything == exact  # probing every list is exact, partners included


def test_pair_search_units_shard_with_partners(rng):
    x = unit_rows(rng, 800, 6)
    for method in ("exact", "ivf"):
        plan = gcbs.PairSearchPlan(x, x, 0.97, method, nlist=None, nprobe=3, seed=0,
                                   device=None, precision="fp32", min_partners=3)
        whole = set(zip(*[a.tolist() for a in plan.pairs(0, plan.num_units)]))
        cut = plan.num_units // 2
        parts = [plan.pairs(0, cut), plan.pairs(cut, plan.num_units)]
        assert whole == {p for r, c in parts for p in zip(r.tolist(), c.tolist())}


def torch_block_pairs(sims, self_col, threshold, k):
    """The selection of one block before issue 33: -inf on self, mask, nonzero, topk."""
    sims = sims.clone()
    mine = torch.nonzero(self_col >= 0).squeeze(1)
    sims[mine, self_col[mine]] = -torch.inf
    r, c = torch.nonzero(sims > threshold, as_tuple=True)
    if k:
        r2, c2 = gcbs.strongest_partners(sims, r, k, threshold)
        r, c = torch.cat([r, r2]), torch.cat([c, c2])
    return set(zip(r.tolist(), c.tolist()))


@pytest.mark.parametrize("k", [0, 1, 16])
@pytest.mark.parametrize("copies", [1, 3])
def test_compiled_block_selection_equals_torch(rng, k, copies):
    """block_pairs (one pass, CPU) gives the torch selection's pairs, exact ties included
    (rows whose partners tie at the boundary go to the torch path in PairSearchPlan)."""
    from hardbatch.batching.gcbs.blocks import block_pairs

    x = np.repeat(unit_rows(rng, 300 // copies, 5), copies, axis=0)  # copies: exact ties
    y = x[rng.permutation(300)[:250]]
    sims = torch.from_numpy(x[:120] @ y.T)
    self_col = torch.from_numpy(np.where(rng.random(120) < 0.5, rng.integers(0, 250, 120), -1))
    threshold = float(np.float32(np.quantile(sims.numpy(), 0.97)))
    rows, cols, tied = block_pairs(sims, self_col.numpy(), threshold, k)
    want = torch_block_pairs(sims, self_col, threshold, k)
    got = set(zip(rows.tolist(), cols.tolist()))
    assert len(got) == len(rows)
    tied_rows = set(tied.tolist())  # hits only: their partners are the caller's
    assert got == {(i, j) for i, j in want if i not in tied_rows or sims[i, j] > threshold}
    assert len(tied) == 0 or (k > 0 and copies > 1)  # ties only among copies
    plan = gcbs.PairSearchPlan(x, x, threshold, "exact", nlist=None, nprobe=1, seed=0,
                               device=None, precision="fp32", min_partners=k)
    full = torch.from_numpy(x @ x.T)
    r, c = plan._hits(full.clone(), torch.arange(300))
    assert set(zip(r.tolist(), c.tolist())) == torch_block_pairs(full, torch.arange(300),
                                                                 threshold, k)


def test_partition_order_does_not_depend_on_threads(rng):
    x = unit_rows(rng, 2000, 6)
    threads = torch.get_num_threads()
    try:
        orders = []
        for t in (1, 3):
            torch.set_num_threads(t)
            orders.append(hb.gcbs_permutation(x, 0.995, method="partition", partitions=5))
            assert torch.get_num_threads() == t
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*orders)


def test_partition_keeps_partners_inside_cells(rng):
    x = unit_rows(rng, 600, 6)
    one = hb.gcbs_permutation(x, 0.999, method="partition", partitions=1, seed=3)
    assert torch.equal(one, hb.gcbs_permutation(x, 0.999, method="exact", seed=3))
    four = hb.gcbs_permutation(x, 0.999, method="partition", partitions=4, seed=3)
    assert sorted(four.tolist()) == list(range(600))


def test_threshold_is_exact_when_all_rows_fit(rng):
    x = unit_rows(rng, 200, 6)
    thr = similarity_threshold(x, x, 0.99)
    _, ref_thr, _ = dense_gcbs_reference(x, x, 0.99, 0)
    # the threshold lies halfway between the exact quantile's value and the next similarity
    # above it (more than 1e-5 higher): no pair within 5e-6 of it, the same pairs pass
    s = x.astype(np.float64) @ x.T.astype(np.float64)
    np.fill_diagonal(s, -np.inf)
    higher = s[s > ref_thr + 1e-5].min()
    assert ref_thr < thr < higher
    assert np.abs(s - thr).min() >= 5e-6 - 1e-7
    assert ((s > thr) == (s > ref_thr)).all()


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


def test_thresholded_pairs_checks_min_partners(rng):
    x = unit_rows(rng, 20, 4)
    with pytest.raises(ValueError, match="min_partners=20 must lie in"):
        thresholded_pairs(x, x, 0.5, min_partners=20)
    assert len(thresholded_pairs(x, x, 2.0, min_partners=19)[0]) == 20 * 19  # all pairs


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


def interleave_reference(order, chunk):
    """Plain Python: chunks of ``chunk`` items, chunk j of the result = chunk j*s mod C."""
    import math

    chunks = [list(order[i:i + chunk]) for i in range(0, len(order), chunk)]
    count = len(chunks)
    step = max(1, round(count / ((1 + math.sqrt(5)) / 2)))
    while math.gcd(step, count) != 1:
        step += 1
    return [v for j in range(count) for v in chunks[j * step % count]]


@pytest.mark.parametrize("n,chunk", [(23, 5), (256, 32), (1000, 7), (10, 1), (10, 10), (5, 0)])
def test_interleave_chunks_matches_reference(rng, n, chunk):
    order = rng.permutation(n)
    got = gcbs.interleave_chunks(order, chunk)
    want = interleave_reference(order, chunk) if 0 < chunk < n else list(order)
    assert got.tolist() == want and got.dtype == np.int64


def test_interleave_spreads_dense_regions_over_batches():
    # An order of 16 regions of 64 consecutive items (a near-duplicate head, say): batches
    # of 64 cut from it hold one region each; interleaved by chunks of 8, each holds chunks
    # of at least 6 regions, and every chunk stays whole.
    order = np.arange(1024)
    mixed = gcbs.interleave_chunks(order, 8)
    regions = mixed.reshape(16, 64) // 64
    assert min(len(set(r.tolist())) for r in regions) >= 6
    assert (np.diff(mixed.reshape(-1, 8), axis=1) == 1).all()


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


def test_default_interleave_and_build_options():
    assert [gcbs.default_interleave(b) for b in (8, 16, 64, 256, 1024)] == [0, 8, 8, 32, 128]
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        gcbs.default_interleave(0)
    big = gcbs.AUTO_IVF_MAX_ITEMS + 1
    assert gcbs.resolve_build("auto", None, None, big) == (
        "partition", gcbs.DEFAULT_MIN_PARTNERS, -(-big // gcbs.AUTO_CELL_ITEMS))
    assert gcbs.resolve_build("partition", 0, None, 250_000) == ("partition", 0, 3)
    assert gcbs.resolve_build("exact", 3, 0, 10) == ("exact", 3, 0)  # unused: not checked
    with pytest.raises(ValueError, match="partitions=0 must be >= 1"):
        gcbs.resolve_build("partition", 3, 0, 10)


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
