"""The plan of the batch-size sweep (issue 21) shared by its page: batch sizes, arms, the
paired comparisons, the seeds, the protocol text written down before the results, and the
budget arithmetic (measured cost per run, projected sweep total)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from .common import finite, md_row, md_rule

__all__ = ["ARMS", "ARM_NAME", "BATCHES", "COMPARISONS", "EQUAL_STEPS_BATCH", "GUIDED",
           "GUIDED_BATCHES", "MORE_SEEDS", "MORE_SEEDS_ARMS", "PLANNED_SEEDS", "PROTOCOL",
           "budget_lines", "mean_text", "planned_seeds", "projected_cpu_s", "wall_seconds"]

BATCHES = (32, 64, 128, 256)
ARMS = (("uniform", "infonce"), ("proximity", "infonce"), ("uniform", "sscl"),
        ("proximity", "sscl"))
ARM_NAME = {("uniform", "infonce"): "uniform + InfoNCE", ("proximity", "infonce"):
            "proximity + InfoNCE", ("uniform", "sscl"): "uniform + SSCL",
            ("proximity", "sscl"): "proximity + SSCL",
            ("proximity+guided", "infonce"): "proximity + InfoNCE + guided mask"}
#: the guided arm (proximity + InfoNCE, false negatives masked by the reference encoder as
#: guide) and the batch sizes it runs at
GUIDED = ("proximity+guided", "infonce")
GUIDED_BATCHES = (32, 64)
#: (arm, baseline): the paired comparisons at one batch size
COMPARISONS = ((("proximity", "infonce"), ("uniform", "infonce")),
               (("uniform", "sscl"), ("uniform", "infonce")),
               (("proximity", "sscl"), ("uniform", "infonce")),
               (("proximity", "sscl"), ("uniform", "sscl")))
PLANNED_SEEDS = (0, 1, 2)
EQUAL_STEPS_BATCH = 64
#: seeds 3 and 4 for the primary comparison at every B (main budget)
MORE_SEEDS = (3, 4)
MORE_SEEDS_ARMS = (("uniform", "infonce"), ("proximity", "infonce"))


def planned_seeds(arm: tuple[str, str]) -> tuple[int, ...]:
    """The seeds planned for ``arm`` (sampler, loss) at the main budget."""
    return PLANNED_SEEDS + MORE_SEEDS if tuple(arm) in MORE_SEEDS_ARMS else PLANNED_SEEDS


PROTOCOL = """### Protocol (written down before the sweep's results)

- SimCLR on CIFAR-10, the recipe's compact ConvNet (4 conv stages 32/64/128/256, 256-d
  features, projection head to 128 d), temperature 0.5, Adam with weight decay 1e-6, one torch
  thread per run. Training subset: a fixed class-balanced 8,192 of the 50,000 training images
  (`--train-size 8192`, seed 0, the same for every run): 8,192 is a multiple of every B, so each
  B sees every image the same number of times. Evaluation: weighted kNN (k 200, t 0.1) on the
  frozen 256-d features of the full 10,000-image test set (train features: the subset) before
  training, half-way and at the end, and a linear probe (L-BFGS) at the end.
- Image budget: the same number of training images seen at every B (`--images`, 10 epochs of the
  subset = 81,920 images), so steps = images / B (2,560 at B = 32 ... 320 at B = 256).
- Learning rate rule (chosen before any sweep result): Adam's square-root scaling,
  lr(B) = 1e-3 * sqrt(B / 256) (3.5e-4 at B = 32, 5e-4 at 64, 7.1e-4 at 128, 1e-3 at 256;
  1e-3 at B = 256 is the earlier record's setting). Malladi et al. (NeurIPS 2022) show that this
  rule keeps Adam's update noise comparable across B, so that at a fixed image budget runs of
  different B follow about the same optimisation path and differ mostly in their in-batch
  negatives, which is what the sweep asks about. (A fixed lr would give small batches both more
  and noisier steps.)
- Arms: uniform + InfoNCE (the baseline), proximity graph (RWR, alpha 0.2 -> 0.05 decayed over
  the run's steps, M 500 candidates, K 100 neighbours, graph rebuilt once per epoch of the subset,
  i.e. every 8,192 / B steps) + InfoNCE, uniform + SSCL, proximity + SSCL (SSCL: beta 1, tau+ 0.1,
  32 hardest, 8 synthetic).
- Guided arm (added after the first 8 main runs, before any guided run): proximity + InfoNCE
  with guided false-negative masks (`--guide REF --guide-margin m`: j is not a negative of
  anchor i when cos(g_i, g_j) > 1 - m in the reference encoder's embedding below), at
  B = 64 and 32 only (where batch composition should matter most; it costs 6 runs for 3 seeds).
  The margin was fixed by a rule written down before measuring it: the largest margin of
  {0.01, 0.02, 0.05, 0.1, 0.2, 0.3} whose masked pairs, in one epoch of proximity batches
  (B = 64) on the reference embedding, are same-class at least half the time
  (`python scripts/vision_guide_margin.py`, results/vision/sweep/guide_margin.json): m = 0.05.
- Pairing: seed k gives, in every arm and at every B, the same initial weights
  (`seed_everything(k)` before the encoder is built), the same training subset and test set,
  and the same augmentation random numbers (the trainer's generator, seeded with k, draws the
  same numbers per image, so at one image budget it ends in the same state in every arm and at
  every B; at the same B the draws also fall on the same step positions); samplers and SSCL
  draw from their own generators. Each run stores fingerprints of these (`pairing` in its
  JSON); the table "Pairing check" below compares them.
- Reference encoder for the diagnostics: the projections of the 8,192 training images by one
  uniform + InfoNCE run at B = 256 with seed 100 (no sweep seed; the main budget), the same file
  for every arm, seed and B (`--reference`). A trained encoder measures hardness in a semantic
  embedding (which images look alike to a trained SimCLR model); each run's own embedding
  differs by arm, and an untrained one measures mostly colour. The false-negative rate (share of
  same-class pairs in a batch) is read from the labels.
- Seeds 0, 1, 2 for every cell; seeds 3 and 4 for the primary comparison (proximity + InfoNCE
  vs uniform + InfoNCE) at every B, fixed before any of its intervals was seen (adding seeds
  only where an interval straddles 0 would make the stopping depend on the data).
  Equal-steps view: B = 64 runs at B = 256's step count (a quarter of the images) against the
  B = 256 runs of the same seed.
"""


def wall_seconds(r: dict) -> float:
    """Seconds a run took; a resumed run's ``wall_time_s`` covers only its last session."""
    if r.get("resumed") and r.get("train_time_s") is not None:
        return r["train_time_s"] + r.get("eval_time_s", 0.0)
    return r["wall_time_s"]


def mean_text(values, fmt: str = "{:.3f}") -> str:
    """The mean of the finite ``values`` formatted by ``fmt``; ``—`` for none."""
    v = finite(values)
    return fmt.format(statistics.fmean(v)) if v else "—"


def projected_cpu_s(r: dict, images: int, evals: int) -> float:
    """CPU seconds of a run of ``images`` training images and ``evals`` evaluations, from a
    shortened timing run ``r``: its CPU / wall ratio splits its training and evaluation wall
    times into CPU time (the machine was shared, so wall times are inflated)."""
    share = r["cpu_time_s"] / r["wall_time_s"]
    per_eval = r["eval_time_s"] / max(1, len(r["evals"]))
    return share * (r["train_time_s"] * images / r["images_seen"] + per_eval * evals)


def budget_lines(runs: list[dict], main: dict, equal: dict, timing: list[dict],
                 budget: int | None) -> list[str]:
    """The budget arithmetic: cost per B from the shortened timing runs (projected to the main
    budget) and the wall time of finished sweep runs, with the projected sweep total."""
    out = ["### Budget (measured cost per run, projected sweep total)", ""]
    images = budget or 81920
    if timing:
        out += ["Shortened timing runs (`results/vision/sweep/timing/`: 4,096 images, an "
                "evaluation before and after, one thread, B x {uniform + InfoNCE, proximity + "
                "SSCL}; each JSON holds the command that wrote it to another folder before it was "
                "copied here). The machine's two cores were shared with 4-7 other processes "
                "while they ran, so wall times are 1.5-3x the CPU time; the projection uses CPU "
                f"time: a full run = {images:,} training images + 3 evaluations (before, half-way, "
                "end; the last with the linear probe).", "",
                md_row(["B", "arm", "steps", "wall s / 1k train images", "wall s / evaluation",
                        "CPU / wall", "projected CPU min per full run"]), md_rule(7)]
        per_b = defaultdict(list)
        for r in sorted(timing, key=lambda r: (r["config"]["batch_size"], r["sampler"])):
            b = r["config"]["batch_size"]
            cpu = projected_cpu_s(r, images, 3)
            per_b[b].append(r)
            out.append(md_row([b, ARM_NAME.get((r["sampler"], r["loss"]), r["sampler"]),
                               r["steps"], f"{1000 * r['train_time_s'] / r['images_seen']:.1f}",
                               f"{r['eval_time_s'] / max(1, len(r['evals'])):.0f}",
                               f"{r['cpu_time_s'] / r['wall_time_s']:.2f}", f"{cpu / 60:.1f}"]))
        full_cpu = {b: statistics.fmean(projected_cpu_s(r, images, 3) for r in rs)
                    for b, rs in per_b.items()}  # projected CPU seconds of a full run, per B
        main_cpu = sum(full_cpu.values()) * len(ARMS) * len(PLANNED_SEEDS)
        eq = per_b.get(EQUAL_STEPS_BATCH) or []
        eq_cpu = (statistics.fmean(projected_cpu_s(r, images // 4, 2) for r in eq)
                  * len(ARMS) * len(PLANNED_SEEDS)) if eq else 0.0
        ref_cpu = full_cpu.get(256, 0.0)
        total = main_cpu + eq_cpu + ref_cpu
        ratio = statistics.fmean(r["cpu_time_s"] / r["wall_time_s"] for r in timing)
        out += ["", f"Sweep arithmetic (B with timing runs: {sorted(per_b)}): "
                    f"{len(per_b)} B x {len(ARMS)} arms x {len(PLANNED_SEEDS)} seeds = "
                    f"{main_cpu / 3600:.1f} CPU-hours, + {len(ARMS) * len(PLANNED_SEEDS)} "
                    f"equal-steps runs (B = 64, {images // 4:,} images, 2 evaluations) = "
                    f"{eq_cpu / 3600:.1f}, + the reference run {ref_cpu / 3600:.1f}: "
                    f"{total / 3600:.1f} CPU-hours in all: {total / 7200:.1f} hours with two "
                    "workers on two free cores, or "
                    f"{total / 7200 / ratio:.1f} hours at the CPU / wall ratio measured here "
                    f"({ratio:.2f}, a machine shared as during these timings); the target is "
                    "about 8 hours of two-worker time. The margin is for contention and for "
                    "seeds 3 and 4 where an interval straddles 0 (each seed adds a third of the "
                    f"main and equal-steps cost). Hence {timing[0]['config']['train_size']:,} "
                    f"training images and {images:,} images seen per run.", ""]
        extra = (sum(full_cpu.values()) * len(MORE_SEEDS_ARMS) * len(MORE_SEEDS)
                 + sum(full_cpu.get(b, 0.0) for b in GUIDED_BATCHES) * len(PLANNED_SEEDS))
        out += [f"Added later, before their runs: the guided arm (B = "
                f"{', '.join(map(str, GUIDED_BATCHES))}, {len(PLANNED_SEEDS)} seeds) and seeds "
                f"{', '.join(map(str, MORE_SEEDS))} of the primary comparison at every B: "
                f"{extra / 3600:.1f} more CPU-hours at the same rates, "
                f"{(total + extra) / 3600:.1f} CPU-hours for the whole sweep "
                f"({(total + extra) / 7200:.1f} hours with two workers on two free cores).", ""]
    done = [r for cell in list(main.values()) + list(equal.values()) for r in cell.values()]
    if done:
        out += ["Finished sweep runs: wall and CPU minutes per run (means):", "",
                md_row(["B", "images", "runs", "wall / run", "CPU / run"]), md_rule(5)]
        groups = defaultdict(list)
        for r in done:
            groups[(r["config"]["batch_size"], r["config"]["images"])].append(r)
        for (b, imgs), rs in sorted(groups.items()):
            out.append(md_row([b, imgs, len(rs),
                               f"{statistics.fmean(wall_seconds(r) for r in rs) / 60:.1f} min",
                               mean_text([r.get("cpu_time_s", math.nan) / 60 for r in rs],
                                     "{:.1f} min")]))
        out.append("")
    return out
