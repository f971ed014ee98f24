"""Two-level collectives: rings inside each node at the full size, rings across nodes among
the GPUs of each rail (same local index) at S / g, one phase after another. Runs on whole
nodes only; its closed form needs the intra- and inter-node links."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from commsim.collectives.algorithms import ring
from commsim.collectives.algorithms.base import Algorithm, Form, Rounds, Schedule

# A two-level collective as phases (op, level): "intra" runs on the g GPUs of each node at
# the full size S, "inter" on the n_nodes GPUs of each rail (same local index) at S / g.
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "all-reduce": (("reduce-scatter", "intra"), ("all-reduce", "inter"), ("all-gather", "intra")),
    "reduce-scatter": (("reduce-scatter", "intra"), ("reduce-scatter", "inter")),
    "all-gather": (("all-gather", "inter"), ("all-gather", "intra")),
}


def schedule(op: str, n: int, size: float, *, gpus_per_node: int = 1, **_) -> Schedule:
    """Rings inside nodes at S and across nodes per rail at S/g, phase after phase."""
    nodes = np.arange(n).reshape(n // gpus_per_node, gpus_per_node)
    levels = {"intra": (nodes, size), "inter": (nodes.T, size / gpus_per_node)}
    return [s for phase, level in PHASES[op] for s in ring.ring_steps(phase, *levels[level])]


def terms(op: str, n, *, gpus_per_node=1, **_) -> list[Rounds]:
    # Each phase is a ring (Patarasuk & Yuan 2009) on its tier: g ranks at S inside the
    # node, n / g ranks at S / g across nodes. All rails run at once, each on its own NIC,
    # so the inter-node bandwidth is one GPU's share of the network.
    g = gpus_per_node
    sizes = {"intra": (g, 1.0), "inter": (n // g, 1.0 / g)}
    out = []
    for phase, level in PHASES[op]:
        ranks, scale = sizes[level]
        out += [replace(t, load=t.load * scale, tier=level) for t in ring.terms(phase, ranks)]
    return out


ALGORITHM = Algorithm(
    "hierarchical",
    {op: Form(schedule, terms) for op in PHASES},
    whole_nodes=True,
    two_tier=True,
)
