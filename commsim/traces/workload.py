"""A traced workload: what profiler traces say about the model they ran, so that `predict`,
`plan` and the what-if API run it on another cluster, GPU count or layout.

From the traces (per step, on its slowest rank, the median over steps):
- compute per micro-batch: the step's compute (summary: step less exposed communication)
  less the optimizer (torch.optim's annotation), over DDP's forward passes in the step
  (one when the trace has no DDP annotation);
- the data-parallel sync: the bytes and elements of the all-reduces and reduce-scatters on
  the data-parallel group (dp = traced ranks / (tp x pp); gloo's run on the default group),
  the median over the steps that synced (DDP's no_sync steps move no gradients);
- the traced layout: ranks, and tp, pp and the micro-batch as the caller says (a trace does
  not name them; the micro-batch defaults to the scenario's).

Applied to a setup (`apply`), the step model's one compute efficiency is set so that the
scenario's model, laid out as traced (the scenario's strategy with the traced tp, pp and
micro-batch), takes exactly the traced compute per micro-batch; every other layout, GPU
count or cluster scales from there by the model's FLOPs (step.model, FLOPs at one
efficiency). The optimizer and the communication stay commsim's models.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from commsim.scenario import Setup
from commsim.specs import SpecError
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.traces.intervals import clip, measure
from commsim.traces.kineto import RankTrace, dtype_bytes
from commsim.traces.summary import step_collectives, step_figures

SYNC_OPS = ("all-reduce", "reduce-scatter")  # what carries the gradients (DDP, ZeRO)
MISMATCH = 0.01  # traced synced elements / model parameters off by more: said


@dataclass(frozen=True)
class TracedWorkload:
    """What the traces measured (seconds and bytes per step of one rank)."""

    sources: tuple[str, ...]
    ranks: int  # traced world size
    tp: int
    pp: int
    micro_batch: int | None  # samples per micro-batch traced; None: the scenario's
    steps: int  # steps the medians are over
    micro_batches: int
    compute_s: float  # per micro-batch, forward + backward (+ recomputation), slowest rank
    optimizer_s: float
    sync_bytes: float  # data-parallel all-reduce / reduce-scatter bytes per step
    sync_elements: float

    @property
    def dp(self) -> int:
        return self.ranks // (self.tp * self.pp)

    def to_dict(self) -> dict:
        return {
            "files": len(self.sources),
            "traced_gpus": self.ranks,
            "layout": {"tp": self.tp, "pp": self.pp, "dp": self.dp},
            "micro_batch": self.micro_batch,
            "steps": self.steps,
            "micro_batches": self.micro_batches,
            "compute_per_micro_batch_s": self.compute_s,
            "optimizer_s": self.optimizer_s,
            "sync_bytes": self.sync_bytes,
        }


def _step(trace: RankTrace, k: int, dp: int) -> tuple[float, float, int, float, float]:
    """(compute, optimizer seconds, micro-batches, sync bytes, sync elements) of step k."""
    lo, hi = trace.window(k)
    optimizer = measure(clip(trace.optimizer, lo, hi))
    m = max(trace.steps[k].forwards, 1)
    synced = [
        c
        for c in step_collectives(trace, k)
        if c.op in SYNC_OPS and c.bytes and c.group and len(c.group) == dp
    ]
    nbytes = sum(c.bytes for c in synced)
    # a sized collective has its dtype (kineto reads both or neither)
    elements = sum(c.bytes / dtype_bytes(c.dtype, trace.source, "dtype") for c in synced)
    return step_figures(trace, k).compute_s - optimizer, optimizer, m, nbytes, elements


def read_workload(
    traces: list[RankTrace], tp: int = 1, pp: int = 1, micro_batch: int | None = None
) -> TracedWorkload:
    """The traced workload of every rank's trace (see the module docstring)."""
    world = max(t.world for t in traces)
    if world % (tp * pp):
        raise SpecError("--trace-tp", "", f"tp x pp = {tp * pp} does not divide {world} ranks")
    dp = world // (tp * pp)
    numbers = sorted(set.intersection(*({s.number for s in t.steps} for t in traces)))
    if not numbers:
        raise SpecError(traces[0].source, "ProfilerStep", "no step every rank traced")
    rows = []
    for number in numbers:
        per_rank = [
            _step(t, next(k for k, s in enumerate(t.steps) if s.number == number), dp)
            for t in traces
        ]
        ms = {r[2] for r in per_rank}
        if len(ms) > 1:
            raise SpecError(traces[0].source, f"ProfilerStep#{number}", f"ranks ran {ms} passes")
        slowest = max(per_rank, key=lambda r: r[0])
        rows.append(slowest)
    compute, optimizer, m = (np.median([r[i] for r in rows]) for i in range(3))
    synced = [r for r in rows if r[3] > 0] or rows  # steps under no_sync move no gradients
    nbytes, elements = (np.median([r[i] for r in synced]) for i in (3, 4))
    m = int(round(m))
    if compute <= 0:
        raise SpecError(traces[0].source, "traceEvents", "no compute in the traced steps")
    return TracedWorkload(
        tuple(t.source for t in traces),
        world,
        tp,
        pp,
        micro_batch,
        len(rows),
        m,
        float(compute) / m,
        float(optimizer),
        float(nbytes),
        float(elements),
    )


def apply(setup: Setup, traced: TracedWorkload) -> tuple[Setup, dict]:
    """The setup computing at the traced rate, and what was taken and assumed (see the
    module docstring); a traced rate above the GPU's peak is a SpecError."""
    s = setup.scenario
    strategy = s.strategy.model_copy(update={"tp": traced.tp, "pp": traced.pp})
    peak = StepModel(setup.workload, setup.cluster, setup.gpu, setup.n_gpus, s.global_batch, 1.0)
    mb = traced.micro_batch or s.micro_batch
    L = Layouts.of([strategy], mb, lambda _: traced.dp, lambda _: traced.micro_batches)
    c = peak.compute(L)
    at_peak = float(c.forward[0] + c.backward[0])  # seconds per micro-batch at 100% of peak
    efficiency = at_peak / traced.compute_s
    if not 0 < efficiency <= 1:
        raise SpecError(
            "--trace",
            "",
            f"the traced compute runs the model at {efficiency:.0%} of the {setup.gpu.name}'s "
            "peak: not the model traced, or traced on a faster GPU",
        )
    doc = traced.to_dict() | {
        "compute_efficiency": efficiency,
        "taken": [
            f"compute per micro-batch of {mb} {traced.compute_s:.6g} s at tp {traced.tp}, pp "
            f"{traced.pp}: {100 * efficiency:.3g}% of the {setup.gpu.name}'s peak for every FLOP",
        ],
        "assumed": _assumed(setup, traced),
    }
    new = replace(setup, scenario=s.model_copy(update={"compute_efficiency": efficiency}))
    return new, doc


def _assumed(setup: Setup, traced: TracedWorkload) -> list[str]:
    s = setup.scenario
    out = (
        []
        if traced.micro_batch
        else [f"the traced micro-batch is the scenario's ({s.micro_batch})"]
    )
    out += [
        f"the traced model is the scenario's ({setup.workload.name}), run with the "
        "scenario's other strategy fields (recomputation, precision, ...)",
        "other layouts, GPU counts and clusters compute at the same share of the GPU's peak",
        "the optimizer and all communication are commsim's models, not the trace's",
    ]
    if s.compute_efficiency is not None:
        out.append(f"the scenario's compute_efficiency {s.compute_efficiency:g} replaced")
    params = float(setup.workload.params)
    if traced.tp == traced.pp == 1 and traced.dp > 1 and params > 0:
        ratio = traced.sync_elements / params
        if abs(ratio - 1) > MISMATCH:
            out.append(
                f"the trace syncs {traced.sync_elements:.4g} gradient elements a step, the "
                f"model has {params:.4g} parameters: is it the model traced?"
            )
    return out
