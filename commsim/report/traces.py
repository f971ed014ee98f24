"""Trace summaries as tables, and a traced step drawn beside commsim's replay of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from commsim.units import fmt_bytes, fmt_rate, fmt_time

if TYPE_CHECKING:
    from commsim.traces.graph import Graph
    from commsim.traces.kineto import RankTrace
    from commsim.traces.replay import Replay
    from commsim.traces.summary import Summary


def summary_tables(s: Summary) -> list[Table]:
    """Steps (each rank's), then collectives grouped by op, size and group size."""
    steps = Table(title="traced steps", title_justify="left")
    cols = ("rank", "step", "time", "compute", "busy", "comm", "exposed", "idle", "overlap")
    for c in cols:
        steps.add_column(c, justify="right")
    for f in s.steps:
        steps.add_row(
            str(f.rank),
            str(f.step),
            *(
                fmt_time(v)
                for v in (f.step_s, f.compute_s, f.busy_s, f.comm_s, f.exposed_comm_s, f.idle_s)
            ),
            f"{100 * f.overlap_ratio:.0f}%",
        )
    groups: dict[tuple, list] = {}
    for c in s.collectives:
        groups.setdefault((c.op, c.bytes, c.group_size), []).append(c)
    colls = Table(title="collectives (medians)", title_justify="left")
    for c in ("op", "size", "ranks", "count", "time", "algbw", "busbw"):
        colls.add_column(c, justify="left" if c == "op" else "right")
    for (op, size, n), rows in sorted(groups.items(), key=lambda x: (x[0][0], x[0][1] or 0)):
        mid = sorted(rows, key=lambda r: r.time_s)[len(rows) // 2]
        colls.add_row(
            op,
            fmt_bytes(size) if size is not None else "-",
            str(n) if n else "-",
            str(len(rows)),
            fmt_time(mid.time_s),
            fmt_rate(mid.algbw_Bps) if mid.algbw_Bps else "-",
            fmt_rate(mid.busbw_Bps) if mid.busbw_Bps else "-",
        )
    if not groups:  # an empty table says nothing: say that
        steps.caption = "no collectives traced"
        return [steps]
    return [steps, colls]


def plot_step(traces: list[RankTrace], graph: Graph, predicted: Replay, path: str) -> None:
    """Per rank two lanes, measured (compute, collectives) and commsim's replay on the
    cluster (compute nodes, collectives), on one time axis from the step's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from commsim.files import write_atomic
    from commsim.traces.imported import step_index
    from commsim.traces.intervals import clip
    from commsim.traces.summary import step_collectives

    number = int(graph.metadata["step"])
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.9 * len(traces)))
    labels = []
    for row, t in enumerate(traces):
        k = step_index(t, number)
        lo, hi = t.window(k)
        y = 2 * row
        for a, b in clip(t.compute, lo, hi).tolist():
            ax.barh(y + 1, (b - a) * 1e3, left=(a - lo) * 1e3, color="#4c72b0", height=0.35)
        for c in step_collectives(t, k):
            ax.barh(
                y + 0.6, c.duration * 1e3, left=(c.start - lo) * 1e3, color="#dd8452", height=0.35
            )
        for n in graph.ranks[t.rank]:
            a, b = predicted.start[(t.rank, n.id)], predicted.end[(t.rank, n.id)]
            if n.kind == "comp" and n.name == "idle":
                continue
            color = "#55a868" if n.kind == "comp" else "#c44e52"
            ax.barh(
                y + (0.2 if n.kind == "comp" else -0.2),
                (b - a) * 1e3,
                left=a * 1e3,
                color=color,
                height=0.35,
            )
        labels += [(y, f"rank {t.rank} commsim"), (y + 0.8, f"rank {t.rank} traced")]
    ax.set_yticks([p for p, _ in labels], [name for _, name in labels])
    ax.set_xlabel("ms from the step's start")
    ax.set_title(f"step {number}: traced (compute blue, comm orange) and commsim (green, red)")
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
