"""`commsim goodput`: the cluster as it behaves under failures.

A scenario's mean time to interruption, checkpoint interval, restart cost, goodput and
badput under one recovery strategy or all of them side by side; with --gpus LOW:HIGH the
same across cluster sizes (time to train ideal and with failures).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.given import pick
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
    overrides,
)
from commsim.cli.stragglers import stragglers_cmd
from commsim.files import check_output
from commsim.reliability.recovery import STRATEGIES, Policy
from commsim.report import terminal
from commsim.units import parse_time

if TYPE_CHECKING:
    from commsim.scenario import Setup

GpusOpt = Annotated[str | None, Opt(help="GPU count, or LOW:HIGH to sweep sizes (doubling).")]
# goodput's flags that set scenario fields, and those that set the recovery Policy (_policy)
SCENARIO_FLAGS = (*SHARED_FLAGS, "zero", "tokens", "price_per_gpu_hour")
POLICY_FLAGS = ("interval", "async_save", "spares", "spare_target", "detect", "reschedule")
POLICY_FLAGS += ("warmup", "init")


def _policy(recovery, interval, async_save, spares, spare_target, detect, reschedule, warmup, init):
    """The recovery `recovery` with the flags' checkpointing, spares and times (parsed)."""
    return Policy(
        strategy=recovery,
        interval_s=parse_time(interval) if interval else None,
        async_save=async_save,
        spares=spares,
        spare_target=spare_target,
        detect_s=parse_time(detect),
        reschedule_s=parse_time(reschedule),
        warmup_s=parse_time(warmup),
        init_s=parse_time(init) if init else None,
    )


def _rates(setup: Setup, rate_scale: float, repair: str | None):
    """The cluster's failure rates, scaled by --rate-scale, with --repair's repair time."""
    from commsim.reliability.rates import rates_for

    if rate_scale < 0:
        raise ValueError(f"--rate-scale must not be negative, got {rate_scale}")
    rates = rates_for(setup.cluster.spec).scaled(rate_scale)
    return dataclasses.replace(rates, repair_s=parse_time(repair)) if repair else rates


def goodput_cmd(
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

    with terminal.user_errors():
        check_output(plot, "--plot", image=True)
        spec, source, sizes, policies = _inputs(args)
        if len(sizes) > 1 or (gpus and ":" in gpus):
            return _sizing(spec, source, sizes, policies, rate_scale, repair, plot, json_out)
        setup = resolve(spec.model_copy(update={"gpus": sizes[0]}), source)
        rates = _rates(setup, rate_scale, repair)
        doc, title = _one_size(setup, policies, rates, monte_carlo, seed)
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
    if recovery != "all" and recovery not in STRATEGIES:
        raise ValueError(f"--recovery must be one of {', '.join(STRATEGIES)} or all")
    spec, source = load_scenario(args["scenario"], overrides(**pick(args, SCENARIO_FLAGS)))
    sizes = gpu_sizes(args["gpus"], spec.gpus)
    names = STRATEGIES if recovery == "all" else (recovery,)
    return spec, source, sizes, [_policy(n, **pick(args, POLICY_FLAGS)) for n in names]


def _one_size(setup: Setup, policies, rates, monte_carlo: int, seed: int):
    """goodput of one cluster size under each recovery policy (those that do not apply are
    skipped with their reason), with a Monte-Carlo check of each when asked; the JSON
    document and the table's title."""
    from commsim.reliability import goodput as gp
    from commsim.reliability import stragglers
    from commsim.reliability.montecarlo import simulate

    prediction = stragglers.predict_step(setup)
    reports, skipped, checks = [], {}, {}
    for policy in policies:
        try:
            model = gp.model_for(prediction, setup, policy, rates)
        except ValueError as e:
            skipped[policy.strategy] = str(e)
            continue
        reports.append(gp.report(model).to_dict())
        if monte_carlo:
            sim = simulate(model, 30 * 86400.0, runs=monte_carlo, seed=seed)
            checks[policy.strategy] = {"goodput": sim.goodput, "failures": sim.failures}
    if not reports:
        raise ValueError("no recovery applies: " + "; ".join(skipped.values()))
    title = (
        f"{setup.scenario.name}: {setup.workload.name} on {setup.n_gpus:,} GPUs of "
        f"{setup.cluster.spec.name}, step {prediction.step_time_s:.3g} s"
    )
    doc = {
        "scenario": setup.scenario.name,
        "gpus": setup.n_gpus,
        "step_time_s": prediction.step_time_s,
        "reports": reports,
        "skipped": skipped,
        "monte_carlo": checks,
    }
    return doc, title


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
    """goodput across cluster sizes, one recovery at a time (the first given)."""
    from commsim.reliability import sizing
    from commsim.report import goodput as out
    from commsim.specs import SpecError

    with terminal.user_errors():
        if spec.tokens is None:
            raise SpecError(source, "tokens", "a size sweep needs the training tokens (--tokens)")
        policy = policies[0] if len(policies) == 1 else Policy("cold")
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
        model = spec.model if isinstance(spec.model, str) else spec.model.name
        title = (
            f"goodput by cluster size: {model}, {spec.tokens:.3g} tokens, "
            f"{policy.strategy} recovery"
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
