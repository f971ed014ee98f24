"""The tables of one predicted step: where its time goes, the batch arithmetic, memory,
and (plain data parallelism) the gradient buckets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from commsim.report.labels import describe_strategy, layout_label, pct
from commsim.units import fmt_bytes, fmt_duration, fmt_time


def step_table(title: str, pred: dict[str, Any]) -> Table:
    """The step's summary: where the time goes, the derived metrics, memory, and (when the
    document has it) the batch arithmetic. Parts a layout does not have are left out."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("what it is", style="dim")
    rows = [
        ("strategy", layout_label(pred), describe_strategy(pred["strategy"])),
        *(_batch_rows(pred["batch"]) if pred.get("batch") else ()),
        ("step time", fmt_time(pred["step_time_s"]), "one optimizer step"),
        ("compute", fmt_time(pred["compute_s"]), "forward + backward + optimizer"),
        ("  forward", fmt_time(pred["forward_s"]), "all micro-batches"),
        ("  backward", fmt_time(pred["backward_s"]), "all micro-batches"),
        ("  optimizer", fmt_time(pred["optimizer_s"]), "mixed-precision Adam, HBM-bound"),
        *(
            (label, fmt_time(pred[key]), what)
            for key, label, what in (
                ("bubble_s", "pipeline bubble", _bubble_rule(pred["strategy"])),
                ("tp_comm_s", "tensor-parallel comm", "on the critical path"),
                ("cp_comm_s", "context-parallel comm", "K/V exchange not hidden"),
                ("ep_comm_s", "expert-parallel comm", "all-to-alls, etp gathers: critical path"),
                ("pp_comm_s", "pipeline sends", "on the critical path"),
                ("dp_comm_s", "data-parallel comm", "gradient sync / ZeRO collectives"),
                ("dp_exposed_s", "  of it exposed", "not hidden under backward"),
            )
            if pred.get(key)  # a part the layout does not have (or that costs nothing)
        ),
        ("communication", fmt_time(pred["comm_s"]), "sum of collectives"),
        *(
            [("encode/decode", fmt_time(pred["codec_s"]), "compression on the compute stream")]
            if pred["codec_s"]
            else []
        ),
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
        ("samples/s", f"{pred['samples_per_s']:,.1f}", "global throughput"),
        *_memory_rows(pred["memory"]),
        *(
            (label, value(pred["training"][key]), what)
            for key, label, value, what in (
                (
                    "time_to_train_s",
                    "time to train",
                    fmt_duration,
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


def _spread(values: Sequence[float], show) -> str:
    """Per-stage figures: one when all are equal, every one for a few stages, else the
    first, the range of the middle ones and the last."""
    if len(set(values)) == 1:
        return show(values[0])
    if len(values) <= 4:
        return " | ".join(show(v) for v in values)
    middle = values[1:-1]
    inner = show(min(middle)) + ("" if min(middle) == max(middle) else f"-{show(max(middle))}")
    return f"{show(values[0])} | {inner} | {show(values[-1])}"


def _batch_rows(b: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The batch and layout arithmetic (report.arithmetic) as rows a reader can check."""
    degrees = " x ".join(f"{k} {b[k]}" for k in ("dp", "tp", "pp", "cp") if b[k] > 1 or k == "dp")
    rows = [
        (
            "global batch",
            f"{b['global_batch']:,}",
            f"= dp {b['dp']} x micro-batch {b['micro_batch']} x {b['micro_batches']} "
            "micro-batches per step",
        ),
        ("GPUs", f"{b['dp'] * b['tp'] * b['pp'] * b['cp']:,}", f"= {degrees}"),
    ]
    if b["ep"] > 1:
        rows.append(
            (
                "expert parallel",
                f"ep {b['ep']}, etp {b['etp']}",
                "experts over ep ranks, each over etp, folded over tp x cp x dp",
            )
        )
    per = "stage" if b["pp"] > 1 else "GPU"
    rows += [
        (f"layers per {per}", _spread(b["stage_layers"], str), "transformer layers held"),
        (
            f"parameters per {per}",
            _spread(b["stage_params"], lambda n: f"{n / 1e9:.3g} B"),
            "before tensor / expert splitting",
        ),
    ]
    return rows


def _memory_rows(m: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Memory per GPU and its parts, against what HBM leaves usable."""
    verdict = "fits" if m["fits"] else "[red]DOES NOT FIT[/red]"
    rows = [
        (
            "memory per GPU",
            f"{m['total_bytes'] / 1e9:.1f} GB",
            f"{verdict} in {m['usable_bytes'] / 1e9:.1f} GB usable (fullest stage)",
        )
    ]
    for key, label, what in (
        ("params_bytes", "  parameters", "bf16 weights"),
        ("grads_bytes", "  gradients", "by ZeRO stage"),
        ("optimizer_bytes", "  optimizer state", "fp32 master, Adam moments"),
        ("activations_bytes", "  activations", "micro-batches in flight"),
        ("buffers_bytes", "  buffers", "buckets, gathers, workspace, error feedback"),
    ):
        rows.append((label, f"{m[key] / 1e9:.1f} GB", what))
    return rows


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


def _bubble_rule(strategy: dict) -> str:
    """How the schedule's bubble is counted: 1F1B's ticks or DualPipe's Table 2 formula."""
    if strategy.get("pipeline_schedule") == "dualpipe":
        return "(p / 2 - 1)(F&B + B - 3W), DualPipe"
    return "(p - 1) / v idle ticks"
