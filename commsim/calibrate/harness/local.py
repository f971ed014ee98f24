"""`calibrate run --local N`: start N ranks on this host (127.0.0.1) and supervise them. No
torch here: the launcher only starts processes, so its ranks start without waiting for a
torch import of its own (seconds on a loaded host)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict

from commsim.calibrate.harness.config import HarnessConfig
from commsim.calibrate.records import append_records
from commsim.specs import SpecError


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
