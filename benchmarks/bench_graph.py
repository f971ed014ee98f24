"""Graph-form cost engine: build the cluster and evaluate a ring and a hierarchical
all-reduce on 1,024 and 16,384 GPUs; wall time and peak memory of each case.

Goal (issue 2): 16,384 GPUs built and evaluated in under 5 s and 2 GiB.
Each case runs in a fresh subprocess so its peak RSS is its own.
Run: .venv/bin/python benchmarks/bench_graph.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

CASES = [(1024, "ring"), (1024, "hierarchical"), (16384, "ring"), (16384, "hierarchical")]
TOPOLOGY = "dgx-h100-ib"
SIZE = 2**30  # 1 GiB all-reduce


def one_case(n_gpus: int, algorithm: str) -> dict:
    """Build + place + evaluate in this process; report times and peak RSS."""
    t0 = time.perf_counter()
    import numpy as np  # noqa: F401  (import cost is not the engine's)

    from commsim import catalog
    from commsim.collectives.group import GroupCost
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec
    from commsim.topology.build import build_cluster
    from commsim.topology.placement import place

    t_import = time.perf_counter()
    spec = load_spec(ClusterSpec, catalog.topology_path(TOPOLOGY))
    cluster = build_cluster(spec, n_gpus)
    t_build = time.perf_counter()
    cost = GroupCost(cluster, place(cluster, n_gpus, "blocked"))
    seconds = float(cost.time("all-reduce", algorithm, SIZE)[0])
    t_eval = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "gpus": n_gpus,
        "algorithm": algorithm,
        "import_s": t_import - t0,
        "build_s": t_build - t_import,
        "evaluate_s": t_eval - t_build,
        "total_s": t_eval - t_import,
        "peak_rss_MiB": peak / 2**20,
        "predicted_allreduce_s": seconds,
        "edges": cluster.graph.number_of_edges(),
    }


def main() -> None:
    print(f"graph-form all-reduce of {SIZE / 2**30:g} GiB on {TOPOLOGY}, blocked placement")
    print(
        f"{'GPUs':>6} {'algorithm':>13} {'build':>8} {'evaluate':>9} {'total':>8} "
        f"{'peak RSS':>9} {'edges':>8} {'predicted':>10}"
    )
    for n, alg in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "--case", str(n), alg],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out)
        print(
            f"{r['gpus']:>6} {r['algorithm']:>13} {r['build_s']:>7.2f}s {r['evaluate_s']:>8.2f}s "
            f"{r['total_s']:>7.2f}s {r['peak_rss_MiB']:>6.0f} MiB {r['edges']:>8} "
            f"{r['predicted_allreduce_s'] * 1e3:>8.2f}ms"
        )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--case":
        print(json.dumps(one_case(int(sys.argv[2]), sys.argv[3])))
    else:
        main()
