"""The text page's sections on batches without training: the debiasing floor (from
``scripts/text_debias_floor.py``'s JSON) and the plan-only runs (``hardbatch bench simcse
--plan-only``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from .common import fmt_mean_std as fmt
from .common import md_row, md_rule
from .text_runs import SAMPLERS, TextRuns, r_base


def floor_section(path: Path) -> list[str]:
    """The debiasing-floor table from ``scripts/text_debias_floor.py``'s JSON, if present."""
    if not path.is_file():
        return []
    rec = json.loads(path.read_text())
    groups: dict = defaultdict(list)
    for r in rec["rows"]:
        groups[(r["temperature"], r["tau_plus"], r["beta"], r["sampler"])].append(r)
    L: list[str] = []
    w = L.append
    w("### Why DCL / HCL do not train at t = 0.05: the debiasing floor\n")
    w("DCL / HCL replace the negative sum S by `max((S - tau+ N pos) / (1 - tau+), N e^(-1/t))`. "
      "Per batch of SimCSE views (each batch encoded twice in train mode, dropout = the "
      "augmentation, 32 tokens, the starting all-MiniLM-L6-v2), the share of rows on that floor "
      "(`hardbatch.losses.debiased_floor_stats`) and the median `tau+` below which a row is off "
      f"it; {rec['batches_per_sampler']} batches of {rec['batch_size']} per sampler (proximity = "
      "the runs' M 1000, K 500, alpha 0.7), seed "
      f"{rec['seed']}. Command `{rec['command'].strip()}`, {rec['machine']}, "
      f"{rec['wall_time_s']:.0f} s.\n")
    w("| t | tau+ | beta | sampler | rows on the floor | median tau+ bound | positive cos | "
      "negative cos (max) |")
    w(md_rule(8))
    for (t, tp, beta, smp), rs in sorted(groups.items(), key=lambda kv: (kv[0][:3], kv[0][3])):
        w(md_row([f"{t:g}", f"{tp:g}", f"{beta:g}", smp,
                  f"{100 * statistics.mean(r['floor_fraction'] for r in rs):.0f}%",
                  f"{statistics.median(r['tau_plus_max'] for r in rs):.1e}",
                  f"{statistics.mean(r['pos_cos'] for r in rs):.3f}",
                  f"{statistics.mean(r['neg_cos'] for r in rs):.3f} "
                  f"({max(r['neg_cos_max'] for r in rs):.3f})"]))
    at = [r for r in rec["rows"] if r["temperature"] == 0.05]
    hot = [r for r in rec["rows"] if r["temperature"] == 0.5]
    low = 100 * min(r["floor_fraction"] for r in at)
    w(f"\nAt SimCSE's t = 0.05, {low:.0f}%{' or more' if low < 99.5 else ''} of the "
      "rows of every batch are on the floor for each tau+ and beta measured, uniform or proximity "
      "batches alike: the positives (dropout views of one sentence) are so much closer than any "
      "negative that `tau+ N pos` exceeds the whole negative sum, so the loss is constant (~0) "
      "and trains nothing. The bound on tau+ that would free a row is far below any useful "
      "class prior, where DCL is InfoNCE in effect. Hence the DCL / HCL rows are also run at "
      "t = 0.5 (the DCL and HCL papers' temperature), where "
      f"{100 * max((r['floor_fraction'] for r in hot), default=math.nan):.0f}% of rows at most "
      "are on the floor; the "
      "BatchSampler paper (Appendix B.6) gives the same reason for DCL / HCL falling below "
      "SimCSE with BERT, where the gap is smaller and training still happens.\n")
    return L


def plans_section(g: TextRuns) -> list[str]:
    """The plan-only runs (``hardbatch bench simcse --plan-only``) of the main tag's size."""
    if not g.plans:
        return []
    L: list[str] = []
    w = L.append
    w("### Batch plans without training (all samplers, more thresholds)\n")
    w("The graphs / orders are built once from the starting model, so a run's batches depend "
      "only on sampler, seed and starting embeddings: `hardbatch bench simcse --plan-only` "
      "draws the same number of batches and scores them (the trained runs' hardness above "
      "agrees to 3 decimals: a run's starting embeddings come from the precomputed 100k-"
      "sentence file, a fresh encoding or its cache - `config.start_embeddings` - which differ "
      "by float rounding, enough to change a walk's step now and then). `pairs > c` = share "
      "of in-batch pairs with starting-model cosine above c. "
      "Rows with options other than the grid's are ablations (plan only, not trained).\n")
    w("| sampler | options | seeds | hardness | mean negative cos | pairs > 0.5 | "
      "pairs > 0.7 | pairs > 0.8 | pairs > 0.9 |")
    w(md_rule(9))
    pg: dict = defaultdict(list)
    for r in g.plans:
        if r_base(r["tag"]) != r_base(g.main_tag or r["tag"]):
            continue
        opts = ", ".join(f"{k} {v}" for k, v in r["sampler_options"].items()) or "—"
        pg[(r["sampler"], opts, r["tag"])].append(r["plan_diagnostics"])
    key_order = sorted(pg, key=lambda k: (SAMPLERS.index(k[0]), k[2] != g.main_tag, k[1]))
    for sampler_, opts, tag_ in key_order:
        ds = pg[(sampler_, opts, tag_)]
        w(md_row([sampler_, opts, len(ds), fmt([d["mean_hardness"] for d in ds], 3),
                  fmt([d["mean_mean_negative_similarity"] for d in ds], 3),
                  *(fmt([d["mean_pairs_above"][t] for d in ds], 5)
                    for t in ("0.5", "0.7", "0.8", "0.9"))]))
    top = max(d["mean_pairs_above"]["0.9"] for ds in pg.values() for d in ds)
    w(f"\nAcross the plans above at most {100 * top:.4f}% of in-batch pairs have a starting-model "
      "cosine above 0.9: by this proxy false negatives are rare for every sampler at this "
      "data size.\n")
    w("Why the proximity batches are only slightly harder than uniform ones: each sentence "
      "keeps its K most similar of M random candidates, so with K/M = 0.5 (the paper's 500 of "
      "1000) its neighbours are merely the more similar half of a random sample, and a walk "
      "over them stays close to a random batch; the rows with a smaller K/M show how the "
      "hardness grows when the graph is more selective.\n")
    return L
