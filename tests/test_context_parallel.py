"""Ring attention's per-layer costs (step.context): merging the cp steps' partial results
through HBM, and the K/V transfers a step's attention cannot hide, against hand-computed
figures, a step-by-step simulation of Transformer Engine's loop, and the step model."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.context import merge_bytes, ring_attention
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload


def test_merge_bytes_by_hand():
    # cp 4, 1,000 query and 100 key elements: forward 4 (init: read 2, write the bf16
    # accumulator 2) + 3 x 6 (rescale and add: read 2, read and write the sum 2 + 2) bytes a
    # query element, no cast after (TE keeps the sum in the output's dtype without FP8
    # attention); backward 4 (copy) + 3 x 6 (add) a dQ, dK, dV element
    fwd, bwd = merge_bytes(np.array([4, 1]), 1000.0, 100.0)
    assert fwd.tolist() == [22 * 1000, 0.0]
    assert bwd.tolist() == [22 * 1200, 0.0]


def test_ring_attention_by_hand():
    # cp 4, a 1 s transfer a step, 2 s of attention core (0.5 s a step): 3 transfers show
    # 0.5 s each forward; backward 2 transfers (K, V and their gradients) against 1.25 s
    fwd, bwd = ring_attention(4, 1.0, 2.0, 100.0, 200.0, 100.0)
    assert float(fwd) == pytest.approx(3 * 0.5 + 1.0)
    assert float(bwd) == pytest.approx(3 * 0.75 + 2.0)
    hidden_f, hidden_b = ring_attention(4, 0.1, 2.0, 0.0, 0.0, 1.0)
    assert (float(hidden_f), float(hidden_b)) == (0.0, 0.0)


def _simulated_ring(cp: int, transfer: float, share: float) -> float:
    """Transformer Engine's forward loop event by event: step i waits for its K/V, issues
    the next transfer as it starts, then attends for `share` seconds; the end, less the
    attention itself."""
    start, arrived = 0.0, 0.0
    for i in range(cp):
        start = max(start, arrived)
        if i < cp - 1:
            arrived = start + transfer  # sent on as step i starts
        start += share
    return start - cp * share


@pytest.mark.parametrize("seed", range(30))
def test_the_exposed_transfers_are_the_simulated_rings(seed):
    rng = np.random.default_rng(seed)
    cp = int(rng.choice([2, 4, 8, 16]))
    transfer, core = rng.uniform(0, 2), rng.uniform(0, 8)
    fwd, _ = ring_attention(cp, transfer, core, 0.0, 0.0, 1.0)
    assert float(fwd) == pytest.approx(_simulated_ring(cp, transfer, core / cp), abs=1e-12)


def _model():
    shape = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, gated_mlp=True)
    spec = ModelSpec(name="llama-ish", vocab=1000, seq_len=8192, **shape)
    cluster = make_cluster(nodes=2, gpus_per_node=8, nics=8, nic_bw="400Gbps")
    gpu = catalog.GPUS["h100"]
    return StepModel(build_workload(spec), cluster, gpu, 16, 16, None), gpu


def test_the_step_model_charges_each_layer_its_merges():
    hm, gpu = _model()
    L = Layouts.build(dp=2, cp=8, micro_batches=8)
    b = hm.evaluate(L).row(0)
    blocks, tokens = 4, 8192 / 8
    queries, keys = tokens * 16 * 64, tokens * 4 * 64
    fwd, bwd = merge_bytes(8, queries, keys)
    merges = blocks * (float(fwd) + float(bwd)) / 2.97e12  # the H100's BabelStream Triad
    assert b["cp_comm"] >= 8 * merges * (1 - 1e-12)  # 8 micro-batches; transfers on top
    one = hm.evaluate(Layouts.build(dp=16, micro_batches=1)).row(0)
    assert one["cp_comm"] == 0.0
    # recomputation that replays attention replays its ring steps
    full = hm.evaluate(Layouts.build(dp=2, cp=8, micro_batches=8, recompute=2)).row(0)
    assert full["cp_comm"] - b["cp_comm"] == pytest.approx(b["comm_forward"], rel=1e-9)


def test_the_sequence_must_split_into_2_cp_chunks():
    # scenario._check_cp_chunks: Megatron-core's load-balanced causal split gives each cp
    # rank 2 chunks, so 4096 tokens take cp 2 (4 chunks of 1024) and 4095 do not
    from commsim.cli.options import setup_from_flags
    from commsim.specs import SpecError

    flags = {"model": "llama2-7b", "cluster": "dgx-h100-ib", "gpus": 256, "tp": 2, "cp": 2}
    assert setup_from_flags(None, seq_len=4096, **flags).scenario.strategy.cp == 2
    with pytest.raises(SpecError, match="sequence length 4095 does not split into 2 x cp = 4"):
        setup_from_flags(None, seq_len=4095, **flags)
    with pytest.raises(SpecError) as e:
        setup_from_flags(None, seq_len=4094, **flags | {"cp": 4})
    assert e.value.field == "strategy.cp"


def test_the_cp_split_rule_by_hand_and_against_megatrons_split():
    # scenario.cp_split_problem, the one statement of the rule, against the split itself:
    # Megatron-core cuts the sequence into 2 cp chunks and gives rank r chunks r and
    # 2 cp - 1 - r, so every rank holds the same tokens only when the chunks are equal
    from commsim.scenario import cp_split_problem

    assert cp_split_problem(4096, 2) == ""
    assert cp_split_problem(4095, 2) == "sequence length 4095 does not split into 2 x cp = 4 chunks"
    assert all(cp_split_problem(seq, 1) == "" for seq in (1, 2, 4095))  # no split at cp 1
    for cp in (2, 3, 4, 8):
        for seq in range(2 * cp, 40 * cp):
            chunks = [len(c) for c in np.array_split(np.arange(seq), 2 * cp)]
            ranks = {chunks[r] + chunks[2 * cp - 1 - r] for r in range(cp)}
            even = len(set(chunks)) == 1 and len(ranks) == 1
            assert (cp_split_problem(seq, cp) == "") == even, (seq, cp)


@pytest.mark.parametrize("seq,cps", [(4095, {1}), (6144, {1, 2, 4}), (12288, {1, 2, 4, 8})])
def test_the_search_proposes_only_a_cp_that_splits_the_sequence(seq, cps):
    # unpinned, the search's cp degrees split the sequence (and keep 512-token chunks)
    from commsim.planner.search import context_parallel_choices, enumerate_layouts
    from commsim.scenario import cp_split_problem, load_scenario, resolve

    assert all(
        not cp_split_problem(s, c) for s in range(1, 20000, 7) for c in context_parallel_choices(s)
    )
    flags = dict(model="llama2-7b", cluster="dgx-h100-ib", gpus=32, global_batch=64, seq_len=seq)
    setup = resolve(*load_scenario(None, flags), check=False)
    layouts = enumerate_layouts(setup, {"micro_batch": 1, "recompute": "none"})
    assert set(layouts.cp.tolist()) == cps
