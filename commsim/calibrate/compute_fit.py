"""The compute rate the data-parallel runs measured: model FLOP/s per rank and its share of
the GPU's catalog peak (a profile's `compute`)."""

from __future__ import annotations

import numpy as np

from commsim import catalog
from commsim.calibrate.records import Results
from commsim.profile import ComputeFit
from commsim.specs import ClusterSpec


def fit_compute(results: Results, spec: ClusterSpec) -> ComputeFit | None:
    """Model FLOP/s per rank from the data-parallel runs: 3 x forward FLOPs per sample
    (backward is twice forward: commsim.workload) x batch over forward + backward time
    (compute alone minus the optimizer); None without such runs."""
    flops, times, lows, highs, model = [], [], [], [], ""
    for run in results.runs.values():
        if run.model is None or not run.ddp:
            continue
        model = run.model.name
        step_flops = 3.0 * sum(layer.forward_flops for layer in run.model.layers)
        step_flops *= run.model.batch
        for d in run.ddp:
            flops.append(step_flops)
            times.append(d.compute_s - d.optimizer_s)
            lows.append((d.compute_p10_s or d.compute_s) - d.optimizer_s)
            highs.append((d.compute_p90_s or d.compute_s) - d.optimizer_s)
    if not flops:
        return None
    rate = np.array(flops) / np.array(times)
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    mid = float(np.median(rate))
    return ComputeFit(
        flops_per_s=mid,
        flops_per_s_range=(
            float(np.min(np.array(flops) / np.array(highs))),
            float(np.max(np.array(flops) / np.array(lows))),
        ),
        efficiency=mid / gpu.peak_flops,
        gpu=gpu.name,
        model=model,
        points=len(flops),
    )
