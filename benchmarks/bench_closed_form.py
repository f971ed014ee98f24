"""Closed-form evaluations per second, vectorised over group sizes x message sizes.

The planner calls these formulas millions of times; the goal is 1,000,000 evaluations/s.
Run: .venv/bin/python benchmarks/bench_closed_form.py
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS
from commsim.collectives.evaluate import collective_time, hierarchical_time
from commsim.collectives.select import best_algorithm

GOAL = 1_000_000
N = np.arange(2, 1026)[:, None]  # 1,024 group sizes
SIZE = 2.0 ** np.linspace(3, 32, 1024)[None, :]  # 1,024 sizes, 8 B .. 4 GiB
ALPHA, BW = 5e-6, 25e9
OVERHEAD = 2e-6  # a per-message o given explicitly (alpha's endpoint part), not alpha / 2


def rate(fn, evaluations: int, repeats: int = 5) -> float:
    """Best evaluations per second over a few runs."""
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return evaluations / best


def main() -> None:
    grid = N.size * SIZE.size
    rows = []
    for op, algs in ALGORITHMS.items():
        for alg in algs:
            if alg == "hierarchical":
                fn = partial(hierarchical_time, op, N, 8, SIZE, 1e-6, 450e9, ALPHA, BW)
            else:
                fn = partial(collective_time, op, alg, N, SIZE, ALPHA, BW, ps_shards=N)
            rows.append((f"{op} {alg}", rate(fn, grid)))
    for op, alg in (("all-reduce", "tree"), ("all-reduce", "ps"), ("all-to-all", "direct")):
        fn = partial(collective_time, op, alg, N, SIZE, ALPHA, BW, ps_shards=N, overhead=OVERHEAD)
        rows.append((f"{op} {alg}, o given", rate(fn, grid)))
    auto = partial(best_algorithm, "all-reduce", N, SIZE, ALPHA, BW)
    rows.append(("all-reduce auto (best of 3)", rate(auto, grid)))
    print(f"{N.size} group sizes x {SIZE.size} sizes = {grid:,} evaluations per call")
    for name, r in rows:
        print(f"  {name:30s} {r:14,.0f} /s  {'ok' if r >= GOAL else 'BELOW GOAL'}")
    print(f"slowest vectorised: {min(r for _, r in rows):,.0f} /s (goal {GOAL:,} /s)")
    nccl_rows()
    scalar = partial(collective_time, "all-reduce", "ring", 64, 2.0**20, ALPHA, BW)
    print(f"one scalar call (numpy overhead): {rate(scalar, 1, repeats=2000):,.0f} /s")


def nccl_rows() -> None:
    """NCCL's model: its choice and time vectorised over sizes for one communicator (64 and
    4,096 DGX H100 GPUs), and how many communicators' tables it builds a second."""
    from commsim import catalog
    from commsim.collectives.nccl.model import CommModel
    from commsim.collectives.nccl.tables import tables
    from commsim.collectives.nccl.topo import Machine
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec

    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-h100-ib"))
    machine, t = Machine.from_spec(spec), tables(spec.nccl.version)
    sizes = np.ravel(2.0 ** np.linspace(3, 32, N.size * SIZE.size))
    for ranks, nodes in ((64, 8), (4096, 512)):
        model = CommModel(machine, t, ranks, nodes)
        for op in ("all-reduce", "all-gather"):
            r = rate(partial(model.estimate, op, sizes), sizes.size)
            print(f"  NCCL {op} choice, {ranks} ranks  {r:14,.0f} /s")
    shapes = [(8 * k, k) for k in range(1, 129)]
    build = rate(lambda: [CommModel(machine, t, n, k) for n, k in shapes], len(shapes), 3)
    print(f"  NCCL tables built: {build:,.0f} communicators /s")


if __name__ == "__main__":
    main()
