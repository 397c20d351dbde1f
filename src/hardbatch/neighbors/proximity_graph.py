"""The proximity graph (BatchSampler eq. 3): block layout and build, in one process or sharded.

:func:`proximity_graph` returns an int64 neighbour table [N, K] whose row ``i`` lists the K chosen
neighbours of item ``i`` by decreasing inner product (ties ordered as ``torch.topk`` orders them),
never ``i`` itself. Nothing of size N x N (or N x M x d) is ever materialised: work runs over
bounded blocks of groups. The candidate pools (groups of items sharing one pool, drawn from a
balanced design) come from :mod:`hardbatch.neighbors.proximity_pools`; :mod:`hardbatch.neighbors.knn_graph` re-exports
the public names of both modules.

Block layout (how the build runs)
---------------------------------
The embeddings are copied once in group order (``x[order]``, N*d floats): a group's own rows are
then one contiguous slice, and its pool is, but for the ~1/(2g) uniformly re-drawn slots, the
concatenation of M/g whole groups (``a + t_r``). A block of groups therefore gathers its
candidates as whole groups of g*d floats (memory copies, not N*M random rows), patches the
re-drawn slots, and runs one batched product [g, d] x [d, M] per group. On the CPU a compiled
kernel then selects each row's top K (a sampled bound keeps ~1.7 K of the M values, a bucket
sort orders them) and writes the neighbour ids straight into the table; worker threads share the
blocks, each running its products single-threaded. On other devices ``torch.topk`` selects. Rows
with tied values in their top K + 1 are re-selected by ``torch.topk``, so ties come out as there. The similarities are the same floats as those of a
per-group gather, so the graph does not depend on the blocking.

Devices, precision, shards
--------------------------
As for every graph of :mod:`hardbatch.neighbors.knn_graph`. Specific to this build: the pools are drawn on
the CPU by one seeded kernel whatever ``device`` is, so every device compares the same
candidates; a block holds whole groups, bounded so that its similarities and its gathered
candidate rows each stay under ~4M floats on the CPU (~64M on CUDA); the ranks of
:func:`sharded_proximity_graph` build contiguous ranges of blocks and reproduce the
single-process graph; half precision (``precision="bf16" | "fp16"``) may change neighbours
in near-ties.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit

from .._device import Precision, block_elements, check_precision, matmul_fp32, resolve_device
from .._logging import NO_BAR, BuildLog, get_logger, progress_bar
from .._sorted import insert_descending
from .._validation import check_int, embedding_tensor
from ..distributed import all_gather_rows, rank_share
from .proximity_pools import check_graph_sizes, check_group_size, default_group_size, pool_design

__all__ = ["ProximityGraphLayout", "proximity_graph", "sharded_proximity_graph"]

_LOG = get_logger("neighbors")


_SAMPLE = 64  # similarities per row sampled for the top-k bound


@njit(cache=True, nogil=True)
def _top_rows(sims, dest_rows, pools, g, k, out, tied):
    """Top k of every row of ``sims`` [rows, M]: ``out[dest_rows[r]]`` = their pool ids.

    Row r belongs to pool ``r // g``; rows with ``dest_rows[r] < 0`` are skipped. Order: by
    decreasing value. A bound from a strided sample of the row keeps about 1.7 k of its M
    values (all of them when that keeps fewer than k); the kept ones are bucket-sorted by
    value, and the buckets up to the k-th value are insertion-sorted. A row whose top k + 1
    values hold two equal ones gets ``tied[r] = 1`` (its ties are ordered by position here;
    the caller re-selects it with ``torch.topk``, whose tie order it must match).
    """
    m = sims.shape[1]
    nb = 16
    while nb < 2 * k:
        nb *= 2
    keep = np.empty(m, np.int32)
    kval = np.empty(m, np.float32)
    bucket = np.empty(m, np.int32)
    spos = np.empty(m, np.int32)
    sval = np.empty(m, np.float32)
    count = np.empty(nb + 1, np.int32)
    top = np.empty(_SAMPLE, np.float32)
    sampled = m >= 4 * _SAMPLE and 4 * k <= m
    step = max(1, m // _SAMPLE)
    rank = min(_SAMPLE, (_SAMPLE * k * 3) // (2 * m) + 3)
    for r in range(sims.shape[0]):
        dest = dest_rows[r]
        if dest < 0:
            continue
        s = sims[r]
        c = 0
        if sampled:  # bound: the rank-th largest of _SAMPLE strided values
            nt = 0
            for i in range(_SAMPLE):
                v = s[i * step]
                if nt < rank:
                    j = nt
                    nt += 1
                elif v > top[rank - 1]:
                    j = rank - 1
                else:
                    continue
                while j > 0 and top[j - 1] < v:
                    top[j] = top[j - 1]
                    j -= 1
                top[j] = v
            bound = top[rank - 1]
            for i in range(m):  # branch-free compaction
                v = s[i]
                keep[c] = i
                kval[c] = v
                c += v >= bound
        if c < k:  # every value (small M, or a bound that kept too few)
            for i in range(m):
                keep[i] = i
                kval[i] = s[i]
            c = m
        lo = kval[0]
        hi = kval[0]
        for i in range(c):
            lo = min(lo, kval[i])
            hi = max(hi, kval[i])
        span = np.float64(hi) - np.float64(lo)
        scale = (nb - 1) / span if span > 0 and span < np.inf else 0.0
        count[:] = 0
        for i in range(c):  # bucket: monotone in the value (0 holds the largest)
            f = (np.float64(hi) - np.float64(kval[i])) * scale
            b = min(nb - 1, int(f)) if f > 0 else 0
            bucket[i] = b
            count[b + 1] += 1
        for b in range(nb):
            count[b + 1] += count[b]
        limit = c
        for b in range(nb):  # the buckets holding the top k
            if count[b + 1] >= k:
                limit = count[b + 1]
                break
        for i in range(c):  # stable counting sort by bucket
            b = bucket[i]
            spos[count[b]] = keep[i]
            sval[count[b]] = kval[i]
            count[b] += 1
        for i in range(1, limit):  # stable insertion sort (buckets are nearly sorted)
            insert_descending(sval, spos, i, sval[i], spos[i])
        grp = r // g
        for j in range(k):
            out[dest, j] = pools[grp, spos[j]]
        for j in range(min(k, limit - 1)):
            if sval[j] == sval[j + 1]:
                tied[r] = 1
                break


@njit(cache=True, nogil=True)
def _gather_pools(grouped, emb, s, e, offsets, g, redrawn, pools, cand):
    """``cand[a - s]`` = the candidate rows of pool a, for the groups a in [s, e).

    ``grouped`` [G*g, d] holds the rows in group order, so the slots dealt in round r
    are the g rows of group ``(a + offsets[r]) % G``; the ``redrawn`` slots (flat
    positions ``a*M + slot``, those of [s, e) only) take their item's row of ``emb``.
    """
    m = cand.shape[1]
    n_groups = grouped.shape[0] // g
    rounds = offsets.shape[0]
    src = np.empty(4, np.int64)
    for a in range(s, e):
        for r0 in range(0, rounds, 4):  # 4 rounds at a time: 4 memory streams in flight
            q = min(4, rounds - r0)
            for t in range(q):
                src[t] = ((a + offsets[r0 + t]) % n_groups) * g
            for j in range(g):
                for t in range(q):
                    slot = (r0 + t) * g + j
                    if slot < m:
                        cand[a - s, slot] = grouped[src[t] + j]
    for f in redrawn:
        a = f // m
        cand[a - s, f - a * m] = emb[pools[a, f - a * m]]


class ProximityGraphLayout:
    """Validated inputs, candidate pools and block layout of one proximity-graph build.

    Shared by :func:`proximity_graph` (all blocks) and :func:`sharded_proximity_graph` (one
    contiguous range of blocks per rank): both run :meth:`rows` on the same blocks, so the
    sharded graph equals the single-process one.

    Example:
        >>> import torch
        >>> from hardbatch.neighbors.proximity_graph import ProximityGraphLayout
        >>> layout = ProximityGraphLayout(torch.randn(40, 8), 20, 5, 0, None, None, "fp32")
        >>> layout.rows(0, layout.num_blocks).shape
        torch.Size([40, 5])
    """

    def __init__(self, embeddings, candidates: int, neighbors: int, seed: int,
                 group_size: int | None, device, precision: str) -> None:
        x = embedding_tensor(embeddings)
        self.candidates = check_int(candidates, "candidates", low=1)
        self.neighbors = check_int(neighbors, "neighbors", low=1)
        n = x.shape[0]
        if n < 2:
            raise ValueError(f"embeddings has N={n} item(s); a neighbour graph needs at least 2")
        check_graph_sizes(self.candidates, self.neighbors, n)
        g = check_group_size(group_size, self.candidates, n)
        g = default_group_size(self.candidates, n) if g is None else g
        self.device = resolve_device(device)
        self.dtype = check_precision(precision)
        design = pool_design(n, self.candidates, g, seed)
        self.num_items = n
        self.members = torch.from_numpy(design["members"])
        self.pools = torch.from_numpy(design["pools"])
        self.offsets = torch.from_numpy(design["offsets"])
        self.redrawn = torch.from_numpy(design["redrawn"])
        self.n_groups, self.g = self.members.shape
        self.width = self.offsets.numel() * self.g  # gathered slots per pool (M rounded up)
        # A block of groups holds blk*g*M similarities and blk*M gathered candidate rows of
        # d floats: bound both. Each group's product is its own (batched) matmul, so on CPU
        # the graph does not depend on the blocking (tested); on CUDA a batched product of
        # another batch count may pick another kernel (near-ties could then differ).
        self.per_block = max(1, block_elements(self.device)
                             // (self.width * max(self.g, x.shape[1])))
        self.num_blocks = -(-self.n_groups // self.per_block)
        self.x = x
        self.block_bytes = 0  # largest block so far: similarities, gathered rows, top-k

    def grouped(self) -> torch.Tensor:
        """The embeddings in group order on ``device`` ([G*g, d]; zero rows pad the last group)."""
        n, d = self.x.shape
        out = torch.empty((self.members.numel(), d), dtype=self.dtype, device=self.device)
        out[n:] = 0
        order = self.members.reshape(-1)[:n].to(self.device)  # the padding is at the end
        if self.x.dtype == self.dtype:
            torch.index_select(self.x.to(self.device), 0, order, out=out[:n])
        else:
            out[:n] = torch.index_select(self.x.to(self.device), 0, order)
        return out

    def rows(self, block_start: int, block_end: int, out: torch.Tensor | None = None,
             bar=NO_BAR) -> torch.Tensor:
        """Neighbour rows [n_items, K] (CPU int64) of the items of blocks [start, end), in group order.

        With ``out`` ([N, K]) the rows are written into it in place (no second copy)
        and ``out`` is returned. ``bar.update(1)`` after each block. On the CPU, blocks
        are shared by ``torch.get_num_threads()`` worker threads, each running its
        blocks' products single-threaded (no fine-grained synchronisation).
        """
        g, k = self.g, self.neighbors
        flat = self.members.reshape(-1)
        if out is None:  # rows of valid members, in group order
            s0 = min(self.n_groups, block_start * self.per_block) * g
            span = flat[s0:min(self.n_groups, block_end * self.per_block) * g]
            dest = torch.full_like(span, -1)
            dest[span >= 0] = torch.arange(int((span >= 0).sum()))
            table = torch.empty((int((span >= 0).sum()), k), dtype=torch.int64)
        else:
            s0, dest, table = 0, flat, out
        ctx = (self.x.to(self.device, self.dtype), self.grouped(), dest, s0, table)
        blocks = iter(range(block_start, block_end))
        default = torch.get_num_threads()
        threads = max(1, min(default, block_end - block_start)) if self.device.type == "cpu" else 1
        if threads == 1:
            bufs = {}
            for b in blocks:
                self._block(b, *ctx, bufs)
                bar.update(1)
            return table
        lock = threading.Lock()

        def work():
            torch.set_num_threads(1)  # this thread's products (OpenMP/MKL: thread-local)
            bufs = {}
            while True:
                with lock:
                    b = next(blocks, None)
                if b is None:
                    return
                self._block(b, *ctx, bufs)
                bar.update(1)

        try:
            with ThreadPoolExecutor(threads) as pool:
                for job in [pool.submit(work) for _ in range(threads)]:
                    job.result()
        finally:
            torch.set_num_threads(default)  # the default for threads started later
        return table

    def _gather(self, s: int, e: int, emb, grouped, bufs: dict) -> torch.Tensor:
        """Candidate embeddings [e - s, M, d] of groups [s, e): whole partner groups, then the
        re-drawn slots' own rows (CPU: one compiled copy into a reused buffer)."""
        m, dev = self.candidates, self.device
        lo, hi = np.searchsorted(self.redrawn.numpy(), [s * m, e * m])
        if dev.type == "cpu":
            shape = (self.per_block, m, grouped.shape[1])
            if "cand" not in bufs:
                bufs["cand"] = torch.empty(shape, dtype=grouped.dtype)
            cand = bufs["cand"][:e - s]
            ints = torch.int32 if grouped.element_size() == 4 else torch.int16
            _gather_pools(grouped.view(ints).numpy(), emb.view(ints).numpy(), s, e,
                          self.offsets.numpy(), self.g, self.redrawn[lo:hi].numpy(),
                          self.pools.numpy(), cand.view(ints).numpy())
            return cand
        partners = (torch.arange(s, e)[:, None] + self.offsets) % self.n_groups
        cand = torch.index_select(grouped.view(self.n_groups, -1), 0,
                                  partners.reshape(-1).to(dev)).view(e - s, self.width, -1)
        if self.width != m:
            cand = cand[:, :m].contiguous()
        if hi > lo:  # slots filled by a uniform draw: their own rows
            flat = self.redrawn[lo:hi]
            slot = (flat // m - s).to(dev), (flat % m).to(dev)
            cand[slot] = emb[self.pools.reshape(-1)[flat].to(dev, torch.int64)]
        return cand

    def _block(self, b: int, emb, grouped, dest, s0: int, table, bufs: dict) -> None:
        """Rows of block b into ``table[dest[row]]``: gather, product, top k."""
        m, k, g, dev = self.candidates, self.neighbors, self.g, self.device
        s = b * self.per_block
        e = min(self.n_groups, s + self.per_block)
        blk = e - s
        pools = self.pools[s:e]
        cand = self._gather(s, e, emb, grouped, bufs)
        sims = matmul_fp32(grouped[s * g:e * g].view(blk, g, -1), cand.transpose(1, 2))
        sims = sims.view(blk * g, m)
        rows_dest = dest[s * g - s0:e * g - s0]
        nbytes = sims.nbytes + cand.nbytes
        if dev.type == "cpu":  # compiled selection; rows with ties: torch.topk's order below
            tied = np.zeros(blk * g, np.uint8)
            _top_rows(sims.numpy(), rows_dest.numpy(), pools.numpy(), g, k, table.numpy(), tied)
            rows = torch.from_numpy(np.flatnonzero(tied))
        else:
            rows = torch.nonzero(rows_dest >= 0).squeeze(1)
        if len(rows):
            top = sims[rows.to(dev)].topk(k, dim=1, sorted=True).indices
            ids = torch.gather(pools.to(dev, torch.int64)[(rows // g).to(dev)], 1, top)
            table[rows_dest[rows]] = ids.cpu()
            nbytes += top.nbytes + ids.nbytes
        self.block_bytes = max(self.block_bytes, nbytes)

    def assemble(self, rows: torch.Tensor) -> torch.Tensor:
        """Scatter rows of all blocks, in group order, into the [N, K] table."""
        flat = self.members.reshape(-1)
        out = torch.empty((self.num_items, self.neighbors), dtype=torch.int64)
        out[flat[flat >= 0]] = rows
        return out


def proximity_graph(embeddings: torch.Tensor | np.ndarray, candidates: int = 1000,
                    neighbors: int = 100, seed: int = 0, *,
                    group_size: int | None = None, device: str | torch.device | None = None,
                    precision: Precision = "fp32", progress: bool | None = None) -> torch.Tensor:
    """Proximity graph (BatchSampler Algorithm 2, eq. 3).

    For every item, M = ``candidates`` items are drawn uniformly without replacement from the
    other items, and the K = ``neighbors`` with the highest inner product ``e_i . e_m`` are kept.

    Args:
        embeddings: [N, d] float tensor or array (normalise first for cosine).
        candidates: M, candidate-set size, ``neighbors < M < N``.
        neighbors: K, neighbours kept per item.
        seed: seed of the candidate draws; same inputs and seed give the same graph.
        group_size: items sharing one candidate pool (see the module docstring); default: the
            largest divisor of M up to ``min(64, M // 16)`` (50 for M = 1000, 25 for M = 500);
            1 gives fully independent pools.
        device: where products and top-k run (default CPU); the pools are the same everywhere.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"`` (half-precision inputs, fp32
            accumulation; may change neighbours in near-ties).
        progress: a tqdm bar over the blocks (True), none (False), or (None) when stderr is a
            terminal; shown once a build runs past 2 s.

    Returns:
        int64 CPU tensor [N, K]; row i holds i's neighbours by decreasing similarity.

    Logs one INFO record on ``hardbatch.neighbors.knn_graph`` (N, d, method, seconds, peak extra memory).
    Memory: O(N*K) output, O(N*M/g) pool ids (int32), the embeddings in group order on
    ``device`` (N*d in the chosen precision) and one block of at most about 4M (CPU) or 64M
    (CUDA) similarities and as many floats of gathered candidate embeddings.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> graph = hb.proximity_graph(torch.randn(40, 8), candidates=20, neighbors=5, seed=0)
        >>> graph.shape, bool((graph != torch.arange(40)[:, None]).all())
        (torch.Size([40, 5]), True)
    """
    with BuildLog(_LOG, "proximity_graph", method="proximity") as log:
        layout = ProximityGraphLayout(embeddings, candidates, neighbors, seed, group_size, device,
                                      precision)
        log.set(n=layout.num_items, d=layout.x.shape[1], candidates=layout.candidates,
                neighbors=layout.neighbors, group_size=layout.g)
        bar = progress_bar(layout.num_blocks, "proximity graph", progress)
        out = layout.rows(0, layout.num_blocks, bar=bar, out=torch.empty(
            (layout.num_items, layout.neighbors), dtype=torch.int64))
        bar.close()
        grouped = layout.members.numel() * layout.x.shape[1] * layout.x.element_size()
        log.hold(out.nbytes, layout.pools.nbytes, layout.members.nbytes, grouped,
                 layout.block_bytes)
        return out


def sharded_proximity_graph(embeddings: torch.Tensor | np.ndarray, candidates: int = 1000,
                            neighbors: int = 100, seed: int = 0, *,
                            group_size: int | None = None,
                            device: str | torch.device | None = None,
                            precision: Precision = "fp32", group=None) -> torch.Tensor:
    """:func:`proximity_graph`, built by all ranks of the process ``group`` together (None:
    the default group; one process: the plain build).

    Every rank must call it with the same embeddings and arguments (as after
    :func:`hardbatch.distributed.sync_bank_update`). Rank r builds the rows of blocks
    ``[r*nb/W, (r+1)*nb/W)`` of the block layout (whole groups sharing a candidate pool,
    BatchSampler eq. 3) on its ``device``; the rows are all-gathered, so every rank returns the
    full [N, K] graph, identical to the single-process one.

    Memory per rank: the pool table N*M/g int32 (g items share a pool; 100 MB at N = 1.28M,
    M = 1000, g = 50), the embeddings N*d, one block, and the full [N, K] int64 graph after the
    gather (the walks need all of it), plus a receive buffer of W * max-rows-per-rank * K.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> from hardbatch.neighbors.proximity_graph import sharded_proximity_graph
        >>> x = torch.randn(40, 8)
        >>> graph = sharded_proximity_graph(x, candidates=20, neighbors=5, seed=0)
        >>> graph.shape, torch.equal(graph, hb.proximity_graph(x, 20, 5, seed=0))  # one process
        (torch.Size([40, 5]), True)
    """
    layout = ProximityGraphLayout(embeddings, candidates, neighbors, seed, group_size, device,
                                  precision)
    start, end = rank_share(layout.num_blocks, group)
    return layout.assemble(all_gather_rows(layout.rows(start, end), group))
