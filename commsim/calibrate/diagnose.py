"""What makes a fit doubtful, said loudly (a profile's `warnings`): a parameter the data do
not pin down, residuals that follow the op or the size (the model misses something those
points share), and bandwidths the testbed's own TCP link check contradicts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from commsim.calibrate.points import Point
from commsim.calibrate.records import LinkCheckRecord
from commsim.units import fmt_bytes

# A parameter whose 95% interval moves some measured time by more than this (in log) is not
# identified: the data allow predictions that far apart.
IDENTIFIED = 0.10
# A group of points (one op, one size) whose median residual is off by more than this, and
# by more than 3 standard errors of a median (1.2533 sd / sqrt(n)), structures the residuals.
STRUCTURE = 0.05
MIN_GROUP = 3
# A fitted per-flow bandwidth more than this from the TCP goodput a link check measured, and
# with that goodput outside its 95% interval, contradicts the check (gloo itself may lose a
# few percent to its own framing and scheduling).
LINK_TOLERANCE = 0.05


def interval_effect(jac: np.ndarray, replicates: np.ndarray) -> np.ndarray:
    """Per parameter, the most its 95% interval (bootstrap percentiles) moves any point's
    log time: half the interval's width times the point's sensitivity |d log t / dx|."""
    lo, hi = np.percentile(replicates, (2.5, 97.5), axis=0)
    return np.max(np.abs(jac), axis=0) * (hi - lo) / 2


def unidentified(names: Sequence[str], effects: np.ndarray) -> list[str]:
    """A warning for each parameter whose interval moves a prediction over IDENTIFIED."""
    return [
        f"{name} is not identified: its 95% interval moves a measured time by up to "
        f"{100 * math.expm1(e):.0f}% (measure sizes or groups that depend on it)"
        for name, e in zip(names, effects, strict=True)
        if e > IDENTIFIED
    ]


def _nominal(nbytes: float) -> float:
    """The sweep size a point belongs to (the harness rounds to whole elements per rank)."""
    return float(2.0 ** round(math.log2(nbytes)))


def structure(points: Sequence[Point], resid: np.ndarray, sd: float) -> list[str]:
    """Warnings for ops and sizes whose points sit off the model together (STRUCTURE)."""
    out = []
    for label, key in (("op", lambda p: p.op), ("size", lambda p: _nominal(p.bytes))):
        groups: dict = {}
        for p, r in zip(points, resid, strict=True):
            groups.setdefault(key(p), []).append(r)
        for name, rs in groups.items():
            if len(rs) < MIN_GROUP or len(groups) < 2:
                continue
            med = float(np.median(rs))
            if abs(med) > max(STRUCTURE, 3 * 1.2533 * sd / math.sqrt(len(rs))):
                what = fmt_bytes(name) if label == "size" else name
                side = "slower" if med < 0 else "faster"
                out.append(
                    f"residuals are structured by {label}: {what} measures "
                    f"{100 * abs(math.expm1(-med)):.0f}% {side} than the model (median of "
                    f"{len(rs)} points): the model misses something these share"
                )
    return out


def flow_bandwidth(
    tier: str, sharing: int, bandwidths: dict[str, float], uplinks: int
) -> float | None:
    """What the fitted links give each of `sharing` flows a link check ran on `tier`: a
    NIC's bandwidth in a rack; across racks also the rack's uplink, split over its
    `uplinks` parallel links (one flow takes one) and shared by the flows."""
    nic = bandwidths.get("inter-node")
    if tier == "inter-node":
        return nic
    uplink = bandwidths.get("cross-rack")
    if uplink is None:
        return None
    per_flow = uplink / max(sharing, uplinks)
    return per_flow if nic is None else min(nic, per_flow)


def link_contradictions(
    checks: Sequence[LinkCheckRecord],
    bandwidths: dict[str, float],
    intervals: dict[str, tuple[float, float]],
    uplinks: int,
) -> list[str]:
    """Warnings where the fit's per-flow bandwidth and a link check's TCP goodput disagree
    (LINK_TOLERANCE); intervals: each tier's 95% bandwidth interval (its value where it
    has none), which flow_bandwidth carries to the per-flow figure."""
    ends = [{t: intervals.get(t, (b, b))[k] for t, b in bandwidths.items()} for k in (0, 1)]
    out = []
    for check in checks:
        for row in check.links:
            if row.tier is None:
                continue
            fitted = flow_bandwidth(row.tier, row.sharing, bandwidths, uplinks)
            if fitted is None:
                continue
            lo, hi = (flow_bandwidth(row.tier, row.sharing, e, uplinks) for e in ends)
            measured = float(np.median(row.measured_Bps))
            if abs(fitted / measured - 1) > LINK_TOLERANCE and not lo <= measured <= hi:
                out.append(
                    f"the fit contradicts the testbed's link check ({check.testbed}, "
                    f"{row.link}): {fitted / 1e6:.4g} MB/s a flow fitted (95%: "
                    f"{lo / 1e6:.4g}-{hi / 1e6:.4g}), {measured / 1e6:.4g} MB/s of TCP "
                    f"goodput measured ({100 * (fitted / measured - 1):+.0f}%)"
                )
    return out
