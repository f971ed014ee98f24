"""PyTorch FSDP in the Chakra export gathers what step.fsdp prices: reshard_after_forward
(true, false, "all-but-last") decides which units a backward gathers again, and PyTorch's
FSDP never frees its root (the end layers) after the forward; the replay is predict's step
on one stage, where compute hides the gathers and where nothing overlaps."""

from __future__ import annotations

import pytest
from test_traces_chakra import _export, _reads_back_the_same

from commsim.step.pipeline import chunk_times
from commsim.step.predict import step_model, strategy_layouts
from commsim.traces.replay import replay

FSDP = dict(gpus=8, global_batch=16, seq_len=4096, fsdp=True)


@pytest.mark.parametrize(
    "layout",
    [
        dict(),  # the root kept gathered: the end layers gathered forward only
        dict(reshard_after_forward=False),
        dict(reshard_after_forward="all-but-last"),
        dict(reshard_after_forward=False, overlap=False),
        dict(reshard_after_forward=False, cp=2),
        dict(reshard_after_forward=False, fsdp_shard=2),
    ],
)
def test_fsdp_resharding_replays_predict_exactly(tmp_path, layout):
    setup, graph, step, paths = _export(tmp_path, **(FSDP | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


@pytest.mark.parametrize(
    "reshard, backward",
    [(True, 32), (False, 0), ("all-but-last", 31)],
)
def test_backward_gathers_by_hand(tmp_path, reshard, backward):
    """Llama 2 7B, dp 8, 2 micro-batches of 32 units: each forward gathers the 32 units and
    the end layers; a backward gathers all 32 again (true), none (false: kept from the
    forward), or all but the last block it starts on (all-but-last); never the end layers
    (the root stays gathered); 32 reduce-scatters a backward whatever it keeps."""
    _, graph, _, _ = _export(tmp_path, **(FSDP | dict(reshard_after_forward=reshard)))
    z3 = [n for n in graph.ranks[0] if n.name.startswith("zero3")]
    forward = [n for n in z3 if n.op == "all-gather" and "forward" in n.name]
    back = [n for n in z3 if n.op == "all-gather" and "backward" in n.name]
    assert len(forward) == 2 * (32 + 1) and sum("end layers" in n.name for n in forward) == 2
    assert len(back) == 2 * backward and not any("end layers" in n.name for n in back)
    assert sum(n.op == "reduce-scatter" for n in z3) == 2 * 32


ROOF = dict(gpus=8, global_batch=16, seq_len=4096, compute_efficiency="roofline")


@pytest.mark.parametrize(
    "layout",
    [
        dict(zero=3),
        dict(zero=3, tp=2),
        dict(fsdp=True),
        dict(fsdp=True, fsdp_shard=2),
        dict(fsdp=True, reshard_after_forward=False),
        dict(zero=3, cp=2),
        dict(zero=3, cp=2, kernels="torchtitan"),
    ],
)
def test_zero3_units_beside_the_collectives_replay_predict_exactly(tmp_path, layout):
    """On the roofline a unit's compute beside its neighbours' gathers and reduce-scatters
    runs slower (step.fsdp's rates, on the SMs their NCCL kernels leave): the graph's units
    last that long, and on one stage the replay is predict's step again (ring attention's
    blocks as units too)."""
    setup, graph, step, paths = _export(tmp_path, **(ROOF | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_only_units_beside_collectives_are_slowed(tmp_path):
    """dp 8, 2 micro-batches of 32 units: each forward unit but the last runs beside the
    next unit's gather, longer than its compute alone; the last has nothing beside it and
    lasts its share of the op's compute exactly; without contention (one efficiency) every
    unit lasts that share."""
    setup, graph, _, _ = _export(tmp_path, **(ROOF | dict(zero=3)))
    units = [n for n in graph.ranks[0] if n.name.startswith("forward 0 chunk 0 unit")]
    assert len(units) == 32
    alone = units[-1].duration
    L = strategy_layouts(setup, [setup.scenario.strategy])
    t = chunk_times(L.row(0), step_model(setup).evaluate(L).row(0))
    assert alone == pytest.approx(t.forward / 32, rel=1e-12)
    assert all(n.duration > alone * 1.001 for n in units[:-1])
    _, plain, _, _ = _export(tmp_path, **(ROOF | dict(zero=3, compute_efficiency=0.45)))
    shares = {n.duration for n in plain.ranks[0] if n.name.startswith("forward 0 chunk 0 unit")}
    assert len(shares) == 1
