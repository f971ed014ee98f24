"""`plan`'s ranking as a reader takes it in: rows that differ in nothing that matters merged
(ring and tree for a ZeRO layout whose data-parallel traffic is reduce-scatter/all-gather:
the same figures), columns that are the same in every shown row said once beneath the
table instead of repeated, and the counts told as one story."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from commsim.report.labels import bucket_label, compression_label, layout_label, pct
from commsim.units import fmt_time

# the strategy settings a row shows, and how each is written
SETTINGS = (
    ("algorithm", lambda s: s["algorithm"]),
    ("bucket MiB", lambda s: bucket_label(s, none="-", unit="")),
    ("overlap", lambda s: "on" if s["overlap"] else "off"),
    ("placement", lambda s: s["placement"]),
    ("compression", compression_label),
)
# the strategy fields those settings write: the only ones two merged rows may differ in
MERGEABLE = {"algorithm", "bucket_mb", "overlap", "placement", "compression", "error_feedback"}
# the figures that make two rows the same row (a strategy setting that changes none of them
# does not matter here)
FIGURES = ("step_time_s", "exposed_comm_s", "bubble_s", "comm_s", "mfu")


def _key(c: dict[str, Any]) -> tuple:
    """Rows with equal keys merge: the same layout (every strategy field but the settings
    above: degrees, rank order, sharding, precision, TP overlap, FlashAttention, ...), the
    same memory and the same figures."""
    layout = tuple(sorted((k, repr(v)) for k, v in c["strategy"].items() if k not in MERGEABLE))
    figures = tuple(round(float(c.get(k) or 0.0), 15) for k in FIGURES)
    return (layout_label(c), layout, round(c["memory"]["total_bytes"]), *figures)


def merge_rows(candidates: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates, best first, with every row whose figures equal an earlier row's
    folded into it: its settings are listed as alternatives ("ring|tree"). Each row
    gets `shown` (setting -> text) and `merged` (how many rows it stands for)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for c in candidates:
        shown = {name: show(c["strategy"]) for name, show in SETTINGS}
        row = rows.get(_key(c))
        if row is None:
            rows[_key(c)] = c | {"shown": {k: [v] for k, v in shown.items()}, "merged": 1}
            continue
        row["merged"] += 1
        for k, v in shown.items():
            if v not in row["shown"][k]:
                row["shown"][k].append(v)
    for row in rows.values():
        row["shown"] = {k: "|".join(v) for k, v in row["shown"].items()}
    return list(rows.values())


def plan_table(title: str, rows: Sequence[dict[str, Any]], top: int) -> tuple[Table, str]:
    """The best `top` merged rows; a setting or figure the same in all of them becomes a
    column only when it varies, else part of the line returned beneath the table."""
    shown = list(rows[:top])
    best = shown[0]["step_time_s"]
    columns: list[tuple[str, bool, Any]] = [
        ("#", False, lambda i, r: str(i)),
        ("layout", True, lambda i, r: layout_label(r)),
        *((name, True, lambda i, r, n=name: r["shown"][n]) for name, _ in SETTINGS),
        ("tp overlap", True, lambda i, r: _tp_overlap(r["strategy"])),
        ("step", False, lambda i, r: fmt_time(r["step_time_s"])),
        ("exposed", False, lambda i, r: fmt_time(r["exposed_comm_s"])),
        ("bubble", False, lambda i, r: fmt_time(r.get("bubble_s", 0.0))),
        ("memory", False, lambda i, r: f"{r['memory']['total_bytes'] / 1e9:.1f} GB"),
        ("MFU", False, lambda i, r: pct(r["mfu"])),
        ("vs best", False, lambda i, r: f"+{100 * (r['step_time_s'] / best - 1):.1f}%"),
    ]
    cells = [[show(i, r) for _, _, show in columns] for i, r in enumerate(shown, 1)]
    keep = [
        k
        for k, (name, _, _) in enumerate(columns)
        if name in ("#", "layout", "step") or len(shown) == 1 or len({c[k] for c in cells}) > 1
    ]
    same = [
        f"{columns[k][0]} {cells[0][k]}"
        for k in range(len(columns))
        if k not in keep and columns[k][0] != "vs best" and cells[0][k]
    ]
    table = Table(title=title, title_justify="left")
    for k in keep:
        name, left, _ = columns[k]
        if name == "layout":  # the one column that folds when the page is too narrow
            table.add_column(name, overflow="fold")
            continue
        widest = max(len(row[k]) for row in cells)  # a figure is never cut
        table.add_column(name, justify="left" if left else "right", min_width=widest)
    for row in cells:
        table.add_row(*(row[k] for k in keep))
    return table, ("every row: " + ", ".join(same)) if same else ""


def _tp_overlap(strategy: dict[str, Any]) -> str:
    """Tensor-parallel comm under the GEMMs, on or off; blank without tensor parallelism."""
    if strategy.get("tp", 1) == 1:
        return ""
    return "on" if strategy.get("tp_overlap") else "off"


def plan_story(searched: int, fitting: int, ranked: int, merged: int, shown: int) -> str:
    """The counts in one sentence: searched, left out for memory, not runnable, ranked,
    merged (of the kept predictions), shown."""
    parts = [f"{searched:,} layouts searched"]
    if searched > fitting:
        parts.append(f"{searched - fitting:,} do not fit in GPU memory")
    if fitting > ranked:
        parts.append(f"{fitting - ranked:,} cannot run their algorithm on their groups")
    text = ", ".join(parts) + f"; {ranked:,} ranked"
    if merged > 0:
        text += f", {merged:,} of them merged into rows with the very same figures"
    return text + f"; the best {shown:,} shown"
