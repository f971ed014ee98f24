"""Cluster sizing with failures counted: each size's goodput, its time to train and cost
with failures beside the ideal ones, and the pick made on the real figures."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.planner.sizing import SizingRow, objective_value
from commsim.reliability.goodput import GoodputReport

GPT3 = [
    "plan", "--model", "gpt3-175b", "--cluster", "dgx-h100-ib", "--global-batch", "1536",
    "--seq-len", "2048", "--tp", "8", "--pp", "16", "--cp", "1", "--tokens", "300e9",
    "--price-per-gpu-hour", "2", "--gpus", "1024:4096",
]  # fmt: skip


def _json(args):
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_sizing_rows_carry_goodput_and_honour_the_pins():
    doc = _json(GPT3)
    rows = doc["sizing"]
    assert [r["gpus"] for r in rows] == [1024, 2048, 4096]
    for r in rows:
        assert (r["strategy"]["tp"], r["strategy"]["pp"], r["strategy"]["cp"]) == (8, 16, 1)
        assert r["recovery"] == "cold" and 0.9 < r["goodput"] < 1.0
        # with failures: the ideal time over the goodput, GPU-hours and cost alike
        assert r["time_to_train_goodput_s"] == pytest.approx(r["time_to_train_s"] / r["goodput"])
        assert r["cost_goodput"] == pytest.approx(r["gpu_hours_goodput"] * 2)
    goodputs = [r["goodput"] for r in rows]
    assert goodputs == sorted(goodputs, reverse=True)  # more GPUs, more interruptions


def test_recovery_none_gives_the_ideal_figures_only():
    rows = _json([*GPT3, "--recovery", "none"])["sizing"]
    assert all("goodput" not in r for r in rows)


def test_failure_flags_outside_sizing_are_refused():
    result = CliRunner().invoke(app, ["plan", "--recovery", "cold", "--spares", "2"])
    assert result.exit_code == 2
    assert "--recovery, --spares: failures and goodput apply to cluster sizing" in result.output


def test_the_objective_reads_the_times_with_failures():
    class _P:
        step_time_s = 1.0
        training = {"time_to_train_s": 100.0, "gpu_hours": 10.0, "cost": 20.0}

    report = GoodputReport.__new__(GoodputReport)
    object.__setattr__(report, "time_to_train_s", 125.0)
    object.__setattr__(report, "gpu_hours", 12.5)
    object.__setattr__(report, "cost", 25.0)
    row = SizingRow("f", 8, _P(), goodput=report)
    assert objective_value(row, "time-to-train") == 125.0
    assert objective_value(row, "cost") == 25.0
    assert objective_value(SizingRow("f", 8, _P()), "time-to-train") == 100.0
