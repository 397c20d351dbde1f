"""hardbatch.metrics.global_loss (the global-vs-batch loss gap) against a dense float64
reference, on real data (digits) and in a fixed reference embedding; its input checks."""

import math

import numpy as np
import pytest
import torch
from metrics_reference import BATCHES, ref_negative_similarities

import hardbatch as hb
from hardbatch import metrics as M
from hardbatch.metrics import global_loss

# ---------------------------------------------------------------------------------------------
# dense float64 reference
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda x, y: M.loss_gap(x, [[0, 1]], temperature=0), "temperature"),
    (lambda x, y: M.loss_gap(x, [[0, 1]], positives=x[:5]), "positives has shape"),
    (lambda x, y: M.loss_gap(x, [[0, 1]], block_size=0), "block_size"),
    (lambda x, y: M.loss_gap(x, [[0, 12]]), "outside"),
])
def test_bad_input_raises_clear_value_error(tiny, call, match):
    x, y = tiny
    with pytest.raises(ValueError, match=match):
        call(x, y)
