"""One rank of the gathered-negatives test (tests/hardbatch/losses/test_gather.py); run it with

    PYTHONPATH=tests torchrun --standalone --nproc_per_node=2 tests/hardbatch/losses/gather_worker.py

On gloo (CPU), float64: a tiny linear encoder under DistributedDataParallel, every loss with
``gather=True`` (both forms; labels, false_negatives, extra negatives, SSCL's random synthetic
negatives; mean and sum), ranks holding different batch sizes (one of them possibly empty), against
one process computing the same loss on the concatenated global batch: the parameter gradients
after DDP's averaging agree to 1e-9 and the ranks' loss values average to the global loss.
Also: guided_mask(gather=True) is the global mask's rows of this rank; the sentence-transformers
adapter with a guide and gather; ``group=`` (a subgroup of two ranks); bad input (different embedding dims, one rank's NaN, a mask of
the wrong shape) raises a ValueError on every rank, after which the ranks still work together.
Each rank prints ``RANK r OK``; any failed check raises.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hardbatch as hb
from hardbatch.integrations.sentence_transformers import SentenceTransformerLoss
from support import end_torchrun_worker

D_IN, D = 6, 4
SIZES = {2: [5, 3], 3: [4, 0, 3]}  # uneven local batch sizes (a short or empty last batch)
NEG_SIZES = {2: [2, 0], 3: [1, 2, 0]}  # hard negatives per rank (a rank without any)
TOL = 1e-9


def global_data(world: int):
    gen = torch.Generator().manual_seed(7)
    total, neg = sum(SIZES[world]), sum(NEG_SIZES[world])
    x1 = torch.randn(total, D_IN, generator=gen, dtype=torch.float64)
    x2 = x1 + 0.3 * torch.randn(total, D_IN, generator=gen, dtype=torch.float64)
    xn = torch.randn(neg, D_IN, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 3, (total,), generator=gen)
    mask = torch.rand(total, total, generator=gen) < 0.3
    return x1, x2, xn, labels, mask


def local_slice(sizes: list[int], rank: int) -> slice:
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


CASES = [  # (loss function, options)
    (hb.info_nce, {}),
    (hb.info_nce, {"reduction": "sum", "temperature": 0.2}),
    (hb.debiased_info_nce, {"tau_plus": 0.1}),
    (hb.hard_negative_info_nce, {"tau_plus": 0.1, "beta": 1.0}),
    (hb.sscl_loss, {"hardest": 4, "synthetic": 3}),
]


def check_ddp_gradients(rank: int, world: int) -> int:
    """Every case x form x input variant: DDP(gather=True) == one process on the global batch."""
    x1, x2, xn, labels, mask = global_data(world)
    sl, nsl = local_slice(SIZES[world], rank), local_slice(NEG_SIZES[world], rank)
    torch.manual_seed(0)
    encoder = torch.nn.Linear(D_IN, D, dtype=torch.float64)
    reference = copy.deepcopy(encoder)  # one process, plain autograd
    ddp = DistributedDataParallel(encoder)
    checked = 0
    for fn, options in CASES:
        for form in ("simclr", "simcse"):
            for variant in ("plain", "labels", "mask", "labels+mask+negatives"):
                kw = dict(options, form=form)
                glob, loc = dict(kw), dict(kw)
                if "labels" in variant:
                    glob["labels"], loc["labels"] = labels, labels[sl]
                if "mask" in variant:
                    glob["false_negatives"], loc["false_negatives"] = mask, mask[sl]
                if fn is hb.sscl_loss:
                    glob["generator"] = torch.Generator().manual_seed(5)
                    loc["generator"] = torch.Generator().manual_seed(5)
                use_neg = "negatives" in variant
                ddp.zero_grad()
                b, m = SIZES[world][rank], NEG_SIZES[world][rank] if use_neg else 0
                z = ddp(torch.cat([x1[sl], x2[sl], xn[nsl][:m]]))  # one DDP forward
                value = fn(z[:b], z[b:2 * b], negatives=z[2 * b:] if m else None, gather=True,
                           **loc)
                value.backward()
                reference.zero_grad()
                z = reference(torch.cat([x1, x2, xn]))
                total = x1.shape[0]
                expected = fn(z[:total], z[total:2 * total],
                              negatives=z[2 * total:] if use_neg else None, **glob)
                expected.backward()
                for p, q in zip(encoder.parameters(), reference.parameters()):
                    err = (p.grad - q.grad).abs().max().item()
                    assert err <= TOL, (fn.__name__, form, variant, err)
                mean_value = value.detach().clone()
                dist.all_reduce(mean_value)
                assert abs(mean_value.item() / world - expected.item()) <= TOL, (
                    fn.__name__, form, variant, mean_value.item() / world, expected.item())
                checked += 1
    return checked


def check_guided_mask(rank: int, world: int) -> None:
    gen = torch.Generator().manual_seed(3)
    total = sum(SIZES[world])
    ga = torch.randn(total, 5, generator=gen)
    gp = ga + 0.8 * torch.randn(total, 5, generator=gen)
    sl = local_slice(SIZES[world], rank)
    for form in ("simcse", "simclr"):
        for margin in (0.0, 0.3):
            got = hb.guided_mask(ga[sl], gp[sl], margin, form=form, gather=True)
            want = hb.guided_mask(ga, gp, margin, form=form)[sl]
            assert torch.equal(got, want), (form, margin)
    assert bool(hb.guided_mask(ga, gp, 0.3).any())  # the mask is not trivially empty


def check_adapter(rank: int, world: int) -> None:
    """SentenceTransformerLoss(gather=True, guide=...) on precomputed columns == one process."""
    x1, x2, _, _, _ = global_data(world)
    sl = local_slice(SIZES[world], rank)
    guide_a, guide_b = x1[:, :D] * 2.0, x2[:, :D] + 0.5  # a fixed "guide model"'s embeddings
    loss = SentenceTransformerLoss(torch.nn.Identity(), "infonce", scale=5.0, margin=0.1,
                                   gather=True)
    single = SentenceTransformerLoss(torch.nn.Identity(), "infonce", scale=5.0, margin=0.1)
    a, p = x1[sl, :D].clone().requires_grad_(), x2[sl, :D].clone().requires_grad_()
    value = loss.compute_loss_from_embeddings([a, p], None, [guide_a[sl], guide_b[sl]])
    value.backward()
    ga, gp = x1[:, :D].clone().requires_grad_(), x2[:, :D].clone().requires_grad_()
    expected = single.compute_loss_from_embeddings([ga, gp], None, [guide_a, guide_b])
    # the gradient of sum over ranks of value = world * the global loss's gradient
    (expected * world).backward()
    mean_value = value.detach().clone()
    dist.all_reduce(mean_value)
    assert abs(mean_value.item() / world - expected.item()) <= TOL
    # Rows of the global gradient: the gather's backward sums every rank's share into them.
    torch.testing.assert_close(a.grad, ga.grad[sl], rtol=0, atol=TOL)
    torch.testing.assert_close(p.grad, gp.grad[sl], rtol=0, atol=TOL)


def check_subgroup(rank: int, world: int) -> None:
    """``group=``: ranks 0 and ``world - 1`` gather among themselves only."""
    members = [0, world - 1]
    group = dist.new_group(members)  # every rank takes part in creating it
    if rank not in members:
        return
    gen = torch.Generator().manual_seed(11)
    parts = [torch.randn(3 + r, 5, generator=gen, dtype=torch.float64) for r in members]
    mine = members.index(rank)
    z = parts[mine].clone().requires_grad_()
    value = hb.hard_negative_info_nce(z, z.flip(1), form="simcse", gather=True, group=group)
    value.backward()
    whole = torch.cat(parts).requires_grad_()
    expected = hb.hard_negative_info_nce(whole, whole.flip(1), form="simcse")
    (expected * len(members)).backward()
    rows = slice(sum(p.shape[0] for p in parts[:mine]), None)
    torch.testing.assert_close(z.grad, whole.grad[rows][:z.shape[0]], rtol=0, atol=TOL)


def expect_error_everywhere(call, match: str) -> None:
    try:
        call()
    except ValueError as exc:
        assert match in str(exc), str(exc)
    else:
        raise AssertionError(f"no ValueError (expected {match!r})")


def check_bad_input(rank: int, world: int) -> None:
    b = SIZES[world][0]
    gen = torch.Generator().manual_seed(rank)
    # Different embedding dims: every rank names every rank's shape, nobody hangs.
    z = torch.randn(b, 4 + rank, generator=gen)
    expect_error_everywhere(lambda: hb.info_nce(z, z + 1, gather=True), "rank 1: [")
    # One rank's bad input: its own error there, a pointer to it elsewhere.
    z = torch.randn(b, 4, generator=gen)
    bad = z.clone()
    if rank == 1:
        bad[0, 0] = float("nan")
    expect_error_everywhere(lambda: hb.info_nce(bad, z, gather=True),
                            "NaN" if rank == 1 else "rank(s) [1]")
    # A local [b, b] mask where the global batch's [b, B_global] one is needed.
    expect_error_everywhere(
        lambda: hb.info_nce(z, z + 1, gather=True,
                            false_negatives=torch.zeros(b, b, dtype=torch.bool)),
        f"[b, {b * world}]")
    expect_error_everywhere(lambda: hb.guided_mask(torch.randn(b, 3 + rank), torch.randn(
        b, 3 + rank), gather=True), "same guide embedding dim")
    # Still in step afterwards: a gathered module call (DCL's first-batch floor check gathers
    # too) equals the function.
    module = hb.DebiasedInfoNCE(0.5, 0.1, form="simcse", gather=True)
    value = module(z.requires_grad_(), z + 1)
    value.backward()
    assert module.floor_fraction is not None
    assert torch.equal(value, hb.debiased_info_nce(z, z + 1, form="simcse", gather=True))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    checked = check_ddp_gradients(rank, world)
    check_guided_mask(rank, world)
    check_adapter(rank, world)
    check_subgroup(rank, world)
    check_bad_input(rank, world)
    dist.barrier()
    print(f"RANK {rank} OK ({checked} gradient cases, world {world}, pid {os.getpid()})",
          flush=True)
    end_torchrun_worker()


if __name__ == "__main__":
    main()
