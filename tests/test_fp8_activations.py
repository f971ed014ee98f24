"""FP8 activations: Transformer Engine keeps an FP8 GEMM's input for the weight gradient in
FP8 (1 byte), so a block under FP8 keeps less than Korthikanti's BF16 count. Checked by a
tensor-by-tensor inventory of what each TE module saves, against ActivationWidths' formula,
and through memory_per_gpu (scalar and batch alike)."""

import numpy as np
import pytest

from commsim.step.activations import ActivationWidths
from commsim.step.memory import ParallelLayout, memory_per_gpu, memory_per_gpu_batch
from commsim.workload.presets import build_workload


def saved_bytes(h, q, kv, f, gated, dropout, fp8):
    """Bytes a token's block keeps, module by module (Megatron-core's TE layer spec):
    (replicated, split over tp). An independent inventory, not the widths formula."""
    gemm = 1 if fp8 else 2  # TE v2.8 linear.py / layernorm_linear.py: FP8 input saved in FP8
    replicated = [
        2 * h,  # input_layernorm + linear_qkv (LayerNormLinear): the norm's input, BF16
        gemm * h,  # ... its ln_out, the QKV GEMM's input
        2 * h,  # pre_mlp_layernorm + linear_fc1: the norm's input
        gemm * h,  # ... its ln_out, fc1's input
        (1 * h + 1 * h) if dropout else 0,  # two dropout masks
    ]
    split = [
        2 * (q + kv + kv),  # the attention kernel's Q, K, V
        2 * q,  # and its output (BF16: FlashAttention's backward reads O)
        1 * q if fp8 else 0,  # linear_proj's FP8 copy of that output (BF16: the same tensor)
        (4 * f if gated else 2 * f),  # the activation's input: gate and up, or fc1's output
        gemm * f,  # linear_fc2's input, the activation's output
    ]
    return sum(replicated), sum(split)


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-8b", "llama3-70b"])
@pytest.mark.parametrize("fp8", [False, True])
def test_widths_match_the_module_inventory(name, fp8):
    c = build_workload(name).arch
    w = ActivationWidths.of(c, fp8=fp8)
    rep, split = saved_bytes(
        c.hidden,
        c.heads * c.head_width,
        c.kv_heads * c.head_width,
        c.ffn_hidden,
        c.gated_mlp,
        c.has_dropout,
        fp8,
    )
    assert (w.replicated, w.split) == pytest.approx((rep / c.hidden, split / c.hidden))


def test_gpt_block_by_hand():
    # GPT-3 (4h MLP, MHA, dropout): BF16 is Korthikanti's 10 + 24; FP8: norms 2 + 2, GEMM
    # inputs 1 + 1, masks 1 + 1 = 8 replicated; Q, K, V, O 8 + O's FP8 copy 1 + fc1 out 2 x 4
    # + GeLU out 1 x 4 = 21 split
    c = build_workload("gpt3-175b").arch
    assert (ActivationWidths.of(c).replicated, ActivationWidths.of(c).split) == (10.0, 24.0)
    fp8 = ActivationWidths.of(c, fp8=True)
    assert (fp8.replicated, fp8.split) == pytest.approx((8.0, 21.0))
    # the scores term (eager attention) and op-level checkpointing are not FP8's
    assert fp8.scores == ActivationWidths.of(c).scores


def test_fp8_lowers_only_the_activations():
    w = build_workload("llama3-70b")
    layout = dict(dp=2, tp=4, pp=8, interleave=5, zero=1, micro_batches=64, seq_len=8192)
    bf16 = memory_per_gpu(w, ParallelLayout(**layout, sequence_parallel=True, grad_bytes=4))
    # with FP8 primary weights (no FP8 weight copy beside them: test_memory_savers)
    fp8 = memory_per_gpu(
        w, ParallelLayout(**layout, sequence_parallel=True, grad_bytes=4, fp8=True, fp8_param=True)
    )
    assert (fp8.params, fp8.grads, fp8.optimizer) == (bf16.params, bf16.grads, bf16.optimizer)
    # tp 4 with sequence parallelism: (6 + 23) / 4 against (8 + 25.5) / 4 a layer's sbh
    assert fp8.activations / bf16.activations == pytest.approx(29 / 33.5, rel=1e-3)
    full = memory_per_gpu(
        w, ParallelLayout(**layout, sequence_parallel=True, recompute="full", fp8=True)
    )
    kept = memory_per_gpu(w, ParallelLayout(**layout, sequence_parallel=True, recompute="full"))
    assert full.activations == kept.activations  # full recompute keeps the BF16 layer input


def test_fp8_batch_equals_scalar():
    w = build_workload("mixtral-8x7b")
    fp8 = np.array([False, True, True, False])
    tp = np.array([1, 2, 4, 8])
    batch = memory_per_gpu_batch(w, 8, tp, 2, 1, 1, 0, tp > 1, micro_batches=8, fp8=fp8)
    for i in range(4):
        layout = ParallelLayout(
            dp=8,
            tp=int(tp[i]),
            pp=2,
            zero=1,
            sequence_parallel=bool(tp[i] > 1),
            micro_batches=8,
            fp8=bool(fp8[i]),
        )
        assert batch[i] == pytest.approx(memory_per_gpu(w, layout).total, rel=1e-12)


def test_moe_copies_keep_fp8_inputs():
    # Mixtral: top-2 x capacity 1.25 routed copies, each keeping its expert's gate and up in
    # BF16 (4 x 14336), the product in FP8 (14336) and its FP8 input beyond the first (4096)
    c = build_workload("mixtral-8x7b").arch
    w = ActivationWidths.of(c, fp8=True)
    attention = 2 * (4096 + 1024 + 1024 + 4096) + 4096
    moe = 2.5 * 5 * 14336 + 1.5 * 1 * 4096
    assert (w.replicated, w.split) == pytest.approx((6.0, (attention + moe) / 4096))
