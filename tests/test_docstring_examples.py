"""The library's docstring examples run, and every public class and function has one.

* ``test_docstring_examples_run``: every ``>>>`` example in every ``hardbatch`` module (found by
  walking ``src/hardbatch``; the integrations and plots included: sentence-transformers, PyG,
  Lightning and matplotlib are test dependencies) runs under :mod:`doctest` with
  ``ELLIPSIS | NORMALIZE_WHITESPACE``. A module is skipped only with a reason in
  :data:`SKIPPED_MODULES`.
* ``test_public_names_have_an_example``: every class and function named in ``hardbatch.__all__``
  or in the ``__all__`` of a public module or subpackage (``hardbatch.samplers``,
  ``hardbatch.batching.gcbs``, ``hardbatch.metrics``, ...; a package without ``__all__``, such as
  ``hardbatch.integrations``, through its public modules; a module without ``__all__`` through
  the public classes and functions it defines) has an ``Example:`` section holding ``>>>``.

Examples are meant to be small (N about 40 items, d = 8) and to print what is stable across
machines: shapes, lengths, integers, rounded numbers.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
import time
import warnings

import pytest

import hardbatch

#: Modules whose docstrings are not run, and why.
SKIPPED_MODULES = {
    "hardbatch.__main__": "importing it runs the command line and exits",
}
#: Optional packages imported before a module's examples are timed: a first import (seconds for
#: Lightning or sentence-transformers) is not the example's cost.
OPTIONAL_IMPORTS = {
    "hardbatch.integrations.lightning": ("lightning.pytorch",),
    "hardbatch.integrations.pyg": ("torch_geometric",),
    "hardbatch.integrations.sentence_transformers": ("sentence_transformers", "datasets"),
    "hardbatch.plots": ("matplotlib",),
}
#: Seconds one docstring's examples may take: they take well under 3 s on an idle 2-core CPU
#: (the sentence-transformers ones about 1 s); the bound leaves room for a busy machine.
EXAMPLE_SECONDS = 10.0
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
EXAMPLE = re.compile(r"^\s*Examples?:\s*$", re.MULTILINE)


def library_modules() -> list[str]:
    """Every module of the library, ``hardbatch`` itself first."""
    names = [m.name for m in pkgutil.walk_packages(hardbatch.__path__, "hardbatch.")]
    return ["hardbatch", *sorted(names)]


def _is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _defined_here(obj, module_name: str) -> bool:
    return (inspect.isclass(obj) or inspect.isfunction(obj)) and \
        getattr(obj, "__module__", "") == module_name


def public_namespaces() -> list[str]:
    """``hardbatch``, its public modules and subpackages, and the public modules of a
    subpackage without ``__all__``."""
    out = ["hardbatch"]
    for info in pkgutil.iter_modules(hardbatch.__path__, "hardbatch."):
        if not _is_public(info.name):
            continue
        out.append(info.name)
        module = importlib.import_module(info.name)
        if info.ispkg and not hasattr(module, "__all__"):
            out += [m.name for m in pkgutil.iter_modules(module.__path__, info.name + ".")
                    if _is_public(m.name)]
    return out


def public_objects(namespace: str) -> dict[str, object]:
    """``{qualified name: object}`` of the public classes and functions of ``namespace``."""
    module = importlib.import_module(namespace)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items()
                 if not n.startswith("_") and _defined_here(obj, namespace)]
    out = {}
    for name in names:
        obj = getattr(module, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and \
                getattr(obj, "__module__", "").startswith("hardbatch"):
            out[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return out


def has_example(obj) -> bool:
    doc = inspect.getdoc(obj) or ""
    match = EXAMPLE.search(doc)
    return match is not None and ">>>" in doc[match.end():]


@pytest.mark.parametrize("name", [n for n in library_modules() if n not in SKIPPED_MODULES])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    for prefix, packages in OPTIONAL_IMPORTS.items():
        if name.startswith(prefix):
            for package in packages:
                importlib.import_module(package)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report: list[str] = []
    failed, slow = 0, []
    for test in finder.find(module, name):
        if not test.examples:
            continue
        start = time.perf_counter()
        failed += runner.run(test, out=report.append).failed
        if (seconds := time.perf_counter() - start) > EXAMPLE_SECONDS:
            slow.append(f"{test.name}: {seconds:.1f} s")
    assert failed == 0, "".join(report)
    if slow:  # speed lives in benchmarks, not in timed tests: a loaded machine only warns
        warnings.warn(f"docstring examples over {EXAMPLE_SECONDS} s: {slow}", stacklevel=1)


def test_skipped_modules_exist():
    assert set(SKIPPED_MODULES) <= set(library_modules())


@pytest.mark.parametrize("namespace", public_namespaces())
def test_public_names_have_an_example(namespace):
    missing = sorted(q for q, obj in public_objects(namespace).items() if not has_example(obj))
    assert not missing, f"{len(missing)} public names without an 'Example:' section: {missing}"
