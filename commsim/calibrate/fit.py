"""Fit each link tier's alpha and bandwidth to measured collectives, with 95% intervals.

The model is commsim's own graph evaluator: a measurement of `op` over a group of ranks
placed on the cluster's GPUs costs what the backend's algorithm (profile.ALGORITHMS) costs
there, step by step, with flows routed and sharing links max-min fairly. Its parameters
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
pieces; the residuals are relative, (predicted - measured) / measured, because timing
noise is multiplicative and sizes span eight decades.

Intervals: the linearised covariance s^2 (J^T J)^-1, s^2 = sum r^2 / (m - p), with
Student's t at m - p degrees of freedom (Seber & Wild 2003, Nonlinear Regression, 5.1).
A bandwidth's interval is the reciprocal of beta's. A tier is fitted where the data
separate it: its parameters are free when some measured group spans exactly that tier
(one node, several nodes of one rack, several racks) and a parameter moves some point's
time by at least 0.1%; the others keep the cluster's value.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from commsim import __version__, catalog
from commsim.calibrate.profile import (
    ALGORITHMS,
    TIERS,
    ComputeFit,
    MetaRecord,
    Profile,
    Provenance,
    Results,
    TierFit,
    apply_tiers,
    tier_params,
)
from commsim.collectives.group import GroupCost
from commsim.collectives.schedule import Schedule, Step, evaluate
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import Cluster, build_cluster

MIN_SHARE = 1e-3  # a parameter moving no point's time by this much is not fitted
BETA_FLOOR = 1e-6  # beta may fall to this fraction of its start (bandwidth x 1e6), no lower


@dataclass(frozen=True)
class Point:
    """One measured collective placed on the cluster."""

    run: str
    line: int
    op: str
    group: tuple[int, ...]  # world ranks
    gpus: tuple[int, ...]  # the GPU each group rank ran on
    bytes: float
    measured_s: float
    span: str  # the widest tier the group crosses


def placement(meta: MetaRecord, spec: ClusterSpec, source: str = "results") -> np.ndarray:
    """GPU of each world rank, from where the ranks ran.

    Racks (COMMSIM_RACK) in order of first appearance take leaves 0, 1, ...; hosts in a
    rack take its nodes in order of first appearance; without rack labels hosts take nodes
    0, 1, ... A host's ranks take its GPUs by LOCAL_RANK (else rank). Only the structure
    matters: which ranks share a node and which nodes share a rack."""
    gpn, per_rack = spec.node.gpus_per_node, spec.fabric.nodes_per_leaf
    ranks = sorted(meta.ranks, key=lambda r: r.rank)
    hosts = meta.hosts
    if all(r.rack is not None for r in ranks):
        rack_of: dict[str, str] = {}
        for r in ranks:
            if rack_of.setdefault(r.host, r.rack) != r.rack:  # type: ignore[arg-type]
                raise SpecError(source, "placement", f"host {r.host!r} is in two racks")
        racks = list(dict.fromkeys(rack_of[h] for h in hosts))
        node_of: dict[str, int] = {}
        for k, rack in enumerate(racks):
            members = [h for h in hosts if rack_of[h] == rack]
            if len(members) > per_rack:
                raise SpecError(
                    source,
                    "placement",
                    f"rack {rack!r} ran {len(members)} hosts but cluster {spec.name!r} has "
                    f"{per_rack} nodes per rack",
                )
            node_of.update({h: k * per_rack + i for i, h in enumerate(members)})
    else:
        node_of = {h: i for i, h in enumerate(hosts)}
    if max(node_of.values()) >= spec.nodes:
        raise SpecError(
            source,
            "placement",
            f"the run needs node {max(node_of.values()) + 1} but cluster {spec.name!r} has "
            f"{spec.nodes} nodes",
        )
    gpu = np.empty(len(ranks), dtype=np.int64)
    for host in hosts:
        mine = sorted(
            (r for r in ranks if r.host == host),
            key=lambda r: (r.local_rank if r.local_rank is not None else r.rank, r.rank),
        )
        if len(mine) > gpn:
            raise SpecError(
                source,
                "placement",
                f"host {host!r} ran {len(mine)} ranks but cluster {spec.name!r} has {gpn} "
                "GPUs per node",
            )
        for local, r in enumerate(mine):
            gpu[r.rank] = node_of[host] * gpn + local
    return gpu


def span(spec: ClusterSpec, gpus) -> str:
    """The widest tier a group crosses: one node, one rack, or several racks."""
    nodes = np.asarray(gpus) // spec.node.gpus_per_node
    if np.unique(nodes).size == 1:
        return "intra-node"
    if np.unique(nodes // spec.fabric.nodes_per_leaf).size == 1:
        return "inter-node"
    return "cross-rack"


def collect_points(results: Results, spec: ClusterSpec) -> tuple[list[Point], list[str]]:
    """Every measured collective of a group of two or more, placed; and notes on what was
    left out (unsupported ops)."""
    points, notes = [], []
    for run_id, run in results.runs.items():
        gpu = placement(run.meta, spec, f"run {run_id}")
        for line, rec in run.collectives:
            if rec.status != "ok":
                notes.append(f"{rec.op} unsupported by {run.meta.backend} in run {run_id}")
                continue
            if len(rec.group) < 2:
                continue
            gpus = tuple(int(g) for g in gpu[rec.group])
            points.append(
                Point(
                    run_id,
                    line,
                    rec.op,
                    tuple(rec.group),
                    gpus,
                    float(rec.bytes),  # type: ignore[arg-type]
                    float(rec.time_s),  # type: ignore[arg-type]
                    span(spec, gpus),
                )
            )
    return points, list(dict.fromkeys(notes))


# --------------------------------------------------------------------------- the model


def _step(src, dst, nbytes: float) -> Step:
    src = np.asarray(src, dtype=np.int64)
    return Step(
        src=src,
        dst=np.asarray(dst, dtype=np.int64),
        nbytes=np.full(src.shape, float(nbytes)),
        rail=np.full(src.shape, -1, dtype=np.int64),
    )


def binomial_broadcast(n: int, size: float) -> Schedule:
    """gloo's broadcast (gloo/broadcast.cc) from rank 0: rank v receives the whole buffer
    from v minus its highest set bit, then sends it to v + 2^i for every 2^i above that bit,
    all sends posted at once. Step d holds the sends of the ranks at depth d (d set bits),
    so the root shares its link among ceil(lg n) children."""
    steps = []
    for depth in range(max(1, (n - 1).bit_length())):
        src, dst = [], []
        for v in range(n):
            if v.bit_count() != depth:
                continue
            i = v.bit_length()  # children v + 2^i for 2^i above v's highest bit
            while v + (1 << i) < n:
                src.append(v)
                dst.append(v + (1 << i))
                i += 1
        if src:
            steps.append(_step(src, dst, size))
    return steps


def shift(n: int, size: float) -> Schedule:
    """nccl-tests' sendrecv: every rank sends the buffer to the next and receives from the
    previous, at once (one step, one peer each way)."""
    ranks = np.arange(n)
    return [_step(ranks, (ranks + 1) % n, size)]


class GroupModel:
    """Times of one group's collectives on one built cluster, by the names of
    profile.ALGORITHMS: commsim's algorithms, 'a|b' (the faster), 'allreduce-ring' (a
    full ring all-reduce, as gloo's reduce-scatter), 'binomial' (gloo's broadcast)."""

    def __init__(self, cluster: Cluster, gpus) -> None:
        self.cluster = cluster
        self.gpus = np.asarray(gpus, dtype=np.int64)
        self.cost = GroupCost(cluster, self.gpus)

    def time(self, op: str, algorithm: str, size: float) -> float:
        if "|" in algorithm:  # tree and hierarchical run only on whole nodes
            names = [
                a
                for a in algorithm.split("|")
                if a not in ("tree", "hierarchical") or a in self.cost.algorithms(op)
            ]
            return min(self.time(op, a, size) for a in names)
        n = self.gpus.size
        if op == "send-recv":
            return evaluate(shift(n, size), self.cluster, self.gpus)
        if algorithm == "binomial" and op == "broadcast":
            return evaluate(binomial_broadcast(n, size), self.cluster, self.gpus)
        if algorithm == "allreduce-ring" and op == "reduce-scatter":
            return float(self.cost.time("all-reduce", "ring", size)[0])
        return float(self.cost.time(op, algorithm, size)[0])


def model_times(spec: ClusterSpec, points: list[Point], algorithms: dict[str, str]) -> np.ndarray:
    """Predicted seconds of every point on the cluster `spec` describes."""
    top = max(max(p.gpus) for p in points)
    cluster = build_cluster(spec, top + 1)
    groups: dict[tuple[int, ...], GroupModel] = {}
    memo: dict[tuple[tuple[int, ...], str, float], float] = {}
    out = np.empty(len(points))
    for i, p in enumerate(points):
        key = (p.gpus, p.op, p.bytes)
        if key not in memo:
            model = groups.get(p.gpus) or groups.setdefault(p.gpus, GroupModel(cluster, p.gpus))
            memo[key] = model.time(p.op, algorithms[p.op], p.bytes)
        out[i] = memo[key]
    return out


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Param:
    tier: str
    name: str  # "alpha" (s) or "beta" (s/B)


@dataclass
class FitResult:
    """A fitted profile and the points it was fitted to, with the model's times for them."""

    profile: Profile
    points: list[Point]
    predicted_s: np.ndarray
    spec: ClusterSpec  # the cluster with the fitted tiers written in


def _theta_spec(spec: ClusterSpec, params: list[Param], theta: np.ndarray) -> ClusterSpec:
    base = tier_params(spec)
    tiers = {p.tier: list(base[p.tier]) for p in params}
    for p, v in zip(params, theta, strict=True):
        if p.name == "alpha":
            tiers[p.tier][0] = float(v)
        else:
            tiers[p.tier][1] = 1.0 / float(v)
    return apply_tiers(spec, {t: (a, b) for t, (a, b) in tiers.items()})


def _jacobian(f: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, t0: np.ndarray):
    """Forward differences, each parameter stepped by 1e-5 of itself: exact within a
    linear piece of the model, which is all a step this small sees."""
    cols = []
    for j in range(theta.size):
        h = 1e-5 * theta[j]
        bumped = theta.copy()
        bumped[j] += h
        cols.append((f(bumped) - t0) / h)
    return np.column_stack(cols)


def _solve(
    times: Callable[[np.ndarray], np.ndarray],
    measured: np.ndarray,
    theta0: np.ndarray,
    free: np.ndarray,
    params: list[Param],
) -> np.ndarray:
    """Relative least squares over the free parameters, in units of their start values."""
    scale = theta0[free]
    names = [p.name for p, f in zip(params, free, strict=True) if f]
    lower = np.array([0.0 if name == "alpha" else BETA_FLOOR for name in names])

    def full(u: np.ndarray) -> np.ndarray:
        theta = theta0.copy()
        theta[free] = u * scale
        return theta

    res = optimize.least_squares(
        lambda u: times(full(u)) / measured - 1.0,
        np.ones(free.sum()),
        bounds=(lower, np.inf),
        diff_step=1e-5,
        method="trf",
        x_scale="jac",
    )
    return full(res.x)


def fit_profile(
    results: Results, spec: ClusterSpec, *, source: str = "results"
) -> FitResult:
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
    spans = Counter(p.span for p in points)
    params = [
        Param(t, name) for t in TIERS if spans.get(t) for name in ("alpha", "beta")
    ]
    if len(points) <= len(params):
        raise SpecError(
            source, "", f"{len(points)} points cannot fit {len(params)} parameters: measure more"
        )
    base = tier_params(spec)
    theta0 = np.array(
        [base[p.tier][0] if p.name == "alpha" else 1.0 / base[p.tier][1] for p in params]
    )
    theta0 = np.where(theta0 > 0, theta0, 1e-6)  # a zero latency still needs a scale
    measured = np.array([p.measured_s for p in points])

    def times(theta: np.ndarray) -> np.ndarray:
        return model_times(_theta_spec(spec, params, theta), points, algorithms)

    theta, free = theta0, np.zeros(len(params), dtype=bool)
    for _ in range(3):  # parameters can start or stop mattering as the others move
        predicted = times(theta)
        jac = _jacobian(times, theta, predicted)
        share = np.max(np.abs(jac * theta) / predicted[:, None], axis=0)
        if not (share >= MIN_SHARE).any():
            raise SpecError(source, "", "no tier parameter changes any prediction: nothing to fit")
        if np.array_equal(share >= MIN_SHARE, free):
            break
        free = share >= MIN_SHARE
        theta = _solve(times, measured, theta, free, params)
    else:
        predicted = times(theta)
        jac = _jacobian(times, theta, predicted)
    jac = jac[:, free] / measured[:, None]
    resid = predicted / measured - 1.0
    dof = len(points) - int(free.sum())
    _check_separable(jac, [p for p, f in zip(params, free, strict=True) if f], source)
    s2 = float(resid @ resid) / dof
    half = np.full(len(params), np.nan)
    cov = s2 * np.linalg.inv(jac.T @ jac)
    half[free] = stats.t.ppf(0.975, dof) * np.sqrt(np.diag(cov))
    fitted_spec = _theta_spec(spec, params, theta)
    tiers = _tier_fits(params, theta, half, free, spans)
    for p, f in zip(params, free, strict=True):
        if not f:
            what = "alpha" if p.name == "alpha" else "bandwidth"
            notes.append(
                f"{p.tier} {what} kept the cluster's value: no measurement depends on it "
                "(measure smaller sizes for alpha, larger for bandwidth; or another link "
                "is the bottleneck)"
            )
    compute = fit_compute(results, spec)
    profile = Profile(
        cluster=spec.name,
        backend=backend,
        tiers=tiers,
        algorithms=algorithms,
        compute=compute,
        provenance=Provenance(
            files=results.files,
            runs=list(results.runs),
            date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            points=len(points),
            commsim=__version__,
            rms_rel_error=float(np.sqrt(np.mean(resid**2))),
        ),
        notes=notes,
    )
    return FitResult(profile, points, predicted, fitted_spec)


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
    params: list[Param], theta: np.ndarray, half: np.ndarray, free: np.ndarray, spans: Counter
) -> dict[str, TierFit]:
    """Per-tier values and 95% intervals; a bandwidth's interval is 1 / beta's."""
    out = {}
    for tier in dict.fromkeys(p.tier for p in params):
        (ia,) = [i for i, p in enumerate(params) if p == Param(tier, "alpha")]
        (ib,) = [i for i, p in enumerate(params) if p == Param(tier, "beta")]
        alpha, beta = float(theta[ia]), float(theta[ib])
        alpha_ci = (max(0.0, alpha - half[ia]), alpha + half[ia]) if free[ia] else None
        bw_ci = None
        if free[ib]:
            lo, hi = beta - half[ib], beta + half[ib]
            bw_ci = (1.0 / hi, 1.0 / lo if lo > 0 else float("inf"))
        out[tier] = TierFit(
            alpha_s=alpha,
            alpha_ci_s=alpha_ci,
            bandwidth_Bps=1.0 / beta,
            bandwidth_ci_Bps=bw_ci,
            points=spans[tier],
            fitted=[n for n, i in (("alpha", ia), ("bandwidth", ib)) if free[i]],
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
