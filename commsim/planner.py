"""Enumerate data-parallel strategies, predict each, rank them by step time."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from commsim.collectives.group import GroupCost
from commsim.predict import Prediction, Setup, gradient_sync_cost, predict
from commsim.specs import Strategy
from commsim.topology.placement import PLACEMENTS

ALGORITHMS = ("ring", "tree", "rhd", "ps", "hierarchical")
BUCKET_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)  # DDP bucket_cap_mb choices


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
) -> list[Strategy]:
    """The cross product of the searched dimensions, other fields taken from `base`."""
    return [
        base.model_copy(update={"algorithm": a, "bucket_mb": b, "overlap": o, "placement": p})
        for a, b, o, p in itertools.product(algorithms, bucket_mb, overlap, placements)
    ]


def plan(
    setup: Setup,
    candidates: Iterable[Strategy],
    on_progress: Callable[[], None] | None = None,
) -> PlanResult:
    """Predict every candidate (one cost model per placement, shared) and rank by step time.

    Left out: a candidate whose algorithm cannot run on the group (tree and hierarchical
    need whole nodes), and one whose placement gives the very same rank order as a
    placement already searched (its predictions would be identical rows).
    """
    costs: dict[tuple[str, int], GroupCost] = {}
    same_as: dict[str, str] = {}
    result = PlanResult(ranked=[])
    for strategy in candidates:
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
        usable = strategy.algorithm in ("auto", *costs[key].algorithms("all-reduce"))
        if usable and strategy.placement not in same_as:
            result.ranked.append(predict(setup, strategy, costs[key]))
        else:
            result.skipped += 1
        if on_progress:
            on_progress()
    result.ranked.sort(key=lambda p: p.report.step_time_s)
    result.notes = [
        f"placement {p} gives the same rank order as {q} here; shown as {q}"
        for p, q in same_as.items()
    ]
    return result
