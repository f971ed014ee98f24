"""The base of every spec (pydantic): quantities read with their units ("400Gbps", "25MiB",
"2us") and stored in SI, and a model that refuses unknown fields and non-finite numbers."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    ValidationInfo,
    field_validator,
)

from commsim import units

# torch DDP turns bucket_cap_mb into int(cap * 2**20) bytes for the C++ Reducer's int64_t
# bucket_bytes_cap (torch/nn/parallel/distributed.py, c10d/reducer.hpp): a cap of 2**43 MiB
# or more cannot be given to DDP (and 1e308 MiB overflowed commsim's bytes to inf)
DDP_BUCKET_MB_LIMIT = 2.0**43


def _positive(v: float) -> float:
    if not v > 0:
        raise ValueError(f"must be positive, got {v:g}")
    return v


def _non_negative(v: float) -> float:
    if v < 0:
        raise ValueError(f"must not be negative, got {v:g}")
    return v


def _with_unit(parse):
    """A quantity's parser that, for input from a file or flag (validation context
    {"units": True}), refuses a non-zero number without a unit: read as bytes/s, 100 is
    a thousand million times slower than the 100 Gb/s that was meant."""

    def validate(value: Any, info: ValidationInfo) -> float:
        return parse(value, bare=not (info.context or {}).get("units", False))

    return validate


def _unit_text(unit: str) -> PlainSerializer:
    """JSON dumps write a quantity with its SI unit, so a dump reads back as a file does."""
    return PlainSerializer(lambda v: f"{v!r}{unit}", return_type=str, when_used="json")


Bytes = Annotated[
    float,
    BeforeValidator(_with_unit(units.parse_bytes)),
    AfterValidator(_positive),
    _unit_text("B"),
]
Rate = Annotated[
    float,
    BeforeValidator(_with_unit(units.parse_rate)),
    AfterValidator(_positive),
    _unit_text("B/s"),
]
Latency = Annotated[
    float,
    BeforeValidator(_with_unit(units.parse_time)),
    AfterValidator(_non_negative),
    _unit_text("s"),
]
FlopRate = Annotated[float, AfterValidator(_positive)]
Duration = Annotated[
    float,
    BeforeValidator(_with_unit(units.parse_time)),
    AfterValidator(_positive),
    _unit_text("s"),
]


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits true/false itself (bool, Any, a Literal of them, a union
    with one), as opposed to a number pydantic would turn true into."""
    if annotation is bool or annotation is Any:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return any(isinstance(a, bool) for a in args)
    if origin is Annotated:
        return _takes_bool(args[0])
    if origin in (typing.Union, types.UnionType):
        return any(_takes_bool(a) for a in args)
    return False


class Spec(BaseModel):
    """Base: unknown fields are errors (a typo must not pass silently), and so are
    infinite or NaN numbers, and true/false where a number goes."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 where a number goes: `gpus: true` (or yes, on) ran on one
        GPU. A yes/no is refused wherever the field does not take one."""
        if isinstance(value, bool) and not _takes_bool(
            cls.model_fields[info.field_name].annotation
        ):
            raise ValueError(f"{str(value).lower()} is a yes/no, not a number")
        return value
