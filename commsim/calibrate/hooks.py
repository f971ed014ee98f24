"""DDP comm hooks, predicted against measured: each hook's speedup over plain all-reduce.

The harness (`calibrate run --comm-hooks none,fp16,powersgd:1`) times the DDP step of its
model once per bucket cap and hook, each `ddp` record naming its hook as commsim spells it
(`compression`, `error_feedback`, `overlap`). Per bucket cap, the measured speedup of a hook
is the uncompressed step time over its own; commsim predicts both steps of the same model
(validate.predict_ddp's per-layer times, scaled to the measured compute alone) with the
hook's collectives and codec cost as predict.bucket_sync_time and bucket_codec_time price
them, and error = predicted speedup / measured speedup - 1.

Approximations, stated rather than hidden:
- codec cost: commsim's model is a GPU HBM pass (bytes at the memory bandwidth, matmul FLOPs
  at the fp32 peak). On CPU hosts it is priced with the cluster's GPU entry (cpu-host:
  20 GB/s, 100 GFLOP/s, order-of-magnitude figures); with a profile that fitted the compute
  rate, the matmul rate is the measured FLOP/s instead. The predicted codec seconds are
  reported separately (codec_s) so a reader can see how much of a prediction they carry;
  on a slow link they are a few per cent of the step.
- PowerSGD: torch's powerSGD_hook compresses each >= 2-D tensor as (rows, rest) and
  all-reduces 1-D tensors uncompressed (three all-reduces per bucket); commsim prices the
  flat bucket as batched_powerSGD_hook does (one square matrix, two all-reduces). At rank 1
  both payloads are a small fraction of the bucket, so the step is latency-bound either way.
- gloo: PowerSGD runs one bucket at a time there (record overlap false; see the harness),
  predicted with overlap off: the buckets' exchanges after the backward, one after another.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from commsim import catalog
from commsim.calibrate.fit import GroupModel, placement
from commsim.calibrate.profile import (
    ALGORITHMS,
    DDPRecord,
    ModelRecord,
    Profile,
    Results,
    apply_profile,
)
from commsim.calibrate.validate import DTYPE_BYTES, harness_workload, predict_ddp
from commsim.compression import encode_decode_seconds, parse_compressor
from commsim.specs import ClusterSpec, GPUSpec, SpecError
from commsim.timeline import MIB, StepReport, assign_buckets, schedule_streams
from commsim.topology.build import build_cluster


class HookDDPRecord(DDPRecord):
    """A `ddp` record with the comm hook it ran (files without one ran none)."""

    compression: str = "none"
    error_feedback: bool = False
    overlap: bool = True


@dataclass(frozen=True)
class HookRow:
    """One bucket cap and hook: measured and predicted step, speedup over no hook."""

    run: str
    bucket_mb: float
    compression: str
    error_feedback: bool
    overlap: bool
    measured_step_s: float
    measured_speedup: float
    predicted_step_s: float
    predicted_speedup: float
    codec_s: float  # predicted encode + decode seconds per step
    error: float  # predicted_speedup / measured_speedup - 1

    def to_dict(self) -> dict:
        return asdict(self)


def hook_records(results: Results) -> dict[str, list[HookDDPRecord]]:
    """Every run's `ddp` records with their hook fields (Results drops unknown fields)."""
    out: dict[str, list[HookDDPRecord]] = {}
    for path in results.files:
        for line in Path(path).read_text().splitlines():
            rec = json.loads(line) if line.strip().startswith("{") else None
            if (
                isinstance(rec, dict)
                and rec.get("kind") == "ddp"
                and rec.get("run") in results.runs
            ):
                out.setdefault(rec["run"], []).append(HookDDPRecord.model_validate(rec))
    return out


def codec_gpu(spec: ClusterSpec, profile: Profile | None) -> GPUSpec:
    """The GPU entry that prices the codec: the cluster's, its matmul rate the measured
    compute rate when the profile has one (encode_decode_seconds takes half the peak)."""
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    if profile is not None and profile.compute is not None:
        gpu = gpu.model_copy(update={"peak_flops": 2.0 * profile.compute.flops_per_s})
    return gpu


def predict_hook_ddp(
    group: GroupModel, model: ModelRecord, ddp: HookDDPRecord, algorithm: str, gpu: GPUSpec
) -> StepReport:
    """The predicted step of the harness model with the record's comm hook: predict_ddp's
    timeline, each bucket's collectives those of the compressor, plus its codec."""
    if ddp.compression == "none" and ddp.overlap:
        return predict_ddp(group, model, ddp, algorithm)
    compressor = parse_compressor(ddp.compression)
    n = len(group.gpus)
    workload = harness_workload(model)
    fwd = np.array([x.forward_s for x in model.layers])
    bwd = np.array([x.backward_s for x in model.layers])
    scale = max(ddp.compute_s - ddp.optimizer_s, 0.0) / float(fwd.sum() + bwd.sum())
    elt = float(DTYPE_BYTES.get(model.dtype, 4))
    tensor_bytes = workload.tensor_params * elt
    buckets = assign_buckets(tensor_bytes, ddp.bucket_mb * MIB, ddp.first_bucket_mb * MIB)

    def sync(sizes: np.ndarray) -> np.ndarray:
        return np.array(
            [
                sum(
                    group.time(op, algorithm, b)
                    for op, b in compressor.collectives(int(s / elt), n)
                )
                for s in sizes
            ]
        )

    def codec(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pairs = [
            encode_decode_seconds(compressor, int(s / elt), gpu, n, ddp.error_feedback)
            for s in sizes
        ]
        enc, dec = np.array(pairs, dtype=float).reshape(-1, 2).T
        return enc, dec

    return schedule_streams(
        fwd * scale,
        bwd * scale,
        tensor_bytes,
        buckets,
        sync,
        tensor_layer=workload.tensor_layer,
        overlap=ddp.overlap,
        optimizer_s=ddp.optimizer_s,
        names=[layer.name for layer in workload.layers],
        codec_time=codec if n > 1 and ddp.compression != "none" else None,
    )


def hook_speedups(
    results: Results, spec: ClusterSpec, profile: Profile | None = None
) -> list[HookRow]:
    """Per run, bucket cap and hook: measured and predicted speedup over the uncompressed
    step of the same cap (caps measured without a `none` record are skipped)."""
    if profile is not None:
        spec = apply_profile(spec, profile)
    gpu = codec_gpu(spec, profile)
    records = hook_records(results)
    rows = []
    for rid, ddps in records.items():
        run = results.runs[rid]
        if run.model is None:
            raise SpecError(", ".join(results.files), "", f"run {rid} recorded no model")
        gpus = placement(run.meta, spec, f"run {rid}")
        group = GroupModel(build_cluster(spec, int(max(gpus)) + 1), gpus)
        algorithms = profile.algorithms if profile is not None else ALGORITHMS[run.meta.backend]
        algorithm = algorithms["all-reduce"]
        for cap in dict.fromkeys(d.bucket_mb for d in ddps):
            mine = [d for d in ddps if d.bucket_mb == cap]
            base = next((d for d in mine if d.compression == "none"), None)
            if base is None:
                continue
            base_pred = predict_hook_ddp(group, run.model, base, algorithm, gpu).step_time_s
            for d in mine:
                rep = predict_hook_ddp(group, run.model, d, algorithm, gpu)
                measured = base.step_s / d.step_s
                predicted = base_pred / rep.step_time_s
                rows.append(
                    HookRow(
                        rid,
                        cap,
                        d.compression,
                        d.error_feedback,
                        d.overlap,
                        d.step_s,
                        measured,
                        rep.step_time_s,
                        predicted,
                        rep.codec_s,
                        predicted / measured - 1.0,
                    )
                )
    return rows
