"""A Hugging Face `config.json` as a commsim ModelSpec.

Reads the shape fields of the families people train and maps them onto ModelSpec, so
`--model path/to/config.json` (or `model: path/config.json` in a scenario) builds the same
layers a preset would. Families (by `model_type`, else by `architectures[0]`):

  llama, mistral        layers, hidden, heads, KV heads, head_dim, SwiGLU width, vocabulary,
                        tied head, Mistral's sliding window
  qwen2, qwen3          as llama; Qwen2 has biases on Q, K and V
  mixtral               experts (num_local_experts) of intermediate_size, top-k
  qwen2_moe, qwen3_moe  experts of moe_intermediate_size, top-k; Qwen2-MoE's shared expert
  deepseek_v2/v3        multi-head latent attention (q_lora_rank, kv_lora_rank, nope / rope /
                        value head widths), routed and shared experts, dense first layers
  gpt2                  n_layer, n_embd, n_head, n_inner (default 4 x n_embd), learned
                        positions (n_positions), tied head

The model's context (max_position_embeddings, n_positions) becomes the spec's seq_len: the
position table for GPT-2, and the default run length otherwise (a scenario's seq_len or
`--seq-len` sets the run's). Fields that change the shape in ways commsim cannot build
(biases on every projection, MoE blocks only every k-th layer, windows on only some layers,
cross-attention) are refused with a SpecError naming the file and the field; fields that do
not change the shape (token ids, dropout, rotary settings, dtype) are read past. Not counted,
and named here so nothing is silent: Qwen3's per-head Q/K RMSNorm weights (2 x head_dim a
layer), Qwen2-MoE's shared-expert gate (hidden a layer), DeepSeek-V3's router score-correction
bias (n_routed_experts a MoE layer: 14,848 of its 671,026,419,200 parameters) and its
multi-token-prediction module (num_nextn_predict_layers); the presets leave them out too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from commsim.files import read_json_object
from commsim.spec_io import parse_spec
from commsim.specs import ModelSpec, SpecError

Config = dict[str, Any]
Reader = Callable[[Config, str], dict[str, Any]]

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GPT2LMHeadModel": "gpt2",
}


# the dropout probabilities a config may set (GPT-2's *_pdrop, the LLaMA family's)
DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop")


def is_config_path(name: str) -> bool:
    """A model named by a path to a JSON file rather than a preset name."""
    return name.lower().endswith(".json")


def read_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a Hugging Face config.json; SpecError names the file and field."""
    source = str(path)
    config = read_json_object(path, "config fields")
    family = _family(config, source)
    fields = FAMILIES[family](config, source)
    fields["dropout"] = any(
        _probability(config, key, source) > 0 for key in DROPOUT_KEYS if config.get(key) is not None
    )
    name = config.get("_name_or_path") or _default_name(Path(path))
    return parse_spec(ModelSpec, {"name": str(name), **fields}, source)


def _default_name(path: Path) -> str:
    return path.parent.name if path.stem == "config" and path.parent.name else path.stem


def _family(config: Config, source: str) -> str:
    kind = config.get("model_type")
    if kind is None:
        archs = config.get("architectures") or []
        kind = ARCHITECTURES.get(archs[0]) if isinstance(archs, list) and archs else None
        if kind is None:
            raise SpecError(
                source, "model_type", "missing, and architectures names no known family"
            )
    if kind not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise SpecError(source, "model_type", f"{kind!r} is not a family commsim reads ({known})")
    return kind


def _int(config: Config, key: str, source: str, default: int | None = None) -> int:
    """A positive integer field (an integral float such as 5e8 too)."""
    value = config.get(key, default)
    if value is None:
        raise SpecError(source, key, "required")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise SpecError(source, key, f"expected a whole number, got {value!r}")
    if value < 1:
        raise SpecError(source, key, f"must be positive, got {value!r}")
    return int(value)


def _probability(config: Config, key: str, source: str) -> float:
    """A probability field in [0, 1]."""
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise SpecError(source, key, f"expected a probability in [0, 1], got {value!r}")
    return float(value)


def _optional_int(config: Config, key: str, source: str) -> int | None:
    return None if config.get(key) is None else _int(config, key, source)


def _flag(config: Config, key: str, source: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(source, key, f"expected true or false, got {value!r}")
    return value


def _refuse(config: Config, source: str, checks: dict[str, tuple[Any, str]]) -> None:
    """Fields whose non-default value changes the shape in a way commsim cannot build."""
    for key, (allowed, why) in checks.items():
        if key in config and config[key] != allowed:
            raise SpecError(source, key, f"{config[key]!r}: {why} (not modelled)")


NO_BIAS = {
    "attention_bias": (False, "biases on every attention projection"),
    "mlp_bias": (False, "biases on the MLP projections"),
}


def _decoder(config: Config, source: str) -> dict[str, Any]:
    """What every LLaMA-like family shares: RMSNorm, rotary positions, a SwiGLU MLP."""
    heads = _int(config, "num_attention_heads", source)
    hidden = _int(config, "hidden_size", source)
    fields = {
        "layers": _int(config, "num_hidden_layers", source),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": _int(config, "num_key_value_heads", source, heads),
        "ffn_hidden": _int(config, "intermediate_size", source),
        "gated_mlp": True,
        "vocab": _int(config, "vocab_size", source),
        "seq_len": _int(config, "max_position_embeddings", source),
        "tied_embeddings": _flag(config, "tie_word_embeddings", source, False),
    }
    head_dim = _optional_int(config, "head_dim", source)
    if head_dim is not None and head_dim * heads != hidden:
        fields["head_dim"] = head_dim
    return fields


def _llama(config: Config, source: str) -> dict[str, Any]:
    _refuse(config, source, NO_BIAS)
    fields = _decoder(config, source)
    window = _optional_int(config, "sliding_window", source)
    if window is not None and window < fields["seq_len"]:
        fields["sliding_window"] = window
    return fields


def _qwen(config: Config, source: str) -> dict[str, Any]:
    _refuse(
        config,
        source,
        NO_BIAS | {"use_sliding_window": (False, "windows on the layers above max_window_layers")},
    )
    fields = _decoder(config, source)
    fields["qkv_bias"] = config.get("model_type", "qwen2").startswith("qwen2")
    return fields


def _moe_every_layer(config: Config, source: str) -> None:
    _refuse(
        config,
        source,
        {
            "decoder_sparse_step": (1, "MoE blocks only every k-th layer"),
            "mlp_only_layers": ([], "dense MLPs in chosen layers"),
            "moe_layer_freq": (1, "MoE blocks only every k-th layer"),
        },
    )


def _mixtral(config: Config, source: str) -> dict[str, Any]:
    fields = _llama(config, source)
    experts = _int(config, "num_local_experts", source)
    return fields | {"experts": experts, "top_k": _int(config, "num_experts_per_tok", source)}


def _qwen_moe(config: Config, source: str) -> dict[str, Any]:
    _moe_every_layer(config, source)
    fields = _qwen(config, source)
    expert = _int(config, "moe_intermediate_size", source)
    fields |= {
        "experts": _int(config, "num_experts", source),
        "top_k": _int(config, "num_experts_per_tok", source),
        "moe_ffn_hidden": expert,
        "capacity_factor": 1.0,  # dropless routing
    }
    shared = config.get("shared_expert_intermediate_size") or 0
    if shared:
        width = _int(config, "shared_expert_intermediate_size", source)
        if width % expert:
            raise SpecError(
                source,
                "shared_expert_intermediate_size",
                f"{width} is not a whole number of experts of {expert} (not modelled)",
            )
        fields["shared_experts"] = width // expert
    return fields


def _deepseek(config: Config, source: str) -> dict[str, Any]:
    _refuse(config, source, {"attention_bias": NO_BIAS["attention_bias"]})
    _moe_every_layer(config, source)
    fields = _decoder(config, source)
    fields |= {
        "head_dim": _int(config, "qk_nope_head_dim", source),
        "rope_head_dim": _int(config, "qk_rope_head_dim", source),
        "v_head_dim": _int(config, "v_head_dim", source),
        "kv_lora_rank": _int(config, "kv_lora_rank", source),
        "q_lora_rank": _optional_int(config, "q_lora_rank", source),
        "experts": _int(config, "n_routed_experts", source),
        "top_k": _int(config, "num_experts_per_tok", source),
        "moe_ffn_hidden": _int(config, "moe_intermediate_size", source),
        "shared_experts": _optional_int(config, "n_shared_experts", source) or 0,
        "dense_layers": config.get("first_k_dense_replace") or 0,
        "capacity_factor": 1.0,  # DeepSeek-V3 drops no tokens (arXiv:2412.19437 section 2.1.2)
    }
    if fields["dense_layers"]:
        fields["dense_layers"] = _int(config, "first_k_dense_replace", source)
    return fields


def _gpt2(config: Config, source: str) -> dict[str, Any]:
    _refuse(config, source, {"add_cross_attention": (False, "cross-attention blocks")})
    hidden = _int(config, "n_embd", source)
    return {
        "layers": _int(config, "n_layer", source),
        "hidden": hidden,
        "heads": _int(config, "n_head", source),
        "ffn_hidden": _optional_int(config, "n_inner", source) or 4 * hidden,
        "gated_mlp": False,
        "vocab": _int(config, "vocab_size", source),
        "seq_len": _int(config, "n_positions", source),
        "tied_embeddings": _flag(config, "tie_word_embeddings", source, True),
    }


FAMILIES: dict[str, Reader] = {
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen,
    "qwen3": _qwen,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt2": _gpt2,
}
