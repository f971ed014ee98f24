"""Issue 10's frontier check: `plan` for Llama 3 405B on Meta's 16,384-H100 fabric at 8K
proposes the layout family practitioners run (Llama 3, arXiv:2407.21783 Sec. 3.3: tp 8
within the node, an interleaved pipeline, sharded optimizer state across the data-parallel
replicas) and explains the choice, in the table's notes and in --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app

FABRIC = Path(__file__).resolve().parent.parent / "benchmarks" / "meta-h100-roce.yaml"


@pytest.mark.slow
def test_llama3_405b_on_16384_h100s_gets_llama3s_layout_family_and_why():
    args = ["plan", "--model", "llama3-405b", "--cluster", str(FABRIC), "--gpus", "16384"]
    args += ["--global-batch", "2048", "--seq-len", "8192", "--compute-efficiency", "roofline"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    best = doc["candidates"][0]
    s, layout = best["strategy"], best["layout"]
    assert s["tp"] == 8 and s["tp_overlap"]  # tensor parallelism fills the 8-GPU node
    assert s["pp"] >= 8 and s["interleave"] >= 2  # an interleaved pipeline
    assert s["zero"] >= 1 and layout["dp"] >= 32  # state sharded across many replicas
    assert best["memory"]["total_bytes"] <= 85.6e9
    why = {a["dimension"]: a for a in doc["alternatives"]}
    for dimension in ("context parallelism", "interleaving"):
        assert why[dimension]["delta_s"] > 0  # each other choice along them costs time
    assert all(a["step_time_s"] >= best["step_time_s"] for a in doc["alternatives"])
