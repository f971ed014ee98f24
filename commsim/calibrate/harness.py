"""The torch.distributed benchmark: collectives over a size sweep, then a DDP training step.

Runs one process per rank under torchrun, the testbed's runner, or `--local N` (this module
spawns N processes on 127.0.0.1); each reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT, and COMMSIM_HOST / COMMSIM_RACK where the testbed sets them. gloo on CPU, nccl
on CUDA. Rank 0 appends every result to the JSONL file the moment it is measured
(profile.py describes the records).

Timing, as nccl-tests does it but across processes: warm-up, then per repeat a barrier on
the group and the op timed on every rank; a repeat's time is the slowest rank's (one
all-reduce MAX of all repeats at the end); the record keeps the median and p10/p90. Besides
the whole world, each op runs on the ranks of rank 0's rack and of rank 0's host where
those are smaller groups, so a fit can tell the link tiers apart.

The DDP phase trains a small MLP (pre-norm blocks: LayerNorm, Linear 4x, GELU, Linear) for
several bucket caps: compute alone (no_sync: no communication) and the full step with
DDP's all-reduces overlapping the backward, once per comm hook (`comm_hooks`: PyTorch's own
fp16/bf16 compress and PowerSGD hooks; each `ddp` record names its hook). Its layers
(parameter tensors, FLOPs, and forward/backward seconds measured by module hooks) are
recorded so commsim can rebuild it as a Workload.

A rank that dies makes the others' collectives fail; one that hangs makes them time out
(init_process_group's timeout). Either way the run ends with one clear message, rank 0
appends an `end` record, and everything measured before stays in the file. A watchdog
ends a rank that makes no progress for timeout + 2 s, for the cases a backend does not
time out by itself.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from commsim import __version__
from commsim.calibrate.records import FORMAT_VERSION, append_records
from commsim.collectives.algorithms import bus_factor
from commsim.profile import OPS
from commsim.specs import SpecError
from commsim.units import fmt_bytes, parse_size_range

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
INFO_BYTES = 4096  # room for one rank's JSON self-description in the all-gather
MIB = 2**20


POWERSGD_START_ITER = 2  # vanilla all-reduce steps before PowerSGD (torch's minimum: 2)


def _valid_hook(name: str) -> bool:
    kind, _, rank = name.partition(":")
    if kind == "powersgd":
        return rank.isdigit() and int(rank) >= 1
    return name in ("none", "fp16", "bf16")


@dataclass(frozen=True)
class HarnessConfig:
    """What to measure and how (the `calibrate run` options)."""

    out: str
    backend: str = "auto"  # gloo, nccl, or auto: nccl when CUDA is available
    sizes: str = "8B:256MiB"  # doubling sweep, nccl-tests' -b/-e/-f 2
    ops: tuple[str, ...] = OPS
    bucket_mb: tuple[float, ...] = (1.0, 5.0, 25.0)  # DDP bucket_cap_mb values; () skips DDP
    warmup: int = 5
    repeats: int = 20
    point_budget_s: float = 2.0  # fewer repeats (at least 3) when one op is slow
    groups: str = "tiers"  # "tiers": world + rank 0's rack and host; "world": world only
    timeout_s: float = 300.0
    width: int = 512  # DDP model: hidden width
    depth: int = 4  # blocks
    batch: int = 32  # samples per rank per step
    ddp_repeats: int = 10
    comm_hooks: tuple[str, ...] = ("none",)  # DDP comm hooks, spelled as commsim spells them

    def __post_init__(self) -> None:
        lo, _ = parse_size_range(self.sizes)
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise SpecError(
                "--ops", "", f"unknown op {unknown[0]!r} (choose from {', '.join(OPS)})"
            )
        checks = {
            "--sizes": (lo >= 1, "sizes start at 1 byte"),
            "--backend": (self.backend in ("auto", "gloo", "nccl"), "gloo, nccl or auto"),
            "--groups": (self.groups in ("tiers", "world"), "tiers or world"),
            "--bucket-mb": (all(b > 0 for b in self.bucket_mb), "caps must be positive"),
            "--warmup": (self.warmup >= 1, "at least 1"),
            "--repeats": (self.repeats >= 3, "at least 3 (a median and a spread)"),
            "--timeout": (self.timeout_s > 0, "must be positive"),
            "--width": (self.width >= 1, "at least 1"),
            "--depth": (self.depth >= 1, "at least 1"),
            "--batch": (self.batch >= 1, "at least 1"),
            "--comm-hooks": (
                bool(self.comm_hooks) and all(map(_valid_hook, self.comm_hooks)),
                "none, fp16, bf16 or powersgd:R (R an integer >= 1), comma-separated",
            ),
        }
        for flag, (ok, why) in checks.items():
            if not ok:
                raise SpecError(flag, "", why)
        nccl = self.backend == "nccl" or (self.backend == "auto" and torch.cuda.is_available())
        if "bf16" in self.comm_hooks and not nccl:
            raise SpecError("--comm-hooks", "", "torch's bf16 hook needs CUDA and NCCL 2.10+")

    def size_grid(self) -> list[int]:
        lo, hi = parse_size_range(self.sizes)
        return [int(lo * 2**k) for k in range(int(math.floor(math.log2(hi / lo) + 1e-9)) + 1)]


# --------------------------------------------------------------------------- bookkeeping


class _Writer:
    """Rank 0's appender: one record at a time, flushed and fsynced, from any thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        try:
            with open(path, "ab"):  # fail now, before the other ranks wait on us
                pass
        except OSError as e:
            raise SpecError(path, "", f"cannot append to it: {e.strerror or e}") from None

    def write(self, record: dict[str, Any]) -> None:
        with self.lock:
            append_records(self.path, [record])


@dataclass
class _Progress:
    """What a rank is doing and when it last moved, for the watchdog and error messages."""

    activity: str = "starting"
    last: float = field(default_factory=time.monotonic)

    def tick(self, activity: str | None = None) -> None:
        self.last = time.monotonic()
        if activity is not None:
            self.activity = activity


class _Run:
    """One rank's run: its identity, device, writer and progress."""

    def __init__(self, cfg: HarnessConfig, env: dict[str, int | str]) -> None:
        self.cfg = cfg
        self.rank, self.world = int(env["RANK"]), int(env["WORLD_SIZE"])
        self.local_rank = int(env["LOCAL_RANK"])
        self.backend = cfg.backend
        if self.backend == "auto":
            self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        if self.backend == "nccl":
            if not torch.cuda.is_available():
                raise SpecError("--backend", "", "nccl needs CUDA, and torch sees no GPU")
            self.device = torch.device("cuda", self.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.writer = _Writer(cfg.out) if self.rank == 0 else None
        self.progress = _Progress()
        self.run_id = ""
        self.started = time.monotonic()
        self.done = threading.Event()  # set once the run completed or failed
        self.lock = threading.Lock()

    def emit(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write({"run": self.run_id} | record)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def fail(self, message: str) -> int:
        """End the run: rank 0 records why; every rank says so on stderr. Exit code 1."""
        with self.lock:
            if self.done.is_set():
                return 1
            self.done.set()
        text = f"rank {self.rank}: {message}"
        if self.run_id:
            self.emit(
                {
                    "kind": "end",
                    "status": "failed",
                    "message": text,
                    "elapsed_s": time.monotonic() - self.started,
                }
            )
        kept = f"; measurements so far are in {self.cfg.out}" if self.rank == 0 else ""
        print(f"calibrate run failed: {text}{kept}", file=sys.stderr, flush=True)
        return 1

    def watchdog(self) -> None:
        """End this rank when it makes no progress for timeout + 2 s (a peer hangs where
        the backend does not time out by itself)."""
        limit = self.cfg.timeout_s + 2.0
        while not self.done.wait(0.5):
            idle = time.monotonic() - self.progress.last
            if idle > limit:
                self.fail(
                    f"no progress for {idle:.0f} s during {self.progress.activity}: "
                    "a rank died or hangs"
                )
                os._exit(1)


def _env() -> dict[str, int | str]:
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise SpecError(
            "environment",
            "",
            f"{', '.join(missing)} not set: run under torchrun or `commsim testbed run`, or "
            "pass --local N to start N processes here",
        )
    env: dict[str, int | str] = {k: os.environ[k] for k in ENV}
    env["LOCAL_RANK"] = os.environ.get("LOCAL_RANK", "0")
    return env


def _gather_json(obj: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """All-gather one small JSON object per rank (as bytes: no pickling between ranks)."""
    data = json.dumps(obj).encode()
    if len(data) > INFO_BYTES:
        raise ValueError(f"rank description over {INFO_BYTES} bytes")
    buf = torch.zeros(INFO_BYTES, dtype=torch.uint8)
    buf[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    buf = buf.to(device)
    out = [torch.zeros_like(buf) for _ in range(dist.get_world_size())]
    dist.all_gather(out, buf)
    return [json.loads(bytes(t.cpu().tolist()).rstrip(b"\0")) for t in out]


def _meta(run: _Run) -> dict[str, Any]:
    """Who ran where, with versions; every rank learns rank 0's run id."""
    me = {
        "rank": run.rank,
        "host": os.environ.get("COMMSIM_HOST") or socket.gethostname(),
        "rack": os.environ.get("COMMSIM_RACK"),
        "local_rank": run.local_rank,
        "pid": os.getpid(),
        "run": f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}",
    }
    infos = _gather_json(me, run.device)
    run.run_id = infos[0]["run"]
    versions = {
        "commsim": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if run.backend == "nccl":  # a tuple in current torch, an int code in old ones
        nccl = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return {
        "kind": "meta",
        "format": FORMAT_VERSION,
        "source": "harness",
        "backend": run.backend,
        "device": str(run.device.type),
        "world_size": run.world,
        "ranks": [{k: v for k, v in i.items() if k != "run"} for i in infos],
        "versions": versions,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {k: v for k, v in asdict(run.cfg).items() if k != "out"},
    }


def tier_groups(ranks: Sequence[dict[str, Any]], mode: str) -> list[tuple[str, list[int]]]:
    """The groups to measure: the world, then (mode "tiers") the ranks of rank 0's rack if
    they span several hosts, and the ranks of rank 0's host if they are several: each a
    smaller tier, all containing rank 0 (the writer)."""
    world = list(range(len(ranks)))
    groups = [("world", world)] if len(world) > 1 else []
    if mode != "tiers":
        return groups
    me = ranks[0]
    if me.get("rack") is not None:
        rack = [r["rank"] for r in ranks if r.get("rack") == me["rack"]]
        if len({ranks[r]["host"] for r in rack}) > 1 and len(rack) < len(world):
            groups.append(("rack", rack))
    host = [r["rank"] for r in ranks if r["host"] == me["host"]]
    if 1 < len(host) < len(world) and all(host != g for _, g in groups):
        groups.append(("host", host))
    return groups


# --------------------------------------------------------------------------- collectives

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _op(
    op: str, nbytes: int, group, members: list[int], me: int, device: torch.device
) -> tuple[Callable[[], None], int]:
    """A closure running `op` once on zero-filled float32 buffers (zeros stay zeros:
    no overflow, no denormals), and the bytes it moves by nccl-tests' convention."""
    n = len(members)
    elems = max(1, nbytes // 4)
    per = max(1, elems // n)  # per-rank chunk where the buffer splits over the group

    def zeros(k: int) -> torch.Tensor:
        return torch.zeros(k, dtype=torch.float32, device=device)

    if op == "all-reduce":
        t = zeros(elems)
        return lambda: dist.all_reduce(t, group=group), 4 * elems
    if op == "all-gather":
        inp, out = zeros(per), zeros(per * n)
        return lambda: _all_gather(out, inp, group=group), 4 * per * n
    if op == "reduce-scatter":
        inp, out = zeros(per * n), zeros(per)
        return lambda: _reduce_scatter(out, inp, group=group), 4 * per * n
    if op == "broadcast":
        t = zeros(elems)
        return lambda: dist.broadcast(t, src=members[0], group=group), 4 * elems
    if op == "all-to-all":
        inp, out = zeros(per * n), zeros(per * n)
        return lambda: dist.all_to_all_single(out, inp, group=group), 4 * per * n
    send, recv = zeros(elems), zeros(elems)
    nxt, prev = members[(me + 1) % n], members[(me - 1) % n]

    def sendrecv() -> None:
        ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prev, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    return sendrecv, 4 * elems


def _max_over_ranks(values: Sequence[float], run: _Run, group) -> np.ndarray:
    t = torch.tensor(list(values), dtype=torch.float64, device=run.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().numpy()


def _time_op(fn: Callable[[], None], run: _Run, group) -> np.ndarray:
    """Warm up, pick the repeat count from the slowest warm-up (same on every rank), then
    time each repeat after a barrier; the slowest rank's time per repeat."""
    cfg = run.cfg
    for _ in range(cfg.warmup - 1):
        fn()
        run.progress.tick()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    fn()
    run.sync()
    (slowest,) = _max_over_ranks([time.perf_counter() - t0], run, group)
    repeats = int(np.clip(cfg.point_budget_s / max(slowest, 1e-9), 3, cfg.repeats))
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        run.progress.tick()
        t0 = time.perf_counter()
        fn()
        run.sync()
        times.append(time.perf_counter() - t0)
    return _max_over_ranks(times, run, group)


def _supported(op: str, group, members: list[int], me: int, run: _Run) -> str | None:
    """None if the backend runs `op` on this group, else why not. Members try it once; the
    verdict is agreed by the whole world (one all-reduce MIN), so every rank then walks the
    same points."""
    reason = None
    if me >= 0:
        try:
            fn, _ = _op(op, 4 * len(members), group, members, me, run.device)
            fn()
            run.sync()
        except (RuntimeError, NotImplementedError, ValueError) as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    flag = torch.tensor([0 if reason else 1], dtype=torch.int32, device=run.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if int(flag.item()) == 1:
        return None
    return reason or "unsupported on another rank"


def _collectives(run: _Run, ranks: list[dict[str, Any]]) -> None:
    """Every (group, op, size) point; all ranks meet at a world barrier before each, so
    ranks outside a group wait at most one point."""
    grid = run.cfg.size_grid()
    for name, members in tier_groups(ranks, run.cfg.groups):
        group = None if len(members) == run.world else dist.new_group(members)
        inside = run.rank in members
        me = members.index(run.rank) if inside else -1
        for op in run.cfg.ops:
            run.progress.tick(f"{op} on the {name} group ({len(members)} ranks)")
            why = _supported(op, group, members, me, run)
            if why is not None:
                run.emit(
                    {"kind": "collective", "op": op, "group": members, "status": "unsupported"}
                    | {"error": why}
                )
                continue
            for size in grid:
                run.progress.tick(f"{op} of {fmt_bytes(size)} on the {name} group")
                dist.barrier()
                if not inside:
                    continue
                fn, nbytes = _op(op, size, group, members, me, run.device)
                t = _time_op(fn, run, group)
                median = float(np.median(t))
                algbw = nbytes / median
                factor = 1.0 if op == "send-recv" else float(bus_factor(op, len(members)))
                run.emit(
                    {
                        "kind": "collective",
                        "op": op,
                        "group": members,
                        "status": "ok",
                        "bytes": nbytes,
                        "dtype": "float32",
                        "time_s": median,
                        "p10_s": float(np.percentile(t, 10)),
                        "p90_s": float(np.percentile(t, 90)),
                        "min_s": float(t.min()),
                        "max_s": float(t.max()),
                        "repeats": int(t.size),
                        "algbw_Bps": algbw,
                        "busbw_Bps": algbw * factor,
                    }
                )


# --------------------------------------------------------------------------- DDP


def build_model(width: int, depth: int) -> nn.Sequential:
    """The DDP workload: input projection, `depth` pre-norm MLP blocks (LayerNorm, Linear
    to 4x, GELU, Linear back), a final LayerNorm and a head; one flat Sequential, so
    autograd runs its modules strictly in reverse."""
    mods: list[nn.Module] = [nn.Linear(width, width)]
    for _ in range(depth):
        mods += [nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU()]
        mods += [nn.Linear(4 * width, width)]
    mods += [nn.LayerNorm(width), nn.Linear(width, width)]
    return nn.Sequential(*mods)


def _batch(cfg: HarnessConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(cfg.batch, cfg.width, generator=g).to(device)
    y = torch.randint(0, cfg.width, (cfg.batch,), generator=g).to(device)
    return x, y


def _layer_times(model: nn.Sequential, run: _Run, repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of each module, by hooks: module i's forward runs from
    its forward pre-hook to module i+1's (the last to the end of the loss), its backward
    from its backward pre-hook to module i-1's (module 0 to the end of backward; the last
    also takes the loss's backward). Medians over repeats, slowest rank."""
    x, y = _batch(run.cfg, run.device)
    mods = list(model)
    stamps: dict[tuple[str, int], float] = {}

    def stamp(key: tuple[str, int]) -> None:
        run.sync()
        stamps[key] = time.perf_counter()

    handles = []
    for i, m in enumerate(mods):
        handles.append(m.register_forward_pre_hook(lambda *_, i=i: stamp(("f", i))))
        handles.append(m.register_full_backward_pre_hook(lambda *_, i=i: stamp(("b", i))))
    fwd, bwd = [], []
    last = len(mods) - 1
    for _ in range(repeats + 1):  # the first warms up
        model.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x), y)
        stamp(("f", last + 1))
        stamp(("b", last + 1))
        with warnings.catch_warnings():  # module 0's input needs no gradient: expected
            warnings.filterwarnings("ignore", "Full backward hook", UserWarning)
            loss.backward()
        stamp(("b", -1))
        fwd.append([stamps["f", i + 1] - stamps["f", i] for i in range(last + 1)])
        bwd.append([stamps["b", i - 1] - stamps["b", i] for i in range(last + 1)])
        bwd[-1][last] += stamps["b", last] - stamps["b", last + 1]
        run.progress.tick()
    for h in handles:
        h.remove()
    f = _max_over_ranks(np.median(np.array(fwd[1:]), axis=0), run, None)
    b = _max_over_ranks(np.median(np.array(bwd[1:]), axis=0), run, None)
    return f, b


def _model_record(model: nn.Sequential, fwd: np.ndarray, bwd: np.ndarray, cfg: HarnessConfig):
    """Layers as commsim sees them: each module with parameters, with the parameter-free
    modules after it (GELU) folded in; forward FLOPs per sample: 2 x in x out per Linear
    (element-wise work is not counted, as in commsim.workload)."""
    layers: list[dict[str, Any]] = []
    for i, m in enumerate(model):
        tensors = [p.numel() for p in m.parameters()]
        flops = 2.0 * m.in_features * m.out_features if isinstance(m, nn.Linear) else 0.0
        if tensors or not layers:
            layers.append(
                {
                    "name": f"{i}.{type(m).__name__}",
                    "tensors": tensors,
                    "shapes": [list(p.shape) for p in m.parameters()],
                    "forward_flops": flops,
                    "forward_s": 0.0,
                    "backward_s": 0.0,
                }
            )
        layer = layers[-1]
        layer["forward_s"] += float(fwd[i])
        layer["backward_s"] += float(bwd[i])
    return {
        "kind": "model",
        "name": f"mlp-w{cfg.width}-d{cfg.depth}",
        "batch": cfg.batch,
        "dtype": "float32",
        "layers": layers,
    }


def _ddp_step(run: _Run, ddp, opt, x, y, *, sync: bool) -> tuple[float, float]:
    """One training step after a world barrier: (whole step, optimizer) seconds. Without
    sync, under no_sync: DDP launches no all-reduce, so this is compute alone."""
    opt.zero_grad(set_to_none=False)
    dist.barrier()
    run.progress.tick()
    t0 = time.perf_counter()
    if sync:
        nn.functional.cross_entropy(ddp(x), y).backward()
    else:
        with ddp.no_sync():
            nn.functional.cross_entropy(ddp(x), y).backward()
    run.sync()
    t1 = time.perf_counter()
    opt.step()
    run.sync()
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1


def _one_bucket_at_a_time(hook):
    """`hook`, waited for before the next bucket's starts (no overlap with the backward)."""

    def blocking(state, bucket):
        done = torch.futures.Future()
        done.set_result(hook(state, bucket).wait())
        return done

    return blocking


def _register_hook(ddp, name: str, backend: str) -> tuple[int, bool]:
    """Register PyTorch's own comm hook `name` on `ddp`: the extra warm-up steps it needs
    (PowerSGD all-reduces uncompressed until start_powerSGD_iter), and whether it overlaps.

    PowerSGD launches its later all-reduces from future callbacks; on gloo those of several
    buckets in flight interleave differently on each rank and deadlock, so there it runs
    one bucket at a time."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name in ("fp16", "bf16"):
        ddp.register_comm_hook(None, getattr(default_hooks, f"{name}_compress_hook"))
        return 0, True
    if name.startswith("powersgd:"):
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(name.partition(":")[2]),
            start_powerSGD_iter=POWERSGD_START_ITER,
        )  # error feedback and warm start on, as by default
        hook = powerSGD_hook.powerSGD_hook
        overlap = backend != "gloo"
        ddp.register_comm_hook(state, hook if overlap else _one_bucket_at_a_time(hook))
        return POWERSGD_START_ITER, overlap
    return 0, True


def _ddp(run: _Run) -> None:
    """Per bucket cap and comm hook: compute alone under no_sync, then the full step; SGD."""
    cfg = run.cfg
    torch.manual_seed(0)
    plain = build_model(cfg.width, cfg.depth).to(run.device)
    run.progress.tick("profiling the DDP model's layers")
    fwd, bwd = _layer_times(plain, run, max(3, cfg.ddp_repeats // 2))
    run.emit(_model_record(plain, fwd, bwd, cfg))
    x, y = _batch(cfg, run.device)
    first_mb = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MIB) / MIB
    for cap, hook in ((c, h) for c in cfg.bucket_mb for h in cfg.comm_hooks):
        run.progress.tick(f"DDP step with {cap:g} MiB buckets, comm hook {hook}")
        torch.manual_seed(0)
        model = build_model(cfg.width, cfg.depth).to(run.device)
        ids = [run.device.index] if run.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cap)
        extra, overlap = _register_hook(ddp, hook, run.backend)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)

        batch = (ddp, opt, x, y)
        for _ in range(3 + extra):  # DDP rebuilds its buckets in gradient order after step one
            _ddp_step(run, *batch, sync=True)
        compute = [_ddp_step(run, *batch, sync=False) for _ in range(cfg.ddp_repeats)]
        full = [_ddp_step(run, *batch, sync=True)[0] for _ in range(cfg.ddp_repeats)]
        c = _max_over_ranks([t for t, _ in compute], run, None)
        o = _max_over_ranks([t for _, t in compute], run, None)
        s = _max_over_ranks(full, run, None)
        logged = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
        run.emit(
            {
                "kind": "ddp",
                "bucket_mb": cap,
                "compression": hook,  # absent in older files: none
                "error_feedback": hook.startswith("powersgd:"),
                "overlap": overlap,
                "first_bucket_mb": first_mb,
                "compute_s": float(np.median(c)),
                "compute_p10_s": float(np.percentile(c, 10)),
                "compute_p90_s": float(np.percentile(c, 90)),
                "optimizer_s": float(np.median(o)),
                "step_s": float(np.median(s)),
                "step_p10_s": float(np.percentile(s, 10)),
                "step_p90_s": float(np.percentile(s, 90)),
                "exposed_comm_s": float(np.median(s) - np.median(c)),
                "repeats": cfg.ddp_repeats,
                "buckets_bytes": [int(v) for v in str(logged).split(",") if v.strip()] or None,
            }
        )


# --------------------------------------------------------------------------- entry points


def run_rank(cfg: HarnessConfig) -> int:
    """One rank's whole run; 0 when complete, 1 when it failed (message on stderr)."""
    run = _Run(cfg, _env())
    threading.Thread(target=run.watchdog, daemon=True).start()
    try:
        run.progress.tick(f"rendezvous of {run.world} ranks")
        dist.init_process_group(
            run.backend,
            rank=run.rank,
            world_size=run.world,
            timeout=dt.timedelta(seconds=cfg.timeout_s),
        )
        run.progress.tick("exchanging rank descriptions")
        meta = _meta(run)
        run.emit(meta)
        _collectives(run, meta["ranks"])
        if cfg.bucket_mb:
            _ddp(run)
        dist.barrier()
    except Exception as e:  # a peer died or timed out: say what we were doing, keep the data
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        code = run.fail(f"{run.progress.activity} failed: {first} (did a rank die or hang?)")
        os._exit(code)  # peers may be gone: tearing the process group down could hang
    run.emit({"kind": "end", "status": "complete", "elapsed_s": time.monotonic() - run.started})
    run.done.set()  # stops the watchdog
    dist.destroy_process_group()
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(cfg: HarnessConfig, n: int) -> int:
    """Run n ranks as processes on this host (127.0.0.1); when one fails, give the others
    a few seconds to report, then end them. 0 when all complete."""
    if n < 1:
        raise SpecError("--local", "", f"needs at least 1 process, got {n}")
    port = _free_port()
    config = json.dumps(asdict(cfg))
    # as torchrun does: one process per core share unless the user chose (oversubscribed
    # intra-op thread pools make small CPU ops take milliseconds)
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // n))
    procs = []
    for rank in range(n):
        env = os.environ | {
            "OMP_NUM_THREADS": threads,
            "RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen([sys.executable, "-m", "commsim.calibrate.harness", config], env=env)
        )
    grace = min(10.0, cfg.timeout_s)
    failed_at = None
    try:
        while any(p.poll() is None for p in procs):
            bad = [p for p in procs if p.returncode not in (None, 0)]
            if bad and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > grace:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    for rank, code in enumerate(codes):
        if code != 0:
            why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"calibrate run: rank {rank} ended with {why}", file=sys.stderr, flush=True)
    return 0 if all(c == 0 for c in codes) else 1


def main(argv: list[str]) -> int:
    """A rank started by launch_local: the configuration as JSON in argv[0]."""
    data = json.loads(argv[0])
    for key in ("ops", "bucket_mb", "comm_hooks"):
        data[key] = tuple(data[key])
    try:
        return run_rank(HarnessConfig(**data))
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


def exit_now(code: int) -> None:
    """End a rank's process without interpreter shutdown: after a complete run, gloo's and
    the TCP store's C++ threads can abort it ("terminate called without an active
    exception", SIGABRT) although every record is already fsynced."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
