"""Predicted against measured: every collective, and the data-parallel step per bucket size.

Predictions come from the cluster with the profile written in (apply_profile: its tiers,
its NCCL fit, its backend) and the collective engine (GroupCost: NCCL's model capped by the
graph under nccl, the graph's schedules under gloo), each group on the GPUs its ranks
really ran on (points.placement), each op by the algorithm the profile names for the backend.
The data-parallel step is the harness model exported as a commsim Workload, its per-layer
forward and backward times scaled to the measured compute alone, laid on the timeline
(timeline.schedule_streams) with DDP's buckets (timeline.assign_buckets) and the predicted
all-reduce of each.

Errors: error = predicted / measured - 1; abs_pct = 100 |error|. Exposed communication can
be near zero, so its error is taken relative to the measured step time instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from commsim import catalog
from commsim.calibrate.points import collect_points, placement, span
from commsim.calibrate.records import DDPRecord, ModelRecord, Results
from commsim.collectives.group import GroupCost
from commsim.compression import parse_compressor
from commsim.profile import Profile, apply_profile
from commsim.specs import ClusterSpec, GPUSpec, SpecError
from commsim.step.buckets import MIB, stage_buckets
from commsim.step.predict import ddp_timeline
from commsim.step.sync import BucketCosts, allreduce_costs, compressed_costs
from commsim.step.timeline import StepReport
from commsim.topology.build import build_cluster
from commsim.workload.model import Layer, Workload

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class Row:
    """One comparison. kind: collective, ddp-step or ddp-exposed."""

    kind: str
    run: str
    op: str
    group_size: int
    span: str
    bytes: float | None
    bucket_mb: float | None
    measured_s: float
    predicted_s: float
    error: float  # predicted / measured - 1 (exposed: (predicted - measured) / step)

    @property
    def abs_pct(self) -> float:
        return 100.0 * abs(self.error)

    def to_dict(self) -> dict:
        return asdict(self) | {"abs_pct_error": self.abs_pct}


@dataclass(frozen=True)
class Validation:
    rows: list[Row]
    min_bytes: float

    def summary(self, kind: str) -> dict[str, float | int | None]:
        """Median and worst absolute percentage error of one kind of row (collectives:
        those of at least min_bytes)."""
        errs = [
            r.abs_pct
            for r in self.rows
            if r.kind == kind and (kind != "collective" or (r.bytes or 0) >= self.min_bytes)
        ]
        if not errs:
            return {"points": 0, "median_abs_pct_error": None, "max_abs_pct_error": None}
        return {
            "points": len(errs),
            "median_abs_pct_error": float(np.median(errs)),
            "max_abs_pct_error": float(np.max(errs)),
        }

    def to_dict(self) -> dict:
        coll = self.summary("collective")
        return {
            "rows": [r.to_dict() for r in self.rows],
            "min_bytes": self.min_bytes,
            "median_abs_pct_error": coll["median_abs_pct_error"],
            "max_abs_pct_error": coll["max_abs_pct_error"],
            "points": coll["points"],
            "ddp_step": self.summary("ddp-step"),
            "ddp_exposed": self.summary("ddp-exposed"),
        }


def harness_workload(model: ModelRecord) -> Workload:
    """The harness's model as a commsim Workload: its layers, parameter tensors in
    registration order and forward FLOPs per sample, so predictions describe it."""
    layers = tuple(Layer(x.name, tuple(x.tensors), x.forward_flops) for x in model.layers)
    return Workload(model.name, layers, seq_len=None)


def codec_gpu(spec: ClusterSpec, profile: Profile | None) -> GPUSpec:
    """The GPU entry that prices a comm hook's codec: the cluster's, its matmul rate the
    measured compute rate when the profile has one (encode_decode_seconds takes half the
    peak)."""
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    if profile is not None and profile.compute is not None:
        gpu = gpu.model_copy(update={"peak_flops": 2.0 * profile.compute.flops_per_s})
    return gpu


def predict_ddp(
    group: GroupCost, model: ModelRecord, ddp: DDPRecord, algorithm: str, gpu: GPUSpec
) -> StepReport:
    """The predicted data-parallel step of the harness model for one bucket size and comm hook,
    by the step model's own DDP timeline (step.predict.ddp_timeline) and bucket rule.

    Per-layer forward and backward times are the harness's measured ones scaled so they
    sum to the measured compute alone (minus the optimizer); they also set when each bucket
    is ready. Each bucket runs its hook's collectives (plain: one all-reduce) in `algorithm`
    on the group's GPUs, plus the hook's encode/decode priced on `gpu`; the optimizer runs
    after the last exchange."""
    workload = harness_workload(model)
    fwd = np.array([x.forward_s for x in model.layers])
    bwd = np.array([x.backward_s for x in model.layers])
    scale = max(ddp.compute_s - ddp.optimizer_s, 0.0) / float(fwd.sum() + bwd.sum())
    elt = int(DTYPE_BYTES.get(model.dtype, 4))
    buckets = stage_buckets(
        workload,
        "only",
        0,
        1,
        1,
        elt,
        ddp.bucket_mb * MIB,
        ddp.first_bucket_mb * MIB,
        tuple(bwd.tolist()),
    )
    n = len(group.gpus)

    def price(op, alg, sizes, expert):
        return group.time(op, alg, sizes)

    if ddp.compression == "none" or n == 1:
        network = allreduce_costs(price, algorithm, buckets.bytes, buckets.expert, 0, elt)
        costs = BucketCosts(network, np.zeros(len(buckets)), np.zeros(len(buckets)))
    else:
        compressor = parse_compressor(ddp.compression)
        shapes = [list(s) for x in model.layers for s in (x.shapes or [])]
        per_tensor = None
        if len(shapes) == workload.tensor_params.size:  # the hook sees the bucket's tensors
            per_tensor = [
                compressor.tensor_collectives([shapes[i] for i in b], n) for b in buckets.tensors
            ]
        costs = compressed_costs(
            price,
            algorithm,
            lambda op: (algorithm,),
            compressor,
            buckets.bytes / elt,
            n,
            gpu,
            ddp.error_feedback,
            per_tensor,
        )
    return ddp_timeline(
        workload,
        fwd * scale,
        bwd * scale,
        buckets,
        costs,
        elt,
        overlap=ddp.overlap,
        accum_steps=1,
        optimizer_s=ddp.optimizer_s,
    )


def validate(
    results: Results,
    spec: ClusterSpec,
    profile: Profile,
    *,
    min_bytes: float = 0.0,
    profile_source: str = "profile",
) -> Validation:
    """Predict every measured point with the profile applied to `spec`."""
    backends = results.backends
    if backends != {profile.backend}:
        raise SpecError(
            profile_source,
            "backend",
            f"profile is for {profile.backend}, the results are {', '.join(sorted(backends))}",
        )
    fitted = apply_profile(spec, profile, profile_source)
    points, _ = collect_points(results, fitted)
    ops = {p.op for p in points} | (
        {"all-reduce"} if any(r.ddp for r in results.runs.values()) else set()
    )
    missing = sorted(ops - set(profile.algorithms))
    if missing:
        raise SpecError(profile_source, "algorithms", f"names no algorithm for {missing[0]}")
    ddp_runs = [(rid, run) for rid, run in results.runs.items() if run.model and run.ddp]
    world = {rid: placement(run.meta, fitted, f"run {rid}") for rid, run in ddp_runs}
    gpus_used = [g for p in points for g in p.gpus] + [g for w in world.values() for g in w]
    if not gpus_used:
        raise SpecError(", ".join(results.files), "", "nothing measured to validate")
    cluster = build_cluster(fitted, max(gpus_used) + 1)
    gpu = codec_gpu(fitted, profile)
    groups: dict[tuple[int, ...], GroupCost] = {}

    def group(gpus) -> GroupCost:
        key = tuple(int(g) for g in gpus)
        return groups.get(key) or groups.setdefault(key, GroupCost(cluster, np.array(key)))

    rows = []
    for p in points:
        pred = float(group(p.gpus).time(p.op, profile.algorithms[p.op], p.bytes)[0])
        rows.append(
            Row(
                "collective",
                p.run,
                p.op,
                len(p.gpus),
                p.span,
                p.bytes,
                None,
                p.measured_s,
                pred,
                pred / p.measured_s - 1.0,
            )
        )
    for rid, run in ddp_runs:
        gpus = world[rid]
        where = span(fitted, gpus)
        for d in run.ddp:
            rep = predict_ddp(group(gpus), run.model, d, profile.algorithms["all-reduce"], gpu)  # type: ignore[arg-type]
            op = "ddp" if d.compression == "none" else f"ddp {d.compression}"
            common = (rid, op, len(gpus), where, None, d.bucket_mb)
            rows.append(
                Row(
                    "ddp-step",
                    *common,
                    d.step_s,
                    rep.step_time_s,
                    rep.step_time_s / d.step_s - 1.0,
                )
            )
            rows.append(
                Row(
                    "ddp-exposed",
                    *common,
                    d.exposed_comm_s,
                    rep.exposed_comm_s,
                    (rep.exposed_comm_s - d.exposed_comm_s) / d.step_s,
                )
            )
    return Validation(rows, min_bytes)
