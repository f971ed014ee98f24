"""Bring a testbed up (namespaces, veth links, bridges, shaped links, /etc files) and down,
and list the testbeds on this host."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from commsim.calibrate.testbed.host import (
    ETC_NETNS,
    NS_RE,
    STATE_DIR,
    locked,
    namespaces,
    owned_namespaces,
    require_root,
    sh,
    state_path,
)
from commsim.calibrate.testbed.shaping import GSO_BYTES, TCP_RMEM_MAX, shape
from commsim.calibrate.testbed.spec import CPU_BUDGET, Host, TestbedSpec, hosts


def up(spec: TestbedSpec) -> dict[str, Any]:
    """Build the testbed (removing leftovers of the same prefix first); returns its state."""
    require_root()
    with locked():
        _down(spec.prefix)
        try:
            state = _build(spec)
        except BaseException:
            _down(spec.prefix)
            raise
        state_path(spec.prefix).write_text(json.dumps(state, indent=2) + "\n")
    return state


def _build(spec: TestbedSpec) -> dict[str, Any]:
    """Namespaces, their /etc files, the bridges, the shaped rack uplinks and host links;
    returns the state file's contents."""
    sw = f"{spec.prefix}-sw"
    all_hosts = hosts(spec)
    for ns in [sw] + [h.netns for h in all_hosts]:
        _namespace(ns)
    _etc_files(all_hosts)
    streams = max(4, spec.n_hosts)  # per source and link, before the fabric would drop
    links = []
    bridges = ["core"] + [f"tor{r}" for r in range(spec.racks)]
    for br in bridges:
        sh("ip", "-n", sw, "link", "add", "name", br, "type", "bridge", "stp_state", "0")
        sh("ip", "-n", sw, "link", "set", br, "up")
    for r in range(spec.racks if spec.racks > 1 else 0):  # one rack: nothing crosses racks
        links += _rack_uplink(spec, sw, r, all_hosts, streams)
    for h in all_hosts:
        links += _host_link(spec, sw, h, all_hosts, streams)
    return {
        "prefix": spec.prefix,
        "spec": spec.model_dump(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "namespaces": [sw] + [h.netns for h in all_hosts],
        "bridges": {"netns": sw, "names": bridges},
        "hosts": [h.__dict__ for h in all_hosts],
        "links": links,
        "warnings": _warnings(spec),
    }


def _namespace(ns: str) -> None:
    """A network namespace with loopback up, no IPv6 and capped TCP receive windows."""
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    # no IPv6: no router solicitations or DAD chatter on the shaped links
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
    # a stream's window, hence what it can queue in the fabric, stays under TCP_RMEM_MAX
    sh("ip", "netns", "exec", ns, "sysctl", "-qw",
        f"net.ipv4.tcp_rmem=4096 131072 {TCP_RMEM_MAX}")  # fmt: skip


def _etc_files(all_hosts: list[Host]) -> None:
    """Every host's name in /etc/hosts and no DNS: name lookups (torch's c10d looks peers up)
    answer at once, and a resolver never sends a packet beyond the testbed. `ip netns
    exec` can only bind a file over one that exists in /etc."""
    nss = Path("/etc/nsswitch.conf")
    files = {
        "hosts": "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in all_hosts),
        "resolv.conf": "# commsim testbed: no DNS\nnameserver 127.0.0.1\n",
        "nsswitch.conf": re.sub(r"(?m)^hosts:.*$", "hosts: files", nss.read_text())
        if nss.exists()
        else "",
    }
    for h in all_hosts:
        etc = ETC_NETNS / h.netns
        etc.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            if (Path("/etc") / name).exists():
                (etc / name).write_text(text)


def _rack_uplink(
    spec: TestbedSpec, sw: str, r: int, all_hosts: list[Host], streams: int
) -> list[dict[str, Any]]:
    """Rack r's ToR <-> core veth, each end shaped for the hosts whose packets cross it."""
    gso = ("gso_max_size", str(GSO_BYTES))
    up_dev, down_dev = f"up{r}", f"dn{r}"
    sh("ip", "-n", sw, "link", "add", "name", up_dev, *gso, "type", "veth",
        "peer", "name", down_dev, *gso)  # fmt: skip
    sh("ip", "-n", sw, "link", "set", up_dev, "master", f"tor{r}", "up")
    sh("ip", "-n", sw, "link", "set", down_dev, "master", "core", "up")
    inside = [h for h in all_hosts if h.rack == r]
    outside = [h for h in all_hosts if h.rack != r]
    return [
        shape(sw, dev, spec.uplink_rate, srcs, streams) | {"link": link}
        for dev, srcs, link in (
            (up_dev, inside, f"tor{r}->core"),
            (down_dev, outside, f"core->tor{r}"),
        )
    ]


def _host_link(
    spec: TestbedSpec, sw: str, h: Host, all_hosts: list[Host], streams: int
) -> list[dict[str, Any]]:
    """Host h's eth0 <-> its ToR port, addressed and shaped at both ends."""
    gso = ("gso_max_size", str(GSO_BYTES))
    port = h.name
    sh("ip", "-n", sw, "link", "add", "name", port, *gso, "type", "veth",
        "peer", "name", "eth0", "netns", h.netns, *gso)  # fmt: skip
    sh("ip", "-n", sw, "link", "set", port, "master", f"tor{h.rack}", "up")
    sh("ip", "-n", h.netns, "addr", "add", f"{h.address}/16", "dev", "eth0")
    sh("ip", "-n", h.netns, "link", "set", "eth0", "up")
    others = [o for o in all_hosts if o != h]
    return [
        shape(h.netns, "eth0", spec.host_rate, [h], streams) | {"link": f"{h.name}->tor"},
        shape(sw, port, spec.host_rate, others, streams) | {"link": f"tor->{h.name}"},
    ]


def _warnings(spec: TestbedSpec) -> list[str]:
    """What the host may not keep up with."""
    if spec.n_hosts * spec.host_rate <= CPU_BUDGET:
        return []
    return [
        f"all hosts together may inject {spec.n_hosts * spec.host_rate / 1e6:.0f} MB/s; "
        f"above ~{CPU_BUDGET / 1e6:.0f} MB/s the CPU forwarding packets, not the links, "
        "may be the bottleneck: run `commsim testbed check`"
    ]


def down(prefix: str = "cs") -> list[str]:
    """Remove every namespace of the testbed with this prefix (and its processes, links and
    bridges with it), also after a crash; returns the namespaces removed."""
    require_root()
    with locked():
        return _down(prefix)


def _down(prefix: str) -> list[str]:
    removed = owned_namespaces(prefix)
    if ETC_NETNS.is_dir():
        for etc in ETC_NETNS.iterdir():
            if (m := NS_RE.match(etc.name)) and m.group(1) == prefix:
                shutil.rmtree(etc)
    for ns in removed:
        # processes left inside (ranks of an aborted run) would keep the namespace alive
        for pid in sh("ip", "netns", "pids", ns).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        sh("ip", "netns", "delete", ns)
    state_path(prefix).unlink(missing_ok=True)
    return removed


def status() -> list[dict[str, Any]]:
    """Every testbed on this host: from state files, plus leftovers found by namespace name."""
    found: dict[str, list[str]] = {}
    for ns in namespaces():
        if m := NS_RE.match(ns):
            found.setdefault(m.group(1), []).append(ns)
    states = {p.stem: p for p in STATE_DIR.glob("*.json")} if STATE_DIR.is_dir() else {}
    out = []
    for prefix in sorted(set(found) | set(states)):
        present = sorted(found.get(prefix, []))
        row: dict[str, Any] = {"prefix": prefix, "namespaces": present}
        if prefix in states:
            state = json.loads(states[prefix].read_text())
            missing = sorted(set(state["namespaces"]) - set(present))
            row |= {
                "state": "up" if not missing else "broken",
                "missing": missing,
                "spec": state["spec"],
                "created": state["created"],
            }
        else:
            row |= {"state": "leftover", "missing": [], "spec": None, "created": None}
        out.append(row)
    return out
