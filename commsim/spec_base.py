"""The base of every spec (pydantic): quantities read with their units ("400Gbps", "25MiB",
"2us") and stored in SI, and a model that refuses unknown fields and non-finite numbers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    ValidationInfo,
)

from commsim import units


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


class Spec(BaseModel):
    """Base: unknown fields are errors (a typo must not pass silently), and so are
    infinite or NaN numbers."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )
