"""Tabular results as CSV: one header row of the keys, one line per row; nested values
(a strategy, a memory breakdown) flattened to dotted keys."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

from commsim.files import write_atomic


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"memory": {"total_bytes": 1}} as {"memory.total_bytes": 1}; lists are left out
    (per-bucket or per-stage detail belongs in --json)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= flatten(value, f"{name}.")
        elif not isinstance(value, (list, tuple)):
            out[name] = value
    return out


def write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """The rows as one CSV file, written whole or not at all; the columns are every key
    any row has, in first-seen order."""
    flat = [flatten(r) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    write_atomic(path, buf.getvalue())
