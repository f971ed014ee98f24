"""Calibration data: the JSONL records a measurement appends, and the Profile a fit writes.

A results file holds one JSON object per line; `kind` says what it is, `run` ties it to
its run. Every run starts with a `meta` record (backend, world size, where each rank ran,
versions), then `collective` records (one per op, group and size: the median time over
repeats and its p10/p90), a `model` and `ddp` records (the data-parallel step per bucket
size), and an `end` record when it finishes or fails. Files are only ever appended to.

A Profile is what a fit learnt: each link tier's alpha (seconds per message) and bandwidth
(bytes/s) with 95% intervals, the measured compute rate, and the algorithm the backend runs
for each op. apply_profile writes the tiers into a ClusterSpec, so the graph evaluator
predicts with them.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from commsim.specs import ClusterSpec, Compression, Spec, SpecError, load_spec

FORMAT_VERSION = 1  # the `format` of meta records this reader understands
OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all", "send-recv")
TIERS = ("intra-node", "inter-node", "cross-rack")
Op = Literal["all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all", "send-recv"]
Tier = Literal["intra-node", "inter-node", "cross-rack"]

# What each backend runs, by the names calibrate.fit.GroupModel prices:
ALGORITHMS: dict[str, dict[str, str]] = {
    # gloo as torch's ProcessGroupGloo calls it for CPU tensors (ProcessGroupGloo.cpp):
    "gloo": {
        "all-reduce": "ring",  # gloo/allreduce.cc: ring reduce-scatter, then ring all-gather
        "all-gather": "ring",  # gloo/allgather.cc: N-1 ring steps, two segments in flight
        # ProcessGroupGloo::reduce_scatter_tensor_coalesced: a full all-reduce of the input,
        # each rank keeps its chunk
        "reduce-scatter": "allreduce-ring",
        # gloo/broadcast.cc: binomial tree rooted at the root, not pipelined; a rank posts
        # all its sends at once, so they share its link
        "broadcast": "binomial",
        "all-to-all": "direct",  # gloo/alltoall.cc: every send and receive posted at once
        "send-recv": "direct",  # each rank sends to the next and receives from the previous
    },
    # NCCL: all-reduce by ring or tree, whichever is faster for the size (its tuner's
    # choice); the rest as in NCCL's ring kernels (src/device/*.h)
    "nccl": {
        "all-reduce": "ring|tree",
        "all-gather": "ring",
        "reduce-scatter": "ring",
        "broadcast": "ring",
        "all-to-all": "direct",
        "send-recv": "direct",
    },
}


# --------------------------------------------------------------------------- records


class Record(BaseModel):
    """Fields every record has. Unknown fields are ignored, so newer writers stay readable."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: str
    run: str = Field(min_length=1)


class RankInfo(BaseModel):
    """Where one rank ran: host (COMMSIM_HOST or hostname), rack (COMMSIM_RACK, if known)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    rank: int = Field(ge=0)
    host: str
    rack: str | None = None
    local_rank: int | None = None
    pid: int | None = None


class MetaRecord(Record):
    """The start of a run: who measured, with what, where each rank ran."""

    kind: Literal["meta"]
    format: int = FORMAT_VERSION
    source: Literal["harness", "nccl-tests"]
    backend: str
    world_size: int = Field(ge=1)
    ranks: list[RankInfo]
    versions: dict[str, str] = {}
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


class CollectiveRecord(Record):
    """One op on one group at one size (nccl-tests' size: all-gather output, reduce-scatter
    input, all-to-all what a rank sends in all); time_s is the median over repeats of the
    slowest rank's time; status "unsupported" marks an op the backend lacks."""

    kind: Literal["collective"]
    op: Op
    group: list[int] = Field(min_length=1)  # world ranks, in group rank order
    status: Literal["ok", "unsupported"] = "ok"
    bytes: float | None = Field(default=None, gt=0)
    time_s: float | None = Field(default=None, gt=0)
    p10_s: float | None = None
    p90_s: float | None = None
    repeats: int | None = None
    algbw_Bps: float | None = None
    busbw_Bps: float | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _check(self) -> CollectiveRecord:
        if self.status == "ok" and (self.bytes is None or self.time_s is None):
            raise ValueError("a measured collective needs bytes and time_s")
        if len(set(self.group)) != len(self.group):
            raise ValueError("group lists a rank twice")
        return self


class LayerRecord(BaseModel):
    """One layer of the harness model: parameter tensors (registration order), forward
    FLOPs per sample (a multiply-add is 2), and measured seconds per step (slowest rank)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

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
    """One bucket size: compute alone (no_sync: forward, backward, optimizer; no
    communication) and the full step with DDP's overlapped all-reduces, medians and p10/p90
    over repeats of the slowest rank; exposed_comm_s = step_s - compute_s."""

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
    repeats: int = Field(ge=1)
    buckets_bytes: list[int] | None = None  # DDP's own bucket sizes, when torch reports them
    # the comm hook the step ran, spelled as a strategy's compression (older files: none)
    compression: Compression = "none"
    error_feedback: bool = False
    overlap: bool = True  # False: the hook exchanged one bucket at a time after backward


class EndRecord(Record):
    """How a run ended; a failed run says why (which rank, doing what)."""

    kind: Literal["end"]
    status: Literal["complete", "failed"]
    message: str = ""
    elapsed_s: float | None = None


RECORD_TYPES: dict[str, type[Record]] = {
    "meta": MetaRecord,
    "collective": CollectiveRecord,
    "model": ModelRecord,
    "ddp": DDPRecord,
    "end": EndRecord,
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

    @property
    def backends(self) -> set[str]:
        return {r.meta.backend for r in self.runs.values()}


def _error_text(e: ValidationError) -> str:
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
        raise SpecError(source, where, f"bad {data['kind']} record: {_error_text(e)}") from None


def read_results(paths: str | Path | Iterable[str | Path]) -> Results:
    """Read results files into runs; any malformed or truncated line is a SpecError naming
    the file and line (a run killed mid-write leaves its last line cut short)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    runs: dict[str, Run] = {}
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
            _add(runs, rec, source, n)
    if not runs:
        raise SpecError(", ".join(map(str, paths)), "", "no measurements in the file")
    return Results(files=[str(p) for p in paths], runs=runs)


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


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file whole or not at all: a temporary file beside it, then rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- profiles

Interval = tuple[float, float]  # 95% confidence interval (low, high); high may be inf


class TierFit(Spec):
    """One link tier: alpha (seconds per message, end to end) and the bandwidth of one flow
    alone on it (bytes/s per direction); for cross-rack, a rack's whole uplink. `fitted`
    names what the data determined; the rest kept the cluster's value."""

    alpha_s: float = Field(ge=0)
    alpha_ci_s: Interval | None = None
    bandwidth_Bps: float = Field(gt=0)
    bandwidth_ci_Bps: Interval | None = None
    points: int = Field(ge=0)  # measurements whose group spans exactly this tier
    fitted: list[Literal["alpha", "bandwidth"]] = []


class ComputeFit(Spec):
    """Measured compute: model FLOP/s per rank (3 x forward FLOPs per sample x batch / the
    time of forward + backward) and its share of the GPU's catalog peak."""

    flops_per_s: float = Field(gt=0)
    flops_per_s_range: Interval  # over the p10-p90 of the measured compute times
    efficiency: float = Field(gt=0)
    gpu: str
    model: str
    points: int = Field(ge=1)


class Provenance(Spec):
    """Where a profile came from."""

    files: list[str]
    runs: list[str]
    date: str
    points: int = Field(ge=0)
    commsim: str
    rms_rel_error: float | None = None  # of the fitted model over the points


class Profile(Spec):
    """What a fit learnt about one cluster with one backend."""

    cluster: str
    backend: str
    tiers: dict[Tier, TierFit]
    algorithms: dict[Op, str]
    compute: ComputeFit | None = None
    provenance: Provenance
    notes: list[str] = []


def load_profile(path: str | Path) -> Profile:
    """Read a profile YAML; errors name the file and field."""
    return load_spec(Profile, path)


def profile_yaml(profile: Profile) -> str:
    """A profile as YAML (infinite interval ends as .inf)."""
    import yaml

    def plain(x: Any) -> Any:  # safe_dump writes lists, not tuples
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return [plain(v) for v in x] if isinstance(x, (list, tuple)) else x

    return yaml.safe_dump(plain(profile.model_dump()), sort_keys=False)


def cluster_tiers(spec: ClusterSpec) -> tuple[str, ...]:
    """The tiers a cluster has: GPUs sharing a node, nodes sharing a rack (a leaf, or a
    rail-optimised scalable unit), racks."""
    tiers = []
    if spec.node.gpus_per_node > 1:
        tiers.append("intra-node")
    if spec.nodes > 1 and spec.fabric.nodes_per_leaf > 1:
        tiers.append("inter-node")
    if spec.nodes > spec.fabric.nodes_per_leaf:
        tiers.append("cross-rack")
    return tuple(tiers)


def parsed(spec: ClusterSpec) -> ClusterSpec:
    """The spec with every field validated: pydantic leaves unset defaults as written
    ("100ns"), so validate a dump of it, in which they are set."""
    return ClusterSpec.model_validate(spec.model_dump(warnings=False))


def _leaf_ports(spec: ClusterSpec) -> int:
    """NIC ports on a full leaf: a rail-optimised leaf takes one NIC of each node of its unit."""
    per_node = 1 if spec.node.rail_optimized else spec.node.nics.count
    return spec.fabric.nodes_per_leaf * per_node


def tier_params(spec: ClusterSpec) -> dict[str, tuple[float, float]]:
    """(alpha, bandwidth) of each tier the spec has, as topology.build turns it into links.

    intra-node: the node's latency and per-GPU bandwidth (default: NVLink or PCIe).
    inter-node: NIC latency + the path's cables and switch (nic->leaf: link + switch,
    leaf->nic: link), and the NIC bandwidth. cross-rack: the same path through a spine
    (two more link + switch hops) and the leaf's total uplink: ports x NIC bandwidth /
    oversubscription, or uplinks_per_leaf x NIC bandwidth."""
    from commsim import catalog

    spec = parsed(spec)
    node, fab = spec.node, spec.fabric
    out: dict[str, tuple[float, float]] = {}
    tiers = cluster_tiers(spec)
    if "intra-node" in tiers:
        default = (
            catalog.gpu(node.gpu).nvlink_bandwidth
            if node.interconnect == "nvswitch"
            else node.pcie_bandwidth
        )
        out["intra-node"] = (node.intra_latency, node.intra_bandwidth or default)
    hop = fab.link_latency + fab.switch_latency
    in_rack = node.nics.latency + hop + fab.link_latency
    if "inter-node" in tiers:
        out["inter-node"] = (in_rack, node.nics.bandwidth)
    if "cross-rack" in tiers:
        if fab.uplinks_per_leaf is None:
            uplink = _leaf_ports(spec) * node.nics.bandwidth / fab.oversubscription[0]
        else:
            uplink = fab.uplinks_per_leaf * node.nics.bandwidth
        out["cross-rack"] = (in_rack + 2 * hop, uplink)
    return out


def leaf_uplinks(spec: ClusterSpec) -> int:
    """How many parallel leaf-spine links a leaf has (topology.build): uplinks_per_leaf,
    or ceil(ports / oversubscription); the rack's uplink bandwidth is split among them."""
    spec = parsed(spec)
    if spec.fabric.uplinks_per_leaf is not None:
        return spec.fabric.uplinks_per_leaf
    return max(1, math.ceil(_leaf_ports(spec) / spec.fabric.oversubscription[0]))


def cable_share(spec: ClusterSpec) -> float:
    """The cable's part of one cable + switch hop in the spec (0 when both are 0)."""
    spec = parsed(spec)
    hop = spec.fabric.link_latency + spec.fabric.switch_latency
    return spec.fabric.link_latency / hop if hop > 0 else 0.0


def apply_tiers(spec: ClusterSpec, tiers: Mapping[str, tuple[float, float]]) -> ClusterSpec:
    """A copy of `spec` whose links have the given (alpha, bandwidth) per tier.

    intra-node sets node.intra_latency and intra_bandwidth. inter-node sets the NIC
    bandwidth, and the NIC latency so that the in-rack path (NIC, cable, switch, cable)
    takes alpha_inter; the NIC latency is also LogP's per-message overhead (half of it at
    each end). cross-rack: a cross-rack path passes two more cable + switch hops than an
    in-rack one (topology.build), so with inter-node given a hop gets (alpha_cross -
    alpha_inter) / 2, split between cable and switch as the spec splits it (cable_share),
    and the in-rack path must still hold its own cable, switch, cable; without it the
    fabric stays and the NIC latency makes the cross-rack path take alpha_cross. Its
    bandwidth is the rack's whole uplink, set through the leaf oversubscription (ports x
    NIC bandwidth / uplink, uplinks_per_leaf dropped); it must lie in ((k-1), k] NIC
    bandwidths, k = leaf_uplinks(spec), so the leaf keeps its k parallel uplinks.
    A value outside these ranges is a ValueError: no link setting gives it.
    """
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tier {sorted(unknown)[0]!r} (tiers: {', '.join(TIERS)})")
    spec = parsed(spec)
    data = spec.model_dump()
    node, fab = data["node"], data["fabric"]
    if "intra-node" in tiers:
        node["intra_latency"], node["intra_bandwidth"] = tiers["intra-node"]
    nic_bw = spec.node.nics.bandwidth
    if "inter-node" in tiers:
        alpha_in, nic_bw = tiers["inter-node"]
        node["nics"]["bandwidth"] = nic_bw
    if "cross-rack" in tiers:
        alpha_x, uplink = tiers["cross-rack"]
        if "inter-node" in tiers:
            hop = (alpha_x - alpha_in) / 2
            if hop < -1e-12:
                raise ValueError(
                    f"cross-rack alpha {alpha_x:.4g} s is below the in-rack alpha "
                    f"{alpha_in:.4g} s: a cross-rack path has more hops, not fewer"
                )
            share = cable_share(spec)
            fab["link_latency"], fab["switch_latency"] = share * hop, (1 - share) * max(0.0, hop)
        k, ports = leaf_uplinks(spec), _leaf_ports(spec)
        if not (k - 1) * nic_bw < uplink <= k * nic_bw * (1 + 1e-9):
            raise ValueError(
                f"cross-rack bandwidth {uplink:.4g} B/s is outside what the leaf's {k} "
                f"uplink(s) carry at the NIC rate: ({k - 1}, {k}] x {nic_bw:.4g} B/s"
            )
        oversub = ports * nic_bw / uplink
        while math.ceil(ports / oversub) > k:  # rounding must not add an uplink
            oversub = math.nextafter(oversub, math.inf)
        fab["oversubscription"] = [max(1.0, oversub), *fab["oversubscription"][1:]]
        fab["uplinks_per_leaf"] = None
    if "inter-node" in tiers or "cross-rack" in tiers:
        link, switch = fab["link_latency"], fab["switch_latency"]
        if "inter-node" in tiers:
            fabric_part, alpha = 2 * link + switch, alpha_in
        else:
            fabric_part, alpha = 4 * link + 3 * switch, alpha_x
        if alpha < fabric_part - 1e-12:
            raise ValueError(
                f"alpha {alpha:.4g} s is below the fabric's own {fabric_part:.4g} s of cables "
                "and switches on that path"
            )
        node["nics"]["latency"] = max(0.0, alpha - fabric_part)
    return ClusterSpec.model_validate(data)


def apply_profile(spec: ClusterSpec, profile: Profile, source: str = "profile") -> ClusterSpec:
    """The cluster with the profile's fitted tiers written into its links.

    A profile fitted on another cluster, or naming a tier this cluster does not have, is a
    SpecError: its numbers describe other links."""
    if profile.cluster != spec.name:
        raise SpecError(
            source,
            "cluster",
            f"fitted on cluster {profile.cluster!r}, not {spec.name!r}: fit a profile on it",
        )
    have = cluster_tiers(spec)
    for tier in profile.tiers:
        if tier not in have:
            raise SpecError(
                source,
                f"tiers.{tier}",
                f"cluster {spec.name!r} has no {tier} links (it has: {', '.join(have) or 'none'})",
            )
    try:
        return apply_tiers(
            spec, {t: (f.alpha_s, f.bandwidth_Bps) for t, f in profile.tiers.items()}
        )
    except ValueError as e:
        raise SpecError(source, "tiers", str(e)) from None
