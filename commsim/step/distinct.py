"""Rows equal in every one of some columns, integer or float, found exactly: so work that reads
only those columns runs once per distinct row and is broadcast back (step.compute).

The columns' bits are hashed into one 64-bit word a row and np.unique groups the words; every
row's bits are then compared with its group's first row's, so a hash collision cannot merge
rows that differ (the caller gets None and works row by row). Bits, not values, are compared:
-0.0 and 0.0 (whose reciprocals differ) stay apart.
"""

from __future__ import annotations

import numpy as np

# an odd 64-bit multiplier (the golden ratio's, Knuth's multiplicative hashing)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def _bits(col, n: int) -> np.ndarray:
    """A column of n values as 64-bit words: floats by their bits."""
    col = np.asarray(col)
    col = col.astype(np.float64) if col.dtype.kind == "f" else col.astype(np.int64)
    return np.broadcast_to(col, (n,)).view(np.uint64)


def row_hash(words: list[np.ndarray]) -> np.ndarray:
    """One 64-bit word a row mixing `words` (wrapping multiply-xor; collisions are caught by
    distinct_rows)."""
    h = np.zeros(len(words[0]), dtype=np.uint64)
    for w in words:
        h = (h ^ w) * _MULTIPLIER
        h ^= h >> np.uint64(29)
    return h


def distinct_rows(cols: list, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(group of each of n rows, a row of each group) of rows whose columns (arrays of n;
    a scalar is the same in every row) are bit-for-bit equal; None if two different rows
    hashed alike."""
    words = [_bits(c, n) for c in cols if np.ndim(c)]
    if not words:
        return np.zeros(n, dtype=np.intp), np.zeros(min(n, 1), dtype=np.intp)
    _, inverse = np.unique(row_hash(words), return_inverse=True)
    inverse = inverse.ravel()
    first = np.empty(int(inverse.max(initial=-1)) + 1, dtype=np.intp)
    first[inverse] = np.arange(n)  # a row of each group (any: they are compared below)
    if any((w[first][inverse] != w).any() for w in words):
        return None
    return inverse, first
