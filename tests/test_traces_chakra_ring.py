"""Context parallelism in the Chakra export is the step model's ring, whichever stack runs it:
Transformer Engine's (K/V sends, attention slowed on the SMs NCCL's p2p channels leave) and
PyTorch's for torchtitan's stacks (an all-gather of K and V, fp32 dK/dV sends, its merges).
Checked by a sum over the exported nodes, independent of the writer's and the replay's
clocks, against the step model's compute and ring time, and by the replay against predict."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_traces_chakra import CP, LLAMA, _export, _reads_back_the_same

from commsim.cli.options import setup_from_flags
from commsim.step.predict import step_model, strategy_layouts
from commsim.step.ringsteps import Leg, Ring
from commsim.traces.export import export_graph
from commsim.traces.replay import replay

# the roofline: attention beside a transfer runs slower (one measured efficiency holds none)
ROOF = LLAMA | CP | dict(compute_efficiency="roofline")
LAYOUTS = [
    dict(gpus=8, cp=2),  # Transformer Engine's ring (Megatron-core)
    dict(gpus=8, cp=4, seq_len=8192, cluster="pcie-4gpu", global_batch=2),  # its sends show
    dict(gpus=8, cp=2, kernels="torchtitan"),  # PyTorch's ring
    dict(gpus=8, cp=2, kernels="torchtitan", recompute="selective"),  # its replay too
    dict(gpus=8, cp=4, kernels="torchtitan-compile", global_batch=8),
]
STEP = re.compile(r"^(.* ring step \d+) ")


def _ops_time(nodes) -> float:
    """Seconds of a rank's forwards and backwards summed from its nodes alone: a ring step
    lasts the longer of its transfer (its sends one after another, or its all-gather) and
    its attention; every other compute node its duration."""
    steps: dict[str, list[float]] = {}
    total = 0.0
    for n in nodes:
        if not n.name.startswith(("forward", "backward")):
            continue
        m = STEP.match(n.name)
        if m is None:
            total += n.duration if n.kind == "comp" else 0.0
            continue
        moved, core = steps.setdefault(m.group(1), [0.0, 0.0])
        if n.kind in ("send", "coll"):
            steps[m.group(1)][0] = moved + n.duration
        elif n.kind == "comp":
            steps[m.group(1)][1] = core + n.duration
    return total + sum(max(moved, core) for moved, core in steps.values())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_nodes_sum_to_the_step_models_compute_and_ring(tmp_path, layout):
    """Per rank, the exported forwards and backwards (compute and ring, summed from the
    nodes) are the step model's compute + cp_comm; the replay is predict's step, and the
    files read back and re-priced on the same cluster replay the same."""
    setup, graph, step, paths = _export(tmp_path, **(ROOF | layout))
    model = step_model(setup)
    b = model.evaluate(strategy_layouts(setup, [setup.scenario.strategy])).row(0)
    assert b["cp_comm"] > 0
    for rank in (0, setup.n_gpus - 1):
        assert _ops_time(graph.ranks[rank]) == pytest.approx(b["compute"] + b["cp_comm"], 1e-12)
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_torchtitan_ring_nodes_by_hand():
    """torchtitan, Llama 2 7B (32 heads of 128, K and V as wide as the queries), cp 2 x dp 4,
    4 micro-batches of 32 blocks, 4,096 tokens: per block forward one all-gather of
    cat(K, V), cp x 2 x 2,048 x 4,096 x 2 bytes, on the cp group; backward that all-gather
    again and cp sends of dK and dV in fp32, 2 x 2,048 x 4,096 x 4 bytes, to the other rank;
    no K/V sends. The attention beside each transfer takes longer than alone (the SMs the
    transfer's NCCL kernel holds)."""
    setup = setup_from_flags(None, **(ROOF | dict(gpus=8, cp=2, kernels="torchtitan")))
    graph, _ = export_graph(setup)
    rank0 = graph.ranks[0]
    gathers = [n for n in rank0 if n.kind == "coll" and n.pg == "cp0"]
    sends = [n for n in rank0 if n.kind == "send"]
    assert len(gathers) == 4 * 32 * 2 and {n.op for n in gathers} == {"all-gather"}
    assert {n.bytes for n in gathers} == {2 * 2 * 2048 * 4096 * 2}
    assert len(sends) == 4 * 32 * 2 and all(n.name.startswith("backward") for n in sends)
    assert {n.bytes for n in sends} == {2 * 2048 * 4096 * 4} and {n.peer for n in sends} == {1}
    model = step_model(setup)
    core = float(model.compute(strategy_layouts(setup, [setup.scenario.strategy])).core_fwd[0])
    first = next(n for n in rank0 if n.name.endswith("ring step 1 attention"))
    assert first.name.startswith("forward") and first.duration > core / 2


def test_a_ring_step_by_hand():
    """A step's attention of 0.5 s alone, 1 s on the SMs its 0.25 s transfer leaves: it runs
    at half speed for 0.25 s (0.125 s lost), 0.625 s; three such steps add 0.375 s. Backward
    two 0.25 s messages a step: 0.5 s at half speed, 0.75 s, 0.25 s lost a step."""
    forward = Leg(3, 0.25, 0.5, 1.0, 100.0)
    assert (forward.attention(), forward.added()) == pytest.approx((0.625, 0.375))
    backward = Leg(3, 0.25, 0.5, 1.0, 100.0, sends=2)
    assert (backward.transfer, backward.attention()) == pytest.approx((0.5, 0.75))
    ring = Ring((forward,), (backward,), (0.01, 0.02), np.array([False, True]))
    fwd, bwd = ring.per_layer()
    assert float(fwd) == pytest.approx(0.385)
    assert bwd.tolist() == pytest.approx([0.77, 0.77 + 0.385])
    assert ring.row(1).replay and ring.row(0).backward[0].sends == 2
