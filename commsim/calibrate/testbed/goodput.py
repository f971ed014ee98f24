"""Measure the links with TCP streams between namespaces: each flow's goodput over the
window where all flows ran, and each link class against its shaped rate."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commsim.calibrate.testbed.host import TestbedError, require_root, require_up
from commsim.calibrate.testbed.probe import PROBE_PORT
from commsim.calibrate.testbed.spec import GOODPUT, TestbedSpec, hosts
from commsim.specs import SpecError


def _bytes_at(series: Sequence[Sequence[float]], t: float) -> float:
    """Bytes received by time t, interpolated linearly between samples."""
    for (t0, b0), (t1, b1) in zip(series, series[1:], strict=False):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else b1
    return series[-1][1] if t > series[-1][0] else series[0][1]


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@dataclass
class StreamResult:
    """Goodput of each flow over the window where all flows were running, and CPU load."""

    rates: list[float]  # bytes/s of TCP payload
    window_s: float
    cpu_busy: float  # fraction of all cores busy during the measurement


def measure(
    spec: TestbedSpec, flows: Sequence[tuple[str, str]], seconds: float = 1.5, warmup: float = 0.3
) -> StreamResult:
    """Stream TCP between host pairs (short names, e.g. ("r0h0", "r1h0")) all at once."""
    require_root()
    require_up(spec)
    by_name = {h.name: h for h in hosts(spec)}
    if len(set(flows)) != len(flows) or any(s == d for s, d in flows):
        raise SpecError(spec.name, "flows", "flows must be distinct pairs of different hosts")
    for name in (n for flow in flows for n in flow):
        if name not in by_name:
            raise SpecError(spec.name, "flows", f"unknown host {name!r}")
    probe = [sys.executable, "-m", "commsim.calibrate.testbed"]
    dsts = sorted({d for _, d in flows})
    sinks: dict[str, subprocess.Popen[str]] = {}
    sources: list[subprocess.Popen[str]] = []
    try:
        for d in dsts:
            n = sum(1 for _, dd in flows if dd == d)
            cmd = ["ip", "netns", "exec", by_name[d].netns, *probe, "sink", str(PROBE_PORT), str(n)]
            sinks[d] = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        for d, p in sinks.items():
            if p.stdout.readline().strip() != "ready":
                raise TestbedError(f"the stream receiver on {d} did not start")
        for s, d in flows:
            cmd = ["ip", "netns", "exec", by_name[s].netns, *probe, "source",
                   by_name[d].address, str(PROBE_PORT), str(seconds)]  # fmt: skip
            sources.append(
                subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            )
        for (s, _), p in zip(flows, sources, strict=True):
            if p.stdout.readline().strip() != "ready":
                raise TestbedError(f"the stream sender on {s} did not connect")
        cpu0 = _cpu_times()
        for p in sources:  # every stream is connected: start them together
            p.stdin.write("go\n")
            p.stdin.close()
        for p in sources:
            if p.wait(timeout=seconds + 30) != 0:
                raise TestbedError("a stream sender failed (see its message above)")
        samples = {d: json.loads(p.communicate(timeout=30)[0]) for d, p in sinks.items()}
        cpu1 = _cpu_times()
    finally:
        for p in [*sinks.values(), *sources]:
            if p.poll() is None:
                p.kill()
                p.wait()
    series = [samples[d][by_name[s].address] for s, d in flows]
    t0 = max(ser[0][0] for ser in series) + warmup
    t1 = min(ser[-1][0] for ser in series) - 0.05
    if t1 <= t0:
        raise TestbedError("the streams did not overlap long enough: measure for longer")
    rates = [(_bytes_at(ser, t1) - _bytes_at(ser, t0)) / (t1 - t0) for ser in series]
    busy = (cpu1[0] - cpu0[0]) / max(cpu1[1] - cpu0[1], 1.0)
    return StreamResult(rates, t1 - t0, busy)


def check(spec: TestbedSpec, seconds: float = 1.5) -> list[dict[str, Any]]:
    """Measure each link class with TCP streams; expected rates are per flow, shaped (line
    rate, what htb enforces) and as TCP goodput; ratio is the flow farthest from goodput.
    Each row names the tier its flows cross and how many share a rack uplink (a fit
    compares its bandwidths with these; the all-hosts row checks the CPU, not a tier)."""
    names = [[f"r{r}h{h}" for h in range(spec.hosts_per_rack)] for r in range(spec.racks)]
    host, upl, per_rack = spec.host_rate, spec.uplink_rate, spec.hosts_per_rack
    cases: list[tuple[str, list[tuple[str, str]], float, str | None]] = []
    if per_rack >= 2:
        cases.append(("host link (same rack)", [(names[0][0], names[0][1])], host, "inter-node"))
    if spec.racks >= 2:
        one = [(names[0][0], names[1][0])]
        cases.append(("rack uplink, one flow", one, min(host, upl), "cross-rack"))
        if per_rack >= 2:
            shared = [(names[0][h], names[1][h]) for h in range(per_rack)]
            label = f"rack uplink shared by {per_rack}"
            cases.append((label, shared, min(host, upl / per_rack), "cross-rack"))
        every = [(h.name, names[(h.rack + 1) % spec.racks][h.index]) for h in hosts(spec)]
        cases.append(("all hosts at once (CPU load)", every, min(host, upl / per_rack), None))
    rows = []
    for label, flows, shaped, tier in cases:
        res = measure(spec, flows, seconds)
        ratios = [m / (shaped * GOODPUT) for m in res.rates]
        rows.append(
            {
                "link": label,
                "tier": tier,
                "sharing": len(flows) if tier == "cross-rack" else 1,
                "flows": [f"{s}->{d}" for s, d in flows],
                "shaped_Bps": shaped,
                "expected_goodput_Bps": shaped * GOODPUT,
                "measured_Bps": res.rates,
                "ratio": max(ratios, key=lambda x: abs(x - 1)),
                "cpu_busy": res.cpu_busy,
                "cpu_bound": res.cpu_busy > 0.9 and min(res.rates) < 0.9 * shaped * GOODPUT,
            }
        )
    return rows
