"""Portable counter-based random numbers for the compiled kernels.

Every random choice hardbatch makes inside numba goes through SplitMix64
(Steele et al. 2014): a 64-bit state advanced by a fixed odd constant and
mixed by a bijection. It needs no global state, gives the same stream on
every machine and thread count, and lets each unit of work (a candidate
pool, a batch) own an independent stream derived from ``(seed, ...)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def derive_seed(*parts: int) -> int:
    """Mix integers into one 64-bit stream seed (pure Python, same as the kernels)."""
    state = 0x243F6A8885A308D3
    for part in parts:
        state = (state ^ (int(part) & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state


@njit(inline="always", cache=True)
def mix64(z: np.uint64) -> np.uint64:
    """SplitMix64's output bijection: the 64 random bits of state value ``z``.

    Draw i (1-based) of a stream started at state s is ``mix64(s + i * 0x9E3779B97F4A7C15)``
    (mod 2**64), so a kernel may compute draws out of order, without a state array.
    """
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(inline="always", cache=True)
def next_u64(state: np.ndarray) -> np.uint64:
    """Advance ``state[0]`` and return 64 random bits."""
    state[0] = state[0] + _GOLDEN
    return mix64(state[0])


@njit(inline="always", cache=True)
def rand_below(state: np.ndarray, n: np.int64) -> np.int64:
    """Uniform integer in ``[0, n)`` (53 random bits; bias below 2**-20 for n < 2**32)."""
    return np.int64((next_u64(state) >> np.uint64(11)) % np.uint64(n))


@njit(inline="always", cache=True)
def rand_unit(state: np.ndarray) -> np.float64:
    """Uniform float in ``[0, 1)``."""
    return np.float64(next_u64(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def shuffle_inplace(values: np.ndarray, state: np.ndarray) -> None:
    """Fisher-Yates shuffle of a 1-D array."""
    for i in range(values.shape[0] - 1, 0, -1):
        j = rand_below(state, i + 1)
        tmp = values[i]
        values[i] = values[j]
        values[j] = tmp


def new_state(seed: int) -> np.ndarray:
    """A one-element uint64 array holding a stream state for the kernels."""
    return np.array([seed & _MASK64], dtype=np.uint64)


def permutation(n: int, seed: int) -> np.ndarray:
    """A random permutation of ``range(n)`` (int64), identical on every machine."""
    out = np.arange(n, dtype=np.int64)
    shuffle_inplace(out, new_state(seed))
    return out
