"""What `commsim calibrate` prints: a profile's link classes or NCCL fit, predicted against
measured, comm hooks' speedups, and a fit's notes and warnings (warnings in yellow on
stderr, so they are seen even when stdout is redirected)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from commsim.report import terminal
from commsim.units import fmt_bytes, fmt_time

if TYPE_CHECKING:
    from commsim.calibrate.hooks import HookRow
    from commsim.calibrate.validate import Validation
    from commsim.profile import Profile


def _rate(bps: float) -> str:
    """Bytes/s in the unit that keeps it readable (a testbed's links are MB/s)."""
    if bps == float("inf"):
        return "unbounded"
    return f"{bps / 1e6:.4g} MB/s" if bps < 1e9 else f"{bps / 1e9:.4g} GB/s"


def _span(ci: tuple[float, float] | None, fmt) -> str:
    return f"{fmt(ci[0])} .. {fmt(ci[1])}" if ci else "-"


def tier_table(profile: Profile) -> Table:
    """Each tier's class: alpha and efficiency (share of the line rate) with their 95%
    intervals, the bandwidth at the rate it was fitted at, and how many points."""
    table = Table(
        title=f"{profile.cluster}, {profile.backend}: fitted link classes", title_justify="left"
    )
    cols = ("tier", "alpha", "95% interval", "of line rate", "95% interval", "bandwidth", "points")
    for col in cols:
        table.add_column(col, justify="left" if col == "tier" else "right")
    for tier, f in profile.tiers.items():
        table.add_row(
            tier,
            fmt_time(f.alpha_s),
            _span(f.alpha_ci_s, fmt_time),
            f"{100 * f.efficiency:.1f}%",
            _span(f.efficiency_ci, lambda x: f"{100 * x:.1f}%"),
            f"{_rate(f.bandwidth_Bps)} of {_rate(f.line_rate_Bps)}",
            str(f.points),
        )
    return table


def nccl_table(cluster: str, profile: Profile) -> Table:
    """An NCCL fit: each parameter, its value and 95% interval, or NCCL's own kept."""
    fit = profile.nccl
    table = Table(title=f"{cluster}: NCCL {fit.version}'s model fitted", title_justify="left")
    for col in ("parameter", "value", "95% interval"):
        table.add_column(col, justify="left" if col == "parameter" else "right")
    for cls, value in fit.latency_scale.items():
        lo, hi = fit.latency_scale_ci.get(cls, (value, value))
        table.add_row(f"latency_scale.{cls} (x NCCL's)", f"{value:.3f}", f"{lo:.3f} .. {hi:.3f}")
    for side in ("intra", "inter"):
        value = getattr(fit, f"channel_bandwidth_{side}_Bps")
        if value is not None:
            ci = getattr(fit, f"channel_bandwidth_{side}_ci_Bps")
            table.add_row(f"channel_bandwidth_{side}", _rate(value), _span(ci, _rate))
    for name in fit.not_fitted:
        table.add_row(name, "NCCL's own", "-")
    return table


def print_profile(profile: Profile, output: str) -> None:
    """The fit's tables, its per-call overhead and compute rate, notes and warnings."""
    console = terminal.console
    console.print(nccl_table(profile.cluster, profile) if profile.nccl else tier_table(profile))
    if profile.nccl is None:
        ci = _span(profile.call_overhead_ci_s, fmt_time)
        how = (
            f"95%: {ci}; negative: the links give each call a head start"
            if profile.call_overhead_ci_s is not None
            else "the cluster's value: not fitted, see the notes"
        )
        console.print(
            f"per-call overhead {fmt_time(profile.call_overhead_s)} ({how})", highlight=False
        )
    if profile.compute:
        c = profile.compute
        console.print(
            f"compute: {c.flops_per_s / 1e9:.3g} GFLOP/s per rank ({c.model}), "
            f"{100 * c.efficiency:.1f}% of the {c.gpu} peak"
        )
    prov = profile.provenance
    console.print(
        f"{prov.points} points, rms relative error {100 * (prov.rms_rel_error or 0):.1f}%, "
        f"robust sd {100 * (prov.robust_sd or 0):.1f}%; profile written to {output}"
    )
    print_notes(profile.notes, profile.warnings)


def print_notes(notes: list[str], warnings: list[str] = ()) -> None:
    for note in notes:
        terminal.console.print(f"note: {note}", highlight=False)
    for warning in warnings:
        terminal.err_console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


def validation_table(checked: Validation, cluster: str) -> Table:
    """Every point: what, ranks, span, size, measured, predicted, error ('not modelled'
    for what commsim does not price as measured)."""
    table = Table(title=f"{cluster}: predicted vs measured", title_justify="left")
    for col in ("what", "ranks", "span", "size", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col in ("what", "span") else "right")
    for r in checked.rows:
        size = fmt_bytes(r.bytes) if r.bytes else f"{r.bucket_mb:g} MiB buckets"
        what = r.op if r.kind == "collective" else f"{r.op} {r.kind.removeprefix('ddp-')}"
        error = f"{100 * r.error:+.1f}%" + (" (not modelled)" if r.unmodelled else "")
        table.add_row(
            what,
            str(r.group_size),
            r.span,
            size,
            fmt_time(r.measured_s),
            fmt_time(r.predicted_s),
            error,
        )
    return table


def print_validation(checked: Validation, cluster: str) -> None:
    """The table, why points are not modelled, the summaries and the notes."""
    console = terminal.console
    console.print(validation_table(checked, cluster))
    for why in dict.fromkeys(r.unmodelled for r in checked.rows if r.unmodelled):
        n = sum(1 for r in checked.rows if r.unmodelled == why)
        console.print(f"not modelled ({n} points, not summarised): {why}", highlight=False)
    for kind, label in (("collective", "collectives"), ("ddp-step", "DDP step time")):
        s = checked.summary(kind)
        floored = kind == "collective" and checked.min_bytes > 0  # --min-bytes given
        floor = f" of {fmt_bytes(checked.min_bytes)} and more" if floored else ""
        if s["points"]:
            console.print(
                f"{label}{floor}: median |error| {s['median_abs_pct_error']:.1f}%, worst "
                f"{s['max_abs_pct_error']:.1f}% over {s['points']} points"
            )
        elif floor and any(r.kind == kind for r in checked.rows):
            console.print(f"{label}{floor}: none measured (--min-bytes), nothing summarised")
    print_notes(checked.notes)


def hook_table(rows: list[HookRow]) -> Table:
    """Each comm hook's step and speedup over plain DDP of the same bucket cap."""
    table = Table(title="DDP comm hooks: speedup over plain all-reduce", title_justify="left")
    cols = ("run", "buckets", "hook", "measured", "speedup", "predicted", "speedup")
    for col in (*cols, "error"):  # the hook's name on one line, whatever the page's width
        table.add_column(col, justify="left" if col in ("run", "hook") else "right", no_wrap=True)
    for h in rows:
        hook = h.compression + (" + EF" if h.error_feedback else "")
        table.add_row(
            h.run,
            f"{h.bucket_mb:g} MiB",
            hook + ("" if h.overlap else " (no overlap)"),
            fmt_time(h.measured_step_s),
            f"{h.measured_speedup:.2f}x",
            fmt_time(h.predicted_step_s),
            f"{h.predicted_speedup:.2f}x",
            f"{100 * h.error:+.1f}%",
        )
    return table
