"""Measurements from any tool, as results records: a CSV or JSON table of collectives.

One row (CSV, with a header) or object (a JSON list) per measured collective, fields:

- op: all-reduce, all-gather, reduce-scatter, broadcast, all-to-all or send-recv
- bytes: its size by nccl-tests' convention (all-gather's output, reduce-scatter's input,
  what a rank sends in all in an all-to-all), a number or "4MiB"
- world: how many ranks ran it (all of them: the group is the whole world)
- placement: where each rank ran, in rank order, separated by spaces: `rack/host` (or just
  `host`, when racks are not known); e.g. "r0/a r0/b r1/c r1/d"
- time_s: seconds (the median over repeats, in the timing convention)
- timing: whose clock: slowest-rank (when the last rank finished), rank0 (the first
  rank's time, as many tools print it), or per-rank (rank_times_s gives every rank's)
- rank_times_s: with per-rank, each rank's seconds in rank order, separated by spaces
- backend (optional, else --backend): gloo or nccl; repeats (optional): how many repeats

Rows of one placement and backend become one run (a `meta` record naming the tool as its
source, then its `collective` records), so fits and validation place them as harness runs;
a run's id comes from the tables' content, so importing them twice is refused.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from commsim.calibrate.records import (
    FORMAT_VERSION,
    TIMINGS,
    CollectiveRecord,
    MetaRecord,
    error_text,
)
from commsim.collectives.backends import ALGORITHMS as BACKEND_ALGORITHMS
from commsim.specs import SpecError
from commsim.units import UnitError, parse_bytes

REQUIRED = ("op", "bytes", "world", "placement", "timing")
COLUMNS = (*REQUIRED, "time_s", "rank_times_s", "backend", "repeats")
BACKENDS = tuple(BACKEND_ALGORITHMS)  # the backends commsim prices: gloo, nccl


def _rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, fields) of each measurement in a CSV or JSON file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(str(path), "", "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), "", f"cannot read: {e}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(str(path), f"line {e.lineno}", f"invalid JSON: {e.msg}") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise SpecError(str(path), "", "expected a JSON list of objects, one a measurement")
        return [(f"item {i}", r) for i, r in enumerate(data)]
    if path.suffix.lower() != ".csv":
        raise SpecError(str(path), "", "expected a .csv or .json file")
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in REQUIRED if f not in (reader.fieldnames or [])]
    if missing:
        raise SpecError(
            str(path), "header", f"no {missing[0]!r} column (needs {', '.join(REQUIRED)})"
        )
    rows = []
    for r in reader:
        where, header = f"line {reader.line_num}", len(reader.fieldnames or [])
        if None in r:  # csv.DictReader's key for the values past the header's columns
            raise SpecError(
                str(path),
                where,
                f"{header + len(r[None])} values for the header's {header} columns",
            )
        rows.append((where, dict(r)))
    return rows


def _numbers(text: Any, what: str) -> list[float]:
    values = text if isinstance(text, list) else str(text).split()
    try:
        out = [float(v) for v in values]
    except ValueError:
        raise ValueError(f"{what}: expected numbers separated by spaces, got {text!r}") from None
    if not out or not all(math.isfinite(v) and v > 0 for v in out):
        raise ValueError(f"{what}: expected positive seconds, got {text!r}")
    return out


def _size(value: Any) -> float:
    try:
        return parse_bytes(value if isinstance(value, (int, float)) else str(value).strip())
    except UnitError as e:
        raise ValueError(f"bytes: {e}") from None


def _hosts(placement: Any, world: int) -> list[dict[str, Any]]:
    """RankInfo fields of each rank from a placement string."""
    hosts = str(placement).split()
    if len(hosts) != world:
        raise ValueError(f"placement names {len(hosts)} ranks for world {world}")
    ranks = []
    for rank, where in enumerate(hosts):
        rack, _, host = where.rpartition("/")
        ranks.append({"rank": rank, "host": host, "rack": rack or None})
    if len({r["rack"] is None for r in ranks}) > 1:
        raise ValueError("placement gives racks for some ranks and not others")
    return ranks


def _whole(fields: dict[str, Any], key: str) -> int:
    """A count field (world, repeats): a whole number, 1 or more."""
    try:
        value = int(str(fields[key]).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{key}: expected a whole number >= 1, got {fields[key]!r}")
    return value


def _columns(fields: dict[str, Any]) -> None:
    """Every field one this reader knows: a misspelt or unit-suffixed column (time_us) is
    refused, not silently dropped."""
    unknown = [k for k in fields if k not in COLUMNS]
    if unknown:
        raise ValueError(f"{unknown[0]}: not a column this reader knows ({', '.join(COLUMNS)})")


def _measurement(fields: dict[str, Any], backend: str | None) -> tuple[tuple, dict[str, Any]]:
    """(run key: placement and backend, collective record fields) of one row."""
    _columns(fields)
    missing = [f for f in REQUIRED if fields.get(f) in (None, "")]
    if missing:
        raise ValueError(f"{missing[0]}: missing")
    world = _whole(fields, "world")
    if fields["timing"] not in TIMINGS:
        raise ValueError(f"timing: {fields['timing']!r} is not one of {', '.join(TIMINGS)}")
    ranks = _hosts(fields["placement"], world)
    rec: dict[str, Any] = {
        "kind": "collective",
        "op": fields["op"],
        "group": list(range(world)),
        "bytes": _size(fields["bytes"]),
        "timing": fields["timing"],
    }
    if fields.get("rank_times_s") not in (None, ""):
        rec["rank_times_s"] = _numbers(fields["rank_times_s"], "rank_times_s")
    if fields.get("time_s") not in (None, ""):
        rec["time_s"] = _numbers(fields["time_s"], "time_s")[0]
    elif "rank_times_s" in rec:
        rec["time_s"] = max(rec["rank_times_s"])
    slowest = max(rec.get("rank_times_s") or [0.0])
    if rec["timing"] == "per-rank" and not math.isclose(rec.get("time_s", slowest), slowest):
        raise ValueError(  # per-rank points are read from rank_times_s: another time is lost
            f"time_s: {rec['time_s']:g} s is not the slowest of rank_times_s ({slowest:g} s), "
            "which per-rank timing reads; leave time_s empty"
        )
    if fields.get("repeats") not in (None, ""):
        rec["repeats"] = _whole(fields, "repeats")
    which = fields.get("backend") or backend
    if not which:
        raise ValueError("backend: missing (give a backend column or --backend)")
    if which not in BACKENDS:
        raise ValueError(f"backend: {which!r} is not one of {', '.join(BACKENDS)}")
    key = (tuple((r["rack"], r["host"]) for r in ranks), which)
    return key, rec


def import_table(
    paths: list[str], backend: str | None = None, tool: str = "import"
) -> list[dict[str, Any]]:
    """Results records (meta, then collective, per run) from measurement tables; a bad
    row is a SpecError naming its file, row and field."""
    if backend is not None and backend not in BACKENDS:
        raise SpecError("--backend", "", f"{backend!r} is not one of {', '.join(BACKENDS)}")
    runs: dict[tuple, list[dict[str, Any]]] = {}
    digest = hashlib.sha1()
    for name in paths:
        path = Path(name)
        rows = _rows(path)
        digest.update(json.dumps(rows, sort_keys=True).encode())
        for where, fields in rows:
            try:
                key, rec = _measurement(fields, backend)
                CollectiveRecord.model_validate(rec | {"run": "check"})
            except ValueError as e:
                text = error_text(e) if isinstance(e, ValidationError) else str(e)
                raise SpecError(name, where, text) from None
            runs.setdefault(key, []).append(rec)
    records: list[dict[str, Any]] = []
    for k, (key, recs) in enumerate(runs.items()):
        placement, which = key
        run = f"import-{digest.hexdigest()[:10]}-{k}"  # the same tables give the same runs
        meta = {
            "kind": "meta",
            "run": run,
            "format": FORMAT_VERSION,
            "source": tool,
            "backend": which,
            "world_size": len(placement),
            "ranks": [
                {"rank": i, "host": host, "rack": rack} for i, (rack, host) in enumerate(placement)
            ],
            "file": ", ".join(paths),
        }
        MetaRecord.model_validate(meta)
        records += [meta, *({"run": run} | r for r in recs)]
    if not records:
        raise SpecError(", ".join(paths), "", "no measurements in the file")
    return records
