"""Where gradient compression stops paying: one strategy under each compressor as the NIC
bandwidth changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from commsim.planner.search import COMPRESSIONS, LOSSLESS_ENOUGH
from commsim.scenario import Setup
from commsim.specs import Strategy
from commsim.step.predict import step_model, strategy_layouts
from commsim.topology.build import build_cluster

NIC_FACTORS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0, 16.0)


@dataclass
class BandwidthSweep:
    """Step time of one strategy under each compressor as the NIC bandwidth changes."""

    nic_bandwidth: list[float]  # bytes/s per NIC
    step_time: dict[str, list[float]]  # compressor -> seconds, per bandwidth
    crossovers: dict[str, float]  # compressor -> NIC bandwidth above which it stops paying
    current: float  # the scenario's NIC bandwidth


def bandwidth_sweep(
    setup: Setup,
    strategy: Strategy,
    compressions: Sequence[str] = COMPRESSIONS,
    factors: Sequence[float] = NIC_FACTORS,
) -> BandwidthSweep:
    """The strategy with each compressor (error feedback on for the lossy ones, as the search
    sets it) on the same cluster with its NIC bandwidth scaled by each factor."""
    spec = setup.cluster.spec
    nic = spec.node.nics
    variants = [
        strategy.model_copy(update={"compression": c, "error_feedback": c not in LOSSLESS_ENOUGH})
        for c in compressions
    ]
    times: dict[str, list[float]] = {v.compression: [] for v in variants}
    for f in factors:
        node = spec.node.model_copy(
            update={"nics": nic.model_copy(update={"bandwidth": f * nic.bandwidth})}
        )
        cluster = build_cluster(spec.model_copy(update={"node": node}), setup.n_gpus)
        scaled = replace(setup, cluster=cluster)
        steps = step_model(scaled).evaluate(strategy_layouts(scaled, variants)).step
        for v, t in zip(variants, steps.tolist(), strict=True):
            times[v.compression].append(t)
    bandwidths = [f * nic.bandwidth for f in factors]
    return BandwidthSweep(bandwidths, times, crossovers(bandwidths, times), nic.bandwidth)


def crossovers(bandwidths: list[float], times: dict[str, list[float]]) -> dict[str, float]:
    """Per compressor, the bandwidth where it starts losing to no compression: the last
    sign change of (t_c - t_none), interpolated in log bandwidth."""
    base = np.array(times["none"])
    logb = np.log(bandwidths)
    out = {}
    for c, t in times.items():
        gain = base - np.array(t)  # > 0 while compression pays
        flips = np.nonzero((gain[:-1] > 0) & (gain[1:] <= 0))[0]
        if c != "none" and flips.size:
            i = flips[-1]
            x = logb[i] + (logb[i + 1] - logb[i]) * gain[i] / (gain[i] - gain[i + 1])
            out[c] = float(np.exp(x))
    return out
