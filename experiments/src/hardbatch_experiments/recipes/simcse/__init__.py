"""Unsupervised SimCSE through sentence-transformers with hardbatch's samplers and losses.

BatchSampler (Yang et al., KDD 2023), Table 2 / Sec. 4.2 (SimCSE + proximity-graph batches) and
GCBS (Sachidananda et al.), Table 2 (supervised SimCSE + GCBS), scaled to a CPU budget.

One run = (sampler, loss, seed): start from a sentence-transformers model (default
all-MiniLM-L6-v2, offline), train unsupervised SimCSE (Gao et al. 2021) on the first
``--num-sentences`` lines of the shared Wikipedia sentences for ``--max-steps`` steps with
``SentenceTransformerTrainer``, then score STS12-16 + STS-B (:mod:`hardbatch_experiments.sts`,
SimCSE's "all" setting). Each run writes one JSON (atomically); a finished JSON means the run is
skipped on a rerun, so a grid can be completed in pieces.

SimCSE as sentence-transformers documents it: each sentence is paired with itself
(``{"anchor": s, "positive": s}``), dropout is the only augmentation, and an in-batch
contrastive loss with temperature 0.05 (``scale = 20``); lr 3e-5, batch 64, AdamW with linear
decay and no warm-up (the HF Trainer defaults SimCSE also uses), ``max_seq_length`` 32 during
training (SimCSE's ``--max_seq_length 32``; evaluation uses the model's own limit). Losses:
``mnrl`` (sentence-transformers' ``MultipleNegativesRankingLoss``, the library's recipe)
and the losses of :mod:`hardbatch.registry`, ``infonce`` / ``dcl`` / ``hcl`` / ``sscl``
(hardbatch's ``InfoNCE`` / ``DebiasedInfoNCE`` / ``HardNegativeInfoNCE`` / ``SSCLLoss`` in
SimCSE form through :class:`hardbatch.integrations.sentence_transformers.SentenceTransformerLoss`;
``infonce`` equals MNRL).

Samplers (all passed as ``batch_sampler=`` through
:func:`hardbatch.integrations.sentence_transformers.hard_negative_batch_sampler`):
``default`` (sentence-transformers' ``NoDuplicatesBatchSampler``), ``uniform``, ``knn``,
``proximity`` (proximity graph + RWR, alpha 0.7, M 1000, K 500 as BatchSampler advises for
pre-trained language models, capped to M <= N/2, K <= M/2) and ``gcbs`` (quantile 0.999). The
graph / order is built once from the starting model's embeddings of the training sentences
(``--refresh-every`` re-embeds with the model being trained every that many steps instead).
``--start-embeddings FILE.npy`` supplies those embeddings (``[>= N, d]``, rows in file order,
e.g. the cached ``wiki100000_minilm.npy``); otherwise they are computed once per process and
cached under ``$HARDBATCH_CACHE`` (default ``~/.cache/hardbatch``).

Diagnostics (no false-negative labels exist for unsupervised text): for every training batch,
under the starting model's embeddings, the batch hardness (mean top-1 negative cosine,
:func:`hardbatch.metrics.batch_hardness`), the mean negative cosine, and the near-duplicate rate
(share of in-batch pairs with cosine > ``--near-duplicate`` = 0.9, a proxy for false negatives:
pairs that are paraphrases or copies of each other), plus exact duplicate texts.

``--reinit-layers L`` switches to the non-saturated setting (:mod:`.partial`): MiniLM with its
top L layers re-initialised (seeded), the lower layers frozen and cached, only the top L trained
by a plain loop (:mod:`.partial_run`), scored on STS and the STS-B retrieval view
(:mod:`.retrieval`); :mod:`.probe` measures the starting loss, costs and hardness vs K.

Modules: :mod:`.data` (sentences, starting embeddings, batch diagnostics), :mod:`.run` (one
run, one plan, the run tag), :mod:`.cli` (``hardbatch bench simcse``, the grid), :mod:`.partial`,
:mod:`.partial_run`, :mod:`.retrieval`, :mod:`.probe` (the re-initialised setting).

Usage::

    hardbatch bench simcse --sampler default --loss mnrl --seeds 1 --num-sentences 6400
    hardbatch bench simcse --sampler proximity,gcbs --loss infonce --seeds 3 --out results/text
    hardbatch bench simcse --reinit-layers 1 --sampler proximity --neighbors 10 --lr 5e-4
    (scripts/text_confirm.sh holds the whole confirmatory grid)
"""

from .cli import add_simcse_parser, build_parser, main, run_simcse
from .data import batch_diagnostics, read_sentences, starting_embeddings
from .run import plan_one, result_path, run_one, run_tag

__all__ = [
    "add_simcse_parser",
    "batch_diagnostics",
    "build_parser",
    "main",
    "plan_one",
    "read_sentences",
    "result_path",
    "run_one",
    "run_simcse",
    "run_tag",
    "starting_embeddings",
]
