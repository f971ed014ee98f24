"""Goodput and stragglers for the terminal and as figures (commsim goodput, commsim stragglers).

Everything here reads the JSON form of the reports (GoodputReport.to_dict, SizePoint.to_dict),
so what the table shows is what --json prints.

  goodput          useful compute time / wall time (Meta's ETTR; Google's runtime goodput)
  badput           the rest of the wall time by cause: checkpoint_save, checkpoint_restore,
                   lost_progress (work redone or the step in flight), detection, reschedule,
                   initialization (NCCL and rendezvous), warmup, reduced_capacity
  MTTI             mean time to interruption of the job: 1 / its interruption rate
  time to train    ideal (no failures) / goodput; GPU-hours and cost include spare nodes
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from commsim.files import save_figure
from commsim.report.labels import pct
from commsim.units import fmt_bytes, fmt_duration, fmt_time

BADPUT_ORDER = (
    "checkpoint_save",
    "lost_progress",
    "checkpoint_restore",
    "detection",
    "reschedule",
    "initialization",
    "warmup",
    "reduced_capacity",
)


def _duration(seconds: float | None) -> str:
    """A table cell: blank for none, 0 for none at all, else units.fmt_duration in days "d"
    to 2 decimals (10.72 d beside 10.78 d: what failures add must show)."""
    if seconds is None:
        return ""
    return "0" if seconds == 0 else fmt_duration(seconds, days="d", decimals=2)


def _money(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _spares(r: dict[str, Any]) -> str:
    if r["strategy"] == "cold":
        return "none (pool)"
    return f"{r['spares']} (full size {pct(r['p_full'])})"


def goodput_table(title: str, reports: Sequence[dict[str, Any]]) -> Table:
    """One column per recovery strategy: failures, checkpointing, restart, goodput, badput,
    time to train and cost next to the ideal ones."""
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for r in reports:
        table.add_column(r["strategy"], justify="right")
    first = reports[0]

    def row(label: str, f) -> None:
        table.add_row(label, *[f(r) for r in reports])

    row("MTTI", lambda r: _duration(r["mtti_s"]))
    row("interruptions / day", lambda r: f"{r['interruptions_per_day']:.2f}")
    row("checkpoint / GPU", lambda r: fmt_bytes(r["checkpoint_bytes_per_gpu"]))
    row("checkpoint interval", lambda r: _duration(r["interval_s"]) or "none")
    row(
        "  Young / Daly",
        lambda r: (
            " / ".join(_duration(r[k]) for k in ("young_s", "daly_s")) if r["young_s"] else ""
        ),
    )
    row("checkpoint stall", lambda r: _duration(r["checkpoint_stall_s"]) if r["interval_s"] else "")
    row("  durable after", lambda r: _duration(r["checkpoint_lag_s"]) if r["interval_s"] else "")
    row("restart / stall per failure", lambda r: _duration(r["restart_s"]))
    row("spare nodes", _spares)
    row("[bold]goodput[/bold]", lambda r: f"[bold]{pct(r['goodput'])}[/bold]")
    for key in BADPUT_ORDER:
        if any(key in r["badput"] for r in reports):
            row(f"  {key.replace('_', ' ')}", lambda r, k=key: pct(r["badput"].get(k, 0.0)))
    if first["ideal_time_to_train_s"]:
        row("time to train, ideal", lambda r: _duration(r["ideal_time_to_train_s"]))
        row("time to train", lambda r: _duration(r["time_to_train_s"]))
        row("GPU-hours (with spares)", lambda r: _money(r["gpu_hours"]))
        if first["cost"] is not None:
            row("cost", lambda r: _money(r["cost"]))
    return table


def sizing_table(title: str, points: Sequence[dict[str, Any]], knee: dict[str, Any]) -> Table:
    """Per cluster size: step, MTTI, goodput, and time to train ideal and with goodput."""
    table = Table(title=title, title_justify="left")
    for col in (
        "GPUs",
        "step",
        "MTTI",
        "ckpt every",
        "spares",
        "goodput",
        "ideal",
        "with goodput",
        "GPU-hours",
        "cost",
        "",
    ):
        table.add_column(col, justify="left" if col == "" else "right")
    for p in points:
        if "goodput" not in p:
            table.add_row(f"{p['gpus']:,}", f"[dim]{p['note']}[/dim]", *[""] * 9)
            continue
        mark = "<- fastest" if p["gpus"] == knee.get("fastest_gpus") else ""
        table.add_row(
            f"{p['gpus']:,}",
            fmt_time(p["step_time_s"]),
            _duration(p["mtti_s"]),
            _duration(p["interval_s"]) or "-",
            str(p["spares"]),
            pct(p["goodput"]),
            _duration(p["ideal_time_to_train_s"]),
            _duration(p["time_to_train_s"]),
            _money(p["gpu_hours"]),
            _money(p["cost"]),
            mark,
        )
    return table


def straggler_table(title: str, rows: Sequence[dict[str, Any]]) -> Table:
    """Mitigations of a slow rank: throughput left and work lost over the episode."""
    table = Table(title=title, title_justify="left")
    for col in ("mitigation", "throughput", "lost over the episode", "how"):
        table.add_column(
            col, justify="right" if col in ("throughput", "lost over the episode") else "left"
        )
    for r in rows:
        table.add_row(r["name"], pct(r["throughput"]), _duration(r["lost_s"]), r["note"])
    return table


def plot_sizing(points: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """Goodput against GPUs, and time to train ideal and with goodput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [p for p in points if "goodput" in p]
    gpus = [p["gpus"] for p in ok]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(gpus, [100 * p["goodput"] for p in ok], marker="o")
    left.set_ylabel("goodput (%)")
    if ok and ok[0]["ideal_time_to_train_s"]:
        right.plot(
            gpus, [p["ideal_time_to_train_s"] / 86400 for p in ok], marker="o", label="ideal"
        )
        right.plot(
            gpus, [p["time_to_train_s"] / 86400 for p in ok], marker="s", label="with failures"
        )
        right.set_ylabel("time to train (days)")
        right.legend()
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_badput(reports: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """Where the wall time goes under each recovery strategy (stacked shares)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [r["strategy"] for r in reports]
    bottom = [100 * r["goodput"] for r in reports]
    ax.bar(names, bottom, label="goodput")
    for key in BADPUT_ORDER:
        share = [100 * r["badput"].get(key, 0.0) for r in reports]
        if any(share):
            ax.bar(names, share, bottom=bottom, label=key.replace("_", " "))
            bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    ax.set_ylabel("share of wall time (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
