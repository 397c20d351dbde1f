"""Batch diagnostics (``hardbatch.metrics``): how hard, how false-negative-prone and how
complete a batch plan is.

Pure functions (tensors / arrays in, numbers / tensors out) to compare samplers without
training, or to monitor them during training:

* per batch, from item embeddings ``[N, d]`` (cosine similarity: rows are L2-normalised
  inside; an all-zero row has similarity 0 to everything) and a batch of item ids ``[B]``:
  :func:`negative_similarities` (the values histogrammed in BatchSampler, KDD 2023, Fig. 4
  left and Fig. 5), :func:`similarity_histogram`, :func:`batch_hardness`,
  :func:`batch_false_negative_rate` (Fig. 4 right), :func:`batch_duplicate_rate` and
  :func:`batch_stats` (all of them at once);
* per epoch / plan: :func:`draw_counts`, :func:`coverage` and :func:`plan_stats`
  (per-batch numbers averaged over a list of batches, with a pooled histogram);
* for a whole batch plan: :func:`loss_gap`, the gap between the global NT-Xent loss and the
  loss actually seen with in-batch negatives (GCBS paper, Definitions 3.1 / 3.2 and the
  quantity of section 7.2, Fig. 3, that GCBS minimises), and :class:`LossGap` for several
  plans of one table;
* in a fixed coordinate system: hardness and loss gap in each run's *current* embedding move
  with the model, so :func:`batch_stats`, :func:`plan_stats`, :func:`loss_gap` and
  :class:`LossGap` take ``reference=`` (an ``[N, d]`` array, tensor or ``.npy`` / ``.npz`` /
  ``.pt`` file; :func:`load_reference`) and add the same figures measured in it
  (``reference_*`` keys), and every function taking ``embeddings`` takes a file too. The
  false-negative rate with labels does not depend on any embedding; without labels
  :func:`batch_near_duplicate_rate` (pairs above a cosine threshold) under a reference is the
  label-free estimate.

Pairs are taken over batch *positions*: a batch that repeats an id holds a pair of an item with
itself (cosine 1, same label). That is exactly what an in-batch contrastive loss sees, so a
repeated id counts as the anchor's hardest negative and as a false negative;
:func:`batch_duplicate_rate` reports how often it happens (never for the uniform and GCBS
samplers, which partition the items, nor for the walk samplers, which return distinct items).

Batches are any 1-D sequence of integer ids (list, NumPy array, tensor); a plan (``batches``)
is any iterable of batches (a list, a 2-D array, or a sampler, which is iterated once).
Bad input raises ``ValueError`` naming the parameter and the fix.

Modules: :mod:`~hardbatch.metrics.batch_quality` (per batch and per plan),
:mod:`~hardbatch.metrics.global_loss` (global vs training loss),
:mod:`~hardbatch.metrics.files` (embedding, label and reference files).
"""
from .batch_quality import (
    NEAR_DUPLICATE,
    batch_duplicate_rate,
    batch_false_negative_rate,
    batch_hardness,
    batch_near_duplicate_rate,
    batch_stats,
    coverage,
    draw_counts,
    negative_similarities,
    plan_stats,
    similarity_histogram,
)
from .files import load_reference, read_embeddings_file, read_labels_file
from .global_loss import LossGap, loss_gap

__all__ = [
    "NEAR_DUPLICATE",
    "LossGap",
    "batch_duplicate_rate",
    "batch_false_negative_rate",
    "batch_hardness",
    "batch_near_duplicate_rate",
    "batch_stats",
    "coverage",
    "draw_counts",
    "load_reference",
    "loss_gap",
    "negative_similarities",
    "plan_stats",
    "read_embeddings_file",
    "read_labels_file",
    "similarity_histogram",
]
