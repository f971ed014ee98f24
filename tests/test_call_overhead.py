"""A cluster's per-call software overhead (ClusterSpec.call_overhead): every collective on
two or more ranks costs it once, whatever the backend, algorithm or size."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_spec

from commsim.collectives.evaluate import graph_time
from commsim.collectives.group import GroupCost
from commsim.topology.build import build_cluster

SIZES = np.array([8.0, 2.0**16, 3 * 2.0**20])


def _cost(overhead: float, backend: str = "gloo", n: int = 4) -> GroupCost:
    spec = make_spec(nodes=4, gpus_per_node=1, backend=backend)
    spec = spec.model_copy(update={"call_overhead": overhead})
    return GroupCost(build_cluster(spec, 4), np.arange(n))


@pytest.mark.parametrize(("op", "algorithm"), [("all-reduce", "ring"), ("broadcast", "auto")])
def test_overhead_added_once_per_call_on_the_graph(op, algorithm):
    cost = _cost(5e-3)
    times, names = cost.time_and_choice(op, algorithm, SIZES)
    # the graph evaluator itself, independently of GroupCost's affine interpolation
    graph = [graph_time(op, names[0], s, cost.cluster, cost.gpus) for s in SIZES]
    assert times == pytest.approx(np.array(graph) + 5e-3, rel=1e-9)
    assert cost.time(op, algorithm, SIZES) == pytest.approx(times, rel=1e-12)


def test_affine_intercept_and_nccl_carry_it_one_rank_does_not():
    plain, slow = _cost(0.0), _cost(2e-3)
    (a0, b0), (a1, b1) = plain.affine("all-gather", "ring"), slow.affine("all-gather", "ring")
    assert (a1 - a0, b1) == (pytest.approx(2e-3), b0)
    nccl0, nccl1 = _cost(0.0, "nccl"), _cost(2e-3, "nccl")
    diff = nccl1.time("all-reduce", "auto", SIZES) - nccl0.time("all-reduce", "auto", SIZES)
    assert diff == pytest.approx(np.full(SIZES.size, 2e-3))
    assert _cost(2e-3, n=1).time("all-reduce", "ring", SIZES).tolist() == [0.0, 0.0, 0.0]
