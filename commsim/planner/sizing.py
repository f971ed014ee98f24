"""Cluster sizing: the best layout per fabric and GPU count, its goodput under failures
(commsim.reliability: interruptions, checkpoints, restarts, spares), the Pareto front of time
to train against cost, and the pick for a deadline or a budget. Times and costs are the
ones with failures counted when a recovery policy is given, the ideal ones beside them."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from commsim.planner.plan import plan
from commsim.reliability.goodput import GoodputReport, best_spares, expected_goodput
from commsim.reliability.recovery import Policy
from commsim.scenario import resolve
from commsim.specs import Scenario
from commsim.step.prediction import Prediction


@dataclass
class SizingRow:
    """The best strategy for one fabric and cluster size, and what it costs."""

    fabric: str
    gpus: int
    best: Prediction | None  # None: nothing fits or divides the batch
    note: str = ""
    fabric_file: str = ""  # the name or path it was given as
    goodput: GoodputReport | None = None  # under the sizing's recovery policy (None: ideal)

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
        if self.goodput:
            out |= self.goodput.sizing_fields()
        return out


OBJECTIVES = ("time-to-train", "cost", "throughput-per-dollar", "step-time")


def size_clusters(
    scenario: Scenario,
    source: str,
    fabrics: Sequence[str],
    sizes: Sequence[int],
    gpu: str | None = None,
    on_progress: Callable[[], None] | None = None,
    policy: Policy | None = None,
    pinned: frozenset[str] | set[str] = frozenset(),
) -> list[SizingRow]:
    """For every fabric and GPU count, the fastest layout that fits (hybrid search for
    transformers, plain DDP otherwise) and, under a recovery `policy`, its goodput. A fabric
    file is a template: it grows to as many nodes as a size needs, and `gpu` swaps its GPU
    model; `pinned` strategy fields keep the scenario's values. The points are independent,
    so they run on every core, the largest first."""
    pins = frozenset(pinned)
    tasks = [(scenario, source, f, n, gpu, policy, pins) for f in fabrics for n in sizes]
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
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec

    spec = load_spec(ClusterSpec, catalog.topology_path(fabric, source, "fabric"))
    if gpu is not None:  # "" is refused as a GPU, not taken for none
        catalog.gpu(gpu, source, "gpu")
        spec = spec.model_copy(update={"node": spec.node.model_copy(update={"gpu": gpu})})
    return spec


def _size_one(
    scenario: Scenario,
    source: str,
    fabric: str,
    n: int,
    gpu: str | None,
    policy: Policy | None,
    pinned: frozenset[str],
) -> SizingRow:
    """One point of the sizing sweep (runs in a worker process)."""
    spec = _fabric_spec(fabric, gpu, source)
    grown = spec.model_copy(update={"nodes": max(spec.nodes, -(-n // spec.node.gpus_per_node))})
    setup = resolve(scenario.model_copy(update={"cluster": grown, "gpus": n}), source, check=False)
    # a cluster's size is what is asked: gradient compression is left to `plan` proper
    base = scenario.strategy.model_copy(update={"compression": "none", "error_feedback": False})
    found = plan(setup, base, {"compression", *pinned}, best_only=True)
    best = found.ranked[0] if found.ranked else None
    note = "" if best else "; ".join(found.notes)
    return SizingRow(spec.name, n, best, note, fabric, _goodput(best, setup, policy))


def _goodput(best: Prediction | None, setup, policy: Policy | None) -> GoodputReport | None:
    """The best layout's goodput under `policy`: its checkpoint interval the model's optimum
    unless given; with hot spares and no count given, the count that costs the fewest
    GPU-hours per useful GPU-hour (reliability.goodput.best_spares)."""
    if best is None or policy is None:
        return None
    if policy.strategy == "hot-spare" and policy.spares is None:
        return best_spares(best, setup, policy)
    return expected_goodput(best, setup, policy)


def objective_value(row: SizingRow, objective: str) -> float:
    """Smaller is better: seconds to train, money (or GPU-hours without a price), or
    seconds per step; with failures counted where the row has its goodput."""
    p = row.best
    if p is None:
        return np.inf
    t = p.training or {}
    if row.goodput and row.goodput.time_to_train_s is not None:
        g = row.goodput
        t = {"time_to_train_s": g.time_to_train_s, "gpu_hours": g.gpu_hours, "cost": g.cost}
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
