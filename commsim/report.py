"""What the user sees: rich tables, one JSON document for scripts, matplotlib figures.

Metrics, as every table and JSON key here uses them:
  step time          wall time of one optimizer step (all micro-batches, sync, optimizer)
  exposed comm       step time - compute time: time the GPUs wait on the network
  overlap ratio      1 - exposed / comm: share of communication hidden under compute
  overlap efficiency T_compute / max(T_compute, T_comm)
  scaling efficiency throughput(N) / (N * throughput(1))
  MFU                model FLOP/s / (N * peak FLOP/s)
  algbw, busbw       S / t, and algbw * factor (all-reduce 2(N-1)/N, all-gather and
                     reduce-scatter (N-1)/N, broadcast 1, all-to-all (N-1)/N), as nccl-tests
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from commsim.specs import SpecError
from commsim.units import UnitError, fmt_bytes, fmt_rate, fmt_time

# Piped output (CI logs, `| less`) gets a wide page instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


# The --json option every command takes.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Input errors (a spec, a unit, a value) as one line on stderr and exit code 2."""
    try:
        yield
    except (SpecError, UnitError, ValueError) as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return obj


def print_json(doc: dict[str, Any]) -> None:
    """One JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(_jsonable(doc), indent=2) + "\n")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


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
            if key in pred
        ),
        ("communication", fmt_time(pred["comm_s"]), "sum of collectives"),
        ("encode/decode", fmt_time(pred["codec_s"]), "compression on the compute stream"),
        (
            "exposed comm",
            fmt_time(pred["exposed_comm_s"]),
            "communication not hidden under compute",
        ),
        ("overlap ratio", _pct(pred["overlap_ratio"]), "1 - exposed / comm"),
        ("overlap efficiency", _pct(pred["overlap_efficiency"]), "T_comp / max(T_comp, T_comm)"),
        ("scaling efficiency", _pct(pred["scaling_efficiency"]), "thr(N) / (N thr(1))"),
        ("MFU", _pct(pred["mfu"]), "model FLOP/s / (N peak), recomputation not counted"),
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


def compression_label(strategy: dict[str, Any]) -> str:
    """A compressor as a user spells it, with +EF when error feedback is on."""
    c = strategy["compression"]
    return c + (" +EF" if strategy["error_feedback"] and c != "none" else "")


def describe_strategy(strategy: dict[str, Any]) -> str:
    """One line: layout (when hybrid), algorithm, bucket, overlap, placement, compression."""
    s = strategy
    overlap = "overlap" if s["overlap"] else "no overlap"
    ep = s.get("ep", 1)
    layout = (
        f"tp {s['tp']}, pp {s['pp']}{split_label(s)}, {f'ep {ep}, ' if ep > 1 else ''}"
        f"zero {s['zero']}, "
        f"recompute {s['recompute']}, interleave {s['interleave']}, "
        if (s["tp"], s["pp"], ep, s["zero"], s["recompute"], s["interleave"])
        != (1, 1, 1, 0, "none", 1)
        else ""
    )
    return (
        f"{layout}{s['algorithm']}, {s['bucket_mb']:g} MiB, {overlap}, {s['placement']}, "
        f"compression {compression_label(s)}"
    )


def split_label(s: dict[str, Any]) -> str:
    """An uneven pipeline split as first/last stage layers, e.g. (5..5); '' when even."""
    first, last = s.get("first_stage_layers"), s.get("last_stage_layers")
    if first is None and last is None:
        return ""
    return f"({'=' if first is None else first}..{'=' if last is None else last})"


def layout_label(c: dict[str, Any]) -> str:
    """A layout in a few characters: dp64 tp8 pp16 v2 z1 sel mb1."""
    s, lay = c["strategy"], c["layout"]
    parts = [f"dp{lay['dp']}"]
    parts += [f"tp{s['tp']}"] if s["tp"] > 1 else []
    parts += [f"pp{s['pp']}{split_label(s)}"] if s["pp"] > 1 else []
    parts += [f"ep{s['ep']}"] if s.get("ep", 1) > 1 else []
    parts += [f"v{s['interleave']}"] if s["interleave"] > 1 else []
    parts += [f"z{s['zero']}"] if s["zero"] else []
    parts += [s["recompute"][:3]] if s["recompute"] != "none" else []
    return " ".join([*parts, f"mb{lay['micro_batch']}"])


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
            _pct(c["mfu"]),
            f"+{100 * (c['step_time_s'] / best - 1):.1f}%",
        )
    return table


# The dimensions a plan explains: label, the strategy keys that change together, the value.
_DIMENSIONS = (
    ("tensor parallelism", ("tp",), lambda s: f"tp {s['tp']}"),
    ("pipeline depth", ("pp",), lambda s: f"pp {s['pp']}"),
    ("ZeRO stage", ("zero",), lambda s: f"ZeRO {s['zero']}"),
    ("recomputation", ("recompute",), lambda s: s["recompute"]),
    ("interleaving", ("interleave",), lambda s: f"v {s['interleave']}"),
    ("algorithm", ("algorithm",), lambda s: s["algorithm"]),
    ("bucket size", ("bucket_mb",), lambda s: f"{s['bucket_mb']:g} MiB"),
    ("overlap", ("overlap",), lambda s: "overlap on" if s["overlap"] else "overlap off"),
    ("placement", ("placement",), lambda s: s["placement"]),
    ("compression", ("compression", "error_feedback"), compression_label),
)


def explain_winner(candidates: Sequence[dict[str, Any]]) -> list[str]:
    """Plain sentences on why the best candidate wins: what each alternative dimension costs."""
    best = candidates[0]
    s = best["strategy"]
    lines = [
        f"Best: {describe_strategy(s)}: step {fmt_time(best['step_time_s'])}, compute "
        f"{fmt_time(best['compute_s'])}, communication {fmt_time(best['comm_s'])}"
        + (f" + {fmt_time(best['codec_s'])} encode/decode" if best["codec_s"] else "")
        + f", of which {fmt_time(best['exposed_comm_s'])} exposed "
        f"({_pct(best['overlap_ratio'])} hidden).",
        "  where the step goes: "
        + ", ".join(
            f"{label} {fmt_time(best[key])}"
            for key, label in (
                ("compute_s", "compute"),
                ("bubble_s", "pipeline bubble"),
                ("tp_comm_s", "tensor-parallel comm"),
                ("ep_comm_s", "expert-parallel all-to-all"),
                ("pp_comm_s", "pipeline sends"),
                ("dp_exposed_s", "exposed data-parallel comm"),
                ("exposed_comm_s", "exposed comm"),
                ("codec_s", "encode/decode"),
            )
            if best.get(key) and not (key == "exposed_comm_s" and "dp_exposed_s" in best)
        ),
    ]
    for label, keys, show in _DIMENSIONS:
        others = [
            c
            for c in candidates
            if c["strategy"][keys[0]] != s[keys[0]]
            and all(c["strategy"][k] == s[k] for k in s if k not in keys)
        ]
        if not others:
            continue
        alt = min(others, key=lambda c: c["step_time_s"])
        delta = alt["step_time_s"] - best["step_time_s"]
        value = show(alt["strategy"])
        lines.append(
            f"  best other {label} ({value}): +{fmt_time(delta)} per step, exposed comm "
            f"{fmt_time(alt['exposed_comm_s'])}."
        )
    return lines


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
        f"{fmt_time(pred['exposed_comm_s'])}, overlap {_pct(pred['overlap_ratio'])}"
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
            _pct(r["test_accuracy"]),
            _pct(r["accuracy_retained"]),
            f"{r['test_loss']:.4f}",
            f"{r['final_train_loss']:.4f}",
            f"{r['wire_bytes_per_step']:,}",
        )
    return table


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
    """Gantt chart of a pipelined step (commsim.pipeline events): a row per stage with its idle
    time hatched as the bubble, ZeRO-3 gathers and hidden dp sync on a thin row beneath."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commsim.pipeline import event_kind, event_stage, idle_gaps, pipeline_span

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
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.45 * len(shown)))
    edge = 0.2 if len(events) < 400 * p else 0.0  # white seams wash out thousands of bars
    for (y, h, kind), spans in bars.items():
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
        f"{fmt_time(pred['bubble_s'])} ({_pct(pred['bubble_s'] / pred['step_time_s'])})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sizing_table(rows: Sequence[Any], front: Sequence[Any], pick: Any, title: str) -> Table:
    """Per fabric and cluster size: the best strategy, time to train, GPU-hours, cost."""
    table = Table(title=title, title_justify="left")
    for col in (
        "fabric",
        "GPUs",
        "best layout",
        "step",
        "time to train",
        "GPU-hours",
        "cost",
        "scaling eff.",
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
            table.add_row(r.fabric, str(r.gpus), f"[dim]{r.note}[/dim]", *[""] * 7)
            continue
        t = p.training or {}
        d = p.to_dict()
        table.add_row(
            r.fabric,
            f"{r.gpus:,}",
            f"{layout_label(d)} {d['strategy']['algorithm']}",
            fmt_time(p.step_time_s),
            f"{t.get('time_to_train_s', 0) / 86400:.1f} d",
            f"{t.get('gpu_hours', 0):,.0f}",
            f"{t['cost']:,.0f}" if t.get("cost") is not None else "",
            _pct(p.scaling_efficiency),
            _pct(p.mfu),
            mark,
        )
    return table


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


PERCENT_METRICS = (
    "comm_share",
    "overlap_ratio",
    "scaling_efficiency",
    "mfu",
    "wire_ratio",
    "traffic_cut",
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
        return _pct(value)
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
