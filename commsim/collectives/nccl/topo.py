"""What NCCL's topology search finds for a communicator: per algorithm pattern the number
of channels and each channel's bandwidth inside a node (bwIntra) and across nodes
(bwInter), and the channel counts the communicator then runs (src/graph/search.cc,
src/graph/connect.cc, src/transport/nvls.cc, src/init.cc; NCCL 2.30.7).

NCCL searches the machine's real PCI/NVLink tree; commsim knows the node as a spec (GPUs,
NVLink links, PCIe generation, NICs), so this follows the search's rules on that summary:

- bandwidths are NCCL's own units (GB/s): NVLink = links x the per-link rate NCCL assumes
  for the GPU (topo.h: SM70/SM80 20.0, SM90 20.6, SM100 40.1), PCIe = 0.75 x the spec's
  x16 rate (topo.h: PCI_BW 12 for Gen3 x16; logs show PCI[24.0] for Gen4, PCI[48.0] for
  Gen5, NVIDIA/nccl#879, #1189), a NIC its line rate (NET[50.0] for 400 Gb/s, #1189);
- pass 1 (ncclTopoCompute): from the fastest speed of NCCL's speed array not above the
  path's bottleneck (maxBw) whose minimum channel count fits, count the channels that fit
  at each speed (a ring channel uses one NIC, and `speed` of a GPU's NVLink: all GPUs on one
  node, (ppn - 1) / ppn of them across nodes, where it enters and leaves by PCIe), keep a
  later speed only if it carries strictly more (nChannels x speed), stop when the channels
  reach the GPU's total bandwidth or the next speed is not above 0.49 of the best;
- ncclTopoDupChannels doubles the channels at half the speed when bwIntra >= 25 GB/s,
  except on sm > 80 with bwIntra < 50 and more than 4 channels; trees match the ring's
  channels, and across nodes raise bwIntra up to 2 x bwInter where NVLink allows (pass 2);
- NVLS: one channel per GPU (arity <= 32); on one node all of them, and pass 2 raises
  bwInter up to 2 x bwIntra; across nodes one head per NIC at the network speed;
- the communicator runs 2 x the ring's channels (connect.cc "Duplication should be complete
  now"), doubled again on sm90+ across nodes when bwIntra > 45 and fewer than 16; NVLS runs
  nvlsChannels (16 on sm90; 32 on sm100 across nodes, 24 inside one).

Tested against published logs: 8 H100 on one node, 24 channels and 16 NVLS channels
(NVIDIA/TensorRT-LLM#953), 8 channels of 48 GB/s across DGX H100 nodes, 16 on the
communicator (NVIDIA/nccl#1752 shows channels 0..15).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commsim.specs import ClusterSpec

# topo.h: NVLink bandwidth NCCL assumes per link, by compute capability
NVLINK_PER_LINK = {70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}
# search.cc (2.30.7): the speeds (GB/s a channel) the search tries, fastest first
SPEEDS_INTRA = {
    0: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    100: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTER = {
    0: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
        2.4, 1.2, 0.24, 0.12),
    90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
         1.2, 0.24, 0.12),
    100: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0,
          6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}  # fmt: skip
MAX_CHANNELS = 64  # device.h MAXCHANNELS; a ring search stops at MAXCHANNELS / 2 (init.cc)
NVLS_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY
PCI_BW = 12.0  # topo.h, Gen3 x16: rings at or under it run 256 Simple threads (tuning.cc)


@dataclass(frozen=True)
class Machine:
    """A node as NCCL's tuner sees it (see the module docstring for the units)."""

    cc: int  # compute capability x 10: 70, 80, 90, 100
    nvlink: bool  # GPUs talk over NVLink (NVSwitch), else PCIe
    gpu_bw: float  # a GPU's NVLink (links x per-link rate), or its PCIe
    pci_bw: float  # GPU <-> NIC
    nic_bw: float  # one NIC
    nics: int
    gpus_per_node: int
    cpu: str  # intel, amd, arm, power
    nvls: bool  # NVLink SHARP
    sharp: bool  # CollNet (network SHARP)
    channel_intra: float | None = None  # fitted: a one-node ring channel's bandwidth
    channel_inter: float | None = None  # fitted: a multi-node ring channel's bandwidth

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Machine:
        """The NCCL view of the spec's node; a GPU without a compute capability (the CPU
        testbed's stand-in) is a SpecError naming the cluster's node.gpu: NCCL runs on GPUs."""
        from commsim import catalog  # specs reads this package's version tables
        from commsim.specs import SpecError

        node = spec.node
        gpu = catalog.gpu(node.gpu, spec.name, "node.gpu")
        if not gpu.compute_capability:
            raise SpecError(
                spec.name,
                "node.gpu",
                f"{gpu.name} has no compute_capability, which NCCL's tuner reads (give it "
                "in the GPU's file, or set the cluster's backend: gloo)",
            )
        cc = int(round(gpu.compute_capability * 10))
        nvlink = node.interconnect == "nvswitch"
        pci = 0.75 * node.pcie_bandwidth / 1e9
        if nvlink and gpu.nvlink_links:
            per_link = NVLINK_PER_LINK.get(cc, NVLINK_PER_LINK[min(cc, 100) // 10 * 10])
            gpu_bw = gpu.nvlink_links * per_link
        elif nvlink:
            gpu_bw = 0.8 * (node.intra_bandwidth or gpu.nvlink_bandwidth) / 1e9
        else:
            gpu_bw = 0.75 * (node.intra_bandwidth or node.pcie_bandwidth) / 1e9
        nvls = node.nvls if node.nvls is not None else nvlink and cc >= 90
        nccl = spec.nccl
        return cls(
            cc=cc,
            nvlink=nvlink,
            gpu_bw=gpu_bw,
            pci_bw=pci,
            nic_bw=node.nics.bandwidth / 1e9,
            nics=node.nics.count,
            gpus_per_node=node.gpus_per_node,
            cpu=node.cpu,
            nvls=bool(nvls and nvlink and cc >= 90),
            sharp=spec.fabric.sharp,
            channel_intra=None
            if nccl.channel_bandwidth_intra is None
            else nccl.channel_bandwidth_intra / 1e9,
            channel_inter=None
            if nccl.channel_bandwidth_inter is None
            else nccl.channel_bandwidth_inter / 1e9,
        )

    @property
    def arch(self) -> int:
        """NCCL's compCapIndex: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell."""
        return 3 if self.cc >= 100 else 2 if self.cc >= 90 else 1 if self.cc >= 80 else 0

    def speeds(self, inter: bool) -> tuple[float, ...]:
        table = SPEEDS_INTER if inter else SPEEDS_INTRA
        return table[100 if self.cc >= 100 else 90 if self.cc >= 90 else 0]


@dataclass(frozen=True)
class Graph:
    """One pattern's search result: channels, and each one's bandwidth (GB/s)."""

    channels: int
    bw_intra: float
    bw_inter: float


@dataclass(frozen=True)
class Graphs:
    """What the search gives a communicator, per NCCL algorithm's graph."""

    ring: Graph
    tree: Graph  # also PAT's and CollNetChain's
    nvls: Graph | None  # NVLS and NVLSTree; None where NVLink SHARP is absent
    collnet: Graph | None  # CollNetDirect; None without SHARP
    comm_channels: int  # the channels ring and tree kernels run
    nvls_channels: int
    nvlink: bool  # the intra-node hardware class is NVLink (else PCI)
    ll128: bool  # LL128 is on by default (tuning.cc)


def _pass1(speeds, max_bw: float, total: float, fits, min_channels: int = 1) -> Graph:
    """ncclTopoCompute's first pass as the module docstring describes it."""
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_bw or speeds[i] * min_channels > total):
        i += 1
    best: tuple[int, float] | None = None
    for j in range(i, len(speeds)):
        channels = fits(speeds[j])
        if channels >= min_channels and (best is None or channels * speeds[j] > best[0] * best[1]):
            best = (channels, speeds[j])
        if best and best[0] * best[1] >= total:
            break
        if best and j + 1 < len(speeds) and speeds[j + 1] / best[1] <= 0.49:
            break
    channels, speed = best or (1, speeds[-1])
    return Graph(channels, speed, speed)


def _dup(g: Graph, cc: int) -> Graph:
    """ncclTopoDupChannels (search.cc)."""
    if g.bw_intra < 25.0 or (cc > 80 and g.bw_intra < 50.0 and g.channels > 4):
        return g
    doubled = min(2 * g.channels, MAX_CHANNELS // 2)
    split = -(-doubled // g.channels)
    return Graph(doubled, g.bw_intra / split, g.bw_inter / split)


def _scaled(g: Graph | None, k: float) -> Graph | None:
    return None if g is None else replace(g, bw_intra=g.bw_intra * k, bw_inter=g.bw_inter * k)


def search(m: Machine, ppn: int, nodes: int) -> Graphs:
    """The graphs NCCL builds for a communicator of `nodes` nodes with at most `ppn` of its
    GPUs on one node."""
    inter = nodes > 1
    speeds = m.speeds(inter)
    total = m.gpu_bw
    if not inter:
        ring = _pass1(speeds, total, total, lambda s: min(MAX_CHANNELS // 2, int(total // s)))
        ring = tree = _dup(ring, m.cc)
    else:
        nics = max(1, round(m.nics * ppn / m.gpus_per_node))  # its share of the node's NICs
        path = min(m.nic_bw, m.pci_bw)

        # a channel enters the node at one GPU and leaves from another (through their
        # NICs), crossing NVLink on the way: a GPU's NVLink carries (ppn - 1) / ppn of them
        share = (ppn - 1) / ppn if ppn > 1 else 0.0

        def fits(s: float) -> int:
            nvlink = int(total // (s * share)) if share else MAX_CHANNELS
            return min(MAX_CHANNELS // 2, nics * int(path // s), nvlink)

        ring = _dup(_pass1(speeds, path, total, fits), m.cc)
        wider = [s for s in speeds if ring.bw_inter < s <= 2 * ring.bw_inter and share]
        wider = [s for s in wider if ring.channels * s * share <= total]
        tree = replace(ring, bw_intra=max(wider)) if wider else ring
    nvls = None
    if m.nvls and ppn > 1:
        heads = min(NVLS_ARITY, ppn)
        if not inter:
            first = _pass1(speeds, total, total, lambda s: heads, min_channels=heads)
            up = [s for s in speeds if first.bw_intra < s]
            bw_inter = first.bw_intra
            for s in reversed(up):  # pass 2: raise bwInter while under 2 x bwIntra
                if bw_inter >= 2 * first.bw_intra:
                    break
                bw_inter = s
            nvls = replace(first, bw_inter=bw_inter)
        else:
            heads = min(heads, max(1, round(m.nics * ppn / m.gpus_per_node)))
            s = next((x for x in speeds if x <= min(m.nic_bw, m.pci_bw)), speeds[-1])
            nvls = Graph(heads, s, s)
    collnet = tree if m.sharp and inter else None
    comm = min(MAX_CHANNELS, 2 * ring.channels)
    if m.cc >= 90 and inter and ring.bw_intra > 45.0 and comm < 16:
        comm = min(MAX_CHANNELS, 2 * comm)
    k = m.channel_inter if inter else m.channel_intra
    if k is not None:  # a fitted channel bandwidth: every pattern in proportion
        scale = k / (ring.bw_inter if inter else ring.bw_intra)
        ring, tree = _scaled(ring, scale), _scaled(tree, scale)
        nvls, collnet = _scaled(nvls, scale), _scaled(collnet, scale)
    nvls_channels = 16 if m.cc < 100 else (32 if inter else 24)
    # LL128 on by default (tuning.cc): sm70+, NVLink inside the node and, across nodes, a
    # NIC close to the GPU (path PXB or better: taken as at most 2 GPUs a NIC, as on DGX
    # and HGX boards)
    ll128 = m.cc >= 70 and m.nvlink and (not inter or 2 * m.nics >= m.gpus_per_node)
    return Graphs(ring, tree, nvls, collnet, comm, nvls_channels, m.nvlink, ll128)


P2P_PER_CHANNEL_NET_BW = 14.0  # paths.cc NCCL_P2P_PER_CHANNEL_NET_BW default, GB/s a channel
P2P_PER_BATCH = 8  # device.h NCCL_MAX_DEV_WORK_P2P_PER_BATCH


def _pow2_up(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def p2p_channels(m: Machine, comm_channels: int, ranks: int, nodes: int) -> int:
    """Channels, one CTA (so one SM) each, NCCL's p2p kernel runs a large send to one peer
    and receive from another on (2.30.7 src/graph/paths.cc ncclTopoComputeP2pChannelsPerPeer
    and ncclTopoComputeP2pChannels; enqueue.cc scheduleP2pTasksToPlan spreads a large
    operation over p2pnChannelsPerPeer of them): the fewest any peer allows, 2 x the NVLink
    links to a peer on NVLink (path bw / the per-link rate), 2 over PCIe, and to a peer on
    another node max(the GPU's NICs, their GB/s / 14), rounded up to a power of 2; at most
    the communicator's p2p channels (its channels, rounded up to a power of 2) and, across
    nodes, halved while it times ceil(ranks / 8) exceeds them."""
    if m.nvlink:
        per_link = NVLINK_PER_LINK.get(m.cc, NVLINK_PER_LINK[min(m.cc, 100) // 10 * 10])
        per_peer = 2 * max(1, int(m.gpu_bw / per_link))
    else:
        per_peer = 2
    if nodes > 1:  # ncclTopoGetLocalNetCountByBw: the NICs nearest the GPU (one if shared)
        nics = max(1, m.nics // m.gpus_per_node)
        per_peer = min(per_peer, max(nics, math.ceil(nics * m.nic_bw / P2P_PER_CHANNEL_NET_BW)))
    per_peer = _pow2_up(per_peer)
    p2p = _pow2_up(min(comm_channels, MAX_CHANNELS))
    if nodes <= 1:
        return min(p2p, per_peer)
    while per_peer * math.ceil(ranks / P2P_PER_BATCH) > p2p and per_peer > 1:
        per_peer //= 2
    return per_peer
