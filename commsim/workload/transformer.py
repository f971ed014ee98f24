"""A transformer's shape turned into layers, tensors in the order Hugging Face registers them,
each tagged with how Megatron-LM splits it over tensor (and expert) parallelism.

Covers the families people train: GPT (LayerNorm, biases, learned positions, tied head),
LLaMA (RMSNorm, no biases, rotary positions, SwiGLU, untied head), BERT; grouped-query
attention (kv_heads), a head width of its own (head_dim), multi-head latent attention
(DeepSeek-V2/V3: q_lora_rank, kv_lora_rank), sliding-window attention, and mixtures of
experts with shared experts, experts narrower than the dense MLP and dense first layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commsim.workload.model import Layer, Workload


@dataclass(frozen=True)
class Style:
    """What a transformer family adds around its matmuls, and its parameters' registration order."""

    # block tensor order of HF GPT2Block, LlamaDecoderLayer or BertLayer; "bert" also means token
    # types, an embedding LayerNorm, post-LN (no final norm) and the pretraining heads
    layout: Literal["gpt", "llama", "bert"]
    bias: bool  # linear layers carry biases
    norm: int  # tensors of one norm, h each: LayerNorm 2 (weight, bias), RMSNorm 1 (weight)
    learned_positions: bool  # a position-embedding table as long as the context
    tied_head: bool  # the LM head reuses the token-embedding matrix
    # trains with dropout: GPT-2 (resid/attn_pdrop 0.1), Megatron's GPT (--hidden-dropout and
    # --attention-dropout 0.1) and BERT (0.1) do; LLaMA-family configs (Llama, Mistral,
    # Mixtral, Qwen, DeepSeek) set attention_dropout 0.0 and have no hidden dropout
    dropout: bool


GPT = Style("gpt", bias=True, norm=2, learned_positions=True, tied_head=True, dropout=True)
LLAMA = Style("llama", bias=False, norm=1, learned_positions=False, tied_head=False, dropout=False)
BERT = Style("bert", bias=True, norm=2, learned_positions=True, tied_head=True, dropout=True)


@dataclass(frozen=True)
class TransformerShape:
    """A transformer's shape; `transformer_layers` turns it into layers."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    gated_mlp: bool
    vocab: int
    context: int  # the model's context length (size of a learned position table)
    style: Style
    experts: int = 1  # > 1: MoE blocks' MLP is that many experts behind a router
    top_k: int = 1
    capacity_factor: float = 1.0
    seq_len: int | None = None  # the default run length when shorter than the context
    head_dim: int | None = None  # query/key width of a head (default hidden / heads)
    tied: bool | None = None  # the head reuses the embedding (default: the family's)
    moe_ffn_hidden: int | None = None  # each expert's MLP width (default ffn_hidden)
    shared_experts: int = 0  # always-on experts of moe_ffn_hidden each (DeepSeekMoE)
    dense_layers: int = 0  # the first blocks keep a dense MLP of ffn_hidden (DeepSeek-V3: 3)
    sliding_window: int | None = None  # keys a query attends to in windowed layers
    window_every: int = 1  # every k-th block is windowed (1: all; Gemma-2 style 2)
    q_lora_rank: int | None = None  # MLA (DeepSeek-V2): queries through a low-rank latent
    kv_lora_rank: int | None = None  # MLA: keys and values through a compressed latent
    rope_head_dim: int = 0  # MLA: the decoupled rotary part of a query/key head
    v_head_dim: int | None = None  # MLA: a value head's width (default head_dim)
    qkv_bias: bool = False  # Q, K and V projections carry biases where the family has none
    dropout: bool | None = None  # trains with dropout (None: the family's)

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def tied_head(self) -> bool:
        return self.style.tied_head if self.tied is None else self.tied

    @property
    def has_dropout(self) -> bool:
        return self.style.dropout if self.dropout is None else self.dropout

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None


Tensors = list[tuple[int, str]]  # (parameters, shard tag: "tp", "ep" or "" replicated)


def _linear(n_in: int, n_out: int, bias: bool, column: bool) -> Tensors:
    """A linear layer's weight, then its bias if it has one. Column-parallel layers split
    their output (and bias) over tp; row-parallel ones their input, the bias replicated
    (Shoeybi et al. 2019)."""
    out = [(n_in * n_out, "tp")]
    return out + [(n_out, "tp" if column else "")] if bias else out


def _attention(c: TransformerShape) -> tuple[Tensors, float]:
    """Attention's tensors in registration order (before the block's norms), and the
    parameters its matmuls run per token."""
    h, b, hd = c.hidden, c.style.bias, c.head_width
    if c.mla:  # DeepSeek-V2/V3 MLA: q_a, q_a_norm, q_b (or q_proj), kv_a, kv_a_norm, kv_b, o
        qk = hd + c.rope_head_dim
        vd = c.v_head_dim or hd
        kv_lora = c.kv_lora_rank or 0
        if c.q_lora_rank:
            q = [(h * c.q_lora_rank, ""), (c.q_lora_rank, "")]
            q += [(c.q_lora_rank * c.heads * qk, "tp")]
        else:
            q = [(h * c.heads * qk, "tp")]
        kv = [(h * (kv_lora + c.rope_head_dim), ""), (kv_lora, "")]
        kv += [(kv_lora * c.heads * (hd + vd), "tp")]
        o = [(c.heads * vd * h, "tp")]
        norms = kv_lora + (c.q_lora_rank or 0)  # the latents' RMSNorm weights: no matmul
        return q + kv + o, float(sum(n for n, _ in q + kv + o) - norms)
    qw, kvw = c.heads * hd, c.kv_heads * hd
    if c.style.layout == "gpt":  # attn.c_attn (Q, K, V fused), attn.c_proj
        tensors = _linear(h, qw + 2 * kvw, b, True) + _linear(qw, h, b, False)
    else:  # q, k, v, o
        qkv_b = b or c.qkv_bias
        tensors = _linear(h, qw, qkv_b, True) + _linear(h, kvw, qkv_b, True) * 2
        tensors += _linear(qw, h, b, False)
    return tensors, float(h * qw + 2 * h * kvw + qw * h)


def _mlp(c: TransformerShape, width: int, expert: bool = False) -> Tensors:
    """A (gated) MLP of `width`: gate, up, down (SwiGLU) or up, down. An expert's tensors
    all live on its expert-parallel rank ("ep")."""
    h, b = c.hidden, c.style.bias
    tensors = _linear(h, width, b, True) * (2 if c.gated_mlp else 1) + _linear(width, h, b, False)
    return [(n, "ep") for n, _ in tensors] if expert else tensors


def _mlp_flops_params(c: TransformerShape, width: int) -> float:
    """Matmul parameters one token runs through in an MLP of `width`."""
    return float((3 if c.gated_mlp else 2) * c.hidden * width)


def _attention_core(c: TransformerShape, s: int, windowed: bool) -> float:
    """Forward FLOPs per sample of QK^T and AV: 2 s span (query/key width) + 2 s span
    (value width) per head, span = s (full causal mask counted, Megatron's convention) or
    the window."""
    span = min(s, c.sliding_window) if windowed and c.sliding_window else s
    qk = c.head_width + (c.rope_head_dim if c.mla else 0)
    v = (c.v_head_dim or c.head_width) if c.mla else c.head_width
    return 2.0 * s * span * c.heads * (qk + v)


def _block(c: TransformerShape, moe: bool, windowed: bool, s: int) -> tuple[Tensors, float]:
    """One block's tensors in HF order and its forward FLOPs per sample."""
    h, norm = c.hidden, [(c.hidden, "")] * c.style.norm
    attention, attn_params = _attention(c)
    if moe:  # router (no bias, replicated over tp), shared experts, then the routed experts
        width = c.moe_ffn_hidden or c.ffn_hidden
        expert = _mlp(c, width, expert=True)
        shared = _mlp(c, width * c.shared_experts) if c.shared_experts else []
        mlp = [(h * c.experts, "")] + shared + expert * c.experts
        mlp_params = h * c.experts + (c.top_k + c.shared_experts) * _mlp_flops_params(c, width)
    else:
        mlp = _mlp(c, c.ffn_hidden)
        mlp_params = _mlp_flops_params(c, c.ffn_hidden)
    if c.style.layout == "gpt":  # ln_1, attention, ln_2, mlp
        tensors = norm + attention + norm + mlp
    elif c.style.layout == "llama":  # attention, mlp, input_ and post_attention_layernorm
        tensors = attention + mlp + norm + norm
    else:  # attention, its output LayerNorm, intermediate, output and its LayerNorm
        tensors = attention + norm + mlp + norm
    return tensors, 2.0 * s * (attn_params + mlp_params) + _attention_core(c, s, windowed)


def transformer_layers(c: TransformerShape, name: str, seq_len: int) -> Workload:
    """Layer list of a transformer run on sequences of `seq_len` tokens.

    Block forward FLOPs = 2 s (matmul parameters a token runs) + the attention core (4 s^2 h
    for plain multi-head attention: QK^T and AV over the full s x s score matrix, causal
    masking ignored, as in Megatron's accounting). An MoE block has a router h x E, its
    shared experts and E routed experts, of which a token runs top_k."""
    h, s, st = c.hidden, seq_len, c.style
    vocab_sized = lambda n: "tp" if n in (c.vocab, c.vocab * h) else ""  # noqa: E731
    embed = [c.vocab * h] + ([c.context * h] if st.learned_positions else [])
    if st.layout == "bert":
        embed += [2 * h] + [h] * st.norm  # token-type embeddings and the embedding LayerNorm
    layers = [_layer("embedding", [(n, vocab_sized(n)) for n in embed], 0.0)]
    moe_blocks, cores = 0, 0.0
    for i in range(c.layers):
        moe = c.experts > 1 and i >= c.dense_layers
        windowed = c.sliding_window is not None and i % c.window_every == c.window_every - 1
        tensors, flops = _block(c, moe, windowed, s)
        layers.append(_layer(f"block.{i}", tensors, flops))
        moe_blocks += moe
        cores += _attention_core(c, s, windowed)
    head = [] if c.tied_head else [(c.vocab * h, "tp")]
    head_flops = 2.0 * s * h * c.vocab  # logits, counted even when the weight is tied
    if st.layout == "bert":
        # the pooler and the heads' dense layers are plain (replicated) linears in Megatron
        layers.append(_layer("pooler", [(h * h, ""), (h, "")], 2.0 * h * h))
        # HF `cls`: masked-LM output bias, transform (dense + LayerNorm) over all s tokens and
        # the tied decoder; then the next-sentence classifier on the pooled token
        head = [(c.vocab, "tp"), (h * h, ""), (h, "")] + [(h, "")] * st.norm
        head += [(2 * h, ""), (2, "")]
        head_flops += 2.0 * s * h * h + 2.0 * h * 2
    else:
        layers.append(_layer("final_norm", [(h, "")] * st.norm, 0.0))
    layers.append(_layer("lm_head", head, head_flops))
    width = c.moe_ffn_hidden or c.ffn_hidden
    routed = c.experts * sum(n for n, _ in _mlp(c, width)) if c.experts > 1 else 0
    return Workload(
        name,
        tuple(layers),
        seq_len,
        c.heads,
        c.hidden,
        c.experts,
        c.top_k if c.experts > 1 else 1,
        c.capacity_factor if c.experts > 1 else 1.0,
        routed * moe_blocks / c.layers,  # all experts' MLPs, averaged over the blocks
        attention_flops=cores / c.layers,
        arch=c,
    )


def _layer(name: str, tensors: Tensors, flops: float) -> Layer:
    return Layer(name, tuple(n for n, _ in tensors), flops, tuple(t for _, t in tensors))
