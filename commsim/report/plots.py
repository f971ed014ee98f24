"""Matplotlib figures: step timelines, pipelines, topologies, sweeps, sizing, validation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from commsim.files import write_atomic
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
    fig.savefig(path, dpi=120)
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bandwidth_sweep(sweep: Any, path: str, title: str) -> None:
    """Step time against NIC bandwidth for each compressor; where each stops paying."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gbps = [b * 8 / 1e9 for b in sweep.nic_bandwidth]
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, times in sweep.step_time.items():
        style = {"color": "black", "linewidth": 2.5} if name == "none" else {}
        ax.plot(gbps, times, marker="o", markersize=3, label=name, **style)
    for name, bw in sweep.crossovers.items():
        ax.axvline(bw * 8 / 1e9, color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"{name} stops paying\n{bw * 8 / 1e9:.0f} Gb/s",
            (bw * 8 / 1e9, ax.get_ylim()[1]),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="grey",
        )
    ax.axvline(sweep.current * 8 / 1e9, color="red", linewidth=1)
    ax.annotate(
        "this cluster",
        (sweep.current * 8 / 1e9, ax.get_ylim()[0]),
        color="red",
        fontsize=8,
        ha="left",
        va="bottom",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("bandwidth per NIC (Gb/s)")
    ax.set_ylabel("step time (s)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_pipeline(pred: dict[str, Any], events: Sequence[Any], path: str, title: str) -> None:
    """Gantt chart of a pipelined step (commsim.step.pipeline events): a row per stage with its idle
    time hatched as the bubble, ZeRO-3 gathers and hidden dp sync on a thin row beneath."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commsim.step.pipeline import event_stage

    colors = {
        "forward": "#4c72b0",
        "backward": "#55a868",
        "tp": "#c44e52",
        "send": "#dd8452",
        "zero3": "#937860",
        "dp": "#da8bc3",
        "optimizer": "#8172b2",
    }
    names = [
        "forward",
        "backward",
        "tp all-reduce",
        "send",
        "ZeRO-3 gather",
        "dp sync",
        "optimizer",
    ]
    p = 1 + max(event_stage(ev) for ev in events)
    shown = list(range(p)) if p <= 16 else [*range(8), *range(p - 8, p)]
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.45 * len(shown)))
    edge = 0.2 if len(events) < 400 * p else 0.0  # white seams wash out thousands of bars
    for (y, h, kind), spans in _stage_bars(events, shown).items():
        if kind == "idle":
            style = dict(facecolor="#f4f4f4", edgecolor="#b0b0b0", hatch="///", linewidth=0)
        else:
            style = dict(facecolor=colors[kind], edgecolor="white", linewidth=edge)
        ax.broken_barh(spans, (y, h), **style)
    if p > 16:
        ax.axhline(7.5 - 0.05, color="#888888", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(shown)), [f"stage {k}" for k in shown])
    ax.set_ylim(len(shown) - 0.45, -0.55)
    ax.set_xlabel("time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, fc="#f4f4f4", ec="#b0b0b0", hatch="///"))
    ax.legend(
        handles,
        [*names, "idle (bubble)"],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.5 / (1.6 + 0.45 * len(shown))),
        ncols=8,
        fontsize=8,
        frameon=False,
    )
    cut = f" (stages 8-{p - 9} not drawn)" if p > 16 else ""
    ax.set_title(
        f"{title}: {p} stages{cut}, step {fmt_time(pred['step_time_s'])}, bubble "
        f"{fmt_time(pred['bubble_s'])} ({pct(pred['bubble_s'] / pred['step_time_s'])})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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


def plot_sizing(rows: Sequence[Any], front: Sequence[Any], pick: Any, path: str, title: str):
    """Scaling curve (time to train and scaling efficiency against GPUs, per fabric) and the
    Pareto front of time to train against cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    eff = left.twinx()
    for fabric in dict.fromkeys(r.fabric for r in rows):
        ok = [r for r in rows if r.fabric == fabric and r.best and r.best.training]
        gpus = [r.gpus for r in ok]
        days = [r.best.training["time_to_train_s"] / 86400 for r in ok]
        line = left.plot(gpus, days, marker="o", label=f"{fabric}: time to train")[0]
        eff.plot(
            gpus,
            [100 * r.best.scaling_efficiency for r in ok],
            linestyle="--",
            color=line.get_color(),
            label=f"{fabric}: scaling efficiency",
        )
        cost = [(r.best.training.get("cost") or r.best.training["gpu_hours"]) for r in ok]
        right.scatter(cost, days, color=line.get_color(), label=fabric)
        for r, c, d in zip(ok, cost, days, strict=True):
            right.annotate(
                f"{r.gpus}", (c, d), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
    if front:
        fc = [(r.best.training.get("cost") or r.best.training["gpu_hours"]) for r in front]
        fd = [r.best.training["time_to_train_s"] / 86400 for r in front]
        right.plot(fc, fd, color="black", linewidth=1, label="Pareto front")
    if pick is not None and pick.best and pick.best.training:
        right.scatter(
            [pick.best.training.get("cost") or pick.best.training["gpu_hours"]],
            [pick.best.training["time_to_train_s"] / 86400],
            s=150,
            facecolors="none",
            edgecolors="red",
            label="pick",
        )
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("GPUs")
    left.set_ylabel("time to train (days)")
    eff.set_ylabel("scaling efficiency (%)")
    eff.set_ylim(0, 105)
    left.legend(loc="upper center", fontsize=7)
    eff.legend(loc="lower left", fontsize=7)
    right.set_xscale("log")
    right.set_yscale("log")
    has_price = any(r.best and r.best.training and r.best.training.get("cost") for r in rows)
    right.set_xlabel("cost" if has_price else "GPU-hours")
    right.set_ylabel("time to train (days)")
    right.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
