"""An emulated multi-rack cluster on one Linux host: network namespaces, veth links, bridges, htb.

Each host is a network namespace `{prefix}-r{R}h{H}` with one interface `eth0` at
10.77.R.(H+1)/16. The switches are Linux bridges (one ToR per rack, one core) in a switch
namespace `{prefix}-sw`, so nothing touches the root namespace's network. Every link is a
veth pair shaped with htb on the egress of both ends (one token bucket per direction, like
a full-duplex cable): host <-> ToR at host_rate, ToR <-> core at uplink_rate. Each link
shares its rate fairly between source hosts and never drops a packet (receive windows are
capped and queues hold them), like a lossless InfiniBand or RoCE fabric.

Latency is not emulated: netem, the only Linux qdisc that delays packets, is not available
here, so a non-zero `latency` is refused; calibration fits the natural latency of veth,
bridges and TCP instead (about 100 us round trip). Shaping counts Ethernet frames, so TCP
goodput is 95.6% of the shaped rate (1448 payload bytes per 1514-byte frame).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from commsim.specs import ClusterSpec, Latency, Rate, Spec, SpecError, load_spec

STATE_DIR = Path("/run/commsim-testbed")
ETC_NETNS = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*
MIN_RATE = 1e6 / 8  # 1 Mbit/s: below this a 24 KiB bucket is a long unshaped burst
MAX_RATE = 1e9 / 8  # 1 Gbit/s: the host CPU forwards every packet, so links must stay slow
CPU_BUDGET = 100e6  # bytes/s all hosts may inject at once before two cores become the bottleneck
MAX_HOSTS = 64
GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame (MTU 1500, TCP timestamps)
PROBE_PORT = 5201
GSO_BYTES = 16384  # largest packet the veths hand on: smaller costs CPU, larger costs precision
TCP_RMEM_MAX = 4194304  # receive buffer cap in every host: bounds each stream's bytes in flight
_NS_RE = re.compile(r"^([a-z][a-z0-9]*)-(sw|r\d+h\d+)$")
# A catalog GPU is required by ClusterSpec; the ranks here are CPU processes.
CLUSTER_GPU = "cpu-host"


class TestbedError(SpecError):
    """The host cannot run the testbed (not root, no iproute2, not up, a command failed)."""

    __test__ = False  # not a pytest class

    def __init__(self, message: str):
        super().__init__("commsim testbed", "", message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


def _no_latency(v: float) -> float:
    if v > 0:
        raise ValueError(
            "commsim testbed cannot emulate latency (netem, the only qdisc that delays "
            "packets, is not available; links are only rate-shaped): set 0 or leave it out, "
            "calibration fits the natural latency of veth, bridges and TCP"
        )
    return v


def _rate_bounds(v: float) -> float:
    if not MIN_RATE <= v <= MAX_RATE:
        raise ValueError(
            f"{v * 8 / 1e6:g} Mbit/s is outside 1 Mbit/s .. 1 Gbit/s (the host CPU forwards "
            "every packet: faster links would make the CPU, not the link, the bottleneck)"
        )
    return v


LinkRate = Annotated[Rate, AfterValidator(_rate_bounds)]


class TestbedSpec(Spec):
    """A small emulated cluster: racks x hosts, host link and rack uplink rates."""

    __test__ = False  # not a pytest class

    name: str
    description: str = ""
    racks: int = Field(ge=1, le=250)
    hosts_per_rack: int = Field(ge=1, le=250)
    host_rate: LinkRate  # host <-> ToR, each direction
    uplink_rate: LinkRate  # ToR <-> core, each direction
    latency: Annotated[Latency, AfterValidator(_no_latency)] = 0.0
    prefix: str = Field(default="cs", pattern=r"^[a-z][a-z0-9]{0,9}$")

    @model_validator(mode="after")
    def _few_hosts(self) -> TestbedSpec:
        if self.racks * self.hosts_per_rack > MAX_HOSTS:
            raise ValueError(
                f"{self.racks} racks x {self.hosts_per_rack} hosts is over {MAX_HOSTS} hosts"
            )
        return self

    @property
    def n_hosts(self) -> int:
        return self.racks * self.hosts_per_rack

    @property
    def oversubscription(self) -> float:
        """Rack downlink capacity over uplink capacity (at least 1)."""
        return max(1.0, self.hosts_per_rack * self.host_rate / self.uplink_rate)


def load_testbed(path: str | Path) -> TestbedSpec:
    """Read and validate a testbed YAML; errors are SpecErrors naming the file and field."""
    return load_spec(TestbedSpec, path)


@dataclass(frozen=True)
class Host:
    """One emulated host: its short name (r0h1), rack, index in the rack, namespace, address."""

    name: str
    rack: int
    index: int
    netns: str
    address: str


def hosts(spec: TestbedSpec) -> list[Host]:
    """All hosts in rack order (r0h0, r0h1, ..., r1h0, ...), the order commsim numbers nodes."""
    return [
        Host(f"r{r}h{h}", r, h, f"{spec.prefix}-r{r}h{h}", f"10.77.{r}.{h + 1}")
        for r in range(spec.racks)
        for h in range(spec.hosts_per_rack)
    ]


def cluster_spec(spec: TestbedSpec) -> ClusterSpec:
    """The testbed as a commsim cluster (one 'GPU' per host), so predictions describe it.

    commsim splits the rack uplink into ceil(uplink_rate / host_rate) leaf-spine links: exact
    when the uplink is no faster than a host link or a multiple of it, as in testbeds/.
    Rates are line rates (goodput is 95.6% of them); latencies are placeholders that
    calibration fits."""
    return ClusterSpec.model_validate(
        {
            "name": spec.name,
            "description": spec.description or f"testbed {spec.name}",
            "source": "commsim testbed (network namespaces, bridges, htb-shaped veth links)",
            "nodes": spec.n_hosts,
            "node": {
                "gpu": CLUSTER_GPU,
                "gpus_per_node": 1,
                "interconnect": "pcie",
                # every quantity explicit: Spec does not validate (parse) string defaults
                "intra_latency": "1us",
                "pcie_bandwidth": "32GB/s",
                "nics": {"count": 1, "bandwidth": spec.host_rate, "latency": "20us"},
            },
            "fabric": {
                "kind": "ethernet",
                "tiers": 2,
                "nodes_per_leaf": spec.hosts_per_rack,
                "oversubscription": [spec.oversubscription, 1.0],
                "link_latency": "1us",
                "switch_latency": "5us",
                "routing": "balanced",
            },
        }
    )


# ---------------------------------------------------------------- host requirements


def require_root() -> None:
    """Refuse clearly unless this is root with iproute2's `ip` and `tc` on PATH."""
    if os.geteuid() != 0:
        raise TestbedError(
            "commsim testbed needs root: it creates network namespaces, veth links and tc "
            f"qdiscs; this process runs as uid {os.geteuid()} (try sudo)"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise TestbedError(
            f"commsim testbed needs iproute2: {' and '.join(missing)} not found on PATH"
        )


def _sh(*cmd: str) -> str:
    """Run one iproute2 command; a failure is a TestbedError quoting it and its stderr."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit code {done.returncode}"
        raise TestbedError(f"`{' '.join(cmd)}` failed: {why}")
    return done.stdout


def _namespaces() -> list[str]:
    """Names of all network namespaces (`ip netns list` prints 'name (id: N)')."""
    if shutil.which("ip") is None:
        raise TestbedError("commsim testbed needs iproute2: ip not found on PATH")
    return [line.split()[0] for line in _sh("ip", "netns", "list").splitlines() if line.strip()]


def owned_namespaces(prefix: str) -> list[str]:
    """Namespaces a testbed with this prefix makes, found by name (no state file needed)."""
    return [ns for ns in _namespaces() if (m := _NS_RE.match(ns)) and m.group(1) == prefix]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One up or down at a time on this host (each takes well under a second)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


# ---------------------------------------------------------------- up / down / status


def _shape(ns: str, dev: str, rate: float, sources: Sequence[Host], streams: int) -> dict[str, Any]:
    """Shape one device's egress to `rate` with htb; returns the record for the state file.

    Packets under 128 bytes (TCP ACKs, ARP, tiny messages) go first, so a bulk stream does
    not starve the opposite direction's ACKs; the rest is shared fairly between source
    hosts, each in its own FIFO, deep enough for the receive windows of `streams` TCP
    streams: the fabric is lossless, like InfiniBand or RoCE with PFC (a drop-tail FIFO
    splits bandwidth unevenly between TCP streams, and fair queues are not available here).
    Buckets hold 1 ms, and at least 1.5 GSO packets so htb never waits on a partial one."""
    burst = max(GSO_BYTES * 3 // 2, int(rate * 1e-3))
    queue_bytes = TCP_RMEM_MAX * streams

    def bits(r: float) -> str:
        return f"{int(r * 8)}bit"

    common = f"ceil {bits(rate)} burst {burst} cburst {burst} quantum {2 * GSO_BYTES}"
    batch = [
        f"qdisc replace dev {dev} root handle 1: htb default 10",
        f"class add dev {dev} parent 1: classid 1:1 htb rate {bits(rate)} {common}",
        f"class add dev {dev} parent 1:1 classid 1:10 htb rate {bits(rate / 20)} {common} prio 0",
        f"filter add dev {dev} parent 1: protocol ip prio 1 u32 "
        "match u16 0x0000 0xff80 at 2 flowid 1:10",  # IP total length < 128
    ]
    share = rate * 19 / 20 / len(sources)
    for i, src in enumerate(sources):
        cls = f"1:{0x100 + i:x}"
        batch += [
            f"class add dev {dev} parent 1:1 classid {cls} htb rate {bits(share)} {common} prio 1",
            f"qdisc add dev {dev} parent {cls} bfifo limit {queue_bytes}",
            f"filter add dev {dev} parent 1: protocol ip prio 2 u32 "
            f"match ip src {src.address}/32 flowid {cls}",
        ]
    done = subprocess.run(
        ["tc", "-n", ns, "-batch", "-"],
        input="\n".join(batch) + "\n",
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise TestbedError(f"`tc -n {ns}` shaping {dev} failed: {done.stderr.strip()}")
    return {
        "netns": ns,
        "dev": dev,
        "rate_Bps": rate,
        "burst_bytes": burst,
        "queue_bytes_per_source": queue_bytes,
        "sources": [h.name for h in sources],
    }


def up(spec: TestbedSpec) -> dict[str, Any]:
    """Build the testbed (removing leftovers of the same prefix first); returns its state."""
    require_root()
    with _locked():
        _down(spec.prefix)
        try:
            state = _build(spec)
        except BaseException:
            _down(spec.prefix)
            raise
        state_path(spec.prefix).write_text(json.dumps(state, indent=2) + "\n")
    return state


def _build(spec: TestbedSpec) -> dict[str, Any]:
    sw = f"{spec.prefix}-sw"
    all_hosts = hosts(spec)
    for ns in [sw] + [h.netns for h in all_hosts]:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        # no IPv6: no router solicitations or DAD chatter on the shaped links
        _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        # a stream's window, hence what it can queue in the fabric, stays under TCP_RMEM_MAX
        _sh("ip", "netns", "exec", ns, "sysctl", "-qw",
            f"net.ipv4.tcp_rmem=4096 131072 {TCP_RMEM_MAX}")  # fmt: skip
    # Every host's name in /etc/hosts and no DNS: name lookups (torch's c10d looks peers up)
    # answer at once, and a resolver never sends a packet beyond the testbed. `ip netns
    # exec` can only bind a file over one that exists in /etc.
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
    streams = max(4, spec.n_hosts)  # per source and link, before the fabric would drop
    links = []
    gso = ("gso_max_size", str(GSO_BYTES))
    bridges = ["core"] + [f"tor{r}" for r in range(spec.racks)]
    for br in bridges:
        _sh("ip", "-n", sw, "link", "add", "name", br, "type", "bridge", "stp_state", "0")
        _sh("ip", "-n", sw, "link", "set", br, "up")
    for r in range(spec.racks):
        up_dev, down_dev = f"up{r}", f"dn{r}"
        _sh("ip", "-n", sw, "link", "add", "name", up_dev, *gso, "type", "veth",
            "peer", "name", down_dev, *gso)  # fmt: skip
        _sh("ip", "-n", sw, "link", "set", up_dev, "master", f"tor{r}", "up")
        _sh("ip", "-n", sw, "link", "set", down_dev, "master", "core", "up")
        inside = [h for h in all_hosts if h.rack == r]
        outside = [h for h in all_hosts if h.rack != r]
        for dev, srcs, link in (
            (up_dev, inside, f"tor{r}->core"),
            (down_dev, outside, f"core->tor{r}"),
        ):
            links.append(_shape(sw, dev, spec.uplink_rate, srcs, streams) | {"link": link})
    for h in all_hosts:
        port = h.name
        _sh("ip", "-n", sw, "link", "add", "name", port, *gso, "type", "veth",
            "peer", "name", "eth0", "netns", h.netns, *gso)  # fmt: skip
        _sh("ip", "-n", sw, "link", "set", port, "master", f"tor{h.rack}", "up")
        _sh("ip", "-n", h.netns, "addr", "add", f"{h.address}/16", "dev", "eth0")
        _sh("ip", "-n", h.netns, "link", "set", "eth0", "up")
        others = [o for o in all_hosts if o != h]
        links.append(
            _shape(h.netns, "eth0", spec.host_rate, [h], streams) | {"link": f"{h.name}->tor"}
        )
        links.append(_shape(sw, port, spec.host_rate, others, streams) | {"link": f"tor->{h.name}"})
    warnings = []
    if spec.n_hosts * spec.host_rate > CPU_BUDGET:
        warnings.append(
            f"all hosts together may inject {spec.n_hosts * spec.host_rate / 1e6:.0f} MB/s; "
            f"above ~{CPU_BUDGET / 1e6:.0f} MB/s the CPU forwarding packets, not the links, "
            "may be the bottleneck: run `commsim testbed check`"
        )
    return {
        "prefix": spec.prefix,
        "spec": spec.model_dump(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "namespaces": [sw] + [h.netns for h in all_hosts],
        "bridges": {"netns": sw, "names": bridges},
        "hosts": [h.__dict__ for h in all_hosts],
        "links": links,
        "warnings": warnings,
    }


def down(prefix: str = "cs") -> list[str]:
    """Remove every namespace of the testbed with this prefix (and its processes, links and
    bridges with it), also after a crash; returns the namespaces removed."""
    require_root()
    with _locked():
        return _down(prefix)


def _down(prefix: str) -> list[str]:
    removed = owned_namespaces(prefix)
    if ETC_NETNS.is_dir():
        for etc in ETC_NETNS.iterdir():
            if (m := _NS_RE.match(etc.name)) and m.group(1) == prefix:
                shutil.rmtree(etc)
    for ns in removed:
        # processes left inside (ranks of an aborted run) would keep the namespace alive
        for pid in _sh("ip", "netns", "pids", ns).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _sh("ip", "netns", "delete", ns)
    state_path(prefix).unlink(missing_ok=True)
    return removed


def status() -> list[dict[str, Any]]:
    """Every testbed on this host: from state files, plus leftovers found by namespace name."""
    found: dict[str, list[str]] = {}
    for ns in _namespaces():
        if m := _NS_RE.match(ns):
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


def require_up(spec: TestbedSpec) -> None:
    """Refuse unless this testbed is up, complete, and built from the same description."""
    path = state_path(spec.prefix)
    if not path.exists():
        raise TestbedError(
            f"testbed {spec.prefix!r} is not up: run `commsim testbed up` with this file first"
        )
    state = json.loads(path.read_text())
    if state["spec"] != spec.model_dump():
        raise TestbedError(
            f"testbed {spec.prefix!r} is up with a different description "
            f"({state['spec']['name']!r}): run `commsim testbed up` with this file again"
        )
    missing = set(state["namespaces"]) - set(owned_namespaces(spec.prefix))
    if missing:
        raise TestbedError(
            f"testbed {spec.prefix!r} is broken (missing {', '.join(sorted(missing))}): "
            "run `commsim testbed up` again"
        )


# ---------------------------------------------------------------- running ranks


def rank_hosts(
    spec: TestbedSpec, placement: str | Sequence[str] = "blocked", world_size: int | None = None
) -> list[Host]:
    """The host of each rank, exactly as commsim places ranks for a prediction.

    A job of N ranks gets the first N hosts in rack order and a named placement (blocked,
    interleaved, topology-aware) orders ranks on them with commsim's own `place`; a list
    (or a comma-separated string) names one host per rank instead."""
    # imported here: the stream probes run this module in every namespace and start faster
    from commsim.topology.build import build_cluster
    from commsim.topology.placement import PLACEMENTS, place

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

    def pump(rank: int, stream: Any) -> None:
        for line in stream:
            lines.put((rank, line.rstrip("\n")))
        lines.put((rank, None))

    try:
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
    finally:
        _kill_all(procs)
    if result.failed:
        result.returncode = max(result.codes[r] or 0 for r in result.failed)
    elif result.timed_out:
        result.returncode = 124
    return result


# ---------------------------------------------------------------- measuring links


def _probe(argv: Sequence[str]) -> None:
    """Inside a namespace: `sink PORT N` receives N streams and prints, per sender address,
    (time, bytes so far) samples from the first byte on; `source ADDR PORT SECONDS`
    connects, says ready, and streams for SECONDS once a line arrives on stdin."""
    if argv[0] == "sink":
        port, n = int(argv[1]), int(argv[2])
        server = socket.create_server(("0.0.0.0", port), backlog=n)
        print("ready", flush=True)
        sel = selectors.DefaultSelector()
        sel.register(server, selectors.EVENT_READ, None)
        samples: dict[str, list[tuple[float, int]]] = {}
        totals: dict[str, int] = {}
        done = 0
        while done < n:
            events = sel.select(timeout=15)
            if not events:
                sys.exit("sink: no data for 15 s")
            for key, _ in events:
                if key.data is None:
                    conn, (addr, _) = server.accept()
                    sel.register(conn, selectors.EVENT_READ, addr)
                    samples[addr], totals[addr] = [], 0
                    continue
                addr = key.data
                got = len(key.fileobj.recv(1 << 20))
                now = time.monotonic()
                totals[addr] += got
                if not got:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    done += 1
                if not got or not samples[addr] or now - samples[addr][-1][0] >= 0.005:
                    samples[addr].append((now, totals[addr]))
        print(json.dumps(samples), flush=True)
    else:
        addr, port, seconds = argv[1], int(argv[2]), float(argv[3])
        chunk = bytes(256 * 1024)
        with socket.create_connection((addr, port), timeout=15) as s:
            print("ready", flush=True)
            sys.stdin.readline()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                s.sendall(chunk)


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
    rate, what htb enforces) and as TCP goodput; ratio is the flow farthest from goodput."""
    names = [[f"r{r}h{h}" for h in range(spec.hosts_per_rack)] for r in range(spec.racks)]
    host, upl, per_rack = spec.host_rate, spec.uplink_rate, spec.hosts_per_rack
    cases: list[tuple[str, list[tuple[str, str]], float]] = []
    if per_rack >= 2:
        cases.append(("host link (same rack)", [(names[0][0], names[0][1])], host))
    if spec.racks >= 2:
        cases.append(("rack uplink, one flow", [(names[0][0], names[1][0])], min(host, upl)))
        if per_rack >= 2:
            shared = [(names[0][h], names[1][h]) for h in range(per_rack)]
            cases.append((f"rack uplink shared by {per_rack}", shared, min(host, upl / per_rack)))
        every = [(h.name, names[(h.rack + 1) % spec.racks][h.index]) for h in hosts(spec)]
        cases.append(("all hosts at once (CPU load)", every, min(host, upl / per_rack)))
    rows = []
    for label, flows, shaped in cases:
        res = measure(spec, flows, seconds)
        ratios = [m / (shaped * GOODPUT) for m in res.rates]
        rows.append(
            {
                "link": label,
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


if __name__ == "__main__":
    _probe(sys.argv[1:])
