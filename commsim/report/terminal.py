"""The terminal: consoles, the --json option every command takes, input errors as one line
and exit code 2, and progress bars on stderr."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

# Piped output (CI logs, `| less`) gets a wide page instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)


err_console = Console(stderr=True)


# The --json option every command takes.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Input errors (a spec, a unit, a value) as one line on stderr and exit code 2."""
    from commsim.specs import SpecError  # pydantic: imported when a command runs, not for --help
    from commsim.units import UnitError

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


def progress(total: int, label: str) -> Progress:
    """A progress bar on stderr, shown only if the work lasts over a second."""
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    bar.add_task(label, total=total)
    return bar
