"""torchtitan's op-level selective activation checkpointing (`recompute: op`): what it keeps,
what it replays, and that the search and `predict` price it alike."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import load_scenario, resolve
from commsim.specs import SpecError
from commsim.step.activations import ActivationWidths, activation_bytes_per_layer
from commsim.step.predict import predict, step_model
from commsim.step.shape import Shape
from commsim.workload.presets import build_workload

H, Q, KV, F = 4096, 4096, 1024, 14336  # Llama 3 8B: 32 heads and 8 KV heads of 128, SwiGLU


def test_llama3_8b_keeps_what_torchtitans_policy_saves():
    """Per token and layer, bf16: the block input (h), the attention output (q), and the
    1st, 3rd, 5th and 7th matmuls' outputs: q, v, the gate (f) and the down projection (h)."""
    w = ActivationWidths.of(build_workload("llama3-8b").arch)
    per_token = 2 * (H + Q + Q + KV + F + H)
    got = activation_bytes_per_layer(1, 1, H, 32, 1, False, 3, True, w)
    assert got == pytest.approx(per_token)  # 63.5 KB, against 136 KB kept without it
    assert activation_bytes_per_layer(1, 1, H, 32, 1, False, 0, True, w) > 2 * got
    # tp 4 with sequence parallelism: column-parallel outputs split, the row-parallel down
    # projection's partial sums whole, the input and two reduce-scatter outputs split
    tp4 = activation_bytes_per_layer(1, 1, H, 32, 4, True, 3, True, w)
    assert tp4 == pytest.approx(2 * ((Q + Q + KV + F) / 4 + H + (H + 2 * H) / 4))


def test_the_replay_is_k_o_and_the_up_projection():
    shape = Shape.of(build_workload("llama3-8b"))
    assert shape.op_replay_flops == pytest.approx(2 * 8192 * H * (KV + Q + F))


def _setup(**fields):
    base = dict(model="llama3-8b", cluster="dgx-h100-ib", gpus=8, global_batch=16)
    sc, src = load_scenario(None, base | {"micro_batch": 2, "seq_len": 8192} | fields)
    return resolve(sc, src)


def test_op_costs_between_none_and_full_and_keeps_between_them():
    runs = {r: predict(_setup(zero=3, recompute=r)) for r in ("none", "op", "full")}
    steps = [runs[r].step_time_s for r in ("none", "op", "full")]
    acts = [runs[r].memory.activations for r in ("none", "op", "full")]
    assert steps[0] < steps[1] < steps[2]
    assert acts[0] > acts[1] > acts[2]


def test_the_search_and_predict_agree_when_op_is_pinned():
    setup = _setup(gpus=16, global_batch=64, recompute="op")
    layouts = enumerate_layouts(setup, {"recompute": "op"})
    found = search(step_model(setup), layouts)
    rank = {int(i): k for k, i in enumerate(found.fitting)}
    picks = np.random.default_rng(5).choice(found.fitting, size=20, replace=False)
    for i in picks.tolist():
        strategy = layouts.strategy(i, setup.scenario.strategy)
        assert strategy.recompute == "op"
        sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
        searched = float(found.breakdown.step[rank[i]])
        assert predict(variant, strategy).step_time_s == pytest.approx(searched, rel=1e-9)


def test_op_is_refused_where_it_is_not_modelled():
    with pytest.raises(SpecError, match="strategy.recompute.*dense attention blocks"):
        _setup(model="mixtral-8x7b", gpus=8, seq_len=4096, zero=3, recompute="op")
