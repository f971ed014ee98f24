"""One rank's whole run, N ranks started on this host (`--local N`), and the entry point of
a rank so started (`python -m commsim.calibrate.harness CONFIG`)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import torch.distributed as dist

from commsim.calibrate.harness.collectives import measure_collectives
from commsim.calibrate.harness.config import HarnessConfig
from commsim.calibrate.harness.ddp import measure_ddp
from commsim.calibrate.harness.rank import Run, meta_record, read_env
from commsim.calibrate.records import append_records
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(cfg: HarnessConfig, n: int) -> int:
    """Run n ranks as processes on this host (127.0.0.1); when one fails, give the others
    a few seconds to report, then end them. SIGTERM or Ctrl-C (SIGINT) to the launcher ends
    every rank and closes the run with an `interrupted` end record (what was measured
    stays). 0 when all complete; 128 + the signal when interrupted."""
    if n < 1:
        raise SpecError("--local", "", f"needs at least 1 process, got {n}")
    port = _free_port()
    config = json.dumps(asdict(cfg))
    # as torchrun does: one process per core share unless the user chose (oversubscribed
    # intra-op thread pools make small CPU ops take milliseconds)
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // n))
    start = os.path.getsize(cfg.out) if os.path.exists(cfg.out) else 0
    started = time.monotonic()
    stop: list[int] = []  # the signal that asked us to stop
    handlers = {s: signal.signal(s, lambda sig, _: stop.append(sig)) for s in STOP_SIGNALS}
    procs = []
    try:
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
            cmd = [sys.executable, "-m", "commsim.calibrate.harness", config]
            # their own session: a terminal's Ctrl-C reaches the launcher, which ends them
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        _supervise(procs, min(10.0, cfg.timeout_s), stop)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s, h in handlers.items():
            signal.signal(s, h)
    if stop:
        return _interrupted(cfg.out, start, stop[0], time.monotonic() - started)
    codes = [p.returncode for p in procs]
    for rank, code in enumerate(codes):
        if code != 0:
            why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            print(f"calibrate run: rank {rank} ended with {why}", file=sys.stderr, flush=True)
    return 0 if all(c == 0 for c in codes) else 1


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _supervise(procs: list[subprocess.Popen], grace: float, stop: list[int]) -> None:
    """Wait for the ranks; when one fails, end the rest after `grace` seconds; when a signal
    arrives, end them at once, rank 0 (the writer) first, so no rank records a failure."""
    failed_at = None
    while any(p.poll() is None for p in procs):
        if stop:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + grace
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            return
        bad = [p for p in procs if p.returncode not in (None, 0)]
        if bad and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)


def _interrupted(out: str, start: int, sig: int, elapsed: float) -> int:
    """Close the run this launcher started (its meta record after byte `start` of the
    results file) with an `interrupted` end record, unless it already has an end; say so."""
    name = signal.Signals(sig).name
    runs, ended, measured = [], set(), 0
    if os.path.exists(out):
        with open(out, "rb") as f:
            f.seek(start)
            for line in f.read().decode(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line a killed rank cut short
                kind = rec.get("kind") if isinstance(rec, dict) else None
                runs += [rec["run"]] if kind == "meta" and rec.get("run") else []
                ended |= {rec.get("run")} if kind == "end" else set()
                measured += kind in ("collective", "ddp")
    if runs and runs[-1] not in ended:
        message = f"stopped by {name} to the launcher; every rank ended"
        record = {"kind": "end", "status": "interrupted", "message": message}
        append_records(out, [{"run": runs[-1]} | record | {"elapsed_s": elapsed}])
    print(
        f"calibrate run: interrupted by {name}; every rank ended; the {measured} "
        f"measurements taken are in {out}",
        file=sys.stderr,
        flush=True,
    )
    return 128 + sig


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
