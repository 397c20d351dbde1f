"""GCBS step 1: the similarity threshold, the ``quantile`` of the off-diagonal ``S = X Y^T``.

:func:`similarity_threshold` estimates it from sampled rows (no N x N matrix is formed; exact
when the sample covers every row), on any torch device and in any precision of
:func:`hardbatch.batching.gcbs.gcbs_permutation`. Step 2 (:mod:`hardbatch.batching.gcbs.pairs`) keeps the pairs
above it (gcbs paper, eq. 5).
"""

from __future__ import annotations

import numpy as np
import torch

from ... import _rng
from ..._device import BLOCK_ELEMENTS_CPU, Precision, check_precision, matmul_fp32, resolve_device

__all__ = ["QUANTILE_SAMPLE", "similarity_threshold"]

#: Entries of ``S`` sampled for the quantile (20M fp32 values: 80 MB).
QUANTILE_SAMPLE = 20_000_000


def similarity_threshold(x: np.ndarray, y: np.ndarray, quantile: float, seed: int = 0,
                         sample_size: int = QUANTILE_SAMPLE, *,
                         device: str | torch.device | None = None,
                         precision: Precision = "fp32") -> float:
    """Estimate the ``quantile`` of the off-diagonal entries of ``x @ y.T`` from sampled rows.

    Rows are drawn without replacement until about ``sample_size`` entries are
    covered (all rows when N is small, then the value is exact). ``device`` and
    ``precision`` as in :func:`gcbs_permutation`. Memory: the sampled
    similarities (``sample_size`` floats, 80 MB) on ``device``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> u = torch.nn.functional.normalize(x, dim=1).numpy()  # unit rows, float32
        >>> from hardbatch.batching.gcbs import similarity_threshold
        >>> # 1200 of the 1560 ordered pairs lie across clusters (cosine about 0), 360 inside (about
        >>> # 1): the 0.769 quantile is the largest cosine across clusters
        >>> round(similarity_threshold(u, u, quantile=0.769), 1)
        0.6
    """
    n = x.shape[0]
    dev, dtype = resolve_device(device), check_precision(precision)
    rows_needed = min(n, max(1, -(-sample_size // max(1, n - 1))))
    rows = np.sort(_rng.permutation(n, _rng.derive_seed(seed, 0x0A17))[:rows_needed])
    xt = torch.from_numpy(x).to(dev, dtype)
    yt = xt if y is x else torch.from_numpy(y).to(dev, dtype)
    values = []
    per = max(1, BLOCK_ELEMENTS_CPU // n)
    for s in range(0, len(rows), per):
        r = torch.from_numpy(rows[s:s + per]).to(dev)
        sims = matmul_fp32(xt[r], yt.T)
        sims[torch.arange(len(r), device=dev), r] = -torch.inf  # self pairs: smallest, skipped
        values.append(sims.reshape(-1))
    total = sum(v.numel() for v in values)
    count = total - len(rows)
    k = int(np.clip(np.ceil(quantile * count), 1, count)) + len(rows)
    top = total - k + 1  # the value sought is the top-th largest sampled similarity
    if total >= 1 << 20 and top <= total // 64:
        # Select among the values above a bound that about 4 * top of them pass (from every
        # 16th value): the same value as a selection over all of them, several times faster
        # (a full kthvalue over 20M floats took 0.4 s of a 1 s build at N = 20k).
        every = torch.cat([v[::16] for v in values])
        keep = min(every.numel(), 4 * top // 16 + 64)
        bound = every.kthvalue(every.numel() - keep + 1).values
        above = torch.cat([v[v >= bound] for v in values])
        if above.numel() >= top:
            return _threshold(above, above.kthvalue(above.numel() - top + 1).values)
    values = torch.cat(values)
    return _threshold(values, values.kthvalue(k).values)


def _threshold(values: torch.Tensor, value: torch.Tensor) -> float:
    """The threshold for the quantile's ``value``: halfway between it and the next sampled
    similarity above it by more than a gap (``value + gap`` when none is), so that pairs equal
    to the quantile's value stay below it, as in the paper (``sims > value``). The gap, 1e-5,
    is far above the rounding differences of float32 products between BLAS kernels and
    blockings (about 1e-7 for unit rows): every sampled pair lies at least half a gap from the
    threshold, and ``sims > threshold`` decides it the same way whatever product computed it
    (another block, kernel or machine). Where the sample is the whole matrix (N up to 3,162 at
    the default sample size) the pairs are machine-independent."""
    gap = 1e-5 * max(1.0, abs(float(value)))
    higher = values[values > value + gap]
    high = float(value) + gap if not higher.numel() else float(higher.min())
    return float(np.float32((float(value) + high) / 2))
