"""A testbed's description (racks x hosts, host link and rack uplink rates), validated
against what one host can emulate; its hosts; and the commsim cluster it is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from commsim.spec_base import Latency, Rate, Spec
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec

MIN_RATE = 1e6 / 8  # 1 Mbit/s: below this a 24 KiB bucket is a long unshaped burst
MAX_RATE = 1e9 / 8  # 1 Gbit/s: the host CPU forwards every packet, so links must stay slow
CPU_BUDGET = 100e6  # bytes/s all hosts may inject at once before two cores become the bottleneck
MAX_HOSTS = 64
GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame (MTU 1500, TCP timestamps)

# A catalog GPU is required by ClusterSpec; the ranks here are CPU processes.
CLUSTER_GPU = "cpu-host"


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
