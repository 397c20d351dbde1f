"""Batch-size sweeps of ``hardbatch bench simclr`` (issue 21): the image budget, the learning-rate
rule for a batch size, the fixed reference encoder shared by every arm, and the pairing record.

* ``--images N``: training images seen per run, the same for every batch size B, so a run makes
  ``steps = ceil(N / B)`` steps (over ``ceil(steps / ceil(n / B))`` epochs of the ``n``-image
  training subset; with ``n`` a multiple of every B, e.g. 8192 for B = 32 ... 256, and ``N`` a
  multiple of ``n``, every image is seen the same number of times at every B). The RWR restart
  schedule then decays over exactly those steps (``LinearDecay(total_steps=steps)``).
* ``--lr-rule``: ``fixed`` (the given ``--lr`` at every B) or ``sqrt`` (``lr * sqrt(B / B_ref)``
  with ``B_ref = --lr-reference-batch``, the square-root rule for Adam, Malladi et al. 2022:
  it keeps the noise scale of the updates, so that at a fixed image budget runs with different
  B follow about the same optimisation path and differ mostly in what the contrastive loss
  sees, its in-batch negatives).
* ``--reference FILE``: a fixed ``[n, d]`` embedding of the training subset (one row per
  image, in the subset's order) in which every arm's batches are measured (reference hardness,
  near-duplicate rate); ``--save-reference FILE`` writes one from a finished run (the
  projections of the un-augmented training images), with the subset's ids, so that a file made
  for another subset is refused.
* :func:`pairing_record`: fingerprints that show that seed k of every arm starts from the same
  weights, evaluates on the same images and draws the same augmentation random numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import math
from pathlib import Path

import torch

from hardbatch.cli_types import positive_int

__all__ = ["LR_RULES", "add_budget_arguments", "load_reference_file", "pairing_record",
           "plan_steps", "save_reference", "scaled_lr", "tensor_digest"]

LR_RULES = ("fixed", "sqrt")


def scaled_lr(lr: float, batch_size: int, rule: str = "fixed", reference_batch: int = 256) -> float:
    """The learning rate at batch size ``batch_size`` under ``rule`` (see the module docstring):
    ``fixed``: ``lr``; ``sqrt``: ``lr * sqrt(batch_size / reference_batch)``."""
    if rule not in LR_RULES:
        raise ValueError(f"lr_rule={rule!r} must be one of {LR_RULES}")
    if not lr > 0:
        raise ValueError(f"lr={lr} must be positive")
    if batch_size < 1 or reference_batch < 1:
        raise ValueError(f"batch_size={batch_size} and lr_reference_batch={reference_batch} must "
                         "be >= 1")
    return float(lr) if rule == "fixed" else float(lr) * math.sqrt(batch_size / reference_batch)


def plan_steps(images: int, batch_size: int, train_size: int) -> tuple[int, int]:
    """``(steps, epochs)`` for a budget of ``images`` training images at batch size
    ``batch_size`` over ``train_size`` images: ``steps = ceil(images / batch_size)``,
    ``epochs = ceil(steps / ceil(train_size / batch_size))`` (the last may be partial)."""
    if images < 1:
        raise ValueError(f"images={images} must be >= 1 (training images seen per run)")
    if batch_size < 1 or train_size < 1:
        raise ValueError(f"batch_size={batch_size} and train_size={train_size} must be >= 1")
    steps = math.ceil(images / batch_size)
    return steps, math.ceil(steps / math.ceil(train_size / batch_size))


def tensor_digest(x: torch.Tensor) -> str:
    """The first 16 hex digits of the SHA-256 of a tensor's bytes (CPU, contiguous)."""
    data = x.detach().cpu().contiguous()
    if data.dtype == torch.bfloat16:
        data = data.float()
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]


def pairing_record(model: torch.nn.Module, train_ids: torch.Tensor, test_ids: torch.Tensor) -> dict:
    """Fingerprints of what seed k must share across arms, taken before training: the initial
    weights (encoder + head), the training subset's and the evaluation subset's ids.
    (The augmentation stream's fingerprint, ``augment_generator_end``, is added after
    training by the recipe.)"""
    weights = torch.cat([p.detach().flatten().float().cpu() for p in model.state_dict().values()
                         if torch.is_tensor(p) and p.is_floating_point()])
    return {"initial_weights": tensor_digest(weights), "train_ids": tensor_digest(train_ids.long()),
            "test_ids": tensor_digest(test_ids.long())}


def save_reference(path: Path | str, embeddings: torch.Tensor, ids: torch.Tensor,
                   meta: dict) -> Path:
    """Write a reference embedding file (``.pt``: ``embeddings`` float32 ``[n, d]``, the
    training subset's ``ids`` and ``meta``, a dict of strings and numbers) atomically."""
    path = Path(path)
    if path.suffix not in (".pt", ".pth"):
        raise ValueError(f"--save-reference {path}: must end in .pt")
    if embeddings.ndim != 2 or len(embeddings) != len(ids):
        raise ValueError(f"reference embeddings {tuple(embeddings.shape)} must be [n, d] with one "
                         f"row per training image ({len(ids)})")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"embeddings": embeddings.detach().float().cpu().contiguous(),
                "ids": ids.long().cpu(), "meta": dict(meta)}, tmp)
    tmp.replace(path)
    return path


def load_reference_file(path: Path | str, ids: torch.Tensor,
                        flag: str = "--reference") -> tuple[torch.Tensor, dict]:
    """``(embeddings [n, d] float32, info)`` from a :func:`save_reference` file (or any
    ``[n, d]`` ``.npy`` / ``.npz`` / ``.pt`` file); ``ids`` are the run's training subset ids,
    which a file with ``ids`` must match. ``info``: path, SHA-256 prefix, shape and ``meta``.
    ``flag``: the option errors name (``--reference`` or ``--guide``)."""
    from hardbatch.metrics import load_reference

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: no such file (make one with "
                                "--save-reference, see scripts/vision_sweep.sh)")
    meta: dict = {}
    if path.suffix in (".pt", ".pth"):
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(blob, dict):
            meta = dict(blob.get("meta") or {})
            stored = blob.get("ids")
            if stored is not None and not torch.equal(torch.as_tensor(stored).long(), ids.long()):
                raise ValueError(f"{flag} {path} was made for another training subset "
                                 f"({len(stored)} ids, not the run's {len(ids)}); rebuild it "
                                 "with the run's --train-size")
    x = torch.from_numpy(load_reference(str(path), len(ids), name=flag))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return x, {"path": str(path), "sha256": digest, "shape": list(x.shape), "meta": meta}


def add_budget_arguments(p: argparse.ArgumentParser) -> None:
    """``--images``, ``--lr-rule``, ``--lr-reference-batch``, ``--reference``, ``--guide``,
    ``--guide-margin``, ``--save-reference`` (see the module docstring)."""
    p.add_argument("--images", type=positive_int, default=None,
                   help="training images seen per run (steps = ceil(IMAGES / B); overrides "
                        "--epochs; default: --epochs epochs)")
    p.add_argument("--lr-rule", choices=LR_RULES, default="fixed",
                   help="learning rate per batch size: fixed (--lr at every B) or sqrt "
                        "(--lr * sqrt(B / --lr-reference-batch)); default fixed")
    p.add_argument("--lr-reference-batch", type=positive_int, default=256,
                   help="the batch size at which --lr applies under --lr-rule sqrt (default 256)")
    p.add_argument("--reference", default=None,
                   help="fixed reference embedding of the training subset (.pt / .npy / .npz, "
                        "[n, d]) shared by every arm for the batch diagnostics (default: the "
                        "untrained network of the run's seed)")
    p.add_argument("--guide", default=None,
                   help="guided false-negative masks: a fixed embedding of the training subset "
                        "(same formats as --reference); item j is no negative of anchor i when "
                        "their guide cosine exceeds 1 - --guide-margin (Trainer(guide=))")
    p.add_argument("--guide-margin", type=float, default=0.1,
                   help="margin of --guide's rule, in (0, 2] (default 0.1)")
    p.add_argument("--save-reference", default=None,
                   help="after training, write the projections of the training subset to this "
                        ".pt file (a reference encoder for other runs)")
