"""The ``hardbatch`` command line: help, plugin commands (entry points), the built-in
``inspect`` and the module entry points. The experiments' commands are tested in
tests/hardbatch_experiments (test_demo.py, test_commands.py)."""

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from hardbatch import cli
from hardbatch.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["inspect", "--help"],
                                  ["bench", "graphcl", "--help"], ["eval", "sts", "--help"]])
def test_help_everywhere(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: hardbatch" in out


def test_top_level_help_lists_builtin_and_plugin_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("inspect", "demo", "bench", "eval"):
        assert command in out


def test_no_command_prints_help_and_fails(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "usage: hardbatch" in err


def _hello(subparsers):
    p = subparsers.add_parser("hello", help="a plugin command")
    p.add_argument("--fail", action="store_true")
    p.set_defaults(func=lambda args: _greet(args.fail))
    return p


def _greet(fail: bool) -> int:
    if fail:
        raise ValueError("bad input, named")
    print("hello")
    return 0


def test_plugin_commands_come_from_entry_points(capsys, monkeypatch):
    """A function under the entry-point group adds a command; a plugin that fails to load is
    reported on stderr and the other commands keep working."""
    points = [EntryPoint("hello", f"{__name__}:_hello", cli.COMMAND_GROUP),
              EntryPoint("broken", "no_such_module_xyz:add", cli.COMMAND_GROUP),
              EntryPoint("clash", f"{__name__}:_clash", cli.COMMAND_GROUP)]
    monkeypatch.setattr(cli, "entry_points", lambda group: points if group == cli.COMMAND_GROUP
                        else [])
    code, out, err = run(capsys, "hello")
    assert code == 0 and out == "hello\n"
    assert "command 'broken'" in err and "unavailable" in err
    assert "command 'clash'" in err and "conflicting subparser" in err  # was: no hardbatch
    code, _, err = run(capsys, "hello", "--fail")
    assert code == 2 and "hardbatch hello: error: bad input, named" in err
    with pytest.raises(SystemExit):
        main(["demo", "--help"])  # not registered in this parser
    assert "invalid choice: 'demo'" in capsys.readouterr().err


def test_inspect_is_built_in(capsys, tmp_path):
    code, _, err = run(capsys, "inspect", str(tmp_path / "missing.npy"))
    assert code == 2 and "missing.npy" in err


def test_module_entry_point_exit_code():
    """``python -m hardbatch`` and ``python -m hardbatch.cli``: both interpreters start at once
    (each spends seconds importing; two cores run them side by side)."""
    procs = {module: subprocess.Popen([sys.executable, "-m", module, "demo", "--sampler", "nope"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for module in ("hardbatch", "hardbatch.cli")}
    for module, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (module, err)
        assert "unknown sampler 'nope'" in err and "Traceback" not in err, (module, err)


# --------------------------------------------------------------------------- issue 17.11
def _one_line_error(code, err, prefix):
    assert code == 2, err
    assert "Traceback" not in err and err.startswith(prefix) and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, message", [
    (["eval", "sts", "--model", "m", "--threads", "-1"], "expected a positive integer, got '-1'"),
    (["demo", "--temperature", "1e-39"], "expected a temperature >= 1e-30"),
    (["bench", "simclr", "--dataset", "mnist", "--temperature", "0", "--dry-run"],
     "expected a positive number"),
])
def test_bad_numbers_are_one_line_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:  # argparse: usage line + error line, exit 2
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "Traceback" not in err


def test_sts_data_dir_that_is_a_file_says_so(capsys, tmp_path):
    blocker = tmp_path / "sts.txt"
    blocker.write_text("x")
    code, _, err = run(capsys, "eval", "sts", "--model", "m", "--data-dir", str(blocker))
    _one_line_error(code, err, "hardbatch eval: error: ")
    assert "is a file, not a folder" in err and "does not exist" not in err


def test_diverging_demo_names_the_learning_rate_not_options_the_cli_lacks(capsys, tmp_path):
    code, _, err = run(capsys, "demo", "--lr", "1e30", "--epochs", "1", "--sampler", "uniform",
                       "--no-plots", "--out", str(tmp_path))
    _one_line_error(code, err, "hardbatch demo: error: ")
    assert "lower the learning rate (lr=1e+30)" in err and "check_finite" not in err


def _clash(subparsers):
    """A plugin whose command name is taken (by the built-in inspect)."""
    subparsers.add_parser("inspect")


def test_restart_of_one_is_refused_when_parsed(capsys):
    """The sampler refuses alpha = 1 (a walk that never leaves its start); the option took it
    and failed only after the embeddings were loaded."""
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "emb.npy", "--restart", "1"])
    assert exc.value.code == 2 and "expected a number in [0, 1), got '1'" in \
        capsys.readouterr().err


def test_a_missing_extra_is_a_one_line_error(capsys):
    def needs_extra(_):
        raise ImportError("hardbatch plan needs pyarrow: pip install 'hardbatch[plan]'")

    assert cli.run_guarded("hardbatch x", needs_extra, None) == 2
    _one_line_error(2, capsys.readouterr().err, "hardbatch x: error: hardbatch plan needs")


def test_run_guarded_reports_user_errors_and_keeps_bug_tracebacks(capsys):
    def diverged(_):
        raise FloatingPointError("loss is nan at step 3; lower the learning rate")

    assert cli.run_guarded("hardbatch x", diverged, None) == 2
    _one_line_error(2, capsys.readouterr().err, "hardbatch x: error: loss is nan")

    def bug(_):
        raise RuntimeError("a real bug")

    with pytest.raises(RuntimeError, match="a real bug"):
        cli.run_guarded("hardbatch x", bug, None)


def test_standalone_recipe_entry_points_are_guarded(capsys, tmp_path):
    """``python -m hardbatch_experiments.recipes.graphcl`` (RecipeCommand.main) reports the
    library's ValueError in one line, as ``hardbatch bench graphcl`` does."""
    from hardbatch_experiments.recipes.graphcl import cli as graphcl_cli

    code = graphcl_cli.main(["--dataset", "MUTAG", "--seed-list", "a", "--dry-run",
                             "--out", str(tmp_path)])
    _one_line_error(code, capsys.readouterr().err, "hardbatch bench graphcl: error: --seed-list")
