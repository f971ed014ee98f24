"""Predicted against measured: every collective, and the data-parallel step per bucket size.

Predictions come from the cluster with a profile carried over (profile.carry_over: its link
classes, per-call overhead, NCCL fit and backend), or without one from the cluster as it is
with the runs' backend, and the collective engine (GroupCost: NCCL's model capped by the
graph under nccl, the graph's schedules under gloo), each group on the GPUs its ranks
really ran on (points.placement), each op by the algorithm the backend runs. Points commsim
does not price as measured (points.unmodelled) are shown with the reason and left out of
the summaries. The data-parallel step is the harness model exported as a commsim Workload,
its per-layer forward and backward times scaled to the measured compute alone, laid on the
timeline with DDP's buckets as the run's torch forms them (step.buckets: its first-bucket
rule by version), checked against the layout DDP itself reported, and the predicted
all-reduce of each.

Errors: error = predicted / measured - 1; abs_pct = 100 |error|. Exposed communication can
be near zero, so its error is taken relative to the measured step time instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from commsim import catalog
from commsim.calibrate.points import collect_points, placement, span
from commsim.calibrate.records import DDPRecord, ModelRecord, Results
from commsim.collectives.backends import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.compression import parse_compressor
from commsim.profile import Profile, carry_over, compute_efficiency
from commsim.specs import ClusterSpec, GPUSpec, SpecError
from commsim.step.buckets import MIB, BucketPlan, ddp_first_bucket_bytes, stage_buckets
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
    unmodelled: str = ""  # why commsim does not price it as measured (not summarised)

    @property
    def abs_pct(self) -> float:
        return 100.0 * abs(self.error)

    def to_dict(self) -> dict:
        return asdict(self) | {"abs_pct_error": self.abs_pct}


@dataclass(frozen=True)
class Validation:
    rows: list[Row]
    min_bytes: float
    backend: str = ""
    notes: list[str] = field(default_factory=list)  # what was carried over, bucket checks

    def summary(self, kind: str) -> dict[str, float | int | None]:
        """Median and worst absolute percentage error of one kind of row (collectives:
        those of at least min_bytes that commsim models)."""
        errs = [
            r.abs_pct
            for r in self.rows
            if r.kind == kind
            and not r.unmodelled
            and (kind != "collective" or (r.bytes or 0) >= self.min_bytes)
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
            "backend": self.backend,
            "notes": self.notes,
            "unmodelled_points": sum(1 for r in self.rows if r.unmodelled),
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
    measured compute rate when the profile measured this GPU (encode_decode_seconds takes
    half the peak)."""
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    if profile is not None and compute_efficiency(spec, profile) is not None:
        gpu = gpu.model_copy(update={"peak_flops": 2.0 * profile.compute.flops_per_s})
    return gpu


def ddp_buckets(model: ModelRecord, ddp: DDPRecord, torch_version: str) -> BucketPlan:
    """The buckets the run's DDP formed, by commsim's rule (step.buckets) for the run's
    torch (the harness always gives bucket_cap_mb): per-layer backward times set when each
    is ready."""
    bwd = tuple(x.backward_s for x in model.layers)
    cap = float(int(ddp.bucket_mb * MIB))  # DDP: int(bucket_cap_mb * 1024 * 1024)
    first = ddp_first_bucket_bytes(cap, True, torch_version)
    elt = int(DTYPE_BYTES.get(model.dtype, 4))
    return stage_buckets(harness_workload(model), "only", 0, 1, 1, elt, cap, first, bwd)


def bucket_check(plan: BucketPlan, ddp: DDPRecord, torch_version: str) -> str | None:
    """A note where DDP's own buckets (as its logger reported them) differ from commsim's
    rule by more than 1% in a bucket's bytes, or in their number."""
    if ddp.buckets_bytes is None:
        return None
    theirs, ours = np.array(ddp.buckets_bytes, dtype=float), plan.bytes
    if theirs.size == ours.size and np.allclose(theirs, ours, rtol=0.01):
        return None

    def mib(x: np.ndarray) -> str:
        return ", ".join(f"{b / MIB:.3g}" for b in x)

    return (
        f"{ddp.bucket_mb:g} MiB cap: torch {torch_version or '?'}'s DDP formed buckets of "
        f"{mib(theirs)} MiB, commsim's rule {mib(ours)} MiB"
    )


def predict_ddp(
    group: GroupCost,
    model: ModelRecord,
    ddp: DDPRecord,
    algorithm: str,
    gpu: GPUSpec,
    torch_version: str = "",
) -> StepReport:
    """The predicted data-parallel step of the harness model for one bucket size and comm hook,
    by the step model's own DDP timeline (step.predict.ddp_timeline) and the buckets the
    run's torch forms (ddp_buckets).

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
    buckets = ddp_buckets(model, ddp, torch_version)
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


def _prepared(
    results: Results, spec: ClusterSpec, profile: Profile | None, source: str
) -> tuple[ClusterSpec, str, dict[str, str], list[str]]:
    """The cluster to predict on, the backend, its algorithm per op, and what a profile
    carried over: the profile's, or without one the runs' backend on the cluster as is."""
    backends = results.backends
    if profile is None:
        if len(backends) != 1:
            raise SpecError(", ".join(results.files), "backend", f"runs mix {sorted(backends)}")
        backend = next(iter(backends))
        if backend not in ALGORITHMS:
            raise SpecError(", ".join(results.files), "backend", f"unknown backend {backend!r}")
        note = f"no profile: cluster {spec.name!r} as it is, {backend}'s algorithms"
        return spec.model_copy(update={"backend": backend}), backend, ALGORITHMS[backend], [note]
    if backends != {profile.backend}:
        raise SpecError(
            source,
            "backend",
            f"profile is for {profile.backend}, the results are {', '.join(sorted(backends))}",
        )
    fitted, notes = carry_over(spec, profile, source)
    return fitted, profile.backend, dict(profile.algorithms), notes


def validate(
    results: Results,
    spec: ClusterSpec,
    profile: Profile | None = None,
    *,
    min_bytes: float = 0.0,
    profile_source: str = "profile",
) -> Validation:
    """Predict every measured point on `spec`, with the profile carried over if given."""
    fitted, backend, algorithms, notes = _prepared(results, spec, profile, profile_source)
    points, _ = collect_points(results, fitted)
    ops = {p.op for p in points} | (
        {"all-reduce"} if any(r.ddp for r in results.runs.values()) else set()
    )
    missing = sorted(ops - set(algorithms))
    if missing:
        raise SpecError(profile_source, "algorithms", f"names no algorithm for {missing[0]}")
    ddp_runs = [(rid, run) for rid, run in results.runs.items() if run.model and run.ddp]
    world = {rid: placement(run.meta, fitted, results.where(rid)) for rid, run in ddp_runs}
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
        pred = float(group(p.gpus).time(p.op, algorithms[p.op], p.bytes)[0])
        where = (p.run, p.op, len(p.gpus), p.span, p.bytes, None)
        error = pred / p.measured_s - 1.0
        rows.append(Row("collective", *where, p.measured_s, pred, error, p.unmodelled))
    for rid, run in ddp_runs:
        torch_version = run.meta.versions.get("torch", "")
        gpus = world[rid]
        where = span(fitted, gpus)
        for d in run.ddp:
            rep = predict_ddp(
                group(gpus),
                run.model,
                d,
                algorithms["all-reduce"],
                gpu,
                torch_version,  # type: ignore[arg-type]
            )
            checked = bucket_check(ddp_buckets(run.model, d, torch_version), d, torch_version)  # type: ignore[arg-type]
            notes += [f"run {rid}: {checked}"] if checked else []
            op = "ddp" if d.compression == "none" else f"ddp {d.compression}"
            common = (rid, op, len(gpus), where, None, d.bucket_mb)
            step_error = rep.step_time_s / d.step_s - 1.0
            rows.append(Row("ddp-step", *common, d.step_s, rep.step_time_s, step_error))
            exposed_error = (rep.exposed_comm_s - d.exposed_comm_s) / d.step_s
            rows.append(
                Row("ddp-exposed", *common, d.exposed_comm_s, rep.exposed_comm_s, exposed_error)
            )
    return Validation(rows, min_bytes, backend, list(dict.fromkeys(notes)))
