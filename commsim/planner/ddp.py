"""Enumerate strategies, predict each, rank them by step time.

Two searches: plain DDP in full detail (per-bucket timeline on the graph, with algorithm,
bucket, overlap, placement and compression), and hybrid data x tensor x pipeline layouts
priced all at once by commsim.step.parallel (commsim.planner.search)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from commsim.collectives.algorithms import SEARCHED
from commsim.collectives.group import GroupCost
from commsim.scenario import Setup
from commsim.specs import Strategy
from commsim.step.ddp import ddp_memory, gradient_sync_cost
from commsim.step.memory import usable_bytes
from commsim.step.predict import predict
from commsim.step.prediction import Prediction
from commsim.topology.build import build_cluster
from commsim.topology.placement import PLACEMENTS

ALGORITHMS = SEARCHED["all-reduce"]  # every all-reduce auto chooses among
BUCKET_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)  # DDP bucket_cap_mb choices
# One of each kind: half precision, 8-bit, sparse (+ 8-bit values), low rank, 1-bit.
COMPRESSIONS = ("none", "fp16", "int8", "topk:0.01", "topk:0.05+int8", "powersgd:4", "sign")
LOSSLESS_ENOUGH = ("none", "fp16", "bf16")  # everything else is searched with error feedback


@dataclass
class PlanResult:
    """Ranked predictions, best first, and what was left out of the search and why."""

    ranked: list[Prediction]
    notes: list[str] = field(default_factory=list)
    skipped: int = 0


def strategies(
    base: Strategy,
    algorithms: Sequence[str] = ALGORITHMS,
    bucket_mb: Sequence[float] = BUCKET_MB,
    overlap: Sequence[bool] = (True, False),
    placements: Sequence[str] = PLACEMENTS,
    compressions: Sequence[str] = ("none",),
    error_feedback: bool | None = None,
) -> list[Strategy]:
    """The cross product of the searched dimensions, other fields taken from `base`.

    Error feedback is on for every lossy compressor unless `error_feedback` pins it: it
    costs HBM traffic, not bandwidth, and without it biased compressors lose accuracy."""
    return [
        base.model_copy(
            update={
                "algorithm": a,
                "bucket_mb": b,
                "overlap": o,
                "placement": p,
                "compression": c,
                "error_feedback": (
                    c not in LOSSLESS_ENOUGH if error_feedback is None else error_feedback
                ),
            }
        )
        for a, b, o, p, c in itertools.product(
            algorithms, bucket_mb, overlap, placements, compressions
        )
    ]


def plan(
    setup: Setup,
    candidates: Iterable[Strategy],
    on_progress: Callable[[], None] | None = None,
) -> PlanResult:
    """Predict every candidate (one cost model per placement, shared) and rank by step time.

    Left out: a candidate whose algorithm cannot run on the group (tree and hierarchical
    need whole nodes), one whose placement gives the very same rank order as a placement
    already searched (its predictions would be identical rows), and one that does not fit
    in GPU memory (counted, with the first reason, in the notes).
    """
    costs: dict[tuple[str, int], GroupCost] = {}
    same_as: dict[str, str] = {}
    result = PlanResult(ranked=[])
    too_big, why = 0, ""
    for strategy in candidates:
        memory = ddp_memory(setup, strategy)
        if memory.total > usable_bytes(setup.gpu):
            too_big, why = too_big + 1, why or memory.reason(setup.gpu)
            result.skipped += 1
            continue
        key = (strategy.placement, strategy.ps_shards)
        if key not in costs:
            costs[key] = cost = gradient_sync_cost(setup, strategy)
            for (other, shards), seen in costs.items():
                if (
                    shards == strategy.ps_shards
                    and other != strategy.placement
                    and ((seen.gpus == cost.gpus).all())
                ):
                    same_as[strategy.placement] = other
                    break
        usable = strategy.algorithm in ("auto", "nccl", *costs[key].algorithms("all-reduce"))
        if usable and strategy.placement not in same_as:
            result.ranked.append(predict(setup, strategy, costs[key]))
        else:
            result.skipped += 1
        if on_progress:
            on_progress()
    result.ranked.sort(key=lambda p: p.step_time_s)
    result.notes = [
        f"placement {p} gives the same rank order as {q} here; shown as {q}"
        for p, q in same_as.items()
    ]
    if too_big:
        result.notes.append(f"{too_big} strategies dropped: they do not fit in GPU memory ({why})")
    return result


NIC_FACTORS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass
class BandwidthSweep:
    """Step time of one strategy under each compressor as the NIC bandwidth changes."""

    nic_bandwidth: list[float]  # bytes/s per NIC
    step_time: dict[str, list[float]]  # compressor -> seconds, per bandwidth
    crossovers: dict[str, float]  # compressor -> NIC bandwidth above which it stops paying
    current: float  # the scenario's NIC bandwidth


def bandwidth_sweep(
    setup: Setup,
    strategy: Strategy,
    compressions: Sequence[str] = COMPRESSIONS,
    factors: Sequence[float] = NIC_FACTORS,
) -> BandwidthSweep:
    """Where compression stops paying: the strategy with each compressor (error feedback as
    the search sets it) on the same cluster with its NIC bandwidth scaled by each factor."""
    spec = setup.cluster.spec
    nic = spec.node.nics
    variants = strategies(
        strategy,
        [strategy.algorithm],
        [strategy.bucket_mb],
        [strategy.overlap],
        [strategy.placement],
        compressions,
    )
    times: dict[str, list[float]] = {v.compression: [] for v in variants}
    for f in factors:
        node = spec.node.model_copy(
            update={"nics": nic.model_copy(update={"bandwidth": f * nic.bandwidth})}
        )
        scaled = replace(
            setup, cluster=build_cluster(spec.model_copy(update={"node": node}), setup.n_gpus)
        )
        cost = gradient_sync_cost(scaled, strategy)
        for v in variants:
            times[v.compression].append(predict(scaled, v, cost).step_time_s)
    bandwidths = [f * nic.bandwidth for f in factors]
    return BandwidthSweep(bandwidths, times, _crossovers(bandwidths, times), nic.bandwidth)


def _crossovers(bandwidths: list[float], times: dict[str, list[float]]) -> dict[str, float]:
    """Per compressor, the bandwidth where it starts losing to no compression: the last
    sign change of (t_c - t_none), interpolated in log bandwidth."""
    base = np.array(times["none"])
    logb = np.log(bandwidths)
    out = {}
    for c, t in times.items():
        gain = base - np.array(t)  # > 0 while compression pays
        flips = np.nonzero((gain[:-1] > 0) & (gain[1:] <= 0))[0]
        if c != "none" and flips.size:
            i = flips[-1]
            x = logb[i] + (logb[i + 1] - logb[i]) * gain[i] / (gain[i] - gain[i + 1])
            out[c] = float(np.exp(x))
    return out
