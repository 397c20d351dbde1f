"""sentence-transformers integration; every public name is imported from here.

- :mod:`.loss`: :class:`SentenceTransformerLoss`, any hardbatch loss in place of MNRL, with
  GISTEmbed's ``guide=`` masks;
- :mod:`.cached_loss`: :class:`CachedSentenceTransformerLoss`, its GradCache form;
- :mod:`.factory`: :func:`hard_negative_batch_sampler`, the ``batch_sampler`` of
  ``SentenceTransformerTrainingArguments``, which builds
- :mod:`.sampler`: :class:`HardNegativeBatchSampler`, hard-negative batches re-embedded with the
  model being trained, and the checks of its options;
- :mod:`.texts`: the dataset's texts, their conflict keys (no text twice in a batch) and their
  embeddings (:class:`TextEmbeddingSource`);
- :mod:`.resume`: the training sampler's state saved with every checkpoint
  (:data:`RESUME_FILE`) and restored when the trainer resumes, by a callback the factory
  registers with the trainer.

sentence-transformers itself is never imported by these modules (they call the model), so
``import hardbatch`` works without it.
"""

from .cached_loss import CachedSentenceTransformerLoss
from .factory import HardNegativeBatchSamplerFactory, hard_negative_batch_sampler
from .loss import SentenceTransformerLoss
from .resume import RESUME_FILE
from .sampler import (
    DEFAULT_SAMPLER,
    GENERIC_OPTIONS,
    HardNegativeBatchSampler,
    check_options,
    check_text_keys,
    parameters,
    sampler_name,
    sampler_options,
    sampler_seed,
    texts_error,
)
from .texts import LABEL_COLUMNS, TextEmbeddingSource, column_texts, row_conflicts, text_columns

__all__ = [
    "DEFAULT_SAMPLER",
    "GENERIC_OPTIONS",
    "LABEL_COLUMNS",
    "RESUME_FILE",
    "CachedSentenceTransformerLoss",
    "HardNegativeBatchSampler",
    "HardNegativeBatchSamplerFactory",
    "SentenceTransformerLoss",
    "TextEmbeddingSource",
    "check_options",
    "check_text_keys",
    "column_texts",
    "hard_negative_batch_sampler",
    "parameters",
    "row_conflicts",
    "sampler_name",
    "sampler_options",
    "sampler_seed",
    "text_columns",
    "texts_error",
]
