"""One rank's PyTorch profiler trace (the chrome-trace JSON torch.profiler / Kineto writes,
optionally gzipped): its steps, its compute, and its collectives with what PyTorch records
about each.

- Steps are the `ProfilerStep#N` annotations that `profiler.step()` opens; the thread holding
  them is the rank's main (compute-issuing) thread.
- NCCL collectives are GPU kernels carrying the `record_param_comms` metadata PyTorch copies
  onto them ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
  "Process Group Name" / "Description" / "Ranks": the key names as libtorch spells them);
  gloo collectives are `gloo:<op>` annotations on gloo's worker threads, sized by their
  "Input Dims" and "Input type" (recorded with record_shapes=True); gloo records no group,
  so they are taken to run on the default process group (pg_desc "default_pg", or the
  only group; DDP's all-reduces do), an assumption the summary states.
- Compute is every GPU kernel that is not a collective when the trace has GPU kernels;
  otherwise (CPU training) the main thread's ops, less its communication calls: the
  collectives' launch calls (c10d::*, record_param_comms) and DDP's bucket copies (its
  reducer's mul_out into a bucket and copy_bucket_to_grad back, which a step without
  communication does not run).
- Kernel classes (the roofline's, step.compute): the busy time under attention kernels or
  ops, under GEMMs outside them, and the rest (element-wise), by kernel or op names (CPU
  ops nest: aten::linear holds aten::addmm, which names the GEMM).
- The optimizer is torch.optim's `Optimizer.step#<class>.step` annotations on the main
  thread (on GPU traces, the time spent launching its kernels).

Sizes follow nccl-tests: all-gather counts its output, reduce-scatter its input, all-to-all
what a rank sends, send-recv one message. Times are seconds from the first step's start.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commsim.files import read_bytes
from commsim.specs import SpecError
from commsim.traces.intervals import difference, union
from commsim.units import fmt_time

STEP = re.compile(r"^ProfilerStep#(\d+)$")
DDP_FORWARD = "DistributedDataParallel.forward"  # DDP's own annotation: one per micro-batch
OPTIMIZER = "Optimizer.step#"  # torch.optim's annotation of every optimizer.step()
LAUNCH_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:")
# DDP's reducer annotations of its bucket copies (torch/csrc/distributed/c10d/reducer.cpp);
# on GPU traces the copies are kernels, counted as compute there
REDUCER_PREFIXES = ("torch::distributed::reducer::", "torch.distributed.ddp.reducer::")
# bytes per element of the dtype names PyTorch writes ("Float", "BFloat16") and gloo's
# "Input type" strings ("float", "c10::Half")
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "long": 8,
    "int64": 8,
    "longint": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "int16": 2,
    "char": 1,
    "int8": 1,
    "byte": 1,
    "uint8": 1,
    "unsignedchar": 1,
    "signedchar": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
# kernel classes of the compute roofline (step.compute), by words in a kernel's or op's name:
# FlashAttention / fused attention kernels, then GEMMs (cuBLAS, CUTLASS, Hopper's nvjet and
# wgmma kernels, aten's matmuls on CPU); the rest is element-wise, bound by memory
KERNEL_CLASSES = (
    ("attention", ("flash", "fmha", "attention", "attn", "scaled_dot_product", "sdpa")),
    (
        "gemm",
        (
            "gemm",
            "cutlass",
            "cublas",
            "xmma",
            "nvjet",
            "wgmma",
            "hmma",
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::matmul",
            "aten::_scaled_mm",
        ),
    ),
)
# which size nccl-tests reports: the input's or the output's element count
_SIZE_SIDE = {"all-gather": "out"}


@dataclass(frozen=True)
class Collective:
    """One collective as it ran on this rank."""

    op: str  # commsim's name (all-reduce, ...), or the trace's own for ops commsim lacks
    name: str  # as recorded: "allreduce", "_allgather_base", "gloo:all_reduce", a kernel name
    bytes: float | None  # nccl-tests' size; None when the trace does not say
    dtype: str | None
    group: tuple[int, ...] | None  # global ranks of its process group, when known
    pg: str | None  # process group name
    pg_desc: str | None
    start: float
    end: float
    lane: str  # the stream or thread it ran on

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Step:
    number: int
    start: float
    end: float  # the annotation's end (CPU); RankTrace.window extends it over trailing work
    forwards: int  # DDP forward passes in it (micro-batches), 0 when not DDP


@dataclass(frozen=True)
class RankTrace:
    """What one rank's trace says."""

    source: str
    rank: int
    world: int
    backend: str | None
    gpu: bool  # compute from GPU kernels (True) or from the main thread's CPU ops
    groups: dict[str, tuple[str, tuple[int, ...]]]  # process group name -> (desc, ranks)
    steps: tuple[Step, ...]
    compute: np.ndarray  # disjoint busy intervals, seconds
    launches: np.ndarray  # the main thread's launch calls (c10d::*, ...); CPU: bucket copies
    optimizer: np.ndarray  # the main thread's optimizer.step() annotations (disjoint)
    classes: dict[str, np.ndarray]  # kernel class -> busy intervals (kernel_class)
    collectives: tuple[Collective, ...]
    metadata: dict[str, Any]  # the trace's other top-level fields (a harness's own timings)

    def window(self, k: int) -> tuple[float, float]:
        """Step k's window: from its annotation's start to its end or, on GPU traces, later,
        the end of the last collective or compute that started within it (GPU work trails
        its launch), never past the next step's start. On CPU the main thread's work ends
        with the annotation: a gloo collective's record that outlasts it was closed late by
        gloo's thread after the main thread resumed (seen up to 35 ms on the testbed)."""
        s = self.steps[k]
        if not self.gpu:
            return s.start, s.end
        ends = [c.end for c in self.collectives if s.start <= c.start < s.end]
        inside = (self.compute[:, 0] >= s.start) & (self.compute[:, 0] < s.end)
        ends += self.compute[inside, 1].tolist()
        end = max([s.end, *ends])
        if k + 1 < len(self.steps):
            end = min(end, max(s.end, self.steps[k + 1].start))
        return s.start, end


def kernel_class(name: str) -> str:
    """ "attention", "gemm" or "other" (element-wise) for a compute kernel's or op's name."""
    key = name.lower()
    for cls, words in KERNEL_CLASSES:
        if any(w in key for w in words):
            return cls
    return "other"


def _classes(named: list[tuple[float, float, str]], busy: np.ndarray) -> dict[str, np.ndarray]:
    """Busy intervals of each kernel class: attention's kernels or ops (with what runs
    inside them), GEMMs' outside attention, the rest of the busy time as other."""
    spans: dict[str, list] = {cls: [] for cls, _ in KERNEL_CLASSES}
    for a, b, name in named:
        cls = kernel_class(name)
        if cls != "other":
            spans[cls].append((a, b))
    attention = difference(busy, difference(busy, union(spans["attention"])))  # in both
    gemm = difference(difference(busy, difference(busy, union(spans["gemm"]))), attention)
    other = difference(difference(busy, attention), gemm)
    return {"attention": attention, "gemm": gemm, "other": other}


def op_of(name: str) -> str:
    """commsim's op for a collective name PyTorch or a kernel records (allreduce,
    _allgather_base, all_gather_into_tensor_coalesced, ncclDevKernel_ReduceScatter_..., send),
    or the name itself when commsim prices no such op (barrier, reduce, gather, scatter)."""
    key = name.removeprefix("gloo:").replace("_", "").replace("-", "").lower()
    for word, op in (
        ("allreduce", "all-reduce"),
        ("allgather", "all-gather"),
        ("reducescatter", "reduce-scatter"),
        ("alltoall", "all-to-all"),
        ("broadcast", "broadcast"),
        ("sendrecv", "send-recv"),
        ("send", "send-recv"),
        ("recv", "send-recv"),
    ):
        if word in key:
            return op
    return name


def dtype_bytes(name: str, source: str, where: str) -> int:
    key = name.removeprefix("c10::").replace(" ", "").lower()
    if key not in DTYPE_BYTES:
        raise SpecError(source, where, f"unknown dtype {name!r}")
    return DTYPE_BYTES[key]


def _load(path: str | Path) -> dict[str, Any]:
    source = str(path)
    raw = read_bytes(path)
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise SpecError(source, "", f"bad gzip data (truncated file?): {e}") from None
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(source, "", f"not trace JSON (truncated file?): {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SpecError(source, "traceEvents", "missing: not a PyTorch profiler trace")
    return doc


def _number(ev: dict, key: str, source: str, i: int) -> float:
    v = ev.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v):
        raise SpecError(source, f"traceEvents[{i}].{key}", f"missing or not a number ({v!r})")
    return float(v)


def _ranks(value: Any, source: str, where: str) -> tuple[int, ...]:
    """Process group ranks, written as a list or as its string ("[0, 1, 2]")."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, list) or not all(isinstance(r, int) for r in value):
        raise SpecError(source, where, f"not a list of ranks: {value!r}")
    return tuple(value)


def _groups(info: dict, source: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    out = {}
    for k, pg in enumerate(info.get("pg_config") or []):
        where = f"distributedInfo.pg_config[{k}]"
        if not isinstance(pg, dict) or "pg_name" not in pg:
            raise SpecError(source, where, "pg_name missing")
        out[str(pg["pg_name"])] = (
            str(pg.get("pg_desc", "")),
            _ranks(pg.get("ranks"), source, where),
        )
    return out


_NELEMS = ("In msg nelems", "Out msg nelems")


def _count(value: Any, source: str, where: str) -> float:
    """An element count as PyTorch records it: a whole number, 0 or more."""
    whole = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not whole or not np.isfinite(value) or value < 0 or value != int(value):
        raise SpecError(source, where, f"not an element count (a whole number >= 0): {value!r}")
    return float(value)


def _nccl(ev, args, t, source, i, lane, groups) -> Collective:
    """A GPU collective kernel and its record_param_comms metadata; `groups` (pg_config)
    completes a group whose rank list the trace cut short."""
    name = str(args.get("Collective name") or ev.get("name", ""))
    op = op_of(name)
    nbytes = dtype = group = pg = desc = None
    if "Collective name" in args:
        where = f"traceEvents[{i}].args"
        for key in (*_NELEMS, "dtype"):
            if key not in args:
                raise SpecError(source, f"{where}.{key}", f"missing on collective {name!r}")
        dtype = str(args["dtype"])
        side = "Out msg nelems" if _SIZE_SIDE.get(op) == "out" else "In msg nelems"
        counts = {k: _count(args[k], source, f"{where}.{k}") for k in _NELEMS}
        nelems = counts[side] if op != "send-recv" else max(counts.values())
        nbytes = nelems * dtype_bytes(dtype, source, f"{where}.dtype")
        pg = str(args["Process Group Name"]) if "Process Group Name" in args else None
        desc = args.get("Process Group Description")
        listed = args.get("Process Group Ranks")
        if isinstance(listed, str) and listed.replace(" ", "").endswith(",...]"):
            # libkineto writes a group of over 30 ranks as its first 30 and "..." (its
            # kTruncatLength): the whole list is distributedInfo.pg_config's, if given
            group = groups[pg][1] if pg in groups else None
        elif listed is not None:
            group = _ranks(listed, source, f"{where}.Process Group Ranks")
    return Collective(op, name, nbytes, dtype, group, pg, desc, *t, lane)


def _gloo(ev, args, t, source, i, lane, groups, world) -> Collective:
    """A gloo collective annotation, sized by its input tensors."""
    name = str(ev["name"])
    op = op_of(name)
    dims, types = args.get("Input Dims"), args.get("Input type")
    nbytes = dtype = None
    if dims and types:
        dtype = str(types[0])
        elt = dtype_bytes(dtype, source, f"traceEvents[{i}].args.Input type")
        where = f"traceEvents[{i}].args.Input Dims"
        shapes = [d for d in dims if isinstance(d, list)]
        nbytes = float(sum(np.prod([_count(n, source, where) for n in d]) for d in shapes)) * elt
    default = next(((k, g) for k, g in groups.items() if g[0] == "default_pg"), None)
    default = next(iter(groups.items())) if len(groups) == 1 else default
    pg, desc, group = (default[0], *default[1]) if default else (None, None, None)
    if group is None and len(groups) == 0 and world > 0:
        group = tuple(range(world))
    if nbytes is not None and op == "all-gather" and group:
        nbytes *= len(group)  # gloo records the local input; nccl-tests counts the output
    return Collective(op, name, nbytes, dtype, group, pg, desc, *t, lane)


def read_kineto(path: str | Path) -> RankTrace:
    """One rank's trace; a missing or malformed field is a SpecError naming it."""
    source = str(path)
    doc = _load(path)
    info = doc.get("distributedInfo") or {}
    rank, world = _rank_world(info, source)
    groups = _groups(info, source)
    events = [
        (i, e)
        for i, e in enumerate(doc["traceEvents"])
        if isinstance(e, dict) and e.get("ph") == "X"
    ]
    steps_raw = _profiler_steps(events, source)
    main = steps_raw[0][1].get("tid")
    spans = _spans(events, steps_raw, source)
    gpu = any(e.get("cat") == "kernel" for _, e in events)
    compute, colls, forwards, optimizer, named = _sort_events(
        events, spans, main, gpu, source, groups, world
    )
    launches = _launches(events, spans, main, gpu)
    busy = union(compute) if gpu else difference(compute, launches)
    colls.sort(key=lambda c: (c.start, c.lane))
    for c in colls:  # a rank runs only the collectives of groups it is in, inside its world
        if c.group and rank not in c.group:
            raise SpecError(
                source,
                "distributedInfo.rank",
                f"{rank}, but its {c.name!r} at {fmt_time(c.start)} runs on ranks {list(c.group)}",
            )
        if c.group and max(c.group) >= world:
            raise SpecError(
                source,
                "distributedInfo.world_size",
                f"{world}, but its {c.name!r} at {fmt_time(c.start)} runs on rank {max(c.group)}",
            )
    extra = {k: v for k, v in doc.items() if k not in ("traceEvents",)}
    return RankTrace(
        source,
        rank,
        world,
        info.get("backend"),
        gpu,
        groups,
        _steps(steps_raw, spans, forwards),
        busy,
        launches,
        union(optimizer),
        _classes(named, busy),
        tuple(colls),
        extra,
    )


def read_traces(paths: Sequence[str | Path]) -> list[RankTrace]:
    """The traces of one run, one per rank: every rank's read_kineto, all of one world size
    and no rank twice (a SpecError naming the file and field otherwise)."""
    traces = [read_kineto(p) for p in paths]
    seen: dict[int, str] = {}
    for t in traces:
        if t.world != traces[0].world:
            raise SpecError(
                t.source,
                "distributedInfo.world_size",
                f"{t.world}, but {traces[0].source} says {traces[0].world}: not one run",
            )
        if t.rank in seen:
            raise SpecError(
                t.source, "distributedInfo.rank", f"{t.rank} again ({seen[t.rank]}): one per rank"
            )
        seen[t.rank] = t.source
    return traces


def _rank_world(info: dict, source: str) -> tuple[int, int]:
    """(rank, world size) from distributedInfo (0 and 1 when it is missing): whole numbers,
    the rank inside the world."""
    values = {"world_size": info.get("world_size", 1), "rank": info.get("rank", 0)}
    for key, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "world_size" else 0):
            raise SpecError(source, f"distributedInfo.{key}", f"not a valid {key}: {v!r}")
    if values["rank"] >= values["world_size"]:
        raise SpecError(
            source,
            "distributedInfo.rank",
            f"{values['rank']} outside world_size {values['world_size']}",
        )
    return values["rank"], values["world_size"]


def _profiler_steps(events: list[tuple[int, dict]], source: str) -> list[tuple[int, dict]]:
    """The (index, event) of each ProfilerStep#N; none is a SpecError saying how to record."""
    steps = [(i, e) for i, e in events if STEP.match(str(e.get("name", "")))]
    if not steps:
        raise SpecError(
            source,
            "traceEvents",
            "no ProfilerStep#N: profile with schedule= and call prof.step() each step",
        )
    return steps


def _spans(events, steps_raw, source: str) -> dict[int, tuple[float, float]]:
    """Each event's (start, end) in seconds from the first step's start, by its index."""
    base = min(_number(e, "ts", source, i) for i, e in steps_raw)
    spans = {}
    for i, e in events:
        start, dur = _number(e, "ts", source, i), _number(e, "dur", source, i)
        if dur < 0:
            raise SpecError(source, f"traceEvents[{i}].dur", f"negative duration ({dur:g} us)")
        spans[i] = ((start - base) * 1e-6, (start + dur - base) * 1e-6)
    return spans


def _sort_events(events, spans, main, gpu: bool, source: str, groups, world: int):
    """(compute spans, collectives, DDP forwards' starts, optimizer spans, named compute
    spans (start, end, name)): GPU kernels on a GPU trace, the main thread's ops on a CPU
    one; the process `groups` and `world` size complete gloo's collectives."""
    compute, colls, forwards, optimizer, named = [], [], [], [], []
    for i, e in events:
        name, cat, args = str(e.get("name", "")), e.get("cat"), e.get("args") or {}
        t = spans[i]
        if gpu and cat == "kernel":
            lane = f"stream {args.get('stream', e.get('tid'))}"
            if "Collective name" in args or name.lower().startswith("nccl"):
                colls.append(_nccl(e, args, t, source, i, lane, groups))
            else:
                compute.append(t)
                named.append((*t, name))
        elif name.startswith("gloo:"):
            colls.append(_gloo(e, args, t, source, i, f"thread {e.get('tid')}", groups, world))
        elif e.get("tid") == main and not gpu and not STEP.match(name):
            compute.append(t)  # the communication calls are taken out below
            if not name.startswith((*LAUNCH_PREFIXES, *REDUCER_PREFIXES)):
                named.append((*t, name))
        if name == DDP_FORWARD and e.get("tid") == main:
            forwards.append(t[0])
        if name.startswith(OPTIMIZER) and e.get("tid") == main:
            optimizer.append(t)
    return compute, colls, forwards, optimizer, named


def _launches(events, spans, main, gpu: bool) -> np.ndarray:
    """The main thread's communication calls (with DDP's bucket copies on a CPU trace, whose
    compute they are taken out of), as one interval set."""
    calls = LAUNCH_PREFIXES if gpu else (*LAUNCH_PREFIXES, *REDUCER_PREFIXES)
    return union(
        [
            spans[i]
            for i, e in events
            if e.get("tid") == main and str(e.get("name", "")).startswith(calls)
        ]
    )


def _steps(steps_raw, spans, forwards) -> tuple[Step, ...]:
    """The steps in time order, each with the DDP forwards (micro-batches) that start in it."""
    steps = []
    for i, e in sorted(steps_raw, key=lambda x: spans[x[0]][0]):
        s, end = spans[i]
        n = sum(s <= f < end for f in forwards)
        steps.append(Step(int(STEP.match(e["name"]).group(1)), s, end, n))
    return tuple(steps)
