"""`commsim stragglers`: a slow rank, a degraded link and per-rank jitter, and what each
mitigation (drop, rebalance, async, local SGD, hierarchical fallback) leaves."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.given import blame_flags, pick
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
    naming,
    overrides,
    refuse,
    typed,
)
from commsim.report import terminal
from commsim.units import fmt_duration, fmt_gpus

if TYPE_CHECKING:
    from commsim.scenario import Setup

STRAGGLER_FLAGS = (*SHARED_FLAGS, "gpus")  # the flags that set scenario fields


@dataclasses.dataclass(frozen=True)
class Upsets:
    """What stragglers_cmd's flags make go wrong, a field a flag (named as it): one rank
    `slow_rank` times slower for `duration`, per-rank `jitter` (DIST:CV) synchronised every
    step and every `local_steps` (local SGD), `link` (None: none) at 1/`link_factor`."""

    slow_rank: float
    duration: str
    jitter: str
    local_steps: int
    link: str | None
    link_factor: float

    def __post_init__(self) -> None:
        """Each value checked before any work, refused naming its flag."""
        from commsim.reliability.jitter import spread_problem
        from commsim.reliability.stragglers import slower_problem

        refuse("slow_rank", self.slow_rank, slower_problem(self.slow_rank))
        refuse("link_factor", self.link_factor, slower_problem(self.link_factor))
        refuse("duration", self.duration, "" if self.duration_s > 0 else "must be positive")
        steps = "" if self.local_steps >= 1 else "at least 1 step between syncs"
        refuse("local_steps", self.local_steps, steps)
        refuse("link", self.link, "give a link as A:B (see topo show)" if self.link == "" else "")
        refuse("jitter", self.jitter, spread_problem(*self.spread))

    @property
    def duration_s(self) -> float:
        return flag_time("duration", self.duration)

    @property
    def spread(self) -> tuple[str, float]:
        """--jitter's distribution and coefficient of variation (DIST alone: cv 0.05)."""
        dist, sep, text = self.jitter.partition(":")
        with naming("jitter", self.jitter):
            try:
                return dist, float(text) if sep else DEFAULT_CV
            except ValueError:
                raise ValueError(f"the CV {text!r} is not a number (DIST:CV)") from None


UPSET_FLAGS = tuple(f.name for f in dataclasses.fields(Upsets))
DEFAULT_CV = 0.05  # --jitter DIST without a CV: the default's


def stragglers_cmd(
    ctx: typer.Context,
    scenario: ScenarioArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: Annotated[int | None, Opt(help="GPU count.")] = None,
    global_batch: GlobalBatchOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    slow_rank: Annotated[float, Opt(help="One rank's compute this many times slower.")] = 1.2,
    duration: Annotated[str, Opt(help="How long the slow rank lasts (Falcon: s to ~10 h).")] = "1h",
    link: Annotated[
        str | None, Opt(help="A link to degrade, both directions: leaf0:spine0 (see topo show).")
    ] = None,
    link_factor: Annotated[float, Opt(help="The link carries 1/this of its bandwidth.")] = 4.0,
    jitter: Annotated[
        str, Opt(help="Per-rank jitter DIST:CV (normal, lognormal, exponential).")
    ] = "normal:0.05",
    local_steps: Annotated[int, Opt(help="Local SGD: steps between syncs.")] = 8,
    json_out: terminal.JsonOpt = False,
) -> None:
    """A slow rank, a degraded link and per-rank jitter: step time and what each mitigation
    (drop, rebalance, async, local SGD, hierarchical fallback) leaves."""
    args = locals()  # the flags as given
    from commsim.report import goodput as out
    from commsim.scenario import load_scenario, resolve

    given = overrides(**pick(args, STRAGGLER_FLAGS))
    with terminal.user_errors(), blame_flags(scenario, given):
        upsets = Upsets(**pick(args, UPSET_FLAGS))
        alone = upsets.link is None and typed(ctx, "link_factor")
        refuse("link_factor", link_factor, "degrades a --link; none given" if alone else "")
        spec, source = load_scenario(scenario, given)
        setup = resolve(spec, source)
        edges = None if upsets.link is None else _link_edges(setup, upsets.link)
        doc = _stragglers_doc(setup, upsets)
        if edges is not None:
            doc["link"] = _link(setup, doc["prediction"], edges, upsets.link_factor)
        terminal.require_finite(doc, "--slow-rank, --jitter and --link-factor")
    prediction = doc.pop("prediction")
    if json_out:
        terminal.print_json(doc)
        return
    title = (
        f"{setup.scenario.name}: one rank {upsets.slow_rank:g}x slower for "
        f"{fmt_duration(upsets.duration_s)} on "
        f"{fmt_gpus(setup.n_gpus)}: step {prediction.step_time_s:.3g} s -> "
        f"{doc['slow_rank']['step_time_s']:.3g} s"
    )
    terminal.console.print(out.straggler_table(title, doc["slow_rank"]["mitigations"]))
    _print_jitter(doc["jitter"], setup.n_gpus)
    if upsets.link is not None:
        _print_link(doc["link"], upsets)


def _stragglers_doc(setup: Setup, upsets: Upsets) -> dict[str, Any]:
    """The step with one slow rank and what each mitigation leaves, and per-rank jitter's
    cost synchronised and with local SGD; `prediction` holds the healthy step."""
    from commsim.reliability import stragglers

    duration_s, (dist, cv) = upsets.duration_s, upsets.spread
    slow_rank, local_steps = upsets.slow_rank, upsets.local_steps
    p = stragglers.predict_step(setup)
    rows = [
        dataclasses.asdict(r)
        for r in stragglers.slow_rank(setup, p, slow_rank, duration_s, local_steps)
    ]
    jit = {h: stragglers.jitter(p, dist, cv, h) for h in (1, local_steps)}
    return {
        "scenario": setup.scenario.name,
        "gpus": setup.n_gpus,
        "step_time_s": p.step_time_s,
        "slow_rank": {
            "factor": slow_rank,
            "duration_s": duration_s,
            "step_time_s": stragglers.slow_rank_step(setup, p, slow_rank),
            "mitigations": rows,
        },
        "jitter": {
            "distribution": dist,
            "cv": cv,
            "sync": jit[1],
            "local_sgd": jit[local_steps],
            "local_steps": local_steps,
        },
        "prediction": p,
    }


def _print_jitter(j: dict[str, Any], gpus: int) -> None:
    """The jitter line; local SGD's figure against the synchronous step says what lifts it
    (the saved sync) beside what jitter alone costs it."""
    sgd, h = j["local_sgd"], j["local_steps"]
    local = (
        f"; local SGD every {h} steps: {sgd['throughput']:.1%} of that step, as the "
        f"data-parallel sync sent once in {h} saves {sgd['saved_sync_s']:.3g} s a step "
        f"(convergence cost not modelled), and {sgd['throughput_same_schedule']:.1%} of local "
        "SGD without jitter"
    )
    terminal.console.print(
        f"jitter {j['distribution']} cv {j['cv']:g} over {gpus:,} ranks: the slowest rank takes "
        f"{j['sync']['expected_max']:.3f}x the mean, throughput {j['sync']['throughput']:.1%} "
        "of the synchronous step without jitter" + (local if h > 1 else ""),
        highlight=False,
    )


def _print_link(lk: dict[str, Any], upsets: Upsets) -> None:
    rec = lk["hierarchical_recovers"]
    terminal.console.print(
        f"{upsets.link} at 1/{upsets.link_factor:g}: step {lk['healthy_step_s']:.3g} s -> "
        f"{lk['degraded_step_s']:.3g} s; groups crossing it: "
        + ", ".join(f"{k} {len(v)}" for k, v in lk["crossing"].items())
        + (
            f"; hierarchical fallback wins back {rec:.0%} of the ring's loss"
            if rec is not None
            else ""
        ),
        highlight=False,
    )


def _link_edges(setup: Setup, link: str) -> list[int]:
    """--link's two directed edges in the job's cluster (checked before any work)."""
    a, sep, b = link.partition(":")
    names = setup.cluster.names
    ids = [i for i, n in enumerate(names) if n in (f"{a}->{b}", f"{b}->{a}")]
    if not sep or not ids:
        raise ValueError(
            f"--link {link!r}: no such link in the job's cluster (e.g. "
            f"{names[-1].replace('->', ':')})"
        )
    return ids


def _link(setup: Setup, prediction, edges: list[int], factor: float) -> dict[str, Any]:
    """--link's `edges` at 1/--link-factor of their bandwidth: the step, the groups crossing
    them, what the hierarchical fallback wins back."""
    from commsim.reliability import stragglers

    report = stragglers.degraded_link(setup, prediction, edges, factor)
    return dataclasses.asdict(report) | {"hierarchical_recovers": report.hierarchical_recovers}
