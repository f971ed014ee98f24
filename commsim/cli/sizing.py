"""`commsim plan` in sizing mode: a range of GPU counts or several fabrics, the best layout
of each (planner.sizing) and its goodput under failures, the Pareto front of time to train
against cost, and the pick a deadline, a budget or an objective makes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from commsim.cli import plan_show
from commsim.cli.given import blame_flags
from commsim.cli.options import gpu_sizes
from commsim.cli.reliability_flags import flag_time, policy_fields, refuse
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.sizing import SizingRow
    from commsim.reliability.recovery import Policy


def _sizing_title(spec, gpu: str | None) -> str:
    model = spec.model if isinstance(spec.model, str) else spec.model.name
    return (
        f"cluster sizing: {model}, {spec.tokens / 1e9:,.4g}B tokens, global batch "
        f"{spec.global_batch}" + (f", {gpu}" if gpu else "")
    )


# The largest size a sweep may ask for: every size builds its cluster graph in a worker, and
# a 262,144-GPU graph took 1.8 GB and 16 s to build on this 2-core machine (dgx-h100-ib
# grown), so 2^20 GPUs is about 7 GB a worker: beyond it a worker would be killed.
MAX_SIZING_GPUS = 2**20


# the sizing's recovery flags that set a Policy's fields: (flag, field, whether a time)
SIZING_POLICY = (("checkpoint_interval", "interval_s", True), ("async_save", "async_save", False))
SIZING_POLICY += (("spares", "spares", False), ("spare_target", "spare_target", False))


def _policy(failures: dict[str, Any]) -> Policy | None:
    """The sizing's recovery Policy from its flags (None: --recovery none, ideal only), each
    bad value, or one the recovery would ignore, refused naming its flag."""
    from commsim.reliability.recovery import STRATEGIES, Policy

    recovery = failures["recovery"]
    known = recovery in (None, "none", *STRATEGIES)
    refuse("recovery", recovery, "" if known else f"must be one of {', '.join(STRATEGIES)}, none")
    if recovery == "none":
        for key, value in failures.items():
            if key != "recovery" and value is not None:
                refuse(key, value, "--recovery none prices no failures")
        return None
    strategy = recovery or "cold"
    return Policy(strategy=strategy, **policy_fields(failures, SIZING_POLICY, (strategy,)))


def size_clusters_cmd(
    scenario: str | None,
    model: str | None,
    cluster: str | None,
    gpus: str | None,
    overrides: dict[str, Any],
    pins: set[str],
    failures: dict[str, Any],
    json_out: bool,
    *,
    fabric: str | None,
    gpu: str | None,
    deadline: str | None,
    budget: float | None,
    objective: str,
    plot: str | None,
    html: str | None,
    csv: str | None,
) -> None:
    """`commsim plan` in sizing mode: best strategy per fabric and size, its goodput, the
    Pareto front, the pick."""
    from commsim.planner.sizing import OBJECTIVES, pareto_front
    from commsim.report.sweeps import plot_sizing
    from commsim.scenario import load_scenario
    from commsim.specs import SpecError

    given = overrides | {"model": model, "cluster": cluster}
    named = given | {"fabric": fabric, "gpu": gpu}  # a bad fabric or GPU is the flag's fault
    with terminal.user_errors(), blame_flags(scenario, named):
        known = objective in OBJECTIVES
        refuse("objective", objective, "" if known else f"must be one of {', '.join(OBJECTIVES)}")
        deadline_s, budget = _limits(deadline, budget)
        policy = _policy(failures)
        spec, source = load_scenario(scenario, given)
        if spec.tokens is None:
            raise SpecError(source, "tokens", "cluster sizing needs the training tokens (--tokens)")
        fabrics = _fabrics(fabric, cluster, spec)
        sizes = gpu_sizes(gpus, spec.gpus)
        _check_sizes(sizes, spec, source, pins)
        rows = _sized(spec, source, fabrics, sizes, gpu, policy, pins)
        front = pareto_front(rows)
        pick = _pick(rows, deadline_s, budget, objective)
        title = _sizing_title(spec, gpu)
        if plot:
            plot_sizing(rows, front, pick, plot, title, deadline_s)
        plan_show.write_sizing(rows, front, pick, title, deadline_s, csv, html, given)
    why = (
        "the smallest cluster meeting the deadline"
        if deadline_s
        else "the fastest within the budget"
        if budget
        else f"the best {objective}"
    )
    _print_sizing(rows, front, pick, title, why, objective, plot, json_out)


def _fabrics(fabric: str | None, cluster: str | None, spec: Any) -> list[str]:
    """--fabric's topologies, else the scenario's cluster; a name given twice (its rows
    twice over) or --cluster beside --fabric (which would ignore it) is refused."""
    if fabric is None:
        return [spec.cluster if isinstance(spec.cluster, str) else spec.cluster.name]
    names = [f.strip() for f in fabric.split(",")]
    twice = sorted({n for n in names if n and names.count(n) > 1})
    refuse("fabric", fabric, f"{', '.join(twice)} named twice" if twice else "")
    if cluster is not None:
        refuse("cluster", cluster, "sizing runs on the --fabric topologies: name it there")
    return names


def _limits(deadline: str | None, budget: float | None) -> tuple[float | None, float | None]:
    """--deadline in seconds and --budget, each positive when given."""
    deadline_s = flag_time("deadline", deadline) if deadline is not None else None
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"--deadline {deadline}: must be a positive time (e.g. 30d)")
    if budget is not None and not 0 < budget < float("inf"):
        raise ValueError(f"--budget {budget:g}: must be a positive, finite amount")
    return deadline_s, budget


def _check_sizes(sizes: list[int], spec: Any, source: str, pins: set[str]) -> None:
    """Refuse, before any work, pins the model cannot take at any size (check_pins)
    and a size no layout can use: more GPUs than global batch x attention heads x layers
    (dp <= global batch, tp divides the heads, pp <= layers), or than MAX_SIZING_GPUS."""
    from commsim.scenario import check_pins
    from commsim.workload.presets import build_workload

    w = build_workload(spec.model, spec.seq_len, source)
    check_pins(w, spec.strategy, pins, source)
    blocks = w.blocks
    most = spec.global_batch * (w.heads or 1) * max(blocks, 1)
    if sizes[-1] > min(most, MAX_SIZING_GPUS):
        why = (
            f"no layout of {w.name} at global batch {spec.global_batch} uses more than "
            f"{most:,} (global batch x heads x layers)"
            if most < MAX_SIZING_GPUS
            else f"commsim sizes clusters up to {MAX_SIZING_GPUS:,} GPUs"
        )
        raise ValueError(f"--gpus: {sizes[-1]:,} GPUs: {why}")


def _sized(
    spec: Any,
    source: str,
    fabrics: list[str],
    sizes: list[int],
    gpu: str | None,
    policy: Policy | None,
    pins: set[str],
) -> list[SizingRow]:
    """The sizing rows (planner.sizing); a worker that dies is one line, exit 1."""
    from concurrent.futures.process import BrokenProcessPool

    from commsim.planner.sizing import size_clusters

    with terminal.progress(len(fabrics) * len(sizes), "sizing") as bar:
        try:
            return size_clusters(
                spec, source, fabrics, sizes, gpu, lambda: bar.advance(0), policy, pins
            )
        except BrokenProcessPool:
            terminal.error_line(
                f"a sizing worker died (out of memory?) while sizing {sizes[0]:,} to "
                f"{sizes[-1]:,} GPUs: try a smaller --gpus range"
            )
            raise typer.Exit(1) from None


def _pick(
    rows: list[SizingRow], deadline_s: float | None, budget: float | None, objective: str
) -> SizingRow | None:
    """The row a deadline or budget picks, else the best by the objective; None if none."""
    from commsim.planner.sizing import objective_value, pick_size

    if deadline_s is not None or budget is not None:
        return pick_size(rows, deadline_s, budget)
    return min(
        (r for r in rows if r.best),
        key=lambda r: objective_value(r, objective),
        default=None,
    )


def _print_sizing(
    rows: list[SizingRow],
    front: list[SizingRow],
    pick: SizingRow | None,
    title: str,
    why: str,
    objective: str,
    plot: str | None,
    json_out: bool,
) -> None:
    """The sizing table and the pick with why, or the --json document."""
    from commsim.report import labels, tables

    if json_out:
        terminal.print_json(
            {
                "sizing": [r.to_dict() for r in rows],
                "pareto": [r.to_dict() for r in front],
                "pick": pick.to_dict() if pick else None,
                "objective": objective,
            }
        )
        return
    for table in tables.sizing_tables(rows, front, pick, title):
        terminal.console.print(table)
    if pick:
        terminal.console.print(
            f"pick: {pick.gpus:,} GPUs of {pick.fabric}, {why}: "
            f"{labels.describe_strategy(pick.best.to_dict()['strategy'])}",
            highlight=False,
        )
    elif not any(r.best for r in rows):
        terminal.console.print("no size has a layout that runs (why: each size's row)")
    else:
        terminal.console.print("no cluster meets the deadline/budget", highlight=False)
    if plot:
        terminal.console.print(f"scaling curve and Pareto front drawn to {plot}", highlight=False)
