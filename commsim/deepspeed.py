"""A DeepSpeed `ds_config.json` as commsim strategy fields and batch sizes.

What it reads (DeepSpeed's names, defaults from deepspeed/runtime/zero/config.py):

  zero_optimization.stage            -> zero (0-3; the deprecated `true` form is stage 1)
  zero_optimization.reduce_bucket_size
                                     -> bucket_mb: elements (DeepSpeed's default 5e8, not
                                        commsim's 25 MiB) x the gradient dtype's bytes, in MiB
  zero_optimization.overlap_comm     -> overlap (DeepSpeed's default: on for stage 3 only);
                                        stages 1-2 gather the parameters after the optimizer
                                        step (stage_1_and_2.py): overlap_param_gather false
  communication_data_type, else fp16.enabled / bf16.enabled
                                     -> grad_dtype (fp32 when neither is enabled)
  bf16.enabled with ZeRO 0, or ZeRO 1 and data_types.grad_accum_dtype fp32
                                     -> grad_accumulation: fp32 (DeepSpeed's BF16_Optimizer)
  train_micro_batch_size_per_gpu     -> micro_batch
  train_batch_size                   -> global_batch
  gradient_accumulation_steps        -> checked: train_batch_size = micro x steps x dp

`allgather_bucket_size` (stage 1-2 parameter all-gather) and `stage3_prefetch_bucket_size`
have no commsim field: commsim moves the all-gather in the gradient buckets; a different
value is reported in `notes`. A value of "auto" (Hugging Face Trainer's) leaves the field to
commsim's own default, also noted. Offloading (offload_optimizer / offload_param to cpu or
nvme, the deprecated cpu_offload flags), ZeRO++ quantised weights or gradients, hpZ
secondary partitions and MiCS shards change the step in ways commsim does not model: each
is refused with a SpecError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commsim.files import read_json_object
from commsim.specs import SpecError
from commsim.step.layouts import DTYPE_BYTES

MIB = 2**20
DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16",
               "bf16": "bf16", "bfloat16": "bf16"}  # fmt: skip
DEFAULT_BUCKET = 5e8  # elements: DeepSpeedZeroConfig.reduce_bucket_size / allgather_bucket_size
# (field, value DeepSpeed runs by default): anything else is a mechanism commsim lacks
NOT_MODELLED = {
    "zero_quantized_weights": (False, "ZeRO++ quantised weight all-gather"),
    "zero_quantized_gradients": (False, "ZeRO++ quantised gradient reduce-scatter"),
    "zero_hpz_partition_size": (1, "ZeRO++ hpZ secondary parameter partitions"),
    "mics_shard_size": (-1, "MiCS sharding groups"),
    "cpu_offload": (False, "optimizer offload to the CPU"),
    "cpu_offload_param": (False, "parameter offload to the CPU"),
}


@dataclass(frozen=True)
class DeepSpeedSettings:
    """What a ds_config.json says, in commsim's terms."""

    source: str
    strategy: dict[str, Any]  # Strategy fields: zero, bucket_mb, overlap, grad_dtype
    micro_batch: int | None  # None where the file does not say (absent or "auto")
    global_batch: int | None
    accumulation: int | None
    notes: tuple[str, ...] = ()

    def check_batch(self, global_batch: int, micro_batch: int, dp: int) -> None:
        """The scenario's batch must be the one DeepSpeed would run (SpecError naming the
        DeepSpeed field that disagrees)."""
        if self.micro_batch is not None and self.micro_batch != micro_batch:
            raise SpecError(
                self.source,
                "train_micro_batch_size_per_gpu",
                f"{self.micro_batch}, but the scenario's micro_batch is {micro_batch}",
            )
        if self.global_batch is not None and self.global_batch != global_batch:
            raise SpecError(
                self.source,
                "train_batch_size",
                f"{self.global_batch}, but the scenario's global_batch is {global_batch}",
            )
        if self.accumulation is not None and self.accumulation * micro_batch * dp != global_batch:
            raise SpecError(
                self.source,
                "gradient_accumulation_steps",
                f"{self.accumulation} x micro_batch {micro_batch} x data-parallel degree {dp} "
                f"= {self.accumulation * micro_batch * dp}, not the global batch {global_batch}",
            )


def read_deepspeed(path: str | Path) -> DeepSpeedSettings:
    """Read a ds_config.json; bad or unmodelled fields are a SpecError naming the field."""
    source = str(path)
    config = read_json_object(path, "DeepSpeed settings")
    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated form: true means stage 1
        zero = {"stage": 1 if zero else 0}
    if not isinstance(zero, dict):
        raise SpecError(source, "zero_optimization", "expected an object or true/false")
    _refuse(zero, source)
    stage = _whole(zero, "stage", source, "zero_optimization.", default=0)
    if stage > 3:
        raise SpecError(source, "zero_optimization.stage", f"{stage}: stages are 0 to 3")
    notes: list[str] = []
    strategy: dict[str, Any] = {"zero": stage}
    dtype = _grad_dtype(config, source, notes)
    if dtype is not None:
        strategy["grad_dtype"] = dtype
    if _bf16_optimizer(config, stage, source):
        strategy["grad_accumulation"] = "fp32"
    overlap = zero.get("overlap_comm", stage == 3)
    if not isinstance(overlap, bool):
        field = "zero_optimization.overlap_comm"
        raise SpecError(source, field, f"expected true or false, got {overlap!r}")
    strategy["overlap"] = overlap
    if overlap and 0 < stage < 3:  # step() gathers after the optimizer (all_gather_dp_groups)
        strategy["overlap_param_gather"] = False
    reduce = _elements(zero, "reduce_bucket_size", source, notes)
    if reduce is not None:
        strategy["bucket_mb"] = reduce * DTYPE_BYTES[dtype or "fp32"] / MIB
    gather = _elements(zero, "allgather_bucket_size", source, notes)
    if gather is not None and reduce is not None and gather != reduce and 0 < stage < 3:
        notes.append(
            f"allgather_bucket_size {gather:.3g} differs from reduce_bucket_size: commsim "
            "all-gathers in the gradient buckets"
        )
    return DeepSpeedSettings(
        source,
        strategy,
        _batch(config, "train_micro_batch_size_per_gpu", source, notes),
        _batch(config, "train_batch_size", source, notes),
        _batch(config, "gradient_accumulation_steps", source, notes),
        tuple(notes),
    )


def _refuse(zero: dict[str, Any], source: str) -> None:
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key)
        device = section.get("device", "none") if isinstance(section, dict) else section
        if device not in (None, "none"):
            raise SpecError(
                source,
                f"zero_optimization.{key}",
                f"offload to {device} is not modelled (commsim prices GPU-resident state)",
            )
    for key, (default, what) in NOT_MODELLED.items():
        if key in zero and zero[key] not in (default, None):
            raise SpecError(
                source, f"zero_optimization.{key}", f"{zero[key]!r}: {what} is not modelled"
            )


def _whole(d: dict[str, Any], key: str, source: str, prefix: str = "", default: Any = None) -> Any:
    value = d.get(key, default)
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise SpecError(source, prefix + key, f"expected a whole number, got {value!r}")
    if value < 0:
        raise SpecError(source, prefix + key, f"must not be negative, got {value!r}")
    return int(value)


def _elements(zero: dict[str, Any], key: str, source: str, notes: list[str]) -> int | None:
    value = _whole(zero, key, source, "zero_optimization.", default=DEFAULT_BUCKET)
    if value == "auto":
        notes.append(f'zero_optimization.{key} is "auto": commsim\'s bucket_mb default stays')
        return None
    if value == 0:
        raise SpecError(source, f"zero_optimization.{key}", "must be positive")
    return value


def _batch(config: dict[str, Any], key: str, source: str, notes: list[str]) -> int | None:
    value = _whole(config, key, source)
    if value == "auto":
        notes.append(f'{key} is "auto": the scenario\'s batch stands')
        return None
    if value == 0:
        raise SpecError(source, key, "must be positive")
    return value


def _enabled(config: dict[str, Any], key: str, source: str, notes: list[str]) -> bool:
    section = config.get(key, {})
    if not isinstance(section, dict):
        raise SpecError(source, key, "expected an object with `enabled`")
    value = section.get("enabled", False)
    if value == "auto":
        notes.append(f'{key}.enabled is "auto": grad_dtype left to the scenario')
        return False
    if not isinstance(value, bool):
        raise SpecError(source, f"{key}.enabled", f"expected true or false, got {value!r}")
    return value


def _bf16_optimizer(config: dict[str, Any], stage: int, source: str) -> bool:
    """Whether DeepSpeed runs its BF16_Optimizer, which adds each micro-batch's bf16
    gradients into fp32 ones (runtime/bf16_optimizer.py: hp_grad.add_ of the lp grad): bf16
    training whose gradients accumulate in fp32, by default without ZeRO (engine.py
    get_data_types: grad_accum_dtype fp32 for bf16 when ZeRO is off, else the model's dtype),
    and with ZeRO 1 where data_types.grad_accum_dtype says fp32 (_do_optimizer_sanity_check
    returns BFLOAT16 for bf16, fp32 accumulation, stage 1, no offload); DeepSpeed 0.9-0.16."""
    section = config.get("data_types", {})
    if not isinstance(section, dict):
        raise SpecError(source, "data_types", "expected an object")
    value = section.get("grad_accum_dtype")
    if value is not None and value not in DTYPE_NAMES:
        raise SpecError(source, "data_types.grad_accum_dtype", f"{value!r}: fp32, fp16 or bf16")
    if _enabled(config, "bf16", source, []) is not True or stage > 1:
        return False
    accumulate = DTYPE_NAMES[value] if value is not None else "fp32" if stage == 0 else "bf16"
    return accumulate == "fp32"


def _grad_dtype(config: dict[str, Any], source: str, notes: list[str]) -> str | None:
    """The dtype gradients cross the network in: communication_data_type, else the
    training precision (fp16, bf16, or fp32 when neither is on)."""
    fp16 = _enabled(config, "fp16", source, notes)
    bf16 = _enabled(config, "bf16", source, notes)
    if fp16 and bf16:
        raise SpecError(source, "bf16.enabled", "fp16 and bf16 cannot both be enabled")
    comm = config.get("communication_data_type")
    if comm is not None:
        if comm not in DTYPE_NAMES:
            raise SpecError(source, "communication_data_type", f"{comm!r}: fp32, fp16 or bf16")
        return DTYPE_NAMES[comm]
    if any('enabled is "auto"' in n for n in notes):
        return None
    return "fp16" if fp16 else "bf16" if bf16 else "fp32"
