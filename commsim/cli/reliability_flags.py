"""The scenario flags `goodput` and `stragglers` share, as `Annotated` option types (their
help shorter than predict's), and the ones given as scenario overrides."""

from __future__ import annotations

from typing import Annotated, Any

import typer

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
