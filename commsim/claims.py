"""Seed claims put to the model: does a document's figure follow from its own setup?

A scenario file may carry a `claim` (specs.Claim): the words of a document, and checks,
each one metric of the scenario (changed by the check's `where`), divided by the same
metric of a baseline (`versus`) for a before/after figure. commsim computes the metric
and says whether the stated figure is within the check's relative tolerance (or bound).
"Does not hold" means commsim's physics, on the setup as the scenario reads it, gives a
figure that far from the document's; the scenario's `reading` says what was assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commsim import catalog
from commsim.compression import parse_compressor
from commsim.scenario import Setup, resolve, with_overrides
from commsim.spec_io import read_yaml
from commsim.specs import Check, Claim, SpecError
from commsim.step.layouts import DTYPE_BYTES
from commsim.step.predict import predict, step_model, strategy_layouts
from commsim.step.prediction import Prediction
from commsim.whatif import metric

SEED_DIR = catalog.SCENARIO_DIR / "seeds"
DAY = 86400.0

# under a recovery policy (check.recovery; default: the seed's ring rebuild): the whole-job
# stall when a failure is noticed, the wall time lost per failure ((1 - goodput) x MTTI),
# the share of training lost to failures, spare nodes per job node for the spare target
RELIABILITY = ("rebuild_s", "loss_per_failure_s", "failure_badput", "spare_fraction")

# figures of a predicted step that its JSON does not name (the rest: whatif.metric)
DERIVED: dict[str, Callable[[Prediction], float]] = {
    "comm_share": lambda p: p.parts["exposed_comm_s"] / p.step_time_s,
    "buckets": lambda p: float(len(p.buckets)),
}


@dataclass(frozen=True)
class CheckResult:
    """One check: what the document states, what commsim computes, and the verdict."""

    says: str
    metric: str
    ratio: bool  # value is metric(where) / metric(versus)
    value: float
    claimed: float | None
    at_least: float | None
    at_most: float | None
    tolerance: float
    holds: bool

    @property
    def target(self) -> float:
        return next(x for x in (self.claimed, self.at_least, self.at_most) if x is not None)

    @property
    def factor(self) -> float:
        """commsim's figure over the document's."""
        return self.value / self.target if self.target else math.inf


@dataclass(frozen=True)
class ClaimResult:
    """A scenario's claim and each of its checks."""

    scenario: str
    file: str
    source: str
    says: str
    reading: str
    checks: list[CheckResult]

    @property
    def holds(self) -> bool:
        return all(c.holds for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        checks = [asdict(c) | {"factor": c.factor} for c in self.checks]
        return asdict(self) | {"checks": checks, "holds": self.holds}


def seed_files() -> list[Path]:
    """The built-in seed scenarios (scenarios/seeds/*.yaml)."""
    return sorted(SEED_DIR.glob("*.yaml"))


def check_claims(path: str | Path) -> ClaimResult:
    """Evaluate the claim of one scenario file (SpecError if it has none)."""
    source = str(path)
    data = read_yaml(source)
    if not isinstance(data, dict):
        raise SpecError(source, "", "expected a mapping of scenario fields")
    scenario = with_overrides(data, {}, source)
    claim: Claim | None = scenario.claim
    if claim is None:
        raise SpecError(source, "claim", "this scenario states no claim to check")
    setups: dict[str, Setup] = {}
    results = []
    for i, check in enumerate(claim.checks):
        where = f"claim.checks.{i}"
        value = _metric(data, check, check.where, setups, source, where)
        if check.versus is not None:
            base = _metric(data, check, check.where | check.versus, setups, source, where)
            value = value / base if base else math.inf
        results.append(_verdict(check, value))
    return ClaimResult(scenario.name, source, claim.source, claim.says, claim.reading, results)


def _verdict(check: Check, value: float) -> CheckResult:
    """Within the tolerance of the stated figure, or inside the stated bound (loosened
    by the same tolerance)."""
    grow = 1.0 + check.tolerance
    if check.claimed is not None:
        holds = check.claimed / grow <= value <= check.claimed * grow
    elif check.at_least is not None:
        holds = value * grow >= check.at_least
    else:
        holds = value <= check.at_most * grow  # type: ignore[operator]
    return CheckResult(
        check.says,
        check.metric,
        check.versus is not None,
        float(value),
        check.claimed,
        check.at_least,
        check.at_most,
        check.tolerance,
        bool(holds),
    )


def _metric(
    data: dict[str, Any],
    check: Check,
    changes: dict[str, Any],
    setups: dict[str, Setup],
    source: str,
    where: str,
) -> float:
    """The check's metric on the scenario with `changes` applied."""
    here = f"{source}: {where}"
    scenario = with_overrides(data, changes, here)
    key = scenario.model_dump_json()
    setup = setups.get(key) or setups.setdefault(key, resolve(scenario, here))
    strategy = scenario.strategy
    gradient = setup.workload.params * DTYPE_BYTES[strategy.grad_dtype]
    if check.metric == "gradient_bytes":
        return float(gradient)
    if check.metric in ("wire_ratio", "traffic_cut"):
        n = int(setup.workload.params)
        ratio = parse_compressor(strategy.compression).wire_bytes(n) / (4.0 * n)
        return ratio if check.metric == "wire_ratio" else 1.0 - ratio
    if check.metric in ("sync_s", "busbw_Bps"):
        if not strategy.data_parallel_only:
            raise SpecError(source, where, f"{check.metric} is defined for data parallelism")
        size = check.bytes or gradient
        layouts = strategy_layouts(setup, [strategy])
        costs, _ = step_model(setup).dp.bucket_costs(
            layouts.row(0), np.array([size]), np.array([False]), int(layouts.grad_bytes[0])
        )
        seconds = float(costs.network[0])
        if check.metric == "sync_s":
            return seconds
        n = setup.n_gpus
        return size * 2 * (n - 1) / n / seconds  # nccl-tests' all-reduce busbw
    pred = predict(setup, strategy)
    if check.metric in RELIABILITY:
        return _reliability(check, pred, setup, source, where)
    if check.metric == "time_to_train_days":
        if pred.training is None:
            raise SpecError(source, "tokens", "time_to_train_days needs the scenario's tokens")
        return pred.training["time_to_train_s"] / DAY
    return DERIVED[check.metric](pred) if check.metric in DERIVED else metric(pred, check.metric)


def _reliability(check: Check, pred: Prediction, setup: Setup, source: str, where: str) -> float:
    """A reliability metric of the predicted step (commsim.reliability)."""
    from commsim.reliability.goodput import expected_goodput
    from commsim.reliability.recovery import Policy

    try:
        policy = Policy(**({"strategy": "ring-rebuild"} | check.recovery))
        r = expected_goodput(pred, setup, policy)
    except (TypeError, ValueError) as e:
        raise SpecError(source, f"{where}.recovery", str(e)) from None
    if check.metric == "rebuild_s":
        return r.restart_s
    if check.metric == "loss_per_failure_s":
        return (1.0 - r.goodput) * r.mtti_s
    if check.metric == "failure_badput":
        return 1.0 - r.goodput
    return r.spares / r.nodes
