"""What a training checkpoint holds, and seeding.

A checkpoint (:func:`trainer_state`) holds everything a :class:`~hardbatch.train.Trainer` run
depends on: model, optimiser, loss (its generator), bank, the sampler's state at the number of
steps done this epoch, progress, log and every RNG state, so that a resumed run continues
exactly as the uninterrupted one would have.

Safety (issue 34): a checkpoint holds only tensors, numbers, strings, lists and dicts (the NumPy
and Python RNG states as a tensor and plain numbers), so :func:`read_checkpoint` loads it with
``torch.load(weights_only=True)``, which runs no pickled code. :func:`write_checkpoint` adds a
SHA-256 checksum of the content and the writing hardbatch's version
(:mod:`hardbatch._integrity`); :func:`read_checkpoint` verifies it and raises ``ValueError``
naming the file and the word "corrupted" when a byte changed or the checksum is missing.
"""

from __future__ import annotations

import os
import pickle
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .._integrity import seal, verify

__all__ = ["CHECKPOINT_VERSION", "load_trainer_state", "read_checkpoint", "sampler_state",
           "seed_everything", "trainer_state", "write_checkpoint"]

CHECKPOINT_VERSION = 2  # 2: RNG states as tensors and numbers, a checksum


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
            "numpy": numpy_rng_state(),
            "python": python_rng_state(),
        },
    }


def numpy_rng_state() -> dict:
    """NumPy's global RNG state (its bit generator's ``state`` dict) as a tensor and numbers."""
    state = np.random.get_state(legacy=False)
    inner = state["state"]
    return {"bit_generator": str(state["bit_generator"]),
            "key": torch.from_numpy(np.asarray(inner["key"]).astype(np.int64)),
            "pos": int(inner["pos"]), "has_gauss": int(state["has_gauss"]),
            "gauss": float(state["gauss"])}


def set_numpy_rng_state(state) -> None:
    """Restore :func:`numpy_rng_state`."""
    np.random.set_state({
        "bit_generator": state["bit_generator"],
        "state": {"key": np.asarray(state["key"], dtype=np.int64).astype(np.uint32),
                  "pos": int(state["pos"])},
        "has_gauss": int(state["has_gauss"]), "gauss": float(state["gauss"])})


def python_rng_state() -> dict:
    """Python's ``random.getstate()`` (version, 625 ints, gauss_next) as a tensor and numbers."""
    version, internal, gauss_next = random.getstate()
    return {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": None if gauss_next is None else float(gauss_next)}


def set_python_rng_state(state) -> None:
    """Restore :func:`python_rng_state`."""
    random.setstate((int(state["version"]), tuple(int(v) for v in state["internal"].tolist()),
                     state["gauss_next"]))


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
                         f"(this hardbatch reads version {CHECKPOINT_VERSION})")
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
    set_numpy_rng_state(rng["numpy"])
    set_python_rng_state(rng["python"])


def write_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """Write ``state`` with its checksum to ``path`` atomically (a temporary file, flushed to
    disk, then ``os.replace``): a crash leaves the previous checkpoint or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    sealed = seal(state, "checkpoint")
    with open(tmp, "wb") as f:
        torch.save(sealed, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The state saved at ``path``, its checksum verified.

    Loaded with ``torch.load(weights_only=True)`` (no pickled code runs). ``ValueError`` naming
    the file: "corrupted" when the content no longer matches its checksum or cannot be read,
    "not a hardbatch training checkpoint" for another file. A checkpoint without a checksum
    is "corrupted" too.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{path} is corrupted or not a hardbatch training checkpoint: it holds something "
            "other than tensors, numbers, strings, lists and dicts, which torch.load("
            f"weights_only=True) refuses (loading it could run arbitrary code): {exc}") from exc
    except Exception as exc:
        raise ValueError(f"{path} is corrupted or not a hardbatch training checkpoint: "
                         f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(state, dict) or "progress" not in state:
        raise ValueError(f"{path} is not a hardbatch training checkpoint (or is corrupted)")
    if not verify(state, str(path)):
        raise ValueError(f"{path} is corrupted: a hardbatch checkpoint carries a checksum and "
                         "this one has none")
    return state
