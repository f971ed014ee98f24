"""Compute calibrated per kernel class from profiler traces: the traced seconds of GEMMs,
attention and element-wise work per micro-batch, beside what commsim's roofline
(step.compute) gives the same model and layout, and the GPU efficiencies that make the two
agree.

The roofline's time is a sum over classes, each inversely proportional to its rate (GEMM:
peak x gemm_efficiency, or the FP8 rate; attention: peak x attention_efficiency;
element-wise: HBM bandwidth): T = G / r_gemm + A / r_att + M / r_mem. So each class's part
is exact from two evaluations: doubling one rate halves its part, G / r = 2 (T - T(2 r)).
The fitted efficiency is the catalog's times roofline / traced for that class; the
element-wise class has no efficiency (the roofline takes the datasheet HBM bandwidth): its
achieved share of that bandwidth is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.scenario import Setup
from commsim.specs import GPUSpec, SpecError, Strategy
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.traces.intervals import clip, measure
from commsim.traces.kineto import RankTrace
from commsim.traces.summary import step_figures

CLASSES = ("gemm", "attention", "other")
# the GPU figure each class's rate scales with (other: HBM bandwidth, not an efficiency)
RATE_FIELDS = {
    "gemm": ("gemm_efficiency", "fp8_gemm_efficiency"),
    "attention": ("attention_efficiency",),
    "other": ("hbm_bandwidth",),
}


def measured(traces: list[RankTrace]) -> tuple[dict[str, float], int]:
    """(seconds per micro-batch of each class, steps): per step the rank that computed
    longest, the median over the steps every rank traced."""
    numbers = sorted(set.intersection(*({s.number for s in t.steps} for t in traces)))
    if not numbers:
        raise SpecError(traces[0].source, "ProfilerStep", "no step every rank traced")
    rows = []
    for number in numbers:
        best = None
        for t in traces:
            k = next(j for j, s in enumerate(t.steps) if s.number == number)
            lo, hi = t.window(k)
            m = max(t.steps[k].forwards, 1)
            row = {c: measure(clip(t.classes[c], lo, hi)) / m for c in CLASSES}
            busy = step_figures(t, k).busy_s
            if best is None or busy > best[0]:
                best = (busy, row)
        rows.append(best[1])
    return {c: float(np.median([r[c] for r in rows])) for c in CLASSES}, len(rows)


def roofline(setup: Setup, strategy: Strategy, micro_batch: int) -> dict[str, float]:
    """Seconds per micro-batch of each class on the slowest stage, by the roofline at the
    setup's GPU (see the module docstring)."""
    L = Layouts.of([strategy], micro_batch, setup.dp, setup.micro_batches)

    def total(gpu: GPUSpec) -> float:
        s = setup.scenario
        model = StepModel(setup.workload, setup.cluster, gpu, setup.n_gpus, s.global_batch, None)
        c = model.compute(L)
        return float(c.forward[0] + c.backward[0])

    gpu = setup.gpu
    try:
        base = total(gpu)
    except ValueError as e:
        raise SpecError(setup.source, "node.gpu", str(e)) from None
    out = {}
    for cls, fields in RATE_FIELDS.items():
        faster = {f: 2 * getattr(gpu, f) for f in fields if getattr(gpu, f) is not None}
        out[cls] = 2 * (base - total(gpu.model_copy(update=faster)))
    return out


@dataclass(frozen=True)
class KernelFit:
    """Each class: traced and roofline seconds per micro-batch, and the efficiency fitted."""

    gpu: GPUSpec
    traced: dict[str, float]
    roofline: dict[str, float]
    fp8: bool
    steps: int

    def field(self, cls: str) -> str | None:
        """The GPUSpec field the class's time fits (None: element-wise)."""
        if cls == "other":
            return None
        return "fp8_gemm_efficiency" if cls == "gemm" and self.fp8 else RATE_FIELDS[cls][0]

    def fitted(self, cls: str) -> float | None:
        """The catalog's efficiency times roofline / traced (other: the share of the
        datasheet HBM bandwidth the traced element-wise work reached, the roofline running
        it at hbm_efficiency of it); None where the trace or the roofline has none."""
        t, r = self.traced[cls], self.roofline[cls]
        if t <= 0 or r <= 0:
            return None
        field = self.field(cls)
        return (getattr(self.gpu, field) if field else self.gpu.hbm_efficiency or 1.0) * r / t

    def fitted_gpu(self, source: str) -> GPUSpec:
        """The GPU with the fitted efficiencies; a SpecError where one exceeds 1 (faster than
        the GPU's peak: not the model or layout traced) or none can be fitted."""
        update = {}
        for cls in ("gemm", "attention"):
            value = self.fitted(cls)
            if value is None:
                continue
            if value > 1:
                raise SpecError(
                    source,
                    cls,
                    f"traced {value:.0%} of the {self.gpu.name}'s peak: not the "
                    "model or layout traced",
                )
            update[self.field(cls)] = value
        if not update:
            raise SpecError(source, "", "no GEMM or attention time to fit in the traces")
        note = f"gemm/attention efficiencies fitted from profiler traces ({source})"
        name = f"{self.gpu.name}-traced"
        return self.gpu.model_copy(update=update | {"kernel_source": note, "name": name})

    def rows(self) -> list[dict]:
        return [
            {
                "class": cls,
                "traced_s": self.traced[cls],
                "roofline_s": self.roofline[cls],
                "field": self.field(cls) or "hbm_share",
                "catalog": getattr(self.gpu, self.field(cls)) if self.field(cls) else None,
                "fitted": self.fitted(cls),
            }
            for cls in CLASSES
        ]


def gpu_yaml(gpu: GPUSpec) -> str:
    """A GPU as the YAML a cluster's node.gpu may name, sizes and rates with their units
    (catalog.gpu reads it back)."""
    import yaml

    data = gpu.model_dump(exclude_none=True)
    data["hbm_bytes"] = f"{gpu.hbm_bytes!r}B"
    for key in ("hbm_bandwidth", "nvlink_bandwidth"):
        data[key] = f"{getattr(gpu, key)!r}B/s"
    return yaml.safe_dump(data, sort_keys=False)


def fit_kernels(setup: Setup, traces: list[RankTrace], micro_batch: int) -> KernelFit:
    """The traced classes against the roofline of the setup's strategy."""
    traced, steps = measured(traces)
    strategy = setup.scenario.strategy
    fp8 = strategy.precision == "fp8"
    return KernelFit(setup.gpu, traced, roofline(setup, strategy, micro_batch), fp8, steps)
