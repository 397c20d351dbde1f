"""Plain float64 references of the losses and the helpers the loss tests share.

Importable as ``loss_reference`` from any test module (``tests/`` is on pytest's ``pythonpath``):
explicit exp / sum / log with Python loops, as in the papers.
"""

from __future__ import annotations

import math

import torch

from hardbatch.losses import (
    debiased_info_nce,
    hard_negative_info_nce,
    info_nce,
    sscl_loss,
)

FORMS = ["simclr", "simcse"]
KINDS = ["infonce", "debiased", "hard_negative", "sscl"]


def unit(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their norm; an all-zero row stays zero with a zero gradient (hardbatch's
    convention; F.normalize's gradient there is 1 / eps = 1e12)."""
    nonzero = (x != 0).any(dim=-1, keepdim=True).to(x.dtype)
    return x * nonzero / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def reference(
    anchor,
    positive,
    *,
    kind,
    t=0.5,
    form="simclr",
    tau=0.0,
    beta=0.0,
    labels=None,
    bank=None,
    normalize=True,
    hardest=0,
    synthetic=0,
    mix=True,
    seed=0,
    detach_weights=False,
    detach_synthetic=False,
    false_negatives=None,
):
    """Per-row losses in float64 with explicit exp / sum / log and Python loops (as in the papers).

    SSCL: the row's negatives sorted by decreasing similarity, ``count = min(hardest, N)``;
    synthetic ``p`` of row ``r`` uses ``(u1, u2, a) = torch.rand(R, k, 3, generator=seed)[r, p]``
    (float32) and mixes ``hard[floor(u1 count)]`` and ``hard[floor(u2 count)]`` into an explicit
    vector ``h``, mixed then normalised; ``detach_synthetic`` detaches ``h`` (the released code).
    ``false_negatives`` ``[B, B]``: item ``j`` (both its views) is no negative of item ``i``'s rows
    where it is True (the diagonal is ignored).
    """
    a, p = anchor.double(), positive.double()
    fn = None if false_negatives is None else false_negatives.tolist()

    def masked(i, j):  # item j is excluded from item i's negatives
        return fn is not None and i != j and fn[i][j]

    bank = None if bank is None else bank.double()
    if normalize:
        a, p = unit(a), unit(p)
        bank = None if bank is None else unit(bank)
    b = a.shape[0]
    extra = [] if bank is None else list(bank)
    rows = []
    if form == "simclr":
        views = torch.cat([a, p])
        lab = None if labels is None else torch.cat([labels, labels]).tolist()
        for i in range(2 * b):
            j_pos = (i + b) % (2 * b)
            negs = [
                views[j]
                for j in range(2 * b)
                if j not in (i, j_pos) and (lab is None or lab[j] != lab[i])
                and not masked(i % b, j % b)
            ]
            rows.append((views[i], views[j_pos], negs + extra))
    else:
        lab = None if labels is None else labels.tolist()
        for i in range(b):
            negs = [p[j] for j in range(b)
                    if j != i and (lab is None or lab[j] != lab[i]) and not masked(i, j)]
            rows.append((a[i], p[i], negs + extra))

    draws = None
    if kind == "sscl" and synthetic > 0:
        gen = torch.Generator().manual_seed(seed)
        draws = torch.rand(len(rows), synthetic, 3, generator=gen)  # float32, as in hardbatch

    losses = []
    for r, (q, pos_vec, negs) in enumerate(rows):
        if draws is not None and negs:
            sims = [float((q @ n).detach()) for n in negs]
            order = sorted(range(len(negs)), key=lambda j: -sims[j])
            count = min(hardest, len(negs))
            hard = order[:count]
            synth = []
            for k in range(synthetic):
                u1, u2, alpha = draws[r, k]
                vi = negs[hard[min(int(u1 * count), count - 1)]]
                vj = negs[hard[min(int(u2 * count), count - 1)]]
                if mix:
                    alpha = alpha.double()
                    h = alpha * vi + (1 - alpha) * vj
                    h = unit(h) if normalize else h
                else:
                    h = vi
                synth.append(h.detach() if detach_synthetic else h)
            negs = negs + synth
        n = len(negs)
        if n == 0:
            losses.append(torch.zeros((), dtype=torch.float64))
            continue
        pos = torch.exp(q @ pos_vec / t)
        neg = torch.stack([torch.exp(q @ v / t) for v in negs])
        if kind == "infonce":
            ng = neg.sum()
        else:
            imp = neg**beta  # exp(beta * sim / t), as in the HCL code
            if detach_weights:
                imp = imp.detach()
            reweight = (imp * neg).sum() / imp.mean()
            ng = torch.maximum(
                (reweight - tau * n * pos) / (1 - tau),
                torch.tensor(n * math.exp(-1 / t), dtype=torch.float64),
            )
        losses.append(-torch.log(pos / (pos + ng)))
    return torch.stack(losses)


def call(kind, anchor, positive, **kw):
    """The hardbatch functional form for ``kind``, ignoring options that do not apply to it."""
    if kind == "infonce":
        kw = {
            k: v
            for k, v in kw.items()
            if k not in ("tau_plus", "beta", "hardest", "synthetic", "mix", "seed")
        }
        return info_nce(anchor, positive, **kw)
    if kind == "debiased":
        kw = {
            k: v for k, v in kw.items() if k not in ("beta", "hardest", "synthetic", "mix", "seed")
        }
        return debiased_info_nce(anchor, positive, **kw)
    if kind == "hard_negative":
        kw = {k: v for k, v in kw.items() if k not in ("hardest", "synthetic", "mix", "seed")}
        return hard_negative_info_nce(anchor, positive, **kw)
    seed = kw.pop("seed", 0)
    return sscl_loss(anchor, positive, generator=torch.Generator().manual_seed(seed), **kw)


def ref_kwargs(kind, **kw):
    """Map hardbatch keyword arguments to the reference's, with the classes' semantics."""
    out = {
        "kind": kind,
        "t": kw.get("temperature", 0.5),
        "form": kw.get("form", "simclr"),
        "labels": kw.get("labels"),
        "bank": kw.get("negatives"),
        "normalize": kw.get("normalize", True),
        "seed": kw.get("seed", 0),
        "false_negatives": kw.get("false_negatives"),
    }
    if kind != "infonce":
        out["tau"] = kw.get("tau_plus", 0.1)
    if kind in ("hard_negative", "sscl"):
        out["beta"] = kw.get("beta", 1.0)
    if kind == "sscl":
        out.update(
            hardest=kw.get("hardest", 32), synthetic=kw.get("synthetic", 8), mix=kw.get("mix", True)
        )
    return out


def pair(b=6, d=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=gen, dtype=dtype), torch.randn(
        b, d, generator=gen, dtype=dtype
    )


def graded_pair(b=16, d=8, seed=3):
    """Positives from very close to unrelated, so some rows sit on the DCL floor and some not."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(b, d, generator=gen, dtype=torch.float64)
    noise = torch.randn(b, d, generator=gen, dtype=torch.float64)
    return a, a + torch.linspace(0.01, 3.0, b, dtype=torch.float64)[:, None] * noise
