"""`--reshard-after-forward` on predict and plan: the field as a flag, pinned by plan, a
value it cannot price refused in one line naming the flag."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app

BASE = ["--model", "gpt2-xl", "--cluster", "aws-p4d", "--gpus", "16", "--global-batch", "64"]
BASE += ["--zero", "3", "--json"]


def refused(command: str, value: str) -> str:
    """The one line `command` answers `--reshard-after-forward value` with, exit 2."""
    bad = CliRunner().invoke(app, [command, *BASE, "--reshard-after-forward", value])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and f"--reshard-after-forward {value}" in lines[0], bad.output
    return lines[0]


def test_predict_takes_the_flag():
    runs = {
        v: CliRunner().invoke(app, ["predict", *BASE, "--reshard-after-forward", v])
        for v in ("true", "false")
    }
    docs = {v: json.loads(r.stdout) for v, r in runs.items()}
    assert docs["false"]["strategy"]["reshard_after_forward"] is False
    assert docs["false"]["step_time_s"] < docs["true"]["step_time_s"]


def test_plan_pins_it():
    out = CliRunner().invoke(app, ["plan", *BASE, "--reshard-after-forward", "false"])
    assert out.exit_code == 0, out.output
    candidates = json.loads(out.stdout)["candidates"]
    assert candidates and all(not c["strategy"]["reshard_after_forward"] for c in candidates)


@pytest.mark.parametrize("command", ["predict", "plan"])
def test_a_group_size_is_refused_in_one_line(command):
    assert "not priced" in refused(command, "8")


def test_a_value_it_does_not_know_is_named_with_the_values_it_takes():
    line = refused("predict", "maybe")
    assert "true, false or all-but-last" in line and "boolean" not in line
