"""What a training checkpoint holds, and seeding.

A checkpoint (:func:`trainer_state`) holds everything a :class:`~hardbatch.train.Trainer` run
depends on: model, optimiser, loss (its generator), bank, the sampler's state at the number of
steps done this epoch, progress, log and every RNG state, so that a resumed run continues
exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

__all__ = ["CHECKPOINT_VERSION", "load_trainer_state", "read_checkpoint", "sampler_state",
           "seed_everything", "trainer_state", "write_checkpoint"]

CHECKPOINT_VERSION = 1


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global generator and torch.

    Example:
        >>> import random
        >>> import torch
        >>> from hardbatch.train import seed_everything
        >>> seed_everything(0)
        >>> first = (random.random(), torch.rand(2).tolist())
        >>> seed_everything(0)
        >>> first == (random.random(), torch.rand(2).tolist())
        True
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def trainer_state(trainer) -> dict:
    """Everything ``trainer`` (a :class:`~hardbatch.train.Trainer`) needs to continue exactly."""
    loss_gen = getattr(trainer.loss, "generator", None)
    return {
        "version": CHECKPOINT_VERSION,
        "config": asdict(trainer.config),
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "loss": trainer.loss.state_dict(),
        "bank": trainer.bank.state_dict(),
        "sampler": sampler_state(trainer.sampler, trainer.step_in_epoch),
        "progress": {"global_step": trainer.global_step, "epoch": trainer.epoch,
                     "step_in_epoch": trainer.step_in_epoch},
        "history": list(trainer.history),
        "evals": list(trainer.evals),
        "epoch_batches": list(trainer.epoch_batches),
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None),
            "augment": trainer.generator.get_state(),
            "loss": (loss_gen.get_state() if isinstance(loss_gen, torch.Generator)
                     else None),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }


def sampler_state(sampler, step_in_epoch: int) -> dict | None:
    """The sampler's state after ``step_in_epoch`` batches of this epoch (None: it has none)."""
    if not hasattr(sampler, "state_dict"):
        return None
    if step_in_epoch >= len(sampler):  # epoch done: the sampler's next epoch
        return sampler.state_dict()
    try:
        return sampler.state_dict(consumed=step_in_epoch)
    except TypeError:  # a sampler without the consumed= argument
        return sampler.state_dict()


def load_trainer_state(trainer, state: dict) -> None:
    """Restore :func:`trainer_state`'s ``state`` into ``trainer``."""
    if state.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {state.get('version')} is not supported "
                         f"(expected {CHECKPOINT_VERSION})")
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.loss.load_state_dict(state["loss"])
    trainer.bank.load_state_dict(state["bank"])
    if state["sampler"] is not None:
        trainer.sampler.load_state_dict(state["sampler"])
    progress = state["progress"]
    trainer.global_step = int(progress["global_step"])
    trainer.epoch = int(progress["epoch"])
    trainer.step_in_epoch = int(progress["step_in_epoch"])
    trainer.history = list(state["history"])
    trainer.evals = list(state["evals"])
    trainer.epoch_batches = [list(b) for b in state["epoch_batches"]]
    if trainer.scaler is not None and state.get("scaler") is not None:
        trainer.scaler.load_state_dict(state["scaler"])
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    trainer.generator.set_state(rng["augment"])
    loss_gen = getattr(trainer.loss, "generator", None)
    if rng["loss"] is not None and isinstance(loss_gen, torch.Generator):
        loss_gen.set_state(rng["loss"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def write_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """Write ``state`` to ``path`` atomically (a temporary file, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The state saved at ``path``; ``ValueError`` if it is not a training checkpoint."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{path} is not a hardbatch training checkpoint: {exc}") from exc
    if not isinstance(state, dict) or "progress" not in state:
        raise ValueError(f"{path} is not a hardbatch training checkpoint")
    return state
