"""The compiled top-k of similarity rows (CPU) behind the proximity graph.

Public names of a private module: the library's own kernel, not part of the user API.
:func:`top_rows` selects each row's top k by a sampled bound (the rank-th largest of 64
strided values, found by counting, in vector instructions), a compaction of the values above
it (one AVX-512 ``vpcompressd`` per 16 values where numba compiles for such a host, else a
branch-free loop; both keep the same positions in the same order), a bucket sort and an
insertion sort of the buckets up to the k-th value. Which bound and which path only change
the speed: the selection is the row's top k, in decreasing order, exactly as ``torch.topk``
gives it; the rows whose order it cannot promise (ties in the top k + 1 values, a NaN) are
flagged for the caller to re-select with ``torch.topk`` (``tests/.../test_row_select.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .._sorted import insert_descending

__all__ = ["top_rows"]

_SAMPLE = 64  # similarities per row sampled for the top-k bound


def _simd_target() -> bool:
    """Whether numba compiles for this host and the host has AVX-512 (``vpcompressd``)."""
    try:
        import llvmlite.binding as llvm
        from numba.core import config
        return not config.CPU_NAME and bool(llvm.get_host_cpu_features().get("avx512f"))
    except Exception:  # noqa: BLE001 -- any doubt: the portable loop
        return False


_AVX512 = _simd_target()


@intrinsic
def _compress16(typingctx, src, start, bound, keep, c):
    """``keep[c:]`` = the positions i in ``[start, start + 16)`` with ``src[i] >= bound`` or
    NaN, in order (one AVX-512 compress; 16 slots are written); returns c + their count."""
    sig = types.intp(src, types.intp, types.float32, keep, types.intp)

    def codegen(context, builder, signature, args):
        srcv, startv, boundv, keepv, cv = args
        data = context.make_array(signature.args[0])(context, builder, srcv).data
        dest = context.make_array(signature.args[3])(context, builder, keepv).data
        f32, i32 = ir.FloatType(), ir.IntType(32)
        vf, vi = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
        zeros = ir.Constant(vi, [0] * 16)
        vec = builder.load(builder.bitcast(builder.gep(data, [startv]), vf.as_pointer()), align=4)
        bounds = builder.shuffle_vector(builder.insert_element(
            ir.Constant(vf, None), boundv, ir.Constant(i32, 0)), ir.Constant(vf, None), zeros)
        mask = builder.fcmp_unordered(">=", vec, bounds)  # NaN: kept
        first = builder.shuffle_vector(builder.insert_element(
            ir.Constant(vi, None), builder.trunc(startv, i32), ir.Constant(i32, 0)),
            ir.Constant(vi, None), zeros)
        index = builder.add(first, ir.Constant(vi, list(range(16))))
        compress = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            vi, [vi, vi, mask.type]), "llvm.x86.avx512.mask.compress.v16i32")
        packed = builder.call(compress, [index, zeros, mask])
        builder.store(packed, builder.bitcast(builder.gep(dest, [cv]), vi.as_pointer()), align=4)
        popcount = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.IntType(16), [ir.IntType(16)]), "llvm.ctpop.i16")
        count = builder.call(popcount, [builder.bitcast(mask, ir.IntType(16))])
        return builder.add(cv, builder.zext(count, cv.type))

    if isinstance(src, types.Array) and src.layout == keep.layout == "C" and \
            src.dtype == types.float32 and keep.dtype == types.int32:
        return sig, codegen
    return None


def _compact(s, bound, keep):
    """``keep[:c]`` = the positions of ``s``'s values >= bound or NaN, in order; returns c
    (``keep`` holds len(s) + 16 slots)."""
    c = 0
    for i in range(s.shape[0]):
        keep[c] = i
        c += not s[i] < bound  # NaN: kept
    return c


@overload(_compact, jit_options={"cache": True})
def _compact_compiled(s, bound, keep):
    if not (_AVX512 and s.dtype == types.float32 and s.layout == "C"):
        return _compact  # branch-free scalar loop

    def vector(s, bound, keep):
        c = 0
        head = s.shape[0] - s.shape[0] % 16
        for i in range(0, head, 16):
            c = _compress16(s, i, bound, keep, c)
        for i in range(head, s.shape[0]):
            keep[c] = i
            c += not s[i] < bound
        return c
    return vector


@njit(cache=True, nogil=True)
def top_rows(sims, dest_rows, pools, g, k, out, tied):
    """Top k of every row of ``sims`` [rows, M]: ``out[dest_rows[r]]`` = their pool ids.

    Row r belongs to pool ``r // g``; rows with ``dest_rows[r] < 0`` are skipped. Order: by
    decreasing value. A bound from a strided sample of the row keeps about 1.8 k of its M
    values (a looser one, then all of them, when that keeps fewer than k); the kept ones are
    bucket-sorted by value (buckets finer toward the bound, where values are dense), and the
    buckets up to the k-th value are put in order by two odd-even passes and an insertion
    sort. A row whose top k + 1 values hold two equal ones, or that holds a NaN or an
    infinite value anywhere, gets ``tied[r] = 1``, others 0: the caller re-selects such rows
    with ``torch.topk`` (whose order of ties, and of NaN, counted as the largest, this kernel
    does not reproduce; ``out[dest_rows[r]]`` of such a row is unspecified). Every other row
    gets exactly ``torch.topk(sims[r], k)``'s indices, mapped through ``pools[r // g]``.
    Returns the number of flagged rows.

    Example:
        >>> import numpy as np
        >>> from hardbatch.neighbors._row_select import top_rows
        >>> sims = np.array([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 0.1]], np.float32)
        >>> out, tied = np.zeros((2, 2), np.int64), np.zeros(2, np.uint8)
        >>> pools = np.array([[10, 11, 12, 13]], np.int32)  # one pool shared by both rows (g=2)
        >>> top_rows(sims, np.array([1, 0]), pools, 2, 2, out, tied), out.tolist()
        (0, [[12, 10], [11, 13]])
    """
    m = sims.shape[1]
    nb = 16
    while nb < 2 * k:
        nb *= 2
    keep = np.empty(m + 16, np.int32)
    kval = np.empty(m, np.float32)
    bucket = np.empty(m, np.int32)
    spos = np.empty(m, np.int32)
    sval = np.empty(m, np.float32)
    count = np.empty(nb + 1, np.int32)
    samp = np.empty(_SAMPLE, np.float32)
    above = np.empty(_SAMPLE, np.int32)
    sampled = m >= 4 * _SAMPLE and 4 * k <= m
    step = max(1, m // _SAMPLE)
    rank = min(_SAMPLE, (_SAMPLE * k * 3) // (2 * m) + 3)
    n_tied = 0
    for r in range(sims.shape[0]):
        tied[r] = 0
        dest = dest_rows[r]
        if dest < 0:
            continue
        s = sims[r]
        c = 0
        if sampled:  # bound: the rank-th largest of _SAMPLE strided values
            for i in range(_SAMPLE):
                samp[i] = s[i * step]
                above[i] = 0
            for j in range(_SAMPLE):  # above[i]: the samples larger than sample i (vectorised)
                for i in range(_SAMPLE):
                    above[i] += samp[i] < samp[j]
            bound = np.float32(np.inf)
            for i in range(_SAMPLE):  # the rank-th largest: the least with < rank above it
                if above[i] < rank:
                    bound = min(bound, samp[i])
            c = _compact(s, bound, keep)
            if c < k:  # too few kept: the (2 rank)-th largest sample
                bound = np.float32(np.inf)
                for i in range(_SAMPLE):
                    if above[i] < 2 * rank:
                        bound = min(bound, samp[i])
                c = _compact(s, bound, keep)
            for i in range(c):
                kval[i] = s[keep[i]]
        if c < k:  # every value (small M, or a bound that kept too few)
            for i in range(m):
                keep[i] = i
                kval[i] = s[i]
            c = m
        nan = 0  # a NaN is always kept: torch.topk's order (NaN largest) by the caller
        for i in range(c):
            nan += kval[i] != kval[i]
        if nan:
            tied[r] = 1
            n_tied += 1
            continue
        lo0 = lo1 = lo2 = lo3 = hi0 = hi1 = hi2 = hi3 = kval[0]
        i = 0
        while i + 4 <= c:  # min and max in four independent chains
            lo0, lo1, lo2, lo3 = (min(lo0, kval[i]), min(lo1, kval[i + 1]),
                                  min(lo2, kval[i + 2]), min(lo3, kval[i + 3]))
            hi0, hi1, hi2, hi3 = (max(hi0, kval[i]), max(hi1, kval[i + 1]),
                                  max(hi2, kval[i + 2]), max(hi3, kval[i + 3]))
            i += 4
        for i in range(i, c):
            lo0, hi0 = min(lo0, kval[i]), max(hi0, kval[i])
        lo, hi = min(min(lo0, lo1), min(lo2, lo3)), max(max(hi0, hi1), max(hi2, hi3))
        span = np.float64(hi) - np.float64(lo)
        scale = (nb - 1) / (span * span) if span > 0 and span < np.inf else 0.0
        count[:] = 0
        for i in range(c):  # bucket: monotone in the value (0 holds the largest), finer
            f = np.float64(hi) - np.float64(kval[i])  # toward the dense low end: (hi - v)^2
            f = min(f * f * scale, nb - 1.0)
            bucket[i] = np.int32(f) if f > 0 else 0
        for i in range(c):
            count[bucket[i] + 1] += 1
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
        for p in range(2):  # two branch-free odd-even passes, then a stable insertion sort
            for i in range(p, limit - 1, 2):
                a, b = sval[i], sval[i + 1]
                pa, pb = spos[i], spos[i + 1]
                swap = a < b
                sval[i], sval[i + 1] = (b, a) if swap else (a, b)
                spos[i], spos[i + 1] = (pb, pa) if swap else (pa, pb)
        for i in range(1, limit):  # (the buckets are nearly sorted)
            insert_descending(sval, spos, i, sval[i], spos[i])
        grp = r // g
        for j in range(k):
            out[dest, j] = pools[grp, spos[j]]
        for j in range(min(k, limit - 1)):
            if sval[j] == sval[j + 1]:
                tied[r] = 1
                n_tied += 1
                break
    return n_tied
