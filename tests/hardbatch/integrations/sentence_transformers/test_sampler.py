"""The sentence-transformers batch sampler (sentence-transformers itself is not needed here):
no text twice in a batch, as a pairwise conflict (issue 31: mined hard negatives are other
rows' texts), options checked when the factory is made, errors that name rows, texts and
parameters before any encoding, and one log line per encoding pass and build (issue 35)."""

import itertools
import logging

import pytest
import torch

import hardbatch as hb
from hardbatch.integrations.sentence_transformers import (
    HardNegativeBatchSampler,
    hard_negative_batch_sampler,
    row_conflicts,
)
from hardbatch.integrations.sentence_transformers import texts as texts_module

ALL_KINDS = hb.registry.sampler_names()


class LetterEncoder(torch.nn.Module):
    """A stand-in SentenceTransformer: unit vectors of letter counts (copies embed alike)."""

    calls = 0

    def encode(self, texts, batch_size=32, convert_to_tensor=True, normalize_embeddings=True,
               show_progress_bar=False):
        self.calls += 1
        counts = torch.tensor([[float(t.count(c)) + 0.1 for c in "abcdefgh"] for t in texts])
        return torch.nn.functional.normalize(counts, dim=1)


class Table(dict):
    """Columns by name, as a datasets.Dataset offers them."""

    column_names = property(lambda self: list(self.keys()))

    def __len__(self):
        return len(self[self.column_names[0]])


def pairs_with_copies(n=90):
    """(anchor, positive) rows: anchors repeat in threes, and some positives are other anchors."""
    anchors = [("ab" * (j % 4)) + ("cd" * (j % 5)) + f" s{j}" for j in (i // 3 for i in range(n))]
    positives = [f"p{i}" if i % 10 else anchors[(i + 7) % n] for i in range(n)]
    return Table(anchor=anchors, positive=positives, label=[i % 2 for i in range(n)])


def mined_triplets(n=200):
    """(anchor, positive, negative) rows as mine_hard_negatives makes them: the negative of row
    i is the anchor of row i + 1 (another row's text)."""
    anchors = [("abc"[i % 3] * (1 + i % 5)) + ("def"[i % 3] * (i % 4)) + f" q{i}"
               for i in range(n)]
    return Table(anchor=anchors, positive=[f"{a} passage" for a in anchors],
                 negative=[anchors[(i + 1) % n] for i in range(n)])


def repeated_texts(batch, table, columns=None):
    """Texts that occur in two rows of the batch (a row repeating its own text is fine)."""
    columns = columns or [c for c in table.column_names if c != "label"]
    rows = [{table[c][i] for c in columns} for i in batch]
    return sum(len(a & b) for a, b in itertools.combinations(rows, 2))


def kind_options(kind):
    return {"quantile": 0.9} if kind == "gcbs" else {}


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_no_text_appears_twice_in_a_batch_by_default(kind):
    table = pairs_with_copies()
    plain = HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler=kind,
                                     no_duplicates=False, refresh_every=None, **kind_options(kind))
    # sentence-transformers passes its label columns, which NoDuplicatesBatchSampler ignores
    keyed = HardNegativeBatchSampler(table, 10, valid_label_columns=["label", "score"],
                                     model=LetterEncoder(), sampler=kind, refresh_every=None,
                                     **kind_options(kind))
    if kind in ("knn", "gcbs"):
        assert sum(repeated_texts(b, table) for b in plain) > 0  # copies are nearest
    batches = list(keyed)
    assert len(batches) == len(keyed) == 9
    assert all(repeated_texts(b, table) == 0 for b in batches)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_mined_hard_negatives_are_conflicts_not_one_key(kind):
    """Issue 31: the old rule merged rows sharing a text transitively, so a mined dataset was
    one key ('duplicate_keys leave only 1 distinct keys for batches of 16 items')."""
    table = mined_triplets()
    keys = hb.keys.shared_value_keys(zip(*table.values()))
    assert len(set(keys)) == 1  # the old rule: every row in one key
    s = HardNegativeBatchSampler(table, 16, model=LetterEncoder(), sampler=kind,
                                 refresh_every=None, **kind_options(kind))
    for _ in range(2):
        batches = list(s)
        assert len(batches) == 13 and all(repeated_texts(b, table) == 0 for b in batches)
        assert all(len(set(b)) == len(b) for b in batches)


def test_row_conflicts_are_rows_sharing_a_text():
    table = pairs_with_copies(30)
    table["negative"] = [table["anchor"][(i * 7) % 30] for i in range(30)]
    keys = row_conflicts(table, ["label"])
    rows = [{table[c][i] for c in ("anchor", "positive", "negative")} for i in range(30)]
    held = [set(keys.idx[keys.ptr[i]:keys.ptr[i + 1]].tolist()) for i in range(30)]
    for i, j in itertools.combinations(range(30), 2):  # NoDuplicates' conflict: a shared text
        assert bool(held[i] & held[j]) == bool(rows[i] & rows[j]), (i, j)
    assert sorted(keys.values) == sorted({t for i, j in itertools.combinations(range(30), 2)
                                          for t in rows[i] & rows[j]})
    # the label column (two values) makes no conflict, unless it is counted as texts
    assert not row_conflicts(Table(a=["x", "y"], label=[1, 1]), ["label"]).any
    assert row_conflicts(Table(a=["x", "y"], label=[1, 1])).any
    only = row_conflicts(table, ["label"], columns=["anchor"])
    assert only.columns == ["anchor"] and set(only.values) == set(table["anchor"])
    with pytest.raises(ValueError, match=r"duplicate_columns=\['query'\].*no column 'query'"):
        row_conflicts(table, columns=["query"])


def test_duplicate_columns_choose_which_texts_conflict():
    table = mined_triplets(60)
    s = HardNegativeBatchSampler(table, 12, model=LetterEncoder(), sampler="knn",
                                 refresh_every=None, duplicate_columns=["anchor", "positive"])
    assert not s.hard_sampler.duplicate_keys.any  # anchors and positives are all distinct
    full = HardNegativeBatchSampler(table, 12, model=LetterEncoder(), sampler="knn",
                                    refresh_every=None)
    assert full.hard_sampler.duplicate_keys.any


def test_no_duplicates_off_gives_the_plain_sampler():
    table = pairs_with_copies()
    off = HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler="knn",
                                   no_duplicates=False, refresh_every=None, seed=3)
    plain = hb.KNNBatchSampler(LetterEncoder().encode(table["anchor"]), 10, refresh_every=None,
                               seed=3)
    assert off.hard_sampler.duplicate_keys is None and list(off) == list(plain)


def test_own_duplicate_keys_replace_the_texts_keys():
    table = pairs_with_copies()
    own = [i % 30 for i in range(90)]
    s = HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler="proximity",
                                 refresh_every=None, duplicate_keys=own)
    for batch in s:
        assert len({own[i] for i in batch}) == len(batch)
    with pytest.raises(ValueError, match="duplicate_keys has 3 keys but there are N=90"):
        HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler="uniform",
                                 duplicate_keys=[1, 2, 3])


# -- options are checked when the factory is made (issue 35 item 3) -------------------------

def test_a_misspelt_option_raises_when_the_factory_is_made():
    with pytest.raises(ValueError, match="unknown option 'refresh_evry' for sampler='knn'; "
                                         "did you mean 'refresh_every'"):
        hard_negative_batch_sampler(LetterEncoder(), "knn", refresh_evry=5)


@pytest.mark.parametrize("kind", ["uniform", "gcbs", "default"])
def test_options_of_another_sampler_raise_when_the_factory_is_made(kind):
    with pytest.raises(ValueError, match=f"'candidates' for sampler='{kind}': it is an option "
                                         "of 'proximity'"):
        hard_negative_batch_sampler(LetterEncoder(), kind, candidates=10)
    with pytest.raises(ValueError, match="'candidates'"):
        HardNegativeBatchSampler(pairs_with_copies(), 10, model=LetterEncoder(), sampler=kind,
                                 candidates=10)


def test_every_sampler_accepts_its_own_options():
    model = LetterEncoder()
    hard_negative_batch_sampler(model, "proximity", candidates=10, neighbors=5, restart=0.5)
    hard_negative_batch_sampler(model, "gcbs", quantile=0.9, show_progress_bar=False)
    hard_negative_batch_sampler(model, "cluster", clusters=4, duplicate_columns=["anchor"])
    hard_negative_batch_sampler(model, "uniform", no_duplicates=False)


# -- duplicate errors name rows, texts and parameters, before any encoding (item 4) ----------

def crowded(n=40, copies=12):
    """Rows whose positives repeat one text ``copies`` times."""
    return Table(anchor=[f"a{i}" for i in range(n)],
                 positive=["same text"] * copies + [f"p{i}" for i in range(copies, n)])


@pytest.mark.parametrize("kind", ["uniform", "gcbs", "knn", "proximity"])
def test_impossible_duplicate_rules_fail_when_the_sampler_is_made(kind):
    table, model = crowded(), LetterEncoder()
    make = hard_negative_batch_sampler(model, kind, refresh_every=None)
    pattern = (r"'same text' .*12 items.*0, 1, 2, 3, 4, \.\.\..*rows' texts.*"
               r"duplicate_columns=.*no_duplicates=False")
    b = 8 if kind in ("uniform", "gcbs") else 30  # 5 batches for 12 copies / 29 free rows
    with pytest.raises(ValueError, match=pattern):
        make(table, batch_size=b, drop_last=False)
    assert model.calls == 0  # raised before any encoding pass
    with pytest.raises(ValueError, match=pattern):  # and already with the factory's dataset
        hard_negative_batch_sampler(model, kind, train_dataset=table, batch_size=b)
    s = hard_negative_batch_sampler(model, kind, refresh_every=None, no_duplicates=False)(
        table, batch_size=b)  # the fix the message names
    assert len(list(s)) == len(s) >= 1


# -- logging and progress (item 2) -------------------------------------------------------------

@pytest.mark.parametrize("kind", ["knn", "proximity", "gcbs", "cluster"])
def test_every_encoding_pass_and_build_logs_a_line(kind, caplog):
    table = pairs_with_copies()
    caplog.set_level(logging.INFO, logger="hardbatch")
    s = HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler=kind,
                                 refresh_every=3, **kind_options(kind))
    list(s)
    records = [r for r in caplog.records
               if r.name == "hardbatch.integrations.sentence_transformers"]
    encodes = [r for r in records if r.build == "encode"]
    builds = [r for r in caplog.records if r.name == "hardbatch.samplers"
              and r.build == type(s.hard_sampler).__name__]  # timed by the refresh policy
    assert len(encodes) == s.refreshes >= 1 and all(r.n == 90 for r in encodes)
    assert len(builds) >= 1 and all(r.n == 90 and r.seconds >= 0 for r in builds)
    assert "N=90" in encodes[0].getMessage() and "seconds=" in builds[0].getMessage()


def test_show_progress_bar_reaches_the_encoding_and_the_build(monkeypatch):
    seen = []

    def bar(total, desc, progress):
        seen.append((desc, progress))
        return hb._logging.NO_BAR

    monkeypatch.setattr(texts_module, "progress_bar", bar)
    s = HardNegativeBatchSampler(pairs_with_copies(), 10, model=LetterEncoder(),
                                 sampler="gcbs", refresh_every=None, show_progress_bar=True)
    assert seen == [("hardbatch: encoding texts", True)]
    assert s.hard_sampler.progress is True
    s = HardNegativeBatchSampler(pairs_with_copies(), 10, model=LetterEncoder(),
                                 sampler="knn", refresh_every=None)
    assert seen[-1] == ("hardbatch: encoding texts", None)  # default: when stderr is a tty


def test_encoding_in_chunks_equals_one_pass():
    source = texts_module.TextEmbeddingSource(LetterEncoder(), pairs_with_copies()["anchor"],
                                              batch_size=1)  # 32 texts per model.encode call
    assert torch.equal(source(), LetterEncoder().encode(pairs_with_copies()["anchor"]))


def test_train_dataset_may_be_a_dataset_dict():
    table, other = pairs_with_copies(), mined_triplets(60)
    make = hard_negative_batch_sampler(LetterEncoder(), "knn", refresh_every=None,
                                       train_dataset={"a": table, "b": other})
    assert isinstance(make(other, batch_size=10), HardNegativeBatchSampler)
    evaluation = make(Table(anchor=["x", "y", "z"]), batch_size=2)
    assert list(evaluation) == [[0, 1], [2]]
    assert len(make.samplers) == 2 and make.samplers[0].kind == "knn"


# -- the factory end to end: refreshes, the model's mode, evaluation datasets -------------

class _FakeEncoder(torch.nn.Module):
    """Stands in for a SentenceTransformer: encode() embeds texts by character counts."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def encode(self, texts, batch_size=32, convert_to_tensor=False, normalize_embeddings=False,
               show_progress_bar=False):
        self.calls += 1
        self.eval()
        emb = torch.tensor([[t.count(c) + 0.01 for c in "aeiou"] for t in texts])
        return torch.nn.functional.normalize(emb, dim=1)


@pytest.mark.usefixtures("one_thread")
def test_hard_negative_batch_sampler_without_sentence_transformers():
    texts = [("a" * (i % 7)) + ("o" * (i % 5)) + f" text {i}" for i in range(60)]
    dataset = Table(anchor=texts, positive=texts)
    model = _FakeEncoder().train()
    make = hard_negative_batch_sampler(model, "proximity", refresh_every=2,
                                       train_dataset=dataset)
    sampler = make(dataset, batch_size=10, drop_last=False, valid_label_columns=None,
                   generator=None, seed=3)
    assert isinstance(sampler, HardNegativeBatchSampler) and make.samplers == [sampler]
    assert model.calls == 1 and model.training  # embedded once at construction, mode restored
    sampler.set_epoch(0)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 6 and all(len(set(b)) == 10 for b in batches)
    assert model.calls == 3 and sampler.refreshes == 3  # steps 2 and 4 re-embedded
    assert sampler.hard_sampler.candidates == 30 and sampler.hard_sampler.neighbors == 15
    # another dataset (an evaluation set) gets plain sequential batches
    other = make(Table(anchor=texts[:25]), batch_size=10, drop_last=False)
    assert list(other) == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    with pytest.raises(ValueError, match="sampler=") as exc:
        hard_negative_batch_sampler(model, "bfs")
    with pytest.raises(ValueError) as registry_error:
        hb.registry.canonical_sampler("bfs")
    assert str(registry_error.value) in str(exc.value) and "'default'" in str(exc.value)
    with pytest.raises(ValueError, match="unknown option.*'quantile'.*'knn'"):
        hard_negative_batch_sampler(model, "knn", quantile=0.9)(dataset, 10)
    with pytest.raises(ValueError, match="no column"):
        HardNegativeBatchSampler(dataset, 10, model=model, text_column="query")


@pytest.mark.parametrize("kind", ["uniform", "knn", "gcbs", "default"])
def test_a_trainer_that_passes_no_seed_seeds_the_sampler_from_its_generator(kind):
    """Issue 44 item 3: older sentence-transformers trainers call the batch-sampler callable
    without ``seed=`` (only its ``generator`` is seeded with ``args.seed``); the batches still
    change with that seed, as those of sentence-transformers' own samplers do, and equal those
    of a trainer that passes ``seed=args.seed``."""
    if kind == "default":
        pytest.importorskip("sentence_transformers")
        datasets = pytest.importorskip("datasets")
        table = datasets.Dataset.from_dict({"anchor": [f"t{i}" for i in range(60)],
                                            "positive": [f"p{i}" for i in range(60)]})
    else:
        table = pairs_with_copies()
    make = hard_negative_batch_sampler(LetterEncoder(), kind, refresh_every=None,
                                       **kind_options(kind))

    def batches(generator_seed, **seed):  # the old call: no seed
        generator = torch.Generator().manual_seed(generator_seed)
        return list(make(table, batch_size=10, drop_last=False, valid_label_columns=["label"],
                         generator=generator, **seed))

    assert batches(1) == batches(1) != batches(2)
    assert batches(1) == batches(1, seed=1) and batches(2) == batches(2, seed=2)
    assert make.samplers[0].seed == 1


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("kind", ["cluster", "knn"])
def test_a_consumer_that_counts_batches_gets_the_next_epoch_without_set_epoch(kind):
    """sentence-transformers' multi-dataset samplers take len(sampler) batches and never ask
    past the last one, and transformers < 5 never calls set_epoch on a sampler inside them: a
    new iteration must still be the next epoch (not epoch 0 again, not an empty one)."""
    texts = [("a" * (i % 7)) + ("o" * (i % 5)) + f" text {i}" for i in range(60)]
    dataset = Table(anchor=texts, positive=texts)

    def fresh():
        make = hard_negative_batch_sampler(LetterEncoder(), kind, refresh_every=None,
                                           train_dataset=dataset)
        return make(dataset, batch_size=10, drop_last=False, seed=5)

    counted = fresh()
    first = list(itertools.islice(iter(counted), len(counted)))  # never told the epoch ended
    second = list(itertools.islice(iter(counted), len(counted)))
    exhausted = fresh()
    assert list(exhausted) == first and list(exhausted) == second  # as a DataLoader runs it
    told = fresh()
    told.set_epoch(1)
    assert list(told) == second and second != first
    # an iteration cut short (a round-robin draws fewer batches) does not end its epoch
    cut = fresh()
    assert list(itertools.islice(iter(cut), 2)) == first[:2]
    assert list(itertools.islice(iter(cut), len(cut))) == first
    # set_epoch between iterations is obeyed as before
    cut.set_epoch(0)
    assert list(cut) == first


def test_column_texts_names_a_later_row_that_is_not_a_text():
    import datasets

    from hardbatch.integrations.sentence_transformers import column_texts

    data = datasets.Dataset.from_dict({"anchor": ["a", "b", None, "d"]})
    with pytest.raises(ValueError, match=r"column 'anchor' holds NoneType at row 2 \(None\), not a "
                                         r"text: fill or drop that row"):
        column_texts(data, "anchor")
    assert column_texts(data.select([0, 1, 3]), None) == ["a", "b", "d"]
