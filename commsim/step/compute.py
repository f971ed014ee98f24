"""Compute time per micro-batch: a roofline per kernel class, vectorised over layouts.

A transformer block runs its linear layers as GEMMs, its attention core as FlashAttention
(or as batched GEMMs and a softmax without it), and element-wise work (norms, residual
adds, the MLP's activation, rotary embeddings, MoE's token permutation) that is bound by
HBM bandwidth. Each kernel class has its own rate:

- GEMM: 2 M N K FLOPs at the GPU's best measured GEMM rate (catalog: MAMF / peak) times
  the fraction of the GPU its output tiles keep busy. cuBLAS tiles the output in 256 x 128
  blocks, one block per SM at a time (NVIDIA, "Matrix Multiplication Background User's
  Guide", DU-09799-001, sec. 3): a dimension that is not a multiple of its tile wastes the
  rest of the tile (tile quantization), and ceil(tiles / SMs) waves run where tiles / SMs
  would do (wave quantization). Small GEMMs (tensor-parallel slices, a MoE expert's ~1,000
  tokens) lose most there. FP8 (Transformer Engine) runs the blocks' linear layers at the
  FP8 peak and rate, and pays a cast of each GEMM input forward and of each output's
  gradient backward (FP8_CAST).
- Attention core: the QK^T and AV FLOPs FlashAttention executes (causal: half of the s x s
  square; the model's FLOP count, Megatron's, keeps the whole square) at the GPU's
  FlashAttention rate; backward 2.5x forward (it recomputes the scores: 5 matmuls to 2,
  Dao 2023). Without FlashAttention: the full square as GEMMs, and the softmax, its mask
  and dropout over b x heads x s^2 elements through HBM.
- Element-wise: bytes through HBM at what streaming kernels reach of its datasheet
  bandwidth (catalog: hbm_efficiency), forward and backward counted kernel by kernel
  (ELEMENTWISE).

A model without blocks (a CNN, custom layers) runs its FLOPs at the GEMM rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.specs import GPUSpec
from commsim.step.activations import RECOMPUTE
from commsim.step.eager import Prices, fsdp2_copy_out, stack_prices
from commsim.step.shape import Shape
from commsim.workload.model import BACKWARD_FACTOR, Workload

TILE_M, TILE_N = 256, 128  # cuBLAS's large output tile (NVIDIA GEMM guide, sec. 3.2)
ACT = 2  # bytes of a bf16 activation element
# HBM bytes a parameter of adding a micro-batch's 16-bit weight gradient into the accumulated
# one (Strategy.grad_accumulation): "autograd", `.grad += new` in place, both 16-bit, read
# two and write one (torch/csrc/autograd/functions/accumulate_grad.h); "fp32", into an fp32
# buffer: read the 16-bit gradient, read and write the fp32 sum (Megatron's
# `param.main_grad.add_(param.grad.data)`, megatron/model/distributed.py; DeepSpeed's
# `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))`, runtime/bf16_optimizer.py)
GRAD_ADD = 3 * ACT
FP32_GRAD_ADD = ACT + 2 * 4
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


@dataclass(frozen=True)
class Rates:
    """A GPU's kernel rates (FLOP/s, bytes/s) for the roofline."""

    gemm: float  # BF16 GEMM FLOP/s at its best shapes
    fp8: float  # FP8 GEMM FLOP/s at its best shapes (0: no FP8)
    attention: float  # FlashAttention FLOP/s
    memory: float  # HBM bytes/s that streaming kernels reach
    sms: int

    @classmethod
    def of(cls, gpu: GPUSpec) -> Rates:
        """The rates of a catalog GPU; a ValueError naming what the catalog lacks."""
        missing = [
            f
            for f in ("sm_count", "gemm_efficiency", "attention_efficiency")
            if getattr(gpu, f) is None
        ]
        if missing:
            raise ValueError(
                f"GPU {gpu.name!r} has no measured {', '.join(missing)} for the compute "
                "roofline: set the scenario's compute_efficiency instead"
            )
        fp8 = (gpu.fp8_flops or 0.0) * (gpu.fp8_gemm_efficiency or 0.0)
        return cls(
            gemm=gpu.peak_flops * gpu.gemm_efficiency,
            fp8=fp8,
            attention=gpu.peak_flops * gpu.attention_efficiency,
            memory=gpu.stream_bandwidth,
            sms=int(gpu.sm_count),
        )


def tile_utilisation(m, n, sms: int, concurrent=1.0) -> np.ndarray:
    """The share of the GPU a GEMM with an m x n output keeps doing useful work: its tiles'
    useful area over their area, times tiles over the SMs that whole waves occupy; with
    `concurrent` such GEMMs on the GPU at once (streams), their tiles fill the waves together."""
    m, n = np.maximum(np.asarray(m, dtype=float), 1.0), np.maximum(np.asarray(n, dtype=float), 1)
    tm, tn = np.ceil(m / TILE_M), np.ceil(n / TILE_N)
    tiles = tm * tn * concurrent
    waves = np.ceil(tiles / sms)
    return (m * n) / (tm * tn * TILE_M * TILE_N) * tiles / (waves * sms)


def gemm_seconds(m, n, k, rate, sms: int, count=1.0, concurrent=1.0) -> np.ndarray:
    """Seconds of `count` GEMMs of (m x k) by (k x n) at `rate` (FLOP/s at the best shapes),
    `concurrent` of them sharing the GPU at a time (tile_utilisation)."""
    flops = 2.0 * np.asarray(m, float) * np.asarray(n, float) * np.asarray(k, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = count * flops / (rate * tile_utilisation(m, n, sms, concurrent))
    return np.where(flops > 0, out, 0.0)


@dataclass(frozen=True)
class StageTimes:
    """Per micro-batch seconds on one GPU: a block's forward and backward, the attention
    core's forward (what selective recomputation replays), what op-level checkpointing
    replays (the unsaved matmuls and the element-wise work), the layers before the blocks
    (embedding) and after them (final norm, head, loss), forward and backward."""

    block_fwd: np.ndarray
    block_bwd: np.ndarray
    core_fwd: np.ndarray
    op_replay: np.ndarray  # what op-level checkpointing recomputes of a block's forward
    pre_fwd: np.ndarray
    pre_bwd: np.ndarray
    post_fwd: np.ndarray
    post_bwd: np.ndarray


def stage_times(workload: Workload, gpu: GPUSpec, L) -> StageTimes:
    """The roofline times of every layout's block and end layers (step.layouts.Layouts)."""
    rates = Rates.of(gpu)
    arch = workload.arch
    b, tp = L.micro_batch.astype(float), L.tp.astype(float)
    cp, fp8, flash = L.cp.astype(float), L.fp8, L.flash
    adds = _grad_adds(workload, L, rates)
    # FSDP2's copy of each gathered unit out of the all-gather buffer, on the compute stream,
    # once before the forward and once before the backward (step.eager.fsdp2_copy_out)
    copies = _per_param(workload, L, fsdp2_copy_out(L.kernels, L.zero) / rates.memory)
    if arch is None:  # no blocks: every FLOP at the GEMM rate, as one "pre" layer
        fwd = workload.forward_flops * b / (tp * rates.gemm)
        zero = np.zeros(len(L))
        pre_bwd = BACKWARD_FACTOR * fwd + adds.model + copies.model
        fwd = fwd + copies.model
        return StageTimes(zero, zero, zero, zero, fwd, pre_bwd, zero, zero)
    tokens = b * workload.seq_len / cp  # a GEMM's rows: the whole sequence (SP gathers it)
    ep, etp = L.ep.astype(float), L.expert_tp.astype(float)
    split = np.where(L.sequence_parallel, tp, 1.0)  # ranks sharing the element-wise work
    # a norm's backward, in values a row: two passes or Transformer Engine's one
    norm_b = np.where(L.norm_backward == 1, NORM_ONE_PASS_BACKWARD, ELEMENTWISE["norm"][1])
    prices = _prices(arch, L, norm_b)  # the stack's kernels (Strategy.kernels), bytes
    block = _Block(arch, rates, tokens, tp, ep, etp, fp8, flash, workload, split, prices)
    fwd, bwd, core = block.times(b, cp)
    pre_fwd, pre_bwd, post_fwd, post_bwd = _ends(arch, rates, tokens, tp, split, prices)
    bwd, pre_bwd, post_bwd = bwd + adds.block, pre_bwd + adds.pre, post_bwd + adds.post
    fwd, pre_fwd, post_fwd = fwd + copies.block, pre_fwd + copies.pre, post_fwd + copies.post
    # a full recompute replays the forward, its copy the backward's (step.model.compute)
    again = L.recompute != RECOMPUTE.index("full")
    bwd = bwd + again * copies.block
    pre_bwd, post_bwd = pre_bwd + again * copies.pre, post_bwd + again * copies.post
    return StageTimes(fwd, bwd, core, block.op_replay(), pre_fwd, pre_bwd, post_fwd, post_bwd)


def _prices(arch, L, norm_b) -> Prices:
    """Bytes an element of the element-wise kernels of each layout's stack: Megatron's
    (ELEMENTWISE, x ACT; the norm's backward `norm_b` values a row, the loss
    CROSS_ENTROPY_*) or a PyTorch stack's (step.eager)."""
    act = ELEMENTWISE["swiglu" if arch.gated_mlp else "gelu"]
    fused = {
        "norm": (ELEMENTWISE["norm"][0] * ACT, norm_b * ACT),
        "act": (act[0] * ACT, act[1] * ACT),
        "rotary": tuple(n * ACT for n in ELEMENTWISE["rotary"]),
        "loss": (CROSS_ENTROPY_FORWARD, CROSS_ENTROPY_BACKWARD),
    }
    return stack_prices(L.kernels, fused, arch)


@dataclass(frozen=True)
class _GradAdds:
    """Seconds per micro-batch of adding its weight gradients into the accumulated ones
    (none where the wgrad GEMMs accumulate, Strategy.grad_accumulation): of a block, of the
    layers before and after the blocks, and of a model without blocks."""

    block: np.ndarray
    pre: np.ndarray
    post: np.ndarray
    model: np.ndarray


def _grad_adds(workload: Workload, L, rates: Rates) -> _GradAdds:
    """Autograd adds each micro-batch's gradients but the first of a step's (which it keeps
    as they are) into .grad: (m - 1) / m of the micro-batches, GRAD_ADD bytes; an fp32
    buffer takes every micro-batch's, FP32_GRAD_ADD bytes (_per_param)."""
    m = np.maximum(L.micro_batches.astype(float), 1.0)
    per_param = np.select(
        [L.grad_accumulation == 1, L.grad_accumulation == 2],
        [(m - 1) / m * GRAD_ADD, FP32_GRAD_ADD],
    )  # codes of GRAD_ACCUMULATIONS: fused, autograd, fp32
    return _per_param(workload, L, per_param / rates.memory)


def _per_param(workload: Workload, L, share) -> _GradAdds:
    """Seconds of `share` seconds a parameter the GPU holds (a block's dense parameters over
    tp, its experts over ep x etp, the embedding and head over tp: their replicated norms and
    biases are < 0.1%), split as _GradAdds."""
    sh = Shape.of(workload)
    tp = L.tp.astype(float)
    expert = sh.expert_params / max(sh.blocks, 1)
    block = (sh.block_params - expert) / tp + expert / (L.ep * L.expert_tp)
    model = sh.total_params / tp
    return _GradAdds(
        share * block, share * sh.pre_params / tp, share * sh.post_params / tp, share * model
    )


@dataclass
class _Block:
    """One block's kernels on one GPU, for many layouts (the mean over dense and MoE blocks)."""

    arch: object
    rates: Rates
    tokens: np.ndarray
    tp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray  # expert tensor-parallel degree
    fp8: np.ndarray
    flash: np.ndarray
    workload: Workload
    split: np.ndarray  # tp ranks the norms and residual adds split over: tp with SP, else 1
    prices: Prices  # bytes an element of the stack's element-wise kernels (_prices)

    def times(self, b, cp):
        """(forward, backward, attention core forward) seconds of the mean block."""
        c = self.arch
        moe_share = (c.layers - c.dense_layers) / c.layers if c.experts > 1 else 0.0
        attn, dense = self._attention_gemms(), self._mlp_gemms(c.ffn_hidden, 1.0, 1.0)
        (attn_f, attn_cast), (dense_f, dense_cast) = self._gemms(attn), self._gemms(dense)
        moe_f, moe_cast, moe_bytes, moved = self._moe() if moe_share else (0.0,) * 4
        mlp_f = (1 - moe_share) * dense_f + moe_share * moe_f
        cast = attn_cast + (1 - moe_share) * dense_cast + moe_share * moe_cast
        grad_cast = self._grad_casts(attn) + (1 - moe_share) * self._grad_casts(dense)
        grad_cast = grad_cast + moe_share * BACKWARD_FACTOR * moe_cast  # the experts': 2x
        core_f, core_bytes = self._core(b, cp)
        ew_f, ew_b = self._elementwise(1 - moe_share)
        gemm_f, mem = attn_f + mlp_f, self.rates.memory
        # a permutation's backward is the inverse gather / scatter: the same bytes once
        permute = moe_share * moved / mem
        fwd = gemm_f + core_f + (ew_f + moe_share * moe_bytes + core_bytes + cast) / mem + permute
        bwd = BACKWARD_FACTOR * (gemm_f + (moe_share * moe_bytes + core_bytes) / mem)
        bwd = bwd + (ew_b + grad_cast) / mem + ATTENTION_BACKWARD * core_f + permute
        return fwd, bwd, core_f

    def op_replay(self) -> np.ndarray:
        """Seconds op-level checkpointing (memory._op_widths) recomputes of a dense block's
        forward: the matmuls in even places (k, o, and up or down) with the FP8 casts of their
        inputs, and all the element-wise work; the attention kernel's output is kept."""
        c, t, tp = self.arch, self.tokens, self.tp
        mlp = (t, c.ffn_hidden / tp, c.hidden, 1.0) if c.gated_mlp else None
        mlp = mlp or (t, c.hidden, c.ffn_hidden / tp, 1.0)
        k = (t, c.kv_heads * c.head_width / tp, c.hidden, 1.0)
        o = (t, c.hidden, c.heads * c.head_width / tp, 1.0)
        seconds, cast = self._gemms([k, o, mlp])
        return seconds + (self._elementwise(1.0)[0] + cast) / self.rates.memory

    def _rate(self) -> np.ndarray:
        return np.where(self.fp8, self.rates.fp8, self.rates.gemm)

    def _gemms(self, shapes, concurrent=1.0):
        """(seconds, FP8 cast bytes) of (m, n, k, count) GEMMs in the layouts' precision,
        `concurrent` at a time (gemm_seconds)."""
        seconds, cast = 0.0, 0.0
        for m, n, k, count in shapes:
            rate, sms = self._rate(), self.rates.sms
            seconds = seconds + gemm_seconds(m, n, k, rate, sms, count, concurrent)
            cast = cast + np.where(self.fp8, FP8_CAST * m * k * count, 0.0)
        return seconds, cast

    def _grad_casts(self, shapes):
        """FP8 cast bytes of the backward of (m, n, k, count) GEMMs: each output's gradient
        (m x n) cast with its transpose (FP8_CAST), the dgrad and wgrad GEMMs' operands; the
        forward's casts of the inputs are kept for the backward."""
        return sum(np.where(self.fp8, FP8_CAST * m * n * count, 0.0) for m, n, _, count in shapes)

    def _attention_gemms(self):
        """Attention's projections: fused QKV and the output (or MLA's latents)."""
        c, t, tp = self.arch, self.tokens, self.tp
        h, hd = c.hidden, c.head_width
        if c.mla:
            qk, vd = hd + c.rope_head_dim, c.v_head_dim or hd
            q = (
                [(t, c.q_lora_rank, h, 1.0), (t, c.heads * qk / tp, c.q_lora_rank, 1.0)]
                if c.q_lora_rank
                else [(t, c.heads * qk / tp, h, 1.0)]
            )
            kv = [(t, c.kv_lora_rank + c.rope_head_dim, h, 1.0)]
            kv += [(t, c.heads * (hd + vd) / tp, c.kv_lora_rank, 1.0)]
            return q + kv + [(t, h, c.heads * vd / tp, 1.0)]
        qw, kvw = c.heads * hd, c.kv_heads * hd
        return [(t, (qw + 2 * kvw) / tp, h, 1.0), (t, h, qw / tp, 1.0)]

    def _mlp_gemms(self, width, rows_scale, count, split=None):
        """An MLP of `width` split over tp (or `split` ranks): up (and gate, fused), down."""
        c, t = self.arch, self.tokens * rows_scale
        split = self.tp if split is None else split
        up = (2 if c.gated_mlp else 1) * width / split
        return [(t, up, c.hidden, count), (t, c.hidden, width / split, count)]

    def _moe(self):
        """(seconds, cast bytes, element-wise HBM bytes, permuted HBM bytes) of an MoE MLP
        on one GPU, as Megatron-core's all-to-all dispatcher runs it. Sequence parallelism
        leaves the GPU t / tp tokens: the router scores them (a BF16 GEMM of E columns, the
        router being no Transformer Engine layer, then ROUTER_BYTES per token and expert)
        and permutes their top_k x capacity copies (PERMUTE_PASS); the all-to-all over ep and
        the all-gather over etp give each of the E / ep local experts etp x ep / (tp E) x
        t x top_k x capacity rows (balanced routing) of width / etp, which are sorted by
        expert when the GPU holds several (sort_chunks_by_idxs); the experts run as
        grouped GEMMs, GROUPED_GEMM_STREAMS at a time; the combine undoes both
        permutations. Shared experts run as a dense MLP split over tp."""
        c, t = self.arch, self.tokens
        width = c.moe_ffn_hidden or c.ffn_hidden
        routed, local = c.top_k * c.capacity_factor, c.experts / self.ep
        rows = self.etp * self.ep * routed / (self.tp * c.experts)  # per local expert, per token
        router = gemm_seconds(t / self.tp, c.experts, c.hidden, self.rates.gemm, self.rates.sms)
        shared = self._mlp_gemms(width * c.shared_experts, 1.0, 1.0) if c.shared_experts else []
        shared_f, shared_cast = self._gemms(shared)
        experts = self._mlp_gemms(width, rows, local, self.etp)
        expert_f, expert_cast = self._gemms(experts, np.minimum(local, GROUPED_GEMM_STREAMS))
        copies = t / self.tp * routed  # routed copies of the GPU's tokens
        act = (3 if c.gated_mlp else 2) * width * ACT  # the activation of a row of width
        act = copies * act + t * act * c.shared_experts / self.tp  # routed (all etp), shared
        scores = t / self.tp * c.experts * ROUTER_BYTES
        sorted_rows = np.where(local > 1, self.etp * copies, 0.0)
        moved = 2 * PERMUTE_PASS * (copies + sorted_rows) * c.hidden * ACT
        seconds = router + shared_f + expert_f
        return seconds, shared_cast + expert_cast, act + scores, moved

    def _core(self, b, cp):
        """(seconds, HBM bytes) of the attention core's forward."""
        c = self.arch
        flops = self.workload.attention_flops * b / (self.tp * cp)  # the whole s x s square
        flash = CAUSAL * flops / self.rates.attention
        eager = flops / self.rates.gemm
        squares = b * c.heads / self.tp * self.workload.seq_len**2 / cp  # score elements
        score_bytes = np.where(self.flash, 0.0, EAGER_SCORE_BYTES * squares)
        return np.where(self.flash, flash, eager), score_bytes

    def _elementwise(self, dense_share: float):
        """HBM bytes of a block's element-wise (forward, backward), ELEMENTWISE kernel by
        kernel: two norms and two residual adds on the tokens this GPU holds (sequence
        parallelism splits them over tp; without it every tp rank runs them on the whole
        sequence, Korthikanti et al. 2022 sec. 4.2.2), with dropout (the model's) the mask
        each residual add's fused bias-dropout writes (Megatron's bias_dropout_add, a mask of
        h per token, twice) and reads back; rotary embeddings of Q and K and, in a dense
        block (`dense_share` of them), the MLP's activation on its slice of the whole
        sequence."""
        c, t, tp, p = self.arch, self.tokens, self.tp, self.prices
        residual = ELEMENTWISE["residual"]
        rotary = 0 if c.style.learned_positions else (c.heads + c.kv_heads) * c.head_width
        dropout = 2 * c.hidden if c.has_dropout else 0  # elements a token, both residuals
        out = []
        for way in (0, 1):
            held = 2 * (p.norm[way] + residual[way] * ACT) * c.hidden
            held += dropout * (MASK if way == 0 else DROPOUT_BACKWARD)
            sliced = dense_share * p.act[way] * c.ffn_hidden + p.rotary[way] * rotary
            out.append(t / self.split * held + t * (sliced + p.repeat[way]) / tp)
        return out[0], out[1]


def _ends(arch, rates: Rates, tokens, tp, split, prices: Prices):
    """Forward and backward seconds of the layers before the blocks (the embedding: gather
    b s rows of h) and after them (the final norm; the LM head's GEMM in BF16; the loss over
    the vocabulary slice), the norm and the loss at the stack's `prices` (Megatron's:
    ELEMENTWISE, CROSS_ENTROPY_* bytes a logit); the embedding's output and the norm on the
    tokens a tp rank holds (`split`: tp with sequence parallelism, else 1)."""
    h, v = arch.hidden, arch.vocab
    embed = 2 * tokens / split * h * ACT / rates.memory
    head = gemm_seconds(tokens, v / tp, h, rates.gemm, rates.sms)
    logits = tokens * v / tp / rates.memory
    norm_f, norm_b = (n * tokens / split * h / rates.memory for n in prices.norm)
    post_fwd = norm_f + head + prices.loss[0] * logits
    post_bwd = norm_b + BACKWARD_FACTOR * head + prices.loss[1] * logits
    return embed, embed, post_fwd, post_bwd
