"""hardbatch.metrics.files: a reference embedding from .npy / .pt files or as an array, and the
clear errors of a bad one (wrong rows, NaN, not a NumPy file, missing)."""

import numpy as np
import pytest
import torch
from metrics_reference import BATCHES

from hardbatch import metrics as M


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
