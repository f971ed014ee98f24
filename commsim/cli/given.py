"""The flags a command was given: which scenario fields they set, picked by name, and the
flag (not the scenario file) named when a value it set is refused."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# flags that set scenario fields, by how `plan` treats them (`predict` takes them all)
TRAINING_FLAGS = ("global_batch", "micro_batch", "seq_len", "tokens", "price_per_gpu_hour")
TRAINING_FLAGS += ("memory_reserve", "compute_efficiency")
LAYOUT_FLAGS = (  # the search's dimensions: a flag pins one
    *("bucket_mb", "algorithm", "placement", "overlap", "compression", "error_feedback"),
    *("tp", "pp", "ep", "etp", "zero", "recompute", "interleave", "first_stage_layers"),
    *("last_stage_layers", "cp", "order", "fsdp_shard", "precision", "tp_overlap", "ep_overlap"),
    *("pipeline_schedule", "reshard_after_forward"),
)
STACK_FLAGS = ("flash_attention", "overlap_param_gather", "sequence_parallel", "kernels")
STACK_FLAGS += ("grad_dtype",)
NCCL_FLAGS = ("nccl_version", "nccl_algo", "nccl_proto")
# what only a model with a sequence (a transformer) uses: refused for a CNN
SEQUENCE_FLAGS = ("seq_len", "tokens", "flash_attention", "sequence_parallel")
# refusals of one field that another field shares: a product of degrees over the GPUs
# (scenario.check_layout), context parallelism's split of the sequence (cp_split_problem)
SHARED_BLAME = {"strategy": ("gpus", "tp", "pp", "cp"), "strategy.cp": ("cp", "seq_len")}
# the batch's split (scenario.check_layout): global batch over dp x micro-batch
SHARED_BLAME["global_batch"] = ("global_batch", "micro_batch", *SHARED_BLAME["strategy"])
# cluster fields a flag sets (collective, topo; predict and plan through the what-if API's
# `cluster.` paths) and the flags to name; `nccl` is NcclSpec's check of the three together
CLUSTER_BLAME = {"gpus": ("gpus",), "backend": ("backend",), "nccl": NCCL_FLAGS}
CLUSTER_BLAME |= {f"nccl.{k.removeprefix('nccl_')}": (k,) for k in NCCL_FLAGS}


def input_files(args: dict[str, Any]) -> tuple[str | None, ...]:
    """The files a command's flags (its locals()) name for it to read, that no output flag
    may overwrite: the scenario (the built-in one by default), the cluster, fabrics, model,
    DeepSpeed config and profile, where given."""
    from commsim import catalog

    scenario = args.get("scenario")
    named = [str(catalog.DEFAULT_SCENARIO) if scenario is None else scenario]
    named += [args.get(k) for k in ("cluster", "model", "deepspeed", "profile")]
    return (*named, *(args.get("fabric") or "").split(","))


def pick(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The named flags' values (a command's locals()), in the order named."""
    return {name: values[name] for name in names}


def flag(key: str) -> str:
    """The flag that sets a scenario or strategy field."""
    return "--" + key.replace("_", "-")


def refuse_ignored(scenario: Any, given: dict[str, Any], workload: Any = None) -> None:
    """A flag the step model would not use with the rest of the scenario is an error, not
    a no-op: error feedback without a lossy compressor, DDP buckets under ZeRO-3, a stack's
    kernels where one compute_efficiency prices every FLOP, SEQUENCE_FLAGS for a model
    without a sequence (`workload`, when given: a CNN), a price without the tokens whose
    GPU-hours it prices."""
    from commsim.specs import SpecError

    strategy = scenario.strategy
    for key in SEQUENCE_FLAGS:  # a time to train counts tokens: none either
        if given.get(key) is not None and workload is not None and workload.seq_len is None:
            raise SpecError(
                as_typed(key, given[key]),
                "",
                f"{workload.name} has no sequence: a sample is an image, not tokens, and "
                "there is no attention",
            )
    if given.get("price_per_gpu_hour") is not None and scenario.tokens is None:
        raise SpecError(
            as_typed("price_per_gpu_hour", given["price_per_gpu_hour"]),
            "",
            "prices the GPU-hours of training on --tokens (or the scenario's tokens): give them",
        )
    if given.get("kernels") is not None and scenario.compute_efficiency is not None:
        raise SpecError(
            f"--kernels {_shown(given['kernels'])}",
            "",
            "prices the roofline's element-wise kernels, but this scenario computes every "
            f"FLOP at one compute_efficiency ({scenario.compute_efficiency:g}): give "
            "--compute-efficiency roofline",
        )
    if given.get("grad_dtype") is not None and strategy.zero == 3 and strategy.states == "fsdp":
        raise SpecError(
            f"--grad-dtype {_shown(given['grad_dtype'])}",
            "",
            "PyTorch FSDP keeps fp32 gradient shards (states: fsdp): the gradients' dtype is "
            "its reduce dtype, not a buffer's",
        )
    if given.get("error_feedback") and strategy.compression == "none":
        raise SpecError(
            "--error-feedback", "", "keeps what a lossy compressor drops: give --compression"
        )
    if given.get("bucket_mb") is not None and strategy.zero == 3:
        raise SpecError(
            f"--bucket-mb {_shown(given['bucket_mb'])}",
            "",
            "ZeRO-3/FSDP gathers and reduce-scatters per transformer block: no DDP buckets",
        )


def refuse_nccl_flags(flags: dict[str, Any], backend: str) -> None:
    """--nccl-version/--nccl-algo/--nccl-proto set NCCL's tuner: under another backend (gloo,
    by --backend, the cluster or a profile) nothing reads them, so they are refused."""
    from commsim.specs import SpecError

    given = [k for k in NCCL_FLAGS if flags.get(k) is not None]
    if given and backend != "nccl":
        named = ", ".join(as_typed(k, flags[k]) for k in given)
        raise SpecError(named, "", f"set NCCL's tuning, but the collectives run on {backend}")


@contextlib.contextmanager
def blame_nccl_flags(flags: dict[str, Any]) -> Iterator[None]:
    """NCCL left with nothing to run under NCCL_ALGO / NCCL_PROTO names the --nccl-* flags
    given (`collective all-gather --nccl-algo tree` blamed --algorithm; predict named none)."""
    from commsim.collectives.group import NcclUnavailable

    try:
        yield
    except NcclUnavailable as e:
        given = [k for k in NCCL_FLAGS if flags.get(k) is not None]
        if not given:  # the cluster file or profile set them: the message says which
            raise
        raise ValueError(f"{', '.join(as_typed(k, flags[k]) for k in given)}: {e}") from None


@contextlib.contextmanager
def blame_cluster_flags(flags: dict[str, Any]) -> Iterator[None]:
    """An error about a cluster field a flag set (--gpus, --backend, --nccl-*) names the flag
    and its value, not the cluster file or `what-if` (`--nccl-version abc`, not
    `what-if: cluster.nccl.version`)."""
    from commsim.specs import SpecError

    try:
        yield
    except SpecError as e:
        field = e.field.removeprefix("cluster.")
        keys = [k for k in CLUSTER_BLAME.get(field, ()) if flags.get(k) is not None]
        if not keys:
            raise
        raise SpecError(", ".join(as_typed(k, flags[k]) for k in keys), "", e.problem) from None


def as_typed(key: str, value: Any) -> str:
    """A flag and its value as the user typed them: --x 3, --ep-overlap, --no-ep-overlap."""
    if isinstance(value, bool):
        return flag(key) if value else "--no-" + flag(key)[2:]
    return f"{flag(key)} {_shown(value)}"


def _shown(value: Any) -> str:
    """A flag's value as typed; quoted when empty or spaced."""
    text = str(value)
    return repr(text) if not text.strip() or " " in text else text


@contextlib.contextmanager
def blame_flags(scenario: str | None, overrides: dict[str, Any]) -> Iterator[None]:
    """An error about a scenario field a flag set names the flag and its value, not the
    scenario file (`predict --tp -2` is the flag's fault, not default.yaml's)."""
    from commsim import catalog
    from commsim.specs import SpecError

    source = str(scenario or catalog.DEFAULT_SCENARIO)
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        yield
    except SpecError as e:
        if e.source != source:
            raise
        keys = [k for k in given if e.field in (k, f"strategy.{k}")]
        if e.field in SHARED_BLAME:  # a problem of several fields: the flags that set them
            keys = [k for k in SHARED_BLAME[e.field] if k in given]
        if not keys:
            raise
        named = ", ".join(as_typed(k, given[k]) for k in keys)
        raise SpecError(named, "", e.problem) from None
