"""Enumerate strategies, predict each, rank them by step time.

Two searches: plain DDP in full detail (per-bucket timeline on the graph, with algorithm,
bucket, overlap, placement and compression), and hybrid data x tensor x pipeline layouts
priced all at once by commsim.parallel (commsim.search)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import numpy as np

from commsim.collectives.group import GroupCost
from commsim.memory import usable_bytes
from commsim.parallel import ALGORITHMS as HYBRID_ALGORITHMS
from commsim.parallel import PLACEMENT_KINDS
from commsim.predict import (
    Prediction,
    Setup,
    ddp_memory,
    gradient_sync_cost,
    hybrid_model,
    hybrid_prediction,
    predict,
)
from commsim.search import enumerate_layouts, search
from commsim.specs import Scenario, Strategy
from commsim.topology.build import build_cluster
from commsim.topology.placement import PLACEMENTS

ALGORITHMS = ("ring", "tree", "rhd", "ps", "hierarchical")
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


def plan_hybrid(
    setup: Setup, pins: dict[str, object], keep: int = 200, exclude_data_parallel: bool = False
) -> PlanResult:
    """Search data x tensor x pipeline layouts (commsim.search) and return the best `keep`
    as predictions; with `exclude_data_parallel` plain-DDP layouts are left to `plan`'s
    detailed per-bucket search."""
    base = setup.scenario.strategy
    model = hybrid_model(setup, base)
    layouts = enumerate_layouts(setup, pins)
    found = search(setup, model, layouts)
    result = PlanResult(ranked=[])
    for i in found.ranked:
        row = found.layouts.row(int(i))
        strategy = base.model_copy(
            update={
                k: row[k]
                for k in (
                    "tp",
                    "pp",
                    "ep",
                    "zero",
                    "recompute",
                    "interleave",
                    "bucket_mb",
                    "overlap",
                    "algorithm",
                    "placement",
                )
            }
            | {"compression": "none", "error_feedback": False}
            | {
                "first_stage_layers": row["first_layers"] if row["first_layers"] >= 0 else None,
                "last_stage_layers": row["last_layers"] if row["last_layers"] >= 0 else None,
            }
        )
        if exclude_data_parallel and strategy.data_parallel_only:
            result.skipped += 1
            continue
        variant = replace(
            setup, scenario=setup.scenario.model_copy(update={"micro_batch": row["micro_batch"]})
        )
        result.ranked.append(hybrid_prediction(variant, strategy, found.breakdown.row(int(i))))
        if len(result.ranked) == keep:
            break
    result.notes.append(f"{found.searched} data x tensor x pipeline layouts priced")
    if found.dropped:
        smallest = int(np.argmin(np.where(found.breakdown.fits, np.inf, found.breakdown.memory)))
        result.notes.append(
            f"{found.dropped} layouts dropped: they do not fit in GPU memory (the smallest of "
            f"them needs {found.breakdown.memory[smallest] / 1e9:.1f} GB of "
            f"{usable_bytes(setup.gpu) / 1e9:.1f} GB usable)"
        )
    result.skipped += found.dropped + found.searched - len(found.ranked) - found.dropped
    return result


def plan_all(
    setup: Setup,
    base: Strategy,
    pinned: set[str],
    on_progress: Callable[[], None] | None = None,
) -> PlanResult:
    """Everything `commsim plan` searches, merged and ranked: plain DDP in full detail when
    the batch divides over all GPUs and the pins allow it, hybrid layouts for transformers.
    `pinned` names the strategy fields (and "micro_batch") held at base's values."""
    s = setup.scenario

    def pick(name, choices):
        return [getattr(base, name)] if name in pinned else list(choices)

    layout_default = Strategy()
    layout_keys = ("tp", "pp", "ep", "zero", "recompute", "interleave")
    layout_keys += ("first_stage_layers", "last_stage_layers")
    dp_allowed = all(
        getattr(base, k) == getattr(layout_default, k) for k in layout_keys if k in pinned
    )
    algorithm_pinned = "algorithm" in pinned and base.algorithm != "auto"
    result = PlanResult(ranked=[])
    runs_ddp = dp_allowed and s.global_batch % (setup.n_gpus * s.micro_batch) == 0
    if runs_ddp:
        ddp = strategies(
            base.model_copy(update={k: getattr(layout_default, k) for k in layout_keys}),
            algorithms=[base.algorithm] if algorithm_pinned else ALGORITHMS,
            bucket_mb=pick("bucket_mb", BUCKET_MB),
            overlap=pick("overlap", (True, False)),
            placements=pick("placement", PLACEMENTS),
            compressions=pick("compression", COMPRESSIONS),
            error_feedback=base.error_feedback if "error_feedback" in pinned else None,
        )
        result = plan(setup, ddp, on_progress)
    elif dp_allowed:
        result.notes.append(
            f"plain data parallelism skipped: global batch {s.global_batch} is not a multiple "
            f"of {setup.n_gpus} GPUs x micro-batch {s.micro_batch}"
        )
    # hybrid layouts search NCCL's two all-reduces (ring, tree): 'nccl' pins nothing there
    hybrid_pinned = algorithm_pinned and base.algorithm != "nccl"
    hybrid_allowed = (
        setup.workload.heads is not None
        and base.compression == "none"
        and (not hybrid_pinned or base.algorithm in HYBRID_ALGORITHMS)
        and base.placement in PLACEMENT_KINDS
    )
    if hybrid_allowed:
        pins = {k: getattr(base, k) for k in pinned & set(Strategy.model_fields)}
        pins.pop("compression", None)
        pins.pop("error_feedback", None)
        if not hybrid_pinned:
            pins.pop("algorithm", None)
        if "micro_batch" in pinned:
            pins["micro_batch"] = s.micro_batch
        hybrid = plan_hybrid(setup, pins, exclude_data_parallel=runs_ddp)
        result.ranked = sorted(result.ranked + hybrid.ranked, key=lambda p: p.step_time_s)
        result.notes += hybrid.notes
        result.skipped += hybrid.skipped
        if runs_ddp:
            result.notes.append("gradient compression is searched for plain DDP (comm hooks)")
    return result


@dataclass
class SizingRow:
    """The best strategy for one fabric and cluster size, and what it costs."""

    fabric: str
    gpus: int
    best: Prediction | None  # None: nothing fits or divides the batch
    note: str = ""
    fabric_file: str = ""  # the name or path it was given as

    def to_dict(self) -> dict[str, object]:
        p = self.best
        out: dict[str, object] = {"fabric": self.fabric, "gpus": self.gpus, "note": self.note}
        if p:
            out |= {
                "strategy": p.strategy.model_dump(),
                "layout": p.layout,
                "step_time_s": p.step_time_s,
                "scaling_efficiency": p.scaling_efficiency,
                "mfu": p.mfu,
                "tflops_per_gpu": p.tflops_per_gpu,
            } | (p.training or {})
        return out


OBJECTIVES = ("time-to-train", "cost", "throughput-per-dollar", "step-time")


def size_clusters(
    scenario: Scenario,
    source: str,
    fabrics: Sequence[str],
    sizes: Sequence[int],
    gpu: str | None = None,
    on_progress: Callable[[], None] | None = None,
) -> list[SizingRow]:
    """For every fabric and GPU count, the fastest layout that fits (hybrid search for
    transformers, plain DDP otherwise). A fabric file is a template: it grows to as many
    nodes as a size needs, and `gpu` swaps its GPU model. The points are independent, so
    they run on every core, the largest first."""
    tasks = [(scenario, source, fabric, n, gpu) for fabric in fabrics for n in sizes]
    for fabric in fabrics:  # bad names fail here, in this process, before any work starts
        _fabric_spec(fabric, gpu, source)
    rows: dict[tuple[str, int], SizingRow] = {}
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(_size_one, *t) for t in sorted(tasks, key=lambda t: -t[3])]
        for future in as_completed(futures):
            row = future.result()
            rows[(row.fabric_file, row.gpus)] = row
            if on_progress:
                on_progress()
    return [rows[(t[2], t[3])] for t in tasks]


def _fabric_spec(fabric: str, gpu: str | None, source: str):
    from commsim import catalog
    from commsim.specs import ClusterSpec, load_spec

    spec = load_spec(ClusterSpec, catalog.topology_path(fabric, source, "fabric"))
    if gpu:
        catalog.gpu(gpu, source, "gpu")
        spec = spec.model_copy(update={"node": spec.node.model_copy(update={"gpu": gpu})})
    return spec


def _size_one(scenario: Scenario, source: str, fabric: str, n: int, gpu: str | None) -> SizingRow:
    """One point of the sizing sweep (runs in a worker process)."""
    from commsim.predict import resolve

    spec = _fabric_spec(fabric, gpu, source)
    grown = spec.model_copy(update={"nodes": max(spec.nodes, -(-n // spec.node.gpus_per_node))})
    setup = resolve(scenario.model_copy(update={"cluster": grown, "gpus": n}), source, check=False)
    if setup.workload.heads is not None:
        found = plan_hybrid(setup, {}, keep=1)
    else:
        found = plan(
            setup, strategies(scenario.strategy, bucket_mb=(25.0,), placements=("blocked",))
        )
    best = found.ranked[0] if found.ranked else None
    return SizingRow(spec.name, n, best, "" if best else "; ".join(found.notes), fabric)


def objective_value(row: SizingRow, objective: str) -> float:
    """Smaller is better: seconds to train, money (or GPU-hours without a price), or
    seconds per step."""
    p = row.best
    if p is None:
        return np.inf
    t = p.training or {}
    if objective == "step-time":
        return p.step_time_s
    if objective == "time-to-train":
        return t.get("time_to_train_s", np.inf)
    cost = t.get("cost") if t.get("cost") is not None else t.get("gpu_hours", np.inf)
    return cost  # cost and throughput per dollar rank alike: tokens are fixed


def pareto_front(rows: Sequence[SizingRow]) -> list[SizingRow]:
    """Rows no other row beats on both time to train and cost (GPU-hours without a price)."""
    ok = [r for r in rows if r.best and r.best.training]

    def point(r):
        return objective_value(r, "time-to-train"), objective_value(r, "cost")

    return sorted(
        (
            r
            for r in ok
            if not any(
                point(o)[0] <= point(r)[0] and point(o)[1] <= point(r)[1] and point(o) != point(r)
                for o in ok
            )
        ),
        key=lambda r: point(r)[0],
    )


def pick_size(
    rows: Sequence[SizingRow], deadline_s: float | None, budget: float | None
) -> SizingRow | None:
    """The smallest cluster that meets the deadline (and the budget, if any); with only a
    budget, the fastest run within it."""
    ok = [r for r in rows if r.best and r.best.training]
    if budget is not None:
        ok = [r for r in ok if objective_value(r, "cost") <= budget]
    if deadline_s is not None:
        ok = [r for r in ok if objective_value(r, "time-to-train") <= deadline_s]
        return min(ok, key=lambda r: (r.gpus, objective_value(r, "cost")), default=None)
    return min(ok, key=lambda r: objective_value(r, "time-to-train"), default=None)
