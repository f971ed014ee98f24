"""Fit each link tier's alpha and bandwidth, and the backend's per-call overhead, to measured
collectives, with 95% intervals and warnings where the fit is doubtful.

The model is commsim's own graph evaluator: a measurement of `op` over a group of ranks
placed on the cluster's GPUs costs what the backend's algorithm (backends.ALGORITHMS,
priced by GroupCost) costs there, step by step, with flows routed and sharing links
max-min fairly, plus one per-call software overhead (ClusterSpec.call_overhead: gloo's
dispatch and rendezvous). Its parameters are, per tier, alpha (seconds per message) and
beta = 1 / bandwidth (seconds per byte); apply_tiers writes them into the cluster's links.
Points commsim does not price as measured (points.unmodelled: gloo's pairwise exchanges,
a broadcast timed at its root) are left out, each reason stated in the profile's notes.

Why least squares on this model is well posed: for a fixed schedule every flow's time is
its path latency (a sum of alphas, plus LogP overheads that are halves of them) plus its
bytes over max-min fair rates, which are piecewise linear in the betas; a step takes its
slowest flow and the collective sums its steps. So the predicted time is piecewise linear
in (alpha, beta, overhead) (Thakur et al. 2005's alpha-beta sums are the uniform-network
case: ring all-reduce 2(N-1) alpha + 2(N-1)/N S beta). Within one piece the Jacobian,
taken by finite differences of the graph evaluator, holds exactly the schedule's
coefficients: how many alphas and how many bytes per beta each point pays in each tier,
and 1 for the overhead. The solve is robust (calibrate.robust: soft-L1 on log residuals,
no point cut), the intervals a bootstrap over points and repeats, and calibrate.diagnose
warns where a parameter is not identified, residuals follow the op or the size, or the
bandwidths contradict the testbed's own link check.

A tier is fitted where the data separate it: its parameters are free when some measured
group spans exactly that tier (one node, several nodes of one rack, several racks) and a
parameter moves some point's time by at least 0.1%; the others keep the cluster's value.
The overhead is fitted where the data tell it from the alphas (several ops or group sizes:
a ring all-reduce on N ranks pays 2(N-1) alphas and one overhead, a binomial broadcast
log2 N and one); otherwise it stays 0 and the profile says why.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commsim import __version__
from commsim.calibrate import diagnose, robust
from commsim.calibrate.compute_fit import fit_compute
from commsim.calibrate.points import MIN_SHARE, Point, collect_points
from commsim.calibrate.records import Results
from commsim.calibrate.tiers import TierModel, tier_fits
from commsim.collectives.backends import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.profile import TIERS, Profile, Provenance, cluster_tiers, hardware_class
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import build_cluster

FAR = 4.0  # robust sds: a point this far from the fit is named in the notes (not dropped)


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


class _Problem:
    """The points, the model and the solver's view of it: parameters in units of their
    scale, the free ones solved, the rest at the cluster's value."""

    def __init__(self, model: TierModel, points: list[Point], algorithms: dict[str, str]):
        self.model, self.points = model, points
        self.measured = np.array([p.measured_s for p in points])
        self.scale = np.array([p.scale for p in model.params])
        self.lower = np.array([p.lower for p in model.params]) / self.scale
        self.upper = np.array([p.upper for p in model.params]) / self.scale
        self.nominal = np.array([p.start for p in model.params])
        self.algorithms = algorithms

    def times(self, theta: np.ndarray) -> np.ndarray:
        return model_times(self.model.cluster(theta), self.points, self.algorithms)

    def jac(self, theta: np.ndarray, predicted: np.ndarray) -> np.ndarray:
        """d log(predicted) / d u (u = theta / scale) at theta, every parameter."""
        raw = _jacobian(self.times, theta, predicted, _steps(self.model, theta))
        return raw * self.scale / predicted[:, None]

    def solve(self, theta: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, float]:
        """The robust solution over the free parameters (calibrate.robust.solve)."""

        def full(u: np.ndarray) -> np.ndarray:
            out = theta.copy()
            out[free] = u * self.scale[free]
            return out

        u, sd = robust.solve(
            lambda v: np.log(self.times(full(v)) / self.measured),
            theta[free] / self.scale[free],
            self.lower[free],
            self.upper[free],
        )
        return full(u), sd


def _tangled(jac: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Which of the parameters `among` the points cannot tell apart (robust.tangled)."""
    out = np.zeros_like(among)
    out[among] = robust.tangled(jac[:, among])
    return out


def _free_parameters(
    prob: _Problem, theta: np.ndarray, notes: list[str], source: str
) -> tuple[np.ndarray, np.ndarray, float]:
    """Solve over the parameters that matter and that the points separate; repeat while
    parameters start or stop mattering as the others move (at most three times). The
    overhead keeps the cluster's value where it cannot be told from the alphas; any other
    tangle is a SpecError. Returns (theta, free, noise scale)."""
    model = prob.model
    free = np.zeros(theta.size, dtype=bool)
    sd = robust.FIRST_SCALE
    for _ in range(3):
        predicted = prob.times(theta)
        jac = prob.jac(theta, predicted)
        matters = np.max(np.abs(jac), axis=0) >= MIN_SHARE
        if not matters.any():
            raise SpecError(source, "", "no tier parameter changes any prediction: nothing to fit")
        tangled = _tangled(jac, matters)
        if tangled[model.overhead_index]:
            matters[model.overhead_index] = False
            tangled = _tangled(jac, matters)
            notes.append(
                "per-call overhead kept at the cluster's value: these measurements cannot "
                "tell it from the alphas (measure several ops or group sizes)"
            )
        if tangled.any():
            names = ", ".join(model.params[i].label for i in np.nonzero(tangled)[0])
            why = f"the measurements cannot separate {names}: measure more sizes or groups"
            raise SpecError(source, "", why)
        if np.array_equal(matters, free):
            break
        free = matters
        theta = np.where(free, theta, prob.nominal)
        theta, sd = prob.solve(theta, free)
    return theta, free, sd


def fit_profile(results: Results, spec: ClusterSpec, *, source: str = "results") -> FitResult:
    """Fit the tiers the data separate, the per-call overhead, and the compute rate, into
    a Profile of the spec's link classes."""
    backends = results.backends
    if len(backends) != 1:
        raise SpecError(source, "backend", f"runs mix backends {sorted(backends)}: fit one")
    backend = backends.pop()
    if backend not in ALGORITHMS:
        known = ", ".join(ALGORITHMS)
        raise SpecError(source, "backend", f"no algorithm table for {backend!r} ({known})")
    every, notes = collect_points(results, spec)
    points = [p for p in every if not p.unmodelled]
    notes += _left_out(every)
    if not points:
        raise SpecError(source, "", "no measured collective commsim models to fit")
    if backend == "nccl":
        return _nccl_profile(results, spec, points, notes, source)
    spans = Counter(p.span for p in points)
    floor = 0.5 * min(p.measured_s for p in points)
    model = TierModel(spec, [t for t in TIERS if spans.get(t)], floor)
    if len(points) <= len(model.params):
        raise SpecError(
            source,
            "",
            f"{len(points)} points cannot fit {len(model.params)} parameters: measure more",
        )
    prob = _Problem(model, points, ALGORITHMS[backend])
    theta, free, sd = _free_parameters(prob, prob.nominal.copy(), notes, source)
    predicted = prob.times(theta)
    resid = np.log(predicted / prob.measured)
    jac = prob.jac(theta, predicted)[:, free]
    reps = robust.bootstrap(
        np.log(predicted),
        jac,
        theta[free] / prob.scale[free],
        prob.lower[free],
        prob.upper[free],
        prob.measured,
        [p.repeats for p in points],
        sd,
    )
    thetas = np.tile(theta, (len(reps), 1))
    thetas[:, free] = reps * prob.scale[free]
    labels = [p.label for p, f in zip(model.params, free, strict=True) if f]
    warnings = diagnose.unidentified(labels, diagnose.interval_effect(jac, reps))
    warnings += diagnose.structure(points, resid, sd)
    tiers, overhead = tier_fits(model, theta, free, thetas, spans)
    checks = [c for c in results.link_checks if c.testbed == spec.name]
    warnings += diagnose.link_contradictions(
        checks,
        {t: f.bandwidth_Bps for t, f in tiers.items()},
        {t: f.bandwidth_ci_Bps for t, f in tiers.items() if f.bandwidth_ci_Bps},
        model.k,
    )
    notes += _fit_notes(model, theta, free, points, predicted, resid, sd)
    profile = Profile(
        cluster=spec.name,
        backend=backend,
        hardware={t: hardware_class(spec, t) for t in cluster_tiers(spec)},
        tiers=tiers,
        call_overhead_s=overhead[0],
        call_overhead_ci_s=overhead[1],
        algorithms=ALGORITHMS[backend],
        compute=fit_compute(results, spec),
        provenance=_provenance(results, points, resid),
        notes=list(dict.fromkeys(notes)),
        warnings=warnings,
    )
    return FitResult(profile, points, predicted, model.cluster(theta))


def _left_out(points: list[Point]) -> list[str]:
    """One note per reason points were left out as not modelled, with their count."""
    reasons = Counter(p.unmodelled for p in points if p.unmodelled)
    return [f"left out {n} points commsim does not model: {why}" for why, n in reasons.items()]


def _fit_notes(model, theta, free, points, predicted, resid, sd) -> list[str]:
    """What kept the cluster's value and why, what ended at a bound, and the points far
    from the fit (weighed down by the loss, none dropped)."""
    notes = []
    for p, f, x in zip(model.params, free, theta, strict=True):
        if not f and p.name != "overhead":
            notes.append(
                f"{p.label} kept the cluster's value: no measurement depends on it (measure "
                "smaller sizes for alpha, larger for bandwidth, or another link is the "
                "bottleneck)"
            )
        elif f and min(x - p.lower, p.upper - x) <= 1e-6 * p.scale:
            notes.append(f"{p.label} ended at its bound ({p.lower:g}..{p.upper:g})")
    far = np.abs(resid - np.median(resid)) > FAR * max(sd, robust.MIN_SCALE)
    if far.any():
        worst = int(np.argmax(np.abs(resid)))
        p = points[worst]
        notes.append(
            f"{int(far.sum())} of {len(points)} points lie over {FAR:g} robust sd from the fit "
            f"(weighed down by the soft-L1 loss, none dropped); worst: {p.op} of "
            f"{p.bytes:.0f} B on {len(p.gpus)} ranks (line {p.line}), measured "
            f"{p.measured_s:.3g} s, model {predicted[worst]:.3g} s"
        )
    return notes


def _provenance(results: Results, points: list[Point], resid: np.ndarray) -> Provenance:
    """Where the profile came from and how well it fits; a point so far off every model
    that the fit's error overflows (a size or time out of any range) is a SpecError naming
    it, never a profile with an infinite error."""
    with np.errstate(over="ignore"):
        rms = float(np.sqrt(np.mean(np.expm1(resid) ** 2)))
    if not math.isfinite(rms):
        worst = int(np.argmax(np.abs(resid)))
        p = points[worst]
        raise SpecError(
            ", ".join(results.files),
            f"line {p.line}",
            f"{p.op} of {p.bytes:.3g} B in {p.measured_s:.3g} s is a factor "
            f"e^{abs(resid[worst]):.0f} off the model: not a size and time to fit",
        )
    return Provenance(
        files=results.files,
        runs=list(results.runs),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        points=len(points),
        commsim=__version__,
        rms_rel_error=rms,
        robust_sd=robust.robust_sd(resid),
    )


def _nccl_profile(
    results: Results, spec: ClusterSpec, points: list[Point], notes: list[str], source: str
) -> FitResult:
    """An NCCL backend's profile: NCCL's model fitted (calibrate.nccl_fit); the link tiers
    keep the cluster's values (under NCCL they only cap bandwidth where the fabric is
    congested, which nccl-tests on a quiet fabric does not show)."""
    from commsim.calibrate.nccl_fit import fit_nccl

    algorithms = ALGORITHMS["nccl"]
    result = fit_nccl(results, spec, points, algorithms, source)
    measured = np.array([p.measured_s for p in points])
    profile = Profile(
        cluster=spec.name,
        backend="nccl",
        hardware={t: hardware_class(spec, t) for t in cluster_tiers(spec)},
        tiers={},
        algorithms=algorithms,
        nccl=result.fit,
        compute=fit_compute(results, spec),
        provenance=_provenance(results, points, np.log(result.predicted / measured)),
        notes=[*notes, *result.notes],
        warnings=result.warnings,
    )
    return FitResult(profile, points, result.predicted, result.spec)
