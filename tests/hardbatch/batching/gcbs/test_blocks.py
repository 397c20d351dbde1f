"""The compiled selection of one similarity block (hardbatch.batching.gcbs.blocks) against the
torch selection it replaced."""

import numpy as np
import pytest
import torch
from support import unit_rows

from hardbatch.batching import gcbs


def torch_block_pairs(sims, self_col, threshold, k):
    """The selection of one block before issue 33: -inf on self, mask, nonzero, topk."""
    sims = sims.clone()
    mine = torch.nonzero(self_col >= 0).squeeze(1)
    sims[mine, self_col[mine]] = -torch.inf
    r, c = torch.nonzero(sims > threshold, as_tuple=True)
    if k:
        r2, c2 = gcbs.strongest_partners(sims, r, k, threshold)
        r, c = torch.cat([r, r2]), torch.cat([c, c2])
    return set(zip(r.tolist(), c.tolist()))


@pytest.mark.parametrize("k", [0, 1, 16])
@pytest.mark.parametrize("copies", [1, 3])
def test_compiled_block_selection_equals_torch(rng, k, copies):
    """block_pairs (one pass, CPU) gives the torch selection's pairs, exact ties included
    (rows whose partners tie at the boundary go to the torch path in PairSearchLayout)."""
    from hardbatch.batching.gcbs.blocks import block_pairs

    x = np.repeat(unit_rows(rng, 300 // copies, 5), copies, axis=0)  # copies: exact ties
    y = x[rng.permutation(300)[:250]]
    sims = torch.from_numpy(x[:120] @ y.T)
    self_col = torch.from_numpy(np.where(rng.random(120) < 0.5, rng.integers(0, 250, 120), -1))
    threshold = float(np.float32(np.quantile(sims.numpy(), 0.97)))
    rows, cols, tied = block_pairs(sims, self_col.numpy(), threshold, k)
    want = torch_block_pairs(sims, self_col, threshold, k)
    got = set(zip(rows.tolist(), cols.tolist()))
    assert len(got) == len(rows)
    tied_rows = set(tied.tolist())  # hits only: their partners are the caller's
    assert got == {(i, j) for i, j in want if i not in tied_rows or sims[i, j] > threshold}
    assert len(tied) == 0 or (k > 0 and copies > 1)  # ties only among copies
    layout = gcbs.PairSearchLayout(x, x, threshold, "exact", nlist=None, nprobe=1, seed=0,
                               device=None, precision="fp32", min_partners=k)
    full = torch.from_numpy(x @ x.T)
    r, c = layout._hits(full.clone(), torch.arange(300))
    assert set(zip(r.tolist(), c.tolist())) == torch_block_pairs(full, torch.arange(300),
                                                                 threshold, k)
