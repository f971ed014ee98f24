"""Run a command once per rank, each in its host's namespace, torchrun-style: which host
each rank gets, its environment, and how the run ends."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from commsim.calibrate.testbed.host import require_root, require_up
from commsim.calibrate.testbed.spec import Host, TestbedSpec, cluster_spec, hosts
from commsim.specs import SpecError
from commsim.topology.build import build_cluster
from commsim.topology.placement import PLACEMENTS, place


def rank_hosts(
    spec: TestbedSpec, placement: str | Sequence[str] = "blocked", world_size: int | None = None
) -> list[Host]:
    """The host of each rank, exactly as commsim places ranks for a prediction.

    A job of N ranks gets the first N hosts in rack order and a named placement (blocked,
    interleaved, topology-aware) orders ranks on them with commsim's own `place`; a list
    (or a comma-separated string) names one host per rank instead."""
    all_hosts = hosts(spec)
    if isinstance(placement, str) and placement in PLACEMENTS:
        n = spec.n_hosts if world_size is None else world_size
        if not 1 <= n <= spec.n_hosts:
            raise SpecError(spec.name, "world_size", f"must be 1..{spec.n_hosts}, got {n}")
        return [
            all_hosts[int(g)] for g in place(build_cluster(cluster_spec(spec), n), n, placement)
        ]
    names = placement.split(",") if isinstance(placement, str) else list(placement)
    by_name = {h.name: h for h in all_hosts} | {h.netns: h for h in all_hosts}
    chosen = []
    for name in (n.strip() for n in names):
        if name not in by_name:
            raise SpecError(
                spec.name,
                "placement",
                f"{name!r} is neither {', '.join(PLACEMENTS)} nor a host "
                f"(r0h0 .. r{spec.racks - 1}h{spec.hosts_per_rack - 1})",
            )
        chosen.append(by_name[name])
    if len(set(chosen)) != len(chosen):
        raise SpecError(spec.name, "placement", "a host is listed twice (one rank per host)")
    if world_size is not None and world_size != len(chosen):
        raise SpecError(spec.name, "world_size", f"{world_size} ranks but {len(chosen)} hosts")
    return chosen


def rank_env(spec: TestbedSpec, ranks: Sequence[Host], rank: int, port: int) -> dict[str, str]:
    """The torchrun-style environment of one rank, plus where it sits in the testbed."""
    host = ranks[rank]
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(len(ranks)),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": ranks[0].address,
        "MASTER_PORT": str(port),
        "COMMSIM_HOST": host.name,
        "COMMSIM_RACK": str(host.rack),
        "COMMSIM_TESTBED": spec.name,
        # gloo, NCCL and tensorpipe would otherwise look up the host name (the root
        # namespace's) to choose an interface
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TP_SOCKET_IFNAME": "eth0",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class RunResult:
    """How a multi-rank run ended: the exit code to propagate and each rank's."""

    returncode: int = 0
    hosts: list[str] = field(default_factory=list)  # host of each rank
    codes: list[int | None] = field(default_factory=list)  # per rank, shell style
    failed: list[int] = field(default_factory=list)  # ranks that failed on their own
    killed: list[int] = field(default_factory=list)  # ranks stopped because of them
    timed_out: bool = False
    lines: list[tuple[int, str]] = field(default_factory=list)  # (rank, line) as they came


def _exit_code(returncode: int) -> int:
    """A shell-style code: killed by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _kill_all(procs: Sequence[subprocess.Popen[str]], grace: float = 3.0) -> list[int]:
    """SIGTERM each live rank's process group, SIGKILL what outlives `grace`; returns them."""
    alive = [i for i, p in enumerate(procs) if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for i in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[i].pid, sig)
        deadline = time.monotonic() + grace
        while any(procs[i].poll() is None for i in alive) and time.monotonic() < deadline:
            time.sleep(0.02)
    return alive


def run(
    spec: TestbedSpec,
    command: Sequence[str],
    placement: str | Sequence[str] = "blocked",
    world_size: int | None = None,
    timeout: float | None = None,
    port: int = 29500,
    on_line: Callable[[int, Host, str], None] | None = None,
) -> RunResult:
    """Run `command` once per rank, each in its host's namespace, torchrun-style.

    Output lines go to on_line as they arrive. When a rank fails the others are killed and
    the returncode is the worst failing rank's; on timeout all are killed and it is 124."""
    require_root()
    if not command:
        raise SpecError(spec.name, "command", "no command given")
    require_up(spec)
    ranks = rank_hosts(spec, placement, world_size)
    result = RunResult(hosts=[h.name for h in ranks], codes=[None] * len(ranks))
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[subprocess.Popen[str]] = []
    try:
        _start(spec, ranks, command, port, lines, procs)
        _follow(result, ranks, procs, lines, timeout, on_line)
    finally:
        _kill_all(procs)
    if result.failed:
        result.returncode = max(result.codes[r] or 0 for r in result.failed)
    elif result.timed_out:
        result.returncode = 124
    return result


def _start(
    spec: TestbedSpec,
    ranks: Sequence[Host],
    command: Sequence[str],
    port: int,
    lines: queue.Queue[tuple[int, str | None]],
    procs: list[subprocess.Popen[str]],
) -> None:
    """Start each rank in its host's namespace, appending to `procs` as it goes (so what
    started can be killed if a start fails); a thread per rank puts its output lines, then
    None, on `lines`."""

    def pump(rank: int, stream: Any) -> None:
        for line in stream:
            lines.put((rank, line.rstrip("\n")))
        lines.put((rank, None))

    for rank, host in enumerate(ranks):
        p = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, *command],
            env=os.environ | rank_env(spec, ranks, rank, port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # a process group per rank, to kill what it spawned
        )
        procs.append(p)
        threading.Thread(target=pump, args=(rank, p.stdout), daemon=True).start()


def _follow(
    result: RunResult,
    ranks: Sequence[Host],
    procs: Sequence[subprocess.Popen[str]],
    lines: queue.Queue[tuple[int, str | None]],
    timeout: float | None,
    on_line: Callable[[int, Host, str], None] | None,
) -> None:
    """Pass output lines on and record exit codes until every rank has exited and closed
    its output; on the first failure or the timeout, kill the others."""
    deadline = None if timeout is None else time.monotonic() + timeout
    open_streams = len(ranks)
    stopping = False
    exited_at = None  # a rank's orphaned child may hold its output open: wait 2 s at most
    while (open_streams or None in result.codes) and (
        exited_at is None or time.monotonic() < exited_at + 2.0
    ):
        with contextlib.suppress(queue.Empty):
            rank, line = lines.get(timeout=0.05)
            if line is None:
                open_streams -= 1
            else:
                result.lines.append((rank, line))
                if on_line:
                    on_line(rank, ranks[rank], line)
        for rank, p in enumerate(procs):
            if result.codes[rank] is None and p.poll() is not None:
                result.codes[rank] = _exit_code(p.returncode)
                if p.returncode != 0 and not stopping:
                    result.failed.append(rank)
        if not stopping and deadline is not None and time.monotonic() > deadline:
            result.timed_out = True
        if not stopping and (result.failed or result.timed_out):
            stopping = True
            result.killed = _kill_all(procs)
        if exited_at is None and None not in result.codes:
            exited_at = time.monotonic()
