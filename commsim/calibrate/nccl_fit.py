"""Fit NCCL's model to measured NCCL collectives (nccl-tests logs, harness runs on nccl).

The model is the NCCL backend's price of each measurement (collectives.group.GroupCost:
NCCL's tuner picks the algorithm and protocol, the time is its latency plus the bytes
over the smaller of its bandwidth and the graph's share), with the cluster's `nccl`
settings holding the parameters: per link class (NVLink or PCI inside a node, the network
across nodes) a factor on NCCL's per-step latencies, and the per-channel bandwidth of its
rings on one node and across nodes (replacing what its topology search gives; every
algorithm's channels scale with them). Each is solved as the log of its ratio to NCCL's
own value, since all are positive and act multiplicatively, by the tier fit's procedure
(calibrate.fit): residuals log(predicted / measured), a soft-L1 first pass, points over 4
robust standard deviations set aside, plain least squares on the rest, linearised 95%
intervals. A parameter is fitted where some measurement depends on it (moves by 0.1% or
more when it moves by a unit of its log); the others keep NCCL's value and the profile
says why. The NCCL version is the one the runs recorded, else the cluster's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from commsim.calibrate.points import MIN_SHARE, Point, inliers
from commsim.calibrate.records import Results
from commsim.collectives import nccl
from commsim.collectives.group import GroupCost
from commsim.profile import NcclFit
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import build_cluster

BOUND = 5.0  # a parameter stays within e^-5 .. e^5 of NCCL's value


@dataclass(frozen=True)
class Param:
    name: str  # latency_scale.<class>, channel_bandwidth_intra, channel_bandwidth_inter
    start: float  # NCCL's own value (1 for a latency factor; GB/s for a channel)


@dataclass
class NcclFitResult:
    fit: NcclFit
    predicted: np.ndarray
    keep: np.ndarray  # points used (not outliers)
    spec: ClusterSpec  # the cluster with the fitted NCCL settings
    notes: list[str]


def measured_version(results: Results, spec: ClusterSpec) -> str:
    """The NCCL version the runs recorded (one, and one commsim encodes), else the spec's."""
    seen = {r.meta.versions.get("nccl") for r in results.runs.values()} - {None, "", "unknown"}
    if len(seen) == 1:
        version = seen.pop()
        try:
            nccl.tables(version)
            return version
        except ValueError:
            pass
    return spec.nccl.version


def _candidates(spec: ClusterSpec, points: list[Point]) -> list[Param]:
    """The parameters some measurement could depend on, at NCCL's own values."""
    gpn = spec.node.gpus_per_node
    shapes = {(len(p.gpus), len({g // gpn for g in p.gpus})) for p in points}
    intra = "nvlink" if spec.node.interconnect == "nvswitch" else "pci"
    params = []
    if any(n > nodes for n, nodes in shapes):  # two ranks share a node somewhere
        params.append(Param(f"latency_scale.{intra}", 1.0))
    if any(nodes > 1 for _, nodes in shapes):
        params.append(Param("latency_scale.net", 1.0))
    one = [(n, nodes) for n, nodes in shapes if nodes == 1]
    many = [(n, nodes) for n, nodes in shapes if nodes > 1]
    if one:
        n, _ = max(one)
        params.append(
            Param("channel_bandwidth_intra", nccl.comm_model(spec, n, 1).graphs.ring.bw_intra)
        )
    if many:
        n, nodes = max(many)
        ring = nccl.comm_model(spec, n, nodes).graphs.ring
        params.append(Param("channel_bandwidth_inter", ring.bw_inter))
    return params


def _spec(spec: ClusterSpec, params: list[Param], u: np.ndarray) -> ClusterSpec:
    """The cluster with the parameters at log-ratios u to NCCL's values."""
    nc = spec.nccl
    scale, update = dict(nc.latency_scale), {}
    for p, x in zip(params, u, strict=True):
        value = p.start * math.exp(float(x))
        if p.name.startswith("latency_scale."):
            scale[p.name.split(".", 1)[1]] = value
        else:
            update[p.name] = value * 1e9
    return spec.model_copy(update={"nccl": nc.model_copy(update={"latency_scale": scale} | update)})


def fit_nccl(
    results: Results,
    spec: ClusterSpec,
    points: list[Point],
    algorithms: dict[str, str],
    source: str,
) -> NcclFitResult:
    """Fit the NCCL parameters the points determine (see the module docstring)."""
    version = measured_version(results, spec)
    spec = spec.model_copy(update={"nccl": spec.nccl.model_copy(update={"version": version})})
    cluster = build_cluster(spec, max(max(p.gpus) for p in points) + 1)
    groups: dict[tuple[int, ...], GroupCost] = {}
    for p in points:
        if p.gpus not in groups:
            groups[p.gpus] = GroupCost(cluster, np.array(p.gpus), backend="nccl")
    batches: dict[tuple, list[int]] = {}
    for i, p in enumerate(points):
        batches.setdefault((p.gpus, p.op), []).append(i)
    sizes = np.array([p.bytes for p in points])
    measured = np.array([p.measured_s for p in points])
    params = _candidates(spec, points)

    def times(u: np.ndarray) -> np.ndarray:
        fitted = _spec(spec, params, u)
        out = np.empty(len(points))
        for (gpus, op), idx in batches.items():
            cost = groups[gpus].with_nccl(fitted)
            out[idx] = cost.time(op, algorithms[op], sizes[idx])
        return out

    def resid(u: np.ndarray, rows=slice(None)) -> np.ndarray:
        return np.log(times(u)[rows] / measured[rows])

    u = np.zeros(len(params))
    notes: list[str] = []
    jac = _jacobian(resid, u)
    free = np.max(np.abs(jac), axis=0) >= MIN_SHARE
    if not free.any():
        raise SpecError(source, "", "no NCCL parameter changes any prediction: nothing to fit")
    u = _solve(resid, u, free, "soft_l1")
    keep = inliers(resid(u))
    if keep.sum() <= free.sum():
        raise SpecError(source, "", "too few consistent points to fit: measure more")
    u = _solve(lambda v: resid(v, keep), u, free, "linear")
    jac = _jacobian(resid, u)
    lost = free & (np.max(np.abs(jac[keep]), axis=0) < MIN_SHARE)
    if lost.any():  # stopped mattering at the refit: back to NCCL's value
        free &= ~lost
        u[lost] = 0.0
        u = _solve(lambda v: resid(v, keep), u, free, "linear") if free.any() else u
    r = resid(u)[keep]
    dof = max(int(keep.sum() - free.sum()), 1)
    j = jac[keep][:, free]
    try:
        cov = float(r @ r) / dof * np.linalg.inv(j.T @ j)
        sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    except np.linalg.LinAlgError:
        names = ", ".join(p.name for p, f in zip(params, free, strict=True) if f)
        raise SpecError(source, "", f"the measurements cannot separate {names}") from None
    t = float(stats.t.ppf(0.975, dof))
    fit = _record(version, params, u, free, sd, t)
    for p, f in zip(params, free, strict=True):
        if not f:
            notes.append(
                f"NCCL {p.name} kept NCCL's value: no measurement depends on it (measure "
                "smaller sizes for latencies, larger for channel bandwidth)"
            )
    if not keep.all():
        notes.append(f"left out {int((~keep).sum())} of {len(points)} points as outliers")
    return NcclFitResult(fit, times(u), keep, _spec(spec, params, u), notes)


def _record(version, params, u, free, sd, t) -> NcclFit:
    """The NcclFit of the solution: values, 95% intervals (x exp(+- t sd)) of the fitted."""
    data: dict = {"version": version, "latency_scale": {}, "latency_scale_ci": {}}
    fitted, not_fitted, k = [], [], 0
    for p, x, f in zip(params, u, free, strict=True):
        if not f:
            not_fitted.append(p.name)
            continue
        value = p.start * math.exp(float(x))
        spread = math.exp(min(t * float(sd[k]), 700.0))
        k += 1
        fitted.append(p.name)
        if p.name.startswith("latency_scale."):
            cls = p.name.split(".", 1)[1]
            data["latency_scale"][cls] = value
            data["latency_scale_ci"][cls] = (value / spread, value * spread)
        else:
            data[f"{p.name}_Bps"] = value * 1e9
            data[f"{p.name}_ci_Bps"] = (value * 1e9 / spread, value * 1e9 * spread)
    return NcclFit(**data, fitted=fitted, not_fitted=not_fitted)


def _jacobian(resid, u: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """d log(predicted) / d u by one-sided differences."""
    base = resid(u)
    cols = []
    for j in range(u.size):
        bumped = u.copy()
        bumped[j] += h
        cols.append((resid(bumped) - base) / h)
    return np.column_stack(cols) if cols else np.zeros((base.size, 0))


def _solve(resid, u: np.ndarray, free: np.ndarray, loss: str) -> np.ndarray:
    """Least squares over the free log-ratios within +-BOUND (soft_l1 at 10%)."""

    def full(v: np.ndarray) -> np.ndarray:
        out = u.copy()
        out[free] = v
        return out

    res = optimize.least_squares(
        lambda v: resid(full(v)),
        u[free],
        bounds=(-BOUND, BOUND),
        diff_step=1e-4,
        method="trf",
        loss=loss,
        f_scale=0.1,
    )
    return full(res.x)
