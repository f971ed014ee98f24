"""The scenario flags `goodput` and `stragglers` share, as `Annotated` option types (their
help shorter than predict's), and the ones given as scenario overrides; a value their own
flags give refused naming the flag."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from commsim.cli.given import as_typed

Opt = typer.Option
ScenarioArg = Annotated[str | None, typer.Argument(help="Scenario YAML (default: built-in).")]
ModelOpt = Annotated[str | None, Opt(help="Model preset.")]
ClusterOpt = Annotated[str | None, Opt(help="Topology name or YAML path.")]
GlobalBatchOpt = Annotated[int | None, Opt(help="Samples per step.")]
MicroBatchOpt = Annotated[int | None, Opt(help="Samples per GPU per micro-step.")]
SeqLenOpt = Annotated[int | None, Opt(help="Tokens per sample.")]
TpOpt = Annotated[int | None, Opt("--tp", help="Tensor-parallel degree.")]
PpOpt = Annotated[int | None, Opt("--pp", help="Pipeline stages.")]
SHARED_FLAGS = ("model", "cluster", "global_batch", "micro_batch", "seq_len", "tp", "pp")


def overrides(**kw: Any) -> dict[str, Any]:
    """The flags given (not None), as scenario overrides."""
    return {k: v for k, v in kw.items() if v is not None}


@contextlib.contextmanager
def naming(key: str, value: Any) -> Iterator[None]:
    """A value refused where it is read (a ValueError; a UnitError is one) as one error that
    names the flag and its value as typed: `--duration soon: not a time: 'soon' ...`."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"{as_typed(key, value)}: {e}") from None


def refuse(key: str, value: Any, problem: str) -> None:
    """Flag `key`'s value refused for `problem` ("": accepted), naming the flag."""
    if problem:
        raise ValueError(f"{as_typed(key, value)}: {problem}")


def flag_time(key: str, text: str) -> float:
    """Flag `key`'s time in seconds (units.parse_time), refused naming the flag."""
    from commsim.units import parse_time

    with naming(key, text):
        return parse_time(text)


def policy_fields(
    flags: dict[str, Any], fields: tuple[tuple[str, str, bool], ...], strategies: tuple[str, ...]
) -> dict[str, Any]:
    """A recovery Policy's fields from flags: `fields` lists (flag, Policy field, whether a
    time). Each value given (None: Policy's default) is checked alone against Policy's own
    rules, so that a refusal names its flag, and refused if none of `strategies` reads it."""
    from commsim.reliability.recovery import UNUSED, Policy

    out = {}
    for key, name, is_time in fields:
        if flags[key] is None:
            continue
        value = flag_time(key, flags[key]) if is_time else flags[key]
        with naming(key, flags[key]):
            Policy(**{name: value})
        if all(name in UNUSED.get(s, ()) for s in strategies):
            refuse(key, flags[key], f"{', '.join(strategies)} recovery does not use it")
        out[name] = value
    return out


def typed(ctx: typer.Context, key: str) -> bool:
    """Whether the command's flag `key` was given (not left at its default): a flag that
    acts only with another must be refused without it, not accepted and ignored."""
    source = ctx.get_parameter_source(key)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
