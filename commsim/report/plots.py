"""Matplotlib figures: step timelines, pipelines, topologies, sweeps, sizing, validation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from commsim.files import save_figure, write_atomic
from commsim.report.labels import pct
from commsim.specs import SpecError
from commsim.units import fmt_time

if TYPE_CHECKING:
    from commsim.calibrate.validate import Validation


def plot_timeline(pred: dict[str, Any], events: Sequence[Any], path: str, title: str) -> None:
    """Gantt chart of the compute and communication streams of one step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "forward": "#4c72b0",
        "backward": "#55a868",
        "optimizer": "#8172b2",
        "comm": "#dd8452",
    }
    lanes = {"compute": 1, "comm": 0}
    fig, ax = plt.subplots(figsize=(11, 2.8))
    for ev in events:
        kind = "comm" if ev.stream == "comm" else ev.label.split()[0].split(":")[0]
        color = colors.get(kind, "#999999")
        ax.barh(
            lanes[ev.stream],
            ev.end_s - ev.start_s,
            left=ev.start_s,
            height=0.6,
            color=color,
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks([0, 1], ["communication", "compute"])
    ax.set_xlabel("time (s)")
    ax.set_title(
        f"{title}: step {fmt_time(pred['step_time_s'])}, exposed comm "
        f"{fmt_time(pred['exposed_comm_s'])}, overlap {pct(pred['overlap_ratio'])}"
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), loc="upper left", ncols=4, fontsize=8)
    ax.set_ylim(-0.5, 2.0)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_topology(graph: Any, path: str, title: str) -> None:
    """The cluster graph drawn in layers: GPUs, hubs, NICs, leaves, spines, cores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = ["gpu", "hub", "nic", "leaf", "spine", "core"]
    by_kind: dict[str, list[str]] = {k: [] for k in order}
    for name, data in graph.nodes(data=True):
        by_kind[data["kind"]].append(name)
    pos = {}
    for level, kind in enumerate(order):
        names = by_kind[kind]
        for i, name in enumerate(names):
            pos[name] = ((i + 0.5) / max(len(names), 1), level)
    from matplotlib.collections import LineCollection

    fig, ax = plt.subplots(figsize=(12, 6))
    segments = [(pos[u], pos[v]) for u, v in graph.edges() if u < v]  # one per duplex link
    ax.add_collection(LineCollection(segments, colors="#bbbbbb", linewidths=0.4, zorder=1))
    for level, kind in enumerate(order):
        names = by_kind[kind]
        if names:
            xs = [pos[n][0] for n in names]
            ax.scatter(xs, [level] * len(xs), s=12, zorder=2, label=f"{kind} ({len(names)})")
    ax.set_yticks(range(len(order)), order)
    ax.set_xticks([])
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


PIPELINE_COLORS = {
    "forward": "#4c72b0",
    "backward": "#55a868",
    "tp": "#c44e52",
    "send": "#dd8452",
    "zero3": "#937860",
    "dp": "#da8bc3",
    "optimizer": "#8172b2",
}
PIPELINE_NAMES = ("forward", "backward", "tp all-reduce", "send", "ZeRO-3 gather", "dp sync")
ZOOM_ABOVE = 32  # micro-batches per step past which a second panel zooms on the warm-up


def _draw_stages(ax, bars, shown: list[int], p: int, edge: float) -> None:
    """The stage rows of a pipeline chart on one axes."""
    for (y, h, kind), spans in bars.items():
        if kind == "idle":
            style = dict(facecolor="#f4f4f4", edgecolor="#b0b0b0", hatch="///", linewidth=0)
        else:
            style = dict(facecolor=PIPELINE_COLORS[kind], edgecolor="white", linewidth=edge)
        ax.broken_barh(spans, (y, h), **style)
    if p > 16:
        ax.axhline(7.5 - 0.05, color="#888888", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(shown)), [f"stage {k}" for k in shown])
    ax.set_ylim(len(shown) - 0.45, -0.55)
    ax.set_xlabel("time (s)")


def plot_pipeline(pred: dict[str, Any], events: Sequence[Any], path: str, title: str) -> None:
    """Gantt chart of a pipelined step (commsim.step.pipeline events): a row per stage with
    its idle time hatched as the bubble, ZeRO-3 gathers and hidden dp sync on a thin row
    beneath. With more than ZOOM_ABOVE micro-batches (hundreds of bars a row) a second
    panel zooms on the warm-up: twice the bubble and four more ticks, marked on the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commsim.step.pipeline import event_stage, pipeline_span

    p = 1 + max(event_stage(ev) for ev in events)
    shown = list(range(p)) if p <= 16 else [*range(8), *range(p - 8, p)]
    m = (pred.get("layout") or {}).get("micro_batches", 1)
    zoom = m > ZOOM_ABOVE and pred["bubble_s"] > 0
    height = 1.6 + 0.45 * len(shown)
    fig, axes = plt.subplots(2 if zoom else 1, 1, figsize=(12, height * (1.9 if zoom else 1)))
    axes = list(axes) if zoom else [axes]
    edge = 0.2 if len(events) < 400 * p else 0.0  # white seams wash out thousands of bars
    bars = _stage_bars(events, shown)
    for ax in axes:
        _draw_stages(ax, bars, shown, p, edge)
    if zoom:
        start, _ = pipeline_span(events)
        v = pred["strategy"]["interleave"]
        tick = pred["bubble_s"] * v / max(p - 1, 1)
        window = (start, start + 2 * pred["bubble_s"] + 4 * tick)
        axes[1].set_xlim(*window)
        axes[0].axvspan(*window, color="#ffd54f", alpha=0.35, zorder=0)
        axes[1].set_title(f"zoom: the warm-up, the first {fmt_time(window[1] - start)}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PIPELINE_COLORS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, fc="#f4f4f4", ec="#b0b0b0", hatch="///"))
    labels = [*PIPELINE_NAMES, "optimizer", "idle (bubble)"]
    fig.legend(handles, labels, loc="lower center", ncols=8, fontsize=8, frameon=False)
    cut = f" (stages 8-{p - 9} not drawn)" if p > 16 else ""
    axes[0].set_title(
        f"{title}: {p} stages{cut}, {m} micro-batches, step {fmt_time(pred['step_time_s'])}, "
        f"bubble {fmt_time(pred['bubble_s'])} ({pct(pred['bubble_s'] / pred['step_time_s'])})",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04 if zoom else 0.07, 1, 1))
    save_figure(fig, path)
    plt.close(fig)


def _stage_bars(
    events: Sequence[Any], shown: list[int]
) -> dict[tuple[float, float, str], list[tuple[float, float]]]:
    """(y, height, kind) -> (start, duration) spans of the shown stages: each stage's idle
    time while the pipeline runs (the bubble) and its events on the stage's row, ZeRO-3
    gathers and hidden dp sync on a thin lane beneath."""
    from commsim.step.pipeline import event_kind, event_stage, idle_gaps, pipeline_span

    row = {k: r for r, k in enumerate(shown)}
    start, end = pipeline_span(events)
    bars: dict[tuple[float, float, str], list[tuple[float, float]]] = {}
    for k in shown:  # the bubble: idle time on the stage while the pipeline runs
        gaps = idle_gaps(events, k, start, end)
        bars[(row[k] - 0.35, 0.55, "idle")] = [(a, b - a) for a, b in gaps]
    for ev in events:
        k = event_stage(ev)
        if k in row:
            kind = event_kind(ev)
            lane = (row[k] + 0.24, 0.2) if kind in ("zero3", "dp hidden") else (row[k] - 0.35, 0.55)
            kind = "dp" if kind == "dp hidden" else kind
            bars.setdefault((*lane, kind), []).append((ev.start_s, ev.end_s - ev.start_s))
    return bars


def plot_validation(validation: Validation, path: str | Path, title: str) -> None:
    """Measured (x) against predicted (y), log-log, one colour per op, with y = x and
    +-15% lines; written whole or not at all."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    kinds = [r for r in validation.rows if r.kind in ("collective", "ddp-step")]
    if not kinds:
        raise SpecError(str(path), "", "nothing to plot")
    for label in dict.fromkeys(r.op for r in kinds):
        mine = [r for r in kinds if r.op == label]
        ax.scatter(
            [r.measured_s for r in mine],
            [r.predicted_s for r in mine],
            s=14,
            marker="s" if label == "ddp" else "o",
            label="DDP step" if label == "ddp" else label,
        )
    values = [v for r in kinds for v in (r.measured_s, r.predicted_s) if v > 0]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    line = np.geomspace(lo, hi, 50)
    ax.plot(line, line, "k-", lw=1, label="y = x")
    for f in (0.85, 1.15):
        ax.plot(line, line * f, "k:", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
    ax.set_xlabel("measured (s)")
    ax.set_ylabel("predicted (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buf.getvalue())
