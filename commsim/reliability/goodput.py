"""Goodput: the share of wall time a job spends on work it keeps, and where the rest goes.

goodput = useful compute time / wall time: Meta's effective training time ratio (ETTR,
Kokolis et al. 2025, arXiv:2410.21680) and Google's runtime goodput (its ML Productivity
Goodput is scheduling x runtime x program goodput; scheduling is taken as 1 here and
program goodput is the step model's MFU). Badput is split as Google's goodput library
names it (BadputType: checkpoint save, checkpoint restore, wasted progress from disruption,
initialisation/startup), plus detection, rescheduling and reduced capacity.

Restarting strategies (commsim.reliability.checkpoint): with E the expected time per
durable checkpoint, failures strike running time at rate lambda, and each costs Q - M of
restart on average, so running time per checkpoint is E M / Q; of it tau is useful, the
stall saves, the rest is redone; E (1 - M / Q) is restarting, split over its phases by the
expected time an attempt spends in each before a failure cuts it.

Strategies that keep running (per-step, ring rebuild): failures of part k arrive at rate
lambda_k; each stalls the job S_k (and again rejoin when the replacement joins) and takes a
share f_k of the replicas out for D_k. Stall windows are Poisson arrivals of fixed length,
so the job is free of stalls with probability exp(-sum lambda_k (S_k + rejoin)); replicas
out when no stall covers the moment are lambda_k f_k (D_k - S_k)+ (Little's law, the windows
that start with a stall removed). goodput = exp(-sum lambda S) (1 - sum lambda f (D - S)+).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from commsim.reliability import checkpoint as ck
from commsim.reliability.adapter import JobState, job_state
from commsim.reliability.interruptions import Interruptions, job_interruptions
from commsim.reliability.rates import (
    DEFAULT_REPAIR_S,
    DEFAULT_STORAGE_BPS,
    SOURCES,
    Rates,
    rates_for,
)
from commsim.reliability.recovery import (
    PHASES,
    RESTARTING,
    Costs,
    Policy,
    restart_costs,
    running_costs,
)
from commsim.reliability.spares import p_full_size, spares_for

DAY = 86400.0


@dataclass(frozen=True)
class Model:
    """Everything the analytical model and the Monte-Carlo simulation share."""

    job: JobState
    interruptions: Interruptions
    policy: Policy
    costs: Costs
    spares: int
    p_full: float
    interval_s: float | None  # restarting strategies
    events: tuple[tuple[str, str, float, float], ...]  # (part, class, per second, replicas out)

    @property
    def rate(self) -> float:
        return sum(e[2] for e in self.events)

    @property
    def mtbf(self) -> float:
        return 1.0 / self.rate if self.rate else math.inf

    def restarts(self) -> list[tuple[float, float]]:
        """(probability, seconds) of each restart class."""
        by_class: dict[str, float] = {}
        for _, cls, rate, _ in self.events:
            by_class[cls] = by_class.get(cls, 0.0) + rate
        return [(r / self.rate, sum(self.costs.restart[c].values())) for c, r in by_class.items()]


@dataclass(frozen=True)
class GoodputReport:
    """A job's goodput under failures and how the rest of its wall time is spent."""

    strategy: str
    gpus: int
    nodes: int
    mtti_s: float
    interruptions_per_day: float
    by_class_per_day: dict[str, float]
    degrading_per_day: float
    goodput: float
    badput: dict[str, float]  # category -> share of wall time
    interval_s: float | None
    young_s: float | None
    daly_s: float | None
    checkpoint_stall_s: float
    checkpoint_lag_s: float
    checkpoint_bytes_per_gpu: float
    checkpoint_bytes: float
    restart_s: float  # mean restart (restarting strategies) or first stall per failure
    spares: int
    p_full: float
    ideal_time_to_train_s: float | None
    time_to_train_s: float | None
    gpu_hours: float | None
    cost: float | None
    assumptions: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self) | {"assumptions": list(self.assumptions)}

    def sizing_fields(self) -> dict[str, object]:
        """The figures a cluster-sizing row shows next to its ideal ones (flat)."""
        return {
            "goodput": self.goodput,
            "mtti_s": self.mtti_s,
            "checkpoint_interval_s": self.interval_s,
            "spares": self.spares,
            "time_to_train_goodput_s": self.time_to_train_s,
            "gpu_hours_goodput": self.gpu_hours,
            "cost_goodput": self.cost,
            "recovery": self.strategy,
        }


def _replicas_hit(job: JobState, nodes: float) -> float:
    """Data-parallel replicas on `nodes` consecutive nodes (a leaf's nodes are consecutive)."""
    replica = job.replica_of_gpu()
    gpus = min(job.gpus, max(1, math.ceil(nodes)) * job.gpus_per_node)
    return float(np.unique(replica[:gpus]).size)


def _events(job: JobState, inter: Interruptions) -> tuple[tuple[str, str, float, float], ...]:
    out = []
    for e in inter.exposures:
        rate = inter.part_rate(e)
        if rate > 0:
            hit = 1.0 if e.cls == "software" else _replicas_hit(job, e.nodes_out)
            out.append((e.part, e.cls, rate, min(1.0, hit / job.dp)))
    return tuple(out)


def build_model(job: JobState, inter: Interruptions, policy: Policy) -> Model:
    """Spares, costs and checkpoint interval of a job under a recovery policy."""
    repairs, nodes = inter.repairs(), job.nodes
    spares = 0 if policy.strategy == "cold" else policy.spares
    if spares is None:
        spares = spares_for(repairs, nodes, policy.spare_target)
    p_full = p_full_size(repairs, nodes, spares)
    events = _events(job, inter)
    if policy.strategy in RESTARTING:
        io = inter.rates
        costs = restart_costs(job, policy, 1.0 - p_full, io.write_Bps, io.read_Bps)
    else:
        costs = running_costs(job, policy, 1.0 - p_full)
    model = Model(job, inter, policy, costs, spares, p_full, None, events)
    if policy.strategy not in RESTARTING or model.rate == 0:
        return model  # nothing fails: no checkpoint is worth its stall
    tau = policy.interval_s
    if tau is None:
        # a checkpoint is taken between steps, and an asynchronous one must be written
        # before the next starts
        floor = max(costs.lag_s - costs.stall_s, job.step_s)
        tau = ck.optimal_interval(costs.stall_s, costs.lag_s, model.mtbf, model.restarts(), floor)
    return replace(model, interval_s=tau)


def _restart_breakdown(m: Model) -> tuple[float, dict[str, float]]:
    c, tau, mtbf = m.costs, m.interval_s, m.mtbf
    restarts = m.restarts()
    e = ck.commit_time(tau, c.stall_s, c.lag_s, mtbf, restarts)
    q = ck.restart_factor(mtbf, restarts)
    running = e * mtbf / q
    # An attempt of class c is in phase i, which spans [a, b) of it, until a failure cuts
    # it: expected seconds M (e^(-a/M) - e^(-b/M)); attempts come in proportion to p_c.
    weights = dict.fromkeys(PHASES, 0.0)
    for _, cls, rate, _ in m.events:
        start = 0.0
        for phase in PHASES:
            end = start + c.restart[cls][phase]
            weights[phase] += rate * (math.exp(-start / mtbf) - math.exp(-end / mtbf))
            start = end
    total = sum(weights.values()) or 1.0
    bad = {p: (e - running) * w / total / e for p, w in weights.items()}
    bad["checkpoint_save"] = c.stall_s / e
    bad["lost_progress"] = (running - tau - c.stall_s) / e
    return tau / e, bad


def _running_breakdown(m: Model) -> tuple[float, dict[str, float]]:
    c = m.costs
    stall_rate: dict[str, float] = {"detection": 0.0, "lost_progress": 0.0, "initialization": 0.0}
    reduced = 0.0
    for _, cls, rate, share in m.events:
        first = sum(c.stall[cls].values())
        for phase, seconds in c.stall[cls].items():
            stall_rate[phase] += rate * seconds
        stall_rate["initialization"] += rate * c.rejoin_s
        reduced += rate * share * max(c.reduced_s[cls] - first, 0.0)
    total = sum(stall_rate.values())
    free = math.exp(-total)
    bad = {p: (1.0 - free) * v / total if total else 0.0 for p, v in stall_rate.items()}
    bad["reduced_capacity"] = free * min(reduced, 1.0)
    return free * max(1.0 - reduced, 0.0), bad


def analytical_goodput(m: Model) -> tuple[float, dict[str, float]]:
    """(goodput, badput shares) of the model (module docstring)."""
    if m.rate == 0:
        return 1.0, {}
    if m.policy.strategy in RESTARTING:
        return _restart_breakdown(m)
    return _running_breakdown(m)


def _assumptions(m: Model) -> tuple[str, ...]:
    p = m.policy
    return (
        f"failure rates: {SOURCES['rates']}",
        f"repair: {SOURCES['repair']}"
        if m.interruptions.rates.repair_s == DEFAULT_REPAIR_S
        else f"node repair {m.interruptions.rates.repair_s / 3600:g} h (given)",
        f"storage: {SOURCES['storage']}"
        if m.interruptions.rates.write_Bps == DEFAULT_STORAGE_BPS
        else f"storage {m.interruptions.rates.write_Bps / 1e12:g} TB/s (given)",
        f"detection {p.detect_s:g} s, reschedule {p.reschedule_s:g} s, warm-up "
        f"{p.warmup_s:g} s (commsim.reliability.recovery)",
        "NCCL initialisation 265 s at 96k GPUs, linear in GPUs (NCCLX, arXiv:2510.20171)"
        if p.init_s is None
        else f"communicator set-up {p.init_s:g} s for the whole job (given)",
        "failures independent and exponential (Poisson); planned maintenance not counted",
    )


def report(m: Model) -> GoodputReport:
    """The GoodputReport of a model."""
    good, bad = analytical_goodput(m)
    job, inter, c = m.job, m.interruptions, m.costs
    if m.policy.strategy in RESTARTING:
        restarts = m.restarts()
        restart_mean = sum(p * r for p, r in restarts)
        timed = c.stall_s > 0 and m.rate > 0
        young = ck.young_interval(c.stall_s, m.mtbf) if timed else None
        daly = ck.daly_interval(c.stall_s, m.mtbf) if timed else None
    else:
        firsts = [r * sum(c.stall[cls].values()) for _, cls, r, _ in m.events]
        restart_mean = sum(firsts) / m.rate if m.rate else 0.0
        young = daly = None
    ideal = job.ideal_time_s
    time = ideal / good if ideal and good > 0 else None
    gpu_hours = time * (job.gpus + m.spares * job.gpus_per_node) / 3600 if time else None
    price = job.price_per_gpu_hour
    return GoodputReport(
        strategy=m.policy.strategy,
        gpus=job.gpus,
        nodes=job.nodes,
        mtti_s=inter.mtti_s,
        interruptions_per_day=inter.rate * DAY,
        by_class_per_day={k: v * DAY for k, v in inter.by_class.items() if v > 0},
        degrading_per_day=inter.degrade_rate * DAY,
        goodput=good,
        badput=bad,
        interval_s=m.interval_s,
        young_s=young,
        daly_s=daly,
        checkpoint_stall_s=c.stall_s,
        checkpoint_lag_s=c.lag_s,
        checkpoint_bytes_per_gpu=job.held_bytes,
        checkpoint_bytes=job.unique_bytes,
        restart_s=restart_mean,
        spares=m.spares,
        p_full=m.p_full,
        ideal_time_to_train_s=ideal,
        time_to_train_s=time,
        gpu_hours=gpu_hours,
        cost=gpu_hours * price if gpu_hours and price else None,
        assumptions=_assumptions(m),
    )


def model_for(prediction, setup, policy: Policy | None = None, rates: Rates | None = None):
    """The Model of a predicted step on its setup (rates: the cluster's, unless given)."""
    job = job_state(prediction, setup)
    rates = rates or rates_for(setup.cluster.spec)
    return build_model(
        job, job_interruptions(setup.cluster, setup.n_gpus, rates), policy or Policy()
    )


def expected_goodput(prediction, setup, policy: Policy | None = None, rates: Rates | None = None):
    """GoodputReport of a predicted step (commsim.step.predict) on its setup: what the
    planner's sizing calls for each row."""
    return report(model_for(prediction, setup, policy, rates))


def best_checkpoint_interval(prediction, setup, policy: Policy | None = None) -> dict[str, float]:
    """The model's optimal interval, with Young's and Daly's closed forms beside it."""
    m = model_for(prediction, setup, replace(policy or Policy(), interval_s=None))
    if m.interval_s is None:
        raise ValueError(f"{m.policy.strategy} recovery takes no periodic checkpoints")
    stall = m.costs.stall_s
    return {
        "optimal_s": m.interval_s,
        "young_s": ck.young_interval(stall, m.mtbf),
        "daly_s": ck.daly_interval(stall, m.mtbf),
        "mtti_s": m.mtbf,
        "stall_s": stall,
    }


def best_spares(prediction, setup, policy: Policy | None = None, most: int | None = None):
    """The GoodputReport with the spare count (0..most; default: twice the count for the
    policy's spare_target) that needs the fewest GPU-hours per useful GPU-hour."""
    policy = policy or Policy("hot-spare")
    first = model_for(prediction, setup, replace(policy, spares=None))
    job, inter = first.job, first.interruptions
    most = 2 * first.spares + 1 if most is None else most

    def cost(r: GoodputReport) -> float:
        return (r.gpus + r.spares * job.gpus_per_node) / (r.gpus * r.goodput)

    reports = [report(build_model(job, inter, replace(policy, spares=s))) for s in range(most + 1)]
    return min(reports, key=cost)
