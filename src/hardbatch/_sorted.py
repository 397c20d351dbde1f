"""A compiled helper shared by the top-k kernels (proximity graph, GCBS pair blocks).

Public names of a private module: the library's own helpers, not part of the user API.
"""

from __future__ import annotations

from numba import njit

__all__ = ["insert_descending"]


@njit(inline="always", cache=True)
def insert_descending(values, ids, free: int, value, ident) -> None:
    """Insert ``(value, ident)`` into ``values/ids[:free + 1]``, kept in decreasing order of
    ``values[:free]``: larger values move up one slot from ``free``; equal ones stay first
    (a stable insertion)."""
    t = free
    while t > 0 and values[t - 1] < value:
        values[t] = values[t - 1]
        ids[t] = ids[t - 1]
        t -= 1
    values[t] = value
    ids[t] = ident
