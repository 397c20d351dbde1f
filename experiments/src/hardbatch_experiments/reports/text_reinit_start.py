"""The starting state and pilots of the re-initialised SimCSE section (docs/results/text.md,
issue 19): step-0 loss and STS by re-initialised layers L, in-batch hardness vs K, step cost by
L, the reasons for the pre-registered choices and the grid's cost estimate, read from
``results/text/start`` and ``results/text/pilot``."""

from __future__ import annotations

import statistics
from pathlib import Path

from .common import md_row, md_rule, read_json

__all__ = ["reasons", "records", "reinit_runs", "start_tables"]


def reinit_runs(folder: Path) -> list[dict]:
    """The ``simcse-reinit`` run records under ``folder``, each with ``_file`` (its name)."""
    out = []
    if folder.is_dir():
        for p, rec in read_json(folder):
            if isinstance(rec, dict) and rec.get("benchmark") == "simcse-reinit":
                rec["_file"] = p.name
                out.append(rec)
    return out


def start_tables(start: Path) -> list[str]:
    L: list[str] = []
    w = L.append
    rows = sorted((rec for _, rec in read_json(start) if isinstance(rec, dict)
                   and rec.get("benchmark") == "simcse-start"),
                  key=lambda r: (r.get("input_dropout", 0.0), r["reinit_layers"], r["seed"])
                  ) if start.is_dir() else []
    w("### Starting model: SimCSE loss at step 0 and STS, by L\n")
    if not rows:
        w("pending (`python -m hardbatch_experiments.recipes.simcse.probe start`)\n")
    else:
        r0 = rows[0]
        w(f"Loss = unsupervised SimCSE loss (dropout views, t = {r0['temperature']}, "
          f"B = {r0['batch_size']}) averaged over the same {r0['probe_batches']} batches "
          f"({r0['probe_batches_rule']}, over the first {r0['num_sentences']:,} sentences); "
          f"its ceiling for a model that cannot tell sentences apart is log B = "
          f"{r0['log_batch_size']:.2f}. L = 0 is the unmodified fine-tuned model.\n")
        w("| L | seed | input dropout | step-0 loss | STS avg (6 tasks) | STS-B |")
        w(md_rule(6))
        for r in rows:
            sts = r.get("sts") or {}
            w(md_row([r["reinit_layers"], r["seed"], f"{r.get('input_dropout', 0.0):g}",
                      f"{r['step0_loss_mean']:.4g}",
                      f"{sts['avg']:.2f}" if sts else "—",
                      f"{sts['tasks']['STSBenchmark']:.2f}" if sts else "—"]))
        cmds = list(dict.fromkeys(r["command"] for r in rows))
        w("\nCommands: " + "; ".join(f"`{x}`" for x in cmds) + ".\n")
    L += _cost_table(start / "cost.json")
    hard = sorted((rec for _, rec in read_json(start) if isinstance(rec, dict)
                   and rec.get("benchmark") == "simcse-hardness"),
                  key=lambda r: r["reinit_layers"]) if start.is_dir() else []
    w("### Batch hardness vs K (proximity graph, M = 1000, alpha 0.7)\n")
    if not hard:
        w("pending (`python -m hardbatch_experiments.recipes.simcse.probe hardness`)\n")
    for h in hard:
        w(f"Mean top-1 negative cosine over the first {h['rows'][0]['batches']} batches of "
          f"B = {h['batch_size']}, N = {h['num_sentences']:,} sentences; graph built from and "
          f"hardness measured in one fixed embedding: the {h['embedding']}; second column: "
          "the same batches in the full fine-tuned MiniLM's embedding.\n")
        w("| sampler | K | hardness (starting model) | hardness (full MiniLM) | in-batch pairs "
          "with full-MiniLM cosine > 0.5 / 0.7 / 0.9 |")
        w(md_rule(5))
        for r in h["rows"]:
            ref, above = r.get("hardness_reference"), r.get("reference_pairs_above")
            w(md_row([r["sampler"], r["neighbors"] or "—", f"{r['hardness']:.3f}",
                      f"{ref:.3f}" if ref is not None else "—",
                      " / ".join(f"{above[t]:.5f}" for t in ("0.5", "0.7", "0.9"))
                      if above else "—"]))
        w(f"\nCommand: `{h['command']}`.\n")
    return L


def records(folder: Path, kind: str) -> list[dict]:
    if not folder.is_dir():
        return []
    return [rec for _, rec in read_json(folder)
            if isinstance(rec, dict) and rec.get("benchmark") == kind]


def reasons(start: Path, c: dict) -> list[str]:
    """Why these choices, from the measurements above (the numbers are read, not typed)."""
    L: list[str] = []
    w = L.append
    rows = {r["reinit_layers"]: r for r in records(start, "simcse-start")
            if r["seed"] == 0 and not r.get("input_dropout")}
    cost = {r["reinit_layers"]: r for rec in records(start, "simcse-cost") for r in rec["rows"]}
    layers = c["reinit_layers"]
    if layers in rows and 0 in rows and rows[layers].get("sts"):
        r, r0 = rows[layers], rows[0]
        others = ", ".join(f"L = {k}: {v['step0_loss_mean']:.3f}" for k, v in sorted(rows.items())
                           if k not in (0, layers))
        w(f"- **L = {layers}**: the largest step-0 loss of L = 1..4 ({r['step0_loss_mean']:.3f}; "
          f"{others}; the fine-tuned model: {r0['step0_loss_mean']:.1e}), the cheapest step"
          + (f" ({cost[layers]['step_cpu_s_median']:.2f} s CPU vs "
             f"{cost[6]['step_cpu_s_median']:.2f} s for the whole transformer)"
             if layers in cost and 6 in cost else "")
          + f", and a starting STS average {r0['sts']['avg'] - r['sts']['avg']:.1f} points below "
          "the fine-tuned model's, so there is room to move. Deeper re-initialisation does not "
          "raise the loss (presumably because layers drawn with std 0.02 stay close to the "
          "identity on the residual stream; not tested) and costs more per step. The pilot run "
          "(below) checks that a uniform run moves STS.")
    hard = {r["reinit_layers"]: r for r in records(start, "simcse-hardness")}.get(layers)
    if hard:
        uni = next(r for r in hard["rows"] if r["sampler"] == "uniform")
        k = next((r for r in hard["rows"] if r["neighbors"] == c["neighbors"]), None)
        if k:
            fn = max(r["reference_pairs_above"]["0.7"] for r in hard["rows"]
                     if r.get("reference_pairs_above"))
            w(f"- **K = {c['neighbors']}**: the hardest batches of K in {{10, 20, 50, 100}} "
              f"(hardness {k['hardness']:.3f} vs uniform {uni['hardness']:.3f} in the starting "
              f"model; {k['hardness_reference']:.3f} vs {uni['hardness_reference']:.3f} in the "
              "full MiniLM; the saturated record's K = 500 was barely harder than uniform), "
              "and the "
              f"false-negative proxy stays negligible for every K (at most {fn:.5f} of in-batch "
              "pairs have full-MiniLM cosine > 0.7), so nothing argues for a larger K.")
    if layers in cost:
        q = cost[layers]
        run_cpu = c["steps"] * q["step_cpu_s_median"]
        refresh = c["num_sentences"] / 1000 * q["encode_cpu_s_per_1k"]
        w(f"- **{c['steps']} steps, N = {c['num_sentences']:,}, refresh every "
          f"{c['refresh_every']}**: a step costs {q['step_cpu_s_median']:.2f} s CPU, so "
          f"{c['steps']} steps are about {run_cpu / 60:.0f} CPU-minutes; a re-encoding of the "
          f"{c['num_sentences']:,} sentences {refresh:.0f} s CPU "
          f"({c['steps'] // c['refresh_every']} per graph run)" + _grid_estimate(start, c, q)
          + " The cache of 20,000 sentences is "
          f"{q['cache_mb_per_1k'] * c['num_sentences'] / 1000:.0f} MB in float16 per worker "
          "(100,000 would be 2.3 GB and a refresh 5x dearer); 1500 x 64 = 4.8 epochs of it.")
    w(f"- **lr {c['lr']:g}**: randomly initialised layers need a larger rate than SimCSE's 3e-5 "
      "for pre-trained weights; not tuned (one pilot).")
    w(f"- **Guide = the full fine-tuned MiniLM, margin {c['guide_margin']}**: an independent, "
      "stronger model than the one being trained (GISTEmbed's premise); the starting model "
      "finds every pair similar (uniform hardness above) and cannot tell paraphrases from "
      "negatives. Both views of a sentence share one guide embedding, so `guided_mask(g, g, "
      f"margin)` masks candidate j when cos(g_i, g_j) > 1 - margin = {1 - c['guide_margin']:g}; "
      "the hardness table shows such pairs are rare, so this arm comes last.\n")
    return L


def _grid_estimate(start: Path, c: dict, q: dict) -> str:
    """The grid's CPU estimate from the step / refresh costs and the pilot's measured eval."""
    pilots = reinit_runs(start.parent / "pilot")
    if not pilots:
        return "."
    ev = statistics.mean(r["eval_cpu_s"] + r["cache_time_s"] for r in pilots if "eval_cpu_s" in r)
    refresh = c["num_sentences"] / 1000 * q["encode_cpu_s_per_1k"]
    train = c["steps"] * q["step_cpu_s_median"]
    graph = train + ev + (c["steps"] // c["refresh_every"] + 1) * refresh
    total = 5 * (2 * (train + ev) + 4 * graph)  # default, uniform + 4 graph arms, 5 seeds
    return (f"; the pilot's evaluation + set-up took {ev / 60:.1f} CPU-minutes. 30 runs (6 arms "
            f"x 5 seeds) are then about {total / 3600 / 2:.1f} hours of two-worker CPU before "
            "graph builds and contention (wall was 1.5x CPU on this loaded machine): within "
            "the ~8 h budget.")


def _cost_table(path: Path) -> list[str]:
    L = ["### Cost per step and per re-encoding (top layers only, cached lower layers)\n"]
    if not path.is_file():
        return L + ["pending (`python -m hardbatch_experiments.recipes.simcse.probe cost`)\n"]
    import json

    c = json.loads(path.read_text())
    L.append(f"One torch thread, B = {c['batch_size']}, cache over the first "
             f"{c['num_sentences']:,} sentences (32 tokens, float16). CPU = process time of the "
             "measuring process (its own work); wall = elapsed, measured while other jobs "
             "shared the 2 cores. A step = forward + backward of the top L layers on 2 x B "
             "cached rows + AdamW; a re-encoding = the top L layers in eval mode over the cache "
             "(what a graph refresh costs); the cache build runs the embeddings and the lower "
             "6 - L layers once. L = 6 is the whole transformer (a full-model step, "
             "for reference).\n")
    L.append("| L | step CPU (s) | step wall (s) | re-encode CPU (s / 1k sentences) | re-encode "
             "wall (s / 1k) | cache build CPU (s / 1k) | cache (MB / 1k sentences) |")
    L.append(md_rule(7))
    for r in c["rows"]:
        L.append(md_row([r["reinit_layers"], f"{r['step_cpu_s_median']:.3f}",
                         f"{r['step_s_median']:.3f}", f"{r['encode_cpu_s_per_1k']:.2f}",
                         f"{r['encode_s_per_1k']:.2f}", f"{r['cache_build_cpu_s_per_1k']:.1f}",
                         f"{r['cache_mb_per_1k']:.1f}"]))
    e = c["env"]
    L.append(f"\nCommand: `{c['command']}` (finished {e.get('finished', '')}; machine: "
             f"{e.get('cpus')}-core x86-64 CPU VM, torch {e.get('torch')}, no GPU; the same for "
             "every run of this section).\n")
    return L


#: pairs of arms compared besides each arm vs default: the sampler vs hardbatch's own uniform,
#: the two graph samplers with each other, and the guided masks vs the same sampler without
