"""One rank of the torchrun test (tests/hardbatch/test_distributed.py); run it with

    PYTHONPATH=tests torchrun --standalone --nproc_per_node=2 tests/hardbatch/distributed_worker.py

Checks, on gloo (CPU): all_gather_rows with uneven sizes, sharded proximity / kNN
graphs and GCBS orders == the single-process ones, EmbeddingBank synchronisation, identical plans and
distinct (item-disjoint for partitions) batches per step, a DDP-style training loop
(bank fed from each rank's batches, graph rebuilt sharded) that reproduces a
single-process simulation of the same run, and background planning under DDP.
Each rank prints ``RANK r OK`` at the end; any failed check raises.

``distributed_worker.py trainer`` runs only :func:`check_trainer_skip` (a few seconds): the
Trainer under DDP when one rank's batch has a single item (issue 17.10).
``distributed_worker.py checks`` runs only :func:`check_gather_errors` and
:func:`check_trainer_guide` (a few seconds): all_gather_rows' errors on every rank, and
``Trainer(guide=...)`` with a ``gather=True`` loss.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import hardbatch as hb
import hardbatch.distributed as hbdist
import hardbatch._device as hbdevice
from hardbatch.batching.gcbs import sharded_gcbs_permutation
from hardbatch.neighbors.knn_graph import sharded_knn_graph, sharded_proximity_graph
from support import end_torchrun_worker

N, D, B = 600, 16, 40


def gather_objects(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def fake_encoder(base: torch.Tensor, idx: torch.Tensor, step: int) -> torch.Tensor:
    """Embeddings that depend only on (item, step): the same on any rank or process."""
    drift = torch.cos(idx[:, None].double() * 0.37 + step * 0.11 + torch.arange(D)).float()
    return base[idx] + 0.3 * drift


def check_gather(rank: int, world: int) -> None:
    mine = torch.arange(rank * 10, rank * 10 + 3 + 2 * rank).reshape(-1, 1).repeat(1, 3)
    got = hbdist.all_gather_rows(mine)
    want = torch.cat([torch.arange(r * 10, r * 10 + 3 + 2 * r).reshape(-1, 1).repeat(1, 3)
                      for r in range(world)])
    assert torch.equal(got, want), (got, want)
    empty = hbdist.all_gather_rows(torch.zeros((0 if rank == 0 else 2, 4)))
    assert empty.shape == (2 * (world - 1), 4)


def check_graphs(x: np.ndarray) -> None:
    # Small blocks, so that both ranks build several blocks of groups / rows.
    hbdevice.BLOCK_ELEMENTS_CPU = 1 << 13
    for g in (None, 1):
        sharded = sharded_proximity_graph(x, 100, 10, seed=3, group_size=g)
        assert torch.equal(sharded, hb.proximity_graph(x, 100, 10, seed=3, group_size=g))
    assert torch.equal(sharded_knn_graph(x, 10), hb.knn_graph(x, 10))
    for method in ("exact", "ivf"):
        assert torch.equal(sharded_gcbs_permutation(x, 0.99, method=method, seed=4),
                           hb.gcbs_permutation(x, 0.99, method=method, seed=4)), method
    # the defaults ("auto", min_partners) and interleaved chunks resolve alike on every rank
    assert torch.equal(sharded_gcbs_permutation(x, 0.99, seed=4, interleave=8),
                       hb.gcbs_permutation(x, 0.99, seed=4, interleave=8))
    assert torch.equal(sharded_gcbs_permutation(x, 0.99, seed=4, min_partners=0),
                       hb.gcbs_permutation(x, 0.99, seed=4, min_partners=0))
    for parts in (1, 2, 5):  # cells shared across the ranks
        assert torch.equal(
            sharded_gcbs_permutation(x, 0.99, method="partition", partitions=parts, seed=4),
            hb.gcbs_permutation(x, 0.99, method="partition", partitions=parts, seed=4)), parts
    hbdevice.BLOCK_ELEMENTS_CPU = 1 << 22


def check_bank(rank: int, world: int) -> None:
    bank = hb.EmbeddingBank(50, 4, seed=1)  # sync is automatic under torchrun
    assert bank.synchronized
    ref = hb.EmbeddingBank(50, 4, seed=1, sync=False)
    for step in range(3):
        sizes = [5 + r + step for r in range(world)]  # uneven sizes
        idx = [torch.arange(r * 7 + step, r * 7 + step + sizes[r]) % 50 for r in range(world)]
        val = [torch.full((sizes[r], 4), float(10 * step + r)) for r in range(world)]
        bank.update(idx[rank], val[rank])
        ref.update(torch.cat(idx), torch.cat(val))  # one process doing all ranks' updates
    tables = gather_objects(bank.embeddings)
    assert all(torch.equal(t, ref.embeddings) for t in tables)
    assert torch.equal(bank.last_update, ref.last_update) and bank.step == ref.step


def check_plans(x: np.ndarray, rank: int, world: int) -> None:
    for kind in ("uniform", "proximity", "knn", "gcbs"):
        kw = {"seed": 5}
        if kind == "uniform":
            s = hb.UniformBatchSampler(N, B, **kw)
            single = hb.UniformBatchSampler(N, B, rank=0, world_size=1, **kw)
        elif kind == "proximity":
            s = hb.ProximityGraphSampler(x, B, 100, 10, refresh_every=None, **kw)
            single = hb.ProximityGraphSampler(x, B, 100, 10, refresh_every=None, rank=0,
                                              world_size=1, **kw)
            assert s.distributed and not single.distributed
        elif kind == "knn":
            s = hb.KNNBatchSampler(x, B, refresh_every=None, **kw)
            single = hb.KNNBatchSampler(x, B, refresh_every=None, rank=0, world_size=1, **kw)
        else:
            s = hb.GCBSSampler(x, B, quantile=0.99, **kw)
            single = hb.GCBSSampler(x, B, quantile=0.99, rank=0, world_size=1, **kw)
            assert s.distributed and not single.distributed
        assert (s.rank, s.world_size) == (rank, world)
        mine = list(s)
        everyone = gather_objects(mine)
        steps = math.ceil(math.ceil(N / B) / world)
        assert all(len(p) == steps for p in everyone)
        interleaved = [everyone[r][k] for k in range(steps) for r in range(world)]
        assert interleaved[:math.ceil(N / B)] == list(single), kind  # = the single-process plan
        for k in range(steps):
            batches = [everyone[r][k] for r in range(world)]
            assert len({tuple(b) for b in batches}) == world, (kind, k)  # distinct per step
            if kind in ("uniform", "gcbs") and (k + 1) * world <= math.ceil(N / B):
                items = [i for b in batches for i in b]
                assert len(items) == len(set(items)), (kind, k)  # partitions: disjoint


def train_like(base, sampler, bank, epochs: int, rank: int, world: int):
    """DDP-style loop: each rank encodes its own batch and feeds the (synchronised) bank."""
    loader = torch.utils.data.DataLoader(torch.arange(N), batch_sampler=sampler)
    seen, step = [], 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for idx in loader:
            seen.append(idx.tolist())
            bank.update(idx, fake_encoder(base, idx, step))
            step += 1
    return seen


def simulate_single_process(base, make_sampler, epochs: int, world: int):
    """The same run in one process: W samplers (rank=r, not distributed) and one bank
    that receives every rank's updates in rank order, as the synchronised banks do."""
    bank = hb.EmbeddingBank(N, D, seed=2, sync=False)
    samplers = [make_sampler(bank, r, world) for r in range(world)]
    seen, step = [[] for _ in range(world)], 0
    for epoch in range(epochs):
        its = []
        for s in samplers:
            s.set_epoch(epoch)
            its.append(iter(s))
        for _ in range(len(samplers[0])):
            batches = [torch.tensor(next(it)) for it in its]
            for r in range(world):
                seen[r].append(batches[r].tolist())
            bank.update(torch.cat(batches),
                        torch.cat([fake_encoder(base, b, step) for b in batches]))
            step += 1
    return seen


def check_training(base: torch.Tensor, rank: int, world: int) -> None:
    for background, prefetch in ((False, 0), (True, 0), (True, 4)):
        def make(bank, r=None, w=None, distributed=None, background=background,
                 prefetch=prefetch):
            on = r is None  # background build / planner thread in the DDP run only
            return hb.ProximityGraphSampler(bank, B, 100, 10, refresh_every=3, seed=9,
                                            refresh_lag=1, background=background and on,
                                            prefetch=prefetch if on else 0,
                                            distributed=distributed, rank=r, world_size=w)

        bank = hb.EmbeddingBank(N, D, seed=2)
        sampler = make(bank)
        assert sampler.distributed and bank.synchronized
        mine = train_like(base, sampler, bank, epochs=2, rank=rank, world=world)
        everyone = gather_objects(mine)
        # Single-process simulation with unsharded graphs: identical batches.
        sim = simulate_single_process(base, lambda bk, r, w: make(bk, r, w, False), 2, world)
        assert everyone == sim, \
            f"background={background}, prefetch={prefetch}: DDP run != single-process run"
        assert sampler.refreshes == 5  # steps 0, 3, ..., 12 (15 is scheduled, used at 16)
        tables = gather_objects(bank.embeddings)
        assert all(torch.equal(t, tables[0]) for t in tables)
    for background in (False, True):  # GCBS with pipelined epochs (next order built off the loop)
        def make_gcbs(bank, r=None, w=None, distributed=None, background=background):
            return hb.GCBSSampler(bank, B, quantile=0.99, seed=9, refresh_lag=2,
                                  background=background and r is None, distributed=distributed,
                                  rank=r, world_size=w)

        bank = hb.EmbeddingBank(N, D, seed=2)
        mine = train_like(base, make_gcbs(bank), bank, epochs=3, rank=rank, world=world)
        sim = simulate_single_process(base, lambda bk, r, w: make_gcbs(bk, r, w, False), 3, world)
        assert gather_objects(mine) == sim, f"GCBS background={background}: DDP != single process"


class CountingEncoder:
    """A stand-in SentenceTransformer: deterministic unit embeddings of each text."""

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, texts, **kwargs):
        self.encoded += len(texts)
        rows = [np.random.default_rng(int(t.split()[-1])).standard_normal(D) for t in texts]
        out = torch.tensor(np.array(rows), dtype=torch.float32).reshape(len(texts), D)
        return torch.nn.functional.normalize(out, dim=1)


def check_text_encoding(rank: int, world: int) -> None:
    from hardbatch.integrations.sentence_transformers import TextEmbeddingSource

    texts = [f"sentence {i}" for i in range(101)]
    model = CountingEncoder()
    sharded = TextEmbeddingSource(model, texts)()  # each rank encodes its share, all-gathered
    assert model.encoded in (101 // world, 101 // world + 1)
    whole = TextEmbeddingSource(CountingEncoder(), texts, shard=False)()
    assert torch.equal(sharded, whole)


def check_trainer_skip(rank: int, world: int) -> None:
    """N = 9, B = 4 on 2 ranks: the second step gives rank 0 a one-item batch and rank 1 a
    full one. Both ranks must skip that step together (else DDP's gradient all-reduce and the
    synchronised bank update pair with the wrong step and the ranks diverge or hang)."""
    import warnings

    from hardbatch.train import Trainer

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(1))
    bank = hb.EmbeddingBank(9, 4, seed=0)
    assert bank.synchronized
    sampler = hb.UniformBatchSampler(9, 4, seed=0)
    assert [len(b) for b in sampler] == ([4, 1] if rank == 0 else [4, 4])
    trainer = Trainer(model, hb.InfoNCE(0.5), sampler, x, bank=bank, epochs=2, progress=False,
                      augment=lambda v, generator=None: v + 0.01 * torch.randn(
                          v.shape, generator=generator))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip warning (rank 1: another rank's batch)
        result = trainer.fit()
    skipped = [r["step"] for r in result.history if r.get("skipped")]
    assert skipped == [2, 4], skipped  # on every rank
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = gather_objects((params, bank.embeddings, bank.step))
    assert all(torch.equal(p, everyone[0][0]) for p, _, _ in everyone), "weights diverged"
    assert all(torch.equal(t, everyone[0][1]) and s == everyone[0][2] for _, t, s in everyone)


def expect_error(match: str, fn, *args, **kw) -> None:
    """``fn`` raises a ValueError whose message contains ``match`` (on this rank)."""
    try:
        fn(*args, **kw)
    except ValueError as err:
        assert match in str(err), str(err)
        return
    raise AssertionError(f"no ValueError ({match!r})")


def check_gather_errors(rank: int, world: int) -> None:
    """Wrong ``counts``, a different trailing shape or dtype on one rank: the same ValueError
    on every rank before any data moves (no padding rows, no dropped rows, no gloo crash),
    after which the ranks still gather together."""
    rows = torch.full((3 if rank == 0 else 2, 2), float(rank + 1))
    want = torch.cat([torch.full((3 if r == 0 else 2, 2), float(r + 1)) for r in range(world)])
    sizes = [3] + [2] * (world - 1)
    for fn in (hbdist.all_gather_rows, hbdist.all_gather_rows_with_grad):
        expect_error("counts=[3, 3] on rank 0 must list every rank's tensor.shape[0]", fn,
                     rows, counts=[3] * world)  # would pad a zero row
        expect_error("counts=[3, 1] on rank 0", fn, rows, counts=[3] + [1] * (world - 1))
        expect_error(f"counts of {world} ints expected on rank 0", fn, rows, counts=[3])
        bad = sizes if rank == 0 else [2] * world  # only rank 1's counts are wrong
        expect_error("counts=[2, 2] on rank 1", fn, rows, counts=bad)
        assert torch.equal(fn(rows, counts=sizes).detach(), want)
    expect_error("same trailing shape and dtype on every rank, got rank 0: [n, 4] torch.float32,"
                 " rank 1: [n, 5] torch.float32", hbdist.all_gather_rows,
                 torch.ones(3, 4 if rank == 0 else 5))
    expect_error("rank 1: [n, 4] torch.float16", hbdist.all_gather_rows,
                 torch.ones(3, 4, dtype=torch.float32 if rank == 0 else torch.float16))
    expect_error("rank 1: [n, 2, 3]", hbdist.all_gather_rows_with_grad,
                 torch.ones(3, 6) if rank == 0 else torch.ones(3, 2, 3))
    assert torch.equal(hbdist.all_gather_rows(rows), want)  # the ranks still work together


def check_trainer_guide(rank: int, world: int) -> None:
    """Trainer(guide=[N, d']) with InfoNCE(gather=True) under DDP: the loss gets the guided
    mask of this rank's anchors against the global batch, [b, B_global] (it raised before:
    the mask was [b, b])."""
    from hardbatch.train import Trainer

    class Recording(hb.InfoNCE):
        masks: list = []

        def forward(self, anchor, positive, labels=None, negatives=None, false_negatives=None):
            self.masks.append(false_negatives)
            return super().forward(anchor, positive, labels, negatives, false_negatives)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 4))
    gen = torch.Generator().manual_seed(1)
    x, guide = torch.randn(16, 6, generator=gen), torch.randn(16, 3, generator=gen)
    guide[1::2] = guide[::2] + 0.01 * torch.randn(8, 3, generator=gen)  # near pairs to mask
    loss = Recording(0.5, gather=True)
    result = Trainer(model, loss, hb.UniformBatchSampler(16, 4, seed=0), x, epochs=1,
                     progress=False, guide=guide, guide_margin=0.1).fit()
    batches = gather_objects(result.last_epoch_batches)
    assert len(loss.masks) == len(batches[rank]) == 2
    for step, mask in enumerate(loss.masks):
        items = torch.tensor([i for r in range(world) for i in batches[r][step]])
        full = hb.guided_mask(guide[items], guide[items], 0.1, form="simclr")
        assert torch.equal(mask, full[4 * rank:4 * rank + 4]), (rank, step)
    assert any(m.any() for m in loss.masks)


def main_trainer(checks: bool = False) -> None:
    from datetime import timedelta

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if checks:
        check_gather_errors(rank, world)
        check_trainer_guide(rank, world)
    else:
        check_trainer_skip(rank, world)
    dist.barrier()
    print(f"RANK {rank} OK", flush=True)
    end_torchrun_worker()


def main() -> None:
    backend = os.environ.get("HARDBATCH_DIST_BACKEND", "gloo")  # "nccl" on a multi-GPU machine
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)  # the same embeddings on every rank
    x = rng.standard_normal((N, D)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    check_gather(rank, world)
    check_graphs(x)
    check_bank(rank, world)
    check_plans(x, rank, world)
    check_training(torch.from_numpy(x), rank, world)
    check_text_encoding(rank, world)
    dist.barrier()
    print(f"RANK {rank} OK", flush=True)
    end_torchrun_worker()


if __name__ == "__main__":
    try:
        if sys.argv[1:] in (["trainer"], ["checks"]):
            main_trainer(checks=sys.argv[1] == "checks")
        else:
            main()
    except Exception:  # noqa: BLE001 - report any failure, then exit without hanging
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # do not leave the other rank waiting in a collective
