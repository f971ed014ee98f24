"""Matplotlib figures of sweeps: step time against NIC bandwidth per compressor, cluster
sizing (time to train and scaling efficiency against GPUs, the Pareto front, the deadline)
and a collective's bus bandwidth against message size. Axes carry plain numbers (256, not
2^8), every marker is in the legend, and curves that coincide are drawn once, labelled
with every name they stand for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from commsim.files import save_figure

MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
STYLES = ("-", "--", "-.", ":")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain(axis) -> None:
    """Plain numbers on a log axis: 256, 0.5, 1,024 rather than 2^8 or 10^3. A decimal
    axis (call after plotting) gets ticks at 1, 2, 5 a decade, or at every digit when its
    data span less than a decade, so it is never left with one label or none."""
    import matplotlib.ticker as ticker

    if axis.get_scale() == "log" and axis._scale.base == 10:
        lo, hi = axis.get_view_interval()
        subs = (1.0, 2.0, 5.0) if hi > 10 * lo else tuple(float(d) for d in range(1, 10))
        axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.6g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def coinciding(curves: dict[str, Sequence[float]]) -> dict[str, list[float]]:
    """Curves with the same values merged under one label "a = b", in first-seen order."""
    groups: list[tuple[list[str], Sequence[float]]] = []
    for name, ys in curves.items():
        twin = next((g for g in groups if np.allclose(g[1], ys, rtol=1e-9, atol=0)), None)
        if twin:
            twin[0].append(name)
        else:
            groups.append(([name], ys))
    return {" = ".join(names): list(ys) for names, ys in groups}


def plot_bandwidth_sweep(sweep: Any, path: str, title: str) -> None:
    """Step time against NIC bandwidth for each compressor; where each stops paying; the
    cluster's own bandwidth marked and named in the legend."""
    plt = _pyplot()
    gbps = [b * 8 / 1e9 for b in sweep.nic_bandwidth]
    fig, ax = plt.subplots(figsize=(9, 5))
    for k, (name, times) in enumerate(coinciding(sweep.step_time).items()):
        none = "none" in name.split(" = ")
        style = dict(color="black", linewidth=2.5) if none else {}
        ax.plot(
            gbps,
            times,
            marker=MARKERS[k % len(MARKERS)],
            linestyle=STYLES[k % len(STYLES)],
            markersize=4,
            label=name,
            **style,
        )
    for name, bw in sweep.crossovers.items():
        ax.axvline(bw * 8 / 1e9, color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"{name} stops paying\n{bw * 8 / 1e9:,.0f} Gb/s",
            (bw * 8 / 1e9, ax.get_ylim()[1]),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="grey",
        )
    here = sweep.current * 8 / 1e9
    ax.axvline(
        here,
        color="#17becf",
        linewidth=2,
        alpha=0.7,
        label=f"this cluster: {here:,.4g} Gb/s per NIC",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain(ax.xaxis)
    _plain(ax.yaxis)
    ax.set_xlabel("bandwidth per NIC (Gb/s)")
    ax.set_ylabel("step time (s)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def _days(row: Any) -> float:
    """A sizing row's time to train in days, with failures where its goodput is known (the
    figure its pick and Pareto front are made on)."""
    from commsim.planner.sizing import objective_value

    return objective_value(row, "time-to-train") / 86400


def _cost(row: Any) -> float:
    """Its cost, or GPU-hours without a price, with failures where its goodput is known."""
    from commsim.planner.sizing import objective_value

    return objective_value(row, "cost")


def plot_sizing(
    rows: Sequence[Any],
    front: Sequence[Any],
    pick: Any,
    path: str,
    title: str,
    deadline_s: float | None = None,
) -> None:
    """Scaling curve (time to train and scaling efficiency against GPUs, per fabric) and the
    Pareto front of time to train against cost; the deadline as a line on both."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    eff = left.twinx()
    for k, fabric in enumerate(dict.fromkeys(r.fabric for r in rows)):
        ok = [r for r in rows if r.fabric == fabric and r.best and r.best.training]
        gpus = [r.gpus for r in ok]
        days = [_days(r) for r in ok]
        marker = MARKERS[k % len(MARKERS)]
        line = left.plot(gpus, days, marker=marker, label=f"{fabric}: time to train")[0]
        eff.plot(
            gpus,
            [100 * r.best.scaling_efficiency for r in ok],
            linestyle="--",
            marker=marker,
            markerfacecolor="none",
            color=line.get_color(),
            label=f"{fabric}: scaling efficiency",
        )
        cost = [_cost(r) for r in ok]
        right.scatter(cost, days, color=line.get_color(), marker=marker, label=fabric)
        for r, c, d in zip(ok, cost, days, strict=True):
            right.annotate(
                f"{r.gpus:,}", (c, d), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
    if front:
        fd = [_days(r) for r in front]
        right.plot([_cost(r) for r in front], fd, color="black", lw=1, label="Pareto front")
    if pick is not None and pick.best and pick.best.training:
        right.scatter(
            [_cost(pick)],
            [_days(pick)],
            s=150,
            facecolors="none",
            edgecolors="red",
            label=f"pick: {pick.gpus:,} GPUs of {pick.fabric}",
        )
    if deadline_s:
        for ax in (left, right):
            ax.axhline(
                deadline_s / 86400,
                color="red",
                linestyle=":",
                label=f"deadline: {deadline_s / 86400:,.4g} days",
            )
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    for axis in (left.xaxis, left.yaxis):
        _plain(axis)
    failures = " with failures" if any(r.goodput for r in rows) else ""
    left.set_xlabel("GPUs")
    left.set_ylabel(f"time to train{failures} (days)")
    eff.set_ylabel("scaling efficiency (%)")
    eff.set_ylim(0, 105)
    left.legend(loc="upper center", fontsize=7)
    eff.legend(loc="lower left", fontsize=7)
    right.set_xscale("log")
    right.set_yscale("log")
    for axis in (right.xaxis, right.yaxis):
        _plain(axis)
    priced = any(r.best and r.best.training and r.best.training.get("cost") for r in rows)
    right.set_xlabel("cost" if priced else "GPU-hours")
    right.set_ylabel(f"time to train{failures} (days)")
    right.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_busbw(doc: dict[str, Any], path: str) -> None:
    """A collective's bus bandwidth against message size, one curve per algorithm (as
    requested), coinciding ones drawn once."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    curves: dict[str, list[float]] = {}
    sizes: dict[str, list[float]] = {}
    for r in doc["rows"]:
        curves.setdefault(r["requested"], []).append(r["busbw_Bps"] / 1e9)
        sizes.setdefault(r["requested"], []).append(r["bytes"])
    x = next(iter(sizes.values()))
    for k, (name, ys) in enumerate(coinciding(curves).items()):
        ax.plot(
            x,
            ys,
            marker=MARKERS[k % len(MARKERS)],
            linestyle=STYLES[k % len(STYLES)],
            markersize=4,
            label=name,
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_size_formatter())
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{doc['op']}: {doc['gpus']} GPUs of {doc['cluster']}, {doc['placement']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _size_formatter():
    import matplotlib.ticker

    from commsim.units import fmt_bytes

    return matplotlib.ticker.FuncFormatter(lambda v, _: fmt_bytes(v) if v > 0 else "")
