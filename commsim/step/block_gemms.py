"""The linear layers of a transformer block as GEMM shapes on one GPU: (m, n, k, count), an
m x k by k x n product `count` times, m the tokens, the weights split over tensor parallelism
as Megatron lays them out (column-parallel in, row-parallel out). One list serves the
roofline (step.compute) and tensor-parallel overlap (step.tpoverlap), as do their backward
shapes (grad_gemms) and the bytes a weight-gradient GEMM writes (wgrad_bytes)."""

from __future__ import annotations

import numpy as np

from commsim.step.kernel_bytes import ACT, FUSED_WGRAD


def grad_gemms(shapes):
    """The backward GEMMs of (m, n, k, count) forward GEMMs Y = X W: the data gradients
    dX = dY W^T, (m, k, n, count) (m x k out, over the n outputs), and the weight gradients
    dW = X^T dY, (k, n, m, count) (k x n out, over the m tokens)."""
    return [(m, k, n, c) for m, n, k, c in shapes], [(k, n, m, c) for m, n, k, c in shapes]


def wgrad_bytes(grad_accumulation):
    """HBM bytes a weight-gradient GEMM moves an output element, per layout: the fp32 main
    gradient read and written where the GEMM accumulates into it (grad_accumulation code 0,
    "fused", FUSED_WGRAD), else the bf16 gradient written (ACT)."""
    return np.where(np.asarray(grad_accumulation) == 0, FUSED_WGRAD, ACT)


def attention_gemms(arch, tokens, tp):
    """Attention's projections: fused QKV and the output (or MLA's latents); the last is the
    row-parallel output projection."""
    h, hd = arch.hidden, arch.head_width
    if arch.mla:
        q_up, kv_up = mla_up_gemms(arch, tokens, tp)
        q = [(tokens, arch.q_lora_rank, h, 1.0), q_up] if arch.q_lora_rank else [q_up]
        kv = [(tokens, arch.kv_lora_rank + arch.rope_head_dim, h, 1.0), kv_up]
        return q + kv + [(tokens, h, arch.heads * (arch.v_head_dim or hd) / tp, 1.0)]
    qw, kvw = arch.heads * hd, arch.kv_heads * hd
    return [(tokens, (qw + 2 * kvw) / tp, h, 1.0), (tokens, h, qw / tp, 1.0)]


def mla_up_gemms(arch, tokens, tp):
    """MLA's up-projections: Q's from its latent (from h without q_lora_rank) and the keys'
    and values' from theirs, split over tp."""
    hd = arch.head_width
    qk, vd = hd + arch.rope_head_dim, arch.v_head_dim or hd
    q_in = arch.q_lora_rank or arch.hidden
    kv = (tokens, arch.heads * (hd + vd) / tp, arch.kv_lora_rank, 1.0)
    return [(tokens, arch.heads * qk / tp, q_in, 1.0), kv]


def mlp_gemms(arch, tokens, width, split, count=1.0):
    """An MLP of `width` split over `split` ranks: up (and gate, fused), then down."""
    up = (2 if arch.gated_mlp else 1) * width / split
    return [(tokens, up, arch.hidden, count), (tokens, arch.hidden, width / split, count)]
