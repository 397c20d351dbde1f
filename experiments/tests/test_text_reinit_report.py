"""The re-initialised-MiniLM section of the text page: paired effects from the shared helper,
"pending" for arms and tables without runs, guided runs as their own arm."""

from __future__ import annotations

import json

from hardbatch_experiments.reports.paired import paired_effect
from hardbatch_experiments.reports.text_reinit import arm_of, reinit_section


def _run(sampler, seed, avg, mrr, guide=None):
    return {"benchmark": "simcse-reinit", "sampler": sampler, "loss": "mnrl", "seed": seed,
            "avg": avg, "retrieval": {"mrr@10": mrr, "recall@1": mrr / 2},
            "config": {"guide_margin": guide}, "diagnostics": {"mean_hardness": 0.3},
            "loss_curve": [0.5, 0.1], "loss_curve_chunk": 30, "train_time_s": 60.0,
            "refresh_time_s": 0.0,
            "eval_time_s": 60.0, "wall_time_s": 130.0, "env": {"finished": f"t{seed}"},
            "command": f"hardbatch bench simcse --sampler {sampler} --seed-list {seed}"}


def test_reinit_section_pairs_by_seed(tmp_path):
    folder = tmp_path / "reinit"
    folder.mkdir()
    base = {1: 60.0, 2: 61.0, 3: 59.5}
    prox = {1: 61.0, 2: 61.5, 3: 61.0}
    for s, v in base.items():
        (folder / f"d{s}.json").write_text(json.dumps(_run("default", s, v, 0.5)))
    for s, v in prox.items():
        (folder / f"p{s}.json").write_text(json.dumps(_run("proximity", s, v, 0.6)))
    (folder / "g1.json").write_text(json.dumps(_run("proximity", 1, 62.0, 0.6, guide=0.5)))
    text = "\n".join(reinit_section(tmp_path))
    assert paired_effect(prox, base).format(2) in text
    assert "+10.00 [+10.00, +10.00] (n = 3, paired)" in text  # MRR@10 x 100, constant diff
    assert "proximity + guided false-negative masks" in text and "no interval" in text
    assert "Pending arms: uniform, knn, gcbs" in text
    assert "pending (`python -m hardbatch_experiments.recipes.simcse.probe start`)" in text
    assert "### Pilot runs (exploration, seed 0)\n\npending" in text
    verdict = text.split("### Verdict")[1].split("### Setting")[0]
    # interim: 0 of the 5 planned seeds finished for every main arm (uniform, gcbs missing)
    assert verdict.lstrip().startswith("**Pending, interim** (0 of 5 seeds")
    assert ("- proximity graph + RWR: STS avg +1.00 [-0.24, +2.24] (n = 3, paired), within noise; "
            "MRR@10 +10.00 [+10.00, +10.00] (n = 3, paired), beyond noise, better.") in verdict
    assert "guided" not in verdict  # n = 1: no verdict
    assert "In plain words" not in verdict  # only once every main arm has every seed
    assert "Training loss" in text and "proximity: 0.5 (steps 1-30)" in text
    assert arm_of(_run("proximity", 1, 0, 0, guide=0.5)) == "proximity+guided"


def test_reinit_verdict_final_recommends_only_an_arm_beyond_noise(tmp_path):
    folder = tmp_path / "reinit"
    folder.mkdir()
    seeds = (1, 2, 3, 4, 5)
    gain = {"default": 0.0, "uniform": 0.1, "proximity": 1.0, "gcbs": -1.0}
    for arm, g in gain.items():
        for s in seeds:
            jitter = {"default": 0.0, "uniform": 0.5 if s % 2 else -0.5}.get(arm, 0.05 * (s % 2))
            v = 60.0 + s + g + jitter  # uniform: +0.1 on average, within noise
            (folder / f"{arm}{s}.json").write_text(json.dumps(_run(arm, s, v, 0.5)))
    for s in (1, 2):  # an optional arm still running: shown apart, not in the verdict
        (folder / f"knn{s}.json").write_text(json.dumps(_run("knn", s, 65.0 + s + s % 2, 0.5)))
    text = "\n".join(reinit_section(tmp_path))
    values = {arm: {s: 60.0 + s + g + ({"default": 0.0, "uniform": 0.5 if s % 2 else -0.5}
                                       .get(arm, 0.05 * (s % 2))) for s in seeds}
              for arm, g in gain.items()}
    side = paired_effect(values["gcbs"], values["proximity"])
    assert side.format(2) == "-2.00 [-2.00, -2.00] (n = 5, paired)"
    assert ("Side comparisons (read after the runs, not pre-registered; STS avg): proximity vs "
            f"uniform {paired_effect(values['proximity'], values['uniform']).format(2)}; ") in text
    assert f"gcbs vs proximity {side.format(2)}; knn vs gcbs " in text
    assert "proximity+guided vs" not in text  # no guided arm: no guided comparison
    verdict = text.split("### Verdict")[1].split("### Setting")[0]
    assert verdict.lstrip().startswith("**Verdict (5 paired seeds)**")
    head, running = verdict.split("Still running (interim, not part of the verdict):")
    assert "kNN" not in head and "- kNN sampler: STS avg" in running and "(n = 2, paired)" in running
    assert ("In plain words: proximity graph + RWR trained a better STS model than the default "
            "sampler beyond seed noise; GCBS (library defaults) did worse. On the STS-B retrieval "
            "view (MRR@10) no sampler did better than the default beyond noise. Recommended for "
            "SimCSE-style training from a partly trained encoder: proximity graph + RWR."
            ) in verdict


def test_reinit_verdict_names_a_retrieval_loss_and_recommends_around_it(tmp_path):
    """An arm that costs retrieval beyond noise is named with its interval, and the
    recommendation prefers the arm with an STS gain that does not cost retrieval."""
    folder = tmp_path / "reinit"
    folder.mkdir()
    # (STS gain, MRR gain) per arm; proximity has the larger STS gain but loses retrieval
    gain = {"default": (0.0, 0.0), "uniform": (0.0, 0.0), "proximity": (3.0, -0.02),
            "gcbs": (2.0, 0.0)}
    for arm, (g, m) in gain.items():
        for s in (1, 2, 3, 4, 5):
            jitter = 0.1 * (s % 2) if arm != "default" else 0.0
            run = _run(arm, s, 60.0 + s + g + jitter, 0.5 + m + jitter / 100)
            (folder / f"{arm}{s}.json").write_text(json.dumps(run))
    verdict = "\n".join(reinit_section(tmp_path)).split("### Verdict")[1].split("### Setting")[0]
    seeds = (1, 2, 3, 4, 5)
    mrr = paired_effect({s: 100 * (0.48 + 0.001 * (s % 2)) for s in seeds},
                        {s: 100 * 0.5 for s in seeds})
    assert (f"no sampler did better than the default beyond noise; proximity graph + RWR did "
            f"worse ({mrr.format(2)})") in verdict
    assert verdict.rstrip().endswith("from a partly trained encoder: GCBS (library defaults).")


def test_reinit_verdict_recommends_tied_arms_together(tmp_path):
    """Two arms whose paired STS difference is within noise are recommended together, with
    that difference; an arm clearly behind the best is left out."""
    folder = tmp_path / "reinit"
    folder.mkdir()
    seeds = (1, 2, 3, 4, 5)
    # knn - gcbs alternates +1 / -0.8 (mean +0.2, within noise); proximity 2 points behind
    gain = {"default": lambda s: 0.0, "uniform": lambda s: 0.0,
            "proximity": lambda s: 2.0 + 0.01 * s, "gcbs": lambda s: 4.0 + 0.01 * s,
            "knn": lambda s: 4.0 + 0.01 * s + (1.0 if s % 2 else -0.8)}
    values = {a: {s: 60.0 + s + g(s) for s in seeds} for a, g in gain.items()}
    for arm, v in values.items():
        for s in seeds:
            (folder / f"{arm}{s}.json").write_text(json.dumps(_run(arm, s, v[s], 0.5)))
    verdict = "\n".join(reinit_section(tmp_path)).split("### Verdict")[1].split("### Setting")[0]
    tie = paired_effect(values["knn"], values["gcbs"])
    assert not tie.beyond_noise and tie.mean > 0
    assert verdict.rstrip().endswith(
        "from a partly trained encoder: kNN sampler or GCBS (library defaults), tied (STS avg "
        f"kNN sampler vs GCBS (library defaults) {tie.format(2)}, within noise): the largest "
        "gain is not ahead beyond seed noise.")
