"""Plain-Python references (no vectorisation, no torch) and the batches shared by the
``hardbatch.metrics`` tests (importable as ``metrics_reference``: see ``conftest.py``)."""

import math

BATCHES = [[0, 3, 5, 7], [11, 2, 9], [4, 4, 1, 6, 8], [10, 1]]


def ref_cos(a, b):
    na = math.sqrt(sum(v * v for v in a))
    nb = math.sqrt(sum(v * v for v in b))
    return sum(u * v for u, v in zip(a, b)) / (na * nb)


def ref_negative_similarities(x, batch):
    out = []
    for p in range(len(batch)):
        for q in range(p + 1, len(batch)):
            out.append(ref_cos(x[batch[p]], x[batch[q]]))
    return out
