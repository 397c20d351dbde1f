"""``hardbatch demo code`` (recipes/codesearch/demo.py): its pure parts against hand-made
inputs, a short run on the real code-search data, and its bad-input errors."""

import json
import os

import numpy as np
import pytest

from hardbatch_experiments.recipes.codesearch.demo import (
    batch_summary,
    epoch_batches,
    measured_effects,
    median_batch,
    side_by_side,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_batch_summary_counts_twins_packages_and_hardness():
    emb = np.eye(4, dtype=np.float32)[[0, 0, 1, 2, 3, 3]]  # items 0/1 and 4/5 coincide
    queries = ["a", "a", "b", "c", "d", "a"]
    packages = ["p", "p", "q", "q", "r", "r"]
    s = batch_summary(emb, [np.array([0, 1, 2]), np.array([3, 4, 5])], queries, packages)
    # batch 0: items 0 and 1 share text "a" (2 queries with a twin), packages {p, q}, and two
    # anchors of three have an identical negative (hardness (1 + 1 + 0) / 3)
    # batch 1: no repeated text, packages {q, r}; items 4 and 5 coincide
    np.testing.assert_array_equal(s["repeated"], [2, 0])
    np.testing.assert_array_equal(s["packages"], [2, 2])
    np.testing.assert_allclose(s["hardness"], [2 / 3, 2 / 3], atol=1e-6)
    assert s["batches"] == 2 and s["mean_repeated"] == 1.0


def test_median_batch_is_the_lower_middle_not_the_hardest():
    assert median_batch(np.array([0.9, 0.1, 0.5])) == 2
    assert median_batch(np.array([0.4, 0.3, 0.2, 0.1])) == 2  # sorted: 3, 2, 1, 0 -> index 2


def test_side_by_side_clips_and_pads():
    text = side_by_side(["x" * 30, "short"], ["multi\n  line   text"], ("left", "right"), width=10)
    lines = text.splitlines()
    assert lines[0].startswith("  left") and lines[0].endswith("| right")
    assert lines[2] == "  " + "x" * 9 + "… | multi lin…"
    assert lines[3] == "  short      | "


def test_epoch_batches_keys_keep_twins_apart():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((64, 8)).astype(np.float32)
    emb[32:] = emb[:32] + 1e-3  # item i + 32 is a near-copy of item i, with the same text
    keys = [f"q{i % 32}" for i in range(64)]
    twins = lambda plan: sum(len(b) - len({keys[i] for i in b}) for b in plan)  # noqa: E731
    for name in ("knn", "gcbs"):
        assert twins(epoch_batches(name, emb, 8, 0)) > 0  # hard batches gather the copies ...
        assert twins(epoch_batches(name, emb, 8, 0, keys)) == 0  # ... keys keep them apart
    kept = epoch_batches("gcbs", emb, 8, 0, keys)  # GCBS: every item once per epoch
    assert sorted(np.concatenate(kept).tolist()) == list(range(64))


def _record(label, seed, value):
    return {"benchmark": "codesearch", "label": label, "seed": seed,
            "metrics": {"test": {"mrr@10": value}}}


def test_measured_effects_are_paired_over_shared_seeds(tmp_path):
    runs = [("default", 1, 0.50), ("default", 2, 0.52), ("gcbs", 1, 0.51), ("gcbs", 2, 0.54),
            ("gcbs", 3, 0.60), ("mined", 1, 0.53)]
    for label, seed, v in runs:
        (tmp_path / f"codesearch__{label}__seed{seed}.json").write_text(
            json.dumps(_record(label, seed, v)))
    lines = measured_effects(tmp_path)
    # gcbs - default on seeds 1, 2 (seed 3 has no partner): differences 1 and 2 points, mean
    # 1.5, sd 0.7071, t(0.975, 1) = 12.706: half-width 6.35
    assert lines[0].startswith("  gcbs - default: +1.50 [-4.85, +7.85] (n = 2, paired)")
    assert "within noise" in lines[0]
    assert lines[1].startswith("  mined - default: +3.00 (n = 1")
    assert lines[2] == "  community - default: no paired seed yet"
    assert measured_effects(tmp_path / "missing") == []


def test_demo_code_on_real_pairs(data_root, cli, tmp_path):
    if not (data_root / "code" / "train.jsonl.gz").is_file():
        pytest.skip("code-search data not found under the shared data folder")
    code, out, err = cli("demo", "code", "--pairs", "128", "--batch-size", "16",
                         "--show", "3", "--hard-sampler", "knn", "--data-dir", str(data_root),
                         "--results", str(tmp_path / "none"))
    assert code == 0, err
    assert "B = 16, 8 batches per epoch" in out
    table = {line[:54].strip(): line[54:].split() for line in out.splitlines()
             if line.startswith("  ") and len(line) > 54}
    uniform, knn = (float(v) for v in table["batch hardness (top-1 negative cosine)"])
    assert knn > uniform  # kNN batches are harder than uniform ones in the same embedding
    assert table["the same with duplicate_keys=queries (shown)"] == ["0.000", "0.000"]
    assert out.count("| ") >= 4  # header + 3 rows of queries side by side
    assert "No code-search results found under" in out and "docs/results/code_search.md" in out


@pytest.mark.parametrize("argv,message", [
    (["--pairs", "10"], "--pairs 10 must be at least two batches"),
    (["--batch-size", "1"], "--batch-size 1 must be at least 2"),
    (["--show", "0"], "--show 0 must be at least 1"),
    (["--hard-sampler", "uniform"], "--hard-sampler uniform is the baseline"),
    (["--hard-sampler", "nope"], "nope"),
    (["--epochs", "3"], "unrecognized arguments: --epochs"),
])
def test_demo_code_bad_input_exits_2_without_traceback(cli, argv, message):
    code, _, err = cli("demo", "code", *argv)
    assert code == 2
    assert message in err and "Traceback" not in err
