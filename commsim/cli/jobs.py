"""`commsim jobs`: several jobs on one fabric, each alone and sharing it (commsim.multijob)."""

from __future__ import annotations

from typing import Annotated

import typer

from commsim.report import terminal

AllocationOpt = Annotated[
    str | None,
    typer.Option(help="Override the file's allocation: packed, random or fragmented."),
]
SeedOpt = Annotated[int | None, typer.Option(help="Override the random allocation's seed.")]


def jobs_cmd(
    path: Annotated[str, typer.Argument(help="A jobs file: a cluster and its jobs (YAML).")],
    allocation: AllocationOpt = None,
    seed: SeedOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Each job's step time alone on the fabric and sharing it with the others' gradient
    traffic (max-min on the shared links), and the slowdown."""
    from commsim.multijob import load_jobs, run_jobs
    from commsim.topology.placement import ALLOCATIONS

    with terminal.user_errors():
        spec = load_jobs(path)
        if allocation is not None and allocation not in ALLOCATIONS:
            raise ValueError(f"--allocation {allocation}: choose from {', '.join(ALLOCATIONS)}")
        _check_seed(seed, allocation or spec.allocation)
        changes = {"allocation": allocation, "seed": seed}
        spec = spec.model_copy(update={k: v for k, v in changes.items() if v is not None})
        with terminal.progress(len(spec.jobs), "pricing jobs") as bar:
            results = run_jobs(spec, path, on_progress=lambda: bar.advance(0))
    cluster = spec.cluster if isinstance(spec.cluster, str) else spec.cluster.name
    if json_out:
        terminal.print_json(
            {
                "name": spec.name,
                "cluster": cluster,
                "allocation": spec.allocation,
                "jobs": [r.to_dict() for r in results],
            }
        )
        return
    terminal.console.print(_table(f"{spec.name}: {cluster}, {spec.allocation} allocation", results))


def _check_seed(seed: int | None, allocation: str) -> None:
    """--seed a non-negative integer, given only where the allocation is random (the others
    draw nothing: it would be ignored)."""
    if seed is None:
        return
    if seed < 0:
        raise ValueError(f"--seed {seed}: must be a non-negative integer")
    if allocation != "random":
        raise ValueError(
            f"--seed {seed}: only the random allocation draws nodes, this run's is {allocation} "
            "(give --allocation random)"
        )


def _table(title: str, results):
    """One row a job: size, pods spanned, layout, step alone and shared, slowdown."""
    from rich.table import Table

    from commsim.units import fmt_time

    table = Table(title=title, title_justify="left")
    for col in ("job", "GPUs", "pods", "layout", "alone", "shared", "slowdown"):
        table.add_column(col, justify="left" if col in ("job", "layout") else "right")
    for r in results:
        table.add_row(
            r.name,
            str(r.gpus),
            str(r.pods),
            _layout(r),
            fmt_time(r.alone.step_time_s),
            fmt_time(r.shared.step_time_s),
            f"{r.slowdown:.3f}x",
        )
    return table


def _layout(r) -> str:
    """A job's layout in a few words: its parallel degrees, ZeRO stage and algorithm."""
    s, layout = r.alone.strategy, r.alone.layout or {}
    degrees = f"tp {s.tp} pp {s.pp} dp {layout.get('dp', '?')}" + (
        f" cp {s.cp}" if s.cp > 1 else ""
    )
    return f"{degrees}, zero {s.zero}, {s.algorithm}"
