"""Data x tensor x pipeline layouts priced by the vectorised step model (step.parallel)."""

from __future__ import annotations

import numpy as np

from commsim.scenario import Setup
from commsim.specs import (
    Strategy,
)
from commsim.step.memory import (
    RECOMPUTE,
    ParallelLayout,
    memory_per_gpu,
)
from commsim.step.parallel import ALGORITHMS as HYBRID_ALGORITHMS
from commsim.step.parallel import NCCL_ALGORITHMS, HybridModel, Layouts
from commsim.step.pipeline import pipeline_events
from commsim.step.prediction import Prediction, prediction
from commsim.step.timeline import (
    DTYPE_BYTES,
    Event,
    adam_step_time,
)
from commsim.topology.placement import PLACEMENT_KINDS


def strategy_layouts(setup: Setup, strategies: list[Strategy]) -> Layouts:
    """Strategies as the hybrid model's layout arrays."""

    def col(f, dtype=np.int64):
        return np.array([f(x) for x in strategies], dtype=dtype)

    return Layouts(
        dp=col(setup.dp),
        tp=col(lambda x: x.tp),
        pp=col(lambda x: x.pp),
        ep=col(lambda x: x.ep),
        micro_batch=col(lambda x: setup.scenario.micro_batch),
        micro_batches=col(setup.micro_batches),
        zero=col(lambda x: x.zero),
        recompute=col(lambda x: RECOMPUTE.index(x.recompute)),
        interleave=col(lambda x: x.interleave),
        bucket_mb=col(lambda x: x.bucket_mb, float),
        overlap=col(lambda x: x.overlap, bool),
        algorithm=col(lambda x: HYBRID_ALGORITHMS.index(x.algorithm)),
        placement=col(lambda x: PLACEMENT_KINDS.index(x.placement)),
        first_layers=col(lambda x: x.split_layers[0]),
        last_layers=col(lambda x: x.split_layers[1]),
    )


def hybrid_model(setup: Setup, strategy: Strategy) -> HybridModel:
    """The hybrid step model of this setup (gradients reduced in the strategy's dtype)."""
    s = setup.scenario
    return HybridModel(
        setup.workload,
        setup.cluster,
        setup.gpu,
        setup.n_gpus,
        s.global_batch,
        s.compute_efficiency,
        DTYPE_BYTES[strategy.grad_dtype],
    )


def predict_hybrid(
    setup: Setup, strategy: Strategy, model: HybridModel | None = None
) -> Prediction:
    """Predict a data x tensor x pipeline layout with commsim.step.parallel's step model; an
    algorithm the hybrid model does not name ('auto', 'nccl', 'ps') runs as the faster of
    NCCL's ring and tree, as the search takes it, and the prediction names the one run."""
    model = model or hybrid_model(setup, strategy)
    names = (strategy.algorithm,) if strategy.algorithm in HYBRID_ALGORITHMS else NCCL_ALGORITHMS
    candidates = [strategy.model_copy(update={"algorithm": a}) for a in names]
    layouts = strategy_layouts(setup, candidates)
    rows = model.evaluate(layouts)
    best = int(np.argmin(rows.step))
    b = rows.row(best)
    events = tuple(pipeline_events(layouts.row(best), b))
    return hybrid_prediction(setup, candidates[best], b, events)


def hybrid_prediction(
    setup: Setup, strategy: Strategy, b: dict[str, float], events: tuple[Event, ...] = ()
) -> Prediction:
    """A Prediction from one row of the hybrid model's StepBreakdown (with the pipeline's
    events when the caller will draw them)."""
    comm = b["tp_comm"] + b["ep_comm"] + b["pp_comm"] + b["dp_comm"]
    exposed = b["tp_comm"] + b["ep_comm"] + b["pp_comm"] + b["dp_exposed"]
    compute = b["compute"] + b["optimizer"]
    parts = {
        "compute_s": compute,
        "forward_s": b["compute"] / 3.0,
        "backward_s": b["compute"] * 2.0 / 3.0,
        "optimizer_s": b["optimizer"],
        "comm_s": comm,
        "codec_s": 0.0,
        "exposed_comm_s": exposed,
        "bubble_s": b["bubble"],
        "tp_comm_s": b["tp_comm"],
        "ep_comm_s": b["ep_comm"],
        "pp_comm_s": b["pp_comm"],
        "dp_comm_s": b["dp_comm"],
        "dp_exposed_s": b["dp_exposed"],
    }
    w, s = setup.workload, setup.scenario
    single = s.global_batch * w.train_flops / (setup.gpu.peak_flops * s.compute_efficiency) + (
        adam_step_time(w.params, setup.gpu, DTYPE_BYTES[strategy.grad_dtype])
    )
    layout = ParallelLayout(
        dp=setup.dp(strategy),
        tp=strategy.tp,
        pp=strategy.pp,
        ep=strategy.ep,
        micro_batch=s.micro_batch,
        seq_len=w.seq_len,
        zero=strategy.zero,
        recompute=strategy.recompute,
        sequence_parallel=strategy.tp > 1,
        interleave=strategy.interleave,
        micro_batches=setup.micro_batches(strategy),
        grad_bytes=DTYPE_BYTES[strategy.grad_dtype],
        bucket_mb=strategy.bucket_mb,
        first_layers=strategy.split_layers[0],
        last_layers=strategy.split_layers[1],
    )
    return prediction(
        setup,
        strategy,
        b["step"],
        parts,
        1.0 - exposed / comm if comm > 0 else 1.0,
        compute / max(compute, comm) if compute > 0 else 1.0,
        single,
        mfu=b["mfu"],
        hfu=b["hfu"],
        memory=memory_per_gpu(w, layout),
        events=events,
    )
