"""What-if analyses from Python: change any part of a scenario, predict, sweep, plot.

    from commsim import whatif
    base = whatif.load()                                        # the built-in scenario
    oversub = whatif.change(base, {"cluster.fabric.oversubscription": [3, 1]})
    whatif.predict(oversub).step_time_s
    sweep = whatif.sweep(base, "gpus", [16, 32, 64])
    sweep.plot(["step_time_s", "exposed_comm_s"])
    traced = whatif.traced(["rank0.json", "rank1.json"])      # a profiled run's compute
    whatif.predict(whatif.change(base, gpus=1024), traced)     # ... on 1,024 GPUs

Changes name scenario fields (`gpus`, `model`), strategy fields (`compression`, `tp`) as
the CLI flags do, or a dotted path into the cluster (`cluster.node.nics.bandwidth`), which
copies the named topology into the scenario first. Every change is validated like a file.
A traced workload (traces.workload) computes at the rate its profiler traces measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from commsim import catalog
from commsim.scenario import load_scenario, resolve, with_overrides
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec, Scenario, SpecError
from commsim.step.predict import predict as predict_setup
from commsim.step.prediction import Prediction
from commsim.traces.kineto import read_traces
from commsim.traces.workload import TracedWorkload, apply, read_workload

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SOURCE = "what-if"


def load(path: str | None = None, changes: Mapping[str, Any] | None = None) -> Scenario:
    """A scenario file (the built-in one when None), with `changes` applied."""
    scenario, _ = load_scenario(path, {})
    return change(scenario, changes or {})


def change(scenario: Scenario, changes: Mapping[str, Any] | None = None, **more: Any) -> Scenario:
    """The scenario with fields replaced: scenario or strategy names, or dotted cluster paths."""
    changes = {**(changes or {}), **more}
    data = scenario.model_dump(exclude_none=True)
    flat = {}
    for key, value in changes.items():
        if key.startswith("cluster."):
            if not isinstance(data["cluster"], dict):
                name = data["cluster"]
                path = catalog.topology_path(name, SOURCE)
                data["cluster"] = load_spec(ClusterSpec, path).model_dump(exclude_none=True)
            _set(data["cluster"], key.split(".")[1:], value, key)
        else:
            flat[key] = value
    return with_overrides(data, flat, SOURCE, units=False)  # a dumped scenario is in SI


def _set(tree: dict[str, Any], path: list[str], value: Any, key: str) -> None:
    for part in path[:-1]:
        if not isinstance(tree.get(part), dict):
            raise SpecError(SOURCE, key, f"{part!r} is not a section of the cluster")
        tree = tree[part]
    tree[path[-1]] = value


def traced(
    paths: Sequence[str], tp: int = 1, pp: int = 1, micro_batch: int | None = None
) -> TracedWorkload:
    """The workload of a run's profiler traces (one per rank), traced at tp x pp and
    `micro_batch` (None: each scenario's own)."""
    return read_workload(read_traces(paths), tp, pp, micro_batch)


def predict(scenario: Scenario, trace: TracedWorkload | None = None) -> Prediction:
    """Predict one step of the scenario (its layout checked as `commsim predict` does),
    computing at a traced workload's measured rate when given one."""
    setup = resolve(scenario, SOURCE)
    return predict_setup(apply(setup, trace)[0] if trace is not None else setup)


def figures(prediction: Prediction) -> dict[str, float]:
    """Every number of a prediction by its JSON name (step_time_s, exposed_comm_s, mfu, ...)."""
    return {k: float(v) for k, v in prediction.to_dict().items() if isinstance(v, (int, float))}


def _pick(flat: dict[str, float], name: str) -> float:
    if name not in flat:
        raise KeyError(f"no metric {name!r}; known: {', '.join(sorted(flat))}")
    return flat[name]


def metric(prediction: Prediction, name: str) -> float:
    """One figure of a prediction by its JSON name."""
    return _pick(figures(prediction), name)


@dataclass(frozen=True)
class Sweep:
    """Predictions of one scenario with one field taking each of `values`."""

    field: str
    values: list[Any]
    predictions: list[Prediction]

    def column(self, name: str) -> np.ndarray:
        """One metric across the sweep."""
        return np.array([metric(p, name) for p in self.predictions])

    def rows(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The sweep as records: the swept value, then each named metric."""
        out = []
        for v, p in zip(self.values, self.predictions, strict=True):
            flat = figures(p)  # one to_dict per prediction, not one per name
            out.append({self.field: v} | {n: _pick(flat, n) for n in names})
        return out

    def plot(self, names: Sequence[str], title: str = "", logx: bool = False) -> Figure:
        """The named metrics against the swept value, one line each."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6.4, 3.6), layout="constrained")
        ax = fig.add_subplot()
        numeric = all(isinstance(v, (int, float)) for v in self.values)
        x = self.values if numeric else list(range(len(self.values)))
        for name in names:
            ax.plot(x, self.column(name), marker="o", label=name)
        if not numeric:
            ax.set_xticks(x, [str(v) for v in self.values])
        if logx and numeric:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(self.field)
        ax.set_title(title or f"{', '.join(names)} against {self.field}")
        ax.legend()
        ax.grid(alpha=0.3)
        return fig


def sweep(
    scenario: Scenario, field: str, values: Sequence[Any], trace: TracedWorkload | None = None
) -> Sweep:
    """Predict the scenario with `field` set to each value in turn (at a traced workload's
    rate when given one)."""
    values = list(values)
    return Sweep(field, values, [predict(change(scenario, {field: v}), trace) for v in values])
