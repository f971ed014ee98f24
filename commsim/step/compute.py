"""Compute time per micro-batch: a roofline per kernel class, vectorised over layouts.

A transformer block runs its linear layers as GEMMs, its attention core as FlashAttention
(or as batched GEMMs and a softmax without it), and element-wise work (norms, residual
adds, the MLP's activation, rotary embeddings, MoE's token permutation) that is bound by
HBM bandwidth. Each kernel class has its own rate:

- GEMM: step.gemm, the output tiles over the SMs at the best measured GEMM rate. Small
  GEMMs (tensor-parallel slices, a MoE expert's ~1,000 tokens) lose most there. FP8
  (Transformer Engine) runs the blocks' linear layers at the FP8 peak and rate, and pays a
  cast of each GEMM input forward and of each output's gradient backward (FP8_CAST).
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

from dataclasses import dataclass, fields, replace
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from commsim.specs import GPUSpec
from commsim.step.activations import RECOMPUTE, RECOMPUTE_MODULES
from commsim.step.block_gemms import (
    attention_gemms,
    grad_gemms,
    mla_up_gemms,
    mlp_gemms,
    wgrad_bytes,
)
from commsim.step.distinct import distinct_rows
from commsim.step.eager import Prices, fsdp2_copy_out, stack_prices
from commsim.step.gemm import Rates, gemm_seconds
from commsim.step.kernel_bytes import (
    ACT,
    ATTENTION_BACKWARD,
    CAUSAL,
    CROSS_ENTROPY_BACKWARD,
    CROSS_ENTROPY_FORWARD,
    DROPOUT_BACKWARD,
    EAGER_SCORE_BYTES,
    ELEMENTWISE,
    FP8_CAST,
    FP32_GRAD_ADD,
    GRAD_ADD,
    GROUPED_GEMM_STREAMS,
    MASK,
    NORM_ONE_PASS_BACKWARD,
    PERMUTE_PASS,
    ROUTER_BYTES,
)
from commsim.step.shape import Shape
from commsim.workload.model import BACKWARD_FACTOR, Workload


@dataclass(frozen=True)
class StageTimes:
    """Per micro-batch seconds on one GPU: a block's forward and backward, the attention
    core's forward (what selective recomputation replays), what op-level checkpointing
    replays (the unsaved matmuls and the element-wise work), the layers before the blocks
    (embedding) and after them (final norm, head, loss), forward and backward; what the
    recompute_modules replay of a block's forward (module_replay) and, of each backward, the
    weight-gradient part (*_wgrad: DualPipe's W, step.model)."""

    block_fwd: np.ndarray
    block_bwd: np.ndarray
    core_fwd: np.ndarray
    op_replay: np.ndarray  # what op-level checkpointing recomputes of a block's forward
    pre_fwd: np.ndarray
    pre_bwd: np.ndarray
    post_fwd: np.ndarray
    post_bwd: np.ndarray
    module_replay: np.ndarray
    block_wgrad: np.ndarray
    pre_wgrad: np.ndarray
    post_wgrad: np.ndarray


# The Layouts columns _stage_times reads: a planner's layouts take a few thousand distinct
# combinations of them (and of the rates beside a collective) among millions of rows
READS = (
    *("micro_batch", "micro_batches", "tp", "cp", "ep", "expert_tp", "fp8", "flash"),
    *("kernels", "zero", "reshard", "recompute", "recompute_parts", "sequence_parallel"),
    *("norm_backward", "grad_accumulation"),
)


def stage_times(workload: Workload, gpu: GPUSpec, L, rates: Rates | None = None) -> StageTimes:
    """The roofline times of every layout's block and end layers (step.layouts.Layouts), at
    the GPU's rates or at `rates` (per layout where they are arrays: step.contention): priced
    once per distinct row of the READS columns and the rates (step.distinct), the same
    numbers as row by row, as every operation is element-wise."""
    rates = rates or Rates.of(gpu)
    cols = {n: getattr(L, n) for n in READS}
    per_row = {f.name: getattr(rates, f.name) for f in fields(rates)}
    per_row = {k: v for k, v in per_row.items() if np.ndim(v)}
    groups = distinct_rows([*cols.values(), *per_row.values()], len(L))
    if groups is None:  # a hash collision: row by row
        return _stage_times(workload, L, rates)
    inverse, first = groups
    few = SimpleNamespace(**{n: c[first] for n, c in cols.items()})  # READS alone
    t = _stage_times(workload, few, replace(rates, **{k: v[first] for k, v in per_row.items()}))
    return StageTimes(
        *(np.broadcast_to(getattr(t, f.name), first.shape)[inverse] for f in fields(t))
    )


def _stage_times(workload: Workload, L, rates: Rates) -> StageTimes:
    """stage_times for every row of L (its READS columns)."""
    arch = workload.arch
    b, tp = L.micro_batch.astype(float), L.tp.astype(float)
    cp, fp8, flash = L.cp.astype(float), L.fp8, L.flash
    adds = _grad_adds(workload, L, rates)
    # FSDP2's copy of each gathered unit out of the all-gather buffer, on the compute stream,
    # once before the forward and once before the backward (step.eager.fsdp2_copy_out)
    copies = _per_param(workload, L, fsdp2_copy_out(L.kernels, L.zero) / rates.memory)
    if arch is None:  # no blocks: every FLOP at the GEMM rate, as one "pre" layer
        fwd = workload.forward_flops * b / (tp * rates.gemm)
        zero = np.zeros(b.shape)
        pre_bwd = BACKWARD_FACTOR * fwd + adds.model + copies.model
        wgrad = weight_gradient(fwd, adds.model)
        fwd = fwd + copies.model
        return StageTimes(zero, zero, zero, zero, fwd, pre_bwd, zero, zero, zero, zero, wgrad, zero)
    tokens = b * workload.seq_len / cp  # a GEMM's rows: the whole sequence (SP gathers it)
    ep, etp = L.ep.astype(float), L.expert_tp.astype(float)
    split = np.where(L.sequence_parallel, tp, 1.0)  # ranks sharing the element-wise work
    # a norm's backward, in values a row: two passes or Transformer Engine's one
    norm_b = np.where(L.norm_backward == 1, NORM_ONE_PASS_BACKWARD, ELEMENTWISE["norm"][1])
    prices = _prices(arch, L, norm_b)  # the stack's kernels (Strategy.kernels), bytes
    # seconds a weight-gradient GEMM moves an output element (block_gemms.wgrad_bytes)
    wgrad_write = wgrad_bytes(L.grad_accumulation) / rates.write
    block = _Block(
        arch, rates, tokens, tp, ep, etp, fp8, flash, workload, split, prices, wgrad_write
    )
    fwd, bwd, core, wgrad = block.times(b, cp)
    ends = _ends(arch, rates, tokens, tp, split, prices, wgrad_write)
    pre_fwd, pre_bwd, post_fwd, post_bwd, head_wgrad = ends
    bwd, pre_bwd, post_bwd = bwd + adds.block, pre_bwd + adds.pre, post_bwd + adds.post
    fwd, pre_fwd, post_fwd = fwd + copies.block, pre_fwd + copies.pre, post_fwd + copies.post
    # a full recompute replays the forward, its copy the backward's (step.model.compute);
    # units kept from the forward (reshard_after_forward false) are not gathered again
    again = (L.recompute != RECOMPUTE.index("full")) & (L.reshard != 1)
    bwd = bwd + again * copies.block
    pre_bwd, post_bwd = pre_bwd + again * copies.pre, post_bwd + again * copies.post
    replay = block.module_replay(L.recompute_parts)
    return StageTimes(
        *(fwd, bwd, core, block.op_replay(), pre_fwd, pre_bwd, post_fwd, post_bwd, replay),
        block_wgrad=weight_gradient(wgrad, adds.block),
        pre_wgrad=pre_bwd,  # the embedding's backward is its weight gradient alone
        post_wgrad=weight_gradient(head_wgrad, adds.post),
    )


def weight_gradient(wgrad, adds):
    """Seconds of a backward's weight-gradient part (zero-bubble's W, DualPipe's W): the
    weight-gradient GEMMs X^T dY (_Block.gemms) with the adds of the gradient into the
    accumulated one (_grad_adds); the attention core's, the element-wise and the casts'
    backward are data gradients."""
    return wgrad + adds


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


class Gemms(NamedTuple):
    """Seconds of a group of GEMMs (_Block.gemms): forward, data and weight gradients, and
    the HBM bytes of the FP8 casts of their forward inputs."""

    fwd: np.ndarray | float
    dgrad: np.ndarray | float
    wgrad: np.ndarray | float
    cast: np.ndarray | float

    @property
    def bwd(self):
        return self.dgrad + self.wgrad

    def add(self, other: Gemms) -> Gemms:
        return Gemms(*(a + b for a, b in zip(self, other, strict=True)))

    def mix(self, other: Gemms, share: float) -> Gemms:
        """(1 - share) of these and `share` of `other`: the mean of dense and MoE blocks."""
        return Gemms(*((1 - share) * a + share * b for a, b in zip(self, other, strict=True)))


_NO_GEMMS = Gemms(0.0, 0.0, 0.0, 0.0)


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
    wgrad_write: np.ndarray  # seconds a weight-gradient GEMM writes an output element

    @property
    def moe_share(self) -> float:
        """The share of blocks that are MoE (all but the dense first ones)."""
        c = self.arch
        return (c.layers - c.dense_layers) / c.layers if c.experts > 1 else 0.0

    def times(self, b, cp):
        """(forward, backward, attention core forward, weight-gradient GEMM) seconds of the
        mean block."""
        c, moe_share = self.arch, self.moe_share
        attn = attention_gemms(c, self.tokens, self.tp)
        dense = mlp_gemms(c, self.tokens, c.ffn_hidden, self.tp)
        a, d = self.gemms(attn), self.gemms(dense)
        moe, moe_bytes, moved = self._moe() if moe_share else (_NO_GEMMS, 0.0, 0.0)
        mlp = d.mix(moe, moe_share)
        cast = a.cast + mlp.cast
        grad_cast = self._grad_casts(attn) + (1 - moe_share) * self._grad_casts(dense)
        grad_cast = grad_cast + moe_share * BACKWARD_FACTOR * moe.cast  # the experts': 2x
        core_f, core_bytes = self._core(b, cp)
        ew_f, ew_b = self._elementwise(1 - moe_share)
        mem = self.rates.memory
        # a permutation's backward is the inverse gather / scatter: the same bytes once
        permute = moe_share * moved / mem
        fwd = a.fwd + mlp.fwd + core_f + permute
        fwd = fwd + (ew_f + moe_share * moe_bytes + core_bytes + cast) / mem
        bwd = a.bwd + mlp.bwd + BACKWARD_FACTOR * (moe_share * moe_bytes + core_bytes) / mem
        bwd = bwd + (ew_b + grad_cast) / mem + ATTENTION_BACKWARD * core_f + permute
        return fwd, bwd, core_f, a.wgrad + mlp.wgrad

    def module_replay(self, parts) -> np.ndarray:
        """Seconds a mean block's backward re-runs of the forward of the recompute_modules in
        `parts` (activations.recompute_code; Megatron-core's CheckpointWithoutOutput re-runs
        the module's forward function), kernel by kernel as `times` prices that forward:
        "layernorm" the two norms on the tokens this GPU holds (transformer_layer.py: input_
        and pre_mlp_layernorm) and, under FP8, each output's cast again (the activations
        model keeps both in the GEMM's format; Transformer Engine re-quantises the saved
        original input); "mla_up_proj" MLA's Q and KV up-projection GEMMs and the rotary
        embedding (multi_latent_attention.py, qkv_up_proj_and_rope_apply); "moe_act" the
        routed experts' activation on each routed copy (moe/experts.py) and, under FP8, the
        cast of its output, the down projection's input; "mlp" a dense block's MLP (its two
        GEMMs with their inputs' casts and its activation, as `times`), on the dense share
        of blocks; "shared_experts" an MoE block's shared experts, as `_moe` runs them;
        "core_attn" replays as selective recomputation (StageTimes.core_fwd)."""
        c, t, mem = self.arch, self.tokens, self.rates.memory
        bit = [(np.asarray(parts) >> i) & 1 for i in range(len(RECOMPUTE_MODULES))]
        cast = np.where(self.fp8, FP8_CAST, 0.0)  # bytes an element of a re-cast GEMM input
        norm = 2 * t / self.split * c.hidden * (self.prices.norm[0] + cast)
        up = 0.0
        if c.mla:
            g = self.gemms(mla_up_gemms(c, t, self.tp))
            rotary = self.prices.rotary[0] * self._rotary_width() * t / self.tp
            up = g.fwd + (g.cast + rotary) / mem
        act = 0.0
        if self.moe_share:
            width = c.moe_ffn_hidden or c.ffn_hidden
            copies = t / self.tp * c.top_k * c.capacity_factor  # as _moe counts them
            act = self.moe_share * copies * width * (self.prices.act[0] + cast)
        g = self.gemms(mlp_gemms(c, t, c.ffn_hidden, self.tp))
        dense_act = t / self.tp * c.ffn_hidden * self.prices.act[0]  # as _elementwise
        mlp = (1 - self.moe_share) * (g.fwd + (g.cast + dense_act) / mem)
        g, shared_act = self._shared_experts()
        shared = self.moe_share * (g.fwd + (g.cast + shared_act) / mem)
        out = bit[0] * norm / mem + bit[1] * up + bit[2] * act / mem + bit[4] * mlp
        return out + bit[5] * shared

    def op_replay(self) -> np.ndarray:
        """Seconds op-level checkpointing (memory._op_widths) recomputes of a dense block's
        forward: the matmuls in even places (k, o, and up or down) with the FP8 casts of their
        inputs, and all the element-wise work; the attention kernel's output is kept."""
        c, t, tp = self.arch, self.tokens, self.tp
        mlp = (t, c.ffn_hidden / tp, c.hidden, 1.0) if c.gated_mlp else None
        mlp = mlp or (t, c.hidden, c.ffn_hidden / tp, 1.0)
        k = (t, c.kv_heads * c.head_width / tp, c.hidden, 1.0)
        o = (t, c.hidden, c.heads * c.head_width / tp, 1.0)
        g = self.gemms([k, o, mlp])
        return g.fwd + (self._elementwise(1.0)[0] + g.cast) / self.rates.memory

    def _rate(self) -> np.ndarray:
        return np.where(self.fp8, self.rates.fp8, self.rates.gemm)

    def gemms(self, shapes, concurrent=1.0, rate=None) -> Gemms:
        """Seconds of (m, n, k, count) GEMMs, `concurrent` at a time (gemm_seconds), in the
        layouts' precision (or at `rate`, no FP8 casts): the forward X W (m x n out); its
        backward, the data gradient dY W^T (m x k out, over n) and the weight gradient
        X^T dY (k x n out, over the m tokens; wgrad_write an element)."""
        sms, act, casts = self.rates.sms, ACT / self.rates.write, rate is None
        rate = self._rate() if casts else rate
        out = [0.0] * 4
        for (m, n, k, count), d, w in zip(shapes, *grad_gemms(shapes), strict=True):
            out[0] = out[0] + gemm_seconds(m, n, k, rate, sms, count, concurrent, write=act)
            out[1] = out[1] + gemm_seconds(*d[:3], rate, sms, count, concurrent, write=act)
            wgrad = gemm_seconds(*w[:3], rate, sms, count, concurrent, write=self.wgrad_write)
            out[2] = out[2] + wgrad
            out[3] = out[3] + np.where(self.fp8 & casts, FP8_CAST * m * k * count, 0.0)
        return Gemms(*out)

    def _grad_casts(self, shapes):
        """FP8 cast bytes of the backward of (m, n, k, count) GEMMs: each output's gradient
        (m x n) cast with its transpose (FP8_CAST), the dgrad and wgrad GEMMs' operands; the
        forward's casts of the inputs are kept for the backward."""
        return sum(np.where(self.fp8, FP8_CAST * m * n * count, 0.0) for m, n, _, count in shapes)

    def _rotary_width(self) -> int:
        """Values a token's rotary embedding rotates: Q's and K's heads (0: learned
        positions)."""
        c = self.arch
        return 0 if c.style.learned_positions else (c.heads + c.kv_heads) * c.head_width

    def _moe(self):
        """(Gemms, element-wise HBM bytes, permuted HBM bytes of the forward) of an MoE MLP
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
        router = self.gemms([(t / self.tp, c.experts, c.hidden, 1.0)], rate=self.rates.gemm)
        shared, shared_act = self._shared_experts()
        experts = mlp_gemms(c, t * rows, width, self.etp, local)
        experts = self.gemms(experts, np.minimum(local, GROUPED_GEMM_STREAMS))
        copies = t / self.tp * routed  # routed copies of the GPU's tokens
        act = (3 if c.gated_mlp else 2) * width * ACT  # the activation of a row of width
        act = copies * act + shared_act  # routed (all etp), shared
        scores = t / self.tp * c.experts * ROUTER_BYTES
        sorted_rows = np.where(local > 1, self.etp * copies, 0.0)
        moved = 2 * PERMUTE_PASS * (copies + sorted_rows) * c.hidden * ACT
        return router.add(shared).add(experts), act + scores, moved

    def _shared_experts(self):
        """(Gemms, activation HBM bytes of the forward) of an MoE layer's shared experts: a
        dense MLP of shared_experts x the expert width over tp, on every token."""
        c = self.arch
        width = (c.moe_ffn_hidden or c.ffn_hidden) * c.shared_experts
        gemms = self.gemms(mlp_gemms(c, self.tokens, width, self.tp) if width else [])
        act = (3 if c.gated_mlp else 2) * width * ACT * self.tokens / self.tp
        return gemms, act

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
        rotary = self._rotary_width()
        dropout = 2 * c.hidden if c.has_dropout else 0  # elements a token, both residuals
        out = []
        for way in (0, 1):
            held = 2 * (p.norm[way] + residual[way] * ACT) * c.hidden
            held += dropout * (MASK if way == 0 else DROPOUT_BACKWARD)
            sliced = dense_share * p.act[way] * c.ffn_hidden + p.rotary[way] * rotary
            out.append(t / self.split * held + t * (sliced + p.repeat[way]) / tp)
        return out[0], out[1]


def _ends(arch, rates: Rates, tokens, tp, split, prices: Prices, wgrad_write):
    """Forward and backward seconds of the layers before the blocks (the embedding: gather
    b s rows of h) and after them (the final norm; the LM head's GEMMs in BF16, as
    _Block.gemms prices them; the loss over the vocabulary slice), the norm and the loss at
    the stack's `prices` (Megatron's: ELEMENTWISE, CROSS_ENTROPY_* bytes a logit), and the
    head's weight-gradient GEMM seconds; the embedding's output and the norm on the tokens a
    tp rank holds (`split`: tp with sequence parallelism, else 1)."""
    h, v, mem, sms = arch.hidden, arch.vocab, rates.memory, rates.sms
    embed = 2 * tokens / split * h * ACT / mem
    fwd = (tokens, v / tp, h, 1.0)
    (dgrad,), (wgrad,) = grad_gemms([fwd])
    head = gemm_seconds(*fwd[:3], rates.gemm, sms, write=ACT / rates.write)
    dgrad = gemm_seconds(*dgrad[:3], rates.gemm, sms, write=ACT / rates.write)
    wgrad = gemm_seconds(*wgrad[:3], rates.gemm, sms, write=wgrad_write)
    logits = tokens * v / tp / mem
    norm_f, norm_b = (n * tokens / split * h / mem for n in prices.norm)
    post_fwd = norm_f + head + prices.loss[0] * logits
    post_bwd = norm_b + dgrad + wgrad + prices.loss[1] * logits
    return embed, embed, post_fwd, post_bwd, wgrad
