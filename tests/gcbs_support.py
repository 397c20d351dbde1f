"""Dense NumPy references of GCBS shared by the gcbs tests (tests/hardbatch/batching/gcbs/).

Importable as ``gcbs_support`` from any test module (``tests/`` is on pytest's ``pythonpath``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from hardbatch import _rng


def dense_pairs_reference(x, y, thr, min_partners):
    """Float64 adjacency [N, N]: s_ij > thr, plus each row's ``min_partners`` largest s_ij."""
    s = x.astype(np.float64) @ y.T.astype(np.float64)
    np.fill_diagonal(s, -np.inf)
    a = s > thr
    if min_partners:
        top = np.argsort(-s, axis=1, kind="stable")[:, :min_partners]
        a[np.arange(len(x))[:, None], top] = True
    return a


def dense_gcbs_reference(x, y, quantile, seed, min_partners=0):
    """Dense NumPy GCBS: exact quantile of all off-diagonal cosines, threshold (plus each
    item's ``min_partners`` strongest pairs), RCM."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    n = len(x)
    s = x.astype(np.float64) @ y.T.astype(np.float64)
    off = s[~np.eye(n, dtype=bool)]
    k = int(np.ceil(quantile * off.size))
    thr = np.sort(off)[k - 1]
    a = dense_pairs_reference(x, y, thr, min_partners)
    relabel = _rng.permutation(n, _rng.derive_seed(seed, 0x3C3))
    inverse = np.argsort(relabel)
    a = a[np.ix_(relabel, relabel)]  # row/col i of the relabelled matrix = item relabel[i]
    sym = sp.csr_matrix((a | a.T).astype(np.int8))
    order = reverse_cuthill_mckee(sym, symmetric_mode=True)
    return relabel[order], thr, inverse
