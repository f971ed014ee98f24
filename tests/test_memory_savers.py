"""Memory mechanisms a stack may choose (Strategy.recompute_modules, optimizer_moments,
fp8_param, grad_accumulation fp32): each against a hand-computed case and a second count."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.specs import ModelSpec, Strategy
from commsim.step.activations import (
    RECOMPUTE_MODULES,
    ActivationWidths,
    activation_bytes_per_layer,
    recompute_code,
    recompute_names,
)
from commsim.step.layouts import Layouts
from commsim.step.memory import ParallelLayout, memory_per_gpu, memory_per_gpu_batch
from commsim.step.model import state_grad_bytes
from commsim.workload.presets import build_workload

GPT = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)


def _layer(widths, parts, s=4096, h=7168, a=128):
    return activation_bytes_per_layer(s, 1, h, a, 1, False, 0, True, widths, parts)


def test_layernorm_recompute_drops_the_two_norm_outputs_of_korthikanti():
    # Korthikanti Table 2's 34 sbh (flash: no scores) keeps the two LayerNorm outputs, 2 sbh
    # each (the attention's and the MLP's inputs): recomputed, 30 sbh remain
    widths = ActivationWidths.of(build_workload(GPT).arch)
    s, h = 256, 512
    sbh = s * h
    none = activation_bytes_per_layer(s, 1, h, 8, 1, False, 0, True, widths)
    assert none == 34 * sbh
    assert _layer(widths, recompute_code(["layernorm"]), s, h, 8) == 30 * sbh
    # full recomputation keeps the layer input whatever the modules say
    full = activation_bytes_per_layer(s, 1, h, 8, 1, False, 2, True, widths, 7)
    assert full == 2 * sbh


def test_deepseek_block_with_its_three_recomputations_by_inventory():
    # DeepSeek-V3 (arXiv:2412.19437 sec. 3.2.3), BF16, a tensor at a time, per token, for
    # the average block (3 dense of 61): kept are the two norm inputs (2 h each), MLA's
    # latents (q 1536, kv 512, rope key 64: 2 B each) and the attention output (128 x 128);
    # an MoE block keeps each of its 8 routed copies' gate and up (2 x 2048, 2 B) and the 7
    # extra copies' input (h, 2 B), and the shared expert's gate, up and product (3 x 2048);
    # a dense block its MLP's gate, up and product (3 x 18432) -- the norm outputs, Q, K, V
    # and the routed experts' SwiGLU output recomputed
    c = build_workload("deepseek-v3").arch
    h = 7168
    attention = 2 * h + 2 * h + 2 * (1536 + 512 + 64) + 2 * 128 * 128
    moe = 8 * 2 * 2 * 2048 + 7 * 2 * h + 3 * 2 * 2048
    dense = 3 * 2 * 18432
    per_token = attention + (58 * moe + 3 * dense) / 61
    parts = recompute_code(["layernorm", "mla_up_proj", "moe_act"])
    got = _layer(ActivationWidths.of(c), parts) / 4096
    assert got == pytest.approx(per_token, rel=1e-12)


def test_deepseek_fp8_block_with_its_low_precision_caching_by_inventory():
    # as above under FP8 (sec. 3.3.2): the routed experts' SwiGLU inputs (gate, up) in FP8,
    # 1 B; the attention output once in E5M6, 1.5 B; the 7 extra routed copies' input and the
    # shared expert's and the dense MLP's GEMM inputs in FP8 (Transformer Engine), their gate
    # and up in BF16
    c = build_workload("deepseek-v3").arch
    h = 7168
    attention = 2 * h + 2 * h + 2 * (1536 + 512 + 64) + 1.5 * 128 * 128
    moe = 8 * 2 * 2048 + 7 * h + (4 + 1) * 2048
    dense = (4 + 1) * 18432
    per_token = attention + (58 * moe + 3 * dense) / 61
    parts = recompute_code(["layernorm", "mla_up_proj", "moe_act"])
    widths = ActivationWidths.of(c, fp8=True)
    got = activation_bytes_per_layer(4096, 1, h, 128, 1, False, 0, True, widths, parts, True)
    assert got / 4096 == pytest.approx(per_token, rel=1e-12)
    # BF16 widths have nothing for it to save
    assert ActivationWidths.of(c).fp8_cached == 0.0


def test_recompute_codes_round_trip():
    for n in range(2 ** len(RECOMPUTE_MODULES)):
        assert recompute_code(recompute_names(n)) == n
    assert recompute_code(["moe_act", "layernorm"]) == 0b101


def _toy_memory(**kw):
    w = build_workload(GPT, 256, "toy")
    layout = dict(dp=4, tp=2, zero=1, sequence_parallel=True, micro_batches=4, grad_bytes=4)
    return w, memory_per_gpu(w, ParallelLayout(**(layout | kw)))


def test_bf16_moments_by_hand_and_by_parameter_count():
    # ZeRO's K = 12 (fp32 master, momentum, variance) becomes 4 + 2 + 2 = 8 (DeepSeek-V3 sec.
    # 3.3.3), sharded over dp 4 under ZeRO-1: 4 B less a parameter / 4
    w, fp32 = _toy_memory()
    _, bf16 = _toy_memory(moment_bytes=2)
    assert bf16.optimizer / fp32.optimizer == pytest.approx(8 / 12)
    # the parameters this tp rank holds, counted from the layers' shard tags
    held = sum(
        n / (2 if layer.shard(i) else 1) for layer in w.layers for i, n in enumerate(layer.tensors)
    )
    assert fp32.optimizer - bf16.optimizer == pytest.approx(4 * held / 4)
    same = (bf16.params, bf16.grads, bf16.activations)
    assert same == (fp32.params, fp32.grads, fp32.activations)


def test_fp8_weight_copy_counts_the_blocks_gemm_weights():
    # GPT block: QKV 3h^2 + O h^2 + fc1 4h^2 + fc2 4h^2 = 12 h^2 weights split over tp 2, with
    # the column-parallel biases (QKV 3h, fc1 4h) split too; an FP8 copy and its transpose,
    # 2 B each, on 8 blocks
    h = 512
    _, bf16 = _toy_memory()
    _, copy = _toy_memory(fp8=True)
    _, primary = _toy_memory(fp8=True, fp8_param=True)
    assert copy.params - bf16.params == pytest.approx(2 * 8 * (12 * h * h + 7 * h) / 2)
    assert primary.params == bf16.params
    # ZeRO-3 casts a unit's weights as it gathers them: no copy kept
    _, z3 = _toy_memory(zero=3, fp8=True)
    _, z3_bf16 = _toy_memory(zero=3)
    assert z3.params == z3_bf16.params


def test_fp32_accumulation_buffer():
    # Megatron's fp32 main_grad / DeepSpeed's BF16_Optimizer: 4 B a parameter whatever the
    # wire dtype; plain DDP keeps its 2 + 2 + 12 accounting
    assert state_grad_bytes(False, 2, True) == 4
    assert state_grad_bytes(False, 2, False) == 2
    assert state_grad_bytes(False, 4, True) == 4
    assert state_grad_bytes(True, 2, True) == 2


def test_batch_equals_scalar_and_layouts_keep_the_fields():
    w = build_workload("deepseek-v3", 4096, "ds")
    kw = dict(dp=128, pp=16, ep=64, zero=1, micro_batches=120, seq_len=4096, fp8=True)
    kw |= dict(first_layers=3, last_layers=2, grad_bytes=4)
    one = memory_per_gpu(
        w,
        ParallelLayout(**kw, moment_bytes=2, recompute_parts=7, fp8_param=True, fp8_cache=True),
    ).total
    batch = memory_per_gpu_batch(
        w,
        kw.pop("dp"),
        1,
        kw.pop("pp"),
        1,
        kw.pop("zero"),
        0,
        False,
        **{k: np.array([v]) for k, v in kw.items()},
        moment_bytes=2,
        recompute_parts=7,
        fp8_param=True,
        fp8_cache=True,
    )
    assert float(batch[0]) == pytest.approx(one)
    s = Strategy(
        recompute_modules=("mla_up_proj", "layernorm"),
        optimizer_moments="bf16",
        fp8_param=True,
        fp8_cache=True,
    )
    L = Layouts.of([s], 1, lambda _: 1, lambda _: 1)
    back = L.strategy(0, Strategy())
    assert set(back.recompute_modules) == {"layernorm", "mla_up_proj"}
    assert (back.optimizer_moments, back.fp8_param, back.fp8_cache) == ("bf16", True, True)


def test_bad_moment_bytes_refused():
    w = build_workload(GPT, 256, "toy")
    with pytest.raises(ValueError, match="moment_bytes"):
        memory_per_gpu(w, ParallelLayout(moment_bytes=3))
