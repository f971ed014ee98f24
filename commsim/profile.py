"""A calibration profile: what a fit learnt about one cluster's links and compute.

A Profile holds each link tier's alpha (seconds per message) and bandwidth (bytes/s) with
95% intervals (a gloo fit), or NCCL's model parameters (an NCCL fit: a factor on its
per-step latencies of each link class, the per-channel bandwidth of its rings, the NCCL
version measured), the measured compute rate, and the algorithm the backend runs for each
op. apply_profile writes them into a ClusterSpec, with the profile's backend, so the
predictions use them. It is core data: calibration writes it, prediction reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from commsim.specs import ClusterSpec, LinkClass, Spec, SpecError, load_spec

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all", "send-recv")
TIERS = ("intra-node", "inter-node", "cross-rack")
Op = Literal["all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all", "send-recv"]
Tier = Literal["intra-node", "inter-node", "cross-rack"]

# 95% confidence interval (low, high); high may be inf (Spec refuses inf elsewhere)
Interval = tuple[float, Annotated[float, Field(allow_inf_nan=True)]]


class TierFit(Spec):
    """One link tier: alpha (seconds per message, end to end) and the bandwidth of one flow
    alone on it (bytes/s per direction); for cross-rack, a rack's whole uplink. `fitted`
    names what the data determined; the rest kept the cluster's value."""

    alpha_s: float = Field(ge=0)
    alpha_ci_s: Interval | None = None
    bandwidth_Bps: float = Field(gt=0)
    bandwidth_ci_Bps: Interval | None = None
    points: int = Field(ge=0)  # measurements whose group spans exactly this tier
    fitted: list[Literal["alpha", "bandwidth"]] = []


class ComputeFit(Spec):
    """Measured compute: model FLOP/s per rank (3 x forward FLOPs per sample x batch / the
    time of forward + backward) and its share of the GPU's catalog peak."""

    flops_per_s: float = Field(gt=0)
    flops_per_s_range: Interval  # over the p10-p90 of the measured compute times
    efficiency: float = Field(gt=0)
    gpu: str
    model: str
    points: int = Field(ge=1)


class NcclFit(Spec):
    """NCCL's model fitted to NCCL measurements: the version that ran (its tables price),
    per link class a factor on NCCL's per-step latencies, the per-channel bandwidth of its
    rings on one node (intra) and across nodes (inter), each with a 95% interval. `fitted`
    names what the data determined; `not_fitted` what kept NCCL's own value."""

    version: str
    latency_scale: dict[LinkClass, float] = {}
    latency_scale_ci: dict[LinkClass, Interval] = {}
    channel_bandwidth_intra_Bps: float | None = Field(default=None, gt=0)
    channel_bandwidth_intra_ci_Bps: Interval | None = None
    channel_bandwidth_inter_Bps: float | None = Field(default=None, gt=0)
    channel_bandwidth_inter_ci_Bps: Interval | None = None
    fitted: list[str] = []
    not_fitted: list[str] = []


class Provenance(Spec):
    """Where a profile came from."""

    files: list[str]
    runs: list[str]
    date: str
    points: int = Field(ge=0)
    commsim: str
    rms_rel_error: float | None = None  # of the fitted model over the points


class Profile(Spec):
    """What a fit learnt about one cluster with one backend."""

    cluster: str
    backend: str
    tiers: dict[Tier, TierFit]
    algorithms: dict[Op, str]
    nccl: NcclFit | None = None
    compute: ComputeFit | None = None
    provenance: Provenance
    notes: list[str] = []


def load_profile(path: str | Path) -> Profile:
    """Read a profile YAML; errors name the file and field."""
    return load_spec(Profile, path)


def profile_yaml(profile: Profile) -> str:
    """A profile as YAML (infinite interval ends as .inf)."""
    import yaml

    def plain(x: Any) -> Any:  # safe_dump writes lists, not tuples
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return [plain(v) for v in x] if isinstance(x, (list, tuple)) else x

    return yaml.safe_dump(plain(profile.model_dump()), sort_keys=False)


def cluster_tiers(spec: ClusterSpec) -> tuple[str, ...]:
    """The tiers a cluster has: GPUs sharing a node, nodes sharing a rack (a leaf, or a
    rail-optimised scalable unit), racks."""
    tiers = []
    if spec.node.gpus_per_node > 1:
        tiers.append("intra-node")
    if spec.nodes > 1 and spec.fabric.nodes_per_leaf > 1:
        tiers.append("inter-node")
    if spec.nodes > spec.fabric.nodes_per_leaf:
        tiers.append("cross-rack")
    return tuple(tiers)


def parsed(spec: ClusterSpec) -> ClusterSpec:
    """The spec with every field validated: pydantic leaves unset defaults as written
    ("100ns"), so validate a dump of it, in which they are set."""
    return ClusterSpec.model_validate(spec.model_dump(warnings=False))


def _leaf_ports(spec: ClusterSpec) -> int:
    """NIC ports on a full leaf: a rail-optimised leaf takes one NIC of each node of its unit."""
    per_node = 1 if spec.node.rail_optimized else spec.node.nics.count
    return spec.fabric.nodes_per_leaf * per_node


def tier_params(spec: ClusterSpec) -> dict[str, tuple[float, float]]:
    """(alpha, bandwidth) of each tier the spec has, as topology.build turns it into links.

    intra-node: the node's latency and per-GPU bandwidth (default: NVLink or PCIe).
    inter-node: NIC latency + the path's cables and switch (nic->leaf: link + switch,
    leaf->nic: link), and the NIC bandwidth. cross-rack: the same path through a spine
    (two more link + switch hops) and the leaf's total uplink: ports x NIC bandwidth /
    oversubscription, or uplinks_per_leaf x NIC bandwidth."""
    from commsim import catalog

    spec = parsed(spec)
    node, fab = spec.node, spec.fabric
    out: dict[str, tuple[float, float]] = {}
    tiers = cluster_tiers(spec)
    if "intra-node" in tiers:
        default = (
            catalog.gpu(node.gpu).nvlink_bandwidth
            if node.interconnect == "nvswitch"
            else node.pcie_bandwidth
        )
        out["intra-node"] = (node.intra_latency, node.intra_bandwidth or default)
    hop = fab.link_latency + fab.switch_latency
    in_rack = node.nics.latency + hop + fab.link_latency
    if "inter-node" in tiers:
        out["inter-node"] = (in_rack, node.nics.bandwidth)
    if "cross-rack" in tiers:
        if fab.uplinks_per_leaf is None:
            uplink = _leaf_ports(spec) * node.nics.bandwidth / fab.oversubscription[0]
        else:
            uplink = fab.uplinks_per_leaf * node.nics.bandwidth
        out["cross-rack"] = (in_rack + 2 * hop, uplink)
    return out


def leaf_uplinks(spec: ClusterSpec) -> int:
    """How many parallel leaf-spine links a leaf has (topology.build): uplinks_per_leaf,
    or ceil(ports / oversubscription); the rack's uplink bandwidth is split among them."""
    spec = parsed(spec)
    if spec.fabric.uplinks_per_leaf is not None:
        return spec.fabric.uplinks_per_leaf
    return max(1, math.ceil(_leaf_ports(spec) / spec.fabric.oversubscription[0]))


def cable_share(spec: ClusterSpec) -> float:
    """The cable's part of one cable + switch hop in the spec (0 when both are 0)."""
    spec = parsed(spec)
    hop = spec.fabric.link_latency + spec.fabric.switch_latency
    return spec.fabric.link_latency / hop if hop > 0 else 0.0


def apply_tiers(spec: ClusterSpec, tiers: Mapping[str, tuple[float, float]]) -> ClusterSpec:
    """A copy of `spec` whose links have the given (alpha, bandwidth) per tier.

    intra-node sets node.intra_latency and intra_bandwidth. inter-node sets the NIC
    bandwidth, and the NIC latency so that the in-rack path (NIC, cable, switch, cable)
    takes alpha_inter; the NIC latency is also LogP's per-message overhead (half of it at
    each end). cross-rack: a cross-rack path passes two more cable + switch hops than an
    in-rack one (topology.build), so with inter-node given a hop gets (alpha_cross -
    alpha_inter) / 2, split between cable and switch as the spec splits it (cable_share),
    and the in-rack path must still hold its own cable, switch, cable; without it the
    fabric stays and the NIC latency makes the cross-rack path take alpha_cross. Its
    bandwidth is the rack's whole uplink, set through the leaf oversubscription (ports x
    NIC bandwidth / uplink, uplinks_per_leaf dropped); it must lie in ((k-1), k] NIC
    bandwidths, k = leaf_uplinks(spec), so the leaf keeps its k parallel uplinks.
    A value outside these ranges is a ValueError: no link setting gives it.
    """
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tier {sorted(unknown)[0]!r} (tiers: {', '.join(TIERS)})")
    spec = parsed(spec)
    data = spec.model_dump()
    node, fab = data["node"], data["fabric"]
    if "intra-node" in tiers:
        node["intra_latency"], node["intra_bandwidth"] = tiers["intra-node"]
    nic_bw = spec.node.nics.bandwidth
    if "inter-node" in tiers:
        alpha_in, nic_bw = tiers["inter-node"]
        node["nics"]["bandwidth"] = nic_bw
    if "cross-rack" in tiers:
        alpha_x, uplink = tiers["cross-rack"]
        if "inter-node" in tiers:
            hop = (alpha_x - alpha_in) / 2
            if hop < -1e-12:
                raise ValueError(
                    f"cross-rack alpha {alpha_x:.4g} s is below the in-rack alpha "
                    f"{alpha_in:.4g} s: a cross-rack path has more hops, not fewer"
                )
            share = cable_share(spec)
            fab["link_latency"], fab["switch_latency"] = share * hop, (1 - share) * max(0.0, hop)
        k, ports = leaf_uplinks(spec), _leaf_ports(spec)
        if not (k - 1) * nic_bw < uplink <= k * nic_bw * (1 + 1e-9):
            raise ValueError(
                f"cross-rack bandwidth {uplink:.4g} B/s is outside what the leaf's {k} "
                f"uplink(s) carry at the NIC rate: ({k - 1}, {k}] x {nic_bw:.4g} B/s"
            )
        oversub = ports * nic_bw / uplink
        while math.ceil(ports / oversub) > k:  # rounding must not add an uplink
            oversub = math.nextafter(oversub, math.inf)
        fab["oversubscription"] = [max(1.0, oversub), *fab["oversubscription"][1:]]
        fab["uplinks_per_leaf"] = None
    if "inter-node" in tiers or "cross-rack" in tiers:
        link, switch = fab["link_latency"], fab["switch_latency"]
        if "inter-node" in tiers:
            fabric_part, alpha = 2 * link + switch, alpha_in
        else:
            fabric_part, alpha = 4 * link + 3 * switch, alpha_x
        if alpha < fabric_part - 1e-12:
            raise ValueError(
                f"alpha {alpha:.4g} s is below the fabric's own {fabric_part:.4g} s of cables "
                "and switches on that path"
            )
        node["nics"]["latency"] = max(0.0, alpha - fabric_part)
    return ClusterSpec.model_validate(data)


def apply_profile(spec: ClusterSpec, profile: Profile, source: str = "profile") -> ClusterSpec:
    """The cluster with the profile's fitted tiers written into its links, its NCCL fit
    into `nccl`, and its backend (nccl or gloo) as the cluster's.

    A profile fitted on another cluster, or naming a tier this cluster does not have, is a
    SpecError: its numbers describe other links."""
    if profile.cluster != spec.name:
        raise SpecError(
            source,
            "cluster",
            f"fitted on cluster {profile.cluster!r}, not {spec.name!r}: fit a profile on it",
        )
    have = cluster_tiers(spec)
    for tier in profile.tiers:
        if tier not in have:
            raise SpecError(
                source,
                f"tiers.{tier}",
                f"cluster {spec.name!r} has no {tier} links (it has: {', '.join(have) or 'none'})",
            )
    try:
        spec = apply_tiers(
            spec, {t: (f.alpha_s, f.bandwidth_Bps) for t, f in profile.tiers.items()}
        )
    except ValueError as e:
        raise SpecError(source, "tiers", str(e)) from None
    update: dict[str, Any] = {}
    if profile.backend in ("nccl", "gloo"):
        update["backend"] = profile.backend
    if profile.nccl is not None:
        fit = profile.nccl
        update["nccl"] = spec.nccl.model_copy(
            update={
                "version": fit.version,
                "latency_scale": dict(fit.latency_scale),
                "channel_bandwidth_intra": fit.channel_bandwidth_intra_Bps,
                "channel_bandwidth_inter": fit.channel_bandwidth_inter_Bps,
            }
        )
    return spec.model_copy(update=update)
