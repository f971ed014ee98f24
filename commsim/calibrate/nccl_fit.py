"""Fit NCCL's model to measured NCCL collectives (nccl-tests logs, harness runs on nccl).

The model is the NCCL backend's price of each measurement (collectives.group.GroupCost:
NCCL's tuner picks the algorithm and protocol, the time is its latency plus the bytes
over the smaller of its bandwidth and the graph's share), with the cluster's `nccl`
settings holding the parameters: per link class (NVLink or PCI inside a node, the network
across nodes) a factor on NCCL's per-step latencies, and the per-channel bandwidth of its
rings on one node and across nodes (replacing what its topology search gives; every
algorithm's channels scale with them). Each is solved as the log of its ratio to NCCL's
own value, since all are positive and act multiplicatively, as the tier fit is
(calibrate.robust: soft-L1 on log residuals, no point cut; 95% intervals by bootstrap;
calibrate.diagnose's warnings). A parameter is fitted where some measurement depends on it
(moves by 0.1% or more when it moves by a unit of its log); the others keep NCCL's value
and the profile says why. The NCCL version is the one the runs recorded, else the
cluster's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commsim.calibrate import diagnose, robust
from commsim.calibrate.points import MIN_SHARE, Point
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
    spec: ClusterSpec  # the cluster with the fitted NCCL settings
    notes: list[str]
    warnings: list[str]


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


def measured_overrides(results: Results, source: str) -> dict[str, str]:
    """NCCL_ALGO / NCCL_PROTO as the runs exported them ({"algo": ..., "proto": ...}, only
    those set): the runs were timed under them, so the fit prices them so. Runs that
    disagree cannot share one fit (a SpecError)."""
    out: dict[str, str] = {}
    for var, key in (("NCCL_ALGO", "algo"), ("NCCL_PROTO", "proto")):
        seen = {r.meta.nccl_env.get(var) for r in results.runs.values()}
        if len(seen) > 1:
            shown = ", ".join(sorted(str(v or "unset") for v in seen))
            raise SpecError(source, "", f"the runs exported different {var} ({shown}): fit apart")
        if (value := seen.pop() if seen else None) is not None:
            out[key] = value
    return out


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
    overrides = measured_overrides(results, source)
    nccl = spec.nccl.model_copy(update={"version": version} | overrides)
    spec = spec.model_copy(update={"nccl": nccl})
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

    def resid(u: np.ndarray) -> np.ndarray:
        return np.log(times(u) / measured)

    u = np.zeros(len(params))
    jac = _jacobian(resid, u)
    free = np.max(np.abs(jac), axis=0) >= MIN_SHARE
    if not free.any():
        raise SpecError(source, "", "no NCCL parameter changes any prediction: nothing to fit")
    u, sd = _solve(resid, u, free)
    jac = _jacobian(resid, u)
    lost = free & (np.max(np.abs(jac), axis=0) < MIN_SHARE)
    if lost.any():  # stopped mattering at the solution: back to NCCL's value
        free &= ~lost
        u[lost] = 0.0
        if not free.any():
            raise SpecError(source, "", "no NCCL parameter changes any prediction: nothing to fit")
        u, sd = _solve(resid, u, free)
        jac = _jacobian(resid, u)
    j = jac[:, free]
    chosen = [p for p, f in zip(params, free, strict=True) if f]
    tangled = robust.tangled(j)
    if tangled.any():
        names = ", ".join(p.name for p, t in zip(chosen, tangled, strict=True) if t)
        raise SpecError(source, "", f"the measurements cannot separate {names}")
    r = resid(u)
    bound = np.full(int(free.sum()), BOUND)
    reps = robust.bootstrap(
        r + np.log(measured), j, u[free], -bound, bound, measured, [p.repeats for p in points], sd
    )
    names = [f"NCCL {p.name}" for p in chosen]
    warnings = diagnose.unidentified(names, diagnose.interval_effect(j, reps))
    warnings += diagnose.structure(points, r, sd)
    notes = [
        f"NCCL {p.name} kept NCCL's value: no measurement depends on it (measure smaller "
        "sizes for latencies, larger for channel bandwidth)"
        for p, f in zip(params, free, strict=True)
        if not f
    ]
    fit = _record(version, params, u, free, reps).model_copy(update=overrides)
    return NcclFitResult(fit, times(u), _spec(spec, params, u), notes, warnings)


def _record(version, params, u, free, reps) -> NcclFit:
    """The NcclFit of the solution: values, 95% intervals over the bootstrap replicates
    (a column per free parameter) of the fitted."""
    data: dict = {"version": version, "latency_scale": {}, "latency_scale_ci": {}}
    fitted, not_fitted, k = [], [], 0
    for p, x, f in zip(params, u, free, strict=True):
        if not f:
            not_fitted.append(p.name)
            continue
        value = p.start * math.exp(float(x))
        lo, hi = robust.interval(p.start * np.exp(reps[:, k]))
        k += 1
        fitted.append(p.name)
        if p.name.startswith("latency_scale."):
            cls = p.name.split(".", 1)[1]
            data["latency_scale"][cls] = value
            data["latency_scale_ci"][cls] = (lo, hi)
        else:
            data[f"{p.name}_Bps"] = value * 1e9
            data[f"{p.name}_ci_Bps"] = (lo * 1e9, hi * 1e9)
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


def _solve(resid, u: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, float]:
    """The robust solution over the free log-ratios within +-BOUND (calibrate.robust)."""

    def full(v: np.ndarray) -> np.ndarray:
        out = u.copy()
        out[free] = v
        return out

    bound = np.full(int(free.sum()), BOUND)
    v, sd = robust.solve(lambda v: resid(full(v)), u[free], -bound, bound, diff_step=1e-4)
    return full(v), sd
