"""Every sampler's batches and every loss's values / gradients equal the recorded golden outputs.

The fixture was recorded before the package layout changed (issue 16); see ``cases.py`` and
``README.md``. Index outputs (batches, graphs, permutations) must be identical everywhere.
Floating-point outputs must lie within 1e-12 (float64) / 1e-6 (float32, half inputs) of the
first recording on every machine, and be bit-identical to the values pinned for this machine
kind where there are any (``cases.machine()``: processor family and model, the CPU capability
torch dispatches to, the BLAS libraries and the kernel-selecting CPU flags, not only the
processor's marketing name, which every EPYC generation shares).
"""

from __future__ import annotations

import pytest
import torch

from golden import cases

GOLDEN = cases.load()
PINNED = GOLDEN["exact"].get(cases.machine(), {})


@pytest.fixture(scope="module")
def computed() -> dict[str, torch.Tensor]:
    return cases.all_cases()


def test_same_case_names(computed):
    assert sorted(computed) == sorted(GOLDEN["cases"])


@pytest.mark.parametrize("key", sorted(GOLDEN["cases"]))
def test_case_unchanged(computed, key):
    cases.compare(key, computed[key], GOLDEN["cases"][key], PINNED.get(key))


def test_machine_key_names_the_kernels():
    key = cases.machine()
    assert f"cap {torch.backends.cpu.get_cpu_capability()}" in key
    assert "torch blas" in key and "numpy blas" in key and "flags" in key


def test_compare_tolerates_kernel_rounding_but_not_a_change_of_formula():
    want = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    cases.compare("k", want * (1 + 1e-14), want)  # another machine's rounding
    with pytest.raises(AssertionError):
        cases.compare("k", want * (1 + 1e-9), want)
    with pytest.raises(AssertionError):  # pinned on this kind: bit for bit
        cases.compare("k", want * (1 + 1e-14), want, exact=want)
    f32 = want.float()
    cases.compare("k", f32 * (1 + 2e-7), f32)
    with pytest.raises(AssertionError):
        cases.compare("k", f32 * 1.001, f32)
    ints = torch.tensor([1, 2, 3])
    with pytest.raises(AssertionError):
        cases.compare("k", ints + 1, ints)
