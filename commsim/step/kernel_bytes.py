"""Bytes and FLOP ratios of the kernels a training step runs, counted from the frameworks'
code (each with its source): what step.compute's roofline prices at the HBM and GEMM rates."""

ACT = 2  # bytes of a bf16 activation element
# HBM bytes a parameter of adding a micro-batch's 16-bit weight gradient into the accumulated
# one (Strategy.grad_accumulation): "autograd", `.grad += new` in place, both 16-bit, read
# two and write one (torch/csrc/autograd/functions/accumulate_grad.h); "fp32", into an fp32
# buffer: read the 16-bit gradient, read and write the fp32 sum (Megatron's
# `param.main_grad.add_(param.grad.data)`, megatron/model/distributed.py; DeepSpeed's
# `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))`, runtime/bf16_optimizer.py)
GRAD_ADD = 3 * ACT
FP32_GRAD_ADD = ACT + 2 * 4
# bytes an element of a weight-gradient GEMM's output moves when the GEMM accumulates into the
# fp32 main gradient itself ("fused": Megatron's gradient_accumulation_fusion,
# fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32, and Transformer Engine's
# fuse_wgrad_accumulation run cuBLAS with main_grad as C and D, beta 1): read and write 4
FUSED_WGRAD = 2 * 4
# bytes of a dropout mask element: PyTorch's CUDA dropout keeps a bool mask for the backward
# (aten/src/ATen/native/cuda/Dropout.cu, dropout_cuda: mask of kBool), as Korthikanti et al.
# 2022 count it (sbh bytes per dropout)
MASK = 1
# bytes to cast a bf16 GEMM input to fp8 for training: Transformer Engine's cast_transpose
# reads the bf16 element (2) and writes the fp8 copy and its transpose (1 + 1), the transpose
# being the wgrad GEMM's operand on Hopper (common/transpose/rtc/cast_transpose.cu at
# 192ce32: output_c and output_t); Blackwell's MXFP8 writes rowwise and columnwise copies alike
FP8_CAST = 2 + 1 + 1
# HBM bytes a logit of Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/
# cross_entropy.py at d98e8a64d, 2026-08, as megatron/mpu/cross_entropy.py in 2021; the
# default, cross_entropy_loss_fusion off), each pass over the b s x v / tp logits: forward,
# the 16-bit logits cast to fp32 (read 2, write 4), max (read 4), subtract it in place (4 + 4),
# exp in place (4 + 4), sum (4), divide in place to keep the softmax (4 + 4): 38; backward,
# multiply by the loss gradient in place (4 + 4), the cast's gradient to 16 bits (4 + 2): 14
CROSS_ENTROPY_FORWARD = 2 + 4 + 4 + 8 + 8 + 4 + 8
CROSS_ENTROPY_BACKWARD = 8 + 4 + 2
# Element-wise kernels' HBM traffic in elements of a row they touch (x ACT bytes), forward and
# backward, from the kernels' code:
# - norm (LayerNorm or RMSNorm): forward reads x, writes y; backward, a kernel for dx (reads dy
#   and x, writes dx) and one for the weight's partial sums that reads dy and x again (Apex
#   csrc/layer_norm_cuda_kernel.cu at 4b0ee25, cuComputeGradInput + cuComputePartGradGammaBeta:
#   the Megatron 2021-22 rows; PyTorch 2.x aten/src/ATen/native/cuda/layer_norm_kernel.cu has
#   the same two passes: torchtitan's and MosaicML's rows). Transformer Engine's
#   ln_bwd_tuned_kernel (common/normalization/layernorm/ln_bwd_kernels.cuh at 40a3423) loads
#   dy and x once, stores dx and per-CTA partials (NORM_ONE_PASS_BACKWARD):
#   Strategy.norm_backward picks which
# - residual add: forward reads both inputs, writes the sum; backward, autograd sums the two
#   gradients of the stream where it forks into the branch (read 2, write 1); with dropout
#   (Megatron's bias_dropout_add) the branch's gradient is dy x mask x scale: read dy and the
#   mask (MASK bytes), write (DROPOUT_BACKWARD)
# - GeLU (Megatron's bias_gelu, megatron/model/fused_bias_gelu.py at 6fd0b40 bias_gelu_back):
#   forward reads and writes f; backward reads dy and the input, writes dx
# - SwiGLU (megatron/core/fusions/fused_bias_swiglu.py at b1030e9 swiglu_back; TE's dswiglu):
#   forward reads gate and up, writes f; backward reads dy, gate and up, writes dgate and dup
# - rotary embedding of Q and K (TE / Apex fused RoPE, backward the same rotation of the
#   gradient): read and write each, both ways
ELEMENTWISE = {
    "norm": (2, 5),
    "residual": (3, 3),
    "gelu": (2, 3),
    "swiglu": (3, 5),
    "rotary": (2, 2),
}
NORM_ONE_PASS_BACKWARD = 3
DROPOUT_BACKWARD = 2 * ACT + MASK  # bytes an element: read dy and the mask, write dx
ATTENTION_BACKWARD = 2.5  # FlashAttention's backward / forward FLOPs (5 matmuls to 2)
CAUSAL = 0.5  # the share of the s x s square causal FlashAttention computes
# MoE (Megatron-core's all-to-all token dispatcher, transformer/moe/token_dispatcher.py): the
# router's fp32 scores per token and expert through HBM: softmax read and write (4 + 4), top-k
# read (4), the dense probabilities and routing map written (4 + 1), the load-balancing loss
# reads the probabilities (4)
ROUTER_BYTES = 21
# a token permutation (moe_utils.permute / unpermute, sort_chunks_by_idxs; fused or not, a
# gather or scatter): each routed copy's h values read once and written once
PERMUTE_PASS = 2
# Transformer Engine's GroupedLinear runs the experts' GEMMs round-robin on this many CUDA
# streams (transformer_engine/common/util/multi_stream.cpp, num_compute_streams), so that
# many expert GEMMs share the SMs' waves
GROUPED_GEMM_STREAMS = 4
EAGER_SCORE_BYTES = 10  # per score element, forward, without FlashAttention: write scores
# (2), softmax read + write (4), dropout mask and output (1 + 2), AV reads the probabilities
# (1 more than the fused path keeps): Korthikanti et al. 2022's 5 a s^2 b of stored scores
