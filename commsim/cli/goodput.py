"""`commsim goodput`: the cluster as it behaves under failures.

A scenario's mean time to interruption, checkpoint interval, restart cost, goodput and
badput under one recovery strategy or all of them side by side; with --gpus LOW:HIGH the
same across cluster sizes (time to train ideal and with failures).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.given import blame_flags, pick
from commsim.cli.options import gpu_sizes
from commsim.cli.reliability_flags import (
    SHARED_FLAGS,
    ClusterOpt,
    GlobalBatchOpt,
    MicroBatchOpt,
    ModelOpt,
    Opt,
    PpOpt,
    ScenarioArg,
    SeqLenOpt,
    TpOpt,
    flag_time,
    overrides,
    policy_fields,
    refuse,
    typed,
)
from commsim.cli.stragglers import stragglers_cmd
from commsim.files import check_output
from commsim.reliability.recovery import STRATEGIES, Policy
from commsim.report import terminal
from commsim.units import fmt_gpus

if TYPE_CHECKING:
    from commsim.scenario import Setup

GpusOpt = Annotated[str | None, Opt(help="GPU count, or LOW:HIGH to sweep sizes (doubling).")]
# goodput's flags that set scenario fields, and those that set a recovery Policy's fields:
# (flag, field, whether a time)
SCENARIO_FLAGS = (*SHARED_FLAGS, "zero", "tokens", "price_per_gpu_hour")
POLICY_FIELDS = (("interval", "interval_s", True), ("async_save", "async_save", False))
POLICY_FIELDS += (("spares", "spares", False), ("spare_target", "spare_target", False))
POLICY_FIELDS += tuple((k, f"{k}_s", True) for k in ("detect", "reschedule", "warmup", "init"))
POLICY_FLAGS = tuple(key for key, _, _ in POLICY_FIELDS)


def _policies(names: tuple[str, ...], flags: dict[str, Any]) -> list[Policy]:
    """The recoveries `names` with the flags' checkpointing, spares and times (parsed, each
    refused naming its flag)."""
    fields = policy_fields(flags, POLICY_FIELDS, names)
    return [Policy(strategy=n, **fields) for n in names]


def _rates(setup: Setup, rate_scale: float, repair: str | None):
    """The cluster's failure rates, scaled by --rate-scale, with --repair's repair time."""
    from commsim.reliability.rates import rates_for

    scale = "" if 0 < rate_scale < math.inf else "must be a positive, finite factor"
    refuse("rate_scale", rate_scale, scale)
    rates = rates_for(setup.cluster.spec).scaled(rate_scale)
    return dataclasses.replace(rates, repair_s=flag_time("repair", repair)) if repair else rates


def _check_simulation(ctx: typer.Context, monte_carlo: int, seed: int, sweep: bool) -> None:
    """--monte-carlo's runs (0: none) check one size's goodput, seeded by --seed: neither
    is taken and ignored by a size sweep, nor --seed without runs."""
    refuse("monte_carlo", monte_carlo, "must not be negative" if monte_carlo < 0 else "")
    refuse("seed", seed, "must not be negative (numpy's seeds)" if seed < 0 else "")
    for key, value in (("monte_carlo", monte_carlo), ("seed", seed)):
        if sweep and typed(ctx, key):
            refuse(
                key, value, "applies to one size's Monte-Carlo check, not a --gpus LOW:HIGH sweep"
            )
    if not sweep and not monte_carlo and typed(ctx, "seed"):
        refuse("seed", seed, "seeds the --monte-carlo runs; none asked for")


def goodput_cmd(
    ctx: typer.Context,
    scenario: ScenarioArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: GpusOpt = None,
    global_batch: GlobalBatchOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    zero: Annotated[int | None, Opt("--zero", help="ZeRO stage.")] = None,
    tokens: Annotated[float | None, Opt(help="Training tokens (time to train).")] = None,
    price_per_gpu_hour: Annotated[float | None, Opt(help="Price of a GPU-hour.")] = None,
    recovery: Annotated[
        str, Opt(help=f"Recovery: {', '.join(STRATEGIES)}, or all (side by side).")
    ] = "all",
    interval: Annotated[
        str | None, Opt(help="Checkpoint interval (10min); default: the optimum.")
    ] = None,
    async_save: Annotated[
        bool, Opt("--async-save/--sync-save", help="Asynchronous checkpoint writes.")
    ] = False,
    spares: Annotated[
        int | None, Opt(help="Hot spare nodes; default: enough for --spare-target.")
    ] = None,
    spare_target: Annotated[
        float, Opt(help="Probability the job stays at full size (picks the spares).")
    ] = 0.999,
    repair: Annotated[str | None, Opt(help="Node repair time (72h by default).")] = None,
    detect: Annotated[str, Opt(help="Time to notice a failure.")] = "10s",
    reschedule: Annotated[str, Opt(help="Time to get a replacement node.")] = "5min",
    warmup: Annotated[str, Opt(help="Process start, data loaders, first steps.")] = "60s",
    init: Annotated[
        str | None, Opt(help="Communicator set-up of the whole job (default: 265 s at 96k GPUs).")
    ] = None,
    rate_scale: Annotated[float, Opt(help="Multiply every failure rate (what-if).")] = 1.0,
    monte_carlo: Annotated[
        int, Opt(help="Also simulate this many runs of 30 days (check the model).")
    ] = 0,
    seed: Annotated[int, Opt(help="Seed of the simulation.")] = 0,
    plot: Annotated[str | None, Opt(help="PNG: badput per strategy, or goodput vs GPUs.")] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Goodput under failures: MTTI, checkpoint interval (Young, Daly, optimum), restart,
    badput breakdown, spares, and time to train and cost with failures next to the ideal."""
    args = locals()  # the flags as given
    from commsim.report import goodput as out
    from commsim.scenario import resolve

    given = overrides(**pick(args, (*SCENARIO_FLAGS, "gpus")))
    with terminal.user_errors(), blame_flags(scenario, given):
        check_output(plot, "--plot", image=True)
        spec, source, sizes, policies = _inputs(args)
        sweep = len(sizes) > 1 or ":" in (gpus or "")
        _check_simulation(ctx, monte_carlo, seed, sweep)
        if sweep:
            return _sizing(spec, source, sizes, policies, rate_scale, repair, plot, json_out)
        setup = resolve(spec.model_copy(update={"gpus": sizes[0]}), source)
        rates = _rates(setup, rate_scale, repair)
        doc, title = _one_size(setup, policies, rates, monte_carlo, seed)
        terminal.require_finite(doc, "--rate-scale, --tokens and --price-per-gpu-hour")
        if plot:
            out.plot_badput(doc["reports"], plot, title)
    if json_out:
        terminal.print_json(doc)
        return
    _print_goodput(doc, title, plot)


def _inputs(args: dict[str, Any]) -> tuple[Any, str, list[int], list[Policy]]:
    """(the scenario with goodput_cmd's flags applied, its source, the --gpus sizes, the
    Policy of each --recovery strategy: the one given, or all)."""
    from commsim.scenario import load_scenario

    recovery = args["recovery"]
    known = recovery == "all" or recovery in STRATEGIES
    refuse("recovery", recovery, "" if known else f"must be one of {', '.join(STRATEGIES)} or all")
    one = args["gpus"] if ":" not in (args["gpus"] or ":") else None  # not a LOW:HIGH sweep
    flags = pick(args, SCENARIO_FLAGS) | {"gpus": one and gpu_sizes(one, 0)[0]}
    spec, source = load_scenario(args["scenario"], overrides(**flags))  # named as changed
    sizes = gpu_sizes(args["gpus"], spec.gpus)
    names = STRATEGIES if recovery == "all" else (recovery,)
    given = {k: v if typed(args["ctx"], k) else None for k, v in pick(args, POLICY_FLAGS).items()}
    return spec, source, sizes, _policies(names, given)


def _one_size(setup: Setup, policies, rates, monte_carlo: int, seed: int):
    """goodput of one cluster size under each recovery policy (those that do not apply are
    skipped with their reason), with a Monte-Carlo check of each when asked; the JSON
    document and the table's title."""
    from commsim.reliability import goodput as gp
    from commsim.reliability import stragglers

    prediction = stragglers.predict_step(setup)
    models, skipped = {}, {}
    for policy in policies:
        try:
            models[policy.strategy] = gp.model_for(prediction, setup, policy, rates)
        except ValueError as e:
            skipped[policy.strategy] = str(e)
    if not models:  # one policy: the --recovery given
        given = f"--recovery {policies[0].strategy}: " if len(policies) == 1 else ""
        raise ValueError(f"{given}no recovery applies: " + "; ".join(skipped.values()))
    title = (
        f"{setup.scenario.name}: {setup.workload.name} on {fmt_gpus(setup.n_gpus)} of "
        f"{setup.cluster.spec.name}, step {prediction.step_time_s:.3g} s"
    )
    doc = {
        "scenario": setup.scenario.name,
        "gpus": setup.n_gpus,
        "step_time_s": prediction.step_time_s,
        "reports": [gp.report(m).to_dict() for m in models.values()],
        "skipped": skipped,
        "monte_carlo": _simulated(models, monte_carlo, seed) if monte_carlo else {},
    }
    return doc, title


def _simulated(models: dict[str, Any], runs: int, seed: int) -> dict[str, dict[str, Any]]:
    """--monte-carlo's check: `runs` simulated 30-day runs of each recovery's model, seeded,
    under a progress bar (no bound on runs: they take constant memory, the bar shows the
    pace)."""
    from commsim.reliability.montecarlo import simulate

    checks = {}
    with terminal.progress(runs * len(models), "simulating 30-day runs") as bar:
        for name, model in models.items():
            sim = simulate(model, 30 * 86400.0, runs, seed, lambda k: bar.advance(0, k))
            checks[name] = {"goodput": sim.goodput, "failures": sim.failures}
    return checks


def _print_goodput(doc: dict[str, Any], title: str, plot: str | None) -> None:
    """The goodput table, the recoveries skipped, the Monte-Carlo checks, the assumptions."""
    from commsim.report import goodput as out

    terminal.console.print(out.goodput_table(title, doc["reports"]))
    for name, why in doc["skipped"].items():
        terminal.console.print(f"[dim]{name}: {why}[/dim]", highlight=False)
    for name, sim in doc["monte_carlo"].items():
        terminal.console.print(
            f"Monte Carlo, {name}: goodput {sim['goodput']:.2%} over {sim['failures']} "
            "simulated failures",
            highlight=False,
        )
    _assumptions(doc["reports"][0]["assumptions"], plot)


def _assumptions(lines, plot) -> None:
    terminal.console.print("assumptions:", highlight=False)
    for line in lines:
        terminal.console.print(f"  {line}", highlight=False, style="dim")
    if plot:
        terminal.console.print(f"drawn to {plot}")


def _sizing(spec, source, sizes, policies, rate_scale, repair, plot, json_out) -> None:
    """goodput across cluster sizes under one recovery: the one given, or cold (with the
    flags' checkpointing, spares and times either way). Called inside goodput_cmd's
    user_errors."""
    from commsim.reliability import sizing
    from commsim.report import goodput as out
    from commsim.specs import SpecError

    if spec.tokens is None:
        raise SpecError(source, "tokens", "a size sweep needs the training tokens (--tokens)")
    policy = next(p for p in policies if len(policies) == 1 or p.strategy == "cold")
    points = []
    for n in sizes:
        try:
            setup = sizing.grown_setup(spec, source, n)
        except SpecError as e:
            points.append(sizing.SizePoint(n, None, None, e.problem))
            continue
        points.append(sizing.size_point(setup, policy, rates=_rates(setup, rate_scale, repair)))
    knee = sizing.knee(points)
    docs = [p.to_dict() for p in points]
    terminal.require_finite({"sizing": docs}, "--rate-scale and --tokens")
    model = spec.model if isinstance(spec.model, str) else spec.model.name
    title = (
        f"goodput by cluster size: {model}, {spec.tokens:.3g} tokens, {policy.strategy} recovery"
    )
    if plot:
        out.plot_sizing(docs, plot, title)
    if json_out:
        terminal.print_json({"recovery": policy.strategy, "sizing": docs, "knee": knee})
        return
    terminal.console.print(out.sizing_table(title, docs, knee))
    if knee["fastest_gpus"]:
        terminal.console.print(
            f"fastest to train with failures: {knee['fastest_gpus']:,} GPUs "
            f"(ideal: {knee['ideal_fastest_gpus']:,})",
            highlight=False,
        )
    first = next((d for d in docs if "assumptions" in d), None)
    if first:
        _assumptions(first["assumptions"], plot)


def register(app: typer.Typer) -> None:
    """Add `goodput` and `stragglers` to the command line."""
    app.command("goodput")(goodput_cmd)
    app.command("stragglers")(stragglers_cmd)
