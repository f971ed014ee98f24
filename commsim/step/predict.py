"""From a scenario to a predicted step: resolve names, build the cluster, run the timeline.

This is the one place where the specs, the topology, the collective costs and the
timeline meet; the CLI, the planner and notebooks all come through here.
"""

from __future__ import annotations

from commsim.collectives.group import GroupCost
from commsim.scenario import Setup, check_layout
from commsim.specs import (
    Strategy,
)
from commsim.step.ddp import (
    _metrics,
    _step,
    bucket_codec_time,
    bucket_sync_time,
    gradient_sync_cost,
)
from commsim.step.hybrid import predict_hybrid
from commsim.step.prediction import Prediction


def predict(
    setup: Setup, strategy: Strategy | None = None, cost: GroupCost | None = None
) -> Prediction:
    """Predict one optimizer step of the scenario (or of another strategy on its setup).

    Plain DDP runs the per-bucket timeline; a hybrid layout the Megatron-style model of
    commsim.step.parallel. `cost` lets a caller that predicts many DDP strategies share one
    cached cost model."""
    strategy = strategy or setup.scenario.strategy
    if not strategy.data_parallel_only:
        check_layout(setup, strategy)
        return predict_hybrid(setup, strategy)
    cost = cost or gradient_sync_cost(setup, strategy)
    report = _step(
        setup,
        strategy,
        bucket_sync_time(setup, strategy, cost),
        codec_time=bucket_codec_time(setup, strategy),
    )
    return _metrics(setup, strategy, report)
