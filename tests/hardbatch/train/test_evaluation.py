"""hardbatch.train.evaluation: weighted kNN accuracy and the linear probe on frozen features."""

from pathlib import Path

import pytest
import torch

from hardbatch.train import knn_accuracy, linear_probe_accuracy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_knn_and_linear_probe_on_separable_data():
    gen = torch.Generator().manual_seed(0)
    centers = torch.eye(4) * 5
    y_train = torch.arange(4).repeat(50)
    y_test = torch.arange(4).repeat(10)
    x_train = centers[y_train] + torch.randn(200, 4, generator=gen)
    x_test = centers[y_test] + torch.randn(40, 4, generator=gen)
    assert knn_accuracy(x_train, y_train, x_test, y_test, k=200, temperature=0.1) == 1.0
    assert linear_probe_accuracy(x_train, y_train, x_test, y_test) == 1.0
    # random labels: chance level, not perfect
    y_rand = torch.randint(0, 4, (200,), generator=gen)
    assert knn_accuracy(x_train, y_rand, x_test, y_test, k=5) < 0.8


def test_knn_weighted_vote_small_case():
    train_f = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    train_y = torch.tensor([0, 1, 1])
    # k=2 neighbours of [1, 0]: item 0 (class 0, cos 1) outweighs item 1 (class 1, cos 0.99)
    assert knn_accuracy(train_f, train_y, torch.tensor([[1.0, 0.0]]), torch.tensor([0]), k=2) == 1.0
    # k=3 with a flat temperature: classes 1 gets two votes
    assert knn_accuracy(train_f, train_y, torch.tensor([[1.0, 0.0]]), torch.tensor([1]), k=3,
                        temperature=100.0) == 1.0


def test_default_eval_queries_are_left_out_of_the_fit_only_and_the_docs_say_so(digits):
    """Without ``eval_data`` the evaluation queries (``eval_fraction`` of the items) are left
    out of the kNN / probe fit only: the sampler still trains on them (without labels). The
    docs and docstrings called them "held out", which they are not from training."""
    import hardbatch as hb
    from hardbatch.losses import InfoNCE
    from hardbatch.train import TrainConfig, Trainer
    from train_support import small_model

    x, y = digits
    trainer = Trainer(small_model(), InfoNCE(0.5), hb.UniformBatchSampler(len(x), 32, seed=1),
                      x, y, epochs=1, progress=False, eval_every=None)
    x_fit, _, x_query, _ = trainer.eval_data
    assert len(x_fit) + len(x_query) == len(x) and len(x_query) == round(0.2 * len(x))
    query_ids = {int((x == row).all(dim=1).nonzero()[0]) for row in x_query}
    trained = {int(i) for batch in trainer.sampler for i in batch}
    assert query_ids <= trained  # the queries are in the contrastive training batches
    docs = (Path(__file__).parents[3] / "docs" / "training.md").read_text()
    assert "held out from the kNN / probe\n  fit only" in docs
    assert "items is held out as queries" not in docs
    for doc in (TrainConfig.__doc__, Trainer.__doc__, hb.train.__doc__):
        assert "held-out share" not in doc and "held out for evaluation" not in doc
        assert "still in contrastive training" in " ".join(doc.split())
