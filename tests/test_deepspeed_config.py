"""A DeepSpeed ds_config.json as strategy fields: ZeRO stage, bucket sizes in MiB of the
gradient dtype, overlap, the batch it implies, and one-line refusals of what commsim does not
model (offload, ZeRO++, MiCS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from commsim import whatif
from commsim.deepspeed import read_deepspeed
from commsim.scenario import load_scenario
from commsim.specs import SpecError

# LLaMA-Factory's data/deepspeed/zero2.json (as stored on the Hugging Face hub), offload removed
ZERO2 = {
    "zero_optimization": {
        "stage": 2,
        "allgather_partitions": True,
        "allgather_bucket_size": 5e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e8,
        "contiguous_gradients": True,
    },
    "bf16": {"enabled": True},
    "gradient_accumulation_steps": 4,
    "train_micro_batch_size_per_gpu": 2,
    "train_batch_size": 64,
}


def _write(tmp_path: Path, config: dict, name: str = "ds_config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_zero2_config_as_strategy_fields(tmp_path):
    ds = read_deepspeed(_write(tmp_path, ZERO2))
    assert ds.strategy == {
        "zero": 2,
        "grad_dtype": "bf16",
        "overlap": True,
        "overlap_param_gather": False,  # step() gathers after the optimizer
        "bucket_mb": pytest.approx(5e8 * 2 / 2**20),  # 953.7 MiB of bf16 gradients
    }
    assert (ds.micro_batch, ds.global_batch, ds.accumulation) == (2, 64, 4)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, {"zero": 0, "overlap": False, "grad_dtype": "fp32", "bucket_mb": 5e8 * 4 / 2**20}),
        ({"zero_optimization": {"stage": 3}}, {"zero": 3, "overlap": True}),  # DeepSpeed default
        ({"zero_optimization": True}, {"zero": 1}),  # the deprecated form
        ({"fp16": {"enabled": True}}, {"grad_dtype": "fp16"}),
        ({"bf16": {"enabled": True}, "communication_data_type": "fp32"}, {"grad_dtype": "fp32"}),
    ],
)
def test_deepspeeds_defaults(tmp_path, config, expected):
    strategy = read_deepspeed(_write(tmp_path, config)).strategy
    assert {k: strategy[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("config", "fp32"),
    [
        ({"bf16": {"enabled": True}}, True),  # no ZeRO: grad_accum_dtype defaults to fp32
        ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, False),  # bf16 default
        (
            {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 1},
                "data_types": {"grad_accum_dtype": "fp32"},
            },
            True,
        ),
        (
            {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2},
                "data_types": {"grad_accum_dtype": "fp32"},
            },
            False,  # ZeRO 2 runs DeepSpeedZeroOptimizer, not the bf16 optimizer
        ),
        ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}}, False),
        ({"fp16": {"enabled": True}}, False),
        ({}, False),
    ],
)
def test_deepspeeds_bf16_optimizer_accumulates_in_fp32(tmp_path, config, fp32):
    """DeepSpeed's BF16_Optimizer (bf16, fp32 gradient accumulation, ZeRO 0 or 1) adds each
    micro-batch's gradients into fp32 ones: grad_accumulation fp32; otherwise the field is
    left to the scenario."""
    strategy = read_deepspeed(_write(tmp_path, config)).strategy
    assert strategy.get("grad_accumulation") == ("fp32" if fp32 else None)


def test_bucket_elements_follow_the_gradient_dtype(tmp_path):
    config = {"zero_optimization": {"stage": 1, "reduce_bucket_size": 2e8}}
    fp32 = read_deepspeed(_write(tmp_path, config)).strategy["bucket_mb"]
    half = read_deepspeed(_write(tmp_path, config | {"fp16": {"enabled": True}})).strategy
    assert fp32 == pytest.approx(2e8 * 4 / 2**20) and half["bucket_mb"] == pytest.approx(fp32 / 2)


def test_auto_values_leave_commsims_defaults_and_say_so(tmp_path):
    config = {
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
        "bf16": {"enabled": "auto"},
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }
    ds = read_deepspeed(_write(tmp_path, config))
    assert ds.strategy == {"zero": 3, "overlap": True}
    assert ds.micro_batch is None and ds.global_batch is None
    assert any("reduce_bucket_size" in n for n in ds.notes)


@pytest.mark.parametrize(
    ("zero", "field"),
    [
        ({"offload_optimizer": {"device": "cpu", "pin_memory": True}}, "offload_optimizer"),
        ({"offload_param": {"device": "nvme", "nvme_path": "/x"}}, "offload_param"),
        ({"cpu_offload": True}, "cpu_offload"),
        ({"zero_quantized_weights": True}, "zero_quantized_weights"),
        ({"zero_hpz_partition_size": 8}, "zero_hpz_partition_size"),
        ({"mics_shard_size": 8}, "mics_shard_size"),
    ],
)
def test_what_commsim_does_not_model_is_refused_naming_the_field(tmp_path, zero, field):
    path = _write(tmp_path, {"zero_optimization": {"stage": 3} | zero})
    with pytest.raises(SpecError, match="not modelled") as err:
        read_deepspeed(path)
    assert err.value.source == path and err.value.field == f"zero_optimization.{field}"


def test_offload_to_none_is_no_offload(tmp_path):
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}
    assert read_deepspeed(_write(tmp_path, config)).strategy["zero"] == 2


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
        ({"zero_optimization": {"stage": "two"}}, "zero_optimization.stage"),
        ({"zero_optimization": {"reduce_bucket_size": 0}}, "zero_optimization.reduce_bucket_size"),
        ({"zero_optimization": {"overlap_comm": "yes"}}, "zero_optimization.overlap_comm"),
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "bf16.enabled"),
        ({"communication_data_type": "int8"}, "communication_data_type"),
        ({"train_batch_size": 0}, "train_batch_size"),
        ({"train_batch_size": 2.5}, "train_batch_size"),
        ({"data_types": {"grad_accum_dtype": "int8"}}, "data_types.grad_accum_dtype"),
        ({"data_types": []}, "data_types"),
    ],
)
def test_bad_values_name_the_field(tmp_path, config, field):
    with pytest.raises(SpecError) as err:
        read_deepspeed(_write(tmp_path, config))
    assert err.value.field == field


@pytest.mark.parametrize(("text", "says"), [("{x", "invalid JSON"), ("3", "JSON object")])
def test_a_bad_file_is_one_spec_error(tmp_path, text, says):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=says):
        read_deepspeed(path)
    with pytest.raises(SpecError, match="file not found"):
        read_deepspeed(tmp_path / "missing.json")


def _scenario(tmp_path: Path, ds: dict, **fields) -> str:
    body = {"model": "llama2-7b", "cluster": "dgx-a100-ib", "gpus": 8, "seq_len": 2048,
            "deepspeed": _write(tmp_path, ds)} | fields  # fmt: skip
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_a_scenario_takes_its_strategy_and_batch_from_the_deepspeed_config(tmp_path):
    ds = ZERO2 | {"train_batch_size": 64, "gradient_accumulation_steps": 4}
    spec, _ = load_scenario(_scenario(tmp_path, ds), {})
    assert (spec.global_batch, spec.micro_batch) == (64, 2)  # 2 x 4 x dp 8
    assert spec.strategy.zero == 2 and spec.strategy.grad_dtype == "bf16"
    assert spec.strategy.bucket_mb == pytest.approx(953.67, abs=0.01)
    assert whatif.predict(spec).step_time_s > 0


def test_a_flag_overrides_the_deepspeed_config_and_the_batch_is_still_checked(tmp_path):
    path = _scenario(tmp_path, ZERO2)
    spec, _ = load_scenario(path, {"zero": 1})
    assert spec.strategy.zero == 1
    with pytest.raises(SpecError, match="gradient_accumulation_steps"):
        load_scenario(path, {"tp": 2})  # dp 4: 2 x 4 x 4 = 32, not 64


def test_a_scenario_field_that_contradicts_the_config_is_refused(tmp_path):
    path = _scenario(tmp_path, ZERO2, strategy={"zero": 3})
    with pytest.raises(SpecError, match="strategy.zero") as err:
        load_scenario(path, {})
    assert "makes it 2" in str(err.value)
    path = _scenario(tmp_path, ZERO2, global_batch=128)
    with pytest.raises(SpecError, match="global_batch"):
        load_scenario(path, {})


def test_a_bad_deepspeed_config_in_a_scenario_names_its_file(tmp_path):
    ds = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    path = _scenario(tmp_path, ds, global_batch=8)
    with pytest.raises(SpecError, match="ds_config.json: zero_optimization.offload_optimizer"):
        load_scenario(path, {})


def test_what_if_changes_keep_the_deepspeed_settings(tmp_path):
    spec, _ = load_scenario(_scenario(tmp_path, ZERO2), {})
    changed = whatif.change(spec, {"overlap": False})
    assert changed.strategy.zero == 2 and changed.strategy.overlap is False
