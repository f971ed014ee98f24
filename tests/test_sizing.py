"""Cluster sizing: a sweep over fabrics and sizes, its Pareto front and deadline pick."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.planner.plan import plan
from commsim.planner.search import enumerate_layouts, search
from commsim.planner.sizing import SizingRow, pareto_front, pick_size
from commsim.scenario import load_scenario, resolve
from commsim.step.predict import step_model


class _Best:
    """A stand-in for a Prediction carrying only what sizing reads."""

    def __init__(self, days: float, cost: float):
        self.training = {"time_to_train_s": days * 86400, "gpu_hours": cost, "cost": cost}
        self.step_time_s = days


def _row(gpus, days, cost, fabric="f"):
    return SizingRow(fabric, gpus, _Best(days, cost))


def test_pareto_front_and_pick():
    rows = [
        _row(256, 40, 100),
        _row(512, 21, 105),
        _row(1024, 12, 130),
        _row(1024, 15, 140, "slow"),
        _row(2048, 7, 180),
    ]
    front = pareto_front(rows)
    assert [(r.fabric, r.gpus) for r in front] == [("f", 2048), ("f", 1024), ("f", 512), ("f", 256)]
    assert pick_size(rows, deadline_s=30 * 86400, budget=None).gpus == 512  # smallest in time
    assert pick_size(rows, deadline_s=None, budget=135).gpus == 1024  # fastest within budget
    assert pick_size(rows, deadline_s=5 * 86400, budget=None) is None


def test_sizing_cli_json(tmp_path):
    png = tmp_path / "sizing.png"
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "--model",
            "gpt2-xl",
            "--tokens",
            "30e9",
            "--gpus",
            "64:128",
            "--fabric",
            "dgx-h100-ib",
            "--global-batch",
            "512",
            "--price-per-gpu-hour",
            "2",
            "--deadline",
            "30d",
            "--plot",
            str(png),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["gpus"] for r in doc["sizing"]] == [64, 128]
    for r in doc["sizing"]:
        # time to train = tokens / (global batch x sequence) x step time; cost = GPU-hours x 2
        steps = 30e9 / (512 * 1024)
        assert r["time_to_train_s"] == pytest.approx(steps * r["step_time_s"])
        assert r["cost"] == pytest.approx(2 * r["gpus"] * r["time_to_train_s"] / 3600)
    assert doc["pick"]["gpus"] == 64 and png.exists()


@pytest.mark.parametrize(
    "args,expect",
    [
        (("--gpus", "64:128"), "tokens"),
        (("--gpus", "128:64", "--tokens", "1e9"), "HIGH must not be below LOW"),
        (("--fabric", "nowhere", "--tokens", "1e9"), "unknown topology 'nowhere'"),
        (("--fabric", "aws-p4d", "--gpu", "z9000", "--tokens", "1e9"), "unknown GPU"),
    ],
)
def test_sizing_bad_input(args, expect):
    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 2 and expect in result.output, result.output


def test_sizing_refuses_a_pin_the_model_cannot_take_at_any_size():
    """GPT-2 XL has 25 heads: --tp 2 can run on no cluster, said once, before any work."""
    from typer.testing import CliRunner

    from commsim.cli.app import app

    args = ["plan", "--gpus", "8:64", "--tokens", "1e9"]
    result = CliRunner().invoke(app, [*args, "--tp", "2"])
    assert result.exit_code == 2
    assert "--tp 2: 2 does not divide the model's 25 attention heads" in result.output


def test_a_size_without_a_layout_says_why_and_no_deadline_is_blamed():
    """pp 16 cannot split 8 GPUs: that row says so; 16 and 32 GPUs run."""
    from typer.testing import CliRunner

    from commsim.cli.app import app

    args = ["plan", "--gpus", "8:32", "--tokens", "1e9", "--pp", "16", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["gpus"]: r for r in json.loads(result.output)["sizing"]}
    assert "strategy" not in rows[8]
    assert "no layout of gpt2-xl runs on 8 GPUs with pp 16" in rows[8]["note"]
    assert rows[16]["strategy"]["pp"] == rows[32]["strategy"]["pp"] == 16
    empty = CliRunner().invoke(app, ["plan", "--gpus", "8:16", "--tokens", "1e9", "--pp", "32"])
    assert "no size has a layout that runs" in empty.output
    assert "deadline" not in empty.output


@pytest.mark.parametrize("model", ["llama3-8b", "gpt2-xl"])
def test_the_best_alone_is_the_full_searchs_best(model):
    # best_only prices the layouts in order of their no-network bound and stops once the
    # bound passes the best: the same winner as pricing all of them, from fewer layouts;
    # and the bound is below every layout's step
    sc, src = load_scenario(None, dict(model=model, cluster="dgx-h100-ib", gpus=64))
    setup = resolve(sc.model_copy(update={"global_batch": 256}), src, check=False)
    whole = plan(setup, setup.scenario.strategy, set())
    alone = plan(setup, setup.scenario.strategy, set(), best_only=True)
    assert alone.ranked[0].strategy == whole.ranked[0].strategy
    assert alone.ranked[0].step_time_s == whole.ranked[0].step_time_s
    assert (alone.searched, alone.fitting) == (whole.searched, whole.fitting)
    model = step_model(setup)
    layouts = enumerate_layouts(setup, {}, setup.scenario.strategy)
    found = search(model, layouts)
    bound = model.step_bound(layouts.take(found.fitting))
    assert (bound <= found.breakdown.step).all()
    assert len(search(model, layouts, best_only=True).fitting) < len(found.fitting)
