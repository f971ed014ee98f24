"""Model states per GPU under ZeRO and FSDP (weights, gradients, optimizer) and the
buffers that carry them (gradient buckets, gathered ZeRO-3 layers); step.memory adds them
up per pipeline stage.

Follows ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3 and 5): mixed-precision Adam
keeps 2 bytes of fp16/bf16 weights, the gradients, and K = 12 bytes of fp32 master weights,
momentum and variance per parameter; stage 1 shards the optimizer states over the
data-parallel group, stage 2 also the gradients, stage 3 also the weights (FSDP full shard).
"""

from __future__ import annotations

import numpy as np

PARAM_BYTES = 2  # fp16/bf16 weights (ZeRO Sec. 3.1)
FP32_BYTES = 4
OPTIMIZER_BYTES = 12  # fp32 master weights, Adam momentum and variance: K = 12 (ZeRO Sec. 3.1)
# Transformer Engine FP8 with 16-bit primary weights keeps, across a step's micro-batches,
# an FP8 copy of each GEMM weight and, on Hopper, its FP8 transpose for the backward (TE
# Linear's weight workspace, cached while Megatron passes is_first_microbatch): 2 bytes a
# GEMM parameter. FP8 primary weights (Megatron-core fp8_param / --fp8-param-gather, default
# off; Megatron-Bridge's FP8 recipes set it) are that copy: nothing beside PARAM_BYTES
FP8_WEIGHT_COPY_BYTES = 2
MIB = 2**20


def model_state_bytes(params: float, fsdp_states: bool, moment_bytes: int) -> float:
    """Weights and optimizer state of `params` parameters held once, as a checkpoint saves
    them: the states of one unsharded rank (ZeRO 2 + 4 + 2 x moments, FSDP 4 + 2 x moments)."""
    one_rank = dict(dp=1, zero=np.asarray(3), grad_bytes=PARAM_BYTES)
    weights, _, optimizer = zero_states(
        params, **one_rank, fsdp=fsdp_states, moment_bytes=moment_bytes
    )
    return float(weights + optimizer)


def zero_states(params, dp, zero, grad_bytes, fsdp=False, moment_bytes=4):
    """Weight, gradient and optimizer bytes of `params` parameters under a ZeRO stage."""
    # ZeRO Sec. 5.1: P_os 4Ψ + KΨ/Nd, P_os+g 2Ψ + (2 + K)Ψ/Nd, P_os+g+p (2 + 2 + K)Ψ/Nd,
    # K = 12: fp32 master weights, Adam's momentum and variance (Sec. 3.1); with moments of
    # `moment_bytes` K = 4 + 2 x moment_bytes (DeepSeek-V3 sec. 3.3.3: BF16 moments, FP32
    # master weights, K = 8).
    # PyTorch FSDP keeps its shards in the parameters' own dtype, fp32, and casts them to bf16
    # as it gathers them (Zhao et al. 2023, arXiv:2304.11277, Sec. 4.4; FSDP2's
    # MixedPrecisionPolicy): the fp32 shard is the master, so 4 + 8 bytes where ZeRO keeps
    # 2 + 12, and the gradient shard is fp32 (4)
    fsdp = np.asarray(fsdp) & (np.asarray(zero) >= 3)
    moments = 2 * np.asarray(moment_bytes)
    return (
        np.where(fsdp, FP32_BYTES, PARAM_BYTES) * params / np.where(zero >= 3, dp, 1),
        np.where(fsdp, FP32_BYTES, grad_bytes) * params / np.where(zero >= 2, dp, 1),
        (np.where(fsdp, 0, FP32_BYTES) + moments) * params / np.where(zero >= 1, dp, 1),
    )


def comm_buffers(zero, bucket_mb, grad_bytes, largest_layer, params, residual, workspace):
    """Communication buffers, an error-feedback residual and the `workspace` bytes outside the
    tensors (step.workspace: CUDA context, cuBLAS workspaces, NCCL buffers)."""
    # ZeRO 0-2: two buckets, one filling while one is reduced, together never more than the
    # gradient of the `params` held; the gradients themselves live in the buckets (DDP
    # gradient_as_bucket_view, Megatron's contiguous buffer). ZeRO-3/FSDP: the largest layer
    # gathered twice (computing, prefetching) and its gradient before reduce-scatter. Error
    # feedback keeps what compression dropped, a gradient-sized buffer in the bucket's dtype
    # (torch's PowerSGD hook: error_dict, one tensor per bucket of its length and dtype).
    gathered = (2 * PARAM_BYTES + grad_bytes) * largest_layer
    buckets = np.minimum(2.0 * bucket_mb * MIB, grad_bytes * params)
    return workspace + np.where(zero >= 3, gathered, buckets) + residual * params
