"""`commsim plan` in sizing mode: a range of GPU counts or several fabrics, the best layout
of each (planner.sizing), the Pareto front of time against cost, and the pick a deadline,
a budget or an objective makes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from commsim.cli import plan_show
from commsim.cli.options import blame_flags
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.sizing import SizingRow


def _sizing_title(spec, gpu: str | None) -> str:
    model = spec.model if isinstance(spec.model, str) else spec.model.name
    return (
        f"cluster sizing: {model}, {spec.tokens / 1e9:,.4g}B tokens, global batch "
        f"{spec.global_batch}" + (f", {gpu}" if gpu else "")
    )


def gpu_count(text: str | None) -> int | None:
    """--gpus as a count (None when not given)."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--gpus must be a positive count or LOW:HIGH, not {text!r}")
    return int(text)


def gpu_sizes(text: str | None, default: int) -> list[int]:
    """'256:16384' as 256, 512, ..., 16384; a single count as itself."""
    if text is None:
        return [default]
    lo, _, hi = text.partition(":")
    low, high = gpu_count(lo), gpu_count(hi or lo)
    if high < low:
        raise ValueError(f"--gpus {text}: HIGH must not be below LOW")
    sizes = [low]
    while sizes[-1] * 2 <= high:
        sizes.append(sizes[-1] * 2)
    return sizes


# The largest size a sweep may ask for: every size builds its cluster graph in a worker, and
# a 262,144-GPU graph took 1.8 GB and 16 s to build on this 2-core machine (dgx-h100-ib
# grown), so 2^20 GPUs is about 7 GB a worker: beyond it a worker would be killed.
MAX_SIZING_GPUS = 2**20


def size_clusters_cmd(
    scenario: str | None,
    model: str | None,
    cluster: str | None,
    gpus: str | None,
    overrides: dict[str, Any],
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
    """`commsim plan` in sizing mode: best strategy per fabric and size, Pareto front, pick."""
    from commsim.planner.sizing import OBJECTIVES, pareto_front
    from commsim.report.sweeps import plot_sizing
    from commsim.scenario import load_scenario
    from commsim.specs import SpecError

    given = overrides | {"model": model, "cluster": cluster}
    with terminal.user_errors(), blame_flags(scenario, given):
        if objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        deadline_s, budget = _limits(deadline, budget)
        spec, source = load_scenario(scenario, given)
        if spec.tokens is None:
            raise SpecError(source, "tokens", "cluster sizing needs the training tokens (--tokens)")
        fabrics = (
            [f.strip() for f in fabric.split(",")]
            if fabric
            else [spec.cluster if isinstance(spec.cluster, str) else spec.cluster.name]
        )
        sizes = gpu_sizes(gpus, spec.gpus)
        _check_sizes(sizes, spec, source)
        rows = _sized(spec, source, fabrics, sizes, gpu)
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


def _limits(deadline: str | None, budget: float | None) -> tuple[float | None, float | None]:
    """--deadline in seconds and --budget, each positive when given."""
    from commsim.units import parse_time

    deadline_s = parse_time(deadline) if deadline is not None else None
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"--deadline {deadline}: must be a positive time (e.g. 30d)")
    if budget is not None and not 0 < budget < float("inf"):
        raise ValueError(f"--budget {budget:g}: must be a positive, finite amount")
    return deadline_s, budget


def _check_sizes(sizes: list[int], spec: Any, source: str) -> None:
    """Refuse, before any work, a size no layout can use: more GPUs than global batch x
    attention heads x layers (dp <= global batch, tp divides the heads, pp <= layers), or
    than MAX_SIZING_GPUS."""
    from commsim.workload.presets import build_workload

    w = build_workload(spec.model, spec.seq_len, source)
    blocks = sum(layer.name.startswith("block.") for layer in w.layers)
    most = spec.global_batch * (w.heads or 1) * max(blocks, 1)
    if sizes[-1] > min(most, MAX_SIZING_GPUS):
        why = (
            f"no layout of {w.name} at global batch {spec.global_batch} uses more than "
            f"{most:,} (global batch x heads x layers)"
            if most < MAX_SIZING_GPUS
            else f"commsim sizes clusters up to {MAX_SIZING_GPUS:,} GPUs"
        )
        raise ValueError(f"--gpus: {sizes[-1]:,} GPUs: {why}")


def _sized(spec: Any, source: str, fabrics: list[str], sizes: list[int], gpu: str | None):
    """The sizing rows (planner.sizing); a worker that dies is one line, exit 1."""
    from concurrent.futures.process import BrokenProcessPool

    from commsim.planner.sizing import size_clusters

    with terminal.progress(len(fabrics) * len(sizes), "sizing") as bar:
        try:
            return size_clusters(
                spec, source, fabrics, sizes, gpu, on_progress=lambda: bar.advance(0)
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
    terminal.console.print(tables.sizing_table(rows, front, pick, title))
    if pick:
        terminal.console.print(
            f"pick: {pick.gpus:,} GPUs of {pick.fabric}, {why}: "
            f"{labels.describe_strategy(pick.best.to_dict()['strategy'])}",
            highlight=False,
        )
    else:
        terminal.console.print("no cluster meets the deadline/budget", highlight=False)
    if plot:
        terminal.console.print(f"scaling curve and Pareto front drawn to {plot}", highlight=False)
