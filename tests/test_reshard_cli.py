"""`--reshard-after-forward` on predict and plan: the field as a flag, pinned by plan, a
value it cannot price refused in one line naming the flag."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from commsim.cli.app import app

BASE = ["--model", "gpt2-xl", "--cluster", "aws-p4d", "--gpus", "16", "--global-batch", "64"]
BASE += ["--zero", "3", "--json"]


def test_predict_takes_the_flag_and_refuses_a_group_size():
    runs = {
        v: CliRunner().invoke(app, ["predict", *BASE, "--reshard-after-forward", v])
        for v in ("true", "false")
    }
    docs = {v: json.loads(r.stdout) for v, r in runs.items()}
    assert docs["false"]["strategy"]["reshard_after_forward"] is False
    assert docs["false"]["step_time_s"] < docs["true"]["step_time_s"]
    bad = CliRunner().invoke(app, ["predict", *BASE, "--reshard-after-forward", "8"])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and "--reshard-after-forward 8" in lines[0], bad.output


def test_plan_pins_it():
    out = CliRunner().invoke(app, ["plan", *BASE, "--reshard-after-forward", "false"])
    assert out.exit_code == 0, out.output
    candidates = json.loads(out.stdout)["candidates"]
    assert candidates and all(not c["strategy"]["reshard_after_forward"] for c in candidates)


def test_plan_refuses_a_group_size_in_one_line():
    bad = CliRunner().invoke(app, ["plan", *BASE, "--reshard-after-forward", "8"])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and "--reshard-after-forward 8" in lines[0], bad.output


def test_a_value_it_does_not_know_is_named_with_the_values_it_takes():
    bad = CliRunner().invoke(app, ["predict", *BASE, "--reshard-after-forward", "maybe"])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1, bad.output
    assert "--reshard-after-forward maybe" in lines[0]
    assert "true, false or all-but-last" in lines[0] and "boolean" not in lines[0]
