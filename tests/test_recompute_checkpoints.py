"""The checkpointed recompute_modules (Megatron-core's tensor_parallel.checkpoint ones):
"core_attn" and "mlp", the activation bytes each frees and the forward each replays, against
hand-computed bytes and seconds and against an independent route (selective recomputation;
the workload's own FLOP count; the activation widths of a model without an MLP)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import make_cluster
from test_recompute_time import H100, MOE, _block, _replay

from commsim.scenario import SpecError, _check_recompute_modules
from commsim.specs import ModelSpec, Strategy
from commsim.step.activations import (
    ActivationWidths,
    activation_bytes_per_layer,
    recompute_code,
)
from commsim.step.gemm import Rates
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload

DENSE = ModelSpec(
    name="toy-dense", layers=4, hidden=1024, heads=8, vocab=1000, seq_len=512, gated_mlp=True,
    ffn_hidden=2048,
)  # fmt: skip
MLP, CORE = recompute_code(["mlp"]), recompute_code(["core_attn"])


def _kept(c, parts, fp8=False, flash=True, recompute=0, s=4096):
    w = ActivationWidths.of(c, fp8=fp8)
    return float(
        activation_bytes_per_layer(s, 1, c.hidden, c.heads, 1, False, recompute, flash, w, parts)
    )


def test_mlp_frees_the_dense_mlp_inside_by_hand():
    # llama2-7b, 4096 tokens: a token's gate and up (2 x 11008, 2 B) and their product, the
    # down projection's input (11008, 2 B; FP8 1 B); under FP8 the checkpoint keeps its
    # input in BF16 (2 B of h) where the FP8 GEMM kept 1 B -- unless "layernorm" drops it
    c, h, f = build_workload("llama2-7b").arch, 4096, 11008
    assert _kept(c, 0) - _kept(c, MLP) == pytest.approx(4096 * 6 * f)
    assert _kept(c, 0, fp8=True) - _kept(c, MLP, fp8=True) == pytest.approx(4096 * (5 * f - h))
    both = recompute_code(["mlp", "layernorm"])
    freed = _kept(c, 0, fp8=True) - _kept(c, both, fp8=True)
    assert freed == pytest.approx(4096 * (5 * f + 2 * h))  # the two FP8 norm outputs too


def test_mlp_frees_what_a_model_without_its_mlp_would_not_keep():
    # independent: the widths of the same model with no MLP (ffn_hidden 0) keep exactly the
    # rest; on DeepSeek-V3 only its 3 dense blocks of 61 have such an MLP (moe layers: none)
    for name in ("llama2-7b", "deepseek-v3"):
        c = build_workload(name).arch
        share = c.dense_layers / c.layers if c.experts > 1 else 1.0
        no_mlp = ActivationWidths.of(replace(c, ffn_hidden=0))
        w = ActivationWidths.of(c)
        inside = (w.split - no_mlp.split) * c.hidden if c.experts <= 1 else 6.0 * c.ffn_hidden
        assert w.dense_mlp * c.hidden == pytest.approx(share * inside)


def test_core_attn_frees_the_scores_as_selective_recomputation():
    # eager attention, 2048 tokens, GPT widths (scores 5 B an element: softmax, dropout mask
    # and output): 32 heads x 2048^2 scores freed; the same bytes as selective recomputation
    c = build_workload("llama2-7b").arch
    w = ActivationWidths()
    kept = lambda r, p: float(  # noqa: E731
        activation_bytes_per_layer(2048, 1, 4096, 32, 1, False, r, False, w, p)
    )
    assert kept(0, 0) - kept(0, CORE) == pytest.approx(5 * 32 * 2048**2)
    assert kept(0, CORE) == kept(1, 0) == kept(1, CORE)
    # FlashAttention keeps no scores: nothing more to free
    assert _kept(c, CORE) == _kept(c, 0)


def test_mlp_replays_the_dense_mlp_forward_by_hand():
    # 4096 tokens on one GPU: the gate-and-up GEMM 4096 x 4096 x 1024 (16 x 32 = 512 tiles
    # of 256 x 128, 4 waves on 132 SMs), the down GEMM 4096 x 1024 x 2048 (128 tiles, one
    # wave), each writing its output (2 B an element), and SwiGLU reading gate and up,
    # writing their product (3 x 2048 values, 2 B)
    w = build_workload(DENSE)
    rates = Rates.of(H100)
    up = 2 * 4096 * 4096 * 1024 / (rates.gemm * 512 / (4 * 132)) + 4096 * 4096 * 2 / rates.memory
    down = 2 * 4096 * 1024 * 2048 / (rates.gemm * 128 / 132) + 4096 * 1024 * 2 / rates.memory
    act = 4096 * 3 * 2048 * 2 / rates.memory
    assert _replay(_block(w), "mlp") == pytest.approx(up + down + act, rel=1e-12)
    # the MoE toy has no dense block: nothing to replay
    assert _replay(_block(build_workload(MOE)), "mlp") == 0.0


def _model(w, efficiency=None):
    cluster = make_cluster(nodes=1, gpus_per_node=8, nics=8, nic_bw="400Gbps")
    return StepModel(w, cluster, H100, 8, 64, efficiency)


def test_mlp_flops_agree_with_the_workloads_own_count():
    # independent: the workload's block FLOPs grow by the MLP's when ffn_hidden doubles;
    # one efficiency for every FLOP: the replay takes those FLOPs' time, hfu counts them
    a, b = (build_workload(DENSE.model_copy(update={"ffn_hidden": f})) for f in (2048, 4096))
    model_a, model_b = _model(a, 0.5), _model(b, 0.5)
    grown = model_b.shape.block_flops - model_a.shape.block_flops
    assert model_b.shape.mlp_flops - model_a.shape.mlp_flops == pytest.approx(grown)
    assert model_a.shape.mlp_flops == 2 * 512 * 1024 * 2048 * 3
    L = Layouts.build(dp=8, micro_batches=8, recompute_parts=[0, MLP])
    br = model_a.evaluate(L)
    sh = model_a.shape
    extra = 8 * sh.blocks * sh.mlp_flops / (H100.peak_flops * 0.5)  # 8 micro-batches
    assert br.backward[1] - br.backward[0] == pytest.approx(extra, rel=1e-9)
    hfu = br.hfu * br.step * 8 * H100.peak_flops
    assert hfu[1] - hfu[0] == pytest.approx(64 * sh.blocks * sh.mlp_flops, rel=1e-6)


def test_core_attn_is_selective_recomputation_in_the_step():
    # independent: core_attn beside none replays the attention core as selective does, with
    # context parallelism's ring steps; beside selective it adds nothing (tp 2: a layout
    # with neither is plain DDP, Layouts.plain, whose gradients are held otherwise)
    w = build_workload(DENSE)
    model = _model(w)
    L = Layouts.build(
        dp=[4, 4, 4, 2], tp=2, cp=[1, 1, 1, 2], micro_batches=8, recompute=[1, 0, 1, 0],
        recompute_parts=[0, CORE, CORE, CORE],
    )  # fmt: skip
    b = model.evaluate(L)
    assert b.backward[1] == b.backward[0] == b.backward[2]
    assert b.memory[1] == b.memory[0]
    assert b.hfu[1] == b.hfu[0]
    ring = Layouts.build(dp=2, tp=2, cp=2, micro_batches=8, recompute=1)
    assert b.backward[3] == pytest.approx(model.evaluate(ring).backward[0], rel=1e-12)
    plain = Layouts.build(dp=4, tp=2, micro_batches=8)
    assert b.backward[1] > model.evaluate(plain).backward[0]


def test_a_module_the_model_lacks_is_refused():
    # "mlp" checkpoints dense MLPs only (Megatron-core skips MoE layers): the all-MoE toy has
    # none; DeepSeek-V3's 3 dense blocks take it
    moe = build_workload(MOE)
    with pytest.raises(SpecError, match="mlp: toy-moe has no dense MLP blocks"):
        _check_recompute_modules(moe, Strategy(recompute_modules=("mlp",)), "s.yaml")
    _check_recompute_modules(moe, Strategy(recompute_modules=("core_attn",)), "s.yaml")
    ds = build_workload("deepseek-v3")
    _check_recompute_modules(ds, Strategy(recompute_modules=("mlp",)), "s.yaml")
    assert np.isclose(ActivationWidths.of(ds.arch).dense_mlp, 3 / 61 * 6 * 18432 / 7168)


SHARED = MOE.model_copy(update={"shared_experts": 1, "name": "toy-shared"})
SHARED_CODE = recompute_code(["shared_experts"])


def test_shared_experts_free_their_inside_by_hand():
    # DeepSeek-V3, its 58 MoE blocks of 61: the shared expert's gate and up (2 x 2048, 2 B)
    # and their product (2048, 2 B; FP8 1 B) a token; its input is kept (the router's)
    c = build_workload("deepseek-v3").arch
    per_token = 58 / 61 * 6 * 2048
    assert _kept(c, 0) - _kept(c, SHARED_CODE) == pytest.approx(4096 * per_token)
    fp8 = _kept(c, 0, fp8=True) - _kept(c, SHARED_CODE, fp8=True)
    assert fp8 == pytest.approx(4096 * 58 / 61 * 5 * 2048)
    # independent: the widths of the same model without shared experts keep the rest
    no_shared = ActivationWidths.of(replace(c, shared_experts=0))
    assert ActivationWidths.of(c).split - no_shared.split == pytest.approx(per_token / c.hidden)


def test_shared_experts_replay_their_forward_by_hand():
    # 4096 tokens on one GPU: the shared expert's gate-and-up GEMM 4096 x 1024 x 1024 and its
    # down GEMM 4096 x 1024 x 512 (16 x 8 = 128 tiles of 256 x 128 each, one wave on 132
    # SMs), each writing its 4096 x 1024 output (2 B), and SwiGLU (3 x 512 values, 2 B);
    # every block of the toy is MoE
    rates = Rates.of(H100)
    out = 4096 * 1024 * 2 / rates.memory
    up = 2 * 4096 * 1024 * 1024 / (rates.gemm * 128 / 132) + out
    down = 2 * 4096 * 1024 * 512 / (rates.gemm * 128 / 132) + out
    act = 4096 * 3 * 512 * 2 / rates.memory
    block = _block(build_workload(SHARED))
    assert _replay(block, "shared_experts") == pytest.approx(up + down + act, rel=1e-12)
    assert _replay(_block(build_workload(MOE)), "shared_experts") == 0.0
    # independent: the workload's block FLOPs grow by the shared expert's GEMMs
    a, b = (_model(build_workload(spec), 0.5).shape for spec in (MOE, SHARED))
    assert b.shared_flops - a.shared_flops == pytest.approx(b.block_flops - a.block_flops)
    assert b.shared_flops == 2 * 512 * 1024 * 512 * 3
    assert b.module_flops(SHARED_CODE) == b.shared_flops


def test_shared_experts_need_shared_experts():
    for spec in (MOE, DENSE):
        w = build_workload(spec)
        with pytest.raises(SpecError, match="shared_experts: .* has no shared experts"):
            _check_recompute_modules(w, Strategy(recompute_modules=("shared_experts",)), "s")
    _check_recompute_modules(
        build_workload(SHARED), Strategy(recompute_modules=("shared_experts",)), "s"
    )
