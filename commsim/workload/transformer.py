"""A transformer's shape turned into layers, tensors in the order Hugging Face registers them."""

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


GPT = Style(layout="gpt", bias=True, norm=2, learned_positions=True, tied_head=True)


LLAMA = Style(layout="llama", bias=False, norm=1, learned_positions=False, tied_head=False)


BERT = Style(layout="bert", bias=True, norm=2, learned_positions=True, tied_head=True)


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
    experts: int = 1  # > 1: every block's MLP is that many experts behind a router
    top_k: int = 1
    capacity_factor: float = 1.0
    seq_len: int | None = None  # the default run length when shorter than the context


def transformer_layers(c: TransformerShape, name: str, seq_len: int) -> Workload:
    """Layer list of a transformer run on sequences of `seq_len` tokens, tensors as HF registers.

    Block forward FLOPs = 2*s*(matmul params) + 4*s^2*h: the QK^T and AV products over the
    full s x s score matrix (causal masking ignored, as in Megatron's accounting). A MoE block
    (Mixtral's layout) has a router h x E and E expert MLPs, of which a token runs top_k.
    """
    h, s, st, f = c.hidden, seq_len, c.style, c.ffn_hidden
    kv = c.kv_heads * (h // c.heads)  # width of K and V (grouped-query attention)

    def linear(n_in: int, n_out: int) -> tuple[int, ...]:
        """A linear layer's tensors: weight, then bias if the family has them."""
        return (n_in * n_out, n_out) if st.bias else (n_in * n_out,)

    norm = (h,) * st.norm
    q, k, v, o = linear(h, h), linear(h, kv), linear(h, kv), linear(h, h)
    if c.gated_mlp:  # gate, up, down
        mlp = (*linear(h, f), *linear(h, f), *linear(f, h))
    else:  # up (GPT-2 c_fc, BERT intermediate), down (c_proj, output)
        mlp = (*linear(h, f), *linear(f, h))
    expert_params = 0
    experts: tuple[int, ...] = ()
    if c.experts > 1:  # router (no bias), then each expert's MLP
        expert_params = c.experts * sum(mlp)
        experts = mlp * c.experts
        mlp = (h * c.experts, *experts)
    if st.layout == "gpt":  # ln_1, attn.c_attn (Q, K, V fused), attn.c_proj, ln_2, mlp
        block = (*norm, *linear(h, h + 2 * kv), *o, *norm, *mlp)
    elif st.layout == "llama":  # self_attn q, k, v, o, mlp, input_ and post_attention_layernorm
        block = (*q, *k, *v, *o, *mlp, *norm, *norm)
    else:  # attention q, k, v, output dense and LayerNorm, intermediate, output and LayerNorm
        block = (*q, *k, *v, *o, *norm, *mlp, *norm)
    attn_matmul = 2 * h * h + 2 * h * kv  # Q and output projections h x h, K and V h x kv
    mlp_matmul = (3 if c.gated_mlp else 2) * h * f
    if c.experts > 1:  # the router, and the top_k experts each token goes to
        mlp_matmul = h * c.experts + c.top_k * mlp_matmul
    block_flops = 2.0 * s * (attn_matmul + mlp_matmul) + 4.0 * s * s * h

    # Megatron's split: block matrices and column-parallel biases over tp, vectors of length h
    # (norms, row-parallel biases) replicated, experts over tp and ep; the vocabulary table
    # and vocabulary-sized head tensors over tp, positions and token types replicated
    def shards(tensors: tuple[int, ...], split) -> tuple[str, ...]:
        return tuple("tp" if split(n) else "" for n in tensors)

    block_shards = shards(block, lambda n: n != h)
    if experts:  # the experts' tensors are the block's last run of len(experts) MLP tensors
        at = _experts_at(block, experts)
        block_shards = (
            block_shards[:at] + ("ep",) * len(experts) + block_shards[at + len(experts) :]
        )
    embed = (c.vocab * h, *((c.context * h,) if st.learned_positions else ()))
    if st.layout == "bert":
        embed += (2 * h, *norm)  # token-type embeddings and the embedding LayerNorm
    vocab_sized = lambda n: n in (c.vocab, c.vocab * h)  # noqa: E731
    layers = [Layer("embedding", embed, 0.0, shards(embed, vocab_sized))]
    layers += [
        Layer(f"block.{i}", block, block_flops, tuple(block_shards)) for i in range(c.layers)
    ]

    head = () if st.tied_head else (c.vocab * h,)
    head_flops = 2.0 * s * h * c.vocab  # logits, counted even when the weight is tied
    if st.layout == "bert":
        pooler = linear(h, h)
        layers.append(Layer("pooler", pooler, 2.0 * h * h, shards(pooler, vocab_sized)))
        # HF `cls`: masked-LM output bias, transform (dense + LayerNorm) over all s tokens and
        # the tied decoder; then the next-sentence classifier on the pooled token
        head = (c.vocab, *linear(h, h), *norm, *linear(h, 2))
        head_flops += 2.0 * s * h * h + 2.0 * h * 2
    else:
        layers.append(Layer("final_norm", norm, 0.0, shards(norm, vocab_sized)))
    layers.append(Layer("lm_head", head, head_flops, shards(head, vocab_sized)))
    return Workload(
        name,
        tuple(layers),
        seq_len,
        c.heads,
        c.hidden,
        c.experts,
        c.top_k if c.experts > 1 else 1,
        c.capacity_factor if c.experts > 1 else 1.0,
        expert_params,
    )


def _experts_at(block: tuple[int, ...], experts: tuple[int, ...]) -> int:
    """Where the experts' tensors start in a block's tensor tuple (they follow the router)."""
    n = len(experts)
    return next(i for i in range(len(block) - n + 1) if block[i : i + n] == experts)
