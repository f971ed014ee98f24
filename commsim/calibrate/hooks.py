"""DDP comm hooks, predicted against measured: each hook's speedup over plain all-reduce.

The harness (`calibrate run --comm-hooks none,fp16,powersgd:1`) times the DDP step of its
model once per bucket cap and hook, each `ddp` record naming its hook as commsim spells it
(`compression`, `error_feedback`, `overlap`). Per bucket cap, the measured speedup of a hook
is the uncompressed step time over its own; commsim predicts both steps of the same model
(validate.predict_ddp's per-layer times, scaled to the measured compute alone) with the
hook's collectives and codec cost, and error = predicted speedup / measured speedup - 1.

Approximations, stated rather than hidden:
- codec cost: commsim's model is a GPU HBM pass (bytes at the memory bandwidth, matmul FLOPs
  at the fp32 peak). On CPU hosts it is priced with the cluster's GPU entry (cpu-host:
  20 GB/s, 100 GFLOP/s, order-of-magnitude figures); with a profile that fitted the compute
  rate, the matmul rate is the measured FLOP/s instead. The predicted codec seconds are
  reported separately (codec_s) so a reader can see how much of a prediction they carry;
  on a slow link they are a few per cent of the step.
- PowerSGD: priced as torch's powerSGD_hook sends each bucket (PowerSGD.tensor_collectives,
  from the tensor shapes the harness records): the tensors it does not compress in one
  all-reduce, then all Ps, then all Qs. At rank 1 the payloads are a small fraction of the
  bucket, so the step is latency- and CPU-bound.
- gloo: PowerSGD runs one bucket at a time there (record overlap false; see the harness),
  predicted with overlap off: the buckets' exchanges after the backward, one after another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commsim.calibrate.points import placement
from commsim.calibrate.records import Results
from commsim.calibrate.validate import codec_gpu, predict_ddp
from commsim.collectives.backends import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.profile import Profile, apply_profile
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import build_cluster


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


def hook_speedups(
    results: Results, spec: ClusterSpec, profile: Profile | None = None
) -> list[HookRow]:
    """Per run, bucket cap and hook: measured and predicted speedup over the uncompressed
    step of the same cap (caps measured without a `none` record are skipped)."""
    if profile is not None:
        spec = apply_profile(spec, profile)
    gpu = codec_gpu(spec, profile)
    rows = []
    for rid, run in results.runs.items():
        ddps = run.ddp
        if not ddps:
            continue
        if run.model is None:
            raise SpecError(", ".join(results.files), "", f"run {rid} recorded no model")
        gpus = placement(run.meta, spec, results.where(rid))
        group = GroupCost(build_cluster(spec, int(max(gpus)) + 1), gpus)
        algorithms = profile.algorithms if profile is not None else ALGORITHMS[run.meta.backend]
        algorithm = algorithms["all-reduce"]
        torch_version = run.meta.versions.get("torch", "")
        for cap in dict.fromkeys(d.bucket_mb for d in ddps):
            mine = _same_compute([d for d in ddps if d.bucket_mb == cap])
            base = next((d for d in mine if d.compression == "none"), None)
            if base is None:
                continue
            base_pred = predict_ddp(
                group, run.model, base, algorithm, gpu, torch_version
            ).step_time_s
            for d in mine:
                rep = predict_ddp(group, run.model, d, algorithm, gpu, torch_version)
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


def _same_compute(ddps: list) -> list:
    """The records of one cap with one compute and optimizer time: both are measured per hook
    under no_sync, where no hook runs, so they are one quantity measured several times; the
    least disturbed (smallest) stands for all (on a shared 2-core host one configuration's
    compute has been seen 16x the others')."""
    compute = min(d.compute_s for d in ddps)
    optimizer = min(d.optimizer_s for d in ddps)
    return [d.model_copy(update={"compute_s": compute, "optimizer_s": optimizer}) for d in ddps]
