"""Contrastive losses: InfoNCE (SimCLR / SimCSE forms), debiased (DCL), hard-negative (HCL), SSCL.

Every loss takes two views ``anchor`` and ``positive`` of shape ``[B, d]`` (row ``i`` of each is a
positive pair) and compares each anchor with its positive against a set of negatives:

* ``form="simclr"`` (NT-Xent, BatchSampler paper eq. 16): the ``2B`` views are all anchors; each one
  has ``2B - 2`` negatives (every other view except itself and its positive). Per-row losses are
  ``[2B]``: rows ``0..B-1`` use ``anchor[i]`` as the anchor, rows ``B..2B-1`` use ``positive[i]``.
* ``form="simcse"`` (SimCSE / GraphCL / MultipleNegativesRankingLoss, eq. 17): each anchor is
  contrasted with all ``B`` positives, so it has ``B - 1`` negatives. Per-row losses are ``[B]``.
  GraphCL's released ``loss_cal`` also leaves the positive out of the denominator
  (``-log(pos / sum_j neg_ij)``), which this form does not.

Optional ``labels`` ``[B]`` mask known false negatives (no item with the anchor's label is ever a
negative; the positive pair stays the positive); ``false_negatives``, a bool ``[B, B]`` item mask
(True: item ``j`` is not a negative of anchor ``i``; e.g. :func:`guided_mask`, GISTEmbed's guide
rule) generalises them. Optional ``negatives`` ``[m, d]`` (a memory bank as in MoCo, or explicit
hard negatives) are appended to every anchor's negatives and never masked. ``B >= 2`` is needed
without ``negatives``; with at least one row of them a single pair (``B = 1``) is enough.
``gather=True`` contrasts this rank's anchors with every rank's candidates (all-gathered with
gradient; :mod:`.inputs`), scaled so that DDP's averaged gradient is the global batch's.

Writing ``pos = exp(s_i+ / t)`` and ``neg_ij = exp(s_ij / t)`` (cosine similarities ``s`` when
``normalize=True``) and ``N`` for the number of negatives of row ``i``:

* InfoNCE: ``-log(pos / (pos + sum_j neg_ij))``.
* DCL (Chuang et al. 2020; BatchSampler eq. 18 with ``lambda = 1``):
  ``Ng = max((sum_j neg_ij - tau_plus * N * pos) / (1 - tau_plus), N * e^(-1/t))`` and
  ``-log(pos / (pos + Ng))``.
* HCL (Robinson et al. 2021; eq. 18 with ``lambda_ij = w_ij``): as DCL with ``sum_j neg_ij``
  replaced by ``sum_j w_ij neg_ij``, ``w_ij = exp(beta s_ij / t) / mean_j exp(beta s_ij / t)``.
* SSCL (Dong et al., "Synthetic Hard Negative Samples for Contrastive Learning", eq. 2-4): HCL over
  the negatives plus ``k`` synthetic ones mixed from the ``s`` hardest negatives.

The four nest, InfoNCE ⊂ DCL ⊂ HCL ⊂ SSCL, and are computed by one function,
:func:`~hardbatch.losses.functional.contrastive_loss`: SSCL with ``synthetic=0`` is HCL, HCL with
``beta=0`` is DCL (bit for bit), and DCL with ``tau_plus=0`` is InfoNCE but for the floor
``N e^(-1/t)``, which never binds for normalised embeddings (every logit is ``>= -1/t``).

Everything is evaluated in log space: ``log sum exp`` with per-row max shifts, the debiasing
subtraction as ``log S + log(1 - tau_plus N pos / S)`` and the clamp as a maximum of logs, so fp16 /
bf16 inputs at ``t = 0.05`` (where ``exp(1 / t)`` overflows fp16) stay finite. Half-precision inputs
are computed in float32 and the loss is returned in float32; ``torch.autocast`` is disabled inside
the losses, so under mixed precision float32 inputs give the same loss as outside it.

The ``torch.nn.Module`` classes take the two views positionally, ``loss(out0, out1)``, like the
lightly losses (``NTXentLoss``), and class ``labels`` as a keyword, like pytorch-metric-learning.

Rows left without any negative (every other item shares the anchor's label and there is no memory
bank) have loss ``-log(pos / pos) = 0`` and zero gradient; ``reduction="mean"`` still counts them.

Layout: :mod:`.loss_options` (each option declared once: type, default, check), :mod:`.functional`
and :mod:`.modules` (the losses, with their signatures and docs), :mod:`.masks`
(:func:`guided_mask`); internal: :mod:`.core` (the computation: inputs prepared, logits,
log-space negative term, debiasing, reduction; plain InfoNCE entirely there), :mod:`.inputs`
(the batch containers, half-precision cast, label masks and ``gather=True``) and
:mod:`.synthetic` (SSCL's synthetic negatives). Input checks live in ``hardbatch._validation``.
"""

from .functional import (
    debiased_floor_stats,
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)
from .masks import guided_mask
from .modules import DebiasedInfoNCE, HardNegativeInfoNCE, InfoNCE, SSCLLoss

__all__ = [
    "DebiasedInfoNCE",
    "HardNegativeInfoNCE",
    "InfoNCE",
    "SSCLLoss",
    "debiased_floor_stats",
    "debiased_info_nce",
    "guided_mask",
    "hard_negative_info_nce",
    "info_nce",
    "sscl_loss",
]
