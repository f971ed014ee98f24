"""The one cluster `predict` and `plan` price: built from the flags, a flag the step model
would ignore refused, --trace's measured compute applied. Written once for both commands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commsim.cli.given import NCCL_FLAGS, pick, refuse_ignored
from commsim.cli.options import setup_from_flags
from commsim.cli.traced import TRACE_FLAGS, with_trace

if TYPE_CHECKING:
    from commsim.scenario import Setup


def step_setup(
    args: dict[str, Any], given: dict[str, Any], check: bool = True
) -> tuple[Setup, dict | None]:
    """The setup a command's flags (`args`, its locals()) give, `given` the flags that set
    scenario fields (by name, as setup_from_flags takes them), and the output's `trace`
    section (None without --trace). `check`: validate the scenario's own strategy (plan
    searches others, so it checks only what a flag pins). A SpecError names the flag when
    the caller wraps this in blame_flags."""
    setup = setup_from_flags(
        args["scenario"],
        fsdp=args["fsdp"],
        check=check,
        layers_per_virtual_stage=args["layers_per_virtual_stage"],
        backend=args["backend"],
        **pick(args, NCCL_FLAGS),
        **given,
    )
    refuse_ignored(setup.scenario, given, setup.workload)
    return with_trace(setup, *(args[k] for k in TRACE_FLAGS))
