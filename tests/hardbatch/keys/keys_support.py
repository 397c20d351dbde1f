"""Helpers of the ``hardbatch.keys`` tests: duplicate keys of the contract's N items, embeddings
where copies are nearest neighbours, and the count of clashes in batches (key sets:
``tests/sampler_support.py``)."""

import numpy as np
from sampler_support import N


def copies_keys(n=N, groups=150, size=3, seed=0):
    """Keys of ``n`` items where ``groups`` keys are held by ``size`` items each."""
    r = np.random.default_rng(seed)
    keys = [f"item{i}" for i in range(n)]
    members = r.permutation(n)[:groups * size].reshape(groups, size)
    for g, row in enumerate(members):
        for i in row:
            keys[i] = f"copy{g}"
    return keys


def with_copies(emb, keys):
    """Embeddings where items sharing a key are (near) copies: nearest neighbours."""
    x = emb.copy()
    first = {}
    for i, k in enumerate(keys):
        j = first.setdefault(k, i)
        x[i] = emb[j] + 1e-4 * np.cos(i + np.arange(emb.shape[1]))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clashes(batches, keys) -> int:
    return sum(len(b) - len({keys[i] for i in b}) for b in batches)
