"""How often a job is interrupted, by class and by part, from the parts it runs on.

Parts fail independently as Poisson processes, so the job's interruption rate is the sum
over its parts of rate x units that stop it, and its mean time to interruption (MTTI) is the
inverse (a series system; e.g. Kokolis et al. 2025, arXiv:2410.21680, model a job's MTTF
the same way). Parts that only degrade it are counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsim.reliability.blast import Exposure, exposures
from commsim.reliability.rates import HARDWARE, Rates
from commsim.topology.build import Cluster


@dataclass(frozen=True)
class Interruptions:
    """A job's failure exposure: interrupting failures per second by part and class,
    degrading ones, and the nodes each kind takes out of service."""

    exposures: tuple[Exposure, ...]
    rates: Rates

    def part_rate(self, e: Exposure) -> float:
        """Interrupting failures per second of one kind of part."""
        return e.interrupting * self.rates.per_unit_s[e.cls]

    @property
    def by_part(self) -> dict[str, float]:
        return {e.part: self.part_rate(e) for e in self.exposures if e.interrupting}

    @property
    def by_class(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for e in self.exposures:
            out[e.cls] = out.get(e.cls, 0.0) + self.part_rate(e)
        return out

    @property
    def rate(self) -> float:
        """Interruptions per second."""
        return sum(self.part_rate(e) for e in self.exposures)

    @property
    def mtti_s(self) -> float:
        return 1.0 / self.rate if self.rate > 0 else float("inf")

    @property
    def degrade_rate(self) -> float:
        """Failures per second that degrade the fabric without stopping the job."""
        return sum(
            (e.units - e.interrupting) * self.rates.per_unit_s[e.cls] for e in self.exposures
        )

    def hardware_share(self) -> float:
        """Of the interruptions, the share that takes a node out of service for repair."""
        hw = sum(self.part_rate(e) for e in self.exposures if e.cls in HARDWARE)
        return hw / self.rate if self.rate else 0.0

    def repairs(self) -> list[tuple[float, float, float]]:
        """(failures per second, nodes out per failure, repair seconds) of every kind that
        needs a repair: what the spares model queues (commsim.reliability.spares)."""
        return [
            (self.part_rate(e), e.nodes_out, self.rates.repair_of(e.cls))
            for e in self.exposures
            if e.cls in HARDWARE and e.interrupting and e.nodes_out > 0
        ]


def job_interruptions(cluster: Cluster, n_gpus: int, rates: Rates) -> Interruptions:
    """The exposure of a job of n_gpus on the cluster built for it."""
    return Interruptions(tuple(exposures(cluster, n_gpus)), rates)
