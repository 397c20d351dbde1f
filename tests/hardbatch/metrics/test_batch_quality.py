"""hardbatch.metrics.batch_quality (per batch and per plan) against plain-Python references,
on real data (digits) and in a fixed reference embedding; its input checks
(hardbatch.metrics._input_checks) next to it; the figures of hardbatch.plots drawn from its histograms."""

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from metrics_reference import BATCHES, ref_cos, ref_negative_similarities

import hardbatch as hb
from hardbatch import metrics as M

# ---------------------------------------------------------------------------------------------
# plain-Python references (no vectorisation, no torch)
# ---------------------------------------------------------------------------------------------


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


def ref_near_duplicate_rate(x, batch, threshold):
    pairs = ref_negative_similarities(x, batch)
    return sum(v > threshold for v in pairs) / len(pairs)


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
    mixed = [f"class-{v}" if v % 2 else int(v) for v in labels]  # str and int: no sort order
    assert M.batch_false_negative_rate(mixed, batch) == got


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


# ---------------------------------------------------------------------------------------------
# a fixed reference embedding (issue 22, item 5)
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# validation (the checks of hardbatch.metrics._input_checks through these functions)
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
    (lambda x, y: M.batch_false_negative_rate([None, "a", None], [0, 1, 2]),
     "labels contains None at position 0; every item needs a label"),
    (lambda x, y: M.batch_stats(x, [0, 1], y[:5]), "labels has 5 entries"),
    (lambda x, y: M.similarity_histogram(x, [0, 1], bins=0), "bins"),
    (lambda x, y: M.similarity_histogram(x, [0, 1], range=(1, -1)), "range"),
    (lambda x, y: M.draw_counts([], 5), "batches is empty"),
    (lambda x, y: M.draw_counts([0, 1, 2], 5), "flat list"),
    (lambda x, y: M.draw_counts([[0, 5]], 5), r"batches\[0\] holds item id 5"),
    (lambda x, y: M.coverage([[0]], 0), "num_items"),
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


# ---------------------------------------------------------------------------------------------
# plots: hardbatch.plots draws these histograms (it has no test file of its own yet;
# tests/hardbatch/test_plots.py would mirror it)
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
