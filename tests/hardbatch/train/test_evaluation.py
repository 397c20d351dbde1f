"""hardbatch.train.evaluation: weighted kNN accuracy and the linear probe on frozen features."""

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
