"""One rank's run: its identity and device, the records rank 0 writes, its progress and the
watchdog, and the `meta` record of who ran where.

A rank that dies makes the others' collectives fail; one that hangs makes them time out
(init_process_group's timeout). Either way the run ends with one clear message, rank 0
appends an `end` record, and everything measured before stays in the file. A watchdog
ends a rank that makes no progress for timeout + 2 s, for the cases a backend does not
time out by itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commsim import __version__
from commsim.calibrate.harness.config import HarnessConfig
from commsim.calibrate.records import FORMAT_VERSION, append_records
from commsim.specs import SpecError

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
INFO_BYTES = 4096  # room for one rank's JSON self-description in the all-gather


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


class Run:
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


def read_env() -> dict[str, int | str]:
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


def meta_record(run: Run) -> dict[str, Any]:
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
        # NCCL_ALGO / NCCL_PROTO as NCCL reads them from the environment (rank 0's: torchrun
        # gives every rank the same): the fit prices the run under them
        "nccl_env": {v: os.environ[v] for v in ("NCCL_ALGO", "NCCL_PROTO") if os.environ.get(v)}
        if run.backend == "nccl"
        else {},
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {k: v for k, v in asdict(run.cfg).items() if k != "out"},
    }


def max_over_ranks(values: Sequence[float], run: Run, group) -> np.ndarray:
    t = torch.tensor(list(values), dtype=torch.float64, device=run.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().numpy()


def gather_over_ranks(values: Sequence[float], run: Run, group) -> np.ndarray:
    """Every group rank's values (the same count on each), one row per group rank."""
    t = torch.tensor(list(values), dtype=torch.float64, device=run.device)
    rows = [torch.zeros_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, t, group=group)
    return torch.stack(rows).cpu().numpy()
