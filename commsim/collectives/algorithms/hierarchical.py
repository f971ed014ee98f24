"""Two-level collectives: rings inside each node, rings across nodes per rail."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Schedule
from commsim.collectives.algorithms.ring import ring_steps

# A two-level collective as phases (op, level): "intra" runs on the g GPUs of each node at
# the full size S, "inter" on the n_nodes GPUs of each rail (same local index) at S / g.
HIERARCHICAL_PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "all-reduce": (("reduce-scatter", "intra"), ("all-reduce", "inter"), ("all-gather", "intra")),
    "reduce-scatter": (("reduce-scatter", "intra"), ("reduce-scatter", "inter")),
    "all-gather": (("all-gather", "inter"), ("all-gather", "intra")),
}


def hierarchical_steps(op: str, n: int, gpn: int, size: float) -> Schedule:
    """Rings inside nodes at S and across nodes per rail at S/g, phase after phase."""
    nodes = np.arange(n).reshape(n // gpn, gpn)
    levels = {"intra": (nodes, size), "inter": (nodes.T, size / gpn)}
    return [
        s for phase, level in HIERARCHICAL_PHASES[op] for s in ring_steps(phase, *levels[level])
    ]
