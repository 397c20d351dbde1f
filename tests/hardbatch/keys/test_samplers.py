"""duplicate_keys end to end: items with equal keys never share a batch, for every sampler
(issue 22), and no batch holds two rows whose key sets meet (issue 31: no text of a row twice
in a batch, pairwise, as sentence-transformers' NoDuplicatesBatchSampler), through epochs,
resume, prefetch and global batches."""

import itertools
import math

import pytest
import torch
from keys_support import clashes, copies_keys, with_copies
from sampler_support import B, KINDS, N, PARTITIONS, chain_sets, conflicts, make, near_conflicts


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("sets", [False, True])
def test_every_sampler_keeps_copies_apart_and_the_contract(kind, emb, drop_last, sets):
    """Single keys (copies of one text) and key sets (mined rows: a row conflicts with the
    rows holding one of its texts, issue 31)."""
    keys = chain_sets() if sets else copies_keys()
    x = near_conflicts(emb, keys) if sets else with_copies(emb, keys)
    count = conflicts if sets else clashes
    without = list(make(kind, x, refresh_every=None, drop_last=drop_last, seed=1))
    if kind != "community":  # B3 skips each item's nearest ranks
        assert count(without, keys) > 0  # copies / conflicting rows meet without keys
    s = make(kind, x, refresh_every=None, drop_last=drop_last, seed=1, duplicate_keys=keys)
    assert s.duplicate_keys.sets == sets
    for _ in range(2):  # two epochs
        batches = list(s)
        assert len(batches) == (N // B if drop_last else math.ceil(N / B))
        assert count(batches, keys) == 0
        assert all(len(set(b)) == len(b) for b in batches)
        assert getattr(getattr(s, "walk_state", None), "fallbacks", [0])[0] == 0
        if kind in PARTITIONS:
            drawn = sorted(itertools.chain.from_iterable(batches))
            assert len(set(drawn)) == len(drawn) == (N - N % B if drop_last else N)
        else:
            assert all(len(b) == B for b in batches)


@pytest.mark.parametrize("kind", KINDS)
def test_keys_without_copies_give_the_same_batches(kind, emb):
    plain = make(kind, emb, seed=2)
    keyed = make(kind, emb, seed=2, duplicate_keys=[f"t{i}" for i in range(N)])
    assert [list(keyed), list(keyed)] == [list(plain), list(plain)]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_and_prefetch_with_keys(kind, emb):
    keys = copies_keys(seed=4)
    x = with_copies(emb, keys)
    reference = list(make(kind, x, seed=3, duplicate_keys=keys))
    s = make(kind, x, seed=3, duplicate_keys=keys)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    fresh = make(kind, x, seed=3, duplicate_keys=keys)
    fresh.load_state_dict(s.state_dict(consumed=3))
    assert head[:3] + list(fresh) == reference
    if kind not in PARTITIONS:
        assert list(make(kind, x, seed=3, duplicate_keys=keys, prefetch=2)) == reference


@pytest.mark.parametrize("kind", KINDS)
def test_resume_with_conflicts_from_a_saved_state(kind, emb, tmp_path):
    sets = chain_sets(seed=3)
    x = near_conflicts(emb, sets)
    reference = list(make(kind, x, seed=3, duplicate_keys=sets))
    for consumed in (0, 3):  # a prefetching loader ran two batches ahead
        run = make(kind, x, seed=3, duplicate_keys=sets)
        batches = iter(run)
        head = [next(batches) for _ in range(consumed + 2)]
        torch.save(run.state_dict(consumed=consumed), tmp_path / "state.pt")
        resumed = make(kind, x, seed=3, duplicate_keys=sets)
        resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
        assert head[:consumed] + list(resumed) == reference, consumed


@pytest.mark.parametrize("sets", [False, True])
def test_global_batches_never_share_a_key_across_ranks(emb, sets):
    keys = chain_sets(seed=8) if sets else copies_keys(seed=8)
    x = near_conflicts(emb, keys) if sets else with_copies(emb, keys)
    for kind in ("uniform", "knn", "proximity", "gcbs"):
        ranks = [list(make(kind, x, batch_size=32, seed=5, rank=r, world_size=2,
                           global_batch=True, duplicate_keys=keys)) for r in range(2)]
        steps = [a + b for a, b in zip(*ranks)]
        assert (conflicts if sets else clashes)(steps, keys) == 0, kind


def test_per_rank_batches_may_share_a_key_across_ranks_as_distributed_md_says():
    """duplicate_keys hold within each planned batch: with global_batch=False (each rank's
    batch) two ranks' batches of one step may hold copies of one key, which a gather=True loss
    would contrast; docs/distributed.md tells gather=True users to set global_batch=True."""
    from pathlib import Path

    import hardbatch as hb

    keys = [i // 2 for i in range(16)]  # items 2k and 2k + 1 are copies
    for global_batch, shared in ((False, True), (True, False)):
        ranks = [list(hb.UniformBatchSampler(16, 4, world_size=2, rank=r, duplicate_keys=keys,
                                             global_batch=global_batch)) for r in range(2)]
        assert clashes([b for r in ranks for b in r], keys) == 0  # within a rank's batch
        assert (clashes([a + b for a, b in zip(*ranks)], keys) > 0) == shared
    text = " ".join((Path(__file__).parents[3] / "docs" / "distributed.md").read_text().split())
    assert "With `gather=True` and `duplicate_keys`, use `global_batch=True`." in text


def test_docs_examples_run():
    """The duplicate_keys, near_duplicate_keys and global_batch examples of docs/samplers.md
    (run as written)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "samplers.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
              if "duplicate_keys=" in b or "global_batch=True" in b]
    assert len(blocks) == 4  # duplicate keys, key sets, near-duplicates, global batches
    for block in blocks:
        exec(compile(block, "docs/samplers.md", "exec"), {})
