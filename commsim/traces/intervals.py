"""Sets of time intervals: union, measure, difference, clipping. A set is a sorted array of
disjoint [start, end) rows; every figure of a trace summary (busy, exposed, idle) is a
measure of such sets."""

from __future__ import annotations

import numpy as np


def union(spans) -> np.ndarray:
    """The union of intervals (rows of start, end, in any order) as sorted disjoint rows."""
    a = np.asarray(spans, dtype=float).reshape(-1, 2)
    a = a[a[:, 1] > a[:, 0]]
    if len(a) == 0:
        return np.zeros((0, 2))
    a = a[np.argsort(a[:, 0], kind="stable")]
    ends = np.maximum.accumulate(a[:, 1])
    # a new run starts where an interval begins after everything before it has ended
    new = np.ones(len(a), dtype=bool)
    new[1:] = a[1:, 0] > ends[:-1]
    starts = a[new, 0]
    last = np.flatnonzero(np.r_[new[1:], True])
    return np.column_stack([starts, ends[last]])


def measure(spans) -> float:
    """Total length of the union of intervals."""
    u = union(spans)
    return float((u[:, 1] - u[:, 0]).sum())


def clip(spans, lo: float, hi: float) -> np.ndarray:
    """Intervals cut to [lo, hi) (empty ones dropped)."""
    a = np.asarray(spans, dtype=float).reshape(-1, 2)
    c = np.column_stack([np.maximum(a[:, 0], lo), np.minimum(a[:, 1], hi)])
    return c[c[:, 1] > c[:, 0]]


def difference(a, b) -> np.ndarray:
    """The part of the union of `a` not covered by the union of `b`, as disjoint rows."""
    a, b = union(a), union(b)
    out = []
    for s, e in a.tolist():
        t = s
        lo = np.searchsorted(b[:, 1], s, side="right")  # first b ending after s
        for bs, be in b[lo:].tolist():
            if bs >= e:
                break
            if bs > t:
                out.append((t, bs))
            t = max(t, be)
            if t >= e:
                break
        if t < e:
            out.append((t, e))
    return np.array(out, dtype=float).reshape(-1, 2)
