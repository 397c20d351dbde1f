"""The digits demo (hardbatch_experiments.demo) and ``hardbatch demo``: building blocks, a
smoke run, options, aliases and user-facing errors."""

import json

import pytest
import torch
from torch import nn

import hardbatch as hb
from hardbatch_experiments.datasets import load_digits
from hardbatch_experiments.demo import digits_augment, digits_encoder, make_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def test_digits_augment_is_batched_and_deterministic():
    x, _ = load_digits()
    a = digits_augment(x[:50], torch.Generator().manual_seed(1))
    b = digits_augment(x[:50], torch.Generator().manual_seed(1))
    c = digits_augment(x[:50], torch.Generator().manual_seed(2))
    assert a.shape == (50, 64) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0 and a.max() <= 1
    # a view stays closer to its own digit than to the others
    sims = nn.functional.normalize(a, dim=1) @ nn.functional.normalize(x[:50], dim=1).T
    assert sims.diag().mean() > sims.mean() + 0.03
    # with every perturbation switched off the view is the image itself
    same = digits_augment(x[:50], torch.Generator().manual_seed(1), max_rotation=0.0,
                          scale=(1.0, 1.0), max_shift=0.0, noise=0.0, dropout=0.0)
    torch.testing.assert_close(same, x[:50], atol=1e-5, rtol=0)


def test_digits_encoder_shapes():
    encoder, head = digits_encoder()
    f = encoder(torch.rand(5, 64))
    assert f.shape == (5, 128) and head(f).shape == (5, 64)


@pytest.mark.parametrize("alias,canonical,cls", [("debiased", "dcl", hb.DebiasedInfoNCE),
                                                 ("hard_negative", "hcl", hb.HardNegativeInfoNCE)])
def test_make_loss_aliases_are_the_canonical_losses(alias, canonical, cls):
    a, b = make_loss(alias, 0.5, seed=0), make_loss(canonical, 0.5, seed=0)
    assert type(a) is type(b) is cls and a.tau_plus == b.tau_plus == 0.1
    z1, z2 = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).split(4)
    torch.testing.assert_close(a(z1, z2), b(z1, z2), rtol=0, atol=0)
    # the demo's settings, as before the registry: DebiasedInfoNCE(t, tau_plus=0.1), ...
    old = cls(0.5, tau_plus=0.1) if cls is hb.DebiasedInfoNCE else cls(0.5, tau_plus=0.1, beta=1.0)
    torch.testing.assert_close(a(z1, z2), old(z1, z2), rtol=0, atol=0)


def test_demo_smoke_all_samplers(cli, tmp_path):
    out_dir = tmp_path / "demo"
    code, out, err = cli("demo", "--epochs", "1", "--out", str(out_dir), "--seed", "1")
    assert code == 0, err
    for name in ("uniform", "kNN", "proximity graph (RWR)", "GCBS"):
        assert f"| {name} |" in out
    assert "| sampler | kNN acc | linear acc | hardness |" in out
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["sampler"] for r in results["results"]] == list(hb.registry.sampler_names())
    for row in results["results"]:
        assert 0 <= row["knn_accuracy"] <= 1 and 0 <= row["false_negative_rate"] <= 1
        assert row["steps"] == 12 and 0 <= row["sampler_share"] < 1
        assert len(row["curves"]["false_negative_rate"]) == 12
        assert sum(row["histogram"]["counts"]) > 0
    assert results["config"]["epochs"] == 1 and results["config"]["seed"] == 1
    assert (out_dir / "similarity_histograms.png").stat().st_size > 0
    assert (out_dir / "false_negative_rate.png").stat().st_size > 0


def test_demo_options_and_loss_alias(cli, tmp_path):
    code, _, err = cli("demo", "--epochs", "1", "--sampler", "proximity,uniform",
                       "--loss", "debiased", "--batch-size", "200", "--candidates", "300",
                       "--neighbors", "30", "--restart", "0.5", "0.1", "--refresh-every", "3",
                       "--no-plots", "--out", str(tmp_path))
    assert code == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["sampler"] for r in results["results"]] == ["proximity", "uniform"]
    cfg = results["config"]
    assert (cfg["loss"], cfg["batch_size"], cfg["candidates"], cfg["neighbors"]) == \
        ("dcl", 200, 300, 30)  # the alias is recorded under its canonical name
    assert (cfg["restart_start"], cfg["restart_end"], cfg["refresh_every"]) == (0.5, 0.1, 3)
    assert results["results"][0]["refreshes"] == 3  # 8 steps, rebuilt at steps 0, 3, 6
    assert results["results"][0]["rebuild_steps"] == [1, 4, 7]  # (history steps count from 1)
    assert results["results"][1]["rebuild_steps"] == []  # uniform builds nothing
    assert not (tmp_path / "similarity_histograms.png").exists()


def test_demo_table_explains_every_column(capsys, tmp_path):
    """issue 17.15: one legend line per column, saying what it is and which way is better."""
    from hardbatch_experiments.demo import COLUMNS, markdown_table

    row = {"sampler": "uniform", "knn_accuracy": 0.9, "linear_probe_accuracy": 0.95,
           "hardness": 0.7, "mean_negative_similarity": 0.1, "false_negative_rate": 0.1,
           "coverage": 1.0, "sampler_share": 0.01}
    text = markdown_table([row])
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")][1:]
    legend = [ln for ln in text.splitlines() if ln.startswith("- ")]
    assert [name for name, _ in COLUMNS] == header and len(legend) == len(header)
    for name, line in zip(header, legend):
        assert line.startswith(f"- {name}: ")
        assert any(w in line for w in ("higher is better", "lower is better", "higher = ",
                                       "= every"))
    assert not any(ln.startswith("- ") for ln in markdown_table([row], legend=False).splitlines())


def test_demo_output_folder_is_ignored_by_git():
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    res = subprocess.run(["git", "check-ignore", "-q", "hardbatch-demo/results.json"], cwd=repo,
                         check=False)
    assert res.returncode == 0


@pytest.mark.parametrize("argv,message", [
    (["demo", "--sampler", ","], "no sampler name given"),
    (["demo", "--epochs", "0"], "expected a positive integer"),
    (["demo", "--epochs", "two"], "expected a positive integer"),
    (["demo", "--batch-size", "5000"], "--batch-size 5000 must be between 2 and"),
    (["demo", "--batch-size", "1"], "must be between 2 and"),
    (["demo", "--candidates", "50", "--neighbors", "100"], "--neighbors 100 must be smaller"),
    (["demo", "--candidates", "5000"], "must be smaller than the"),
    (["demo", "--restart", "0.2", "2"], "expected a number in [0, 1]"),
    (["demo", "--temperature", "-1"], "expected a positive number"),
])
def test_demo_errors_exit_2_without_traceback(cli, argv, message):
    code, _, err = cli(*argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_out_is_a_file_is_a_clear_error(cli, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    code, _, err = cli("demo", "--epochs", "1", "--sampler", "uniform", "--no-plots",
                       "--out", str(blocker))
    assert code == 2 and "hardbatch demo: error:" in err


def _training_results_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "training_results.py"
    spec = importlib.util.spec_from_file_location("training_results", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_training_page_quotes_its_results_files():
    """issue 35.8: docs/training.md's measured demo numbers are the text that
    scripts/training_results.py renders from results/demo/digits_seed<S>.json. A number edited
    by hand, a results file rerun without rewriting the page, or a number of the surrounding
    prose that no run gave fails here."""
    import re

    from hardbatch_experiments.demo import markdown_table

    script = _training_results_script()
    files = sorted(script.RESULTS.glob("digits_seed*.json"))
    seeds = sorted(int(re.fullmatch(r"digits_seed(\d+)\.json", f.name)[1]) for f in files)
    assert seeds == list(script.SEEDS), files
    records = script.load(seeds)
    for seed, record in zip(seeds, records):
        assert record["seed"] == seed and record["command"].endswith(f"--seed {seed}")
        assert record["config"]["seed"] == seed and record["config"]["epochs"] == 60
        assert record["table"] == markdown_table(record["results"], legend=False)
    page = script.DOC.read_text()
    block = script.section(page)
    assert block == script.render(records), "rerun: python scripts/training_results.py " \
        "--render-only --in-place"
    # the prose around the block quotes only numbers that the block holds
    measured = page[page.index("### Measured"):]
    measured = measured[:measured.index("\n## ")]
    prose = measured.replace(block, "")
    quoted = re.findall(r"\b\d+\.\d{3}\b|\b\d+\.\d%", prose)
    assert not [q for q in quoted if q not in block], quoted


def test_training_results_script_rewrites_only_its_block(tmp_path):
    """The script's --render-only --in-place replaces the marked block and nothing else."""
    script = _training_results_script()
    page = script.DOC.read_text()
    start, end = f"<!-- {script.MARK} -->", f"<!-- /{script.MARK} -->"
    head, rest = page.split(start)
    doc = tmp_path / "training.md"
    doc.write_text(head + start + "\nSTALE 0.999\n" + end + rest.split(end)[1])
    assert script.main(["--render-only", "--in-place", "--doc", str(doc)]) == 0
    assert doc.read_text() == page
