"""GCBS step 1 (hardbatch.batching.gcbs.threshold): the similarity quantile."""

import numpy as np
import pytest
from gcbs_support import dense_gcbs_reference
from support import unit_rows

from hardbatch.batching.gcbs import similarity_threshold


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
