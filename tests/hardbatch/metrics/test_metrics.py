"""hardbatch.metrics against plain-Python / dense float64 references, and on real data (digits)."""

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import hardbatch as hb
from hardbatch import metrics as M
from hardbatch.metrics import global_loss

# ---------------------------------------------------------------------------------------------
# plain-Python references (no vectorisation, no torch)
# ---------------------------------------------------------------------------------------------


def ref_cos(a, b):
    na = math.sqrt(sum(v * v for v in a))
    nb = math.sqrt(sum(v * v for v in b))
    return sum(u * v for u, v in zip(a, b)) / (na * nb)


def ref_negative_similarities(x, batch):
    out = []
    for p in range(len(batch)):
        for q in range(p + 1, len(batch)):
            out.append(ref_cos(x[batch[p]], x[batch[q]]))
    return out


def ref_hardness(x, batch):
    tops = []
    for p in range(len(batch)):
        tops.append(max(ref_cos(x[batch[p]], x[batch[q]]) for q in range(len(batch)) if q != p))
    return sum(tops) / len(tops)


def ref_fn_rate(labels, batch):
    same = total = 0
    for p in range(len(batch)):
        for q in range(len(batch)):
            if p != q:
                total += 1
                same += labels[batch[p]] == labels[batch[q]]
    return same / total


def ref_duplicate_rate(batch):
    seen, dup = set(), 0
    for b in batch:
        dup += b in seen
        seen.add(b)
    return dup / len(batch)


def ref_loss_gap(x, batches, t, y=None):
    """Dense float64 reference: full N x N logsumexp, per-occurrence batch losses."""
    x = np.asarray(x, np.float64)
    y = x if y is None else np.asarray(y, np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    s = x @ y.T / t
    n = len(x)

    def lse(v):
        m = v.max()
        return m + math.log(np.exp(v - m).sum())

    glob = np.array([lse(s[i]) - s[i, i] for i in range(n)])
    occ = {}
    for batch in batches:
        cols = sorted({int(b) for b in batch})
        for i in batch:
            occ.setdefault(int(i), []).append(lse(s[int(i), cols]) - s[int(i), int(i)])
    drawn = sorted(occ)
    batch_loss = np.array([np.mean(occ[i]) for i in drawn])
    return {"global_loss": glob.mean(), "batch_loss": batch_loss.mean(),
            "gap": (glob[drawn] - batch_loss).mean(), "items_drawn": len(drawn)}


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((12, 5)) * rng.uniform(0.5, 3.0, size=(12, 1))  # unnormalised rows
    labels = rng.integers(0, 3, size=12)
    return x.astype(np.float32), labels


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    x = x.astype(np.float32)
    x -= x.mean(axis=0)  # centred pixels: cosine similarity is then informative
    return x, y.astype(np.int64)


BATCHES = [[0, 3, 5, 7], [11, 2, 9], [4, 4, 1, 6, 8], [10, 1]]


# ---------------------------------------------------------------------------------------------
# per-batch metrics vs references
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", BATCHES)
def test_negative_similarities_matches_loop(tiny, batch):
    x, _ = tiny
    got = M.negative_similarities(x, batch)
    ref = ref_negative_similarities(x.tolist(), batch)
    assert got.shape == (len(batch) * (len(batch) - 1) // 2,)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-6)


def test_negative_similarities_accepts_tensors_and_arrays(tiny):
    x, _ = tiny
    a = M.negative_similarities(torch.from_numpy(x), torch.tensor([1, 2, 3]))
    b = M.negative_similarities(x.astype(np.float64), np.array([1, 2, 3], dtype=np.int32))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert M.negative_similarities(x, [4]).numel() == 0


@pytest.mark.parametrize("batch", BATCHES)
def test_similarity_histogram_matches_numpy(tiny, batch):
    x, _ = tiny
    counts, edges = M.similarity_histogram(x, batch, bins=7, range=(-1.0, 1.0))
    ref_counts, ref_edges = np.histogram(ref_negative_similarities(x.tolist(), batch), bins=7,
                                         range=(-1.0, 1.0))
    assert counts.dtype == torch.int64 and edges.shape == (8,)
    np.testing.assert_array_equal(counts.numpy(), ref_counts)
    np.testing.assert_allclose(edges.numpy(), ref_edges)


def test_similarity_histogram_counts_identical_rows_in_last_bin():
    x = np.ones((3, 4), np.float32)  # cosine exactly 1 (up to rounding): must not be dropped
    counts, _ = M.similarity_histogram(x, [0, 1, 2], bins=4)
    assert counts.tolist() == [0, 0, 0, 3]


@pytest.mark.parametrize("batch", BATCHES)
def test_batch_hardness_matches_loop(tiny, batch):
    x, _ = tiny
    assert M.batch_hardness(x, batch) == pytest.approx(ref_hardness(x.tolist(), batch), abs=1e-6)


def test_batch_hardness_single_item_is_nan(tiny):
    assert math.isnan(M.batch_hardness(tiny[0], [3]))


@pytest.mark.parametrize("batch", BATCHES)
def test_false_negative_rate_matches_loop(tiny, batch):
    _, labels = tiny
    got = M.batch_false_negative_rate(labels, batch)
    assert got == pytest.approx(ref_fn_rate(labels.tolist(), batch), abs=1e-12)
    assert M.batch_false_negative_rate(torch.from_numpy(labels), batch) == got
    as_strings = np.array([f"class-{v}" for v in labels])
    assert M.batch_false_negative_rate(as_strings, batch) == got


@pytest.mark.parametrize("batch", BATCHES + [[1, 1, 1], [2, 3, 2, 3, 2]])
def test_duplicate_rate_matches_loop(batch):
    assert M.batch_duplicate_rate(batch) == pytest.approx(ref_duplicate_rate(batch), abs=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
def test_batch_stats_combines_the_single_metrics(tiny, batch):
    x, labels = tiny
    st = M.batch_stats(x, batch, labels)
    assert st["hardness"] == pytest.approx(M.batch_hardness(x, batch), abs=1e-12)
    assert st["false_negative_rate"] == M.batch_false_negative_rate(labels, batch)
    assert st["duplicate_rate"] == M.batch_duplicate_rate(batch)
    ref = ref_negative_similarities(x.tolist(), batch)
    assert st["mean_negative_similarity"] == pytest.approx(sum(ref) / len(ref), abs=1e-6)
    assert st["batch_size"] == len(batch)
    assert "false_negative_rate" not in M.batch_stats(x, batch)


# ---------------------------------------------------------------------------------------------
# per-epoch metrics
# ---------------------------------------------------------------------------------------------
def test_draw_counts_and_coverage_match_loop():
    counts = M.draw_counts(BATCHES, 14)
    ref = [0] * 14
    for batch in BATCHES:
        for i in batch:
            ref[i] += 1
    assert counts.dtype == torch.int64 and counts.tolist() == ref
    assert M.coverage(BATCHES, 14) == pytest.approx(sum(c > 0 for c in ref) / 14)
    assert M.coverage(np.arange(12).reshape(3, 4), 12) == 1.0  # a 2-D array of batches
    assert M.coverage(iter([[0, 1]]), 4) == 0.5  # a one-shot iterator


def test_plan_stats_pools_anchors_pairs_and_entries(tiny):
    x, labels = tiny
    xl, ll = x.tolist(), labels.tolist()
    st = M.plan_stats(x, BATCHES, labels, bins=10)
    # reference: every anchor / pair / entry of every batch counts once
    tops, same, pairs, sims = [], 0, 0, []
    for b in BATCHES:
        for p in range(len(b)):
            tops.append(max(ref_cos(xl[b[p]], xl[b[q]]) for q in range(len(b)) if q != p))
            for q in range(p + 1, len(b)):
                pairs += 1
                same += ll[b[p]] == ll[b[q]]
        sims += ref_negative_similarities(xl, b)
    assert st["hardness"] == pytest.approx(np.mean(tops), abs=1e-6)
    assert st["false_negative_rate"] == pytest.approx(same / pairs, abs=1e-12)
    assert st["mean_negative_similarity"] == pytest.approx(np.mean(sims), abs=1e-6)
    entries = list(itertools.chain.from_iterable(BATCHES))
    repeats = sum(len(b) - len(set(b)) for b in BATCHES)
    assert st["duplicate_rate"] == pytest.approx(repeats / len(entries))
    counts, edges = st["histogram"]
    assert counts.tolist() == np.histogram(sims, bins=10, range=(-1, 1))[0].tolist()
    assert edges.shape == (11,)
    assert st["coverage"] == M.coverage(BATCHES, 12)
    assert st["batches"] == 4 and st["items_drawn"] == len(entries)


def test_plan_stats_of_equal_batches_is_the_mean_of_batch_stats(tiny):
    x, labels = tiny
    plan = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    st = M.plan_stats(x, plan, labels)
    per = [M.batch_stats(x, b, labels) for b in plan]
    for key in ("hardness", "false_negative_rate", "mean_negative_similarity", "duplicate_rate"):
        assert st[key] == pytest.approx(np.mean([p[key] for p in per]), abs=1e-12), key


def test_plan_stats_ignores_pairless_single_item_batches(tiny):
    x, labels = tiny
    st = M.plan_stats(x, [[0, 1, 2], [3]], labels)
    assert st["hardness"] == pytest.approx(M.batch_hardness(x, [0, 1, 2]))
    assert st["false_negative_rate"] == M.batch_false_negative_rate(labels, [0, 1, 2])
    assert st["coverage"] == pytest.approx(4 / 12)


# ---------------------------------------------------------------------------------------------
# loss gap vs dense float64 reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0.5, 0.1, 0.02])
@pytest.mark.parametrize("block_size", [1, 5, 512])
def test_loss_gap_matches_dense_reference(t, block_size):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 6)).astype(np.float32)
    batches = [rng.permutation(37)[:8] for _ in range(6)] + [[4, 4, 9]]  # overlaps, repeats
    got = M.loss_gap(x, batches, temperature=t, block_size=block_size)
    ref = ref_loss_gap(x, batches, t)
    for key in ("global_loss", "batch_loss", "gap"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-5), key
    assert got["items_drawn"] == ref["items_drawn"]
    assert got["coverage"] == pytest.approx(ref["items_drawn"] / 37)


@pytest.mark.parametrize("t", [0.5, 0.01])  # direct exp (symmetric / not) and streaming max
@pytest.mark.parametrize("with_positives", [False, True])
def test_loss_gap_many_tiles_match_dense_reference(monkeypatch, t, with_positives):
    """Tiny tiles: many row blocks and column chunks, ragged last ones, in every code path."""
    monkeypatch.setattr(global_loss, "_TILE_ELEMENTS", 60)
    monkeypatch.setattr(global_loss, "_MIN_COLS", 3)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((53, 5)).astype(np.float32)
    y = (x + 0.5 * rng.standard_normal((53, 5))).astype(np.float32) if with_positives else None
    batches = np.array_split(rng.permutation(53), 6)
    for block_size in (4, 7, 53):
        got = M.loss_gap(x, batches, temperature=t, positives=y, block_size=block_size)
        ref = ref_loss_gap(x, batches, t, y)
        for key in ("global_loss", "batch_loss", "gap"):
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-4), (key, block_size)


def test_loss_gap_with_positive_views_matches_reference():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 8)).astype(np.float32)
    y = x + 0.3 * rng.standard_normal((40, 8)).astype(np.float32)
    batches = np.array_split(rng.permutation(40), 5)
    got = M.loss_gap(torch.from_numpy(x), batches, temperature=0.2, positives=y, block_size=7)
    ref = ref_loss_gap(x, batches, 0.2, y)
    for key in ("global_loss", "batch_loss", "gap"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-5), key
    # a full partition: gap is exactly global - batch
    assert got["gap"] == pytest.approx(got["global_loss"] - got["batch_loss"], abs=1e-9)


def test_loss_gap_object_scores_several_plans_against_one_global_term():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 8)).astype(np.float32)
    plans = [np.array_split(rng.permutation(40), 5), [rng.permutation(40)[:12]]]
    gap = M.LossGap(x, temperature=0.3, block_size=7)
    assert gap.global_losses.shape == (40,) and gap.global_losses.dtype == torch.float64
    for plan in plans:
        assert gap(plan) == M.loss_gap(x, plan, temperature=0.3, block_size=7)
    with pytest.raises(ValueError, match="outside"):
        gap([[0, 40]])
    with pytest.raises(ValueError, match="block_size"):
        M.LossGap(x, block_size=0)


def test_loss_gap_is_nonnegative_and_zero_for_one_full_batch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((50, 4)).astype(np.float32)
    for t in (1.0, 0.3, 0.05):
        for batches in ([rng.permutation(50)[:10]], np.array_split(rng.permutation(50), 7)):
            assert M.loss_gap(x, batches, temperature=t)["gap"] >= 0.0
        full = M.loss_gap(x, [np.arange(50)], temperature=t)
        assert full["gap"] == pytest.approx(0.0, abs=1e-5)
        assert full["batch_loss"] == pytest.approx(full["global_loss"], abs=1e-5)


def test_loss_gap_streaming_handles_cold_temperature():
    """t = 0.01 (logits up to 100): the per-tile max path must not overflow or underflow."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((30, 3)).astype(np.float32)
    y = rng.standard_normal((30, 3)).astype(np.float32)  # unrelated views: positive logits small
    got = M.loss_gap(x, [np.arange(15), np.arange(15, 30)], temperature=0.01, positives=y)
    ref = ref_loss_gap(x, [np.arange(15), np.arange(15, 30)], 0.01, y)
    assert all(math.isfinite(got[k]) for k in ("global_loss", "batch_loss", "gap"))
    assert got["global_loss"] == pytest.approx(ref["global_loss"], rel=1e-4)
    assert got["gap"] == pytest.approx(ref["gap"], rel=1e-4, abs=1e-4)


# ---------------------------------------------------------------------------------------------
# real data: sklearn digits (10 balanced classes, 1797 images)
# ---------------------------------------------------------------------------------------------
def test_uniform_false_negative_rate_on_digits_is_about_one_tenth(digits):
    _x, y = digits
    sampler = hb.UniformBatchSampler(len(y), 64, drop_last=True, seed=0)
    rates = []
    for epoch in range(5):
        sampler.set_epoch(epoch)
        rates += [M.batch_false_negative_rate(y, b) for b in sampler]
    counts = np.bincount(y).astype(np.float64)
    expected = (counts * (counts - 1)).sum() / (len(y) * (len(y) - 1))  # 0.0998
    assert abs(np.mean(rates) - expected) < 0.01
    assert abs(np.mean(rates) - 0.1) < 0.01


def test_gcbs_batches_have_smaller_loss_gap_than_uniform_on_digits(digits):
    x, y = digits
    uniform = list(hb.UniformBatchSampler(len(x), 64, seed=0))
    gcbs = list(hb.GCBSSampler(x, 64, seed=0, method="exact", min_partners=0, interleave=0))
    assert M.coverage(uniform, len(x)) == M.coverage(gcbs, len(x)) == 1.0
    for t in (0.5, 0.1):  # the paper's sampler (GCBS Fig. 4)
        gu = M.loss_gap(x, uniform, temperature=t)
        gg = M.loss_gap(x, gcbs, temperature=t)
        assert gu["global_loss"] == pytest.approx(gg["global_loss"])  # same embeddings
        assert 0.0 <= gg["gap"] < 0.95 * gu["gap"], (t, gg, gu)
    # and GCBS batches are harder (Fig. 4 left: histogram shifted right)
    su, sg = M.plan_stats(x, uniform, y), M.plan_stats(x, gcbs, y)
    assert sg["hardness"] > su["hardness"]
    assert sg["mean_negative_similarity"] > su["mean_negative_similarity"] + 0.05
    # the library's default (partners, interleaved chunks) trades some of that gap for fewer
    # same-label batches; its batches are still harder and its gap still smaller than uniform's
    default = list(hb.GCBSSampler(x, 64, seed=0))
    assert M.loss_gap(x, default, temperature=0.1)["gap"] < 0.97 * M.loss_gap(
        x, uniform, temperature=0.1)["gap"]
    sd = M.plan_stats(x, default, y)
    assert sd["hardness"] > su["hardness"]


def test_uniform_loss_gap_is_stable_across_seeds_on_digits(digits):
    """The GCBS margin above is far outside the seed-to-seed spread of uniform batches."""
    x, _ = digits
    gaps = [M.loss_gap(x, list(hb.UniformBatchSampler(len(x), 64, seed=s)), temperature=0.1)["gap"]
            for s in range(3)]
    gcbs = M.loss_gap(x, list(hb.GCBSSampler(x, 64, seed=0)), temperature=0.1)["gap"]
    assert max(gaps) - min(gaps) < 0.1 < min(gaps) - gcbs


# ---------------------------------------------------------------------------------------------
# a fixed reference embedding (issue 22, item 5)
# ---------------------------------------------------------------------------------------------
def ref_near_duplicate_rate(x, batch, threshold):
    pairs = ref_negative_similarities(x, batch)
    return sum(v > threshold for v in pairs) / len(pairs)


@pytest.fixture(scope="module")
def reference(tiny):
    rng = np.random.default_rng(11)
    return rng.standard_normal((len(tiny[0]), 3)).astype(np.float32)  # another embedding


@pytest.mark.parametrize("batch", BATCHES)
def test_batch_stats_reference_figures_are_measured_in_the_reference(tiny, reference, batch):
    x, labels = tiny
    st = M.batch_stats(x, batch, labels, reference=reference, near_duplicate=0.2)
    assert st["hardness"] == pytest.approx(ref_hardness(x.tolist(), batch), abs=1e-9)
    assert st["reference_hardness"] == pytest.approx(ref_hardness(reference.tolist(), batch),
                                                     abs=1e-9)
    assert st["reference_mean_negative_similarity"] == pytest.approx(
        np.mean(ref_negative_similarities(reference.tolist(), batch)), abs=1e-9)
    assert st["reference_near_duplicate_rate"] == pytest.approx(
        ref_near_duplicate_rate(reference.tolist(), batch, 0.2))
    assert st["false_negative_rate"] == pytest.approx(ref_fn_rate(labels, batch))
    assert M.batch_near_duplicate_rate(reference, batch, 0.2) == \
        st["reference_near_duplicate_rate"]
    assert "reference_hardness" not in M.batch_stats(x, batch)  # only when asked


def test_plan_stats_and_loss_gap_reference_equal_the_figures_of_the_reference(tiny, reference):
    x, labels = tiny
    plan = BATCHES
    st = M.plan_stats(x, plan, labels, bins=10, reference=reference)
    in_ref = M.plan_stats(reference, plan, labels, bins=10)
    for key in ("hardness", "mean_negative_similarity"):
        assert st[f"reference_{key}"] == pytest.approx(in_ref[key], abs=1e-12)
    assert torch.equal(st["reference_histogram"][0], in_ref["histogram"][0])
    assert st["hardness"] == M.plan_stats(x, plan, labels, bins=10)["hardness"]
    pairs = [v for b in plan for v in ref_negative_similarities(reference.tolist(), b)]
    assert st["reference_near_duplicate_rate"] == pytest.approx(
        sum(v > 0.9 for v in pairs) / len(pairs))
    gap = M.loss_gap(x, plan, temperature=0.3, reference=reference)
    want = ref_loss_gap(reference, plan, 0.3)
    for key in ("global_loss", "batch_loss", "gap"):
        assert gap[f"reference_{key}"] == pytest.approx(want[key], abs=1e-5)
    assert gap["gap"] == pytest.approx(ref_loss_gap(x, plan, 0.3)["gap"], abs=1e-5)


def test_reference_from_files_and_as_embeddings(tiny, reference, tmp_path):
    x, _ = tiny
    np.save(tmp_path / "ref.npy", reference)
    torch.save({"embeddings": torch.from_numpy(reference)}, tmp_path / "ref.pt")
    want = M.batch_stats(x, [0, 3, 5], reference=reference)
    for path in (tmp_path / "ref.npy", str(tmp_path / "ref.pt")):
        assert M.batch_stats(x, [0, 3, 5], reference=path) == want
        assert M.batch_hardness(path, [0, 3, 5]) == pytest.approx(want["reference_hardness"])
    assert np.array_equal(M.load_reference(tmp_path / "ref.npy", len(x)), reference)
    assert M.batch_stats(x, [0, 3], reference=torch.from_numpy(reference))[
        "reference_hardness"] == pytest.approx(M.batch_hardness(reference, [0, 3]))


@pytest.mark.parametrize("case, match", [
    ("rows", "reference has 5 rows but"),
    ("nan", "NaN or inf"),
    ("text-npy", "is not a NumPy array file"),
    ("missing", "file not found"),
    ("threshold", "near_duplicate=1.5 must be a cosine"),
])
def test_bad_reference_is_a_clear_error(tiny, reference, tmp_path, case, match):
    x, _ = tiny
    ref = reference
    kwargs = {}
    if case == "rows":
        ref = reference[:5]
    elif case == "nan":
        ref = reference.copy()
        ref[2, 0] = np.inf
    elif case == "text-npy":
        ref = tmp_path / "ref.npy"
        ref.write_text("0.1 0.2\n0.3 0.4\n")
    elif case == "missing":
        ref = tmp_path / "nope.npy"
    else:
        kwargs["near_duplicate"] = 1.5
    with pytest.raises((ValueError, FileNotFoundError), match=match) as err:
        M.plan_stats(x, BATCHES, reference=ref, **kwargs)
    assert "allow_pickle" not in str(err.value)
    if case == "rows":
        with pytest.raises(ValueError, match=match):
            M.loss_gap(x, BATCHES, reference=ref)


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda x, y: M.batch_hardness(x, [0, 99]), r"batch holds item id 99, outside \[0, 12\)"),
    (lambda x, y: M.batch_hardness(x, [-1, 2]), "outside"),
    (lambda x, y: M.batch_hardness(x, []), "batch is empty"),
    (lambda x, y: M.batch_hardness(x, [[0, 1], [2, 3]]), "1-D"),
    (lambda x, y: M.batch_hardness(x, [0.0, 1.5]), "integer item ids"),
    (lambda x, y: M.batch_hardness(x[0], [0]), "embeddings must be 2-D"),
    (lambda x, y: M.batch_hardness(x[:0], [0]), "embeddings is empty"),
    (lambda x, y: M.batch_false_negative_rate(y, [0, 12]), "outside"),
    (lambda x, y: M.batch_false_negative_rate(y.reshape(3, 4), [0, 1]), "labels must be 1-D"),
    (lambda x, y: M.batch_false_negative_rate(np.array([0.0, np.nan]), [0, 1]), "NaN"),
    (lambda x, y: M.batch_stats(x, [0, 1], y[:5]), "labels has 5 entries"),
    (lambda x, y: M.similarity_histogram(x, [0, 1], bins=0), "bins"),
    (lambda x, y: M.similarity_histogram(x, [0, 1], range=(1, -1)), "range"),
    (lambda x, y: M.draw_counts([], 5), "batches is empty"),
    (lambda x, y: M.draw_counts([0, 1, 2], 5), "flat list"),
    (lambda x, y: M.draw_counts([[0, 5]], 5), r"batches\[0\] holds item id 5"),
    (lambda x, y: M.coverage([[0]], 0), "num_items"),
    (lambda x, y: M.loss_gap(x, [[0, 1]], temperature=0), "temperature"),
    (lambda x, y: M.loss_gap(x, [[0, 1]], positives=x[:5]), "positives has shape"),
    (lambda x, y: M.loss_gap(x, [[0, 1]], block_size=0), "block_size"),
    (lambda x, y: M.loss_gap(x, [[0, 12]]), "outside"),
])
def test_bad_input_raises_clear_value_error(tiny, call, match):
    x, y = tiny
    with pytest.raises(ValueError, match=match):
        call(x, y)


def test_nan_embeddings_are_rejected(tiny):
    x = tiny[0].copy()
    x[3, 1] = np.nan
    with pytest.raises(ValueError, match="row 3 contains NaN"):
        M.batch_hardness(x, [1, 3])
    with pytest.raises(ValueError, match="NaN"):
        M.loss_gap(x, [[0, 1]])
    assert math.isfinite(M.batch_hardness(x, [0, 1]))  # rows outside the batch are not read


# `import hardbatch.plots` (and every other library module) loads no matplotlib: checked with the
# other optional packages in one interpreter by tests/test_layout.py
# (test_importing_the_library_loads_no_experiment_or_optional_package).


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def test_plots_write_files(tmp_path, tiny):
    from hardbatch.plots import plot_metric_curves, plot_similarity_histograms

    x, _labels = tiny
    hists = {"a": M.similarity_histogram(x, [0, 1, 2, 3], bins=20),
             "b": M.similarity_histogram(x, [4, 5, 6, 7, 8], bins=20)}
    p = plot_similarity_histograms(hists, tmp_path / "sub" / "h.png", title="t")
    assert p == str(tmp_path / "sub" / "h.png") and (tmp_path / "sub" / "h.png").stat().st_size > 0
    q = plot_metric_curves({"uniform": ([0, 1, 2], [0.1, 0.1, 0.11]),
                            "knn": (np.arange(3), torch.tensor([0.5, 0.6, 0.7]))},
                           tmp_path / "c.png", ylabel="false-negative rate", title="FN")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG" and q.endswith("c.png")
    with pytest.raises(ValueError, match="edges"):
        plot_similarity_histograms({"a": ([1, 2], [0, 1])}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="one value per step"):
        plot_metric_curves({"a": ([0, 1], [1.0])}, tmp_path / "y.png", ylabel="v")
    with pytest.raises(ValueError, match="extension"):
        plot_metric_curves({"a": ([0], [1.0])}, tmp_path / "noext", ylabel="v")
    # issue 17.15: rebuild steps marked on a curve, the plotted quantity defined under the plot
    curves = {"knn": (np.arange(50), np.linspace(0.1, 0.3, 50))}
    plain = plot_metric_curves(curves, tmp_path / "plain.png", ylabel="false-negative rate")
    marked = plot_metric_curves(curves, tmp_path / "marked.png", ylabel="false-negative rate",
                                events={"knn": [0, 20, 40]}, note="false-negative rate = ...")
    assert Path(plain).read_bytes() != Path(marked).read_bytes()
    with pytest.raises(ValueError, match="events names"):
        plot_metric_curves(curves, tmp_path / "e.png", ylabel="v", events={"gcbs": [3]})
