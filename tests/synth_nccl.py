"""nccl-tests logs written from the NCCL backend's model with known parameters and noise:
what the NCCL fit must find again (calibrate.nccl_fit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from commsim.collectives.algorithms import bus_factor
from commsim.collectives.group import GroupCost
from commsim.specs import ClusterSpec
from commsim.topology.build import build_cluster

BINARY = {"all-reduce": "all_reduce_perf", "all-gather": "all_gather_perf"}


def two_h100_nodes() -> ClusterSpec:
    """Two DGX H100-like nodes on one leaf (the calibrate tests' cluster)."""
    return ClusterSpec.model_validate(
        {
            "name": "two-h100-nodes",
            "nodes": 2,
            "node": {
                "gpu": "h100",
                "gpus_per_node": 8,
                "interconnect": "nvswitch",
                "intra_latency": "2us",
                "pcie_bandwidth": "64GB/s",
                "nics": {"count": 8, "bandwidth": "400Gbps", "latency": "3us"},
            },
            "fabric": {
                "kind": "infiniband",
                "nodes_per_leaf": 2,
                "link_latency": "100ns",
                "switch_latency": "200ns",
            },
        }
    )


def nccl_tests_log(
    spec: ClusterSpec,
    op: str,
    hosts: int,
    sizes: np.ndarray,
    *,
    seed: int,
    noise: float = 0.02,
    version_code: int = 22907,
    env: dict[str, str] | None = None,
) -> str:
    """One test of nccl-tests output: `op` on `hosts` nodes of `spec`, every GPU a rank,
    each size timed by the NCCL backend's model times a lognormal noise; `env`'s NCCL
    variables logged by each rank as NCCL_DEBUG=INFO prints them."""
    gpn = spec.node.gpus_per_node
    n = hosts * gpn
    c = build_cluster(spec, n)
    times = GroupCost(c, np.arange(n)).time(op, "nccl", sizes)
    rng = np.random.default_rng(seed)
    times = times * np.exp(rng.normal(0.0, noise, times.size))
    lines = [
        f"# nccl-tests version 2.18.3 nccl-headers={version_code} nccl-library={version_code}",
        f"# Collective test starting: {BINARY[op]}",
        f"# nThread 1 nGpus 1 minBytes {int(sizes[0])} maxBytes {int(sizes[-1])} step: "
        "2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for r in range(n):
        host, dev = divmod(r, gpn)
        lines.append(
            f"#  Rank {r:2d} Group  0 Pid {50000 + r:6d} on   node-a{host + 1:02d} device "
            f"{dev:2d} [0000:{dev + 1:02x}:00] NVIDIA H100 80GB HBM3"
        )
    for r in range(n):
        lines += [
            f"node-a{r // gpn + 1:02d}:{50000 + r}:{50000 + r} [{r % gpn}] NCCL INFO {k} set by "
            f"environment to {v}"
            for k, v in (env or {}).items()
        ]
    lines += [
        "#",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        "
        "      (us)  (GB/s)  (GB/s)",
    ]
    per_rank = 1 if op == "all-reduce" else n
    redop = "sum" if op == "all-reduce" else "none"
    for size, t in zip(sizes, times, strict=True):
        us = t * 1e6
        algbw = size / t / 1e9
        busbw = algbw * float(bus_factor(op, n))
        count = int(size) // 4 // per_rank
        cells = f"{us:8.2f} {algbw:7.2f} {busbw:7.2f}       0"
        lines.append(f"{int(size):12d} {count:13d}     float {redop:>7}      -1 {cells} {cells}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", "#", ""]
    return "\n".join(lines)


def write_logs(path: Path, spec: ClusterSpec) -> list[Path]:
    """An all_reduce_perf and an all_gather_perf on both nodes and an all_gather_perf on
    one, 8 B to 1 GiB, 2% noise: the files an NCCL fit reads."""
    sizes = 2.0 ** np.arange(3, 31)
    out = []
    for k, (op, hosts) in enumerate((("all-reduce", 2), ("all-gather", 2), ("all-gather", 1))):
        p = path / f"{BINARY[op]}_{hosts}x8.log"
        p.write_text(nccl_tests_log(spec, op, hosts, sizes, seed=k))
        out.append(p)
    return out
