"""A calibration profile: what a fit learnt about a backend on one class of links and compute.

A Profile describes link classes, not one cluster's absolute numbers, so it applies to any
cluster built from the same classes (another host count, line rate or oversubscription):
per link tier (GPUs of a node, nodes of a rack, racks) the per-step latency alpha and the
achieved fraction of the tier's line rate (the bandwidth one flow gets over its links'
rate: transport and protocol overheads), each with a 95% interval; the backend's per-call
software overhead; the compute rate as a share of the GPU's peak; and for NCCL its model's
parameters (a factor on its per-step latencies of each link class, the per-channel bandwidth
of its rings, the version measured). `hardware` names each tier's class as the fit saw it
(hardware_class): carry_over writes the profile into a cluster whose tiers are of those
classes, refuses one whose tier has no fitted class, and says what it carried over. It is
core data: calibration writes it, prediction reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from commsim.spec_base import Spec
from commsim.spec_io import load_spec, read_yaml
from commsim.specs import ClusterSpec, LinkClass, NcclOverrides, NcclVersion, SpecError

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all", "send-recv")
TIERS = ("intra-node", "inter-node", "cross-rack")
Op = Literal["all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all", "send-recv"]
Tier = Literal["intra-node", "inter-node", "cross-rack"]
FORMAT = 2  # 1: absolute bandwidths of the one cluster fitted (refused, with how to refit)

# 95% confidence interval (low, high); high may be inf (Spec refuses inf elsewhere)
Interval = tuple[float, Annotated[float, Field(allow_inf_nan=True)]]


class TierFit(Spec):
    """One link tier's class: alpha (seconds per message, end to end) and efficiency, the
    bandwidth one flow alone gets over the tier's line rate (cross-rack: a rack's whole
    uplink over its nominal rate); line_rate_Bps is the rate it was fitted at (for the
    record: a cluster's own rate is what carry_over scales). `fitted` names what the data
    determined; the rest kept the cluster's value."""

    alpha_s: float = Field(ge=0)
    alpha_ci_s: Interval | None = None
    efficiency: float = Field(gt=0)
    efficiency_ci: Interval | None = None
    line_rate_Bps: float = Field(gt=0)
    points: int = Field(ge=0)  # measurements whose group spans exactly this tier
    fitted: list[Literal["alpha", "bandwidth"]] = []

    @property
    def bandwidth_Bps(self) -> float:
        """The bandwidth at the rate it was fitted at."""
        return self.efficiency * self.line_rate_Bps

    @property
    def bandwidth_ci_Bps(self) -> Interval | None:
        """Its 95% interval at that rate."""
        ci = self.efficiency_ci
        return None if ci is None else (ci[0] * self.line_rate_Bps, ci[1] * self.line_rate_Bps)


class ComputeFit(Spec):
    """Measured compute: model FLOP/s per rank (3 x forward FLOPs per sample x batch / the
    time of forward + backward) and its share of the GPU's catalog peak."""

    flops_per_s: float = Field(gt=0)
    flops_per_s_range: Interval  # over the p10-p90 of the measured compute times
    efficiency: float = Field(gt=0)
    gpu: str
    model: str
    points: int = Field(ge=1)


class NcclFit(NcclOverrides):
    """NCCL's model fitted to NCCL measurements: the version that ran (its tables price),
    per link class a factor on NCCL's per-step latencies, the per-channel bandwidth of its
    rings on one node (intra) and across nodes (inter), each with a 95% interval. `fitted`
    names what the data determined; `not_fitted` what kept NCCL's own value. `algo` /
    `proto` (NcclOverrides): NCCL_ALGO / NCCL_PROTO the measured runs exported, which
    carry_over applies to a cluster that sets none."""

    version: NcclVersion
    latency_scale: dict[LinkClass, Annotated[float, Field(gt=0)]] = {}
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
    robust_sd: float | None = None  # 1.4826 x the median absolute log residual


class Profile(Spec):
    """What a fit learnt about one backend on one class of links and compute."""

    format: Literal[2] = FORMAT
    cluster: str  # the cluster it was fitted on (provenance; carry_over checks classes)
    backend: str
    hardware: dict[Tier, str]  # each tier's class on the fitted cluster (hardware_class)
    tiers: dict[Tier, TierFit]
    call_overhead_s: float = 0.0  # negative: the links gave each call a head start
    call_overhead_ci_s: Interval | None = None
    algorithms: dict[Op, str]
    nccl: NcclFit | None = None
    compute: ComputeFit | None = None
    provenance: Provenance
    notes: list[str] = []
    warnings: list[str] = []  # what makes the fit doubtful (calibrate.diagnose)


def load_profile(path: str | Path) -> Profile:
    """Read a profile YAML; errors name the file and field. A format-1 profile (one
    cluster's absolute bandwidths) is refused with how to get a new one."""
    data = read_yaml(path)
    if isinstance(data, dict) and data.get("format", 1) == 1:
        raise SpecError(
            str(path),
            "format",
            "a format-1 profile (absolute bandwidths of the one cluster it was fitted on): "
            "fit it again with `commsim calibrate fit` to get link classes that travel",
        )
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
    NIC latency makes the cross-rack path take alpha_cross. An alpha below the fabric's own
    cables and switches on its path shrinks them in proportion (the NIC's part 0): a fit
    sees only the sum. Its bandwidth is the rack's whole uplink, set through the leaf
    oversubscription (ports x NIC bandwidth / uplink, uplinks_per_leaf dropped); it must
    lie in ((k-1), k] NIC bandwidths, k = leaf_uplinks(spec), so the leaf keeps its k
    parallel uplinks. A value outside these ranges is a ValueError: no link setting gives
    it.
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
        _set_uplink(spec, fab, uplink, nic_bw)
    if "inter-node" in tiers or "cross-rack" in tiers:
        alpha = alpha_in if "inter-node" in tiers else alpha_x
        # (cables, switches) on the path alpha measures: in-rack 2 + 1, cross-rack 4 + 3
        cables, switches = (2, 1) if "inter-node" in tiers else (4, 3)
        fabric_part = cables * fab["link_latency"] + switches * fab["switch_latency"]
        if "inter-node" in tiers and "cross-rack" in tiers and alpha < fabric_part - 1e-12:
            raise ValueError(
                f"alpha {alpha:.4g} s is below the fabric's own {fabric_part:.4g} s of cables "
                "and switches on that path"
            )
        if alpha < fabric_part:  # the fabric's placeholder split: shrink it to fit
            shrink = alpha / fabric_part
            fab["link_latency"], fab["switch_latency"] = (
                fab["link_latency"] * shrink,
                fab["switch_latency"] * shrink,
            )
            fabric_part = alpha
        node["nics"]["latency"] = max(0.0, alpha - fabric_part)
    return ClusterSpec.model_validate(data)


def _set_uplink(spec: ClusterSpec, fab: dict[str, Any], uplink: float, nic_bw: float) -> None:
    """Write a rack's whole uplink bandwidth into the fabric's oversubscription (see
    apply_tiers); a ValueError outside what the leaf's k uplinks at the NIC rate carry."""
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


def hardware_class(spec: ClusterSpec, tier: str) -> str:
    """What a tier's links are, as far as a fit can tell them apart: its GPUs and their
    interconnect inside a node; the fabric's kind and the nodes (their host software sets
    the per-step latency) between nodes and between racks. Line rates and counts are not
    part of it: a profile scales its efficiencies by a cluster's own rates."""
    spec = parsed(spec)
    node, kind = spec.node, spec.fabric.kind
    return {
        "intra-node": f"{node.gpu} GPUs over {node.interconnect}",
        "inter-node": f"{kind} NICs of {node.gpu} nodes",
        "cross-rack": f"{kind} leaf-spine uplinks of {node.gpu} nodes",
    }[tier]


def _rate(bps: float) -> str:
    return f"{bps / 1e6:.4g} MB/s" if bps < 1e9 else f"{bps / 1e9:.4g} GB/s"


def _carried_tier(
    spec: ClusterSpec, profile: Profile, tier: str, source: str
) -> tuple[tuple[float, float], str]:
    """(alpha, bandwidth) of one tier on `spec` from the profile's class: what was fitted
    carried over (alpha as fitted, bandwidth as its efficiency times this cluster's line
    rate), the rest the cluster's own; and a note saying so."""
    if tier not in profile.tiers:
        had = "measured no group of its" if tier in profile.hardware else "had no"
        raise SpecError(
            source,
            f"tiers.{tier}",
            f"no {tier} link class: the cluster it was fitted on ({profile.cluster!r}) {had} "
            f"{tier} links; cluster {spec.name!r} has {hardware_class(spec, tier)}: measure "
            "a group spanning them and fit again",
        )
    mine, theirs = hardware_class(spec, tier), profile.hardware[tier]
    if mine != theirs:
        raise SpecError(
            source,
            f"hardware.{tier}",
            f"fitted on {theirs}, but cluster {spec.name!r} has {mine}: fit on those",
        )
    fit = profile.tiers[tier]
    alpha, line = tier_params(spec)[tier]
    parts = []
    if "alpha" in fit.fitted:
        alpha = fit.alpha_s
        parts.append(f"alpha {alpha * 1e6:.4g} us")
    bandwidth = line
    if "bandwidth" in fit.fitted:
        bandwidth = fit.efficiency * line
        parts.append(f"{100 * fit.efficiency:.1f}% of its {_rate(line)} = {_rate(bandwidth)}")
    kept = "" if len(parts) == 2 else " (the rest this cluster's own: not fitted)"
    return (alpha, bandwidth), f"{tier}: {', '.join(parts) or 'nothing fitted'}{kept}"


def _feasible_uplink(spec: ClusterSpec, tiers: dict[str, tuple[float, float]]) -> str | None:
    """Clamp a carried cross-rack uplink into what the leaf's k uplinks at the (carried)
    NIC rate carry (apply_tiers); a note when it moved (efficiencies from noise can ask a
    little more of an uplink than of the NICs that feed it)."""
    if "cross-rack" not in tiers:
        return None
    nic = tiers.get("inter-node", (0.0, parsed(spec).node.nics.bandwidth))[1]
    k = leaf_uplinks(spec)
    alpha, uplink = tiers["cross-rack"]
    fixed = min(max(uplink, (k - 1) * nic * (1 + 1e-6)), k * nic)
    if fixed == uplink:
        return None
    tiers["cross-rack"] = (alpha, fixed)
    return (
        f"cross-rack uplink {_rate(uplink)} is outside what its {k} link(s) at the NIC's "
        f"{_rate(nic)} carry: set to {_rate(fixed)}"
    )


def carry_over(
    spec: ClusterSpec, profile: Profile, source: str = "profile"
) -> tuple[ClusterSpec, list[str]]:
    """The cluster with the profile's classes written into its links (see the module
    docstring), its per-call overhead, its NCCL fit and its backend; and what was carried
    over. A tier of the cluster the profile has no class for, or a class that differs, is
    a SpecError naming it."""
    have = cluster_tiers(spec)
    tiers, notes = {}, [f"carried over from {profile.cluster!r} ({profile.backend}):"]
    if profile.nccl is None:
        for tier in have:
            tiers[tier], note = _carried_tier(spec, profile, tier, source)
            notes.append(note)
    else:
        for tier in have:
            theirs = profile.hardware.get(tier)
            if theirs is not None and theirs != hardware_class(spec, tier):
                mine = hardware_class(spec, tier)
                raise SpecError(
                    source,
                    f"hardware.{tier}",
                    f"fitted on {theirs}, but cluster {spec.name!r} has {mine}: fit on those",
                )
    unused = [t for t in profile.tiers if t not in have]
    notes += [f"{t}: not used (cluster {spec.name!r} has no {t} links)" for t in unused]
    moved = _feasible_uplink(spec, tiers)
    notes += [moved] if moved else []
    try:
        spec = apply_tiers(spec, tiers)
    except ValueError as e:
        raise SpecError(source, "tiers", str(e)) from None
    update: dict[str, Any] = {"call_overhead": profile.call_overhead_s}
    notes.append(f"per-call overhead {profile.call_overhead_s * 1e3:.3g} ms")
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
            | _nccl_overrides(spec, fit, notes)
        )
        notes.append(f"NCCL {fit.version}'s model: {', '.join(fit.fitted) or 'nothing'} fitted")
    return spec.model_copy(update=update), notes


def _nccl_overrides(spec: ClusterSpec, fit: NcclFit, notes: list[str]) -> dict[str, str]:
    """The profile's NCCL_ALGO / NCCL_PROTO where the cluster sets none (a cluster's own, or
    a --nccl-algo / --nccl-proto flag's, stands), each noted."""
    out = {}
    for key in ("algo", "proto"):
        theirs, mine = getattr(fit, key), getattr(spec.nccl, key)
        var = f"NCCL_{key.upper()}"
        if theirs is not None and mine is None:
            out[key] = theirs
            notes.append(f"{var}={theirs} (the profile's)")
        elif theirs is not None and mine != theirs:
            notes.append(f"{var}={mine} (the cluster's) stands over the profile's {theirs}")
    return out


def apply_profile(spec: ClusterSpec, profile: Profile, source: str = "profile") -> ClusterSpec:
    """The cluster with the profile carried over (carry_over), without the notes."""
    return carry_over(spec, profile, source)[0]


def switch_backend(spec: ClusterSpec, backend: str) -> ClusterSpec:
    """The cluster with `backend` running its collectives (not validated here); a per-call
    overhead, which a profile fitted under the backend it had, is dropped when it changes."""
    update: dict[str, Any] = {"backend": backend}
    if backend != spec.comm_backend:
        update["call_overhead"] = 0.0
    return spec.model_copy(update=update)


def compute_efficiency(spec: ClusterSpec, profile: Profile) -> float | None:
    """The measured share of the GPU's peak, where the cluster has the GPU it was measured
    on (None otherwise, or without a compute measurement)."""
    c = profile.compute
    return c.efficiency if c is not None and c.gpu == parsed(spec).node.gpu else None
