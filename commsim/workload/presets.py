"""The named models (published shapes) and building a Workload from a name or a ModelSpec."""

from __future__ import annotations

from commsim.specs import ModelSpec, SpecError
from commsim.workload.hf import is_config_path, read_config
from commsim.workload.model import Layer, Workload
from commsim.workload.transformer import BERT, GPT, LLAMA, TransformerShape, transformer_layers


def _resnet50() -> Workload:
    """torchvision resnet50 (v1.5: stride on the 3x3 conv) at 224x224, one layer per module.

    He et al. 2016 (arXiv:1512.03385), torchvision.models.resnet50: 25,557,032 parameters,
    4.09 GMAC per image. Convs have one tensor (no bias); a batch norm has two of C (weight,
    bias) and its element-wise FLOPs are not counted. FLOPs = 2 * MACs.
    """
    layers: list[Layer] = []

    def conv_bn(conv: str, bn: str, cin: int, cout: int, k: int, out_hw: int) -> None:
        params = cin * cout * k * k
        layers.append(Layer(conv, (params,), 2.0 * params * out_hw * out_hw))
        layers.append(Layer(bn, (cout, cout), 0.0))

    conv_bn("conv1", "bn1", 3, 64, 7, 112)
    cin, hw = 64, 56  # after the stride-2 max pool
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        out_hw = hw if stage == 1 else hw // 2
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            conv_bn(f"{p}.conv1", f"{p}.bn1", cin, width, 1, hw)
            conv_bn(f"{p}.conv2", f"{p}.bn2", width, width, 3, out_hw)
            conv_bn(f"{p}.conv3", f"{p}.bn3", width, 4 * width, 1, out_hw)
            if b == 0:
                conv_bn(f"{p}.downsample.0", f"{p}.downsample.1", cin, 4 * width, 1, out_hw)
            cin, hw = 4 * width, out_hw
    layers.append(Layer("fc", (cin * 1000, 1000), 2.0 * cin * 1000))
    return Workload("resnet50", tuple(layers), None)


_TRANSFORMERS: dict[str, TransformerShape] = {
    # Radford et al. 2019 (GPT-2); HF gpt2-xl config.json: n_layer 48, n_embd 1600, n_head 25,
    # n_positions 1024, vocab 50257. 1,557,611,200 parameters.
    "gpt2-xl": TransformerShape(
        layers=48,
        hidden=1600,
        heads=25,
        kv_heads=25,
        ffn_hidden=6400,
        gated_mlp=False,
        vocab=50257,
        context=1024,
        style=GPT,
    ),
    # Brown et al. 2020 (arXiv:2005.14165) Table 2.1: 96 layers, d_model 12288, 96 heads,
    # context 2048; GPT-2's vocabulary and architecture. About 174.6B parameters.
    "gpt3-175b": TransformerShape(
        layers=96,
        hidden=12288,
        heads=96,
        kv_heads=96,
        ffn_hidden=49152,
        gated_mlp=False,
        vocab=50257,
        context=2048,
        style=GPT,
    ),
    # Touvron et al. 2023 (arXiv:2307.09288); HF meta-llama/Llama-2-7b-hf config.json:
    # hidden 4096, intermediate 11008 (SwiGLU), 32 layers, 32 heads, vocab 32000,
    # max_position_embeddings 4096 (rotary), untied lm_head. 6,738,415,616 parameters.
    "llama2-7b": TransformerShape(
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn_hidden=11008,
        gated_mlp=True,
        vocab=32000,
        context=4096,
        style=LLAMA,
    ),
    # HF meta-llama/Llama-2-70b-hf config.json: hidden 8192, intermediate 28672, 80 layers,
    # 64 heads, 8 key-value heads (GQA). 68,976,648,192 parameters.
    "llama2-70b": TransformerShape(
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        gated_mlp=True,
        vocab=32000,
        context=4096,
        style=LLAMA,
    ),
    # Jiang et al. 2024 (arXiv:2401.04088); HF mistralai/Mixtral-8x7B-v0.1 config.json: hidden
    # 4096, intermediate 14336 (SwiGLU), 32 layers, 32 heads, 8 kv heads, vocab 32000, 8 local
    # experts, 2 per token, context 32768 (run at 4096 by default), untied head, RMSNorm.
    # 46,702,792,704 parameters, 12,879,925,248 active. Mixtral trains dropless; the capacity
    # factor is GShard's / Switch's customary 1.25.
    "mixtral-8x7b": TransformerShape(
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        gated_mlp=True,
        vocab=32000,
        context=32768,
        style=LLAMA,
        seq_len=4096,
        experts=8,
        top_k=2,
        capacity_factor=1.25,
    ),
    # Meta Llama 3 (Dubey et al. 2024, arXiv:2407.21783, Table 3); HF meta-llama/Meta-Llama-3-8B
    # config.json: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 kv heads, vocab
    # 128256, context 8192, untied. 8,030,261,248 parameters.
    "llama3-8b": TransformerShape(
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        gated_mlp=True,
        vocab=128256,
        context=8192,
        style=LLAMA,
    ),
    # HF meta-llama/Meta-Llama-3-70B config.json: hidden 8192, intermediate 28672, 80 layers,
    # 64 heads, 8 kv heads, vocab 128256. 70,553,706,496 parameters.
    "llama3-70b": TransformerShape(
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn_hidden=28672,
        gated_mlp=True,
        vocab=128256,
        context=8192,
        style=LLAMA,
    ),
    # HF meta-llama/Llama-3.1-405B config.json: hidden 16384, intermediate 53248, 126 layers,
    # 128 heads, 8 kv heads, vocab 128256, context 131072 (pre-trained at 8192 first).
    # 405,853,388,800 parameters.
    "llama3-405b": TransformerShape(
        layers=126,
        hidden=16384,
        heads=128,
        kv_heads=8,
        ffn_hidden=53248,
        gated_mlp=True,
        vocab=128256,
        context=131072,
        style=LLAMA,
        seq_len=8192,
    ),
    # HF mistralai/Mixtral-8x22B-v0.1 config.json: hidden 6144, intermediate 16384, 56 layers,
    # 48 heads, 8 kv heads, vocab 32000, 8 experts, 2 a token, context 65536 (run at 4096).
    # 140,620,634,112 parameters; about 39B active (Mistral AI).
    "mixtral-8x22b": TransformerShape(
        layers=56,
        hidden=6144,
        heads=48,
        kv_heads=8,
        ffn_hidden=16384,
        gated_mlp=True,
        vocab=32000,
        context=65536,
        style=LLAMA,
        seq_len=4096,
        experts=8,
        top_k=2,
        capacity_factor=1.25,
    ),
    # Qwen2.5 (Qwen team 2024, arXiv:2412.15115); HF Qwen/Qwen2.5-72B config.json: hidden 8192,
    # intermediate 29568, 80 layers, 64 heads, 8 kv heads, vocab 152064, biases on Q, K, V,
    # untied. 72,706,203,648 parameters.
    "qwen2.5-72b": TransformerShape(
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn_hidden=29568,
        gated_mlp=True,
        vocab=152064,
        context=32768,
        style=LLAMA,
        seq_len=4096,
        qkv_bias=True,
    ),
    # DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437); HF deepseek-ai/DeepSeek-V3 config.json:
    # hidden 7168, 61 layers, the first 3 dense (intermediate 18432), then 256 routed experts
    # of 2048 (8 a token) and 1 shared; MLA with 128 heads, q_lora_rank 1536, kv_lora_rank 512,
    # qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; vocab 129280, untied; pre-
    # trained at 4096 tokens. 671B parameters, 37B active (the multi-token-prediction module's
    # 14B not included).
    "deepseek-v3": TransformerShape(
        layers=61,
        hidden=7168,
        heads=128,
        kv_heads=128,
        ffn_hidden=18432,
        gated_mlp=True,
        vocab=129280,
        context=163840,
        style=LLAMA,
        seq_len=4096,
        experts=256,
        top_k=8,
        capacity_factor=1.0,
        head_dim=128,
        moe_ffn_hidden=2048,
        shared_experts=1,
        dense_layers=3,
        q_lora_rank=1536,
        kv_lora_rank=512,
        rope_head_dim=64,
        v_head_dim=128,
    ),
    # Devlin et al. 2019 (arXiv:1810.04805): L=24, H=1024, A=16; HF bert-large-uncased
    # config.json: vocab 30522, max_position_embeddings 512, type_vocab_size 2. As
    # BertForPreTraining: 335,141,888 in BertModel + 1,084,220 in the pretraining heads.
    "bert-large": TransformerShape(
        layers=24,
        hidden=1024,
        heads=16,
        kv_heads=16,
        ffn_hidden=4096,
        gated_mlp=False,
        vocab=30522,
        context=512,
        style=BERT,
    ),
}
MODEL_NAMES: tuple[str, ...] = (*_TRANSFORMERS, "resnet50")


def build_workload(
    model: ModelSpec | str,
    seq_len: int | None = None,
    source: str = "model",
    shape_source: str | None = None,
) -> Workload:
    """Turn a preset name, a path to a Hugging Face config.json or a ModelSpec into layers;
    `seq_len` overrides the model's.

    A transformer ModelSpec that sets nothing but name (and seq_len) names a preset. Otherwise
    its family follows gated_mlp: gated means LLaMA-style (RMSNorm, no biases, rotary, untied
    head), plain means GPT-style (LayerNorm, biases, learned positions, tied head). A custom
    layer is one parameter tensor (none when it has no parameters). `shape_source` names
    the model's shape in errors (a config.json's path) where it is not the scenario's.
    """
    if isinstance(model, str):
        if is_config_path(model):  # a Hugging Face config.json (workload.hf): its shape's
            return build_workload(read_config(model), seq_len, source, model)  # faults its own
        return _preset(model, seq_len, source)
    if model.kind == "custom":
        if not model.custom_layers:
            raise SpecError(
                source, "model.custom_layers", "a custom model needs at least one layer"
            )
        layers = tuple(
            Layer(x.name, (x.params,) if x.params else (), x.forward_flops)
            for x in model.custom_layers
        )
        return Workload(model.name, layers, seq_len or model.seq_len)
    if model.kind == "resnet" or not model.model_fields_set - {"name", "kind", "seq_len"}:
        return _preset(model.name, seq_len or model.seq_len, source)
    config = _from_spec(model, seq_len, shape_source or source)
    return transformer_layers(config, model.name, _run_length(config, seq_len, source))


def _preset(name: str, seq_len: int | None, source: str) -> Workload:
    key = name.lower()
    if key == "resnet50":
        return _resnet50()
    if key not in _TRANSFORMERS:
        known = ", ".join(MODEL_NAMES)
        raise SpecError(source, "model", f"unknown model {name!r} (known: {known})")
    config = _TRANSFORMERS[key]
    return transformer_layers(config, key, _run_length(config, seq_len, source))


def _run_length(config: TransformerShape, seq_len: int | None, source: str) -> int:
    """The run's sequence length: the override or the model's context, within learned positions."""
    s = seq_len or config.seq_len or config.context
    if config.style.learned_positions and s > config.context:
        raise SpecError(
            source, "seq_len", f"{s} exceeds the model's {config.context} learned positions"
        )
    return s


def _from_spec(m: ModelSpec, seq_len: int | None, source: str) -> TransformerShape:
    """Check an explicit transformer ModelSpec and fill its defaults."""
    for field in ("layers", "hidden", "heads", "vocab"):
        if getattr(m, field) is None:
            raise SpecError(source, f"model.{field}", "required for a transformer")
    context = m.seq_len or seq_len
    if context is None:
        raise SpecError(source, "model.seq_len", "required (here or in the scenario)")
    if m.hidden % m.heads and m.head_dim is None:
        raise SpecError(
            source, "model.heads", f"{m.heads} does not divide hidden {m.hidden} (give head_dim)"
        )
    kv_heads = m.kv_heads or m.heads
    if m.heads % kv_heads:
        raise SpecError(source, "model.kv_heads", f"{kv_heads} does not divide heads {m.heads}")
    if m.gated_mlp and m.ffn_hidden is None:
        raise SpecError(source, "model.ffn_hidden", "required with gated_mlp (no standard width)")
    ffn = m.ffn_hidden or 4 * m.hidden
    style = LLAMA if m.gated_mlp else GPT
    experts = m.experts or 1
    if experts > 1 and m.top_k > experts:
        raise SpecError(source, "model.top_k", f"{m.top_k} exceeds the {experts} experts")
    if m.dense_layers > m.layers:
        raise SpecError(source, "model.dense_layers", f"{m.dense_layers} exceeds {m.layers} layers")
    if (m.q_lora_rank or m.rope_head_dim or m.v_head_dim) and m.kv_lora_rank is None:
        raise SpecError(source, "model.kv_lora_rank", "latent attention (MLA) needs kv_lora_rank")
    return TransformerShape(
        m.layers,
        m.hidden,
        m.heads,
        kv_heads,
        ffn,
        m.gated_mlp,
        m.vocab,
        context,
        style,
        experts=experts,
        top_k=m.top_k,
        capacity_factor=m.capacity_factor,
        head_dim=m.head_dim,
        tied=m.tied_embeddings,
        moe_ffn_hidden=m.moe_ffn_hidden,
        shared_experts=m.shared_experts,
        dense_layers=m.dense_layers,
        sliding_window=m.sliding_window,
        window_every=m.window_every,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        rope_head_dim=m.rope_head_dim,
        v_head_dim=m.v_head_dim,
        qkv_bias=m.qkv_bias,
        dropout=m.dropout,
    )
