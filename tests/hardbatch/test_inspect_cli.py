"""`hardbatch inspect` (src/hardbatch/inspect_cli.py), run as `python -m hardbatch.inspect_cli`."""

import argparse
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from hardbatch import inspect_cli
from hardbatch.metrics import batch_false_negative_rate
from hardbatch.registry import parse_names


def run_cli(*args, cwd=None):
    """The real thing: a subprocess ``python -m hardbatch.inspect_cli`` (about 4 s of imports)."""
    return subprocess.run([sys.executable, "-m", "hardbatch.inspect_cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=300, check=False)


def run_main(capsys, *args):
    """In-process ``main(argv)``: same code path without the interpreter start-up."""
    try:
        code = inspect_cli.main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    x = (x - x.mean(axis=0)).astype(np.float32)
    root = tmp_path_factory.mktemp("digits")
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    return root, x, y


def test_inspect_on_digits_writes_table_json_and_plot(digits_files, tmp_path, capsys):
    """In process (``python -m hardbatch.inspect_cli`` runs in test_bad_input_through_python_m)."""
    root, x, _y = digits_files
    out = tmp_path / "report"
    res = run_main(capsys, root / "x.npy", "--labels", root / "y.npy", "--batch-size", 128,
                   "--batches", 8, "--candidates", 500, "--neighbors", 50, "--out", out,
                   "--loss-gap")
    assert res.returncode == 0, res.stderr
    table = [ln for ln in res.stdout.splitlines() if ln.startswith("|")]
    assert table[0].startswith("| sampler | batches | B | hardness | mean neg. sim | FN rate |")
    names = list(parse_names("all", "sampler"))  # the registry's samplers, in its order
    assert len(table) == 2 + len(names)  # header, rule, one row per sampler
    assert [row.split("|")[1].strip().split(" ")[0] for row in table[2:]] == names
    for name in ("inspect.json", "inspect.md", "similarity_histograms.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "similarity_histograms.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((out / "inspect.json").read_text())
    assert report["num_items"] == len(x) and report["dim"] == 64 and report["num_classes"] == 10
    stats = report["samplers"]
    assert set(stats) == set(names)
    for name, row in stats.items():
        assert row["batches"] == 8 and row["batch_size"] == 128
        assert sum(row["histogram"]["counts"]) > 0
        assert len(row["histogram"]["edges"]) == len(row["histogram"]["counts"]) + 1
        assert 0.0 <= row["false_negative_rate"] <= 1.0 and row["duplicate_rate"] == 0.0
        assert row["loss_gap"] >= 0.0 and row["sampler_seconds"] >= 0.0
    # uniform: random pairs (about 1/10 same class); knn: many more false negatives, harder
    assert abs(stats["uniform"]["false_negative_rate"] - 0.1) < 0.03
    assert stats["knn"]["false_negative_rate"] > 2 * stats["uniform"]["false_negative_rate"]
    assert stats["knn"]["hardness"] > stats["uniform"]["hardness"]
    assert stats["uniform"]["coverage"] == pytest.approx(min(1.0, 8 * 128 / len(x)), abs=1e-3)
    assert (out / "inspect.md").read_text().count("\n|") == 2 + len(names)
    # issue 35.5: a legend line per column, in the output, inspect.md and inspect.json
    header = [c.strip() for c in table[0].strip("|").split("|")][1:]
    assert list(report["legend"]) == header
    for name in header:
        line = f"- {name}: {report['legend'][name]}"
        assert line in res.stdout.splitlines() and line in (out / "inspect.md").read_text()
    assert any(n.startswith("8 batches of B = 128 are 0.53 of an epoch (15 batches)") for n in report["notes"])


def test_inspect_matches_the_metrics_on_the_same_batches(digits_files, tmp_path, capsys):
    """The uniform row is the metric of the sampler's own batches (same seed)."""
    import hardbatch as hb

    root, _x, y = digits_files
    res = run_main(capsys, root / "x.npy", "--labels", root / "y.npy", "--sampler", "uniform",
                  "--batch-size", 100, "--batches", 3, "--seed", 5, "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    row = json.loads((tmp_path / "inspect.json").read_text())["samplers"]["uniform"]
    batches = list(hb.UniformBatchSampler(len(y), 100, seed=5))[:3]
    expected = np.mean([batch_false_negative_rate(y, b) for b in batches])
    assert row["false_negative_rate"] == pytest.approx(expected)


def test_inspect_reference_measures_every_sampler_in_one_embedding(digits_files, tmp_path,
                                                                    capsys):
    """--reference: the ref. columns are the metrics of the same batches in the reference."""
    import hardbatch as hb
    from hardbatch.metrics import loss_gap, plan_stats

    root, x, y = digits_files
    ref = np.random.default_rng(0).standard_normal((len(x), 16)).astype(np.float32)
    np.save(root / "ref.npy", ref)
    res = run_main(capsys, root / "x.npy", "--labels", root / "y.npy", "--reference",
                   root / "ref.npy", "--sampler", "uniform,gcbs", "--batch-size", 100,
                   "--batches", 3, "--seed", 5, "--loss-gap", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    header = next(ln for ln in res.stdout.splitlines() if ln.startswith("| sampler"))
    assert "ref. hardness" in header and "ref. loss gap" in header
    report = json.loads((tmp_path / "inspect.json").read_text())
    assert report["reference"] == str(root / "ref.npy")
    assert (tmp_path / "reference_similarity_histograms.png").stat().st_size > 0
    batches = list(hb.UniformBatchSampler(len(y), 100, seed=5))[:3]
    row = report["samplers"]["uniform"]
    want = plan_stats(ref, batches)
    assert row["reference_hardness"] == pytest.approx(want["hardness"])
    assert row["reference_mean_negative_similarity"] == pytest.approx(
        want["mean_negative_similarity"])
    assert row["reference_histogram"]["counts"] == want["histogram"][0].tolist()
    assert row["hardness"] == pytest.approx(plan_stats(x, batches)["hardness"])
    assert row["reference_loss_gap"] == pytest.approx(loss_gap(ref, batches)["gap"], abs=1e-6)
    bad = run_main(capsys, root / "x.npy", "--reference", root / "y.npy", "--out", tmp_path)
    assert bad.returncode == 2 and "--reference in" in bad.stderr and "2-D" in bad.stderr
    np.save(tmp_path / "short.npy", ref[:10])
    bad = run_main(capsys, root / "x.npy", "--reference", tmp_path / "short.npy",
                   "--out", tmp_path)
    assert bad.returncode == 2 and "--reference has 10 rows but there are 1797 items" in bad.stderr


@pytest.mark.parametrize("fmt", ["npz", "pt", "pt-dict", "txt-labels"])
def test_inspect_reads_npz_pt_and_text_labels(tmp_path, capsys, fmt):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    y = rng.integers(0, 3, 300)
    if fmt == "npz":
        emb = tmp_path / "e.npz"
        np.savez(emb, other=np.zeros(3), embeddings=x)
        lab = tmp_path / "l.npz"
        np.savez(lab, labels=y)
    elif fmt.startswith("pt"):
        emb = tmp_path / "e.pt"
        t = torch.from_numpy(x)
        torch.save({"embeddings": t} if fmt == "pt-dict" else t, emb)
        lab = tmp_path / "l.pt"
        torch.save(torch.from_numpy(y), lab)
    else:
        emb = tmp_path / "e.npy"
        np.save(emb, x)
        lab = tmp_path / "l.txt"
        lab.write_text("\n".join(f"c{v}" for v in y) + "\n")
    res = run_main(capsys, emb, "--labels", lab, "--sampler", "uniform,proximity", "--batches", 2,
                  "--out", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "o" / "inspect.json").read_text())
    assert report["num_items"] == 300 and report["num_classes"] == 3
    # small N: defaults lowered with a note, not an error
    assert report["parameters"]["batch_size"] < 300 and report["parameters"]["candidates"] < 300
    assert "lowered" in res.stderr


@pytest.mark.parametrize("case, match", [
    ("missing", "embeddings file not found"),
    ("extension", "has extension '.csv'; use one of .npy"),
    ("shape", r"must be 2-D \[N, d\], got shape \(50,\)"),
    ("labels-count", "labels in .* have 49 entries but the embeddings have 50 rows"),
    ("labels-missing", "labels file not found"),
    ("nan", "contain NaN or inf"),
    ("candidates", ("--candidates 80 must be smaller than the number of items N=50; use e.g. "
                   "--candidates 25")),
    ("neighbors", "--neighbors 30 must be smaller than --candidates 20"),
    ("batch-size", "--batch-size 60 is larger than the number of items N=50"),
    ("pt-dict", "holds a dict without key 'embeddings'"),
    ("corrupt", "could not read embeddings file"),
    ("text-as-npy", r"x.npy is not a NumPy array file \(it does not start with the .npy header\)"),
    ("community-small", r"community sampler: window=20 .* \(this command sets only its flags, "
                        r"hardbatch inspect --help; otherwise drop community from --sampler\)"),
])
def test_bad_input_exits_2_with_message_and_no_traceback(tmp_path, capsys, case, match):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 4)).astype(np.float32)
    emb = tmp_path / "x.npy"
    np.save(emb, x)
    args = [emb, "--out", tmp_path / "o"]
    if case == "missing":
        args[0] = tmp_path / "nope.npy"
    elif case == "extension":
        args[0] = tmp_path / "x.csv"
        args[0].write_text("1,2\n")
    elif case == "shape":
        np.save(emb, x[:, 0])
    elif case == "labels-count":
        np.save(tmp_path / "y.npy", np.zeros(49, int))
        args += ["--labels", tmp_path / "y.npy"]
    elif case == "labels-missing":
        args += ["--labels", tmp_path / "y.npy"]
    elif case == "nan":
        x[7, 2] = np.nan
        np.save(emb, x)
    elif case == "candidates":
        args += ["--sampler", "proximity", "--candidates", 80]
    elif case == "neighbors":
        args += ["--sampler", "proximity", "--candidates", 20, "--neighbors", 30]
    elif case == "batch-size":
        args += ["--batch-size", 60]
    elif case == "pt-dict":
        args[0] = tmp_path / "x.pt"
        torch.save({"emb": torch.zeros(3, 2)}, args[0])
    elif case == "corrupt":
        args[0] = tmp_path / "x.pt"
        args[0].write_bytes(b"not a torch file")
    elif case == "text-as-npy":  # issue 17.11: no (unsafe) allow_pickle suggestion
        emb.write_text("0.1,0.2\n0.3,0.4\n")
    elif case == "community-small":  # the sampler's fix names window=, which has no flag
        np.save(emb, x[:20])
        args += ["--sampler", "community", "--batch-size", 4]
    res = run_main(capsys, *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "allow_pickle" not in res.stderr
    assert res.stderr.startswith("hardbatch inspect: error: ")
    assert re.search(match, res.stderr), res.stderr


def test_bad_input_through_python_m():
    res = run_cli("missing.npy", "--labels", "y.npy")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr == "hardbatch inspect: error: embeddings file not found: missing.npy\n"


def test_help(capsys):
    res = run_main(capsys, "--help")
    assert res.returncode == 0 and "EMBEDDINGS" in res.stdout and "--sampler" in res.stdout
    assert "--loss-gap" in res.stdout and "--candidates" in res.stdout


def test_argument_errors(capsys):
    res = run_main(capsys, "x.npy", "--sampler", "random")
    with pytest.raises(ValueError) as registry_error:
        parse_names("random", "sampler")
    assert res.returncode == 2 and str(registry_error.value) in res.stderr
    assert "unknown sampler 'random'" in res.stderr and "Traceback" not in res.stderr
    res = run_main(capsys, "x.npy", "--batch-size", "0")
    assert res.returncode == 2 and "positive integer" in res.stderr
    res = run_main(capsys, "x.npy", "--quantile", "1.5")
    assert res.returncode == 2 and "(0, 1)" in res.stderr
    res = run_main(capsys, "x.npy", "--restart", "-0.1")
    assert res.returncode == 2 and "[0, 1)" in res.stderr


def test_add_inspect_parser_registers_subcommand(digits_files, tmp_path, capsys):
    """How hardbatch.cli wires it in: a subparser whose func is run_inspect."""
    root, _, _ = digits_files
    parser = argparse.ArgumentParser(prog="hardbatch")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect_cli.add_inspect_parser(sub)
    args = parser.parse_args(["inspect", str(root / "x.npy"), "--sampler", "uniform",
                              "--batches", "2", "--batch-size", "64", "--out", str(tmp_path)])
    assert args.func is inspect_cli.run_inspect and args.sampler == "uniform"
    assert args.func(args) == 0
    assert "| uniform | 2 | 64 |" in capsys.readouterr().out
    bad = parser.parse_args(["inspect", str(tmp_path / "missing.npy")])
    assert bad.func(bad) == 2
    assert "embeddings file not found" in capsys.readouterr().err


def test_inspect_defaults_to_one_epoch_and_explains_a_zero_loss_gap(tmp_path, capsys):
    """issue 35.5: the default draws one epoch (ceil(N / B) batches, so coverage is one epoch's),
    and at t = 0.05 the loss gap (each item its own positive: every loss about exp(-(1 - cos) /
    t)) prints in 3 significant digits with a note saying why it is near 0, not as 0.000."""
    x = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = run_main(capsys, tmp_path / "x.npy", "--sampler", "uniform,knn", "--batch-size", 128,
                   "--loss-gap", "--temperature", "0.05", "--out", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "o" / "inspect.json").read_text())
    assert report["parameters"]["batches"] == 8  # ceil(1000 / 128)
    assert report["samplers"]["uniform"]["coverage"] == 1.0
    assert report["samplers"]["knn"]["coverage"] < 0.9  # a walk sampler's epoch
    notes = report["notes"]
    assert notes[0].startswith("8 batches of B = 128 = one epoch of N = 1000 items")
    (walks,) = [n for n in notes if "walk samplers (knn, proximity)" in n]
    assert "(uniform, gcbs, cluster and community partition the items)" in walks
    gap = report["samplers"]["uniform"]["loss_gap"]
    assert 0 < gap < 5e-4  # printed as 0.000 before
    uniform_row = next(ln for ln in res.stdout.splitlines() if ln.startswith("| uniform |"))
    assert uniform_row.endswith(f"| {gap:.2e} |")  # not "| 0.000 |"
    (why,) = [n for n in notes if n.startswith("every loss gap is below 0.0005")]
    assert "its own positive (cosine 1)" in why and "--temperature 0.2" in why
    assert "note: " + why in res.stdout
    # more batches than an epoch: said, with the one-epoch value to use
    res = run_main(capsys, tmp_path / "x.npy", "--sampler", "uniform", "--batch-size", 128,
                   "--batches", 20, "--out", tmp_path / "o")
    notes = json.loads((tmp_path / "o" / "inspect.json").read_text())["notes"]
    assert notes[0].startswith("20 batches of B = 128 span 2.5 epochs") and "--batches 8" in notes[0]
    assert not any("loss gap" in n for n in notes)


def _no_metis():
    raise ImportError("the METIS partitioner needs pymetis: pip install 'hardbatch[metis]'")


def test_a_missing_extra_fails_before_the_work_or_leaves_the_sampler_out_of_all(
        tmp_path, capsys, monkeypatch):
    """Before: the loss gap and five samplers' draws ran, then community's missing pymetis
    ended the command with nothing written; a missing matplotlib did the same at the plot."""
    import hardbatch.samplers.community_sampler as community

    monkeypatch.setattr(community, "require_metis", _no_metis)
    emb = tmp_path / "emb.npy"
    np.save(emb, np.random.default_rng(0).standard_normal((60, 8)).astype(np.float32))
    gap_calls = []
    monkeypatch.setattr("hardbatch.metrics.LossGap", lambda *a, **k: gap_calls.append(1))
    res = run_main(capsys, emb, "--sampler", "uniform,community", "--loss-gap", "--out",
                   tmp_path / "a")
    assert res.returncode == 2 and "community sampler: the METIS partitioner needs pymetis" \
        in res.stderr and gap_calls == []  # refused before the loss gap
    monkeypatch.undo()
    monkeypatch.setattr(community, "require_metis", _no_metis)
    import hardbatch.plots as plots

    def no_matplotlib(*args, **kwargs):
        raise ImportError("hardbatch.plots needs matplotlib: pip install matplotlib")

    monkeypatch.setattr(plots, "plot_similarity_histograms", no_matplotlib)
    res = run_main(capsys, emb, "--batches", "2", "--out", tmp_path / "b")  # --sampler all
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "b" / "inspect.json").read_text())
    assert list(summary["samplers"]) == ["uniform", "knn", "proximity", "gcbs", "cluster"]
    assert any(n.startswith("community left out of --sampler all: the METIS partitioner")
               for n in summary["notes"])
    assert any(n.startswith("no figures: hardbatch.plots needs matplotlib")
               for n in summary["notes"])
    assert "plot" not in summary["files"] and (tmp_path / "b" / "inspect.md").exists()
