"""Failure rates by component class, with their sources, and what one failure takes down.

The defaults are fitted to Meta's Llama 3 405B pre-training (Grattafiori et al. 2024, "The
Llama 3 Herd of Models", arXiv:2407.21783, Sec. 3.3.4 and Table 5): 419 unexpected job
interruptions in a 54-day snapshot on 16,384 H100s, 2,048 hosts of 8 GPUs with one 400 Gb/s
NIC per GPU, 16 GPUs (two hosts) per Minipack2 top-of-rack switch (Sec. 3.3.1). The table's
counts add up to 419 and are used as they are (its 30.1% for "faulty GPU" is not 148 / 419).
Each cause is charged to the part it names, per unit of that part and hour:

  gpu       faulty GPU 148, SRAM 19, system processor 17, thermal/sensor 6, silent data
            corruption 6                                                per GPU
  hbm       HBM3 72                                                     per GPU
  software  software bug 54, NCCL watchdog timeout 7, dependency 2      per GPU (a job with
            more ranks runs more processes that can hit a bug: an assumption)
  nic       NIC 7                                                       per NIC
  host      unplanned host maintenance 32, SSD 3, power supply 3, chassis 2, IO expansion
            board 2, CPU 2, system memory 2                             per node
  switch    5% of top-of-rack switches fail in a year (Gill, Jain, Nagappan, "Understanding
            network failures in data centers", SIGCOMM 2011)            per switch
  cable     the rest of Llama 3's 35 "network switch/cable" interruptions once its 1,024
            ToRs have taken their share at the switch rate, over its 16,384 NIC cables

Planned interruptions (47 of the 466) are not failures: a checkpoint is taken before them.
A GPU, HBM, NIC or host failure takes its node out of service; a software failure only its
processes. A switch or a cable is a place in the graph: what its failure takes down or
degrades is its blast radius (commsim.reliability.blast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: `commsim --help` must not import pydantic
    from commsim.specs import ClusterSpec

HOUR = 3600.0
LLAMA3_HOURS = 54 * 24  # the snapshot: 1,296 hours
LLAMA3_GPUS = 16_384
LLAMA3_NODES = LLAMA3_GPUS // 8
LLAMA3_NICS = LLAMA3_GPUS  # one NIC per GPU
LLAMA3_TORS = LLAMA3_GPUS // 16  # 16 GPUs a rack, one ToR each (Sec. 3.3.1)

# Llama 3 Table 5: cause -> (class, interruptions in the snapshot)
LLAMA3_CAUSES: dict[str, tuple[str, int]] = {
    "faulty GPU": ("gpu", 148),
    "GPU HBM3 memory": ("hbm", 72),
    "software bug": ("software", 54),
    "network switch/cable": ("network", 35),
    "host maintenance": ("host", 32),
    "GPU SRAM memory": ("gpu", 19),
    "GPU system processor": ("gpu", 17),
    "NIC": ("nic", 7),
    "NCCL watchdog timeouts": ("software", 7),
    "silent data corruption": ("gpu", 6),
    "GPU thermal interface + sensor": ("gpu", 6),
    "SSD": ("host", 3),
    "power supply": ("host", 3),
    "server chassis": ("host", 2),
    "IO expansion board": ("host", 2),
    "dependency": ("software", 2),
    "CPU": ("host", 2),
    "system memory": ("host", 2),
}

CLASSES = ("gpu", "hbm", "nic", "host", "switch", "cable", "software")
HARDWARE = ("gpu", "hbm", "nic", "host", "switch", "cable")  # a failure needs a repair
TOR_ANNUAL_FAILURE = 0.05  # Gill et al. 2011: about 5% of ToRs fail in their one-year study


def _llama3(cls: str) -> int:
    return sum(n for c, n in LLAMA3_CAUSES.values() if c == cls)


def _default_rates() -> dict[str, float]:
    """Failures per unit and hour of each class (see the module docstring)."""
    h = LLAMA3_HOURS
    switch = -math.log(1.0 - TOR_ANNUAL_FAILURE) / (365.25 * 24)
    cable = (_llama3("network") - LLAMA3_TORS * switch * h) / (LLAMA3_NICS * h)
    return {
        "gpu": _llama3("gpu") / (LLAMA3_GPUS * h),
        "hbm": _llama3("hbm") / (LLAMA3_GPUS * h),
        "nic": _llama3("nic") / (LLAMA3_NICS * h),
        "host": _llama3("host") / (LLAMA3_NODES * h),
        "switch": switch,
        "cable": cable,
        "software": _llama3("software") / (LLAMA3_GPUS * h),
    }


DEFAULT_RATES_PER_HOUR = _default_rates()

# A failed node, switch or cable is out of service while it is repaired or replaced:
# "physical replacement takes 3-5 days" (Arfeen et al. 2025, nonuniform tensor parallelism,
# arXiv:2504.06095, as summarised at research-viewer.pages.dev, not re-verified): the low end.
DEFAULT_REPAIR_S = 3 * 24 * HOUR
# A switch or an optic is swapped from on-site spares: one hour, an assumption (half of the
# switch failures Singh et al. saw in 180,000 Azure switches were over within 6 minutes,
# "Surviving switch failures in cloud datacenters", CCR 51(2), 2021).
DEFAULT_FABRIC_REPAIR_S = HOUR
FABRIC = ("switch", "cable")
# Llama 3's checkpoint store (Tectonic): "a sustainable throughput of 2 TB/s" (Sec. 3.3.1).
DEFAULT_STORAGE_BPS = 2e12

SOURCES = {
    "rates": "Llama 3 405B, 16,384 H100, 54 days, 419 unexpected interruptions "
    "(arXiv:2407.21783, Table 5); ToR switches 5%/year (Gill et al., SIGCOMM 2011)",
    "repair": "nodes 3 days: the low end of '3-5 days' for a physical replacement "
    "(arXiv:2504.06095, as summarised; not re-verified); switches and cables 1 h (assumed)",
    "storage": "2 TB/s sustained: Llama 3's Tectonic checkpoint store (arXiv:2407.21783)",
}


@dataclass(frozen=True)
class Rates:
    """The failure facts of a cluster in SI units: failures per unit and second by class,
    the repair time of hardware, and the storage bandwidth checkpoints see."""

    per_unit_s: dict[str, float]
    repair_s: float = DEFAULT_REPAIR_S
    fabric_repair_s: float = DEFAULT_FABRIC_REPAIR_S
    write_Bps: float = DEFAULT_STORAGE_BPS
    read_Bps: float = DEFAULT_STORAGE_BPS

    def repair_of(self, cls: str) -> float:
        """Seconds a part of this class is out of service after it fails."""
        return self.fabric_repair_s if cls in FABRIC else self.repair_s

    def scaled(self, factor: float) -> Rates:
        """Every class `factor` times as likely to fail (a what-if knob)."""
        per = {k: v * factor for k, v in self.per_unit_s.items()}
        return replace(self, per_unit_s=per)


def rates_for(spec: ClusterSpec) -> Rates:
    """The defaults, with what the cluster YAML's `reliability` section overrides."""
    rel = spec.reliability
    per_hour = dict(DEFAULT_RATES_PER_HOUR)
    if rel is None:
        return Rates({k: v / HOUR for k, v in per_hour.items()})
    per_hour |= rel.rates
    return Rates(
        {k: v / HOUR for k, v in per_hour.items()},
        rel.repair_time or DEFAULT_REPAIR_S,
        rel.fabric_repair_time or DEFAULT_FABRIC_REPAIR_S,
        rel.storage_write_bandwidth or DEFAULT_STORAGE_BPS,
        rel.storage_read_bandwidth or DEFAULT_STORAGE_BPS,
    )
