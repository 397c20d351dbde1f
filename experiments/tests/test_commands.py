"""Every command takes its sampler and loss names from hardbatch.registry: unknown names get the
registry's one error (exit code 2, no traceback), the aliases debiased / hard_negative work and
runs are named canonically (dcl / hcl), and a run finished under an alias name is skipped.

The recipes' expensive parts (data loading, training) are replaced by recorders: these tests
check the names each command hands on, not the runs themselves (test_graphcl.py,
test_text.py and test_vision.py run them)."""

import json

import pytest

from hardbatch import registry
from hardbatch.cli import main
from hardbatch_experiments import factories, sts, tu
from hardbatch_experiments.recipes.graphcl import cli as graphcl_cli
from hardbatch_experiments.recipes.simcse import cli as simcse_cli

COMMANDS = {
    "demo": ["demo", "--epochs", "1", "--no-plots"],
    "inspect": ["inspect", "missing.npy"],
    "graphcl": ["bench", "graphcl", "--dataset", "MUTAG", "--dry-run"],
    "simcse": ["bench", "simcse", "--dry-run"],
    "simclr": ["bench", "simclr", "--dataset", "mnist", "--dry-run"],
}


def registry_message(call) -> str:
    with pytest.raises(ValueError) as exc:
        call()
    return str(exc.value)


def expected(command: str, kind: str) -> str:
    """The registry's message for the name 'bogus' as the command parses it."""
    if command == "demo" and kind == "loss":
        return registry_message(lambda: registry.canonical_loss("bogus"))
    extra = {("simcse", "sampler"): ("default",), ("simcse", "loss"): ("mnrl",)}
    return registry_message(
        lambda: registry.parse_names("bogus", kind, extra=extra.get((command, kind), ())))


@pytest.mark.parametrize("command,kind", [(c, k) for c in COMMANDS for k in ("sampler", "loss")
                                          if (c, k) != ("inspect", "loss")])
def test_unknown_names_get_the_registry_message(capsys, tmp_path, command, kind):
    argv = COMMANDS[command] + ["--out", str(tmp_path / "out"), f"--{kind}", "bogus"]
    code = main(argv)
    err = capsys.readouterr().err
    message = expected(command, kind)
    prefix = f"hardbatch {command if command in ('demo', 'inspect') else 'bench'}: error: "
    assert code == 2 and prefix + message in err and "Traceback" not in err
    assert f"unknown {kind} 'bogus'" in message
    if kind == "loss":
        assert "'debiased' (= 'dcl')" in message and "'hard_negative' (= 'hcl')" in message
    assert not (tmp_path / "out").exists()


class _Dataset:
    """What ``run_graphcl`` reads of a loaded TU dataset besides handing it to ``run_one``."""

    num_features, feature_kind, num_classes = 1, "constant", 2

    def __len__(self):
        return 188


@pytest.fixture
def calls(monkeypatch):
    """Record each (sampler, loss, result file) a recipe would run; no data is loaded."""
    from hardbatch_experiments.recipes import simclr

    seen = []

    def record(sampler, loss, path):
        seen.append((sampler, loss, path.name))
        path.write_text(json.dumps({"accuracy": 0.5, "avg": 50.0, "knn_accuracy": 0.5}))

    monkeypatch.setattr(tu, "load_tu", lambda *a, **k: _Dataset())
    monkeypatch.setattr(graphcl_cli, "run_one",
                        lambda args, data, s, l, seed, path: record(s, l, path))
    monkeypatch.setattr(simcse_cli, "read_sentences", lambda *a: ["x"] * 128)
    monkeypatch.setattr(sts, "load_sts", lambda *a, **k: {})
    monkeypatch.setattr(simcse_cli, "run_one",
                        lambda args, s, l, seed, path, *rest: record(s, l, path))
    monkeypatch.setattr(simclr, "load_images", lambda *a: (None, [0], None, [0]))
    monkeypatch.setattr(simclr, "run_one", lambda args, data, s, l, seed, path: record(s, l, path))
    return seen


RECIPES = {
    "graphcl": (["--dataset", "MUTAG", "--seeds", "1"], "MUTAG__uniform__{}__seed0.json"),
    "simcse": (["--num-sentences", "128", "--batch-size", "64"],
               "simcse__uniform__{}__seed0__n128_steps2.json"),
    "simclr": (["--dataset", "mnist"], "simclr-mnist__uniform__{}__seed0.json"),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("alias,canonical", [("debiased", "dcl"), ("hard_negative", "hcl")])
def test_recipes_take_loss_aliases_and_name_runs_canonically(calls, capsys, tmp_path, recipe,
                                                             alias, canonical):
    extra, name = RECIPES[recipe]
    argv = ["bench", recipe, *extra, "--sampler", "uniform", "--loss", f"{alias},{canonical}",
            "--out", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    assert calls == [("uniform", canonical, name.format(canonical))]  # one run, listed once


@pytest.mark.parametrize("loss", ["debiased", "dcl"])
def test_simclr_run_finished_under_the_alias_name_is_skipped(calls, capsys, tmp_path, loss):
    (tmp_path / "simclr-mnist__uniform__debiased__seed0.json").write_text(
        json.dumps({"knn_accuracy": 0.5}))
    args = ["bench", "simclr", "--dataset", "mnist", "--sampler", "uniform", "--out",
            str(tmp_path)]
    assert main(args + ["--loss", loss]) == 0
    assert "1/1 runs done, 0 to run" in capsys.readouterr().out and calls == []
    assert main(args + ["--loss", "dcl,hcl"]) == 0
    assert calls == [("uniform", "hcl", "simclr-mnist__uniform__hcl__seed0.json")]


def test_the_settings_tables_cover_the_registry_names():
    assert set(factories.SAMPLER_SETTINGS) == set(registry.sampler_names())
    assert set(factories.LOSS_SETTINGS) == set(registry.loss_names())
