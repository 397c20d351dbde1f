"""torch.distributed: a real 2-process torchrun run on gloo (CPU), and the single-process no-ops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import unit_rows, run_torchrun

import hardbatch as hb
import hardbatch.distributed as hbdist
from hardbatch.batching.gcbs import sharded_gcbs_permutation
from hardbatch.neighbors.knn_graph import sharded_knn_graph, sharded_proximity_graph

WORKER = Path(__file__).with_name("distributed_worker.py")


needs_gloo = pytest.mark.skipif(not torch.distributed.is_available() or
                                not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _torchrun(*args: str, timeout: int) -> None:
    out = run_torchrun(WORKER, *args, timeout=timeout)
    assert "RANK 0 OK" in out and "RANK 1 OK" in out, out[-6000:]


@needs_gloo
def test_torchrun_two_ranks_gloo():
    """Identical plans, distinct batches per step, sharded graphs == single-process graphs,
    synchronised banks, and a DDP-style run (foreground and background builds) equal to a
    single-process simulation: see tests/hardbatch/distributed_worker.py."""
    _torchrun(timeout=300)


@needs_gloo
def test_trainer_skips_a_one_item_batch_on_every_rank_under_ddp():
    """issue 17.10: one rank's one-item batch makes every rank skip the step (one all-reduced
    flag), so DDP's gradient all-reduce and the synchronised bank stay in step: same weights
    and bank on both ranks afterwards (distributed_worker.py check_trainer_skip)."""
    _torchrun("trainer", timeout=120)


@needs_gloo
def test_gather_checks_and_trainer_guide_with_gathered_loss_under_ddp():
    """all_gather_rows(_with_grad) with counts that are not every rank's row count, or with a
    different trailing shape or dtype on one rank, raise the same ValueError on every rank
    (they padded zero rows, dropped rows, or crashed in gloo); Trainer(guide=...) with
    InfoNCE(gather=True) passes the loss the [b, B_global] guided mask (it passed [b, b] and
    the loss raised). distributed_worker.py check_gather_errors / check_trainer_guide."""
    _torchrun("checks", timeout=300)


def test_single_process_functions_are_plain_calls(rng):
    """One process: the collectives hand back their input, the sharded builds equal the
    plain builds."""
    assert not hbdist.is_distributed() and hbdist.get_rank_world() == (0, 1)
    t = torch.arange(6).reshape(3, 2)
    assert hbdist.all_gather_rows(t) is t
    x = unit_rows(rng, 300, 8)
    assert torch.equal(sharded_proximity_graph(x, 50, 5, seed=2),
                       hb.proximity_graph(x, 50, 5, seed=2))
    assert torch.equal(sharded_knn_graph(x, 5), hb.knn_graph(x, 5))
    for method in ("exact", "ivf", "partition"):
        assert torch.equal(sharded_gcbs_permutation(x, 0.99, method=method, partitions=3, seed=1),
                           hb.gcbs_permutation(x, 0.99, method=method, partitions=3, seed=1))
    assert hbdist.rank_share(7) == (0, 7)
    cells = torch.arange(4)
    assert hbdist.broadcast_from_first([cells])[0] is cells
    idx, emb = hbdist.sync_bank_update(torch.tensor([1, 2]), torch.ones(2, 8))
    assert idx.tolist() == [1, 2] and emb.shape == (2, 8)


def test_bank_and_sampler_not_distributed_without_init(rng):
    bank = hb.EmbeddingBank(100, 4, sync=True)
    assert not bank.synchronized  # nothing to synchronise in one process
    bank.update([1, 2], torch.ones(2, 4))
    assert bank.step == 1
    s = hb.ProximityGraphSampler(unit_rows(rng, 300, 8), 16, 50, 5, rank=1, world_size=2)
    assert not s.distributed
    with pytest.raises(ValueError, match="distributed=True needs torch.distributed"):
        hb.ProximityGraphSampler(unit_rows(rng, 300, 8), 16, 50, 5, distributed=True)
    with pytest.raises(ValueError, match="sync="):
        hb.EmbeddingBank(10, 2, sync="yes")


def test_world_size_without_rank_outside_torch_distributed_warns():
    """Each of W processes constructing UniformBatchSampler(N, B, world_size=W) before
    init_process_group took rank 0: all trained rank 0's share, silently."""
    with pytest.warns(UserWarning, match=r"world_size=4 without rank, and torch.distributed is "
                                         r"not initialised: this process takes rank 0.*pass rank="):
        s = hb.UniformBatchSampler(64, 8, world_size=4)
    assert s.rank == 0
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hb.UniformBatchSampler(64, 8, world_size=4, rank=3)  # explicit: no warning
        hb.UniformBatchSampler(64, 8, world_size=1)
        hb.UniformBatchSampler(64, 8)
