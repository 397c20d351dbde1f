"""The ``hardbatch`` command line: help, the demo (smoke run) and user-facing errors."""

import json
import subprocess
import sys

import pytest

from hardbatch.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["inspect", "--help"]])
def test_help_everywhere(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: hardbatch" in out


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "demo" in out and "inspect" in out


def test_no_command_prints_help_and_fails(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "usage: hardbatch" in err


def test_demo_smoke_all_samplers(capsys, tmp_path):
    out_dir = tmp_path / "demo"
    code, out, err = run(capsys, "demo", "--epochs", "1", "--out", str(out_dir), "--seed", "1")
    assert code == 0, err
    for name in ("uniform", "kNN", "proximity graph (RWR)", "GCBS"):
        assert f"| {name} |" in out
    assert "| sampler | kNN acc | linear acc | hardness |" in out
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["sampler"] for r in results["results"]] == ["uniform", "knn", "proximity", "gcbs"]
    for row in results["results"]:
        assert 0 <= row["knn_accuracy"] <= 1 and 0 <= row["false_negative_rate"] <= 1
        assert row["steps"] == 12 and 0 <= row["sampler_share"] < 1
        assert len(row["curves"]["false_negative_rate"]) == 12
        assert sum(row["histogram"]["counts"]) > 0
    assert results["config"]["epochs"] == 1 and results["config"]["seed"] == 1
    assert (out_dir / "similarity_histograms.png").stat().st_size > 0
    assert (out_dir / "false_negative_rate.png").stat().st_size > 0


def test_demo_options(capsys, tmp_path):
    code, _, err = run(capsys, "demo", "--epochs", "1", "--sampler", "proximity,uniform",
                       "--loss", "debiased", "--batch-size", "200", "--candidates", "300",
                       "--neighbors", "30", "--restart", "0.5", "0.1", "--refresh-every", "3",
                       "--no-plots", "--out", str(tmp_path))
    assert code == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["sampler"] for r in results["results"]] == ["proximity", "uniform"]
    cfg = results["config"]
    assert (cfg["loss"], cfg["batch_size"], cfg["candidates"], cfg["neighbors"]) == \
        ("debiased", 200, 300, 30)
    assert (cfg["restart_start"], cfg["restart_end"], cfg["refresh_every"]) == (0.5, 0.1, 3)
    assert results["results"][0]["refreshes"] == 3  # 8 steps, rebuilt at steps 0, 3, 6
    assert not (tmp_path / "similarity_histograms.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["demo", "--sampler", "random"], "unknown sampler 'random'"),
    (["demo", "--sampler", ","], "at least one"),
    (["demo", "--epochs", "0"], "expected a positive integer"),
    (["demo", "--epochs", "two"], "expected a positive integer"),
    (["demo", "--batch-size", "5000"], "--batch-size 5000 must be between 2 and"),
    (["demo", "--batch-size", "1"], "must be between 2 and"),
    (["demo", "--loss", "triplet"], "invalid choice"),
    (["demo", "--candidates", "50", "--neighbors", "100"], "--neighbors 100 must be smaller"),
    (["demo", "--candidates", "5000"], "must be smaller than the"),
    (["demo", "--restart", "0.2", "2"], "expected a number in [0, 1]"),
    (["demo", "--temperature", "-1"], "expected a positive number"),
    (["bench", "simclr"], "required: --dataset"),
])
def test_demo_errors_exit_2_without_traceback(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_out_is_a_file_is_a_clear_error(capsys, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    code, _, err = run(capsys, "demo", "--epochs", "1", "--sampler", "uniform", "--no-plots",
                       "--out", str(blocker))
    assert code == 2 and "hardbatch demo: error:" in err


def test_inspect_is_wired_in(capsys, tmp_path):
    code, _, err = run(capsys, "inspect", str(tmp_path / "missing.npy"))
    assert code == 2 and "missing.npy" in err


def test_module_entry_point_exit_code():
    bad = subprocess.run([sys.executable, "-m", "hardbatch.cli", "demo", "--sampler", "nope"],
                         check=False, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert "unknown sampler" in bad.stderr and "Traceback" not in bad.stderr
