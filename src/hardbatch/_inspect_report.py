"""The text of ``hardbatch inspect``'s report: table, legend, notes (:mod:`hardbatch.inspect_cli`).

:data:`LEGEND` says what each column means; :func:`reading_notes` says how to read one run's
numbers (how many epochs the batches span, the chance false-negative rate, why coverage of walk
samplers stays below 1, why a loss gap is near 0); :func:`fmt` prints a loss gap below
:data:`TINY` to 3 significant digits instead of "0.000".
"""

from __future__ import annotations

import math

import numpy as np

#: What each column of the table means (printed under it, and ``legend`` in inspect.json).
LEGEND = {
    "batches": "batches drawn from the sampler (default: one epoch, ceil(N / B))",
    "B": "batch size",
    "hardness": "mean over anchors of the cosine to the most similar other item of its batch "
                "(its hardest negative); higher = harder negatives, not better by itself",
    "mean neg. sim": "mean cosine of all in-batch pairs (every other item of a batch is a "
                     "negative); higher = harder; uniform batches give the mean over all pairs",
    "FN rate": "false-negative rate: share of in-batch pairs with the same label (used as "
               "negatives, though of one class); lower is better; uniform batches give the "
               "chance rate above",
    "duplicate rate": "share of batch entries repeating an item already in the same batch "
                      "(0 for every built-in sampler)",
    "coverage": "share of the N items drawn at least once by these batches; 1.000 = every "
                "item; the walk samplers (knn, proximity) reach about two thirds in an epoch",
    "sampler time (s)": "wall time to draw all the batches, graph / order construction "
                        "included (after a warm-up); varies with machine load",
    "loss gap": "mean over the drawn items of the global NT-Xent loss (all N items as "
                "negatives) minus their in-batch loss; smaller = batches closer to the global "
                "objective",
    "ref. hardness": "hardness measured in the --reference embedding",
    "ref. mean neg. sim": "mean neg. sim measured in the --reference embedding",
    "ref. near-dup rate": "share of in-batch pairs whose --reference cosine exceeds 0.9 "
                          "(near-copies: a false-negative estimate without labels)",
    "ref. loss gap": "loss gap measured in the --reference embedding",
}
#: Below this, a loss gap prints in scientific notation (it would read 0.000).
TINY = 5e-4


def fmt(value, digits: int | None = 3) -> str:
    """``digits`` decimals; None: 3 decimals, or 3 significant digits below :data:`TINY`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, int):
        return str(value)
    if digits is None:
        if 0 < abs(value) < TINY:
            return f"{value:.2e}"
        digits = 3
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.000"


def markdown_table(rows: list[dict], has_labels: bool, has_gap: bool,
                   has_reference: bool = False) -> str:
    """One row per sampler; the columns present depend on the inputs (labels, gap, reference)."""
    cols = [("batches", "batches", 0), ("B", "batch_size", 0), ("hardness", "hardness", 3),
            ("mean neg. sim", "mean_negative_similarity", 3)]
    if has_labels:
        cols.append(("FN rate", "false_negative_rate", 3))
    cols += [("duplicate rate", "duplicate_rate", 3), ("coverage", "coverage", 3),
             ("sampler time (s)", "sampler_seconds", 3)]
    if has_gap:
        cols.append(("loss gap", "loss_gap", None))
    if has_reference:
        cols += [("ref. hardness", "reference_hardness", 3),
                 ("ref. mean neg. sim", "reference_mean_negative_similarity", 3),
                 ("ref. near-dup rate", "reference_near_duplicate_rate", 3)]
        if has_gap:
            cols.append(("ref. loss gap", "reference_loss_gap", None))
    lines = ["| sampler | " + " | ".join(c[0] for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for row in rows:
        cells = [row["label"]] + [fmt(row.get(key), digits) for _, key, digits in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend_of(table: str) -> dict[str, str]:
    """:data:`LEGEND` for the columns of ``table`` (in its order)."""
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    return {name: LEGEND[name] for name in header if name in LEGEND}


def loss_gap_notes(rows: list[dict], temperature: float, prefix: str = "") -> list[str]:
    """Why the loss gaps are near 0, when they are (a positive logit that dwarfs the rest)."""
    key = f"{prefix}loss_gap"
    gaps = [r[key] for r in rows if r.get(key) is not None]
    if not gaps or max(abs(g) for g in gaps) >= TINY:
        return []
    where = "in the --reference embedding " if prefix else ""
    return [f"every loss gap {where}is below {TINY:g} (global loss "
            f"{fmt(rows[0][f'{prefix}global_loss'], None)}): without a second view each item "
            f"is its own positive (cosine 1), so at t = {temperature:g} its logit 1/t = "
            f"{1 / temperature:.3g} exceeds a negative's by (1 - cos) / t, and each negative adds "
            f"only about exp(-(1 - cos) / t) to the loss. The samplers still compare (the gaps are "
            f"printed to 3 significant digits); --temperature 0.2 or more gives gaps of order 1"]


def reading_notes(args, n: int, batch_size: int, batches: int, rows: list[dict],
                  chance: float | None) -> list[str]:
    """How to read this run's numbers (printed under the legend, ``notes`` in inspect.json)."""
    epoch = math.ceil(n / batch_size)
    notes = []
    if batches == epoch:
        notes.append(f"{batches} batches of B = {batch_size} = one epoch of N = {n} items: "
                     "coverage is the share of the items one epoch reaches")
    elif batches < epoch:
        notes.append(f"{batches} batches of B = {batch_size} are {batches / epoch:.2f} of an "
                     f"epoch ({epoch} batches): coverage is at most {batches * batch_size / n:.3f}"
                     " for every sampler")
    else:
        notes.append(f"{batches} batches of B = {batch_size} span {batches / epoch:.1f} epochs "
                     f"({epoch} batches each): coverage counts the items drawn in any of them; "
                     f"--batches {epoch} measures one epoch")
    if chance is not None:
        notes.append(f"FN rate: uniform batches give the chance rate {chance:.3f} in "
                     "expectation; a sampler above it puts same-class pairs together")
    walks = [r for r in rows if r["sampler"] in ("knn", "proximity")]
    if walks and batches >= epoch:
        notes.append("walk samplers (knn, proximity) build batches around start items not yet "
                     "seen and their batches overlap: their coverage of an epoch stays below 1 "
                     "(uniform, gcbs, cluster and community partition the items)")
    if args.loss_gap:
        notes += loss_gap_notes(rows, args.temperature)
        if args.reference is not None:
            notes += loss_gap_notes(rows, args.temperature, "reference_")
    return notes


def jsonable(value):
    """``value`` with NaN / inf as None and NumPy scalars as Python numbers (for json.dump)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return jsonable(float(value))
    return value


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------
