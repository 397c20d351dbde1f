"""sentence-transformers integration.

``SentenceTransformerLoss`` is a drop-in replacement for
``sentence_transformers.losses.MultipleNegativesRankingLoss`` (MNRL) that computes any hardbatch
loss. sentence-transformers itself is never imported here: the adapter only calls
``model(features)["sentence_embedding"]``, so ``import hardbatch`` works without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..registry import canonical_loss, make_loss

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

__all__ = [
    "HardNegativeBatchSampler",
    "SentenceTransformerLoss",
    "TextEmbeddingSource",
    "hard_negative_batch_sampler",
]


class SentenceTransformerLoss(nn.Module):
    """A hardbatch loss for ``SentenceTransformerTrainer``, structured like MNRL.

    Inputs are ``(anchor, positive)`` pairs or ``(anchor, positive, negative_1, ..., negative_n)``
    tuples: column 0 gives the anchors, column 1 the positives, and every further column is
    appended to the negatives of every anchor, exactly as MNRL treats hard-negative columns. With
    ``loss="infonce"`` and the default ``form="simcse"`` the result equals MNRL with the same
    ``scale`` (cosine similarity times ``scale``, cross-entropy against the positive).

    Args:
        model: the ``SentenceTransformer`` being trained (called as ``model(features)``).
        loss: a loss name of :mod:`hardbatch.registry` (``"infonce"``, ``"dcl"``, ``"hcl"``,
            ``"sscl"``; ``"debiased"`` / ``"hard_negative"`` are aliases) or a hardbatch loss
            module (``InfoNCE`` ...), used as is.
        scale: inverse temperature, ``scale = 1 / temperature`` as in MNRL. Default 20.0
            (temperature 0.05) for a named loss; for a module, its own temperature is used and
            ``scale`` may be omitted.
        labels_as_classes: use the trainer's ``labels`` (a ``[B]`` ``"label"`` column) as class
            labels that mask false negatives. Off by default: like MNRL the labels are ignored,
            since a ``"label"`` column often holds scores rather than classes.
        **loss_kwargs: options of the named loss (``tau_plus``, ``beta``, ``hardest``,
            ``synthetic``, ``form`` ...); the form defaults to ``"simcse"``, MNRL's.
    """

    def __init__(
        self,
        model: SentenceTransformer | nn.Module,
        loss: str | nn.Module = "infonce",
        scale: float | None = None,
        *,
        labels_as_classes: bool = False,
        **loss_kwargs: Any,
    ) -> None:
        super().__init__()
        if scale is not None and (
            not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0
        ):
            raise ValueError(
                f"scale (= 1 / temperature) must be a finite number > 0, got {scale!r}"
            )
        if isinstance(loss, nn.Module):
            if loss_kwargs:
                raise ValueError(
                    f"loss_kwargs {sorted(loss_kwargs)} only apply to a named loss; configure the "
                    f"{type(loss).__name__} module itself instead"
                )
            temperature = getattr(loss, "temperature", None)
            if scale is not None and (
                temperature is None or not math.isclose(scale, 1.0 / temperature)
            ):
                raise ValueError(
                    f"scale={scale} conflicts with the module's temperature={temperature}; "
                    f"omit scale or build the module with temperature={1.0 / scale}"
                )
            self.loss_name = type(loss).__name__
            self.loss_kwargs: dict[str, Any] = {}
            self.scale = None if temperature is None else 1.0 / temperature
            self.loss = loss
        else:
            try:
                self.loss_name = canonical_loss(loss)
            except ValueError as exc:
                raise ValueError(f"{exc}; or pass a hardbatch loss module") from None
            self.loss_kwargs = {"form": "simcse", **loss_kwargs}
            self.scale = 20.0 if scale is None else float(scale)
            self.loss = make_loss(self.loss_name, temperature=1.0 / self.scale,
                                  **self.loss_kwargs)
        self.model = model
        self.labels_as_classes = labels_as_classes

    def forward(
        self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None
    ) -> Tensor:
        """Embed every input column with the model, then :meth:`compute_loss_from_embeddings`."""
        embeddings = [self.model(features)["sentence_embedding"] for features in sentence_features]
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(
        self, embeddings: list[Tensor], labels: Tensor | None = None
    ) -> Tensor:
        """Loss from per-column embeddings ``[B, d]``: anchors, positives, then hard negatives.

        A batch of a single pair without hard-negative columns (the last batch of an epoch when
        the sampler keeps it, ``drop_last=False``) has no negative; as in MNRL (a cross-entropy
        over one logit) its loss is 0, with zero gradient, instead of an error.
        """
        if len(embeddings) < 2:
            raise ValueError(
                f"expected at least 2 embedding columns (anchor, positive[, negatives...]), "
                f"got {len(embeddings)}"
            )
        negatives = torch.cat(embeddings[2:]) if len(embeddings) > 2 else None
        anchor = embeddings[0]
        if (
            isinstance(anchor, Tensor)
            and anchor.dim() == 2
            and anchor.shape[0] == 1
            and (negatives is None or negatives.shape[0] == 0)
        ):
            # Sums over empty slices: exactly 0, on the graph of both columns, never NaN.
            zero = anchor[:0].sum() + embeddings[1][:0].sum()
            return zero.float() if zero.dtype in (torch.float16, torch.bfloat16) else zero
        classes = labels if self.labels_as_classes else None
        return self.loss(anchor, embeddings[1], labels=classes, negatives=negatives)

    def get_config_dict(self) -> dict[str, Any]:
        """Hyperparameters, for the model card written by sentence-transformers."""
        return {"loss": self.loss_name, "scale": self.scale, **self.loss_kwargs}

    @property
    def temperature(self) -> float | None:
        return None if self.scale is None else 1.0 / self.scale


# The batch sampler half of the integration (hard-negative batches re-embedded with the model).
from .sentence_transformers_sampler import (
    HardNegativeBatchSampler,
    TextEmbeddingSource,
    hard_negative_batch_sampler,
)
