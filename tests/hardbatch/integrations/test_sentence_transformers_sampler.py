"""The sentence-transformers batch sampler keeps copies of a text out of one batch by default, as
NoDuplicatesBatchSampler does (issue 22); sentence-transformers itself is not needed here."""

import itertools

import pytest
import torch

from hardbatch.integrations.sentence_transformers_sampler import (
    HardNegativeBatchSampler,
    row_keys,
)


class LetterEncoder(torch.nn.Module):
    """A stand-in SentenceTransformer: unit vectors of letter counts (copies embed alike)."""

    def encode(self, texts, batch_size=32, convert_to_tensor=True, normalize_embeddings=True,
               show_progress_bar=False):
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


def repeated_values(batch, table, columns=("anchor", "positive")):
    values = [table[c][i] for i in batch for c in columns]
    return len(values) - len(set(values)) - sum(table["anchor"][i] == table["positive"][i]
                                                for i in batch)


@pytest.mark.parametrize("kind", ["proximity", "knn", "gcbs", "uniform"])
def test_no_text_appears_twice_in_a_batch_by_default(kind):
    table = pairs_with_copies()
    kw = {"quantile": 0.9} if kind == "gcbs" else {}
    plain = HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler=kind,
                                     no_duplicates=False, refresh_every=None, **kw)
    # sentence-transformers passes its label columns, which NoDuplicatesBatchSampler ignores
    keyed = HardNegativeBatchSampler(table, 10, valid_label_columns=["label", "score"],
                                     model=LetterEncoder(), sampler=kind, refresh_every=None,
                                     **kw)
    if kind != "uniform":
        assert sum(repeated_values(b, table) for b in plain) > 0  # copies are nearest
    batches = list(keyed)
    assert len(batches) == len(keyed) == 9
    assert all(repeated_values(b, table) == 0 for b in batches)


def test_no_duplicates_off_gives_the_plain_sampler():
    import hardbatch as hb

    table = pairs_with_copies()
    off = HardNegativeBatchSampler(table, 10, model=LetterEncoder(), sampler="knn",
                                   no_duplicates=False, refresh_every=None, seed=3)
    plain = hb.KNNBatchSampler(LetterEncoder().encode(table["anchor"]), 10, refresh_every=None,
                               seed=3)
    assert off.hard_sampler.duplicate_keys is None and list(off) == list(plain)


def test_row_keys_follow_shared_values_but_not_labels():
    table = pairs_with_copies(30)
    keys = row_keys(table, ["label"])
    texts = [{table["anchor"][i], table["positive"][i]} for i in range(30)]
    for i, j in itertools.combinations(range(30), 2):
        if texts[i] & texts[j]:  # NoDuplicatesBatchSampler's conflict: any value in common
            assert keys[i] == keys[j]
    assert len(set(keys)) > 5  # the label column (two values) merges nothing
    assert len(set(row_keys(table))) <= 2  # unless it is counted as a text column


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
