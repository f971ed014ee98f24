"""`commsim goodput` and `commsim stragglers` on the command line, goodput across cluster
sizes, and the seed's node-failure claim checked by hand."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsim import claims, whatif
from commsim.cli.app import app
from commsim.reliability.recovery import Policy
from commsim.reliability.sizing import goodput_sizes, knee
from commsim.reliability.spares import nodes_out_pmf

GPT3 = [
    "--model", "gpt3-175b", "--cluster", "dgx-h100-ib", "--global-batch", "1536",
    "--seq-len", "2048", "--tp", "8", "--pp", "16", "--tokens", "300e9",
    "--price-per-gpu-hour", "2",
]  # fmt: skip


def _json(args: list[str]) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_goodput_json_side_by_side_and_checked_by_monte_carlo():
    doc = _json(["goodput", *GPT3, "--gpus", "4096", "--monte-carlo", "2", "--seed", "1"])
    names = [r["strategy"] for r in doc["reports"]]
    assert names == ["cold", "hot-spare", "in-memory", "per-step"]
    assert "ring rebuild" in doc["skipped"]["ring-rebuild"]  # tp x pp spans 16 nodes
    for r in doc["reports"]:
        assert r["goodput"] + sum(r["badput"].values()) == pytest.approx(1.0)
        assert abs(doc["monte_carlo"][r["strategy"]]["goodput"] - r["goodput"]) < 0.02
        assert r["time_to_train_s"] >= r["ideal_time_to_train_s"]
        assert r["assumptions"] and r["mtti_s"] == pytest.approx(doc["reports"][0]["mtti_s"])
    keys = {
        "goodput",
        "badput",
        "mtti_s",
        "interval_s",
        "young_s",
        "daly_s",
        "spares",
        "checkpoint_stall_s",
        "restart_s",
        "time_to_train_s",
        "gpu_hours",
        "cost",
    }
    assert keys <= set(doc["reports"][0])


def test_goodput_table_plot_and_policy_flags(tmp_path):
    png = tmp_path / "badput.png"
    args = [
        "goodput",
        *GPT3,
        "--gpus",
        "2048",
        "--recovery",
        "cold",
        "--interval",
        "10min",
        "--async-save",
        "--rate-scale",
        "2",
        "--repair",
        "48h",
        "--plot",
        str(png),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "goodput" in result.output and "assumptions:" in result.output
    assert png.stat().st_size > 10_000
    doc = _json(args[:-2])
    (r,) = doc["reports"]
    assert r["interval_s"] == 600 and r["checkpoint_lag_s"] > 0
    single = _json(["goodput", *GPT3, "--gpus", "2048", "--recovery", "cold"])
    assert doc["reports"][0]["mtti_s"] == pytest.approx(single["reports"][0]["mtti_s"] / 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recovery", "nope"], "--recovery nope: must be one of"),
        (["--gpus", "8:4"], "HIGH must not be below LOW"),
        (["--interval", "soon"], "not a time"),
        (["--spare-target", "1.5"], "spare_target"),
        (["--rate-scale", "-1"], "rate-scale"),
        (["--gpus", "64:128"], "tokens"),
        (["--recovery", "ring-rebuild", "--zero", "1"], "ZeRO stage 1"),
    ],
)
def test_goodput_bad_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(app, ["goodput", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_stragglers_json():
    doc = _json([
        "stragglers", "--model", "gpt2-xl", "--cluster", "dgx-h100-ib", "--gpus", "256",
        "--global-batch", "2048", "--micro-batch", "4", "--seq-len", "1024",
        "--link", "leaf0:spine0", "--link-factor", "8", "--jitter", "lognormal:0.05",
    ])  # fmt: skip
    rows = {r["name"]: r for r in doc["slow_rank"]["mitigations"]}
    assert rows["wait"]["throughput"] < rows["drop"]["throughput"] < 1
    assert rows["wait"]["lost_s"] == pytest.approx(3600 * (1 - rows["wait"]["throughput"]))
    assert doc["jitter"]["sync"]["expected_max"] > 1
    assert doc["jitter"]["local_sgd"]["throughput"] > doc["jitter"]["sync"]["throughput"]
    assert doc["link"]["edges"] == ["leaf0->spine0", "spine0->leaf0"]
    assert doc["link"]["degraded_step_s"] >= doc["link"]["healthy_step_s"]
    bad = CliRunner().invoke(app, ["stragglers", "--link", "leaf0:nowhere"])
    assert bad.exit_code == 2 and "no such link" in bad.output


def test_every_stragglers_flag_reaches_its_document():
    # cli.stragglers gathers them in one Upsets (named as the flags): each one given, each seen
    doc = _json([
        "stragglers", "--model", "gpt2-xl", "--cluster", "dgx-h100-ib", "--gpus", "64",
        "--global-batch", "512", "--slow-rank", "1.5", "--duration", "2h", "--jitter",
        "exponential:0.2", "--local-steps", "4", "--link", "leaf0:spine0", "--link-factor", "2",
    ])  # fmt: skip
    slow = doc["slow_rank"]
    assert (doc["gpus"], slow["factor"], slow["duration_s"]) == (64, 1.5, 7200.0)
    jitter = doc["jitter"]
    assert (jitter["distribution"], jitter["cv"], jitter["local_steps"]) == ("exponential", 0.2, 4)
    assert doc["link"]["factor"] == 2.0


def test_goodput_falls_with_size_and_where_more_gpus_stop_paying():
    base = whatif.load(
        None,
        {
            "model": "gpt3-175b",
            "cluster": "dgx-h100-ib",
            "gpus": 1024,
            "global_batch": 1536,
            "seq_len": 2048,
            "tp": 8,
            "pp": 16,
            "tokens": 300e9,
        },
    )
    points = goodput_sizes(base, "test", [1024, 2048, 4096], Policy("cold"))
    good = [p.report.goodput for p in points]
    assert good == sorted(good, reverse=True) and good[-1] < good[0]
    k = knee(points)
    assert k["speedups"][0]["with_goodput"] < k["speedups"][0]["ideal"]
    bad = goodput_sizes(base, "test", [1000], Policy("cold"))[0]
    assert bad.report is None and "divide" in bad.note


@pytest.mark.slow
def test_gpt3_sizing_from_1024_to_65536_gpus():
    # the sweep: goodput falls with size, so the last doubling (32,768 -> 65,536)
    # buys less than half of its ideal speed-up in time to train
    doc = _json(["goodput", *GPT3, "--gpus", "1024:65536", "--recovery", "cold"])
    rows = doc["sizing"]
    assert [r["gpus"] for r in rows] == [1024 * 2**i for i in range(7)]
    good = [r["goodput"] for r in rows]
    assert good == sorted(good, reverse=True) and good[-1] < 0.85 < 0.99 < good[0]
    assert rows[4]["mtti_s"] / 3600 == pytest.approx(3.1, abs=0.1)  # 16,384 GPUs
    assert doc["knee"]["ideal_fastest_gpus"] == 65536
    last = doc["knee"]["speedups"][-1]
    assert last["ideal"] > 1.05 and last["with_goodput"] - 1 < (last["ideal"] - 1) / 2


def test_seed_node_failure_claim_by_hand():
    path = claims.SEED_DIR / "003-node-failure-ring-rebuild.yaml"
    rebuild, loss, share, spares = claims.check_claims(path).checks
    # detection (10 s) + NCCL set-up of the 128 data-parallel ranks (265 s at 96k, linear)
    assert rebuild.value == pytest.approx(10 + 265 * 128 / 96000) and rebuild.holds
    assert loss.value > rebuild.value and not loss.holds  # + the spare's state copy
    assert share.value < 1e-4 and share.holds
    assert spares.value == pytest.approx(2 / 16) and spares.holds


def test_spare_fraction_claim_uses_the_spare_target():
    # the same nodes-out distribution as the claim: P(X <= 2) >= 0.999 > P(X <= 1)
    from commsim.reliability.goodput import model_for
    from commsim.scenario import resolve

    scenario = whatif.load(str(claims.SEED_DIR / "003-node-failure-ring-rebuild.yaml"))
    setup = resolve(scenario, "test")
    m = model_for(whatif.predict(scenario), setup, Policy("ring-rebuild"))
    pmf = nodes_out_pmf(m.interruptions.repairs(), 18 / 16)
    assert pmf[:3].sum() >= 0.999 > nodes_out_pmf(m.interruptions.repairs(), 17 / 16)[:2].sum()


def test_a_bad_recovery_in_a_claim_names_the_check(tmp_path):
    text = (claims.SEED_DIR / "003-node-failure-ring-rebuild.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("recovery: {spare_target: 0.999}", "recovery: {spares_target: 1}"))
    result = CliRunner().invoke(app, ["claims", str(bad)])
    assert result.exit_code == 2
    assert "claim.checks.3.recovery" in result.output and "spares_target" in result.output


def test_stragglers_says_local_sgd_over_100_percent_is_the_saved_sync():
    # the default job (GPT-2 XL on 64 A100s, exposed gradient sync ~0.27 s of a 0.92 s step)
    # showed local SGD at 130% "of the synchronous step without jitter" and nothing more
    doc = _json(["stragglers"])
    sgd = doc["jitter"]["local_sgd"]
    assert sgd["throughput"] > 1 > sgd["throughput_same_schedule"]
    assert sgd["saved_sync_s"] > sgd["jitter_s"] > 0
    text = " ".join(CliRunner().invoke(app, ["stragglers"]).output.split())
    assert f"local SGD every 8 steps: {sgd['throughput']:.1%} of that step" in text
    assert f"the data-parallel sync sent once in 8 saves {sgd['saved_sync_s']:.3g} s a step" in text
    assert f"{sgd['throughput_same_schedule']:.1%} of local SGD without jitter" in text
    one = " ".join(CliRunner().invoke(app, ["stragglers", "--local-steps", "1"]).output.split())
    assert "local SGD every" not in one  # no local-SGD clause in the jitter line


def test_stragglers_title_gives_the_duration_with_its_unit():
    """The episode's length as commsim read it, with a unit: `--duration 5` (seconds) printed
    'for 5', a number in no unit, and `5400` read as 1.5 h printed as typed."""
    for typed_as, shown in (("5", "for 5 s on"), ("5400", "for 1.5 h on"), ("2d", "for 2 days on")):
        out = CliRunner().invoke(app, ["stragglers", "--duration", typed_as])
        assert out.exit_code == 0, out.output
        assert shown in " ".join(out.output.split())


def test_goodput_names_a_changed_gpu_count_as_stragglers_does():
    """--gpus N changes what the scenario names, so its name says so (goodput left gpus out
    of 'changed: ...' while stragglers listed it, for the same flags)."""
    args = ["--gpus", "128", "--recovery", "cold"]
    assert "gpus" in _json(["goodput", *args])["scenario"].partition("changed:")[2]
    assert "changed" not in _json(["goodput", "--recovery", "cold"])["scenario"]
