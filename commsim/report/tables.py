"""Rich tables of every command's results (metrics as defined in commsim.report)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from commsim.report.labels import (
    layout_label,
    pct,
)
from commsim.units import fmt_bytes, fmt_duration, fmt_rate, fmt_time


def collective_table(
    title: str, rows: Sequence[dict[str, Any]], algorithms: Sequence[str]
) -> Table:
    """nccl-tests style: one line per size; time (us) and busbw (GB/s) per algorithm, plus
    algbw when only one algorithm is shown. The fastest time of a row is bold."""
    table = Table(title=title, title_justify="left")
    table.add_column("size", justify="right", no_wrap=True)
    single = len(algorithms) == 1
    for alg in algorithms:
        table.add_column(f"{alg}\ntime (us)", justify="right", no_wrap=True)
        if single:
            table.add_column("algbw\n(GB/s)", justify="right", no_wrap=True)
        table.add_column("busbw\n(GB/s)" if single else "\nbusbw", justify="right", no_wrap=True)
    by_size: dict[float, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_size.setdefault(row["bytes"], {})[row["algorithm"]] = row
    for size, cells in by_size.items():
        line = [fmt_bytes(size)]
        best = min(cells.values(), key=lambda r: r["time_s"])["algorithm"]
        for alg in algorithms:
            r = cells[alg]
            us = r["time_s"] * 1e6
            t = f"{us:.2f}" if us < 100 else f"{us:.1f}"
            line.append(f"[bold]{t}[/bold]" if alg == best and not single else t)
            if single:
                line.append(f"{r['algbw_Bps'] / 1e9:.2f}")
            line.append(f"{r['busbw_Bps'] / 1e9:.2f}")
        table.add_row(*line)
    return table


def nccl_choice_table(title: str, rows: Sequence[dict[str, Any]]) -> Table:
    """Per size what NCCL's tuner runs: algorithm, protocol, channels, its own estimate,
    the runner-up and its estimate (why it won), and the bandwidth that priced it: NCCL's
    algorithm bandwidth or the graph's share for the group, whichever is lower."""
    table = Table(title=title, title_justify="left")
    for col in ("size", "algorithm", "protocol", "channels", "NCCL's estimate (us)"):
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    table.add_column("runner-up")
    table.add_column("its estimate (us)", justify="right")
    table.add_column("algbw NCCL / graph (GB/s)", justify="right")
    for r in rows:
        second = r["runner_up_nccl_time_s"]
        nccl_bw, graph_bw = r["nccl_algbw_Bps"] / 1e9, r["graph_algbw_Bps"] / 1e9
        bold = "[bold]{}[/bold]"
        table.add_row(
            fmt_bytes(r["bytes"]),
            r["nccl_algorithm"],
            r["protocol"],
            str(r["channels"]),
            f"{r['nccl_time_s'] * 1e6:.1f}",
            r["runner_up"] or "-",
            "-" if second is None else f"{second * 1e6:.1f}",
            f"{nccl_bw:.0f} / " + (bold.format(f"{graph_bw:.0f}") if graph_bw < nccl_bw
                                   else f"{graph_bw:.0f}"),
        )  # fmt: skip
    return table


def topology_table(summary: dict[str, Any]) -> Table:
    """A cluster's summary: sizes, tiers, bandwidths."""
    table = Table(title=summary["name"], title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for key, value in summary.items():
        if key == "name":
            continue
        if isinstance(value, float) and key.endswith("_Bps"):
            value = fmt_rate(value)
        elif isinstance(value, float) and key.endswith("_s"):
            value = fmt_time(value)
        table.add_row(key, str(value))
    return table


def compression_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Per compressor and gradient source: wire ratio, fidelity delta, encode/decode speed."""
    table = Table(
        title="compressors on this machine's CPU (numpy); delta: ||C(g)-g||^2 <= (1-delta)||g||^2",
        title_justify="left",
    )
    for col in ("gradients", "compressor", "wire ratio", "delta", "encode s/MB", "decode s/MB"):
        table.add_column(col, justify="left" if col in ("gradients", "compressor") else "right")
    for r in rows:
        table.add_row(
            r["gradients"],
            r["compressor"],
            f"{r['wire_ratio']:.4g}",  # .4f showed randomk:1e-9's 8e-08 as 0.0000
            f"{r['delta']:.4f}",
            f"{r['encode_s_per_MB']:.2e}",
            f"{r['decode_s_per_MB']:.2e}",
        )
    return table


def convergence_table(rows: Sequence[dict[str, Any]], steps: int, workers: int) -> Table:
    """Final accuracy and loss of each compressed training run against the uncompressed one."""
    table = Table(
        title=f"digits MLP, {workers} simulated workers, {steps} steps", title_justify="left"
    )
    for col in (
        "compressor",
        "error feedback",
        "test accuracy",
        "retained",
        "test loss",
        "train loss",
        "wire bytes/step",
    ):
        table.add_column(col, justify="left" if col == "compressor" else "right")
    for r in rows:
        table.add_row(
            r["compressor"],
            "on" if r["error_feedback"] else "off",
            pct(r["test_accuracy"]),
            pct(r["accuracy_retained"]),
            f"{r['test_loss']:.4f}",
            f"{r['final_train_loss']:.4f}",
            f"{r['wire_bytes_per_step']:,}",
        )
    return table


def sizing_tables(rows: Sequence[Any], front: Sequence[Any], pick: Any, title: str) -> list[Table]:
    """One table per fabric, a row per cluster size: the best layout, its goodput under
    failures, time to train with failures and ideal (the ideal alone under --recovery none;
    the step time is the ideal time over the fixed step count, in --json), cost with
    failures (GPU-hours when no price is given: cost is GPU-hours x price), MFU; the Pareto
    front and the pick (over every fabric) marked. One line a row within 120 columns."""
    fabrics = list(dict.fromkeys(r.fabric for r in rows))
    return [
        _sizing_table([r for r in rows if r.fabric == f], front, pick, f"{title}, on {f}")
        for f in fabrics
    ]


def _sizing_table(rows: Sequence[Any], front: Sequence[Any], pick: Any, title: str) -> Table:
    """One fabric's sizes (see sizing_tables)."""
    priced = any(r.best and (r.best.training or {}).get("cost") is not None for r in rows)
    money = ("cost", "cost") if priced else ("gpu_hours", "GPU-hours")
    failures = any(r.goodput for r in rows)
    times = ("goodput", "to train", "ideal") if failures else ("to train",)
    table = Table(title=title, title_justify="left")
    for col in ("GPUs", "best layout", *times, money[1], "MFU", ""):
        left = col in ("best layout", "")
        table.add_column(col, justify="left" if left else "right", no_wrap=not left)
    on_front = {(r.fabric, r.gpus) for r in front}
    for r in rows:
        p = r.best
        marks = [
            *(["Pareto"] if (r.fabric, r.gpus) in on_front else []),
            *(["pick"] if pick is r else []),
        ]
        if p is None:
            table.add_row(f"{r.gpus:,}", f"[dim]{r.note}[/dim]", *[""] * (len(times) + 3))
            continue
        t = p.training or {}
        g = r.goodput
        real = (
            {"time_to_train_s": g.time_to_train_s, "gpu_hours": g.gpu_hours, "cost": g.cost}
            if g
            else t
        )
        table.add_row(
            f"{r.gpus:,}",
            layout_label(p.to_dict()),
            *((pct(g.goodput) if g else "",) if failures else ()),
            _duration(real.get("time_to_train_s")),
            *((_duration(t.get("time_to_train_s")),) if failures else ()),
            f"{real[money[0]]:,.0f}" if real.get(money[0]) is not None else "",
            pct(p.mfu),
            ", ".join(marks),
        )
    return table


def _duration(seconds: float | None) -> str:
    """A time to train as fmt_duration writes it, days as d; blank when unknown."""
    return "" if seconds is None else fmt_duration(seconds, days="d")


PERCENT_METRICS = (
    "comm_share",
    "overlap_ratio",
    "scaling_efficiency",
    "mfu",
    "wire_ratio",
    "traffic_cut",
    "failure_badput",
    "spare_fraction",
)


def _claim_figure(metric: str, value: float, ratio: bool) -> str:
    """A claim's figure in the unit its metric reads in."""
    if ratio:
        return f"x{value:.3g}"
    if metric == "gradient_bytes":  # decimal units, as the documents state sizes
        return f"{value / 1e12:.3g} TB" if value >= 1e12 else f"{value / 1e9:.3g} GB"
    if metric == "time_to_train_days":
        return f"{value:.3g} days"
    if metric == "busbw_Bps":
        return fmt_rate(value)
    if metric.endswith("_s"):
        return fmt_time(value)
    if metric in PERCENT_METRICS:
        return pct(value)
    return f"{value:.3g}"


def claims_table(results: Sequence[Any]) -> Table:
    """One row per check of each seed claim: stated, computed, and whether it holds."""
    table = Table(title="Seed claims against commsim's model", title_justify="left")
    for col in ("scenario", "the document says", "metric", "stated", "commsim", "verdict"):
        table.add_column(col, justify="right" if col in ("stated", "commsim") else "left")
    for r in results:
        for i, c in enumerate(r.checks):
            bound = "<= " if c.at_most is not None else ">= " if c.at_least is not None else ""
            verdict = "[green]holds[/green]" if c.holds else "[red]does not hold[/red]"
            if not c.holds and c.claimed is not None:
                verdict += f" ({c.factor:.3g}x)"
            table.add_row(
                r.scenario if i == 0 else "",
                c.says,
                c.metric + (" ratio" if c.ratio else ""),
                bound + _claim_figure(c.metric, c.target, c.ratio),
                _claim_figure(c.metric, c.value, c.ratio),
                verdict,
            )
        table.add_section()
    return table
