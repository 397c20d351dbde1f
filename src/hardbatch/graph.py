"""Neighbour graphs over item embeddings: the proximity graph (BatchSampler eq. 3) and the exact kNN graph.

Both return an int64 neighbour table [N, K] whose row ``i`` lists the K chosen neighbours of item
``i`` by decreasing inner product, never ``i`` itself. Nothing of size N x N (or N x M x d) is ever
materialised: work runs over bounded blocks of rows.

Candidate pools of the proximity graph
--------------------------------------
The paper draws, for every item, M candidates uniformly from the other items and keeps the K with
the largest inner product. Done literally, every item gathers M rows of the embedding matrix: N*M*d
reads (15 GB for MNIST's 60k items at M=1000, d=64; 650 GB at ImageNet scale), which is what makes
the authors' gather + bmm slow. We let items share candidate pools in small random groups of
``group_size`` items (default: the largest divisor of M up to ``min(64, M // 16)``, far below M):
one gather of M rows then serves g items and becomes a small dense matrix product, cutting memory
traffic g-fold.

Naive sharing changes the graph's statistics: if a popular item lands in a group's pool, all g
members see it at once, so the spread of in-degrees grows by a factor ~(1 + (g - 1) K / M) in its
sampling part (+23% in-degree standard deviation on MNIST at g=32, M=1000, K=100). We therefore
build the pools from a *balanced design* that restores the first two moments of the independent
scheme:

* items are put in random order and cut into groups (blocks) of g; in round r = 1..M/g, group a
  receives block a + t_r (mod number of groups), with distinct random offsets t_r != 0. Every item
  thus enters exactly one pool per round, no pool repeats an item and no pool holds its own
  members;
* under independent per-item draws, the number of items that have item j among their candidates is
  ~Poisson(M): mean M, variance M. With sharing it is g times the number of pools containing j, so
  that number needs variance M/g^2, while the cyclic deal gives 0. Each dealt slot is therefore
  replaced by a uniform draw with probability p, p(2 - p) = 1/g (about 1/(2g)), which adds exactly
  that variance: the design matches the mean and the variance of the independent scheme, and with
  them the mean and the spread of in-degrees;
* uniform draws that repeat an item of the pool or hit a group member are re-drawn, so every item
  gets exactly M distinct candidates other than itself, uniform marginally by symmetry.

With ``group_size=1`` this reduces to the independent scheme. The test-suite checks in-degree
spread and mean neighbour similarity against a literal per-item implementation.

Devices, precision, shards
--------------------------
``device=`` runs the products and top-k selections on any torch device (``"cuda"``: one bounded
block of ~64M similarities at a time, ~4M on CPU, whose gathered candidate embeddings are bounded
by the same number of floats); the candidate pools are always drawn on the CPU by the same seeded
kernel, so every device sees the same candidates. ``precision="bf16" | "fp16"`` stores the
embeddings in half precision and multiplies them with fp32 accumulation (on CUDA the product is
returned in fp32 via ``out_dtype``; elsewhere the half result is widened), halving memory traffic;
neighbours may then differ from the fp32 graph in near-ties. Work is cut into blocks of whole
groups (rows for :func:`knn_graph`); :mod:`hardbatch.distributed` hands each rank a contiguous
range of blocks and all-gathers the rows, which reproduces the single-process graph exactly. The
embeddings may be a tensor on any device: they are checked there and never leave it (a CUDA tensor
is not copied to the host, only the neighbour table is).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from numba import njit

from . import _rng
from ._device import Precision, block_elements, check_precision, matmul_fp32, resolve_device
from ._logging import NO_BAR, BuildLog, get_logger, progress_bar
from ._rng import rand_below, rand_unit
from ._validation import check_int, embedding_tensor

__all__ = ["KNNGraphPlan", "ProximityGraphPlan", "candidate_pools", "check_graph_sizes",
           "default_group_size", "knn_graph", "proximity_graph"]

_LOG = get_logger("graph")


def default_group_size(candidates: int, num_items: int) -> int:
    """Items sharing one candidate pool: the largest divisor of M up to ``min(64, M // 16)``.

    A divisor of M avoids a partial last round of the pool design.

    Example:
        >>> from hardbatch.graph import default_group_size
        >>> default_group_size(1000, 60000), default_group_size(500, 60000)
        (50, 25)
    """
    cap = int(max(1, min(64, candidates // 16, num_items - candidates)))
    return max(g for g in range(1, cap + 1) if candidates % g == 0 or g == 1)


def check_group_size(group_size, candidates: int, num_items: int) -> int | None:
    """``group_size`` of :func:`proximity_graph` checked (None: the default, chosen later).

    Example:
        >>> from hardbatch.graph import check_group_size
        >>> check_group_size(None, 20, 40), check_group_size(4, 20, 40)
        (None, 4)
    """
    if group_size is None:
        return None
    return check_int(group_size, "group_size", low=1, high=max(1, num_items - candidates))


@njit(cache=True, nogil=True)
def _balanced_pools(order, m, g, p_uniform, seed, pools):
    """Fill ``pools`` [G, m]: group a = block a of ``order``; pool a = blocks a + t_r (mod G).

    The offsets t_1..t_R are distinct and nonzero, so every item enters
    exactly one pool per round and no pool repeats an item or holds a member
    of its own group. Each slot is then replaced by a uniform draw with
    probability ``p_uniform``; draws that repeat an item of the pool or hit a
    group member are re-drawn.
    """
    n = order.shape[0]
    n_groups = pools.shape[0]
    state = np.empty(1, np.uint64)
    state[0] = seed
    n_rounds = (m + g - 1) // g
    offsets = np.arange(1, n_groups)
    for i in range(n_rounds):  # partial Fisher-Yates: R distinct offsets
        j = i + rand_below(state, n_groups - 1 - i)
        tmp = offsets[i]
        offsets[i] = offsets[j]
        offsets[j] = tmp
    for a in range(n_groups):
        for r in range(n_rounds):
            src = ((a + offsets[r]) % n_groups) * g
            for j in range(min(g, m - r * g)):
                if src + j < n and not (p_uniform > 0.0 and rand_unit(state) < p_uniform):
                    pools[a, r * g + j] = order[src + j]
                else:
                    pools[a, r * g + j] = -1
    stamp = np.full(n, -1, np.int64)
    for a in range(n_groups):
        for j in range(a * g, min(n, a * g + g)):
            stamp[order[j]] = a
        for j in range(m):
            if pools[a, j] >= 0:
                stamp[pools[a, j]] = a
        for j in range(m):
            if pools[a, j] >= 0:
                continue
            v = -1
            for _ in range(64):
                c = rand_below(state, n)
                if stamp[c] != a:
                    v = c
                    break
            if v < 0:
                off = rand_below(state, n)
                for i in range(n):
                    c = (off + i) % n
                    if stamp[c] != a:
                        v = c
                        break
            pools[a, j] = v
            stamp[v] = a


def _uniform_share(n: int, m: int, g: int) -> float:
    """Probability that a dealt slot becomes a uniform draw (module docstring).

    Per round, the number of pools holding item j changes by -Bernoulli(p)
    (its dealt slot replaced) and +~Poisson(p) (uniform hits): variance
    p(2 - p). The target is the independent scheme's M(1 - M/N)/g^2 over
    M/g rounds, less the variance a partial last round (M % g slots) adds.
    """
    width = (m % g) / g
    target = m * (1.0 - m / n) / (g * g) - width * (1.0 - width)
    ratio = min(1.0, max(0.0, target / (m / g)))
    return float(1.0 - np.sqrt(1.0 - ratio))


def candidate_pools(num_items: int, candidates: int, group_size: int,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pools of the proximity graph (balanced design, see the module docstring).

    Returns:
        members: int64 [G, g], the items of each group (-1 pads the last group);
        pools: int32 (int64 if N >= 2**31) [G, M], the group's M distinct
        candidates, none of them a member of the group.

    Example:
        >>> from hardbatch.graph import candidate_pools
        >>> members, pools = candidate_pools(40, 20, 4, seed=0)
        >>> members.shape, pools.shape, bool((pools[0][:, None] != members[0]).all())
        ((10, 4), (10, 20), True)
    """
    n, g = num_items, group_size
    n_groups = -(-n // g)
    if -(-candidates // g) > n_groups - 1:
        g = 1  # too few groups for distinct offsets: independent pools
        n_groups = n
    order = _rng.permutation(n, _rng.derive_seed(seed, 0x6709))
    members = np.full(n_groups * g, -1, np.int64)
    members[:n] = order
    members = members.reshape(n_groups, g)
    pools = np.empty((n_groups, candidates), np.int32 if n < 2**31 else np.int64)
    _balanced_pools(order, candidates, g, _uniform_share(n, candidates, g),
                    np.uint64(_rng.derive_seed(seed, 0x9001)), pools)
    return members, pools


def check_graph_sizes(candidates: int, neighbors: int, num_items: int, *,
                      flags: bool = False) -> None:
    """The proximity graph's size rule K < M < N, as one ``ValueError`` naming the fix.

    ``flags=True`` names the command-line options (``--candidates``) instead of the
    keyword arguments. Every sampler, command and recipe checks the rule here.

    Example:
        >>> from hardbatch.graph import check_graph_sizes
        >>> try:
        ...     check_graph_sizes(20, 30, 40)
        ... except ValueError as err:
        ...     print(str(err).split("; ")[0])
        neighbors=30 must be smaller than candidates=20
    """
    m, k, n = candidates, neighbors, num_items
    if k >= m:
        if flags:
            raise ValueError(f"--neighbors {k} must be smaller than --candidates {m}; use "
                             f"e.g. --neighbors {max(1, m // 5)} or raise --candidates")
        raise ValueError(f"neighbors={k} must be smaller than candidates={m}; raise candidates "
                         "or lower neighbors")
    if m >= n:
        if flags:
            raise ValueError(f"--candidates {m} must be smaller than the number of items N={n}; "
                             f"use e.g. --candidates {max(2, n // 2)} (the paper uses 500 for "
                             "small data sets, 1000 for large ones)")
        fix = (f"lower candidates (e.g. {min(n - 1, max(k + 1, n // 2))})" if k + 1 < n else
               f"lower neighbors below N - 1 = {n - 1} and candidates between neighbors and N "
               "(or use a kNN graph)")
        raise ValueError(f"candidates={m} must be smaller than the number of items N={n}; {fix}")


class ProximityGraphPlan:
    """Validated inputs, candidate pools and block layout of one proximity-graph build.

    Shared by :func:`proximity_graph` (all blocks) and
    :func:`hardbatch.distributed.proximity_graph` (one contiguous range of
    blocks per rank): both run :meth:`rows` on the same blocks, so the sharded
    graph equals the single-process one.

    Example:
        >>> import torch
        >>> from hardbatch.graph import ProximityGraphPlan
        >>> plan = ProximityGraphPlan(torch.randn(40, 8), 20, 5, 0, None, None, "fp32")
        >>> plan.rows(0, plan.num_blocks).shape
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
        members, pools = candidate_pools(n, self.candidates, g, seed)
        self.num_items = n
        self.members = torch.from_numpy(members)
        self.pools = torch.from_numpy(pools)
        self.n_groups, self.g = members.shape
        # A block of groups holds blk*g*M similarities and blk*M gathered candidate rows of
        # d floats: bound both. Each group's product is its own (batched) matmul, so on CPU
        # the graph does not depend on the blocking (tested); on CUDA a batched product of
        # another batch count may pick another kernel (near-ties could then differ).
        self.per_block = max(1, block_elements(self.device)
                             // (self.candidates * max(self.g, x.shape[1])))
        self.num_blocks = -(-self.n_groups // self.per_block)
        self.x = x
        self.block_bytes = 0  # largest block so far: similarities, gathered rows, top-k

    def rows(self, block_start: int, block_end: int, out: torch.Tensor | None = None,
             bar=NO_BAR) -> torch.Tensor:
        """Neighbour rows [n_items, K] (CPU int64) of the items of blocks [start, end), in group order.

        With ``out`` ([N, K]) the rows are written into it in place (no second copy)
        and ``out`` is returned. ``bar.update(1)`` after each block.
        """
        emb = self.x.to(self.device, self.dtype)
        m, k, g = self.candidates, self.neighbors, self.g
        parts = []
        for b in range(block_start, block_end):
            s = b * self.per_block
            mem = self.members[s:s + self.per_block]
            pool = self.pools[s:s + self.per_block].to(self.device, torch.int64)
            blk = mem.shape[0]
            cand = torch.index_select(emb, 0, pool.reshape(-1)).view(blk, m, -1)
            query = torch.index_select(emb, 0, mem.clamp(min=0).reshape(-1).to(self.device))
            sims = matmul_fp32(query.view(blk, g, -1), cand.transpose(1, 2))
            top = sims.topk(k, dim=2, sorted=True).indices
            ids = torch.gather(pool.unsqueeze(1).expand(blk, g, m), 2, top).reshape(-1, k)
            self.block_bytes = max(self.block_bytes, sum(
                t.numel() * t.element_size() for t in (pool, cand, query, sims, top, ids)))
            valid = mem.reshape(-1) >= 0
            if out is not None:
                out[mem.reshape(-1)[valid]] = ids[valid.to(self.device)].cpu()
            else:
                parts.append(ids[valid.to(self.device)].cpu())
            bar.update(1)
        if out is not None:
            return out
        return torch.cat(parts) if parts else torch.empty((0, k), dtype=torch.int64)

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

    Logs one INFO record on ``hardbatch.graph`` (N, d, method, seconds, peak extra memory).
    Memory: O(N*K) output, O(N*M/g) pool ids (int32), the embeddings on ``device`` (N*d in the
    chosen precision) and one block of at most about 4M (CPU) or 64M (CUDA) similarities and as
    many floats of gathered candidate embeddings.

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> graph = hb.proximity_graph(torch.randn(40, 8), candidates=20, neighbors=5, seed=0)
        >>> graph.shape, bool((graph != torch.arange(40)[:, None]).all())
        (torch.Size([40, 5]), True)
    """
    with BuildLog(_LOG, "proximity_graph", method="proximity") as log:
        plan = ProximityGraphPlan(embeddings, candidates, neighbors, seed, group_size, device,
                                  precision)
        log.set(n=plan.num_items, d=plan.x.shape[1], candidates=plan.candidates,
                neighbors=plan.neighbors, group_size=plan.g)
        bar = progress_bar(plan.num_blocks, "proximity graph", progress)
        out = plan.rows(0, plan.num_blocks, out=torch.empty((plan.num_items, plan.neighbors),
                                                            dtype=torch.int64), bar=bar)
        bar.close()
        log.hold(out.nbytes, plan.pools.nbytes, plan.members.nbytes, plan.block_bytes)
        return out


_KNN_METHODS = ("exact", "faiss", "faiss-ivf")


class KNNGraphPlan:
    """Validated inputs and row blocks of one kNN-graph build (see :class:`ProximityGraphPlan`).

    Example:
        >>> from hardbatch.graph import KNNGraphPlan
        >>> plan = KNNGraphPlan(np.eye(40, 8) + 0.1, 5, "exact", None, "fp32", None, 16, 0)
        >>> plan.rows(0, plan.num_blocks).shape
        torch.Size([40, 5])
    """

    def __init__(self, embeddings, neighbors: int, method: str, device, precision: str,
                 nlist: int | None, nprobe: int, seed: int) -> None:
        x = embedding_tensor(embeddings)
        self.neighbors = check_int(neighbors, "neighbors", low=1)
        n = x.shape[0]
        if self.neighbors >= n:
            raise ValueError(f"neighbors={neighbors} must be smaller than the number of items N={n}")
        if method not in _KNN_METHODS:
            raise ValueError(f"method={method!r} must be one of {list(_KNN_METHODS)}")
        self.x, self.num_items, self.method = x, n, method
        self.device = resolve_device(device)
        self.dtype = check_precision(precision)
        self.nlist, self.nprobe, self.seed = nlist, check_int(nprobe, "nprobe", low=1), seed
        self.rows_per_block = max(1, block_elements(self.device) // n)
        if method != "exact":
            self.rows_per_block = max(self.rows_per_block, 16384)
        self.num_blocks = -(-n // self.rows_per_block)
        self._index = None
        self.block_bytes = 0  # largest block so far: similarities, top-k values and indices

    def rows(self, block_start: int, block_end: int, bar=NO_BAR) -> torch.Tensor:
        """Neighbour rows [end - start, K] (CPU int64) of the items of row blocks [start, end);
        ``bar.update(1)`` after each block."""
        start = min(self.num_items, block_start * self.rows_per_block)
        end = min(self.num_items, block_end * self.rows_per_block)
        out = torch.empty((end - start, self.neighbors), dtype=torch.int64)
        if self.method != "exact":
            return self._faiss_rows(start, end, out, bar)
        emb = self.x.to(self.device, self.dtype)
        for s in range(start, end, self.rows_per_block):
            e = min(end, s + self.rows_per_block)
            sims = matmul_fp32(emb[s:e], emb.T)
            sims[torch.arange(e - s, device=self.device),
                 torch.arange(s, e, device=self.device)] = -torch.inf
            out[s - start:e - start] = sims.topk(self.neighbors, dim=1, sorted=True).indices.cpu()
            self.block_bytes = max(self.block_bytes, sims.nbytes + (e - s) * self.neighbors * 12)
            bar.update(1)
        return out

    def _faiss_rows(self, start: int, end: int, out: torch.Tensor, bar=NO_BAR) -> torch.Tensor:
        try:
            import faiss
        except ImportError as exc:
            raise ImportError(f"method={self.method!r} needs faiss: pip install faiss-cpu "
                              "(or faiss-gpu), or use method='exact'") from exc
        x, n, k = self.x.cpu().numpy(), self.num_items, self.neighbors
        if self._index is None:
            d = x.shape[1]
            if self.method == "faiss":
                index = faiss.IndexFlatIP(d)
            else:
                nlist = int(self.nlist or max(1, min(n // 39, 4 * np.sqrt(n))))
                index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist,
                                           faiss.METRIC_INNER_PRODUCT)
                index.cp.seed = int(self.seed) & 0x7FFFFFFF
                sample = _rng.permutation(n, _rng.derive_seed(self.seed, 0x1BF))[:64 * nlist]
                index.train(x[np.sort(sample)])
                index.nprobe = min(self.nprobe, nlist)
            if self.device.type == "cuda" and hasattr(faiss, "StandardGpuResources"):
                self._res = faiss.StandardGpuResources()
                index = faiss.index_cpu_to_gpu(self._res, self.device.index or 0, index)
            index.add(x)
            self._index = index
        for s in range(start, end, 65536):  # bounded result buffers
            e = min(end, s + 65536)
            _, ids = self._index.search(x[s:e], k + 1)
            own = ids == np.arange(s, e)[:, None]
            # Drop the item itself (wherever it appears) or else the last of the K + 1.
            own[~own.any(axis=1), k] = True
            out[s - start:e - start] = torch.from_numpy(ids[~own].reshape(e - s, k))
            self.block_bytes = max(self.block_bytes, x.nbytes + (e - s) * (k + 1) * 13)
            bar.update(-(-(e - s) // self.rows_per_block))
        return out


def knn_graph(embeddings: torch.Tensor | np.ndarray, neighbors: int = 100, *,
              method: Literal["exact", "faiss", "faiss-ivf"] = "exact",
              device: str | torch.device | None = None, precision: Precision = "fp32",
              nlist: int | None = None, nprobe: int = 16, seed: int = 0,
              progress: bool | None = None) -> torch.Tensor:
    """Exact K-nearest-neighbour graph by inner product, excluding self (the paper's "kNN graph").

    Args:
        embeddings: [N, d] float tensor or array.
        neighbors: K, ``1 <= K < N``.
        method: ``"exact"`` (blocked dense products with torch, O(N^2 d) time), ``"faiss"``
            (faiss ``IndexFlatIP``: exact, same cost, faiss kernels) or ``"faiss-ivf"``
            (``IndexIVFFlat``, approximate, about nprobe/nlist of the cost; the route for
            N >= 1M). faiss moves to the GPU when ``device`` is CUDA and faiss-gpu is installed.
        device, precision: as in :func:`proximity_graph` (``"exact"`` only for precision).
        nlist, nprobe, seed: inverted lists (default min(N/39, 4 sqrt(N))), lists probed per
            query, and the training-sample seed of ``"faiss-ivf"``.
        progress: a tqdm bar over the row blocks, as in :func:`proximity_graph`.

    Returns:
        int64 CPU tensor [N, K], row i by decreasing similarity to item i (ties
        and the approximate method may order/choose differently).

    Logs one INFO record on ``hardbatch.graph`` (N, d, method, seconds, peak extra memory).
    Memory: O(N*K) output plus the embeddings and one block of about 4M (CPU) or 64M (CUDA)
    similarities; faiss adds its index (N*d floats).

    Example:
        >>> import torch
        >>> import hardbatch as hb
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8), dim=1)
        >>> graph = hb.knn_graph(x, 5)
        >>> bool((graph[:, 0] == (x @ x.T).fill_diagonal_(-2).argmax(dim=1)).all())
        True
    """
    with BuildLog(_LOG, "knn_graph", method=method) as log:
        plan = KNNGraphPlan(embeddings, neighbors, method, device, precision, nlist, nprobe,
                            seed)
        log.set(n=plan.num_items, d=plan.x.shape[1], neighbors=plan.neighbors)
        bar = progress_bar(plan.num_blocks, f"kNN graph ({method})", progress)
        out = plan.rows(0, plan.num_blocks, bar)
        bar.close()
        log.hold(out.nbytes, plan.block_bytes)
        return out
