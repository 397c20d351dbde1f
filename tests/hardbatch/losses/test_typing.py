"""The loss API has real signatures (issue 42, item 4): explicit parameters with types and
defaults that agree with the declared options, docstrings that name them, ``py.typed`` shipped,
and a type checker (mypy, the ``test`` extra) that accepts right calls and reports wrong ones."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
import tempfile
import tomllib

import pytest
import torch
from loss_reference import pair
from support import REPO

import hardbatch.losses as losses
from hardbatch.losses import functional
from hardbatch.losses.functional import contrastive_loss
from hardbatch.losses.loss_options import (
    OFF,
    DCLOptions,
    HCLOptions,
    InfoNCEOptions,
    SSCLOptions,
)

INPUTS = ("anchor", "positive", "labels", "negatives", "false_negatives")
#: (loss function, its options class, defaults it sets otherwise, options it does not take)
FUNCTIONS = [
    (losses.info_nce, InfoNCEOptions, {}, ()),
    (losses.debiased_info_nce, DCLOptions, {}, ()),
    (losses.hard_negative_info_nce, HCLOptions, {}, ()),
    (losses.sscl_loss, SSCLOptions, {}, ()),
    (contrastive_loss, SSCLOptions, OFF, ()),
    (losses.debiased_floor_stats, HCLOptions, {"beta": OFF["beta"]},
     ("reduction", "detach_weights")),
]
#: (module, its positional options)
MODULES = [
    (losses.InfoNCE, ("temperature", "form")),
    (losses.DebiasedInfoNCE, ("temperature", "tau_plus")),
    (losses.HardNegativeInfoNCE, ("temperature", "tau_plus", "beta")),
    (losses.SSCLLoss, ("temperature", "tau_plus", "beta", "hardest", "synthetic", "mix")),
]
#: a value other than the default, of the right type, for every option
OTHER = {"temperature": 0.25, "form": "simcse", "normalize": False, "reduction": "sum",
         "check_finite": False, "gather": True, "group": object(), "tau_plus": 0.05,
         "beta": 0.5, "detach_weights": True, "hardest": 3, "synthetic": 2, "mix": False,
         "detach_synthetic": True, "generator": torch.Generator()}


def _public_callables():
    names = [n for n in losses.__all__ if callable(getattr(losses, n))]
    return [getattr(losses, n) for n in names] + [contrastive_loss]


@pytest.mark.parametrize("obj", _public_callables(), ids=lambda o: o.__name__)
def test_signatures_are_written_out(obj):
    """No ``__signature__`` override or wrapper: the parameters are the code's own, each with a
    type, and a return type."""
    fn = obj.__init__ if inspect.isclass(obj) else obj
    if obj is losses.guided_mask:  # torch.no_grad's functools.wraps of a written-out function
        fn = fn.__wrapped__
    assert "__signature__" not in vars(fn) and not hasattr(fn, "__wrapped__")
    sig = inspect.signature(fn)
    untyped = [n for n, p in sig.parameters.items()
               if n != "self" and p.annotation is inspect.Parameter.empty]
    assert not untyped and sig.return_annotation is not inspect.Signature.empty, untyped


@pytest.mark.parametrize("fn, options, defaults, dropped", FUNCTIONS,
                         ids=[f[0].__name__ for f in FUNCTIONS])
def test_function_signatures_agree_with_the_options(fn, options, defaults, dropped):
    """Every option of the class (but ``dropped``) and nothing else besides the inputs:
    keyword-only, with the declared type and default (or the function's own:
    ``contrastive_loss`` has every step off)."""
    params = inspect.signature(fn).parameters
    fields = {f.name: f for f in dataclasses.fields(options) if f.name not in dropped}
    assert list(params)[:2] == ["anchor", "positive"]
    assert set(params) == set(fields) | set(INPUTS)
    for name, f in fields.items():
        param = params[name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert param.default == defaults.get(name, f.default), name
        assert param.annotation == f.type, (name, param.annotation, f.type)


@pytest.mark.parametrize("cls, positional", MODULES, ids=[m[0].__name__ for m in MODULES])
def test_module_signatures_agree_with_the_options(cls, positional):
    params = dict(inspect.signature(cls).parameters)
    fields = {f.name: f for f in dataclasses.fields(cls.Options)}
    assert set(params) == set(fields)
    assert [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD] \
        == list(positional)
    for name, f in fields.items():
        assert (params[name].default, params[name].annotation) == (f.default, f.type), name
    forward = inspect.signature(cls.forward).parameters
    assert list(forward) == ["self", *INPUTS]


@pytest.mark.parametrize("obj", [f[0] for f in FUNCTIONS] + [m[0] for m in MODULES],
                         ids=lambda o: o.__name__)
def test_docstrings_name_every_parameter(obj):
    """Each parameter is in the ``Args`` section, and there is an example, a reference or the
    relation to the other losses (sentence-transformers' docstring sections)."""
    doc = inspect.getdoc(obj)
    args = doc.split("Args:")[1].split("\n\n")[0]
    params = inspect.signature(obj).parameters
    missing = [n for n in params if not re.search(rf"\b{n}\b", args)]
    assert not missing, missing
    assert "Example:" in doc and ("References:" in doc or "Relations:" in doc)


def _captured(monkeypatch) -> list:
    seen = []
    monkeypatch.setattr(functional, "compute_loss", lambda options, *_: seen.append(options))
    monkeypatch.setattr(functional, "floor_stats", lambda options, *_: seen.append(options))
    return seen


@pytest.mark.parametrize("fn, options, defaults, dropped", FUNCTIONS,
                         ids=[f[0].__name__ for f in FUNCTIONS])
def test_every_argument_reaches_the_options(monkeypatch, fn, options, defaults, dropped):
    """A function's options are its arguments, each by its own name (the functions make them of
    their ``locals()``), checked; a module's likewise."""
    seen = _captured(monkeypatch)
    kw = {f.name: OTHER[f.name] for f in dataclasses.fields(options) if f.name not in dropped}
    fn(*pair(b=4), **kw)
    assert type(seen[0]) is options and {k: getattr(seen[0], k) for k in kw} == kw


@pytest.mark.parametrize("cls, positional", MODULES, ids=[m[0].__name__ for m in MODULES])
def test_every_module_argument_reaches_the_options(cls, positional):
    kw = {f.name: OTHER[f.name] for f in dataclasses.fields(cls.Options)}
    args = [kw.pop(name) for name in positional]
    loss = cls(*args, **kw)
    assert loss.options.kwargs() == {**dict(zip(positional, args)), **kw}
    assert all(getattr(loss, name) == value for name, value in loss.options.kwargs().items())


def test_py_typed_is_shipped():
    assert (REPO / "src" / "hardbatch" / "py.typed").is_file()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["hardbatch"]


SNIPPET = '''\
import torch

from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss
from hardbatch.losses import debiased_floor_stats, debiased_info_nce, guided_mask
from hardbatch.losses import hard_negative_info_nce, info_nce, sscl_loss
from hardbatch.losses.functional import contrastive_loss

a, p = torch.randn(4, 8), torch.randn(4, 8)
labels = torch.arange(4)
right: list[torch.Tensor] = [
    info_nce(a, p, temperature=0.1, form="simcse", labels=labels),
    debiased_info_nce(a, p, tau_plus=None, reduction="none"),
    hard_negative_info_nce(a, p, beta=0.5, detach_weights=True),
    sscl_loss(a, p, hardest=4, synthetic=2, generator=torch.Generator()),
    contrastive_loss(a, p, tau_plus=0.1, beta=1.0),
    InfoNCE(0.1, "simcse")(a, p, labels=labels),
    DebiasedInfoNCE(0.5, 0.1)(a, p, negatives=p),
    HardNegativeInfoNCE(0.5, 0.1, 1.0, detach_weights=True)(a, p),
    SSCLLoss(0.5, 0.1, 1.0, 4, 2, False, generator=torch.Generator())(a, p),
    guided_mask(a, p, 0.1, form="simclr"),
]
fraction: float = debiased_floor_stats(a, p, tau_plus=0.1)[0]
module = SSCLLoss()
temperature: float = module.temperature
module.temperature = 0.1
module.generator = None

info_nce(a, p, temperature="hot")  # wrong
info_nce(a, p, form="moco")  # wrong
info_nce(a, p, 0.1)  # wrong
info_nce(a, p, beta=1.0)  # wrong
debiased_info_nce(a, p, tau_plus="0.1")  # wrong
sscl_loss(a, p, hardest=2.5)  # wrong
InfoNCE(temperature="hot")  # wrong
HardNegativeInfoNCE(reduction="avg")  # wrong
SSCLLoss(generator=0)  # wrong
InfoNCE()(a, labels=labels)  # wrong
InfoNCE()(a, p, labels=[0, 1])  # wrong
guided_mask(a, p, margin="x")  # wrong
wrong: str = info_nce(a, p)  # wrong
module.temperature = "hot"  # wrong
module.hardest = 2.5  # wrong
'''


def test_mypy_reports_wrong_argument_types(tmp_path, monkeypatch):
    """mypy accepts every right call of the functions and modules (constructors, calls and
    option attributes) and reports each wrong one, on its line."""
    pytest.importorskip("mypy")
    path = tmp_path / "snippet.py"
    path.write_text(SNIPPET)
    monkeypatch.setenv("MYPYPATH", str(REPO / "src"))
    cache = f"{tempfile.gettempdir()}/hardbatch-mypy-cache"  # torch's stubs: ~30 s cold
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
         "--no-error-summary", "--show-error-codes", "--cache-dir", cache, str(path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    reported = {int(m.group(1)) for m in re.finditer(r"^snippet\.py:(\d+): error:", out.stdout,
                                                     re.MULTILINE)}
    wrong = {i for i, line in enumerate(SNIPPET.splitlines(), 1) if line.endswith("# wrong")}
    assert out.returncode in (0, 1), out.stdout + out.stderr
    assert reported == wrong, out.stdout + out.stderr
