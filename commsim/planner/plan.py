"""What `commsim plan` does: search every layout, keep the best as full predictions, and
say what was left out and why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from commsim.planner.search import SearchResult, distinct_placements, enumerate_layouts, search
from commsim.scenario import Setup
from commsim.specs import Strategy
from commsim.step.model import StepModel
from commsim.step.pipeline import pipeline_events
from commsim.step.predict import layout_memory, layouts_timeline, step_model
from commsim.step.prediction import Prediction, prediction
from commsim.units import fmt_gpus

KEEP = 200  # predictions a plan keeps, best first


@dataclass
class PlanResult:
    """Ranked predictions, best first, and what was left out of the search and why."""

    ranked: list[Prediction]
    notes: list[str] = field(default_factory=list)
    searched: int = 0  # layouts enumerated
    skipped: int = 0  # of those: not fitting in memory, or not runnable on their groups
    fitting: int = 0  # of those: fitting in GPU memory (runnable or not)


def plan(
    setup: Setup,
    base: Strategy,
    pinned: set[str],
    keep: int = KEEP,
    on_progress: Callable[[int, int], None] | None = None,
    best_only: bool = False,
) -> PlanResult:
    """Search every layout with the `pinned` strategy fields (and "micro_batch") held at
    base's (the scenario's) values, and return the best `keep` as predictions; with
    `best_only` the fastest alone, pricing only the layouts that may be it (search)."""
    pins = {k: getattr(base, k) for k in pinned if k in Strategy.model_fields}
    if "micro_batch" in pinned:
        pins["micro_batch"] = setup.scenario.micro_batch
    model = step_model(setup)
    layouts = enumerate_layouts(setup, pins, base)
    found = search(model, layouts, on_progress, best_only)
    result = PlanResult(
        ranked=[
            _prediction(setup, model, found, int(k), base, gantt=n == 0)
            for n, k in enumerate(found.ranked[: 1 if best_only else keep])
        ],
        searched=found.searched,
        skipped=found.dropped + len(found.fitting) - len(found.ranked),
        fitting=int(found.fits.sum()),
    )
    result.notes = _notes(setup, found, pins)
    return result


def _prediction(
    setup: Setup, model: StepModel, found: SearchResult, k: int, base: Strategy, gantt: bool
) -> Prediction:
    """The prediction of the k-th fitting layout, laid out in detail; a hybrid layout's
    pipeline schedule (events op by op, seconds for thousands of micro-batches) only with
    `gantt` (the winner's)."""
    i = int(found.fitting[k])
    one = found.layouts.take(np.array([i]))
    strategy = one.strategy(0, base)
    variant = _at_micro_batch(setup, int(one.micro_batch[0]))
    b = found.breakdown.row(k)
    single = float(model.single_gpu_step(one)[0])
    memory = layout_memory(variant, strategy)
    if one.plain[0]:
        report = layouts_timeline(variant, model, one, b["optimizer"], b["sync_rate"])
        return prediction(
            variant, strategy, b, single, memory, tuple(report.buckets), tuple(report.events)
        )
    sync = model.dp.sync_plan(one, 0) if gantt else None
    events = tuple(pipeline_events(one.row(0), b, sync)) if gantt else ()
    return prediction(variant, strategy, b, single, memory, events=events)


def _at_micro_batch(setup: Setup, micro_batch: int) -> Setup:
    """The setup with another micro-batch size (a layout's)."""
    return replace(setup, scenario=setup.scenario.model_copy(update={"micro_batch": micro_batch}))


def _notes(setup: Setup, found: SearchResult, pins: dict) -> list[str]:
    """What a reader needs to trust the ranking: what was left out and why (the counts are
    PlanResult's: searched, fitting, ranked)."""
    s = setup.scenario
    _, same = distinct_placements(setup)
    notes = [
        f"placement {p} gives the same rank order as {q} here; shown as {q}"
        for p, q in same.items()
        if "placement" not in pins and len(found.ranked)
    ]
    if not found.searched:
        held = ", ".join(f"{k} {v}" for k, v in pins.items() if k not in ("compression",))
        notes.append(
            f"no layout of {setup.workload.name} runs on {fmt_gpus(setup.n_gpus)}"
            + (f" with {held}" if held else "")
            + f" at global batch {s.global_batch}"
        )
    if found.dropped:
        dropped = np.nonzero(~found.fits)[0]
        smallest = found.layouts.take(dropped[[np.argmin(found.memory[dropped])]])
        variant = _at_micro_batch(setup, int(smallest.micro_batch[0]))
        why = layout_memory(variant, smallest.strategy(0, setup.scenario.strategy))
        notes.append(f"the smallest layout that does not fit in GPU memory {why.reason(setup.gpu)}")
    if len(found.fitting) > len(found.ranked):
        nccl = setup.cluster.spec.nccl
        limited = nccl.algo or nccl.proto
        why = "; or NCCL_ALGO / NCCL_PROTO leave NCCL nothing to run" if limited else ""
        notes.append(
            "some layouts fit but cannot run their algorithm on their groups "
            f"(tree and hierarchical need whole nodes{why})"
        )
    if s.global_batch % (setup.n_gpus * s.micro_batch) and "tp" not in pins:
        notes.append(
            f"plain data parallelism at micro-batch {s.micro_batch} needs a global batch that "
            f"is a multiple of {setup.n_gpus} GPUs x {s.micro_batch}"
        )
    if pins.get("compression", "none") != "none":
        notes.append("gradient compression (a DDP comm hook) applies to plain data parallelism")
    return notes
