"""Rich tables of every command's results (metrics as defined in commsim.report)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from commsim.report.labels import (
    compression_label,
    layout_label,
    pct,
)
from commsim.units import fmt_bytes, fmt_rate, fmt_time


def collective_table(
    title: str, rows: Sequence[dict[str, Any]], algorithms: Sequence[str]
) -> Table:
    """nccl-tests style: one line per size; time (us) and busbw (GB/s) per algorithm, plus
    algbw when only one algorithm is shown. The fastest time of a row is bold."""
    table = Table(title=title, title_justify="left")
    table.add_column("size", justify="right")
    single = len(algorithms) == 1
    for alg in algorithms:
        table.add_column(f"{alg}\ntime (us)", justify="right")
        if single:
            table.add_column("algbw\n(GB/s)", justify="right")
        table.add_column("busbw\n(GB/s)" if single else f"{alg}\nbusbw", justify="right")
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


def step_table(title: str, pred: dict[str, Any]) -> Table:
    """The step's summary: where the time goes and the derived metrics."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("what it is", style="dim")
    rows = [
        ("step time", fmt_time(pred["step_time_s"]), "one optimizer step"),
        ("compute", fmt_time(pred["compute_s"]), "forward + backward + optimizer"),
        ("  forward", fmt_time(pred["forward_s"]), "all micro-batches"),
        ("  backward", fmt_time(pred["backward_s"]), "all micro-batches"),
        ("  optimizer", fmt_time(pred["optimizer_s"]), "mixed-precision Adam, HBM-bound"),
        *(
            (label, fmt_time(pred[key]), what)
            for key, label, what in (
                ("bubble_s", "pipeline bubble", "(p - 1) / v idle ticks"),
                ("tp_comm_s", "tensor-parallel comm", "on the critical path"),
                ("ep_comm_s", "expert-parallel all-to-all", "on the critical path"),
                ("pp_comm_s", "pipeline sends", "on the critical path"),
                ("dp_comm_s", "data-parallel comm", "gradient sync / ZeRO collectives"),
                ("dp_exposed_s", "  of it exposed", "not hidden under backward"),
            )
            if pred.get(key)  # a part the layout does not have (or that costs nothing)
        ),
        ("communication", fmt_time(pred["comm_s"]), "sum of collectives"),
        ("encode/decode", fmt_time(pred["codec_s"]), "compression on the compute stream"),
        (
            "exposed comm",
            fmt_time(pred["exposed_comm_s"]),
            "communication not hidden under compute",
        ),
        ("overlap ratio", pct(pred["overlap_ratio"]), "1 - exposed / comm"),
        ("overlap efficiency", pct(pred["overlap_efficiency"]), "T_comp / max(T_comp, T_comm)"),
        ("scaling efficiency", pct(pred["scaling_efficiency"]), "thr(N) / (N thr(1))"),
        ("MFU", pct(pred["mfu"]), "model FLOP/s / (N peak), recomputation not counted"),
        (
            "TFLOP/s per GPU",
            f"{pred['tflops_per_gpu']:.1f}",
            "hardware FLOP/s, recomputation counted",
        ),
        ("samples/s", f"{pred['samples_per_s']:.1f}", "global throughput"),
        _memory_row(pred["memory"]),
        *(
            (label, value(pred["training"][key]), what)
            for key, label, value, what in (
                (
                    "time_to_train_s",
                    "time to train",
                    lambda t: f"{t / 86400:.1f} days",
                    "tokens / tokens per step x step time",
                ),
                ("gpu_hours", "GPU-hours", lambda h: f"{h:,.0f}", "N x time to train"),
                ("cost", "cost", lambda c: f"{c:,.0f}", "GPU-hours x price"),
            )
            if pred.get("training") and pred["training"][key] is not None
        ),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _memory_row(m: dict[str, Any]) -> tuple[str, str, str]:
    verdict = "fits" if m["fits"] else "[red]DOES NOT FIT[/red]"
    parts = ", ".join(
        f"{k.removesuffix('_bytes')} {m[k] / 1e9:.1f}"
        for k in (
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "activations_bytes",
            "buffers_bytes",
        )
    )
    return (
        "memory per GPU",
        f"{m['total_bytes'] / 1e9:.1f} GB",
        f"{verdict} in {m['usable_bytes'] / 1e9:.1f} GB usable ({parts} GB)",
    )


def bucket_table(buckets: Sequence[dict[str, Any]], limit: int = 12) -> Table:
    """Per-bucket breakdown: size, when its gradients are ready, when its all-reduce runs."""
    table = Table(title="gradient buckets (in all-reduce order)", title_justify="left")
    for col in ("#", "size", "tensors", "layers", "ready", "start", "end", "all-reduce", "waited"):
        table.add_column(col, justify="right")
    shown = buckets if len(buckets) <= limit else [*buckets[: limit - 2], None, buckets[-1]]
    for b in shown:
        if b is None:
            table.add_row("...", *[""] * 8)
            continue
        table.add_row(
            str(b["index"]),
            fmt_bytes(b["bytes"]),
            str(b["tensors"]),
            str(b["layers"]),
            fmt_time(b["ready_s"]),
            fmt_time(b["start_s"]),
            fmt_time(b["end_s"]),
            fmt_time(b["time_s"]),
            fmt_time(b["start_s"] - b["ready_s"]),
        )
    return table


def plan_table(title: str, candidates: Sequence[dict[str, Any]], top: int) -> Table:
    """Ranked strategies, best first."""
    table = Table(title=title, title_justify="left")
    columns = (
        "rank",
        "layout",
        "algorithm",
        "bucket",
        "overlap",
        "placement",
        "compression",
        "step",
        "exposed comm",
        "bubble",
        "memory",
        "MFU",
        "vs best",
    )
    for col in columns:
        left = col in ("layout", "algorithm", "placement", "compression")
        table.add_column(col, justify="left" if left else "right")
    best = candidates[0]["step_time_s"]
    for i, c in enumerate(candidates[:top], 1):
        s = c["strategy"]
        table.add_row(
            str(i),
            layout_label(c),
            s["algorithm"],
            f"{s['bucket_mb']:g} MiB",
            "on" if s["overlap"] else "off",
            s["placement"],
            compression_label(s),
            fmt_time(c["step_time_s"]),
            fmt_time(c["exposed_comm_s"]),
            fmt_time(c.get("bubble_s", 0.0)),
            f"{c['memory']['total_bytes'] / 1e9:.1f} GB",
            pct(c["mfu"]),
            f"+{100 * (c['step_time_s'] / best - 1):.1f}%",
        )
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
            f"{r['wire_ratio']:.4f}",
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


def sizing_table(rows: Sequence[Any], front: Sequence[Any], pick: Any, title: str) -> Table:
    """Per fabric and cluster size: the best strategy, its goodput under failures, time to
    train with failures and ideal, GPU-hours, cost (with failures where goodput is known)."""
    table = Table(title=title, title_justify="left")
    for col in (
        "fabric",
        "GPUs",
        "best layout",
        "step",
        "goodput",
        "time to train",
        "ideal",
        "GPU-hours",
        "cost",
        "MFU",
        "",
    ):
        table.add_column(col, justify="left" if col in ("fabric", "best layout", "") else "right")
    on_front = {(r.fabric, r.gpus) for r in front}
    for r in rows:
        p = r.best
        mark = " ".join(
            [
                *(["Pareto"] if (r.fabric, r.gpus) in on_front else []),
                *(["<- pick"] if pick is r else []),
            ]
        )
        if p is None:
            table.add_row(r.fabric, str(r.gpus), f"[dim]{r.note}[/dim]", *[""] * 8)
            continue
        t = p.training or {}
        g = r.goodput
        real = (
            {"time_to_train_s": g.time_to_train_s, "gpu_hours": g.gpu_hours, "cost": g.cost}
            if g
            else t
        )
        d = p.to_dict()
        table.add_row(
            r.fabric,
            f"{r.gpus:,}",
            f"{layout_label(d)} {d['strategy']['algorithm']}",
            fmt_time(p.step_time_s),
            pct(g.goodput) if g else "",
            f"{real['time_to_train_s'] / 86400:.2f} d",
            f"{t['time_to_train_s'] / 86400:.2f} d",
            f"{real['gpu_hours']:,.0f}",
            f"{real['cost']:,.0f}" if real.get("cost") is not None else "",
            pct(p.mfu),
            mark,
        )
    return table


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
