"""One hybrid layout's step as Gantt events: its pipeline schedule simulated op by op.

Each stage runs 1F1B (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", Sec. 2.2.1): p - 1 - k warm-up forwards on
stage k, then one forward one backward, then the cool-down backwards. With v > 1 model chunks
per device it runs the interleaved 1F1B of Sec. 2.2.2 in Megatron-core's order (schedules.py:
get_schedule_table, get_pp_rank_microbatches): micro-batches in groups of p, depth-first over
the chunks, 2 (p - 1 - k) + (v - 1) p warm-up forwards. DualPipe (pipeline_schedule) runs
step.dualpipe's order instead (simulate_dualpipe).

Every op waits for its input (the previous stage's forward, the next stage's backward) and
runs one at a time on its stage, so the bubble comes out of the schedule. A forward or
backward is its compute, then its tensor-parallel all-reduces (on the critical path), then
its send to the neighbouring stage; sends are synchronous, as Megatron's default p2p: the
sender waits for the transfer and the receiver starts when it lands. Durations come from the
step model's StepBreakdown (commsim.step.model). With free sends the makespan is its
(m + (p - 1) / v) ticks exactly (for m >= p when v > 1); the model charges every stage two
sends a micro-batch and the end stages send one way, so paid sends make the simulation 3 sends
shorter at v = 1 (p >= 3, m >= 2) and at most m + 1 sends shorter when interleaved.

Given the step model's ZeRO 0-2 sync plan, every stage reduces its buckets as Megatron-core
launches them on the simulated schedule (lay_out_sync): with free sends the step is the
closed form's (step.dpsync) exactly, which the tests check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from commsim.step import dualpipe
from commsim.step.timeline import Event, serial_ends

if TYPE_CHECKING:
    from commsim.step.dpsync import SyncPlan

PIPELINE_KINDS = ("forward", "backward", "tp", "send")  # what the pipeline's makespan spans
CRITICAL_KINDS = (*PIPELINE_KINDS, "dp", "optimizer")  # what keeps a stage busy


@dataclass(frozen=True)
class ChunkTimes:
    """Seconds of one model chunk's work for one micro-batch, and the step's tail."""

    forward: float
    backward: float  # recomputation included
    tp_forward: float
    tp_backward: float
    send: float  # one activation (or gradient) hand-off between neighbouring stages
    gather: float  # one ZeRO-3 parameter all-gather, prefetched (0 without ZeRO-3 overlap)
    dp_hidden: float  # data-parallel sync under the last backward (ZeRO 0-2 with overlap)
    dp_exposed: float
    optimizer: float
    wgrad: float = 0.0  # of backward, the weight-gradient part (DualPipe's W)


def chunk_times(layout: dict, parts: dict) -> ChunkTimes:
    """Per-chunk, per-micro-batch durations from one StepBreakdown row: its forwards and
    backwards (recomputation included), and its collectives on the critical path (tensor-
    and context-parallel, expert all-to-alls), the forwards' share as it gives it."""
    m, v, zero = layout["micro_batches"], layout["interleave"], layout["zero"]
    ops = m * v
    critical = parts["tp_comm"] + parts["cp_comm"] + parts["ep_comm"]
    prefetched = zero == 3 and layout["overlap"]
    # ZeRO-3 moves, per micro-batch, a forward gather, a backward gather and a gradient
    # reduce-scatter of about equal volume (2-byte parameters and gradients)
    return ChunkTimes(
        forward=parts["forward"] / ops,
        backward=parts["backward"] / ops,
        tp_forward=parts["comm_forward"] / ops,
        tp_backward=(critical - parts["comm_forward"]) / ops,
        send=parts["pp_comm"] / (2.0 * ops),
        gather=parts["dp_comm"] / (3.0 * ops) if prefetched else 0.0,
        dp_hidden=0.0 if zero == 3 else parts["dp_comm"] - parts["dp_exposed"],
        dp_exposed=parts["dp_exposed"],
        optimizer=parts["optimizer"],
        wgrad=parts["wgrad"] / ops,
    )


def schedule_group(p: int, m: int) -> int:
    """Micro-batches per group of the interleaved schedule: p, or the fewest that leave no
    group under p (Megatron-core rejects the others); m < p, which it rejects, runs as one
    group."""
    return next((n for n in range(p, m + 1) if m % n == 0 or m % n >= p), m)


def stage_order(p: int, m: int, v: int, k: int) -> list[tuple[str, int, int]]:
    """The ops of stage k in run order: ("F" or "B", model chunk, micro-batch)."""
    size = schedule_group(p, m)
    table = [
        (c, i) for g in range(0, m, size) for c in range(v) for i in range(g, min(g + size, m))
    ]
    n = len(table)
    warm = min(p - 1 - k, m) if v == 1 else min(2 * (p - 1 - k) + (v - 1) * size, n)
    fwd = [("F", c, i) for c, i in table]
    bwd = [("B", v - 1 - c, i) for c, i in table]
    steady = [op for j in range(n - warm) for op in (fwd[warm + j], bwd[j])]
    return fwd[:warm] + steady + bwd[n - warm :]


@dataclass(frozen=True)
class Op:
    """One forward or backward of a chunk on a stage, as simulated."""

    stage: int
    kind: str  # "F" or "B"
    chunk: int
    mb: int
    start: float
    compute_end: float
    tp_end: float
    end: float  # its send done (= tp_end when it sends nothing)
    to: int | None  # the stage it sends to, if any


def simulate(p: int, m: int, v: int, t: ChunkTimes) -> list[Op]:
    """Run every stage's order against the dependencies; each op starts when its stage is
    free and its input has arrived."""
    orders = [stage_order(p, m, v, k) for k in range(p)]
    done: dict[tuple[str, int, int, int], Op] = {}
    at, free = [0] * p, [0.0] * p
    while any(at[k] < len(orders[k]) for k in range(p)):
        moved = False
        for k in range(p):
            while at[k] < len(orders[k]):
                kind, c, i = orders[k][at[k]]
                if kind == "F":
                    src = (k - 1, c) if k > 0 else (p - 1, c - 1) if c > 0 else None
                    dst = (k + 1, c) if k < p - 1 else (0, c + 1) if c < v - 1 else None
                else:
                    src = (k + 1, c) if k < p - 1 else (0, c + 1) if c < v - 1 else None
                    dst = (k - 1, c) if k > 0 else (p - 1, c - 1) if c > 0 else None
                if src is not None:
                    dep = (kind, *src, i)
                else:  # the first stage's first chunk reads data; the loss turns forward around
                    dep = ("F", k, c, i) if kind == "B" else None
                if dep is not None and dep not in done:
                    break
                start = max(free[k], 0.0 if dep is None else done[dep].end)
                compute_end = start + (t.forward if kind == "F" else t.backward)
                tp_end = compute_end + (t.tp_forward if kind == "F" else t.tp_backward)
                to = None if dst is None else dst[0]
                end = tp_end + (0.0 if to is None else t.send)
                done[(kind, k, c, i)] = Op(k, kind, c, i, start, compute_end, tp_end, end, to)
                free[k], at[k], moved = end, at[k] + 1, True
        if not moved:
            raise RuntimeError(f"pipeline schedule deadlocks (p={p}, m={m}, v={v})")
    return sorted(done.values(), key=lambda op: (op.stage, op.start))


def simulate_dualpipe(p: int, m: int, t: ChunkTimes) -> list[Op]:
    """DualPipe's schedule (step.dualpipe.simulate) as ops on their ranks: a forward, its
    collectives and its send; a backward (D: its weight gradient deferred) the same; a
    deferred weight gradient (W) compute alone. The chunk is the rank's stage (phase)."""
    d = dualpipe.Durations(t.forward + t.tp_forward, t.backward + t.tp_backward, t.wgrad, t.send)
    ops = []
    for rank, kind, phase, mb, start, end, to in dualpipe.simulate(p, m, d):
        compute = {"F": t.forward, "B": t.backward, "D": t.backward - t.wgrad, "W": t.wgrad}
        tp = {"F": t.tp_forward, "W": 0.0}.get(kind, t.tp_backward)
        c_end = start + compute[kind]
        ops.append(Op(rank, kind, phase, mb, start, c_end, c_end + tp, end, to))
    return ops


def pipeline_events(layout: dict, parts: dict, sync: SyncPlan | None = None) -> list[Event]:
    """The step of one layout (a Layouts.row) priced by one StepBreakdown.row, as events on
    streams "stage k" (compute, dp sync, optimizer), "stage k tp", "stage k send",
    "stage k zero3" (prefetched gathers) and "stage k dp" (sync hidden under the pipeline).
    With the step model's ZeRO 0-2 sync plan (dpsync.SyncPlan) its buckets are laid out on
    the simulated schedule (lay_out_sync); without, the breakdown's sync is drawn whole."""
    p, m, v = layout["pp"], layout["micro_batches"], layout["interleave"]
    t = chunk_times(layout, parts)
    dual = layout.get("schedule") == "dualpipe"
    ops = simulate_dualpipe(p, m, t) if dual else simulate(p, m, v, t)  # by stage, then start
    v = 2 if dual else v  # DualPipe's two stages a rank named as chunks
    by_stage: list[list[Op]] = [[] for _ in range(p)]
    for op in ops:
        by_stage[op.stage].append(op)
    events: list[Event] = []
    # ZeRO-3 gathers: as late as possible ahead of their op, one at a time per stage; the
    # step starts with whatever cannot hide, which the model counts in dp_exposed
    gathers: list[tuple[Op, float]] = []
    if t.gather > 0:
        for k in range(p):
            ready = float("inf")
            for op in reversed(by_stage[k]):
                ready = min(op.start, ready) - t.gather
                gathers.append((op, ready))
    laid = lay_out_sync(layout, by_stage, sync) if sync and layout["zero"] != 3 else None
    shift = max([0.0, laid.wait if laid else 0.0] + [-s for _, s in gathers])
    for op, s in gathers:
        events.append(
            Event(
                f"stage {op.stage} zero3", f"gather {_name(op, v)}", s + shift, s + t.gather + shift
            )
        )
    for op in ops:
        events += _op_events(op, v, shift)
    if laid:
        events += [Event(e.stream, e.label, e.start_s + shift, e.end_s + shift) for e in laid.bars]
        done = [d + shift for d in laid.done]
    else:
        exposed = max(t.dp_exposed - shift, 0.0)
        done = []
        for k in range(p):
            last = max(op.end for op in by_stage[k]) + shift
            if t.dp_hidden > 0:
                events.append(Event(f"stage {k} dp", "dp sync (hidden)", last - t.dp_hidden, last))
            if exposed > 0:
                events.append(Event(f"stage {k}", "dp sync", last, last + exposed))
            done.append(last + exposed)
    if t.optimizer > 0:
        events += [Event(f"stage {k}", "optimizer", d, d + t.optimizer) for k, d in enumerate(done)]
    return events


def _op_events(op: Op, v: int, shift: float) -> list[Event]:
    """An op's compute, its collectives on the critical path and its send, as events."""
    what, k = _name(op, v), op.stage
    out = [Event(f"stage {k}", what, op.start + shift, op.compute_end + shift)]
    if op.tp_end > op.compute_end:
        out.append(
            Event(
                f"stage {k} tp", f"tp all-reduce {what}", op.compute_end + shift, op.tp_end + shift
            )
        )
    if op.end > op.tp_end:
        out.append(
            Event(
                f"stage {k} send",
                f"send {what} to stage {op.to}",
                op.tp_end + shift,
                op.end + shift,
            )
        )
    return out


@dataclass(frozen=True)
class SyncLayout:
    """A ZeRO 0-2 sync laid out on a simulated schedule (unshifted times): how long the
    first forwards wait for parameter gathers, when each stage's sync is done, its bars."""

    wait: float
    done: list[float]
    bars: list[Event]


def lay_out_sync(layout: dict, by_stage: list[list[Op]], sync: SyncPlan) -> SyncLayout:
    """Every stage reduces the priced stage's buckets as Megatron-core launches them
    (dpsync's docstring), one at a time in launch order: with overlap, under its last
    backward (v = 1, the first stage or a stage alone; the others at their end), or each
    model chunk's after the backward that Megatron aligns to the first stage's last of that
    chunk (v > 1); the parameter gathers from the step's start, in forward order, each
    waited for by the first forward that needs it. Without overlap all of it after the
    stage's last op."""
    p, m, v = layout["pp"], layout["micro_batches"], layout["interleave"]
    n = len(sync.chunk)
    overlap = bool(layout["overlap"])
    backs = [c for kind, c, _ in stage_order(p, m, v, 0) if kind == "B"]
    last_of = {c: max(j for j, cc in enumerate(backs) if cc == c) for c in range(v)}
    ready = 1.0 - sync.leads if v == 1 else np.zeros(n)
    reduce = sync.costs.network - sync.params if overlap else sync.costs.network
    wait, done, bars = 0.0, [], []
    for k, ops in enumerate(by_stage):
        bops = [op for op in ops if op.kind == "B"]
        end = max(op.end for op in ops)
        if not overlap or (v == 1 and k > 0):
            launch = np.full(n, end)
        elif v == 1:
            last = bops[-1]
            launch = last.tp_end - (1.0 - ready) * (last.tp_end - last.start)
        else:
            ids = [last_of[int(c)] + k for c in sync.chunk]
            launch = np.array([bops[j].tp_end if j < len(bops) else end for j in ids])
        ends = serial_ends(launch, reduce)
        done.append(max(end, float(ends.max(initial=end))))
        bars += _chunk_bars(k, "reduce", sync.chunk, ends - reduce, ends)
        if done[-1] > end:
            bars.append(Event(f"stage {k}", "dp sync", end, done[-1]))
        if overlap and sync.params.any():
            fops = [op for op in ops if op.kind == "F"]
            if v == 1:
                f0 = fops[0]
                need = f0.start + (1.0 - ready) * (f0.tp_end - f0.start)
            else:
                first = {c: min(op.start for op in fops if op.chunk == c) for c in range(v)}
                need = np.array([first[int(c)] for c in sync.chunk])
            g_ends = serial_ends(np.zeros(n), sync.params[::-1])[::-1]  # forward order
            wait = max(wait, float(np.max(g_ends - need)))
            bars += _chunk_bars(k, "gather", sync.chunk, g_ends - sync.params, g_ends)
    return SyncLayout(wait, done, bars)


def _chunk_bars(k: int, what: str, chunk, starts, ends) -> list[Event]:
    """One hidden-stream bar per model chunk: its buckets' collectives, first to last."""
    bars = []
    for c in sorted(set(chunk.tolist())):
        mine = chunk == c
        if np.any(ends[mine] > starts[mine]):
            lo, hi = float(starts[mine].min()), float(ends[mine].max())
            bars.append(Event(f"stage {k} dp", f"dp {what} chunk {c}", lo, hi))
    return bars


def _name(op: Op, v: int) -> str:
    what = f"{'forward' if op.kind == 'F' else 'backward'} {op.mb}"
    what += {"D": " inputs", "W": " weights"}.get(op.kind, "")
    return what + (f" chunk {op.chunk}" if v > 1 else "")


def event_kind(ev: Event) -> str:
    """forward, backward, tp, send, zero3, dp (exposed sync), dp hidden or optimizer."""
    sub = ev.stream.split()[2:]
    if sub:
        return "dp hidden" if sub[0] == "dp" else sub[0]
    return ev.label.split()[0]


def event_stage(ev: Event) -> int:
    """The pipeline stage an event runs on."""
    return int(ev.stream.split()[1])


def pipeline_span(events: Sequence[Event]) -> tuple[float, float]:
    """First forward start to last backward (its all-reduce and send) end, all stages."""
    busy = [ev for ev in events if event_kind(ev) in PIPELINE_KINDS]
    return min(ev.start_s for ev in busy), max(ev.end_s for ev in busy)


def idle_gaps(
    events: Sequence[Event], stage: int, start: float, end: float
) -> list[tuple[float, float]]:
    """Intervals of [start, end] in which the stage runs nothing on its critical path
    (compute, tp all-reduce, send, dp sync, optimizer): its bubble within the window."""
    busy = sorted(
        (ev.start_s, ev.end_s)
        for ev in events
        if event_stage(ev) == stage and event_kind(ev) in CRITICAL_KINDS
    )
    gaps, t = [], start
    for s, e in busy:
        if s > t and t < end:
            gaps.append((t, min(s, end)))
        t = max(t, e)
    if t < end:
        gaps.append((t, end))
    return gaps
