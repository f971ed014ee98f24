"""The ring-or-tree pick from NCCL's Simple-protocol constants that the gloo backend keeps for
`--algorithm nccl` (the NCCL backend prices with the full model: nccl.model)."""

from __future__ import annotations

import numpy as np

# NCCL's tuning model, src/graph/tuning.cc (2.2x series), Simple protocol, microseconds.
_BASE_LAT_US = 8.4  # baseLat, Tree and Ring, Simple


_HW_LAT_US = {  # hwLat[NVLINK | PCI | NET][algorithm][Simple]
    "ring": {"nvlink": 3.4, "pci": 5.7, "net": 14.0},
    "tree": {"nvlink": 4.0, "pci": 4.0, "net": 14.0},
}


_NET_OVERHEAD_US = 3.0  # getNetOverhead: 1 us on x86, times 3 for Simple, multi-node rings


_TREE_BUSBW = 0.92  # tree all-reduce: busBw * .92


_RING_PLATEAU = 1.4  # ring Simple multi-node latency factor on compute capability >= 8.0


# treeCorrectionFactor[Simple] indexed by log2(S / 64 B), 64 B .. 256 MiB.
_TREE_CORRECTION = np.array(
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9]
)  # fmt: skip


def nccl_like_choice(
    n_nodes,
    gpus_per_node,
    size,
    bus_bandwidth,
    *,
    channels: int = 1,
    nvlink: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's ring-or-tree pick for all-reduce and the times its tuner predicts (seconds).

    bus_bandwidth: the busbw NCCL's topology search finds (bytes/s per GPU, all channels;
    for several nodes the NIC share). Follows ncclTopoTuneModel / ncclTopoGetAlgoTime for
    the Simple protocol only: NCCL also weighs LL and LL128 (lower latency below ~64 KiB),
    NVLS and CollNet, so for small messages its real pick and times are lower than these.
    """
    nodes, ppn, size, busbw = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (n_nodes, gpus_per_node, size, bus_bandwidth))
    )
    ranks = nodes * ppn
    multi = nodes > 1
    intra = "nvlink" if nvlink else "pci"
    steps = 2 * (ranks - 1)
    inter_steps = np.where(multi, 2 * (nodes - 1), 0)
    ring_intra = np.maximum(_HW_LAT_US["ring"][intra], np.where(multi, _NET_OVERHEAD_US, 0.0))
    ring_lat = _BASE_LAT_US + (steps - inter_steps) * ring_intra
    ring_lat = ring_lat + inter_steps * _HW_LAT_US["ring"]["net"]
    plateau = multi & (size / (channels * ranks) >= 64)
    ring_lat = np.where(plateau, ring_lat * _RING_PLATEAU, ring_lat)
    ring = ring_lat * 1e-6 + size * np.maximum(steps, 1) / (busbw * ranks)

    log_nodes = np.floor(np.log2(nodes))
    tree_lat = _BASE_LAT_US + 2 * (
        (ppn - 1) * _HW_LAT_US["tree"][intra] + log_nodes * _HW_LAT_US["tree"]["net"]
    )
    log_size = np.floor(np.log2(np.maximum(np.floor(size / 64), 1))).astype(int)  # log2i(S >> 6)
    inside = log_size < _TREE_CORRECTION.size
    correction = np.where(inside, _TREE_CORRECTION[np.minimum(log_size, 22)], 1.0)
    tree = tree_lat * 1e-6 + size / (busbw * _TREE_BUSBW * 0.5 * correction)

    single = ranks <= 1
    names = np.where(tree < ring, "tree", "ring")
    return names, np.where(single, 0.0, np.minimum(tree, ring))
