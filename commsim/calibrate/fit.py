"""Fit each link tier's alpha and bandwidth to measured collectives, with 95% intervals.

The model is commsim's own graph evaluator: a measurement of `op` over a group of ranks
placed on the cluster's GPUs costs what the backend's algorithm (backends.ALGORITHMS,
priced by GroupCost) costs there, step by step, with flows routed and sharing links
max-min fairly. Its parameters
are, per tier, alpha (seconds per message) and beta = 1 / bandwidth (seconds per byte);
apply_tiers writes them into the cluster's links.

Why least squares on this model is well posed: for a fixed schedule every flow's time is
its path latency (a sum of alphas, plus LogP overheads that are halves of them) plus its
bytes over max-min fair rates, which are piecewise linear in the betas; a step takes its
slowest flow and the collective sums its steps. So the predicted time is piecewise linear
in (alpha, beta) (Thakur et al. 2005's alpha-beta sums are the uniform-network case:
ring all-reduce 2(N-1) alpha + 2(N-1)/N S beta), and homogeneous of degree 1. Within one
piece the Jacobian, taken by finite differences of the graph evaluator, holds exactly the
schedule's coefficients: how many alphas and how many bytes per beta each point pays in
each tier. scipy's trust-region least squares (Branch, Coleman & Li 1999) moves between
pieces. Residuals are log(predicted / measured): timing noise is multiplicative, sizes span
eight decades, and a stalled process (a point 40x too slow) must look as wrong as it is.
A first pass with a soft-L1 loss finds the bulk; points over 4 robust standard deviations
from it are set aside (and named in the profile's notes); plain least squares on the rest
gives the estimate.

Intervals: the linearised covariance s^2 (J^T J)^-1, s^2 = sum r^2 / (m - p), with
Student's t at m - p degrees of freedom (Seber & Wild 2003, Nonlinear Regression, 5.1),
carried to each tier's alpha and log-bandwidth by the delta method. A tier is fitted where
the data separate it: its parameters are free when some measured group spans exactly that
tier (one node, several nodes of one rack, several racks) and a parameter moves some
point's time by at least 0.1%; the others keep the cluster's value.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from commsim import __version__, catalog
from commsim.calibrate.points import MIN_SHARE, Point, collect_points, inliers
from commsim.calibrate.records import Results
from commsim.collectives.backends import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.profile import (
    TIERS,
    ComputeFit,
    Profile,
    Provenance,
    TierFit,
    apply_tiers,
    cable_share,
    leaf_uplinks,
    parsed,
    tier_params,
)
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import build_cluster

BETA_FLOOR = 1e-6  # beta may fall to this fraction of its start (bandwidth x 1e6), no lower


# --------------------------------------------------------------------------- the model


def model_times(spec: ClusterSpec, points: list[Point], algorithms: dict[str, str]) -> np.ndarray:
    """Predicted seconds of every point on the cluster `spec` describes."""
    top = max(max(p.gpus) for p in points)
    cluster = build_cluster(spec, top + 1)
    groups: dict[tuple[int, ...], GroupCost] = {}
    memo: dict[tuple[tuple[int, ...], str, float], float] = {}
    out = np.empty(len(points))
    for i, p in enumerate(points):
        key = (p.gpus, p.op, p.bytes)
        if key not in memo:
            cost = groups.get(p.gpus) or groups.setdefault(
                p.gpus,
                GroupCost(cluster, p.gpus, backend="gloo"),  # the tier fit: gloo's
            )
            memo[key] = float(cost.time(p.op, algorithms[p.op], p.bytes)[0])
        out[i] = memo[key]
    return out


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Param:
    """One fitted number: tier, name, bounds, start, and the scale it is solved in."""

    tier: str
    name: str  # alpha (s), beta (s/B), hops, share: see TierModel
    lower: float
    upper: float
    start: float
    scale: float


class TierModel:
    """The parameters of the tiers a fit frees, and the cluster they describe.

    intra-node and inter-node: alpha and beta = 1 / bandwidth. cross-rack, as apply_tiers
    can build it: with inter-node also fitted, `hops` (alpha_cross = alpha_inter (1 + 2
    hops): two more cable + switch hops, as many as the in-rack path holds), else its
    alpha; and `share` in ((k-1)/k, 1] (uplink = share x k x NIC bandwidth, k the leaf's
    parallel uplinks). Bounds keep every value buildable, so the fit never leaves the
    model."""

    def __init__(self, spec: ClusterSpec, tiers: list[str]) -> None:
        spec = parsed(spec)
        self.spec, self.tiers = spec, tiers
        self.k = leaf_uplinks(spec)
        base = tier_params(spec)
        fab = spec.fabric
        hop = fab.link_latency + fab.switch_latency
        params = []
        if "intra-node" in tiers:
            params += self._pair("intra-node", 0.0, *base["intra-node"])
        if "inter-node" in tiers:
            floor = 0.0 if "cross-rack" in tiers else 2 * fab.link_latency + fab.switch_latency
            params += self._pair("inter-node", floor, *base["inter-node"])
        if "cross-rack" in tiers:
            alpha_x, uplink = base["cross-rack"]
            if "inter-node" in tiers:  # the in-rack path holds hop (1 + cable share)
                alpha_in, top = base["inter-node"][0], 1.0 / (1.0 + cable_share(spec))
                start = min(top, (alpha_x - alpha_in) / (2 * alpha_in)) if alpha_in else 0.0
                params.append(Param("cross-rack", "hops", 0.0, top, start, 1.0))
            else:
                floor = 3 * hop + fab.link_latency
                params.append(
                    Param("cross-rack", "alpha", floor, np.inf, alpha_x, max(alpha_x, 1e-6))
                )
            low = (self.k - 1) / self.k + 1e-6
            share = np.clip(uplink / (self.k * spec.node.nics.bandwidth), low, 1.0)
            params.append(Param("cross-rack", "share", low, 1.0, float(share), 1.0))
        self.params = params

    @staticmethod
    def _pair(tier: str, floor: float, alpha: float, bandwidth: float) -> list[Param]:
        beta = 1.0 / bandwidth
        return [
            Param(tier, "alpha", floor, np.inf, max(alpha, floor), max(alpha, floor, 1e-6)),
            Param(tier, "beta", BETA_FLOOR * beta, np.inf, beta, beta),
        ]

    def values(self, theta: np.ndarray) -> dict[str, tuple[float, float]]:
        """(alpha, bandwidth) of each fitted tier."""
        v = {(p.tier, p.name): float(x) for p, x in zip(self.params, theta, strict=True)}
        out = {}
        for tier in ("intra-node", "inter-node"):
            if tier in self.tiers:
                out[tier] = (v[tier, "alpha"], 1.0 / v[tier, "beta"])
        if "cross-rack" in self.tiers:
            if "inter-node" in self.tiers:
                alpha_in, nic = out["inter-node"]
                alpha_x = alpha_in * (1 + 2 * v["cross-rack", "hops"])
            else:
                alpha_x, nic = v["cross-rack", "alpha"], self.spec.node.nics.bandwidth
            out["cross-rack"] = (alpha_x, v["cross-rack", "share"] * self.k * nic)
        return out

    def cluster(self, theta: np.ndarray) -> ClusterSpec:
        return apply_tiers(self.spec, self.values(theta))


@dataclass
class FitResult:
    """A fitted profile, the points it was fitted to, the model's times for them, and the
    cluster with the fitted tiers written in."""

    profile: Profile
    points: list[Point]
    predicted_s: np.ndarray
    spec: ClusterSpec


def _jacobian(f: Callable[[np.ndarray], np.ndarray], theta, t0, step: np.ndarray):
    """Jacobian by one-sided differences: exact within a linear piece of the model, which
    is all a step of 1e-5 of a parameter's scale sees."""
    cols = []
    for j in range(theta.size):
        bumped = theta.copy()
        bumped[j] += step[j]
        cols.append((f(bumped) - t0) / step[j])
    return np.column_stack(cols)


def _steps(model: TierModel, theta: np.ndarray) -> np.ndarray:
    """Finite-difference steps: 1e-5 of each scale, backwards where forward would leave
    the parameter's range."""
    h = np.array([1e-5 * p.scale for p in model.params])
    upper = np.array([p.upper for p in model.params])
    return np.where(theta + h > upper, -h, h)


def _solve(
    times, measured: np.ndarray, model: TierModel, theta0: np.ndarray, free, loss: str
) -> np.ndarray:
    """Relative least squares over the free parameters, each in units of its scale; loss
    "soft_l1" (scale 10%) lets a few wild points (a stalled process) pull far less."""
    ps = [p for p, f in zip(model.params, free, strict=True) if f]
    scale = np.array([p.scale for p in ps])

    def full(u: np.ndarray) -> np.ndarray:
        theta = theta0.copy()
        theta[free] = u * scale
        return theta

    lower = np.array([p.lower for p in ps]) / scale
    upper = np.array([p.upper for p in ps]) / scale
    res = optimize.least_squares(
        lambda u: np.log(times(full(u)) / measured),
        np.clip(theta0[free] / scale, lower, upper),
        bounds=(lower, upper),
        diff_step=1e-5,
        method="trf",
        x_scale="jac",
        loss=loss,
        f_scale=0.1,
    )
    return full(res.x)


def fit_profile(results: Results, spec: ClusterSpec, *, source: str = "results") -> FitResult:
    """Fit the tiers the data separate, and the compute rate, into a Profile for `spec`."""
    backends = results.backends
    if len(backends) != 1:
        raise SpecError(source, "backend", f"runs mix backends {sorted(backends)}: fit one")
    backend = backends.pop()
    if backend not in ALGORITHMS:
        known = ", ".join(ALGORITHMS)
        raise SpecError(source, "backend", f"no algorithm table for {backend!r} ({known})")
    algorithms = ALGORITHMS[backend]
    points, notes = collect_points(results, spec)
    if not points:
        raise SpecError(source, "", "no measured collective of two or more ranks to fit")
    if backend == "nccl":
        return _fit_nccl_profile(results, spec, points, notes, source)
    spans = Counter(p.span for p in points)
    model = TierModel(spec, [t for t in TIERS if spans.get(t)])
    if len(points) <= len(model.params):
        raise SpecError(
            source,
            "",
            f"{len(points)} points cannot fit {len(model.params)} parameters: measure more",
        )
    measured = np.array([p.measured_s for p in points])

    def times(theta: np.ndarray) -> np.ndarray:
        return model_times(model.cluster(theta), points, algorithms)

    nominal = np.array([p.start for p in model.params])
    theta = nominal.copy()
    scale = np.array([p.scale for p in model.params])
    free = np.zeros(theta.size, dtype=bool)
    for _ in range(3):  # parameters can start or stop mattering as the others move
        predicted = times(theta)
        jac = _jacobian(times, theta, predicted, _steps(model, theta))
        matters = _matters(jac, scale, predicted)
        if not matters.any():
            raise SpecError(source, "", "no tier parameter changes any prediction: nothing to fit")
        if np.array_equal(matters, free):
            break
        free = matters
        theta = _solve(times, measured, model, theta, free, "soft_l1")
    keep = inliers(np.log(times(theta) / measured))
    if keep.sum() <= free.sum():
        raise SpecError(source, "", "too few consistent points to fit: measure more")
    was_fitted = free.copy()
    for _ in range(3):  # a parameter can stop mattering at the refit: pin it and refit
        theta = _solve(lambda th: times(th)[keep], measured[keep], model, theta, free, "linear")
        predicted = times(theta)
        jac = _jacobian(times, theta, predicted, _steps(model, theta))
        lost = free & ~_matters(jac[keep], scale, predicted[keep])
        if not lost.any():
            break
        free &= ~lost
        theta[lost] = nominal[lost]
        if not free.any():
            raise SpecError(source, "", "no tier parameter changes any prediction: nothing to fit")
    rel_jac = jac[keep][:, free] / predicted[keep, None]  # of log(predicted)
    resid = np.log(predicted[keep] / measured[keep])
    dof = int(keep.sum() - free.sum())
    _check_separable(rel_jac, [p for p, f in zip(model.params, free, strict=True) if f], source)
    cov = np.zeros((theta.size, theta.size))
    cov[np.ix_(free, free)] = float(resid @ resid) / dof * np.linalg.inv(rel_jac.T @ rel_jac)
    if not keep.all():
        worst = int(np.argmax(np.abs(np.log(predicted / measured))))
        p = points[worst]
        notes.append(
            f"left out {int((~keep).sum())} of {len(points)} points as outliers (over 4 robust "
            f"sd from the fit); worst: {p.op} of {p.bytes:.0f} B on {len(p.gpus)} ranks "
            f"(line {p.line}), measured {p.measured_s:.3g} s, model {predicted[worst]:.3g} s"
        )
    tiers = _tier_fits(model, theta, cov, stats.t.ppf(0.975, dof), free, spans)
    for p, f, x, was_free in zip(model.params, free, theta, was_fitted, strict=True):
        if not f:
            why = (
                "the points that did were left out as outliers"
                if was_free
                else "measure smaller sizes for alpha, larger for bandwidth"
            )
            notes.append(
                f"{p.tier} {p.name} kept the cluster's value: no measurement depends on it "
                f"({why}, or another link is the bottleneck)"
            )
        elif min(x - p.lower, p.upper - x) <= 1e-6 * p.scale:
            notes.append(f"{p.tier} {p.name} ended at its bound ({p.lower:g}..{p.upper:g})")
    profile = Profile(
        cluster=spec.name,
        backend=backend,
        tiers=tiers,
        algorithms=algorithms,
        compute=fit_compute(results, spec),
        provenance=Provenance(
            files=results.files,
            runs=list(results.runs),
            date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            points=len(points),
            commsim=__version__,
            rms_rel_error=float(np.sqrt(np.mean(np.expm1(resid) ** 2))),  # points kept
        ),
        notes=notes,
    )
    return FitResult(profile, points, predicted, model.cluster(theta))


def _fit_nccl_profile(
    results: Results, spec: ClusterSpec, points: list[Point], notes: list[str], source: str
) -> FitResult:
    """An NCCL backend's profile: NCCL's model fitted (calibrate.nccl_fit); the link tiers
    keep the cluster's values (under NCCL they only cap bandwidth where the fabric is
    congested, which nccl-tests on a quiet fabric does not show)."""
    from commsim.calibrate.nccl_fit import fit_nccl

    algorithms = ALGORITHMS["nccl"]
    result = fit_nccl(results, spec, points, algorithms, source)
    measured = np.array([p.measured_s for p in points])
    kept = result.keep
    resid = result.predicted[kept] / measured[kept] - 1.0
    profile = Profile(
        cluster=spec.name,
        backend="nccl",
        tiers={},
        algorithms=algorithms,
        nccl=result.fit,
        compute=fit_compute(results, spec),
        provenance=Provenance(
            files=results.files,
            runs=list(results.runs),
            date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            points=len(points),
            commsim=__version__,
            rms_rel_error=float(np.sqrt(np.mean(resid**2))),
        ),
        notes=[*notes, *result.notes],
    )
    return FitResult(profile, points, result.predicted, result.spec)


def _matters(jac: np.ndarray, scale: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Parameters that move some point's time by MIN_SHARE or more over their scale."""
    return np.max(np.abs(jac) * scale / predicted[:, None], axis=0) >= MIN_SHARE


def _check_separable(jac: np.ndarray, params: list[Param], source: str) -> None:
    """Refuse parameters the points cannot tell apart (collinear Jacobian columns)."""
    norms = np.linalg.norm(jac, axis=0)
    _, sv, vt = np.linalg.svd(jac / norms, full_matrices=False)
    if sv[-1] < 1e-9 * sv[0]:
        tangled = [params[i] for i in np.nonzero(np.abs(vt[-1]) > 0.1)[0]]
        names = ", ".join(f"{p.tier} {p.name}" for p in tangled)
        raise SpecError(
            source, "", f"the measurements cannot separate {names}: measure more sizes or groups"
        )


def _tier_fits(
    model: TierModel, theta: np.ndarray, cov: np.ndarray, t: float, free, spans: Counter
) -> dict[str, TierFit]:
    """Each tier's alpha and bandwidth with 95% intervals by the delta method: alpha
    +- t sd, bandwidth x exp(+- t sd(log bandwidth)), gradients by finite differences of
    TierModel.values (no model evaluation)."""

    def flat(th: np.ndarray) -> np.ndarray:
        return np.array([[a, np.log(b)] for a, b in model.values(th).values()]).ravel()

    base = flat(theta)
    steps = _steps(model, theta)
    grad = np.column_stack(
        [
            (flat(theta + np.eye(theta.size)[j] * steps[j]) - base) / steps[j]
            for j in range(theta.size)
        ]
    )
    sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", grad, cov, grad), 0.0))
    out = {}
    for i, (tier, (alpha, bw)) in enumerate(model.values(theta).items()):
        mine = [p.tier == tier for p in model.params]
        names = {p.name for p, m, f in zip(model.params, mine, free, strict=True) if m and f}
        fitted_alpha = bool(names & {"alpha", "hops"})
        fitted_bw = bool(names & {"beta", "share"})
        spread = math.exp(min(t * float(sd[2 * i + 1]), 700.0))  # overflows to inf: unbounded
        high = bw * spread
        if tier == "cross-rack":  # the leaf's k uplinks at the NIC rate are its ceiling
            high = min(high, bw / float(theta[[p.name == "share" for p in model.params]][0]))
        out[tier] = TierFit(
            alpha_s=alpha,
            alpha_ci_s=(max(0.0, alpha - t * sd[2 * i]), alpha + t * sd[2 * i])
            if fitted_alpha
            else None,
            bandwidth_Bps=bw,
            bandwidth_ci_Bps=(bw / spread, high) if fitted_bw else None,
            points=spans[tier],
            fitted=[n for n, f in (("alpha", fitted_alpha), ("bandwidth", fitted_bw)) if f],
        )
    return out


def fit_compute(results: Results, spec: ClusterSpec) -> ComputeFit | None:
    """Model FLOP/s per rank from the data-parallel runs: 3 x forward FLOPs per sample
    (backward is twice forward: commsim.workload) x batch over forward + backward time
    (compute alone minus the optimizer); None without such runs."""
    flops, times, lows, highs, model = [], [], [], [], ""
    for run in results.runs.values():
        if run.model is None or not run.ddp:
            continue
        model = run.model.name
        step_flops = 3.0 * sum(layer.forward_flops for layer in run.model.layers)
        step_flops *= run.model.batch
        for d in run.ddp:
            flops.append(step_flops)
            times.append(d.compute_s - d.optimizer_s)
            lows.append((d.compute_p10_s or d.compute_s) - d.optimizer_s)
            highs.append((d.compute_p90_s or d.compute_s) - d.optimizer_s)
    if not flops:
        return None
    rate = np.array(flops) / np.array(times)
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    mid = float(np.median(rate))
    return ComputeFit(
        flops_per_s=mid,
        flops_per_s_range=(
            float(np.min(np.array(flops) / np.array(highs))),
            float(np.max(np.array(flops) / np.array(lows))),
        ),
        efficiency=mid / gpu.peak_flops,
        gpu=gpu.name,
        model=model,
        points=len(flops),
    )
