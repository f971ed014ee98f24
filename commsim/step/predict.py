"""Predict one strategy's step: the step model on a single layout, laid out in detail.

The figures come from the vectorised step model (step.model), exactly as a search prices
the same strategy; the per-bucket timeline of plain data parallelism (step.timeline) and
the pipeline schedule of the other layouts (step.pipeline) lay the step out for tables and
plots, from the same parts.
"""

from __future__ import annotations

import numpy as np

from commsim.scenario import Setup, check_layout
from commsim.specs import SpecError, Strategy
from commsim.step.activations import recompute_code
from commsim.step.breakdown import MemoryBreakdown
from commsim.step.buckets import BucketPlan
from commsim.step.eager import KERNELS, torchtitan
from commsim.step.layouts import DTYPE_BYTES, Layouts, reshard_code
from commsim.step.memory import ParallelLayout, memory_per_gpu
from commsim.step.model import StepModel, state_grad_bytes
from commsim.step.pipeline import pipeline_events
from commsim.step.prediction import Prediction, prediction
from commsim.step.sync import BucketCosts
from commsim.step.timeline import StepReport, schedule_streams
from commsim.workload.model import Workload


def step_model(setup: Setup) -> StepModel:
    """The step model of a setup's workload on its cluster."""
    s = setup.scenario
    return StepModel(
        setup.workload,
        setup.cluster,
        setup.gpu,
        setup.n_gpus,
        s.global_batch,
        s.compute_efficiency,
        s.memory_reserve,
    )


def strategy_layouts(setup: Setup, strategies: list[Strategy]) -> Layouts:
    """Strategies as layouts at the scenario's micro-batch."""
    return Layouts.of(strategies, setup.scenario.micro_batch, setup.dp, setup.micro_batches)


def predict(
    setup: Setup, strategy: Strategy | None = None, model: StepModel | None = None
) -> Prediction:
    """Predict one optimizer step of the scenario (or of another strategy on its setup).
    `model` lets a caller that predicts many strategies share one model's caches."""
    strategy = strategy or setup.scenario.strategy
    check_layout(setup, strategy)
    model = model or step_model(setup)
    layouts = strategy_layouts(setup, [strategy])
    b = model.evaluate(layouts).row(0)
    if not np.isfinite(b["step"]):  # a collective its algorithm cannot run on its groups
        raise SpecError(
            setup.source,
            "strategy.algorithm",
            f"{strategy.algorithm!r} cannot run this layout's collectives on their groups "
            "(under gloo tree and hierarchical need whole nodes; under NCCL, NCCL_ALGO / "
            "NCCL_PROTO may leave NCCL none of it)",
        )
    single = float(model.single_gpu_step(layouts)[0])
    memory = layout_memory(setup, strategy, model)
    if layouts.plain[0]:
        report = layouts_timeline(setup, model, layouts, b["optimizer"], b["sync_rate"])
        buckets, events = tuple(report.buckets), tuple(report.events)
        return prediction(setup, strategy, b, single, memory, buckets, events)
    events = tuple(pipeline_events(layouts.row(0), b, model.dp.sync_plan(layouts, 0)))
    return prediction(setup, strategy, b, single, memory, events=events)


def ddp_timeline(
    workload: Workload,
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    buckets: BucketPlan,
    costs: BucketCosts,
    grad_bytes: float,
    *,
    overlap: bool,
    accum_steps: int,
    optimizer_s: float,
    contention: float = 1.0,
) -> StepReport:
    """A plain-DDP step laid out bucket by bucket (timeline.schedule_streams): per-layer
    forward and backward seconds of one micro-batch, the buckets and their costs, the
    backward's rate beside the all-reduces (step.contention)."""
    hooked = bool(costs.encode.any() or costs.decode.any())
    return schedule_streams(
        forward_s,
        backward_s,
        workload.tensor_params * float(grad_bytes),
        [list(t) for t in buckets.tensors],
        lambda sizes: costs.network,
        tensor_layer=workload.tensor_layer,
        overlap=overlap,
        accum_steps=accum_steps,
        optimizer_s=optimizer_s,
        names=[layer.name for layer in workload.layers],
        codec_time=(lambda sizes: (costs.encode, costs.decode)) if hooked else None,
        contention=contention,
    )


def layouts_timeline(
    setup: Setup, model: StepModel, layouts: Layouts, optimizer_s: float, contention=1.0
) -> StepReport:
    """The first layout's plain-DDP step with the buckets and costs the step model priced:
    its forward and backward per micro-batch spread over the layers by their FLOPs (the
    shares that set when each bucket is ready), the backward at `contention` of its speed
    beside the all-reduces (StepBreakdown.sync_rate)."""
    sync = model.dp.sync_plan(layouts, 0)
    c = model.compute(layouts)
    w = setup.workload
    weights = np.array(model.dp.layer_weights("none"))
    # each layer's share first, then the seconds: a step near the largest float stays finite
    forward = float(c.forward[0]) * (w.layer_flops / max(float(w.layer_flops.sum()), 1e-300))
    backward = float(c.backward[0]) * (weights / max(float(weights.sum()), 1e-300))
    return ddp_timeline(
        w,
        forward,
        backward,
        sync.buckets,
        sync.costs,
        layouts.grad_bytes[0],
        overlap=bool(layouts.overlap[0]),
        accum_steps=int(layouts.micro_batches[0]),
        optimizer_s=optimizer_s,
        contention=float(contention),
    )


def layout_memory(
    setup: Setup, strategy: Strategy, model: StepModel | None = None
) -> MemoryBreakdown:
    """Per-GPU memory of a strategy on the fullest pipeline stage, by kind; the workspace
    outside the tensors from the step model's groups (`model`, or the setup's)."""
    s, w = setup.scenario, setup.workload
    workspace = (model or step_model(setup)).workspace(strategy_layouts(setup, [strategy]))
    plain = strategy.data_parallel_only
    fp32_buffer = strategy.grad_accumulation == "fp32"
    layout = ParallelLayout(
        dp=setup.dp(strategy),
        tp=strategy.tp,
        pp=strategy.pp,
        ep=strategy.ep,
        etp=strategy.etp or 0,
        micro_batch=s.micro_batch,
        seq_len=w.seq_len,
        zero=strategy.zero,
        recompute=strategy.recompute,
        sequence_parallel=strategy.sequence_parallel and strategy.tp > 1,
        interleave=strategy.interleave,
        micro_batches=setup.micro_batches(strategy),
        grad_bytes=int(state_grad_bytes(plain, DTYPE_BYTES[strategy.grad_dtype], fp32_buffer)),
        bucket_mb=strategy.bucket_mb,
        first_layers=strategy.split_layers[0],
        last_layers=strategy.split_layers[1],
        cp=strategy.cp,
        flash=strategy.flash_attention,
        shard=strategy.fsdp_shard or 0,
        fsdp_states=strategy.states == "fsdp",
        fp8=strategy.precision == "fp8",
        moment_bytes=DTYPE_BYTES[strategy.optimizer_moments],
        recompute_parts=recompute_code(strategy.recompute_modules),
        fp8_param=strategy.fp8_param,
        fp8_cache=strategy.fp8_cache,
        dualpipe=strategy.pipeline_schedule == "dualpipe",
        reshard=reshard_code(strategy.reshard_after_forward),
        kv_gather=bool(torchtitan(KERNELS.index(strategy.kernels))) and strategy.cp > 1,
        residual_bytes=DTYPE_BYTES[strategy.grad_dtype] if _residual(strategy) else 0,
        workspace=float(workspace[0]),
    )
    return memory_per_gpu(w, layout)


def _residual(strategy: Strategy) -> bool:
    """Error feedback keeps a residual only when compression drops something."""
    return strategy.error_feedback and strategy.compression != "none"
