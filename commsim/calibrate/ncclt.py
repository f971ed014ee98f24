"""Read nccl-tests output (all_reduce_perf and its siblings) into calibration records.

The format is nccl-tests' stdout (src/util.cu in NVIDIA/nccl-tests, 2.x): header lines
starting with "#" ("# nccl-tests version 2.18.3 nccl-headers=23003 nccl-library=23003",
"# Collective test starting: all_reduce_perf", "# nThread ... iters: 20 ...", one
"#  Rank  R Group G Pid P on HOST device D [...] NAME" line per rank), the column header
"#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong" (padded
with spaces; out-of-place, then in-place), one row per size, then "# Out of bounds
values : 0 OK" and "# Avg bus bandwidth : X". Times are microseconds, bandwidths GB/s
(1e9 B/s); the size column is nccl-tests' S (all-gather: output, reduce-scatter: input,
alltoall: what a rank sends in all, sendrecv: what a rank sends). A log may hold several
tests; each becomes a run. Lines that are not nccl-tests' own (MPI or NCCL chatter) are
skipped, but a row cut short, a row with wrong elements, or a table format this reader
does not know is an error naming the file and line: a log that checked its data and found
it corrupt, or one from a version whose columns mean something else, must not turn into
calibration data.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commsim.calibrate.records import FORMAT_VERSION
from commsim.specs import SpecError

BINARIES = {
    "all_reduce_perf": "all-reduce",
    "all_gather_perf": "all-gather",
    "reduce_scatter_perf": "reduce-scatter",
    "broadcast_perf": "broadcast",
    "alltoall_perf": "all-to-all",
    "sendrecv_perf": "send-recv",
}
# The table this reader knows (nccl-tests 2.10 and later; `root` arrived in 2.10): size,
# count, type, redop, root, then time/algbw/busbw/#wrong out-of-place and in-place.
COLUMNS = ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "#wrong"] * 2
_VERSION = re.compile(r"^# nccl-tests version (\S+)(?:.*nccl-library=(\d+))?")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)")
_ITERS = re.compile(r"warmup iters:\s*(\d+)\s+iters:\s*(\d+)")
_NCCL = re.compile(r"^NCCL version (\S+)")
# NCCL_DEBUG=INFO's line for an override the job exported ("host:pid:tid [dev] NCCL INFO
# NCCL_ALGO set by environment to ring,tree"; src/misc/param.cc, tuning.cc): the runs were
# measured under it, so the fit prices them under it and the profile keeps it
_ENV = re.compile(r"NCCL INFO (NCCL_ALGO|NCCL_PROTO) set by environment to (\S+?)\.?$")


def nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE as x.y.z: x*10000 + y*100 + z from 2.9 on, x*1000 + y*100 + z
    before (nccl.h's NCCL_VERSION macro)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


@dataclass
class _Section:
    """One test's worth of a log."""

    start: int
    op: str | None = None
    tests_version: str | None = None
    nccl: str | None = None
    iters: int | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    nccl_env: dict[str, str] = field(default_factory=dict)  # NCCL_ALGO / NCCL_PROTO exported
    configured: bool = False  # its "# nThread" line was seen
    in_table: bool = False
    done: bool = False


def _op_from_name(name: str) -> str | None:
    stem = Path(name).name
    for binary, op in BINARIES.items():
        if binary in stem:
            return op
    return None


def _row(tokens: list[str], source: str, n: int) -> dict[str, Any]:
    """One data row, checked: 13 columns of the right types, no wrong elements."""
    where = f"line {n}"
    if len(tokens) < len(COLUMNS):
        raise SpecError(
            source, where, f"truncated row: {len(tokens)} of {len(COLUMNS)} columns: {tokens}"
        )
    try:
        size, count, root = int(tokens[0]), int(tokens[1]), int(tokens[4])
        time_us, algbw, busbw = (float(x) for x in tokens[5:8])
        in_time_us = float(tokens[9])
        wrong = [None if w == "N/A" else float(w) for w in (tokens[8], tokens[12])]
    except ValueError:
        raise SpecError(source, where, f"malformed row: {' '.join(tokens)}") from None
    if any(w for w in wrong if w is not None):
        raise SpecError(
            source,
            where,
            f"{max(w for w in wrong if w is not None):g} wrong elements at {size} B: the test "
            "found corrupt data; refusing to import it",
        )
    if size <= 0 or not all(math.isfinite(t) and t > 0 for t in (time_us, in_time_us)):
        raise SpecError(
            source,
            where,
            f"size {size} B and times {time_us} / {in_time_us} us must be positive and finite",
        )
    if not all(math.isfinite(b) and b >= 0 for b in (algbw, busbw)):
        raise SpecError(source, where, f"algbw {algbw} / busbw {busbw} GB/s: not a bandwidth")
    return {
        "size": size,
        "count": count,
        "type": tokens[2],
        "redop": tokens[3],
        "root": root,
        "time_s": time_us * 1e-6,
        "algbw_Bps": algbw * 1e9,
        "busbw_Bps": busbw * 1e9,
        "in_place_time_s": in_time_us * 1e-6,
    }


def _sections(text: str, source: str) -> list[_Section]:
    """Split a log into its tests and parse each; see the module docstring for the rules."""
    sections: list[_Section] = []
    cur: _Section | None = None
    lines = text.splitlines()
    for n, line in enumerate(lines, start=1):
        stripped = line.strip()
        nthread = stripped.startswith("# nThread")
        if stripped.startswith("# nccl-tests version") or (
            nthread and (cur is None or cur.configured or cur.in_table or cur.done)
        ):
            if cur is not None and cur.in_table:
                raise SpecError(
                    source, f"line {n}", f"the test from line {cur.start} ends without its summary"
                )
            cur = _Section(start=n)
            sections.append(cur)
        if cur is not None and nthread:
            cur.configured = True
        if cur is None:
            continue
        if m := _VERSION.match(stripped):
            major = m.group(1).split(".")[0]
            if major != "2":
                raise SpecError(
                    source, f"line {n}", f"nccl-tests version {m.group(1)}: this reader knows 2.x"
                )
            cur.tests_version = m.group(1)
            if m.group(2):
                cur.nccl = nccl_version(int(m.group(2)))
        elif stripped.startswith("# Collective test starting:"):
            cur.op = _op_from_name(stripped.split(":", 1)[1].strip())
        elif m := _ITERS.search(stripped):
            cur.iters = int(m.group(2))
        elif m := _RANK.match(stripped):
            rank, pid, host, device = m.groups()
            cur.ranks.append(
                {"rank": int(rank), "host": host, "local_rank": int(device), "pid": int(pid)}
            )
        elif (m := _NCCL.match(stripped)) and cur.nccl is None:
            cur.nccl = m.group(1).split("+")[0]
        elif m := _ENV.search(stripped):
            name, value = m.groups()
            if cur.nccl_env.setdefault(name, value) != value:
                raise SpecError(
                    source,
                    f"line {n}",
                    f"{name}={value}, but an earlier rank of this test says "
                    f"{cur.nccl_env[name]}: one test runs one setting",
                )
        elif stripped.startswith("#") and stripped[1:].split()[:1] == ["size"]:
            columns = stripped[1:].split()
            if columns[: len(COLUMNS)] != COLUMNS:
                raise SpecError(
                    source,
                    f"line {n}",
                    f"unsupported nccl-tests table (columns: {' '.join(columns)}); this "
                    f"reader knows nccl-tests 2.10+: {' '.join(COLUMNS)}",
                )
            cur.in_table = True
        elif stripped.startswith("# Out of bounds values") and "FAILED" in stripped:
            raise SpecError(source, f"line {n}", f"the test failed its data check: {stripped}")
        elif stripped.startswith("# Avg bus bandwidth"):
            if not cur.in_table:
                raise SpecError(source, f"line {n}", "results summary without a results table")
            cur.in_table, cur.done = False, True
        elif cur.in_table and re.match(r"^[-+]?\d", stripped):  # a sign: refused, not skipped
            cur.rows.append(_row(stripped.split(), source, n))
    if not sections or not any(s.rows for s in sections):
        raise SpecError(
            source, "", "no nccl-tests results table found (is this an nccl-tests log?)"
        )
    last = sections[-1]
    if not last.done:
        raise SpecError(
            source, f"line {len(lines)}", "the log ends inside a results table (truncated?)"
        )
    return [s for s in sections if s.rows]


def parse_log(path: str | Path, op: str | None = None) -> list[dict[str, Any]]:
    """The records of one nccl-tests log: per test a meta record, then one collective
    record per size (time: out-of-place). `op` names the test where the log does not (it
    overrides the file name's, and must agree with the log's own)."""
    source = str(path)
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise SpecError(source, "", "file not found") from None
    except OSError as e:
        raise SpecError(source, "", e.strerror or str(e)) from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    records: list[dict[str, Any]] = []
    for i, sec in enumerate(_sections(text, source)):
        if op is not None and sec.op is not None and op != sec.op:
            raise SpecError(f"--op {op}", "", f"{source} (line {sec.start}) says it tests {sec.op}")
        which = op or sec.op or _op_from_name(source)
        if which is None:
            raise SpecError(
                source,
                f"line {sec.start}",
                "cannot tell which test this is: the log does not say and the file name "
                f"names none of {', '.join(BINARIES)} (pass --op)",
            )
        world = len(sec.ranks)
        if world == 0 or sorted(r["rank"] for r in sec.ranks) != list(range(world)):
            raise SpecError(source, f"line {sec.start}", "no complete '#  Rank' list")
        run = f"nccl-tests-{digest}-{i}"
        versions = {"nccl-tests": sec.tests_version or "unknown", "nccl": sec.nccl or "unknown"}
        records.append(
            {
                "kind": "meta",
                "run": run,
                "format": FORMAT_VERSION,
                "source": "nccl-tests",
                "backend": "nccl",
                "world_size": world,
                "ranks": sec.ranks,
                "versions": versions,
                "nccl_env": sec.nccl_env,
                "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "file": source,
            }
        )
        for row in sec.rows:
            records.append(
                {
                    "kind": "collective",
                    "run": run,
                    "op": which,
                    "group": list(range(world)),
                    "status": "ok",
                    "bytes": float(row["size"]),
                    "time_s": row["time_s"],
                    "repeats": sec.iters,
                    "algbw_Bps": row["algbw_Bps"],
                    "busbw_Bps": row["busbw_Bps"],
                    "in_place_time_s": row["in_place_time_s"],
                    "dtype": row["type"],
                }
            )
    return records
