"""A Hugging Face config.json as a model: published files give the presets' parameter counts
exactly, a path works wherever a model name does, and bad files name the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec, SpecError
from commsim.workload.hf import read_config
from commsim.workload.presets import build_workload

HF = Path(__file__).parent / "data" / "hf"
PUBLISHED = [  # tests/data/hf/README.md says where each file comes from
    ("meta-llama-3-8b", "llama3-8b"),
    ("meta-llama-3-70b", "llama3-70b"),
    ("mixtral-8x22b", "mixtral-8x22b"),
    ("qwen2.5-72b-instruct", "qwen2.5-72b"),
    ("deepseek-v3", "deepseek-v3"),
    ("gpt2-xl", "gpt2-xl"),
]


def _config(name: str) -> str:
    return str(HF / name / "config.json")


@pytest.mark.parametrize(("directory", "preset"), PUBLISHED)
def test_published_configs_give_the_presets_parameter_counts(directory, preset):
    from_file = build_workload(_config(directory))
    assert from_file.params == build_workload(preset).params
    assert from_file.active_params == build_workload(preset).active_params


@pytest.mark.parametrize(("directory", "preset"), PUBLISHED)
def test_published_configs_give_the_presets_flops(directory, preset):
    """Same layers, so the same FLOPs at the same run length."""
    seq = 1024 if preset == "gpt2-xl" else 4096
    assert build_workload(_config(directory), seq).forward_flops == pytest.approx(
        build_workload(preset, seq).forward_flops
    )


def test_what_the_fields_map_to():
    llama = read_config(_config("meta-llama-3-8b"))
    assert (llama.layers, llama.hidden, llama.heads, llama.kv_heads) == (32, 4096, 32, 8)
    assert (llama.ffn_hidden, llama.vocab, llama.seq_len) == (14336, 128256, 8192)
    assert llama.gated_mlp and llama.tied_embeddings is False and llama.head_dim is None
    qwen = read_config(_config("qwen2.5-72b-instruct"))
    assert qwen.qkv_bias and qwen.sliding_window is None  # use_sliding_window: false
    ds = read_config(_config("deepseek-v3"))
    assert ds.name == "deepseek-ai/DeepSeek-V3"
    assert (ds.experts, ds.top_k, ds.shared_experts, ds.dense_layers) == (256, 8, 1, 3)
    assert (ds.q_lora_rank, ds.kv_lora_rank, ds.rope_head_dim, ds.v_head_dim) == (
        1536,
        512,
        64,
        128,
    )
    gpt = read_config(_config("gpt2-xl"))
    assert gpt.ffn_hidden == 6400 and gpt.seq_len == 1024 and gpt.tied_embeddings


def _write(tmp_path: Path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1 config.json's shape fields, as public copies quote them
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def test_mistral_keeps_its_sliding_window(tmp_path):
    spec = read_config(_write(tmp_path, MISTRAL_7B))
    assert spec.sliding_window == 4096 and spec.window_every == 1
    # embedding and head 2 x 32000 x 4096, 32 blocks of 218,112,000: the "7.24B" quoted for it
    assert build_workload(spec).params == 7_241_732_096


def test_qwen3_moe_is_the_published_runs_shape(tmp_path):
    """Qwen3-30B-A3B's fields (as Megatron-Bridge's provider states them) read to the same
    model the published-runs table writes out by hand."""
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "max_position_embeddings": 40960,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 48,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
        "vocab_size": 151936,
    }
    runs = yaml.safe_load(
        (Path(__file__).parents[1] / "benchmarks" / "published_runs.yaml").read_text()
    )
    by_hand = ModelSpec(name="q", **runs["models"]["qwen3-30b-a3b"])
    assert build_workload(_write(tmp_path, config)).params == build_workload(by_hand).params


def test_qwen2_moe_counts_its_shared_expert_in_experts(tmp_path):
    config = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "max_position_embeddings": 8192,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "vocab_size": 151936,
    }
    spec = read_config(_write(tmp_path, config))
    assert spec.shared_experts == 4 and spec.moe_ffn_hidden == 1408 and spec.qkv_bias


def test_a_path_is_a_model_in_a_scenario_and_on_the_command_line(tmp_path):
    scenario = tmp_path / "s.yaml"
    model = _config("meta-llama-3-8b")
    body = {"model": model, "cluster": "dgx-h100-ib", "gpus": 8, "global_batch": 8,
            "seq_len": 2048, "strategy": {"tp": 8}}  # fmt: skip
    scenario.write_text(yaml.safe_dump(body))
    spec, source = load_scenario(str(scenario), {})
    assert resolve(spec, source).workload.params == 8_030_261_248
    result = CliRunner().invoke(
        app,
        ["predict", str(scenario), "--model", _config("gpt2-xl"), "--seq-len", "1024",
         "--tp", "1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["step_time_s"] > 0


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"model_type": "bert"}, "model_type", "not a family"),
        ({"hidden_size": "big"}, "hidden_size", "whole number"),
        ({"num_hidden_layers": 0}, "num_hidden_layers", "positive"),
        ({"num_attention_heads": None}, "num_attention_heads", "required"),
        ({"attention_bias": True}, "attention_bias", "not modelled"),
        ({"mlp_bias": True}, "mlp_bias", "not modelled"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings", "true or false"),
    ],
)
def test_a_bad_field_names_the_file_and_the_field(tmp_path, change, field, says):
    path = _write(tmp_path, MISTRAL_7B | change)
    with pytest.raises(SpecError, match=says) as err:
        read_config(path)
    assert err.value.source == path and err.value.field == field


def test_refused_moe_and_window_layouts(tmp_path):
    qwen = {"model_type": "qwen2", **{k: v for k, v in MISTRAL_7B.items() if k != "model_type"}}
    with pytest.raises(SpecError, match="use_sliding_window"):
        read_config(_write(tmp_path, qwen | {"use_sliding_window": True}))
    ds = json.loads(Path(_config("deepseek-v3")).read_text()) | {"moe_layer_freq": 2}
    with pytest.raises(SpecError, match="moe_layer_freq"):
        read_config(_write(tmp_path, ds))


@pytest.mark.parametrize(
    ("text", "says"),
    [("{not json", "invalid JSON"), ("[1, 2]", "JSON object"), ("{}", "model_type")],
)
def test_a_bad_file_is_one_spec_error(tmp_path, text, says):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=says):
        build_workload(str(path))


def test_a_missing_file_names_it():
    with pytest.raises(SpecError, match="file not found") as err:
        build_workload("no/such/config.json")
    assert err.value.source == "no/such/config.json"


def test_a_bad_file_on_the_command_line_exits_2(tmp_path):
    path = _write(tmp_path, MISTRAL_7B | {"model_type": "t5"})
    result = CliRunner().invoke(app, ["predict", "--model", path])
    assert result.exit_code == 2
    assert "model_type" in result.output and "Traceback" not in result.output


def test_the_architecture_names_the_family_when_model_type_is_missing(tmp_path):
    config = {k: v for k, v in MISTRAL_7B.items() if k != "model_type"}
    assert read_config(_write(tmp_path, config)).sliding_window == 4096
