"""Goodput across cluster sizes: where adding GPUs stops shortening the time to train.

The ideal time to train falls as the cluster grows (until the layout stops scaling); the
job's interruption rate grows with its parts, so goodput falls. Time to train with goodput
= ideal / goodput, and GPU-hours count the spare nodes too. A size is worth it while
doubling the GPUs still shortens that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from commsim.reliability.adapter import predict_step
from commsim.reliability.goodput import GoodputReport, expected_goodput
from commsim.reliability.rates import Rates
from commsim.reliability.recovery import Policy
from commsim.scenario import Setup, check_layout, resolve
from commsim.specs import ClusterSpec, Scenario, SpecError
from commsim.step.prediction import Prediction


@dataclass(frozen=True)
class SizePoint:
    """One cluster size: its predicted step and its goodput (None, with a note, when the
    layout does not divide the GPUs or the batch, or the recovery does not apply)."""

    gpus: int
    prediction: Prediction | None
    report: GoodputReport | None
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"gpus": self.gpus, "note": self.note}
        if self.prediction is not None:
            out |= {
                "step_time_s": self.prediction.step_time_s,
                "layout": self.prediction.layout,
                "strategy": self.prediction.strategy.model_dump(),
            }
        if self.report is not None:
            out |= self.report.to_dict()
        return out


def grown_setup(scenario: Scenario, source: str, gpus: int) -> Setup:
    """The scenario at `gpus`, its cluster grown to the nodes they need (a topology used as
    a template, as `commsim plan` sizing grows it); the layout is checked."""
    spec = scenario.cluster
    if not isinstance(spec, ClusterSpec):
        from commsim import catalog
        from commsim.spec_io import load_spec

        spec = load_spec(ClusterSpec, catalog.topology_path(spec, source))
    nodes = max(spec.nodes, -(-gpus // spec.node.gpus_per_node))
    changed = scenario.model_copy(
        update={"cluster": spec.model_copy(update={"nodes": nodes}), "gpus": gpus}
    )
    setup = resolve(changed, source, check=False)
    check_layout(setup, scenario.strategy)
    return setup


def size_point(
    setup: Setup, policy: Policy, prediction: Prediction | None = None, rates: Rates | None = None
) -> SizePoint:
    """Goodput of one size (the setup's strategy predicted unless a prediction is given)."""
    prediction = prediction or predict_step(setup)
    try:
        report = expected_goodput(prediction, setup, policy, rates)
    except ValueError as e:
        return SizePoint(setup.n_gpus, prediction, None, str(e))
    return SizePoint(setup.n_gpus, prediction, report)


def goodput_sizes(
    scenario: Scenario, source: str, sizes: Sequence[int], policy: Policy, rates=None
) -> list[SizePoint]:
    """The scenario's layout at every size, with goodput under the policy."""
    points = []
    for n in sizes:
        try:
            setup = grown_setup(scenario, source, n)
        except SpecError as e:
            points.append(SizePoint(n, None, None, e.problem))
            continue
        points.append(size_point(setup, policy, rates=rates))
    return points


def knee(points: Sequence[SizePoint]) -> dict[str, object]:
    """knee_of the points that have a report."""
    return knee_of([(p.gpus, p.report) for p in points if p.report])


def knee_of(rows: Sequence[tuple[int, GoodputReport]]) -> dict[str, object]:
    """Where the time to train is shortest, ideal and with goodput, and what each step up in
    size still buys (ideal and with-goodput speed-up over the previous size). `rows` are
    (GPUs, report) in increasing size; rows without a time to train are left out."""
    ok = [(n, r) for n, r in rows if r is not None and r.time_to_train_s]
    if not ok:
        return {"fastest_gpus": None, "ideal_fastest_gpus": None, "speedups": []}
    fastest = min(ok, key=lambda x: x[1].time_to_train_s)
    ideal = min(ok, key=lambda x: x[1].ideal_time_to_train_s)
    speedups = [
        {
            "from_gpus": na,
            "to_gpus": nb,
            "ideal": a.ideal_time_to_train_s / b.ideal_time_to_train_s,
            "with_goodput": a.time_to_train_s / b.time_to_train_s,
        }
        for (na, a), (nb, b) in zip(ok, ok[1:], strict=False)
    ]
    return {"fastest_gpus": fastest[0], "ideal_fastest_gpus": ideal[0], "speedups": speedups}
