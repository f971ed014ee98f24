"""Element-wise HBM traffic of the stacks that run PyTorch modules rather than Megatron-core's
and Transformer Engine's fused kernels (step.compute.ELEMENTWISE): torchtitan's Llama layers
run eagerly or under torch.compile, llm-foundry's MPT layers. Strategy.kernels names the stack.

Each eager op is one CUDA kernel that reads its inputs from HBM and writes its output there;
autograd runs one or more kernels per op backward. The inventories below list them op by op,
in bytes an element of the tensor they walk (bf16 activations, the 2 bytes of ACT; fp32 where
the code upcasts); their sums are the per-element prices the roofline charges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import numpy as np

from commsim.specs import Kernels

# the stacks (Strategy.kernels): Megatron-core / Transformer Engine (step.compute.ELEMENTWISE),
# torchtitan eager, torchtitan with each block torch.compile'd, llm-foundry (MPT, eager)
KERNELS: tuple[str, ...] = get_args(Kernels)

# torchtitan's RMSNorm at 9dec370 (2024-12-26, the commit its Dec 2024 H100 benchmarks name;
# torchtitan/models/norms.py RMSNorm, norm_type "rmsnorm" in train_configs/llama3_*.toml):
# `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight`, (read, write)
# bytes an element of x, row-sized tensors (mean, rsqrt) left out
RMSNORM_FORWARD = (
    (2, 4),  # x.float()
    (4, 4),  # pow(2)
    (4, 0),  # mean(-1): a row's scalar
    (4, 4),  # x * rsqrt(...)
    (4, 2),  # type_as(x)
    (2, 2),  # * weight
)
# autograd, last op first: * weight (dx = dy * w; dw = sum(dy * y): a product, then its
# row sum), type_as's backward (to fp32), x * r (dx = g * r; dr = sum(g * x): a product, then
# its row sum), mean's backward (a full tensor of g / h), pow's backward (aten pow_backward:
# grad * (2 * x.pow(1)); pow(1) is a copy), the two gradients of x.float() summed, and
# float()'s backward to bf16 (torch/csrc/autograd/FunctionsManual.cpp pow_backward; aten
# pow_Tensor_Scalar_out copies for exponent 1)
RMSNORM_BACKWARD = (
    (2, 2),  # dy * w
    (4, 2),  # dy * y
    (2, 0),  # its row sum (dw)
    (2, 4),  # type_as backward: bf16 -> fp32
    (4, 4),  # g * r
    (8, 4),  # g * x
    (4, 0),  # its row sum (dr)
    (0, 4),  # mean backward: g / h expanded
    (4, 4),  # x.pow(1): a copy
    (4, 4),  # 2 * that
    (8, 4),  # grad * that
    (8, 4),  # the two gradients of x.float() summed
    (4, 2),  # float() backward: fp32 -> bf16
)
# SwiGLU, FeedForward.forward `w2(F.silu(w1(x)) * w3(x))`, bytes an element of the hidden
# width: silu, then the product; backward: the product's two gradients (dy * up, dy * silu)
# and silu's backward (reads dy and the gate)
SWIGLU_FORWARD = ((2, 2), (4, 2))
SWIGLU_BACKWARD = ((4, 2), (4, 2), (4, 2))
# rotary embedding, apply_rotary_emb: q (and k) upcast to fp32, viewed as complex, multiplied
# by the complex64 frequencies (broadcast over batch and heads: left out), viewed back, cast to
# bf16; backward the same three kernels (a cast, the conjugate product, a cast)
ROPE_FORWARD = ((2, 4), (4, 4), (4, 2))
ROPE_BACKWARD = ((2, 4), (4, 4), (4, 2))
# torchtitan's loss (train.py loss_fn at 9dec370, not compiled: "compiling loss function causes
# CUDA errors"): cross_entropy(pred.float(), labels), bytes a logit: the bf16 logits cast to
# fp32, log_softmax (read, write); backward: nll_loss's zero-filled gradient, log_softmax's
# backward (reads the gradient and its output), the cast back to bf16
TORCH_CE_FORWARD = ((2, 4), (4, 4))
TORCH_CE_BACKWARD = ((0, 4), (8, 4), (4, 2))
# llm-foundry's default loss at 5e85bd62d (llmfoundry/models/mpt/modeling_mpt.py, loss_fn
# "fused_crossentropy": flash_attn.losses.cross_entropy, a Triton kernel): forward reads the
# bf16 logits once (the row's log-sum-exp kept), backward reads them and writes their gradient
FUSED_CE_FORWARD = (
    (2, 0),
    # and Composer's training metrics, every micro-batch after its backward, without grad
    # (composer/trainer/trainer.py _eval_train_metrics at 2deccf2c8; llm-foundry 5e85bd62d's
    # use_train_metrics defaults to true): LanguageCrossEntropy and LanguagePerplexity each
    # run torch's cross-entropy on the bf16 logits, whose log_softmax autocast runs in fp32
    # (reads 2, writes 4; nll_loss then gathers one a row)
    (2, 4),
    (2, 4),
)
FUSED_CE_BACKWARD = ((2, 2),)
RMSNORM = (RMSNORM_FORWARD, RMSNORM_BACKWARD)
SWIGLU = (SWIGLU_FORWARD, SWIGLU_BACKWARD)
ROPE = (ROPE_FORWARD, ROPE_BACKWARD)


# FSDP2 (torch.distributed fsdp _fsdp_collectives.py foreach_all_gather_copy_out, torch of
# Dec 2024): after each all-gather the compute stream waits for it and copies every
# parameter's bf16 slice out of the all-gather buffer into its unsharded tensor
# (split_with_sizes_copy): read 2, write 2 bytes a parameter of the unit, each gather
FSDP2_COPY_OUT = 2 + 2


def fsdp2_copy_out(kernels: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """Bytes a held parameter of FSDP2's copy-out, per gather, for each layout: torchtitan's
    stacks (its FSDP is FSDP2) with ZeRO-3; FSDP1 (llm-foundry's Composer) gathers straight
    into the flat parameter and views it, no copy."""
    return np.where(torchtitan(kernels) & (zero == 3), FSDP2_COPY_OUT, 0.0)


def torchtitan(kernels: np.ndarray) -> np.ndarray:
    """True where a layout's stack (codes into KERNELS) is torchtitan's, eager or compiled."""
    return np.isin(kernels, [KERNELS.index("torchtitan"), KERNELS.index("torchtitan-compile")])


def total(ops) -> int:
    """Bytes an element of an op inventory: what its kernels read and write."""
    return sum(r + w for r, w in ops)


def repeat_kv_bytes(heads: int, kv_heads: int, head_width: int) -> tuple[int, int]:
    """(forward, backward) bytes a token of torchtitan's repeat_kv (model.py at 9dec370:
    unsqueeze, expand, reshape: a copy, as SDPA's flash kernel then took no grouped K/V) on K and
    V: read the kv_heads heads, write heads; backward, expand's gradient sums the copies back
    (read heads, write kv_heads). None without grouped-query attention."""
    if heads == kv_heads:
        return 0, 0
    once = 2 * (heads + kv_heads) * head_width * 2  # K and V, bf16
    return once, once


@dataclass(frozen=True)
class Prices:
    """Bytes an element of each element-wise kernel class, (forward, backward), each an array
    over the layouts: norm (of a row of h), act (of the MLP's width), rotary (of q and k),
    repeat (a token's K and V copies), loss (a logit)."""

    norm: tuple
    act: tuple
    rotary: tuple
    repeat: tuple
    loss: tuple


def stack_prices(kernels: np.ndarray, fused: dict[str, tuple], arch) -> Prices:
    """The Prices of the layouts' stacks (codes into KERNELS), from `fused` (Megatron's, in
    bytes: norm, act, rotary, loss) where a stack runs the same work. torchtitan-compile fuses
    its blocks (Inductor: each element-wise chain one kernel, as Megatron's) but still copies
    K and V for SDPA and runs its loss eagerly; llm-foundry's LayerNorm and GeLU are single
    ATen kernels as Megatron's are, its loss the fused one. RMSNorm's eager price applies where
    the model's norm is RMSNorm (torchtitan's LayerNorm is one ATen kernel too)."""
    code = {name: kernels == i for i, name in enumerate(KERNELS)}
    eager, foundry = code["torchtitan"], code["llm-foundry"]
    titan = eager | code["torchtitan-compile"]
    rms, gated = arch.style.norm == 1, arch.gated_mlp
    repeat = repeat_kv_bytes(arch.heads, arch.kv_heads, arch.head_width)
    ce = ((TORCH_CE_FORWARD, FUSED_CE_FORWARD), (TORCH_CE_BACKWARD, FUSED_CE_BACKWARD))

    def pick(way, mask, ops, name):
        return np.where(mask, total(ops), fused[name][way])

    return Prices(
        norm=tuple(pick(w, eager & rms, o, "norm") for w, o in enumerate(RMSNORM)),
        act=tuple(pick(w, eager & gated, o, "act") for w, o in enumerate(SWIGLU)),
        rotary=tuple(pick(w, eager, o, "rotary") for w, o in enumerate(ROPE)),
        repeat=tuple(np.where(titan, repeat[w], 0) for w in (0, 1)),
        loss=tuple(
            np.select([titan, foundry], [total(t), total(f)], fused["loss"][w])
            for w, (t, f) in enumerate(ce)
        ),
    )
