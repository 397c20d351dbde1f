"""The proximity graph (BatchSampler eq. 3): block layout and build, in one process or sharded.

:func:`proximity_graph` returns an int64 neighbour table [N, K] whose row ``i`` lists the K chosen
neighbours of item ``i`` by decreasing inner product (ties ordered as ``torch.topk`` orders them),
never ``i`` itself. Nothing of size N x N (or N x M x d) is ever materialised: work runs over
bounded blocks of groups. The candidate pools (groups of items sharing one pool, drawn from a
balanced design) come from :mod:`hardbatch.neighbors.proximity_pools`;
:mod:`hardbatch.neighbors.knn_graph` re-exports the public names of both modules.

Block layout (how the build runs)
---------------------------------
The embeddings are copied once in group order (``x[order]``, N*d floats): a group's own rows are
then one contiguous slice, and its pool is, but for the ~1/(2g) uniformly re-drawn slots, the
concatenation of M/g whole groups (``a + t_r``). A block of groups therefore gathers its
candidates as whole groups of g*d floats (memory copies, not N*M random rows), patches the
re-drawn slots, and runs one batched product [g, d] x [d, M] per group. On the CPU a compiled
kernel (:mod:`hardbatch.neighbors._row_select`) then selects each row's top K (a sampled bound
keeps ~1.8 K of the M values, a bucket sort orders them) and writes the neighbour ids straight
into the table; worker threads share the blocks, each running its products single-threaded in
its own buffers, and a CPU block is cache-sized (its gathered rows are multiplied, and its
similarities selected, while still in the core's cache). On other devices ``torch.topk``
selects. Rows with tied values in their top K + 1 (or a NaN similarity, from an overflowing
product) are re-selected by ``torch.topk``, so ties come out as there. The similarities are
the same floats as those of a per-group gather, so the graph does not depend on the blocking.

Devices, precision, shards
--------------------------
As for every graph of :mod:`hardbatch.neighbors.knn_graph`. Specific to this build: the pools
are drawn on the CPU by one seeded kernel whatever ``device`` is, so every device compares the
same candidates; a block holds whole groups, bounded so that its similarities and its gathered
candidate rows each stay under ~128K floats on the CPU (~64M on CUDA); the ranks of
:func:`sharded_proximity_graph` build contiguous ranges of blocks and reproduce the
single-process graph; half precision (``precision="bf16" | "fp16"``) may change neighbours
in near-ties.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._device import Precision, block_elements, check_precision, matmul_fp32, resolve_device
from .._logging import NO_BAR, BuildLog, get_logger, progress_bar
from .._validation import check_int, embedding_tensor
from ..distributed import all_gather_rows, rank_share
from ._row_select import top_rows
from .proximity_pools import (check_graph_sizes, check_group_size, default_group_size,
                              pool_design, pool_members)

__all__ = ["ProximityGraphLayout", "proximity_graph", "sharded_proximity_graph"]

_LOG = get_logger("neighbors")


CPU_BLOCK_FLOATS = 1 << 17  # gathered candidate floats (and similarities) of a CPU block


@intrinsic
def _copy_rows(typingctx, dst, dst_row, src, src_row, rows):
    """``dst`` rows ``[dst_row, dst_row + rows)`` = ``src`` rows ``[src_row, ...)``: one
    ``memcpy`` (C-contiguous arrays of one dtype, rows of their last axis, of one width)."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        dstv, dst_rowv, srcv, src_rowv, rowsv = args
        to = context.make_array(signature.args[0])(context, builder, dstv)
        frm = context.make_array(signature.args[2])(context, builder, srcv)
        width = builder.extract_value(frm.shape, signature.args[2].ndim - 1)
        cgutils.raw_memcpy(builder, builder.gep(to.data, [builder.mul(dst_rowv, width)]),
                           builder.gep(frm.data, [builder.mul(src_rowv, width)]),
                           builder.mul(rowsv, width), context.get_abi_sizeof(
                               context.get_data_type(signature.args[2].dtype)))
        return context.get_dummy_value()

    if all(isinstance(a, types.Array) and a.layout == "C" for a in (dst, src)) and \
            dst.dtype == src.dtype:
        return sig, codegen
    return None


@njit(cache=True, nogil=True)
def _gather_pools(grouped, emb, s, e, offsets, g, redrawn, pools, cand):
    """``cand[a - s]`` = the candidate rows of pool a, for the groups a in [s, e).

    ``grouped`` [G*g, d] holds the rows in group order, so the slots dealt in round r
    are the g rows of group ``(a + offsets[r]) % G``: one copy of g*d contiguous values;
    the ``redrawn`` slots (flat positions ``a*M + slot``, those of [s, e) only) then take
    their item's row of ``emb``.
    """
    m = cand.shape[1]
    n_groups = grouped.shape[0] // g
    for a in range(s, e):
        for r in range(offsets.shape[0]):
            partner = a + offsets[r]  # (a + t_r) mod G, t_r < G
            partner = partner - n_groups if partner >= n_groups else partner
            _copy_rows(cand, (a - s) * m + r * g, grouped, partner * g, min(g, m - r * g))
    for f in redrawn:
        a = f // m
        cand[a - s, f - a * m] = emb[pools[a, f - a * m]]


def _populate(*tensors: torch.Tensor) -> None:
    """Fault in the pages of fresh CPU tensors ahead of their first writes (Linux >= 5.14
    ``MADV_POPULATE_WRITE``; contents unchanged, safe beside writers; elsewhere nothing), so
    that the kernel clears them on a core that would otherwise wait."""
    if not sys.platform.startswith("linux"):
        return
    try:
        madvise = ctypes.CDLL(None).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError, TypeError):
        return
    page = mmap.PAGESIZE
    for t in tensors:
        if t.device.type == "cpu":
            start = -(-t.data_ptr() // page) * page
            end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
            if end > start:
                madvise(start, end - start, 23)  # MADV_POPULATE_WRITE; EINVAL if unknown


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
        x = embedding_tensor(embeddings, finite=False)
        self.candidates = check_int(candidates, "candidates", low=1)
        self.neighbors = check_int(neighbors, "neighbors", low=1)
        n = x.shape[0]
        if n < 2:
            raise ValueError(f"embeddings has N={n} item(s); a neighbour graph needs at least 2")
        check_graph_sizes(self.candidates, self.neighbors, n)
        g = check_group_size(group_size, self.candidates, n)
        g = default_group_size(self.candidates, n) if g is None else g
        self.device = resolve_device(device)
        self.compiled = self.device.type == "cpu"  # the compiled gather and top k (else torch's)
        self.dtype = check_precision(precision)
        members = pool_members(n, self.candidates, g, seed)
        background = ThreadPoolExecutor(1)  # the pools are drawn while the caller goes on
        self._design = background.submit(pool_design, n, self.candidates, g, seed,
                                         members=members)
        background.shutdown(wait=False)
        self._drawn: dict[str, torch.Tensor] = {}
        embedding_tensor(x)  # the NaN / inf check, meanwhile
        self.num_items = n
        self.members = torch.from_numpy(members)
        self.n_groups, self.g = self.members.shape
        self.width = -(-self.candidates // self.g) * self.g  # gathered slots per pool
        # A block of groups holds blk*g*M similarities and blk*M gathered candidate rows of
        # d floats: bound both. Each group's product is its own (batched) matmul, so on CPU
        # the graph does not depend on the blocking (tested); on CUDA a batched product of
        # another batch count may pick another kernel (near-ties could then differ).
        # On the CPU a block is also cache-sized (CPU_BLOCK_FLOATS): its gathered rows are
        # still in the core's cache when multiplied, its similarities when selected.
        budget = block_elements(self.device)
        if self.device.type == "cpu":
            budget = min(budget, CPU_BLOCK_FLOATS)
        self.per_block = max(1, budget // (self.width * max(self.g, x.shape[1])))
        self.num_blocks = -(-self.n_groups // self.per_block)
        self.x = x
        self.block_bytes = 0  # largest block so far: similarities, gathered rows, top-k

    def _drawn_pools(self) -> dict[str, torch.Tensor]:
        """``pools``, ``offsets`` and ``redrawn`` of :func:`pool_design`, waited for once."""
        if not self._drawn:
            design = self._design.result()
            self._drawn = {key: torch.from_numpy(design[key])
                           for key in ("pools", "offsets", "redrawn")}
        return self._drawn

    pools = property(lambda self: self._drawn_pools()["pools"],
                     doc="Candidate pools [G, M] (int32; int64 if N >= 2**31).")
    offsets = property(lambda self: self._drawn_pools()["offsets"],
                       doc="Group offsets t_r of the rounds, int64 [R].")
    redrawn = property(lambda self: self._drawn_pools()["redrawn"],
                       doc="Flat positions a*M + slot of the uniformly drawn slots.")

    def grouped(self, pool: ThreadPoolExecutor | None = None, parts: int = 1,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """The embeddings in group order on ``device`` ([G*g, d]; zero rows pad the last group),
        copied in ``parts`` slices of rows by the threads of ``pool`` (into ``out`` if given)."""
        n, d = self.x.shape
        if out is None:
            out = torch.empty((self.members.numel(), d), dtype=self.dtype, device=self.device)
        out[n:] = 0
        order = self.members.reshape(-1)[:n].to(self.device)  # the padding is at the end
        src = self.x.to(self.device)

        def copy(lo: int, hi: int) -> None:
            if src.dtype == self.dtype:
                torch.index_select(src, 0, order[lo:hi], out=out[lo:hi])
            else:
                out[lo:hi] = torch.index_select(src, 0, order[lo:hi])

        cuts = [n * i // parts for i in range(parts + 1)]
        if pool is None:
            copy(0, n)
        else:
            for job in [pool.submit(copy, lo, hi) for lo, hi in zip(cuts, cuts[1:])]:
                job.result()
        return out

    def rows(self, block_start: int, block_end: int, out: torch.Tensor | None = None,
             bar=NO_BAR) -> torch.Tensor:
        """Neighbour rows [n_items, K] (CPU int64) of the items of blocks [start, end), in
        group order.

        With ``out`` ([N, K]) the rows are written into it in place (no second copy)
        and ``out`` is returned. ``bar.update(1)`` after each block. On the CPU, blocks
        are shared by ``torch.get_num_threads()`` worker threads, each running its
        blocks' products single-threaded in its own buffers (no fine-grained synchronisation).
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
        blocks = iter(range(block_start, block_end))
        default = torch.get_num_threads()
        threads = max(1, min(default, block_end - block_start)) if self.device.type == "cpu" else 1
        emb = self.x.to(self.device, self.dtype)
        buffer = torch.empty((self.members.numel(), emb.shape[1]), dtype=self.dtype,
                             device=self.device)
        filler = threading.Thread(target=_populate, args=(buffer, table), daemon=True)
        filler.start()  # while the pools are drawn, on the other core
        self._drawn_pools()
        if threads == 1:
            run = self._worker(emb, self.grouped(out=buffer), dest, s0, table, threads)
            for b in blocks:
                run(b)
                bar.update(1)
            filler.join()
            return table
        lock = threading.Lock()

        def work(grouped):
            torch.set_num_threads(1)  # this thread's products (OpenMP/MKL: thread-local)
            run = self._worker(emb, grouped, dest, s0, table, threads)
            while True:
                with lock:
                    b = next(blocks, None)
                if b is None:
                    return
                run(b)
                bar.update(1)

        try:
            with ThreadPoolExecutor(threads) as pool:
                grouped = self.grouped(pool, threads, buffer)
                for job in [pool.submit(work, grouped) for _ in range(threads)]:
                    job.result()
        finally:
            torch.set_num_threads(default)  # the default for threads started later
        filler.join()
        return table

    def _worker(self, emb, grouped, dest, s0: int, table, threads: int):
        """``run(b)``: the rows of block b into ``table[dest[row]]`` (gather, product, top k),
        in buffers of the calling thread."""
        m, k, g = self.candidates, self.neighbors, self.g
        per, d = self.per_block, grouped.shape[1]
        pools = self.pools.numpy()
        cuts = np.searchsorted(self.redrawn.numpy(), np.arange(self.n_groups + 1) * m)
        queries = grouped.view(self.n_groups, g, d)
        if not self.compiled:
            def run_device(b: int) -> None:
                s, e = b * per, min(self.n_groups, b * per + per)
                cand = self._gather_device(s, e, emb, grouped, cuts)
                sims = matmul_fp32(queries[s:e], cand.transpose(1, 2)).view(-1, m)
                rows_dest = dest[s * g - s0:e * g - s0]
                self._retop(sims, torch.nonzero(rows_dest >= 0).squeeze(1), rows_dest, s, e,
                            table)
                self.block_bytes = max(self.block_bytes, sims.nbytes + cand.nbytes)
            return run_device
        ints = torch.int32 if grouped.element_size() == 4 else torch.int16
        cand = torch.empty((per, m, d), dtype=grouped.dtype)
        sims = torch.empty((per, g, m))
        tied = np.zeros(per * g, np.uint8)
        self.block_bytes = max(self.block_bytes, threads * (cand.nbytes + sims.nbytes))
        arrays = (grouped.view(ints).numpy(), emb.view(ints).numpy(), self.offsets.numpy(),
                  self.redrawn.numpy(), cand.view(ints).numpy())
        cand_t, dest_np, table_np = cand.transpose(1, 2), dest.numpy(), table.numpy()
        flat_sims = sims.view(-1, m).numpy()
        fp32 = grouped.dtype == torch.float32

        def run(b: int) -> None:
            s, e = b * per, min(self.n_groups, b * per + per)
            gi, ei, offsets, redrawn, ci = arrays
            _gather_pools(gi, ei, s, e, offsets, g, redrawn[cuts[s]:cuts[e]], pools, ci)
            if fp32 and e - s == per:  # the same product as matmul_fp32, into this thread's buffer
                torch.bmm(queries[s:e], cand_t, out=sims)
                block = flat_sims
            elif fp32:
                block = torch.bmm(queries[s:e], cand_t[:e - s], out=sims[:e - s]).view(-1, m)
            else:
                block = matmul_fp32(queries[s:e], cand_t[:e - s]).view(-1, m)
            if top_rows(np.asarray(block)[:(e - s) * g], dest_np[s * g - s0:e * g - s0],
                        pools[s:e], g, k, table_np, tied):
                rows = torch.from_numpy(np.flatnonzero(tied[:(e - s) * g]))  # ties: torch.topk
                self._retop(torch.as_tensor(block), rows, dest[s * g - s0:e * g - s0], s, e,
                            table)
        return run

    def _retop(self, sims, rows, rows_dest, s: int, e: int, table) -> None:
        """``torch.topk`` of the given rows of a block's similarities into the table."""
        if len(rows):
            dev = sims.device
            top = sims[rows.to(dev)].topk(self.neighbors, dim=1, sorted=True).indices
            pools = self.pools[s:e].to(dev, torch.int64)
            ids = torch.gather(pools[(rows // self.g).to(dev)], 1, top)
            table[rows_dest[rows]] = ids.cpu()

    def _gather_device(self, s: int, e: int, emb, grouped, cuts) -> torch.Tensor:
        """Candidate embeddings [e - s, M, d] of groups [s, e) on a device other than the CPU:
        whole partner groups, then the re-drawn slots' own rows."""
        m, dev = self.candidates, self.device
        partners = (torch.arange(s, e)[:, None] + self.offsets) % self.n_groups
        cand = torch.index_select(grouped.view(self.n_groups, -1), 0,
                                  partners.reshape(-1).to(dev)).view(e - s, self.width, -1)
        if self.width != m:
            cand = cand[:, :m].contiguous()
        if cuts[e] > cuts[s]:  # slots filled by a uniform draw: their own rows
            flat = self.redrawn[cuts[s]:cuts[e]]
            slot = (flat // m - s).to(dev), (flat % m).to(dev)
            cand[slot] = emb[self.pools.reshape(-1)[flat].to(dev, torch.int64)]
        return cand

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

    Logs one INFO record on ``hardbatch.neighbors.knn_graph`` (N, d, method, seconds, peak
    extra memory).
    Memory: O(N*K) output, O(N*M/g) pool ids (int32), the embeddings in group order on
    ``device`` (N*d in the chosen precision) and one block per CPU thread of at most about
    128K similarities (64M on CUDA) and as many floats of gathered candidate embeddings.

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
