"""What one transformer layer keeps for its backward: activation bytes per token by the
layer's widths (Korthikanti et al. 2022, arXiv:2205.05198, Table 2, generalised), under tensor
and sequence parallelism, FlashAttention and each recomputation mode; step.memory multiplies
it by layers and micro-batches in flight."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# recompute codes 0-3 of the batch variant: Megatron's selective (the attention core) and
# full, and torchtitan's op-level selective checkpointing ("op", see ActivationWidths.of)
RECOMPUTE = ("none", "selective", "full", "op")
# Megatron-core's output-discarding recompute_modules (TransformerConfig.recompute_modules:
# "layernorm", "mla_up_proj", "moe_act"; CheckpointWithoutOutput), the mechanisms DeepSeek-V3
# states (arXiv:2412.19437 sec. 3.2.3: "recompute all RMSNorm operations and MLA
# up-projections during back-propagation"; sec. 3.3.2: the SwiGLU inputs of the MoE cached,
# its output recomputed): each drops its outputs from what a layer keeps. Then two that
# Megatron-core checkpoints whole (tensor_parallel.checkpoint: the module's inputs kept, all
# it saves inside freed, its forward re-run in the backward): "core_attn" the attention core
# (attention.py, _checkpointed_attention_forward: what RECOMPUTE "selective" does), "mlp" a
# dense block's MLP (transformer_layer.py: recompute_mlp, not on MoE layers), given the pre-MLP
# norm's output; "shared_experts" an MoE layer's shared experts (moe_layer.py:
# shared_experts_recompute), given the same. A bit each in the batch variant's recompute_parts
# code (bit i: RECOMPUTE_MODULES[i])
RECOMPUTE_MODULES = ("layernorm", "mla_up_proj", "moe_act", "core_attn", "mlp", "shared_experts")


def recompute_code(modules) -> int:
    """The bit code of a list of RECOMPUTE_MODULES names."""
    return sum(1 << RECOMPUTE_MODULES.index(m) for m in set(modules))


def recompute_names(code: int) -> tuple[str, ...]:
    """The RECOMPUTE_MODULES names of a recompute_code."""
    return tuple(m for i, m in enumerate(RECOMPUTE_MODULES) if code >> i & 1)


def replays_core(recompute, parts) -> np.ndarray:
    """Where a layer recomputes its attention core: Megatron's selective recomputation, or
    the "core_attn" recompute module beside none (Megatron-core's selective granularity with
    recompute_modules ["core_attn"], its default: the same checkpoint)."""
    core = (np.asarray(parts) >> RECOMPUTE_MODULES.index("core_attn")) & 1
    recompute = np.asarray(recompute)
    return (recompute == RECOMPUTE.index("selective")) | ((recompute == 0) & (core > 0))


@dataclass(frozen=True)
class ActivationWidths:
    """What a transformer layer keeps per token for its backward, in bytes per unit of h
    (Korthikanti et al. 2022, Table 2, generalised to the layer's real widths): `replicated`
    on every tensor-parallel rank unless sequence parallelism splits it, `split` over tp, and
    `scores` per attention-score element (a s / h of them) when eager attention keeps them.
    The defaults are Korthikanti's GPT block (4h MLP, dropout): 10, 24 and 5."""

    replicated: float = 10.0
    split: float = 24.0
    scores: float = 5.0
    # op-level checkpointing keeps: `op_replicated` (the block's input), `op_split` (saved
    # GEMM outputs over tp, the attention output), `op_whole` (a saved row-parallel GEMM's
    # output: its partial sums are whole on every tp rank) and, when tp > 1,
    # `op_scatters` (the saved outputs of the two sequence-parallel reduce-scatters)
    op_replicated: float = 2.0
    op_split: float = 0.0
    op_whole: float = 0.0
    op_scatters: float = 4.0
    # of replicated and split: what each RECOMPUTE_MODULES entry drops (norm_out of
    # replicated; up_proj, act_out, dense_mlp and shared_mlp of split) and, of replicated,
    # what "mlp" keeps more (mlp_input: its checkpoint keeps the BF16 input where FP8 GEMMs
    # keep 1 byte)
    norm_out: float = 0.0
    up_proj: float = 0.0
    act_out: float = 0.0
    dense_mlp: float = 0.0
    mlp_input: float = 0.0
    shared_mlp: float = 0.0
    # of split: what DeepSeek-V3's low-precision caching saves (fp8_cache)
    fp8_cached: float = 0.0

    @classmethod
    def of(cls, c, fp8: bool = False) -> ActivationWidths:
        """A TransformerShape's widths. Replicated: the two norms' inputs (2 + 2), the
        attention's and the MLP's inputs (2 + 2), 1-byte dropout masks after each (1 + 1),
        MLA's latents. Split: Q, K, V and the attention output (2 bytes a value each), the
        MLP inside (plain: its up-projection and activation outputs, 2 f + 2 f; gated: gate,
        up and their product, 3 x 2 f); an MoE layer keeps that for each of its top_k x
        capacity routed copies of a token, with the copy's input (2 h), and its shared
        experts'. Scores: softmax output 2, and with dropout its mask 1 and output 2.
        `fp8`: the linear layers run Transformer Engine FP8 GEMMs, which keep a GEMM's input
        for the weight gradient in FP8, 1 byte a value (TE v1.8 module/linear.py "saved_inputmat
        _t", v2.8 linear.py "Discard unneeded data in input tensor", layernorm_linear.py's
        ln_out, grouped_linear.py's inputmats for MoE experts): the attention's and the MLP's
        inputs, the MLP's inner GEMM input (activation output), each routed copy's input and
        an FP8 copy of the attention output for the output projection, beside the BF16 one
        the attention kernel keeps; norm inputs, Q, K, V and the activation's input stay BF16.
        MLA's latents are counted in BF16 (not checked against a source). What the
        RECOMPUTE_MODULES drop: "layernorm" the two norm outputs (the attention's and the
        MLP's inputs, in whatever format they are kept: recomputed for their GEMMs' backward
        from the norm inputs, which stay); "mla_up_proj" MLA's Q, K and V (recomputed from the
        latents); "moe_act" the routed experts' activation output (their down-projection's
        input, recomputed from the kept activation input); "mlp" all a dense block's MLP
        keeps inside (its input, the checkpoint's, stays: in BF16, 2 bytes, where FP8
        GEMMs kept 1; none when "layernorm" drops it too); "shared_experts" all an MoE
        layer's shared experts keep inside (their input is the router's, kept in BF16 by
        its GEMM anyway); "core_attn" the scores, as
        selective recomputation (activation_bytes_per_layer). `fp8_cached` (FP8 widths only): what
        DeepSeek-V3's low-precision caching saves (sec. 3.3.2): the MoE activation's inputs
        in FP8, 1 byte a value where BF16 keeps 2, and the attention output kept once, in
        E5M6 (1.5 bytes), for both the attention's backward and the output projection's,
        where Transformer Engine keeps it in BF16 and in FP8 (2 + 1)."""
        h, d = c.hidden, 1.0 if c.has_dropout else 0.0
        gemm_in = 1.0 if fp8 else 2.0  # bytes a saved GEMM input takes
        hd = c.head_width
        if c.mla:
            qk = c.heads * (hd + c.rope_head_dim)
            q, k, v = qk, qk, c.heads * (c.v_head_dim or hd)
            latent = 2.0 * ((c.q_lora_rank or 0) + c.kv_lora_rank + c.rope_head_dim)
        else:
            q, k, v, latent = c.heads * hd, c.kv_heads * hd, c.kv_heads * hd, 0.0
        o = q if not c.mla else v  # the attention output's width
        attention = 2.0 * (q + k + v + o) + (gemm_in * o if fp8 else 0.0)

        def inside(width: float) -> float:
            return ((4.0 if c.gated_mlp else 2.0) + gemm_in) * width

        mlp = inside(c.ffn_hidden)
        act_out = act_in = share = shared = 0.0
        if c.experts > 1:
            routed = c.top_k * c.capacity_factor
            expert = c.moe_ffn_hidden or c.ffn_hidden
            moe = routed * inside(expert) + (routed - 1.0) * gemm_in * h
            shared = inside(c.shared_experts * expert) if c.shared_experts else 0.0
            moe += shared
            share = (c.layers - c.dense_layers) / c.layers
            mlp = (1.0 - share) * mlp + share * moe
            act_out = share * routed * gemm_in * expert
            act_in = share * routed * (2.0 if c.gated_mlp else 1.0) * expert
        return cls(
            replicated=4.0 + 2.0 * gemm_in + 2.0 * d + latent / h,
            split=(attention + mlp) / h,
            scores=2.0 + 3.0 * d,
            norm_out=2.0 * gemm_in,
            up_proj=2.0 * (q + k + v) / h if c.mla else 0.0,
            act_out=act_out / h,
            dense_mlp=(1.0 - share) * inside(c.ffn_hidden) / h,
            mlp_input=(1.0 - share) * (2.0 - gemm_in),
            shared_mlp=share * shared / h,
            fp8_cached=(act_in + 1.5 * o) / h if fp8 else 0.0,
            **_op_widths(c, q, k, v),
        )


def _op_widths(c, q: float, k: float, v: float) -> dict[str, float]:
    """What torchtitan's op-level selective checkpointing keeps of a dense block, per unit of
    h (torchtitan parallelize_llama.py, _save_list and _get_custom_policy, 2024-25): the
    outputs of the matmuls in odd places of the block's forward (q, k, v, o, then gate, up,
    down or up, down: q, v, gate and down, or q, v and up), the attention kernel's output
    and the tp reduce-scatters' outputs; everything else (k, o, the rest of the MLP, norms,
    activations, rotary) is recomputed in the backward. Its block input is kept too."""
    h, f = c.hidden, c.ffn_hidden
    split, whole = (q, False), (h, True)  # column-parallel outputs split, row-parallel whole
    mlp = [(f, False), (f, False), whole] if c.gated_mlp else [(f, False), whole]
    matmuls = [split, (k, False), (v, False), whole, *mlp]
    kept = matmuls[::2]  # the 1st, 3rd, 5th ... (every second one is recomputed)
    return {
        "op_split": 2.0 * (q + sum(w for w, row in kept if not row)) / h,
        "op_whole": 2.0 * sum(w for w, row in kept if row) / h,
    }


def activation_bytes_per_layer(
    s,
    b,
    h,
    a,
    t,
    sequence_parallel,
    recompute,
    flash=False,
    widths=ActivationWidths(),
    parts=0,
    fp8_cache=False,
):
    """Activation bytes one transformer layer keeps for one micro-batch (Korthikanti Table 2
    with the layer's ActivationWidths); `recompute` is a code of RECOMPUTE, arrays broadcast;
    s is the tokens this GPU holds of a sequence (s / cp under context parallelism).
    FlashAttention (Dao et al. 2022) keeps no s x s scores, softmax or dropout of them: the
    scores term goes, as under selective recomputation (its softmax statistics, a s b fp32
    values, are negligible). `parts`: a recompute_code of RECOMPUTE_MODULES, what they drop
    taken off what the layer keeps without full or op-level recomputation, as is what
    `fp8_cache` (DeepSeek-V3's low-precision caching) saves."""
    # tensor parallel: sbh(replicated + split/t + scores as/(ht)); sequence parallelism also
    # splits the replicated part; selective recompute drops the scores; full recompute keeps
    # the 2sbh layer input, /t under sequence parallelism (Megatron stores it sharded)
    sbh = np.asarray(s, float) * b * h
    recompute = np.asarray(recompute)
    no_scores = (recompute != 0) | np.asarray(flash) | replays_core(recompute, parts)
    scores = np.where(no_scores, 0.0, widths.scores * a * s / h)
    sp = np.where(sequence_parallel, t, 1)
    w = widths
    has = [(np.asarray(parts) >> i) & 1 for i in range(len(RECOMPUTE_MODULES))]
    replicated = w.replicated - has[0] * w.norm_out + has[4] * (1 - has[0]) * w.mlp_input
    split = w.split - has[1] * w.up_proj - has[2] * w.act_out - has[4] * w.dense_mlp
    split = split - has[5] * w.shared_mlp
    split = split - np.asarray(fp8_cache) * w.fp8_cached
    kept = sbh * (replicated / sp + (split + scores) / t)
    op = w.op_whole + (w.op_replicated + np.where(t > 1, w.op_scatters, 0.0)) / sp
    op = sbh * (op + w.op_split / t)
    return np.select([recompute == 2, recompute == 3], [2.0 * sbh / sp, op], kept)
