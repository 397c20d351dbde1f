"""Evaluation of frozen features: weighted kNN and linear-probe accuracy (train -> test).

``evaluate(encoder, train_x, train_y, test_x, test_y)`` embeds both sets with :func:`embed` and
scores them with :func:`knn_accuracy` (the InstDisc / SimCLR monitor) and
:func:`linear_probe_accuracy` (L-BFGS logistic regression).
"""

from __future__ import annotations

import torch
from torch import nn

from .._device import resolve_device
from .._validation import l2_normalize_rows

__all__ = ["embed", "evaluate", "knn_accuracy", "linear_probe_accuracy"]


@torch.no_grad()
def embed(module: nn.Module, x: torch.Tensor, batch_size: int = 1024,
          device: str | torch.device = "cpu") -> torch.Tensor:
    """``module(x)`` in eval mode and chunks of ``batch_size`` rows on ``device``, as a float32
    CPU tensor (training mode restored).

    Example:
        >>> import torch
        >>> from hardbatch.train import embed
        >>> encoder = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Dropout(0.5))
        >>> features = embed(encoder, torch.randn(40, 8), batch_size=16)  # eval mode: no dropout
        >>> features.shape, features.dtype, encoder.training
        (torch.Size([40, 4]), torch.float32, True)
    """
    device = resolve_device(device)
    was_training = module.training
    module.eval()
    try:
        out = [module(x[i:i + batch_size].to(device)).float().cpu()
               for i in range(0, len(x), batch_size)]
    finally:
        module.train(was_training)
    return torch.cat(out)


@torch.no_grad()
def knn_accuracy(train_features: torch.Tensor, train_labels: torch.Tensor,
                 test_features: torch.Tensor, test_labels: torch.Tensor, k: int = 200,
                 temperature: float = 0.1, chunk: int = 1024) -> float:
    """Weighted kNN accuracy (Wu et al. 2018 InstDisc; the SimCLR / MoCo kNN monitor).

    Cosine similarities of each test feature to the training features; the ``k`` nearest vote
    for their class with weight ``exp(s / temperature)``; ``chunk`` test rows per block of
    similarities.

    Example:
        >>> from hardbatch.train import knn_accuracy
        >>> import torch
        >>> y = torch.arange(40) % 4
        >>> train_x = 3 * torch.eye(8)[y] + 0.1 * torch.randn(40, 8)  # 4 well separated classes
        >>> test_x = 3 * torch.eye(8)[y] + 0.1 * torch.randn(40, 8)
        >>> knn_accuracy(train_x, y, test_x, y, k=5)
        1.0
    """
    train = l2_normalize_rows(train_features.float())
    test = l2_normalize_rows(test_features.float())
    train_labels = train_labels.long()
    classes = int(torch.cat([train_labels, test_labels.long()]).max()) + 1
    k = min(int(k), train.shape[0])
    correct = 0
    for i in range(0, test.shape[0], chunk):
        sims = test[i:i + chunk] @ train.T
        top, idx = sims.topk(k, dim=1)
        weights = (top / temperature).exp()
        votes = torch.zeros(sims.shape[0], classes)
        votes.scatter_add_(1, train_labels[idx], weights)
        correct += int((votes.argmax(1) == test_labels[i:i + chunk].long()).sum())
    return correct / test.shape[0]


def linear_probe_accuracy(train_features: torch.Tensor, train_labels: torch.Tensor,
                          test_features: torch.Tensor, test_labels: torch.Tensor,
                          weight_decay: float = 1e-4, max_iter: int = 100) -> float:
    """Accuracy of multinomial logistic regression on frozen features (full-batch L-BFGS).

    Features are standardised with the training mean / std; deterministic (zero init);
    ``weight_decay``: the L2 penalty, ``max_iter``: L-BFGS iterations.

    Example:
        >>> import torch
        >>> y = torch.arange(40) % 4
        >>> train_x = 3 * torch.eye(8)[y] + 0.1 * torch.randn(40, 8)  # 4 well separated classes
        >>> test_x = 3 * torch.eye(8)[y] + 0.1 * torch.randn(40, 8)
        >>> from hardbatch.train import linear_probe_accuracy
        >>> linear_probe_accuracy(train_x, y, test_x, y, max_iter=50)
        1.0
    """
    mean = train_features.float().mean(0)
    std = train_features.float().std(0).clamp_min(1e-6)
    xtr = (train_features.float() - mean) / std
    xte = (test_features.float() - mean) / std
    ytr = train_labels.long()
    classes = int(torch.cat([ytr, test_labels.long()]).max()) + 1
    weight = torch.zeros(xtr.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(xtr @ weight + bias, ytr)
        loss = loss + weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        pred = (xte @ weight + bias).argmax(1)
    return float((pred == test_labels.long()).double().mean())


def evaluate(encoder: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
             test_x: torch.Tensor, test_y: torch.Tensor, *, k: int = 200, temperature: float = 0.1,
             probe_weight_decay: float = 1e-4, probe_max_iter: int = 100,
             batch_size: int = 1024, device: str | torch.device = "cpu",
             probe: bool = True) -> dict:
    """kNN and linear-probe accuracy of ``encoder``'s frozen features (train -> test);
    ``probe=False``: kNN accuracy only. ``k``, ``temperature``: as :func:`knn_accuracy`;
    ``probe_weight_decay``, ``probe_max_iter``: :func:`linear_probe_accuracy`'s
    ``weight_decay``, ``max_iter``; ``batch_size``, ``device``: as :func:`embed`.

    Example:
        >>> import torch
        >>> from hardbatch.train import evaluate
        >>> centers, y = 3 * torch.eye(8)[:4], torch.arange(40) % 4  # 4 classes in d = 8
        >>> features = centers[y] + 0.1 * torch.randn(40, 8)
        >>> evaluate(torch.nn.Identity(), features[:20], y[:20], features[20:], y[20:], k=5)
        {'knn_accuracy': 1.0, 'linear_probe_accuracy': 1.0}
    """
    device = resolve_device(device)
    f_train = embed(encoder, train_x, batch_size, device)
    f_test = embed(encoder, test_x, batch_size, device)
    out = {"knn_accuracy": knn_accuracy(f_train, train_y, f_test, test_y, k, temperature)}
    if probe:
        out["linear_probe_accuracy"] = linear_probe_accuracy(
            f_train, train_y, f_test, test_y, probe_weight_decay, probe_max_iter)
    return out
