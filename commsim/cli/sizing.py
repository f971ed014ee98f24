"""`commsim plan` in sizing mode: the best layout per fabric and cluster size, its goodput
under failures, the Pareto front of time to train against cost, and the pick."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commsim.cli.options import gpu_sizes
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.sizing import SizingRow


def _sizing_title(spec, gpu: str | None) -> str:
    model = spec.model if isinstance(spec.model, str) else spec.model.name
    return (
        f"cluster sizing: {model}, {spec.tokens:.3g} tokens, global batch "
        f"{spec.global_batch}" + (f", {gpu}" if gpu else "")
    )


def _policy(recovery, interval, async_save, spares, spare_target):
    """The sizing's recovery Policy from its flags (None: --recovery none, ideal only)."""
    from commsim.reliability.recovery import Policy
    from commsim.units import parse_time

    if recovery == "none":
        return None
    return Policy(
        strategy=recovery or "cold",
        interval_s=parse_time(interval) if interval else None,
        async_save=bool(async_save),
        spares=spares,
        spare_target=0.999 if spare_target is None else spare_target,
    )


def size_clusters_cmd(
    scenario: str | None,
    model: str | None,
    cluster: str | None,
    gpus: str | None,
    overrides: dict[str, Any],
    pins: set[str],
    failures: dict[str, Any],
    plot: str | None,
    json_out: bool,
    *,
    fabric: str | None,
    gpu: str | None,
    deadline: str | None,
    budget: float | None,
    objective: str,
) -> None:
    """`commsim plan` in sizing mode: best strategy per fabric and size, Pareto front, pick."""
    from commsim.planner.sizing import OBJECTIVES, pareto_front, size_clusters
    from commsim.report import plots
    from commsim.scenario import load_scenario
    from commsim.specs import SpecError
    from commsim.units import parse_time

    with terminal.user_errors():
        if objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        spec, source = load_scenario(scenario, overrides | {"model": model, "cluster": cluster})
        if spec.tokens is None:
            raise SpecError(source, "tokens", "cluster sizing needs the training tokens (--tokens)")
        fabrics = (
            [f.strip() for f in fabric.split(",")]
            if fabric
            else [spec.cluster if isinstance(spec.cluster, str) else spec.cluster.name]
        )
        sizes = gpu_sizes(gpus, spec.gpus)
        deadline_s = parse_time(deadline) if deadline else None
        policy = _policy(**failures)
        with terminal.progress(len(fabrics) * len(sizes), "sizing") as bar:
            rows = size_clusters(
                spec, source, fabrics, sizes, gpu, lambda: bar.advance(0), policy, pins
            )
        front = pareto_front(rows)
        pick = _pick(rows, deadline_s, budget, objective)
        if plot:
            plots.plot_sizing(rows, front, pick, plot, _sizing_title(spec, gpu))
    why = (
        "the smallest cluster meeting the deadline"
        if deadline_s
        else "the fastest within the budget"
        if budget
        else f"the best {objective}"
    )
    _print_sizing(rows, front, pick, _sizing_title(spec, gpu), why, objective, plot, json_out)


def _pick(
    rows: list[SizingRow], deadline_s: float | None, budget: float | None, objective: str
) -> SizingRow | None:
    """The row a deadline or budget picks, else the best by the objective; None if none."""
    from commsim.planner.sizing import objective_value, pick_size

    if deadline_s or budget:
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
    terminal.console.print(tables.sizing_table(rows, front, pick, title))
    if pick:
        terminal.console.print(
            f"pick: {pick.gpus} GPUs of {pick.fabric}, {why}: "
            f"{labels.describe_strategy(pick.best.to_dict()['strategy'])}",
            highlight=False,
        )
    else:
        terminal.console.print("no cluster meets the deadline/budget", highlight=False)
    if plot:
        terminal.console.print(f"scaling curve and Pareto front drawn to {plot}")
