"""The hybrid-layout search as a plan, and everything `commsim plan` searches, merged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from commsim.planner.ddp import ALGORITHMS, BUCKET_MB, COMPRESSIONS, PlanResult, plan, strategies
from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import Setup
from commsim.specs import Strategy
from commsim.step.hybrid import hybrid_model, hybrid_prediction
from commsim.step.memory import usable_bytes
from commsim.step.parallel import ALGORITHMS as HYBRID_ALGORITHMS
from commsim.topology.placement import PLACEMENT_KINDS, PLACEMENTS


def plan_hybrid(
    setup: Setup, pins: dict[str, object], keep: int = 200, exclude_data_parallel: bool = False
) -> PlanResult:
    """Search data x tensor x pipeline layouts (commsim.planner.search) and return the best `keep`
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
