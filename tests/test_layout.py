"""The package layout holds: light library imports, no cycles, no private names across modules.

Static checks over ``src/`` and ``experiments/src/`` (the AST of every module) and one subprocess that imports every
library module and looks at ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

SRC = {"hardbatch": REPO / "src", "hardbatch_experiments": REPO / "experiments" / "src"}
PACKAGES = tuple(SRC)
HEAVY = ("hardbatch_experiments", "sklearn", "matplotlib", "transformers", "sentence_transformers",
         "torch_geometric", "lightning", "pytorch_lightning")
MAX_LIBRARY_LINES = 500


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str) -> dict[str, Path]:
    root = SRC[package]
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` node names."""
    if not node.level:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """(module, imported name or None, line) for every import statement, lazy ones included."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = resolve(name, path.name == "__init__.py", node)
            out += [(mod, a.name, node.lineno) for a in node.names]
    return out


ALL = {**modules("hardbatch"), **modules("hardbatch_experiments")}


def test_library_never_imports_the_experiments():
    bad = [f"{name}:{line} imports {mod}" for name, path in modules("hardbatch").items()
           for mod, _, line in imports(name, path)
           if mod.split(".")[0] == "hardbatch_experiments"]
    assert not bad, bad


def test_no_private_name_imported_across_modules():
    bad = []
    for name, path in ALL.items():
        for mod, item, line in imports(name, path):
            if mod.split(".")[0] not in PACKAGES or item is None:
                continue
            target = f"{mod}.{item}"
            if item.startswith("_") and not item.startswith("__") and target not in ALL:
                bad.append(f"{name}:{line} imports {item} from {mod}")
    assert not bad, bad


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in ALL}
    for name, path in ALL.items():
        for mod, item, _ in imports(name, path):
            for cand in (f"{mod}.{item}" if item else None, mod):
                if cand in ALL and cand != name:
                    graph[name].add(cand)
                    break
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    """Module-level and lazy imports alike; a package's ``__init__`` re-exporting its own
    submodules is not a cycle (its submodules never import it)."""
    graph = _graph()
    for name in graph:  # __init__ -> submodule edges only; submodules must not import __init__
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")
                       or (ALL[m].name != "__init__.py")}
    assert not _cycles(graph)


def test_library_modules_are_short():
    long = {name: n for name, path in modules("hardbatch").items()
            if (n := len(path.read_text().splitlines())) > MAX_LIBRARY_LINES}
    assert not long, long


def test_no_two_library_modules_share_a_stem():
    """A module's file name finds it: one ``knn_graph``, one ``options`` ... in the library."""
    stems: dict[str, list[str]] = {}
    for path in sorted((SRC["hardbatch"] / "hardbatch").rglob("*.py")):
        if path.name != "__init__.py":
            stems.setdefault(path.stem.lstrip("_"), []).append(
                str(path.relative_to(SRC["hardbatch"])))
    shared = {stem: paths for stem, paths in stems.items() if len(paths) > 1}
    assert not shared, f"module names used twice (rename one): {shared}"


def test_sampler_and_loss_names_are_defined_once():
    """A literal tuple/list of the sampler (or loss) names appears only in hardbatch.registry."""
    bad = []
    for name, path in ALL.items():
        if name == "hardbatch.registry":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if {"uniform", "knn", "proximity", "gcbs"} <= values or \
                        {"infonce", "dcl", "hcl"} <= values or \
                        {"infonce", "debiased", "hard_negative"} <= values:
                    bad.append(f"{name}:{node.lineno}")
    assert not bad, bad


def test_importing_the_library_loads_no_experiment_or_optional_package():
    names = sorted(n for n in modules("hardbatch") if not n.endswith("__main__"))
    code = ("import importlib, json, sys\n"
            f"for n in {names!r}: importlib.import_module(n)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_library_wheel_holds_only_the_library():
    """``pip install .`` ships ``hardbatch`` alone: setuptools finds only it under ``src/``,
    and the experiments are a distribution of their own (``experiments/pyproject.toml``)
    that registers its commands under the ``hardbatch.commands`` entry points."""
    import tomllib
    from setuptools import find_packages

    library = tomllib.loads((REPO / "pyproject.toml").read_text())
    find = library["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(str(REPO / find["where"][0]), include=find["include"])
    assert found and {p.split(".")[0] for p in found} == {"hardbatch"}
    assert "entry-points" not in library["project"]
    experiments = tomllib.loads((REPO / "experiments" / "pyproject.toml").read_text())
    assert "hardbatch" in experiments["project"]["dependencies"]
    assert set(experiments["project"]["entry-points"]["hardbatch.commands"]) == \
        {"demo", "bench", "eval"}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_parses_and_has_a_docstring(package):
    missing = [name for name, path in modules(package).items()
               if path.stat().st_size and ast.get_docstring(ast.parse(path.read_text())) is None]
    assert not missing, missing


def test_the_test_tree_mirrors_the_library():
    """``tests/hardbatch/<path>/`` mirrors the package ``src/hardbatch/<path>/``, and each of its
    ``test_X.py`` names a module X of that package (``_X.py`` too), one of its subpackages or
    the package itself when its ``__init__`` defines code (not only re-exports), alone or with
    an aspect (``test_X_aspect.py``, e.g. test_community_sampler_authors.py); the cross-cutting
    files are listed here, each with why."""
    cross_cutting = {  # path under tests/hardbatch: why it names no single module
        "test_api_arguments.py": "every generator= / device= / dtype= of the public API",
        "integrations/test_losses_integrations.py": "losses in lightly's and PML's call forms",
        "integrations/sentence_transformers/test_trainer.py": "SentenceTransformerTrainer "
                                                             "end to end (factory, sampler, loss)",
        "keys/test_samplers.py": "duplicate_keys end to end through every sampler",
        "losses/test_checks.py": "the input checks of every loss and loss module",
        "losses/test_docs_examples.py": "the code blocks of docs/losses.md",
        "losses/test_false_negatives.py": "false_negatives= on every loss",
        "losses/test_gather.py": "gather=True of every loss across torchrun processes",
        "losses/test_numerics.py": "extreme inputs for every loss",
        "losses/test_properties.py": "hypothesis properties of every loss",
        "losses/test_typing.py": "the signatures of the loss API under mypy",
        "samplers/test_checkpoints.py": "every sampler's state with DataLoader workers",
        "samplers/test_contract.py": "the PlanSampler contract for every sampler",
        "samplers/test_global_batch.py": "global_batch=True across ranks, every sampler",
        "samplers/test_plan_stability.py": "every sampler's plan under rounding noise",
        "samplers/test_properties.py": "hypothesis properties of every sampler",
        "samplers/test_state_kinds.py": "the kind and checksum of every sampler's state",
    }
    tests_root, lib = REPO / "tests" / "hardbatch", SRC["hardbatch"] / "hardbatch"
    folders = [tests_root] + sorted(p for p in tests_root.rglob("*")
                                    if p.is_dir() and "__pycache__" not in p.parts)
    bad = []
    for folder in folders:
        rel = folder.relative_to(tests_root)
        package, where = lib / rel, "".join(f"{part}/" for part in rel.parts)
        if not (package / "__init__.py").is_file():
            bad.append(f"tests/hardbatch/{where} mirrors no package src/hardbatch/{where}")
            continue
        init = ast.parse((package / "__init__.py").read_text()).body
        names = {p.stem.lstrip("_") for p in package.glob("*.py") if p.name != "__init__.py"} | \
            {p.name for p in package.iterdir() if (p / "__init__.py").is_file()} | \
            ({package.name} if any(isinstance(node, (ast.FunctionDef, ast.ClassDef))
                                   for node in init) else set())
        for test in sorted(folder.glob("test_*.py")):
            path = test.relative_to(tests_root).as_posix()
            x = test.stem[len("test_"):]
            if path not in cross_cutting and \
                    not any(x == m or x.startswith(m + "_") for m in names):
                bad.append(f"tests/hardbatch/{path} names no module of src/hardbatch/{where}")
    stale = [p for p in cross_cutting if not (tests_root / p).is_file()]
    assert not bad and not stale, bad + [f"allow-listed but missing: {p}" for p in stale]
