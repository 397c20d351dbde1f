"""GCBS step 3: the order of the items, and the order's variants.

- :func:`rcm_order`: the symmetrised pattern of the pairs of step 2, randomly relabelled, in
  reverse Cuthill-McKee order (``scipy.sparse.csgraph.reverse_cuthill_mckee``, the bandwidth
  heuristic of the gcbs paper, section 5.2): batches cut sequentially from it hold strong pairs.
- :class:`PartitionLayout` (``method="partition"``, millions of items): steps 2-3 within coarse
  spherical k-means cells, cells chained by centroid similarity.
- :func:`interleave_chunks` (``interleave=c``; :func:`default_interleave`): chunks of c
  consecutive items of the order dealt apart, so no batch is one dense region.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import reverse_cuthill_mckee

from ... import _rng
from ..._device import resolve_device
from ..._logging import NO_BAR, BuildLog
from ..._validation import check_int
from ...neighbors.kmeans import nearest_centroid, spherical_kmeans
from .pairs import PairSearchLayout, check_min_partners

__all__ = ["PartitionLayout", "default_interleave", "interleave_chunks", "rcm_order"]


def default_interleave(batch_size: int) -> int:
    """Chunk length for batches of B items: B / 8 (8 chunks per batch), at least 8; 0 below 16.

    Chosen on the exploration sets of docs/gcbs.md (B = 256): the shortest chunk costing at
    most 3% of the batch hardness of the uninterleaved order (32).

    Example:
        >>> from hardbatch.batching.gcbs import default_interleave
        >>> default_interleave(256), default_interleave(64), default_interleave(8)
        (32, 8, 0)
    """
    b = check_int(batch_size, "batch_size", low=1)
    return 0 if b < 16 else max(8, b // 8)


def rcm_order(rows: np.ndarray, cols: np.ndarray, n: int, seed: int,
              log: BuildLog | None = None) -> torch.Tensor:
    """Step 3: symmetrised pattern, seeded random relabelling, reverse Cuthill-McKee.

    ``log``: the build's :class:`~hardbatch._logging.BuildLog`, told the bytes held here.

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.gcbs import rcm_order
        >>> rows, cols = np.array([0, 2, 4, 1]), np.array([2, 4, 1, 3])  # the path 0-2-4-1-3
        >>> rcm_order(rows, cols, 5, seed=0).tolist() in ([0, 2, 4, 1, 3], [3, 1, 4, 2, 0])
        True
    """
    # Random relabelling: RCM breaks ties (start node, equal degrees) by label.
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.empty(n, np.int64)
    inverse[relabel] = np.arange(n)
    r, c = inverse[rows], inverse[cols]
    adj = sp.coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(n, n)).tocsr()
    sym = (adj + adj.T).tocsr()
    if log is not None:
        log.hold(rows.nbytes, cols.nbytes, r.nbytes, c.nbytes,
                 *(a.nbytes for m in (adj, sym) for a in (m.data, m.indices, m.indptr)))
    order = reverse_cuthill_mckee(sym, symmetric_mode=True)
    return torch.from_numpy(relabel[np.asarray(order, np.int64)])


class PartitionLayout:
    """Partitioned GCBS: coarse k-means cells, exact pairs + RCM within each, cells chained.

    Items are put in the cell of their nearest centroid (spherical k-means on ``y``,
    :func:`~hardbatch.neighbors.kmeans.spherical_kmeans`); cells are visited along a greedy
    nearest-centroid chain from cell 0, so consecutive cells are similar; within a cell the
    pairs above the global ``threshold`` are found exactly and ordered by
    reverse Cuthill-McKee (:func:`rcm_order`). Pairs across cells are dropped.
    Cost about N^2 d / P for P balanced cells, memory O(N*d + nnz of one cell).
    With ``partitions=1`` this is exactly the ``"exact"`` method.

    The cells are independent: :meth:`order` returns the order of the items of
    chain positions [start, end), so ranks can share them
    (:func:`hardbatch.batching.gcbs.sharded_gcbs_permutation`); :meth:`shard` cuts the
    chain into contiguous ranges of about equal cost (sum of squared cell sizes).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> from hardbatch.batching.gcbs import PartitionLayout
        >>> x = torch.eye(8)[torch.arange(40) % 4] + 0.05 * torch.randn(40, 8)  # 4 clusters of 10
        >>> u = torch.nn.functional.normalize(x, dim=1).numpy()  # unit rows, float32
        >>> layout = PartitionLayout(u, u, 0.5, partitions=2, seed=0, device=None,
        ...                          precision="fp32", min_partners=0)
        >>> len(layout.chain), layout.shard(0, 2), layout.shard(1, 2)  # two cells, one per rank
        (2, (0, 1), (1, 2))
        >>> order = layout.order(0, len(layout.chain))
        >>> [len(set((batch % 4).tolist())) for batch in order.reshape(4, 10)]
        [1, 1, 1, 1]
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, threshold: float, partitions: int,
                 seed: int, device, precision: str, min_partners: int | None = None) -> None:
        self.x, self.y, self.threshold, self.seed = x, y, threshold, seed
        self.device, self.precision = device, precision
        self.min_partners = check_min_partners(min_partners, x.shape[0])
        n = x.shape[0]
        if partitions == 1:
            cell = torch.zeros(n, dtype=torch.int64)
            sim = torch.ones(1, 1)
        else:
            dev = resolve_device(device)
            cent = spherical_kmeans(torch.from_numpy(y).to(dev), partitions, seed)
            cell = nearest_centroid(torch.from_numpy(x).to(cent.device), cent).cpu()
            sim = (cent @ cent.T).cpu()
        sim = sim.double().numpy()
        chain, seen = [0], np.zeros(partitions, bool)
        seen[0] = True
        for _ in range(partitions - 1):  # greedy chain: next, the most similar cell not yet seen
            row = np.where(seen, -np.inf, sim[chain[-1]])
            chain.append(int(np.argmax(row)))  # ties: the lowest cell
            seen[chain[-1]] = True
        self.adopt(cell, torch.tensor(chain, dtype=torch.int64))

    def adopt(self, cell: torch.Tensor, chain: torch.Tensor) -> None:
        """Use these cells [N] and this chain [P] (e.g. rank 0's, broadcast to every rank)."""
        partitions = len(chain)
        self.cell, self.chain = cell.cpu(), [int(c) for c in chain.tolist()]
        self.members = torch.argsort(self.cell, stable=True).numpy()
        self.start = np.zeros(partitions + 1, np.int64)
        self.start[1:] = np.cumsum(np.bincount(self.cell.numpy(), minlength=partitions))


    def shard(self, rank: int, world: int) -> tuple[int, int]:
        """Chain positions [start, end) of ``rank``: contiguous, about equal sum of size^2."""
        sizes = np.array([self.start[c + 1] - self.start[c] for c in self.chain], np.float64)
        cost = np.concatenate([[0.0], np.cumsum(sizes ** 2)])
        cuts = np.searchsorted(cost, cost[-1] * np.arange(world + 1) / world, side="left")
        cuts[0], cuts[-1] = 0, len(self.chain)
        cuts = np.maximum.accumulate(cuts)
        return int(cuts[rank]), int(cuts[rank + 1])

    def order(self, start: int, end: int, bar=NO_BAR, log: BuildLog | None = None) -> np.ndarray:
        """Items of chain positions [start, end), each cell in its RCM order, int64.

        Within a cell, ``min_partners`` are the strongest pairs inside the cell.
        ``bar.update(1)`` per cell; ``log`` is told the bytes held per cell. On the CPU
        ``torch.get_num_threads()`` worker threads share the cells, each running its cells'
        products single-threaded (the order does not depend on it).
        """
        cells = self.chain[start:end]
        threads = torch.get_num_threads()
        if resolve_device(self.device).type != "cpu" or threads < 2 or len(cells) < 2:
            parts = [self._cell_order(c, bar, log) for c in cells]
        else:
            def work(c):
                torch.set_num_threads(1)  # this thread's products (OpenMP/MKL: thread-local)
                return self._cell_order(c, bar, log)

            try:
                with ThreadPoolExecutor(threads) as pool:
                    parts = list(pool.map(work, cells))
            finally:
                torch.set_num_threads(threads)  # the default for threads started later
        return np.concatenate([np.empty(0, np.int64), *parts]).astype(np.int64, copy=False)

    def _cell_order(self, c: int, bar, log: BuildLog | None) -> np.ndarray:
        """The items of cell c in their RCM order."""
        idx = self.members[self.start[c]:self.start[c + 1]]
        bar.update(1)
        if len(idx) <= 1:
            return idx
        xs = np.ascontiguousarray(self.x[idx])
        ys = xs if self.y is self.x else np.ascontiguousarray(self.y[idx])
        pairs = PairSearchLayout(xs, ys, self.threshold, "exact", nlist=None, nprobe=1,
                                 seed=0, device=self.device, precision=self.precision,
                                 min_partners=min(self.min_partners, len(idx) - 1))
        rows, cols = pairs.pairs(0, pairs.num_units)
        if log is not None:
            log.hold(pairs.block_bytes + xs.nbytes + ys.nbytes, rows.nbytes, cols.nbytes)
        seed = self.seed if len(self.chain) == 1 else _rng.derive_seed(self.seed, c)
        return idx[rcm_order(rows, cols, len(idx), seed, log).numpy()]


def interleave_chunks(order: np.ndarray | torch.Tensor, chunk: int) -> np.ndarray:
    """Cut ``order`` into chunks of ``chunk`` consecutive items and deal the chunks apart.

    Chunk j of the result is chunk ``(j * s) mod C`` of ``order`` (C chunks, s the integer
    nearest to C / golden ratio that is coprime with C): consecutive chunks come from far
    apart in ``order`` (a low-discrepancy sequence), so any batch of ``B >= 2 * chunk``
    consecutive items holds about ``B / chunk`` chunks from different regions. Each item
    keeps the neighbours it has inside its chunk (the batch stays hard) while the chunks of
    a dense region (near-duplicates) spread over many batches (docs/gcbs.md). ``chunk=0``
    or ``chunk >= N`` returns ``order`` unchanged. Returns int64 [N].

    Example:
        >>> import numpy as np
        >>> from hardbatch.batching.gcbs import interleave_chunks
        >>> interleave_chunks(np.arange(12), 3)  # 4 chunks of 3, dealt in the order 0, 3, 2, 1
        array([ 0,  1,  2,  9, 10, 11,  6,  7,  8,  3,  4,  5])
    """
    order = np.asarray(order, np.int64)
    chunk = check_int(chunk, "interleave", low=0)
    n = len(order)
    if chunk == 0 or chunk >= n:
        return order
    count = -(-n // chunk)
    step = max(1, round(count / 1.618033988749895))
    while np.gcd(step, count) != 1:
        step += 1
    starts = (np.arange(count) * step % count) * chunk
    lengths = np.minimum(chunk, n - starts)
    idx = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(n)
    return order[idx]
