"""Compute calibrated per kernel class from profiler traces: the traced seconds of GEMMs,
attention and element-wise work per micro-batch, beside what commsim's roofline
(step.compute) gives the same model and layout, and the GPU efficiencies that make the two
agree.

The roofline's time is a sum of parts, each inversely proportional to one of its rates
(step.gemm.Rates): the GEMMs' math (peak x gemm_efficiency, or the FP8 rate), their output
writes (the HBM streaming bandwidth, step.gemm.gemm_seconds), FlashAttention (peak x
attention_efficiency) and the element-wise work (the streaming bandwidth):
T = G / r_gemm + G8 / r_fp8 + W / r_write + A / r_att + M / r_mem. So each part is exact
from two evaluations: doubling one rate halves its part, G / r = 2 (T - T(2 r)). A traced
GEMM kernel includes its output's write, so the GEMM class is the math and the writes; under
FP8 it also holds the GEMMs the recipes keep in BF16 (the LM head, an MoE router), so the
FP8 efficiency is fitted to the FP8 GEMMs' math alone, the BF16 math held at the catalog's
gemm_efficiency as the writes are held at its bandwidth. The element-wise class has no
efficiency (the roofline takes the datasheet HBM bandwidth): its achieved share of that
bandwidth is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from commsim.scenario import Setup
from commsim.specs import GPUSpec, SpecError, Strategy
from commsim.step.gemm import Rates
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.traces.intervals import clip, measure
from commsim.traces.kineto import RankTrace
from commsim.traces.summary import step_figures
from commsim.units import fmt_time

CLASSES = ("gemm", "attention", "other")
# the roofline's parts (see the module docstring) and the Rates fields each is inversely
# proportional to; the GEMM class is "math" (BF16), "fp8" (FP8 math) and "write"
PARTS = {
    "math": ("gemm",),
    "fp8": ("fp8",),
    "write": ("write",),
    "attention": ("attention",),
    "other": ("memory",),
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
    """Seconds per micro-batch of each part of the roofline (PARTS) on the slowest stage, at
    the setup's GPU (see the module docstring)."""
    L = Layouts.of([strategy], micro_batch, setup.dp, setup.micro_batches)
    s = setup.scenario
    model = StepModel(setup.workload, setup.cluster, setup.gpu, setup.n_gpus, s.global_batch, None)

    def total(rates: Rates) -> float:
        c = model.compute(L, rates)
        return float(c.forward[0] + c.backward[0])

    try:
        rates = Rates.of(setup.gpu)
        base = total(rates)
    except ValueError as e:
        raise SpecError(setup.source, "node.gpu", str(e)) from None
    out = {}
    for part, fields in PARTS.items():
        faster = replace(rates, **{f: 2 * getattr(rates, f) for f in fields})
        out[part] = 2 * (base - total(faster))
    return out


@dataclass(frozen=True)
class KernelFit:
    """Each class: traced seconds per micro-batch (traces `source`), the roofline's parts
    (roofline), and the efficiency fitted; a SpecError where the traced GEMMs take no
    longer than the roofline's writes of their outputs alone."""

    gpu: GPUSpec
    traced: dict[str, float]
    parts: dict[str, float]
    fp8: bool
    steps: int
    source: str

    def __post_init__(self):
        t, w = self.traced["gemm"], self.parts["write"]
        if 0 < t <= w:
            raise SpecError(
                self.source,
                self.field("gemm"),
                f"the traced GEMMs take {fmt_time(t)} a micro-batch, no longer than the "
                f"roofline's writes of their outputs alone ({fmt_time(w)} at the "
                f"{self.gpu.name}'s HBM bandwidth): not the model or layout traced",
            )

    def field(self, cls: str) -> str | None:
        """The GPUSpec field the class's time fits (None: element-wise)."""
        if cls == "other":
            return None
        if cls == "gemm":
            return "fp8_gemm_efficiency" if self.fp8 else "gemm_efficiency"
        return "attention_efficiency"

    def roofline(self, cls: str) -> float:
        """The roofline's seconds of a class: the GEMMs' are their math (BF16 and FP8) and
        their writes."""
        if cls == "gemm":
            return self.parts["math"] + self.parts["fp8"] + self.parts["write"]
        return self.parts[cls]

    def bf16_held(self, cls: str) -> float:
        """Under FP8, the GEMM class's BF16 math (LM head, router) that the FP8 fit holds
        at the catalog's gemm_efficiency; 0 otherwise."""
        return self.parts["math"] if cls == "gemm" and self.fp8 else 0.0

    def fixed(self, cls: str) -> float:
        """The seconds of a class's roofline that no fitted figure scales: the GEMMs' output
        writes (at the catalog's HBM bandwidth, as the fitted GPU prices them) and, under
        FP8, their BF16 math (bf16_held)."""
        return self.parts["write"] + self.bf16_held(cls) if cls == "gemm" else 0.0

    def fitted(self, cls: str) -> float | None:
        """The figure that makes the class's roofline the traced time (other: the share of
        the datasheet HBM bandwidth the traced element-wise work reached, the roofline
        running it at hbm_efficiency of it); None where the trace or the roofline has none.
        The roofline's scaled seconds r (all but `fixed`, f) run at the catalog's figure c,
        so at a figure e they take r c / e: r c / e + f = traced gives e = c r / (traced - f)."""
        f = self.fixed(cls)
        t, r = self.traced[cls], self.roofline(cls) - f
        if t <= 0 or r <= 0:
            return None
        return self.catalog(cls) * r / (t - f)

    def catalog(self, cls: str) -> float:
        """The catalog's figure the roofline runs the class at (other: its HBM share)."""
        field = self.field(cls)
        return getattr(self.gpu, field) if field else self.gpu.hbm_efficiency or 1.0

    def fitted_gpu(self) -> GPUSpec:
        """The GPU with the fitted efficiencies; a SpecError where one exceeds 1 (faster than
        the GPU's peak: not the model or layout traced) or none can be fitted."""
        update = {}
        for cls in ("gemm", "attention"):
            value = self.fitted(cls)
            if value is None:
                continue
            if value > 1:
                raise SpecError(
                    self.source,
                    cls,
                    f"traced {value:.0%} of the {self.gpu.name}'s peak: not the "
                    "model or layout traced",
                )
            update[self.field(cls)] = value
        if not update:
            raise SpecError(self.source, "", "no GEMM or attention time to fit in the traces")
        note = f"gemm/attention efficiencies fitted from profiler traces ({self.source})"
        name = f"{self.gpu.name}-traced"
        return self.gpu.model_copy(update=update | {"kernel_source": note, "name": name})

    def rows(self) -> list[dict]:
        return [
            {
                "class": cls,
                "traced_s": self.traced[cls],
                "roofline_s": self.roofline(cls),
                "write_s": self.parts["write"] if cls == "gemm" else 0.0,
                "bf16_held_s": self.bf16_held(cls),
                "field": self.field(cls) or "hbm_share",
                "catalog": self.catalog(cls),
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
    parts = roofline(setup, strategy, micro_batch)
    source = ", ".join(t.source for t in traces)
    return KernelFit(setup.gpu, traced, parts, fp8, steps, source)
