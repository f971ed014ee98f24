"""NCCL's tuning constants by version (src/graph/tuning.cc, NVIDIA/nccl), as data.

Each Tables holds what ncclTopoTuneModel and ncclTopoGetAlgoTime read in one range of
releases: the base latencies and the per-step latencies of each hardware class (NVLink,
PCI, network) per algorithm x protocol, in microseconds; the per-channel bandwidth caps
per GPU architecture (rows Volta, Ampere, Hopper, Blackwell) and node count (columns 1, 2,
3+ nodes), in GB/s; and the switches for the rules that changed between releases. A range
starts at the first release where a constant or rule changed, each read from
`git show vX:src/graph/tuning.cc` (and `src/enqueue.cc` for the per-call rules); the
release that changed it is named on the line. Releases after the newest encoded one use
its tables; releases before 2.18 are refused.

Indices follow NCCL's enums (src/include/device.h): algorithms Tree 0, Ring 1,
CollNetDirect 2, CollNetChain 3, NVLS 4, NVLSTree 5, PAT 6; protocols LL 0, LL128 1,
Simple 2; hardware NVLINK 0, PCI 1, NET 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
LL, LL128, SIMPLE = range(3)
NVLINK, PCI, NET = range(3)
VOLTA, AMPERE, HOPPER, BLACKWELL = range(4)


def _a(rows) -> np.ndarray:
    a = np.array(rows, dtype=float)
    a.setflags(write=False)
    return a


def _set(table: np.ndarray, index, value) -> np.ndarray:
    out = table.copy()
    out[index] = value
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class Tables:
    """The constants and rules of one range of NCCL releases (see the module docstring)."""

    first: str  # the release this range starts at
    base: np.ndarray  # baseLat[algorithm][protocol], us
    hw: np.ndarray  # hwLat[hardware][algorithm][protocol], us
    ll_max: np.ndarray  # llMaxBws[row][nodes]: row = arch on 1 node, CPU vendor across nodes
    ring_ll128_max: np.ndarray  # perChMaxRingLL128Bws[arch][nodes]
    tree_ll128_max: np.ndarray  # perChMaxTreeLL128Bws[arch][nodes]
    tree_max: np.ndarray  # perChMaxTreeBws[arch][nodes]
    tree_correction: np.ndarray  # treeCorrectionFactor[protocol][log2(bytes / 64)]
    nvls_tree_max: np.ndarray | None = None  # perChMaxNVLSTreeBws[arch][nodes] (2.28+)
    nvls_efficiency: np.ndarray | None = None  # nvlsEfficiency[arch] (2.28+)
    blackwell: bool = False  # a Blackwell row exists (2.25+); before, sm100 reads Hopper's
    ring_ar_inter_steps: str = "2N"  # ring all-reduce network steps: "2N" or "2(N-1)"
    ring_ll: str = "quarter"  # Ring/LL bus factor: "quarter" (1/4, 1/3) or "half"
    ring_ll128_one_ppn: float | None = 0.7  # Ring/LL128 factor at < 2 GPUs a node
    ppn1_tree_net: bool = False  # one GPU a node: the network latency is Tree's
    nvls_latency: str = "2.18"  # "2.18": base + 18 / 2(N-1) x 19; "2.19": intra + inter
    nvls_bandwidth: str = "generic"  # "generic", "min" (2.19), "min_agrs" (2.27), "efficiency"
    nvls_ratio: str = "2.18"  # bus -> algorithm: "2.18", "5/6" (2.19), "n/nsteps" (2.28)
    ag_rs: tuple[int, ...] = (RING,)  # algorithms for all-gather / reduce-scatter
    ag_rs_convert: bool = True  # non-ring all-gather / reduce-scatter bus -> algorithm ratio
    pat_factor: float = 0.0  # PAT bus bandwidth factor (0: no PAT)
    collnet_arity_us: float = 0.5  # CollNetDirect arity serialisation latency
    nvls_tree_correction: bool = False  # tree correction on Blackwell NVLSTree (2.29+)


# 2.18.3 (tag v2.18.3-1, src/graph/tuning.cc lines 54-120): the oldest range encoded.
_TREE_CORRECTION_23 = _a(
    [  # LL, LL128, Simple; 64 B, 128 B, ... 256 MiB
        [1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1],
        [.9] * 7 + [.8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9],
    ]
)  # fmt: skip
V2_18 = Tables(
    first="2.18.3",
    base=_a([[6.8, 14.0, 0], [6.6, 14.0, 8.4], [6.8, 14.0, 0], [6.8, 14.0, 0],
             [0, 0, 23.0], [0, 0, 23.0], [0, 0, 0]]),
    hw=_a([
        # NVLINK: Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, (PAT)
        [[.6, 1.25, 4], [.6, 1.9, 3.4], [0, 0, 8.0], [0, 0, 4.75], [0, 0, 0], [0, 0, 0], [0, 0, 0]],
        # PCI
        [[1.0, 1.9, 6], [1.0, 2.5, 5.7], [0, 0, 8.0], [0, 0, 8.0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],
        # NET
        [[5.0, 8.5, 14], [2.7, 4, 14], [0, 0, 10.7], [0, 0, 14], [0, 0, 18], [0, 0, 19], [0, 0, 0]],
    ]),
    # rows: Volta-N1 / Intel-N2 / Intel-N4; Ampere-N1 / AMD-N2 / AMD-N4; Hopper-N1 / AMD..
    ll_max=_a([[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [87.7, 22.5, 19.0], [87.7, 22.5, 19.0]]),
    ring_ll128_max=_a([[20.0] * 3, [20.0] * 3, [36.7] * 3, [36.7] * 3]),
    tree_ll128_max=_a([[20.0] * 3, [20.0] * 3, [36.7, 36.7, 29.0], [36.7, 36.7, 29.0]]),
    tree_max=_a([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [38.7, 41.4, 36.0]]),
    tree_correction=_TREE_CORRECTION_23,
)  # fmt: skip

# 2.19.3: "H800/H100 fixes and tuning" (release notes). Tree/Simple 28 us on every class
# (base 0), CollNet 3.7 / 2.8 (NVLink, PCI), 31 / 30 (network); NVLS and NVLSTree 23 us
# on NVLink, NVLSTree 14 us on the network, no base; NVLS latency intra + inter; NVLS
# bandwidth min(bwIntra, bwInter) (NVLSTree: bwInter / 2 beyond 2 nodes), bus -> algorithm
# 5/6; all-gather and reduce-scatter by NVLS too; CollNetDirect arity 0.4 us.
V2_19 = replace(
    V2_18,
    first="2.19.3",
    base=_set(_set(V2_18.base, (slice(2, 4), slice(None)), 0.0), (slice(4, 6), 2), 0.0),
    hw=_a([
        [[.6, 1.25, 28], [.6, 1.9, 3.4], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 23], [0, 0, 23], [0] * 3],
        [[1, 1.9, 28], [1, 2.5, 5.7], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 0], [0, 0, 0], [0] * 3],
        [[5, 8.5, 28], [2.7, 4, 14], [0, 0, 31], [0, 0, 30], [0, 0, 18], [0, 0, 14], [0] * 3],
    ]),
    nvls_latency="2.19",
    nvls_bandwidth="min",
    nvls_ratio="5/6",
    ag_rs=(RING, NVLS),
    collnet_arity_us=0.4,
)  # fmt: skip

# 2.21.5: NVLS and NVLSTree 25 us on NVLink; Hopper's LL caps 141 / 45 / 35; Ring/LL bus
# factor 0.5 (was 1/4, or 1/3 on one node for all-gather, reduce-scatter, broadcast).
V2_21 = replace(
    V2_19,
    first="2.21.5",
    hw=_set(V2_19.hw, (NVLINK, slice(NVLS, NVLS_TREE + 1), SIMPLE), 25.0),
    ll_max=_set(V2_19.ll_max, HOPPER, [141.0, 45.0, 35.0]),
    ring_ll="half",
)

# 2.23.4: PAT for all-gather and reduce-scatter at one GPU a node (release notes: "Add PAT
# algorithms ... Only supports one rank per node"), bus factor 0.85, base 8 us; Tree/Simple
# base 8.4 us, per step 4.0 / 4.0 / 14 us; ring all-reduce crosses the network 2(N-1) times
# (was 2N); Ring/LL128 0.92 at any GPUs a node; one GPU a node takes Tree's network latency
# ("With ppn=1 latencies are fully exposed"); non-ring all-gather / reduce-scatter keep
# their bus bandwidth.
V2_23 = replace(
    V2_21,
    first="2.23.4",
    base=_set(_set(V2_21.base, (TREE, SIMPLE), 8.4), (PAT, slice(None)), 8.0),
    hw=_set(_set(V2_21.hw, (slice(NVLINK, PCI + 1), TREE, SIMPLE), 4.0), (NET, TREE, SIMPLE), 14.0),
    ring_ar_inter_steps="2(N-1)",
    ring_ll128_one_ppn=None,
    ppn1_tree_net=True,
    ag_rs=(RING, NVLS, PAT),
    ag_rs_convert=False,
    pat_factor=0.85,
)

# 2.24.3: "Adjust PAT tuning" (release notes): PAT bus factor 0.75.
V2_24 = replace(V2_23, first="2.24.3", pat_factor=0.75)

# 2.25.1: a Blackwell row, twice Hopper's caps.
V2_25 = replace(
    V2_24,
    first="2.25.1",
    blackwell=True,
    ll_max=_set(V2_24.ll_max, BLACKWELL, [282.0, 90.0, 70.0]),
    ring_ll128_max=_set(V2_24.ring_ll128_max, BLACKWELL, [73.4] * 3),
    tree_ll128_max=_set(V2_24.tree_ll128_max, BLACKWELL, [73.4, 73.4, 58.0]),
    tree_max=_set(V2_24.tree_max, BLACKWELL, [77.4, 82.8, 72.0]),
)

# 2.27.3: NVLS all-gather / reduce-scatter bandwidth min(bwIntra (ppn-1)/ppn, 0.9 bwInter).
V2_27 = replace(V2_25, first="2.27.3", nvls_bandwidth="min_agrs")

# 2.28.3: the constants move to ncclTunerConstants (exposed to tuner plugins); NVLS
# bandwidth from nvlsEfficiency (Hopper 0.85, Blackwell 0.74) and perChMaxNVLSTreeBws,
# all-reduce pipelining two operations; NVLS bus -> algorithm nRanks / nsteps; Blackwell's
# Tree and Tree/LL128 caps retuned.
V2_28 = replace(
    V2_27,
    first="2.28.3",
    nvls_tree_max=_a([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5],
                      [0.0, 96.0, 43.1]]),
    nvls_efficiency=_a([0.0, 0.0, 0.85, 0.74]),
    tree_ll128_max=_set(V2_27.tree_ll128_max, BLACKWELL, [55.6, 31.67, 20.0]),
    tree_max=_set(V2_27.tree_max, BLACKWELL, [70.0, 42.8, 24.0]),
    nvls_bandwidth="efficiency",
    nvls_ratio="n/nsteps",
)  # fmt: skip

# 2.29.2: NVLSTree 20.9 us a network step (was 14); Blackwell Ring/LL128 34.5 / 34.6 /
# 34.5 and NVLSTree 43.8 at 3+ nodes; a 24th tree correction (256 MiB), read by the new
# Blackwell-on-x86 NVLSTree correction.
V2_29 = replace(
    V2_28,
    first="2.29.2",
    hw=_set(V2_28.hw, (NET, NVLS_TREE, SIMPLE), 20.9),
    ring_ll128_max=_set(V2_28.ring_ll128_max, BLACKWELL, [34.5, 34.6, 34.5]),
    nvls_tree_max=_set(V2_28.nvls_tree_max, (BLACKWELL, 2), 43.8),
    tree_correction=_a(np.hstack([_TREE_CORRECTION_23, [[1.0], [1.0], [0.9]]])),
    nvls_tree_correction=True,
)

# 2.30.7 (tag v2.30.7-1, the newest in the stored mirror): Blackwell Ring/LL128 40 and
# NVLSTree 80 at 3+ nodes.
V2_30 = replace(
    V2_29,
    first="2.30.7",
    ring_ll128_max=_set(V2_29.ring_ll128_max, BLACKWELL, [40.0] * 3),
    nvls_tree_max=_set(V2_29.nvls_tree_max, (BLACKWELL, 2), 80.0),
)

RANGES: tuple[Tables, ...] = (V2_18, V2_19, V2_21, V2_23, V2_24, V2_25, V2_27, V2_28, V2_29, V2_30)
LATEST = RANGES[-1]
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:-\d+)?(?:\+\S*)?\s*$")


def parse_version(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of '2.21', '2.21.5', 'v2.21.5-1' or '2.21.5+cuda12.4'."""
    m = _VERSION.match(str(version))
    if not m:
        raise ValueError(f"not an NCCL version: {version!r} (examples: 2.21, 2.30.7)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def tables(version: str) -> Tables:
    """The constants NCCL `version` prices with (a minor release without a patch number
    takes its range's; later releases than the newest encoded take the newest)."""
    v = parse_version(version)
    first = parse_version(RANGES[0].first)
    if v[:2] < first[:2]:
        raise ValueError(
            f"NCCL {version}: commsim encodes NCCL's tuning model from {RANGES[0].first} on "
            f"(ranges start at {', '.join(t.first for t in RANGES)})"
        )
    return [t for t in RANGES if parse_version(t.first)[:2] <= v[:2]][-1]
