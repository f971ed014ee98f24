"""One rank's whole run and the entry point of a rank (`python -m commsim.calibrate.harness
CONFIG`, as local.launch_local starts them)."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading
import time

import torch.distributed as dist

from commsim.calibrate.harness.collectives import measure_collectives
from commsim.calibrate.harness.config import HarnessConfig
from commsim.calibrate.harness.ddp import measure_ddp
from commsim.calibrate.harness.rank import Run, meta_record, read_env
from commsim.specs import SpecError


def run_rank(cfg: HarnessConfig) -> int:
    """One rank's whole run; 0 when complete, 1 when it failed (message on stderr)."""
    run = Run(cfg, read_env())
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
        meta = meta_record(run)
        run.emit(meta)
        measure_collectives(run, meta["ranks"])
        if cfg.bucket_mb:
            measure_ddp(run)
        dist.barrier()
    except Exception as e:  # a peer died or timed out: say what we were doing, keep the data
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        code = run.fail(f"{run.progress.activity} failed: {first} (did a rank die or hang?)")
        os._exit(code)  # peers may be gone: tearing the process group down could hang
    run.emit({"kind": "end", "status": "complete", "elapsed_s": time.monotonic() - run.started})
    run.done.set()  # stops the watchdog
    dist.destroy_process_group()
    return 0


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
