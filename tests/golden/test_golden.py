"""Every sampler's batches and every loss's values / gradients equal the recorded golden outputs.

The fixture was recorded before the package layout changed (issue 16); see ``cases.py``. Index
outputs (batches, graphs, permutations) must be identical. Floating-point outputs are compared
bit for bit on the machine kind that recorded them, and to 1e-12 (float64) / 1e-6 (half
inputs, computed in float32) elsewhere, where vectorised reductions may sum in another order.
"""

from __future__ import annotations

import pytest
import torch

from golden import cases

GOLDEN = torch.load(cases.FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def computed() -> dict[str, torch.Tensor]:
    return cases.all_cases()


def test_same_case_names(computed):
    assert sorted(computed) == sorted(GOLDEN["cases"])


@pytest.mark.parametrize("key", sorted(GOLDEN["cases"]))
def test_case_unchanged(computed, key):
    want, got = GOLDEN["cases"][key], computed[key]
    assert got.dtype == want.dtype and got.shape == want.shape, key
    machine = GOLDEN.get("recorded_on", {}).get(key, GOLDEN["machine"])  # cases added later
    if not want.is_floating_point() or machine == cases.machine():
        assert torch.equal(got, want), key
    else:
        tol = 1e-12 if want.dtype == torch.float64 else 1e-6
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
