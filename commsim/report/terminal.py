"""The terminal: consoles, the --json option every command takes, input errors as one line
and exit code 2, and progress bars on stderr."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

# Tables are laid out for 120 columns. A terminal gives its own width; piped output (CI
# logs, `| less`) gets COLUMNS when set, else 120 instead of rich's 80-column default.
PAGE_WIDTH = 120


def _width() -> int | None:
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PAGE_WIDTH


console = Console(width=_width())


err_console = Console(stderr=True)


# The --json option every command takes.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Input errors (a spec, a unit, a value) as one line on stderr and exit code 2. Warnings
    raised meanwhile (numpy's overflow on an input far out of range, on the way to that
    error) are held and shown only if the work succeeds: a refusal is its one line."""
    import warnings

    from commsim.specs import SpecError  # pydantic: imported when a command runs, not for --help
    from commsim.units import UnitError

    with warnings.catch_warnings(record=True) as held:
        warnings.simplefilter("default")  # each warning once a place, as Python shows them
        try:
            yield
        except (SpecError, UnitError, ValueError) as e:
            error_line(str(e))
            raise typer.Exit(2) from None
    for w in held:  # through the warnings filters again, as if never held
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def error_line(message: str) -> None:
    """One error line on stderr, the message as written (no rich markup: a pattern such as
    [a-z] must stay in it)."""
    from rich.text import Text

    err_console.print(Text("error: ", style="red") + Text(message), soft_wrap=True)


def _not_finite(obj: Any, path: str = "") -> str | None:
    """The path of the first number in a document that is NaN or infinite, else None."""
    if isinstance(obj, float) or getattr(obj, "ndim", None) == 0:  # numpy scalars too
        return None if math.isfinite(float(obj)) else path or "(the result)"
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = _not_finite(value, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def require_finite(doc: dict[str, Any], flags: str = "") -> None:
    """Refuse to show a result with a NaN or an infinity in it (an input so large that a
    figure overflows): a ValueError naming the figure, never a printed inf."""
    where = _not_finite(doc)
    if where:
        hint = f" (check {flags})" if flags else ""
        raise ValueError(f"{where} is not a finite number: an input is out of range{hint}")


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
        disable=not err_console.is_terminal,  # a log or pipe gets no bar (nor its blank line)
    )
    bar.add_task(label, total=total)
    return bar
