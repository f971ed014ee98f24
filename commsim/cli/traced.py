"""`--trace` on predict and plan: a traced workload's compute in place of the model's
(traces.workload), the traced layout given by --trace-tp and --trace-pp."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.scenario import Setup

TraceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--trace",
        help="PyTorch profiler traces (a path or a quoted glob, repeatable) whose measured "
        "compute replaces the model's.",
    ),
]
TraceTpOpt = Annotated[int | None, typer.Option(help="Tensor-parallel degree traced (1).")]
TracePpOpt = Annotated[int | None, typer.Option(help="Pipeline stages traced (1).")]
TraceMbOpt = Annotated[
    int | None, typer.Option(help="Micro-batch traced (default: the scenario's).")
]

TRACE_FLAGS = ("trace", "trace_tp", "trace_pp", "trace_micro_batch")


def trace_paths(patterns: list[str]) -> list[str]:
    """Each --trace value as itself, or the files its glob matches (sorted)."""
    from glob import glob

    from commsim.specs import SpecError

    out: list[str] = []
    for p in patterns:
        found = sorted(glob(p)) if any(ch in p for ch in "*?[") else [p]
        if not found:
            raise SpecError("--trace", "", f"{p!r} matches no file")
        out += found
    return out


def with_trace(
    setup: Setup, patterns: list[str] | None, tp: int | None, pp: int | None, mb: int | None
) -> tuple[Setup, dict | None]:
    """The setup computing at the traced rate and the `trace` section of the output (None
    without --trace); --trace-tp/-pp/-micro-batch without --trace are refused, not ignored."""
    from commsim.specs import SpecError

    given = (("--trace-tp", tp), ("--trace-pp", pp), ("--trace-micro-batch", mb))
    for flag, value in given:
        if value is not None and not patterns:
            raise SpecError(flag, "", "needs --trace")
        if value is not None and value < 1:
            raise SpecError(flag, "", f"{value} is not a positive number")
    if not patterns:
        return setup, None
    from commsim.traces.kineto import read_traces
    from commsim.traces.workload import apply, read_workload

    read = read_traces(trace_paths(patterns))
    return apply(setup, read_workload(read, tp or 1, pp or 1, mb))


def print_trace(doc: dict | None) -> None:
    """What a prediction took from the trace and what it assumed, one line each."""
    if doc is None:
        return
    for line in doc["taken"]:
        terminal.console.print(f"from the trace: {line}", highlight=False)
    for line in doc["assumed"]:
        terminal.console.print(f"assumed: {line}", highlight=False)
