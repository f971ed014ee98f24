"""What `commsim plan` shows after a search: the ranked table (rows with the same figures
merged), why the winner wins, the counts as one story, where compression stops paying;
or the --json document; and the --csv rows and --html page."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.plan import PlanResult
    from commsim.planner.sweep import BandwidthSweep
    from commsim.scenario import Setup


def plan_doc(setup: Setup, result: PlanResult, sweep: BandwidthSweep | None) -> dict[str, Any]:
    """The --json document of a search: the candidates best first, the counts, the notes,
    and what changing the winner along each dimension would cost (`alternatives`)."""
    from commsim.report import labels

    ranked = [p.to_dict() for p in result.ranked]
    return {
        "scenario": setup.scenario.name,
        "gpus": setup.n_gpus,
        "candidates": ranked,
        "searched": result.searched,
        "fitting": result.fitting,
        "ranked": result.searched - result.skipped,
        "skipped": result.skipped,
        "notes": result.notes,
        "alternatives": labels.alternatives(ranked) if ranked else [],
        "bandwidth_sweep": sweep
        and {
            "nic_bandwidth_Bps": sweep.nic_bandwidth,
            "step_time_s": sweep.step_time,
            "crossover_Bps": sweep.crossovers,
        },
    }


def explain_empty(setup: Setup, pinned: set[str]) -> None:
    """When a search with pinned flags found nothing, the layout check says which flag
    cannot work here (a SpecError: exit 2 naming it); otherwise nothing."""
    from commsim.scenario import check_layout
    from commsim.specs import SpecError

    strategy = setup.scenario.strategy
    if "fsdp_shard" in pinned and "zero" not in pinned:  # the search took ZeRO-3 for it
        strategy = strategy.model_copy(update={"zero": 3})
    try:
        check_layout(setup, strategy)
    except SpecError as e:
        field = e.field.removeprefix("strategy.")
        if e.field == "strategy" or field in pinned:
            raise


def lines(setup: Setup, doc: dict[str, Any], top: int) -> tuple[list[Any], list[str]]:
    """The ranked table and the lines beneath it: settings every row shares, the counts,
    why the winner wins, the notes."""
    from commsim.report import labels, ranking

    rows = ranking.merge_rows(doc["candidates"])
    s = setup.scenario
    title = f"{labels.run_title(setup)}, global batch {s.global_batch:,}"
    table, same = ranking.plan_table(title, rows, top)
    merged = len(doc["candidates"]) - len(rows)
    story = ranking.plan_story(
        doc["searched"], doc["fitting"], doc["ranked"], merged, min(top, len(rows))
    )
    text = [same] if same else []
    text += [story, *labels.explain_winner(doc["candidates"]), *doc["notes"]]
    return [table], text


def show(setup: Setup, doc: dict[str, Any], top: int, sweep: Any, plot: str | None) -> None:
    """The table and its lines on the terminal; exit 1 when nothing can run."""
    if not doc["candidates"]:
        terminal.err_console.print("no strategy can run here:", highlight=False)
        for note in [*doc["notes"]]:
            terminal.err_console.print(f"  {note}", highlight=False)
        raise typer.Exit(1)
    tables, text = lines(setup, doc, top)
    for table in tables:
        terminal.console.print(table)
    for line in text:
        terminal.console.print(line, highlight=False)
    if sweep:
        for line in crossover_lines(sweep):
            terminal.console.print(line, highlight=False)
        terminal.console.print(f"bandwidth sweep drawn to {plot}", highlight=False)


def crossover_lines(sweep: BandwidthSweep) -> list[str]:
    """Where each compressor stops paying, from the bandwidth sweep."""
    out = [
        f"{name} stops paying above {bw * 8 / 1e9:,.0f} Gb/s per NIC"
        for name, bw in sweep.crossovers.items()
    ]
    if not sweep.crossovers:
        lo, hi = (b * 8 / 1e9 for b in (sweep.nic_bandwidth[0], sweep.nic_bandwidth[-1]))
        out.append(
            f"no compressor that pays here stops paying between {lo:g} and {hi:g} Gb/s per NIC"
        )
    return out


def write_files(
    setup: Setup,
    result: PlanResult,
    doc: dict[str, Any],
    top: int,
    flags: dict[str, Any],
    files: tuple[str | None, str | None],
    sweep: Any,
) -> None:
    """--csv: one row per kept candidate; --html: the table, its lines, the winner's step,
    the sweep, the inputs."""
    from commsim.cli.predict import draw
    from commsim.report import labels, pages
    from commsim.report.html import Report, figure_png
    from commsim.report.rows import write_csv
    from commsim.report.sweeps import plot_bandwidth_sweep

    csv, html = files
    if csv:
        write_csv(csv, doc["candidates"])
    if not html:
        return
    report = Report(f"commsim plan: {labels.run_title(setup)}")
    if doc["candidates"]:
        tables, text = lines(setup, doc, top)
        for table in tables:
            report.table(table)
        report.lines(text)
        best = doc["candidates"][0]
        png = figure_png(lambda p: draw(setup, best, result.ranked[0], p))
        report.figure(png, "the winner's step")
    else:
        report.lines(["no strategy can run here", *doc["notes"]])
    if sweep:
        title = f"{labels.run_title(setup)}: where compression stops paying"
        png = figure_png(lambda p: plot_bandwidth_sweep(sweep, p, title))
        report.figure(png, "the winner's step time against NIC bandwidth per compressor")
        report.lines(crossover_lines(sweep))
    pages.inputs(report, setup, flags)
    report.write(html)


def write_sizing(
    rows: list[Any],
    front: list[Any],
    pick: Any,
    title: str,
    deadline_s: float | None,
    csv: str | None,
    html: str | None,
    flags: dict[str, Any],
) -> None:
    """Cluster sizing's --csv (one row per fabric and size) and --html (the table, the
    scaling curve and Pareto front, the flags)."""
    import yaml

    from commsim.report import tables
    from commsim.report.html import Report, figure_png
    from commsim.report.rows import write_csv
    from commsim.report.sweeps import plot_sizing

    if csv:
        write_csv(csv, [r.to_dict() for r in rows])
    if not html:
        return
    report = Report(f"commsim plan: {title}")
    for table in tables.sizing_tables(rows, front, pick, title):
        report.table(table)
    png = figure_png(lambda p: plot_sizing(rows, front, pick, p, title, deadline_s))
    report.figure(png, "time to train and scaling efficiency against GPUs; the Pareto front")
    report.heading("Inputs")
    given = {k: v for k, v in flags.items() if v is not None}
    report.code(yaml.safe_dump({"flags": given}, sort_keys=False))
    report.write(html)
