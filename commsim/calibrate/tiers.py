"""The tier fit's parameters (TierModel: per tier alpha and bandwidth, and the per-call
overhead, as the cluster they describe) and what a solution and its bootstrap replicates
say about each tier's class (tier_fits)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from commsim.calibrate import robust
from commsim.profile import TierFit, apply_tiers, cable_share, leaf_uplinks, parsed, tier_params
from commsim.specs import ClusterSpec

BETA_FLOOR = 1e-6  # beta may fall to this fraction of its start (bandwidth x 1e6), no lower
OVERHEAD_SCALE = 1e-4  # seconds: the per-call overhead's unit in the solver


@dataclass(frozen=True)
class Param:
    """One fitted number: tier, name, bounds, start, and the scale it is solved in."""

    tier: str  # a link tier, or "call" for the per-call overhead
    name: str  # alpha (s), beta (s/B), hops, share, overhead (s): see TierModel
    lower: float
    upper: float
    start: float
    scale: float

    @property
    def label(self) -> str:
        return "per-call overhead" if self.name == "overhead" else f"{self.tier} {self.name}"


class TierModel:
    """The parameters of the tiers a fit frees, the per-call overhead, and the cluster they
    describe.

    intra-node and inter-node: alpha and beta = 1 / bandwidth. cross-rack, as apply_tiers
    can build it: with inter-node also fitted, `hops` (alpha_cross = alpha_inter (1 + 2
    hops): two more cable + switch hops, as many as the in-rack path holds), else its
    alpha; and `share` in ((k-1)/k, 1] (uplink = share x k x NIC bandwidth, k the leaf's
    parallel uplinks). The per-call constant (last) starts at the cluster's; it may be
    negative, down to half the fastest measured time (`floor`): a link that lets a burst
    through unshaped (a token bucket, as the testbed's htb) gives each call a head start.
    Bounds keep every value buildable, so the fit never leaves the model."""

    def __init__(self, spec: ClusterSpec, tiers: list[str], floor: float = 0.0) -> None:
        spec = parsed(spec)
        self.spec, self.tiers = spec, tiers
        self.k = leaf_uplinks(spec)
        base = tier_params(spec)
        params = []
        if "intra-node" in tiers:
            params += self._pair("intra-node", *base["intra-node"])
        if "inter-node" in tiers:
            params += self._pair("inter-node", *base["inter-node"])
        if "cross-rack" in tiers:
            alpha_x, uplink = base["cross-rack"]
            if "inter-node" in tiers:  # the in-rack path holds hop (1 + cable share)
                alpha_in, top = base["inter-node"][0], 1.0 / (1.0 + cable_share(spec))
                start = min(top, (alpha_x - alpha_in) / (2 * alpha_in)) if alpha_in else 0.0
                params.append(Param("cross-rack", "hops", 0.0, top, start, 1.0))
            else:
                scale = max(alpha_x, 1e-6)
                params.append(Param("cross-rack", "alpha", 0.0, np.inf, alpha_x, scale))
            low = (self.k - 1) / self.k + 1e-6
            share = np.clip(uplink / (self.k * spec.node.nics.bandwidth), low, 1.0)
            params.append(Param("cross-rack", "share", low, 1.0, float(share), 1.0))
        params.append(Param("call", "overhead", -floor, np.inf, spec.call_overhead, OVERHEAD_SCALE))
        self.params = params
        self.overhead_index = len(params) - 1

    @staticmethod
    def _pair(tier: str, alpha: float, bandwidth: float) -> list[Param]:
        beta = 1.0 / bandwidth
        return [
            Param(tier, "alpha", 0.0, np.inf, alpha, max(alpha, 1e-6)),
            Param(tier, "beta", BETA_FLOOR * beta, np.inf, beta, beta),
        ]

    def values(self, theta: np.ndarray) -> dict[str, tuple[float, float]]:
        """(alpha, bandwidth) of each fitted tier."""
        v = {(p.tier, p.name): float(x) for p, x in zip(self.params, theta, strict=True)}
        out = {}
        for tier in ("intra-node", "inter-node"):
            if tier in self.tiers:
                out[tier] = (v[tier, "alpha"], 1.0 / v[tier, "beta"])
        if "cross-rack" in self.tiers:
            if "inter-node" in self.tiers:
                alpha_in, nic = out["inter-node"]
                alpha_x = alpha_in * (1 + 2 * v["cross-rack", "hops"])
            else:
                alpha_x, nic = v["cross-rack", "alpha"], self.spec.node.nics.bandwidth
            out["cross-rack"] = (alpha_x, v["cross-rack", "share"] * self.k * nic)
        return out

    def cluster(self, theta: np.ndarray) -> ClusterSpec:
        spec = apply_tiers(self.spec, self.values(theta))
        return spec.model_copy(update={"call_overhead": float(theta[self.overhead_index])})


def _parts(model: TierModel, tier: str, free: np.ndarray) -> list[str]:
    """What of a tier the fit determined: alpha (alpha or hops free), bandwidth (beta or
    share free)."""
    names = {p.name for p, f in zip(model.params, free, strict=True) if f and p.tier == tier}
    kinds = (("alpha", {"alpha", "hops"}), ("bandwidth", {"beta", "share"}))
    return [part for part, of in kinds if names & of]


def tier_fits(
    model: TierModel, theta: np.ndarray, free: np.ndarray, thetas: np.ndarray, spans: Counter
) -> tuple[dict[str, TierFit], tuple[float, tuple[float, float] | None]]:
    """Each fitted tier's class (alpha, efficiency: bandwidth over the tier's line rate)
    with 95% intervals over the bootstrap replicates `thetas` (a row each) where the data
    determined it; and the per-call overhead with its interval (None where kept at 0)."""
    lines = {t: bw for t, (_, bw) in tier_params(model.spec).items()}
    reps = [model.values(th) for th in thetas]
    out = {}
    for tier, (alpha, bandwidth) in model.values(theta).items():
        parts = _parts(model, tier, free)
        line = lines[tier]
        alphas = np.array([r[tier][0] for r in reps])
        effs = np.array([r[tier][1] for r in reps]) / line
        out[tier] = TierFit(
            alpha_s=alpha,
            alpha_ci_s=robust.interval(alphas) if "alpha" in parts else None,
            efficiency=bandwidth / line,
            efficiency_ci=robust.interval(effs) if "bandwidth" in parts else None,
            line_rate_Bps=line,
            points=spans[tier],
            fitted=parts,
        )
    i = model.overhead_index
    overhead_ci = robust.interval(thetas[:, i]) if free[i] else None
    return out, (float(theta[i]), overhead_ci)
