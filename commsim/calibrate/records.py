"""Calibration data: the JSONL records a measurement appends.

A results file holds one JSON object per line; `kind` says what it is, `run` ties it to
its run. Every run starts with a `meta` record (backend, world size, where each rank ran,
versions), then `collective` records (one per op, group and size: the median time over
repeats in its timing convention, its p10/p90, each repeat's time and each rank's median),
a `model` and `ddp` records (the data-parallel step per bucket size), and an `end` record
when it finishes or fails. A `link-check` record (`commsim testbed check --out`) stands
alone: the TCP goodput the testbed's links gave. Files are only ever appended to.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from commsim.profile import Op
from commsim.specs import Compression, SpecError

FORMAT_VERSION = 1  # the `format` of meta records this reader understands


class Record(BaseModel):
    """Fields every record has. Unknown fields are ignored, so newer writers stay readable."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    kind: str
    run: str = Field(min_length=1)


class RankInfo(BaseModel):
    """Where one rank ran: host (COMMSIM_HOST or hostname), rack (COMMSIM_RACK, if known)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    rank: int = Field(ge=0)
    host: str
    rack: str | None = None
    local_rank: int | None = None
    pid: int | None = None


class MetaRecord(Record):
    """The start of a run: who measured, with what, where each rank ran."""

    kind: Literal["meta"]
    format: int = FORMAT_VERSION
    source: str = Field(min_length=1)  # harness, nccl-tests, or the tool an import names
    backend: str
    world_size: int = Field(ge=1)
    ranks: list[RankInfo]
    versions: dict[str, str] = {}
    nccl_env: dict[str, str] = {}  # NCCL_ALGO / NCCL_PROTO the run exported (its NCCL log)
    timestamp: str = ""
    file: str | None = None  # the log a record was imported from

    @model_validator(mode="after")
    def _check(self) -> MetaRecord:
        if self.format != FORMAT_VERSION:
            raise ValueError(f"format {self.format} (this commsim reads {FORMAT_VERSION})")
        if sorted(r.rank for r in self.ranks) != list(range(self.world_size)):
            raise ValueError(f"ranks must list each of 0..{self.world_size - 1} once")
        return self

    @property
    def hosts(self) -> list[str]:
        """Hosts in order of their first rank."""
        return list(dict.fromkeys(r.host for r in sorted(self.ranks, key=lambda r: r.rank)))


# Whose clock a time is: the slowest rank's (the collective is done everywhere: what commsim
# predicts), the group's first rank's (what many tools print; a broadcast's root returns once
# its sends are handed to the transport), or every rank's (rank_times_s; time_s their maximum).
Timing = Literal["slowest-rank", "rank0", "per-rank"]
TIMINGS: tuple[str, ...] = Timing.__args__  # type: ignore[attr-defined]


class CollectiveRecord(Record):
    """One op on one group at one size (nccl-tests' size: all-gather output, reduce-scatter
    input, all-to-all what a rank sends in all); time_s is the median over repeats in the
    `timing` convention; times_s each repeat's time in it, rank_times_s each group rank's
    median; status "unsupported" marks an op the backend lacks."""

    kind: Literal["collective"]
    op: Op
    group: list[int] = Field(min_length=1)  # world ranks, in group rank order
    status: Literal["ok", "unsupported"] = "ok"
    bytes: float | None = Field(default=None, gt=0)
    time_s: float | None = Field(default=None, gt=0)
    timing: Timing = "slowest-rank"
    times_s: list[Annotated[float, Field(gt=0)]] | None = None
    rank_times_s: list[Annotated[float, Field(gt=0)]] | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    repeats: int | None = Field(default=None, ge=1)
    algbw_Bps: float | None = None
    busbw_Bps: float | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _check(self) -> CollectiveRecord:
        if self.status == "ok" and (self.bytes is None or self.time_s is None):
            raise ValueError("a measured collective needs bytes and time_s")
        if len(set(self.group)) != len(self.group):
            raise ValueError("group lists a rank twice")
        if self.rank_times_s is not None and len(self.rank_times_s) != len(self.group):
            raise ValueError(
                f"rank_times_s has {len(self.rank_times_s)} times for {len(self.group)} ranks"
            )
        if self.timing == "per-rank" and self.rank_times_s is None:
            raise ValueError("timing per-rank needs rank_times_s (each group rank's time)")
        return self


class LayerRecord(BaseModel):
    """One layer of the harness model: parameter tensors (registration order), forward
    FLOPs per sample (a multiply-add is 2), and measured seconds per step (slowest rank)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    name: str
    tensors: list[int]
    shapes: list[list[int]] | None = None  # each tensor's shape (older files: none)
    forward_flops: float = Field(ge=0)
    forward_s: float = Field(ge=0)
    backward_s: float = Field(ge=0)


class ModelRecord(Record):
    """The harness's DDP model, layer by layer, as commsim can rebuild it (a Workload)."""

    kind: Literal["model"]
    name: str
    batch: int = Field(ge=1)  # samples per rank per step
    dtype: str = "float32"
    layers: list[LayerRecord] = Field(min_length=1)


class DDPRecord(Record):
    """One bucket size and comm hook: compute alone (no_sync: forward, backward, optimizer;
    no communication) and the full step with DDP's overlapped all-reduces, medians and
    p10/p90 over repeats of the slowest rank. exposed_comm_s is the time the rank spends on
    communication instead of computing, by `exposed_by`: "commclock", the harness's hooks in
    the full steps themselves (calibrate.harness.commclock; CPU ranks), or
    "step-minus-compute", step_s - compute_s (CUDA ranks, and files before the clock)."""

    kind: Literal["ddp"]
    bucket_mb: float = Field(gt=0)
    first_bucket_mb: float = Field(gt=0)
    compute_s: float = Field(gt=0)
    compute_p10_s: float | None = None
    compute_p90_s: float | None = None
    optimizer_s: float = Field(ge=0)
    step_s: float = Field(gt=0)
    step_p10_s: float | None = None
    step_p90_s: float | None = None
    exposed_comm_s: float
    exposed_by: Literal["commclock", "step-minus-compute"] = "step-minus-compute"
    repeats: int = Field(ge=1)
    buckets_bytes: list[int] | None = None  # DDP's own bucket sizes, when torch reports them
    # DDP's own buckets as parameter indices (registration order), in launch order
    buckets_params: list[list[int]] | None = None
    # the comm hook the step ran, spelled as a strategy's compression (older files: none)
    compression: Compression = "none"
    error_feedback: bool = False
    overlap: bool = True  # False: the hook exchanged one bucket at a time after backward


class EndRecord(Record):
    """How a run ended; a failed run says why (which rank, doing what); an interrupted one
    was stopped by a signal to its launcher (what it measured before stays)."""

    kind: Literal["end"]
    status: Literal["complete", "failed", "interrupted"]
    message: str = ""
    elapsed_s: float | None = None


class LinkRow(BaseModel):
    """One link class of a link check: its name (goodput.check's), the tier its flows
    cross (None: a check of the host's CPU, not of a tier), how many flows shared the rack
    uplink, the rate it was shaped to per flow, and each flow's measured TCP goodput."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    link: str
    tier: Literal["inter-node", "cross-rack"] | None = None
    sharing: int = Field(default=1, ge=1)
    shaped_Bps: float = Field(gt=0)
    measured_Bps: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)


class LinkCheckRecord(Record):
    """A testbed's own link check (`commsim testbed check --out`): per link class, the TCP
    goodput each flow measured; a fit compares its bandwidths with them."""

    kind: Literal["link-check"]
    testbed: str
    links: list[LinkRow] = Field(min_length=1)


RECORD_TYPES: dict[str, type[Record]] = {
    "meta": MetaRecord,
    "collective": CollectiveRecord,
    "model": ModelRecord,
    "ddp": DDPRecord,
    "end": EndRecord,
    "link-check": LinkCheckRecord,
}


@dataclass
class Run:
    """Everything one run recorded, and the line of its meta record."""

    meta: MetaRecord
    line: int
    collectives: list[tuple[int, CollectiveRecord]] = field(default_factory=list)
    model: ModelRecord | None = None
    ddp: list[DDPRecord] = field(default_factory=list)
    end: EndRecord | None = None


@dataclass
class Results:
    """The runs of one or more results files, by run id, in file order."""

    files: list[str]
    runs: dict[str, Run]
    link_checks: list[LinkCheckRecord] = field(default_factory=list)

    def where(self, run_id: str) -> str:
        """A run as an error names it: its files and the line of its meta record."""
        return f"{', '.join(self.files)}: line {self.runs[run_id].line} (run {run_id})"

    @property
    def backends(self) -> set[str]:
        return {r.meta.backend for r in self.runs.values()}


def error_text(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def parse_record(data: Any, source: str, line: int) -> Record:
    """Validate one decoded JSON line as the record its `kind` names."""
    where = f"line {line}"
    if not isinstance(data, dict):
        raise SpecError(source, where, f"expected a JSON object, got {type(data).__name__}")
    cls = RECORD_TYPES.get(data.get("kind"))  # type: ignore[arg-type]
    if cls is None:
        known = ", ".join(RECORD_TYPES)
        raise SpecError(source, where, f"unknown record kind {data.get('kind')!r} ({known})")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, where, f"bad {data['kind']} record: {error_text(e)}") from None


def read_results(paths: str | Path | Iterable[str | Path]) -> Results:
    """Read results files into runs; any malformed or truncated line is a SpecError naming
    the file and line (a run killed mid-write leaves its last line cut short)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    runs: dict[str, Run] = {}
    checks: list[LinkCheckRecord] = []
    for path in paths:
        source = str(path)
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise SpecError(source, "", "file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(source, "", f"cannot read: {e}") from None
        for n, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as e:
                cut = " (truncated line?)" if n == len(text.splitlines()) else ""
                raise SpecError(source, f"line {n}", f"invalid JSON{cut}: {e.msg}") from None
            rec = parse_record(data, source, n)
            if isinstance(rec, LinkCheckRecord):
                checks.append(rec)
            else:
                _add(runs, rec, source, n)
    if not runs:
        raise SpecError(", ".join(map(str, paths)), "", "no measurements in the file")
    return Results(files=[str(p) for p in paths], runs=runs, link_checks=checks)


def _add(runs: dict[str, Run], rec: Record, source: str, line: int) -> None:
    """File one record under its run, checking it belongs to a run that began earlier."""
    where = f"line {line}"
    if isinstance(rec, MetaRecord):
        if rec.run in runs:
            raise SpecError(source, where, f"run {rec.run!r} starts twice (appended twice?)")
        runs[rec.run] = Run(meta=rec, line=line)
        return
    run = runs.get(rec.run)
    if run is None:
        raise SpecError(source, where, f"{rec.kind} record of run {rec.run!r} before its meta")
    if isinstance(rec, CollectiveRecord):
        bad = [r for r in rec.group if r >= run.meta.world_size]
        if bad:
            raise SpecError(
                source, where, f"group rank {bad[0]} outside world size {run.meta.world_size}"
            )
        run.collectives.append((line, rec))
    elif isinstance(rec, ModelRecord):
        run.model = rec
    elif isinstance(rec, DDPRecord):
        run.ddp.append(rec)
    elif isinstance(rec, EndRecord):
        run.end = rec


def record_line(record: Mapping[str, Any]) -> str:
    """One record as a JSON line (infinities and NaNs become null: JSON has neither)."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }
    return json.dumps(clean, separators=(",", ":")) + "\n"


def import_runs(out: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Add imported runs (each a meta record, then its measurements) to a results file: a
    new file written whole, an existing one appended to. An output path that cannot be
    written, or a run the file already has (the same log, table or trace imported twice),
    is refused before anything is written. What was added: out, runs, measurements."""
    from commsim.files import check_output, write_atomic

    check_output(out, "--out")
    runs = [r["run"] for r in records if r["kind"] == "meta"]
    path = Path(out)
    if path.exists() and path.read_text().strip():
        known = set(read_results(path).runs)
        again = [r for r in runs if r in known]
        if again:
            raise SpecError(out, "", f"run {again[0]!r} is already imported into it")
        append_records(path, records)
    else:
        write_atomic(path, "".join(record_line(r) for r in records))
    return {"out": out, "runs": len(runs), "measurements": len(records) - len(runs)}


def append_records(path: str | Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append records to a results file and fsync: never truncates. A file whose last line
    was cut short (a killed writer) first gets a newline, so the new records stay whole."""
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        for rec in records:
            f.write(record_line(rec).encode())
        f.flush()
        os.fsync(f.fileno())
