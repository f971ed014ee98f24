"""Seed claims: every seed scenario states a claim and predicts; figures checked by hand and
against an independent route (the collective command's graph evaluation); verdict rules;
bad claim files exit 2."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from commsim import claims
from commsim.cli.app import app
from commsim.specs import Check

SEEDS = {p.stem: p for p in claims.seed_files()}


def _checks(name: str) -> list[claims.CheckResult]:
    return claims.check_claims(SEEDS[name]).checks


def test_every_seed_scenario_states_a_claim_and_predicts():
    assert len(SEEDS) >= 10
    sources = set()
    for path in SEEDS.values():
        result = CliRunner().invoke(app, ["predict", str(path), "--json"])
        assert result.exit_code == 0, (path, result.output)
        claim = yaml.safe_load(path.read_text())["claim"]
        assert claim["reading"].strip() and claim["checks"]
        sources.add(claim["source"])
    assert sources == {
        "000_038f76948b29b663.txt",
        "002_51cee7590262ffb4.txt",
        "003_de1c9d0d0e7bf389.txt",
    }


def test_gradient_bytes_by_hand():
    (gpt4,) = _checks("002-gpt4-gradient-bytes")
    assert gpt4.value == 1.8e12 * 2  # fp16: 3.6 TB, half the stated 7.2 TB
    assert not gpt4.holds and gpt4.factor == pytest.approx(0.5)
    size, _ = _checks("003-175b-700gb-100gbps")
    assert size.value == pytest.approx(174.6e9 * 4, rel=0.01) and size.holds


def test_ring_sync_time_by_hand():
    # 128 single-GPU nodes, one 100 Gb/s NIC each: NCCL's ring moves 2(N-1)/N of the 700 GB
    # fp32 gradient through every NIC, on one channel at the 12 GB/s its topology search
    # gives a 12.5 GB/s NIC (search.cc's speed array; latency is milliseconds in all)
    _, sync = _checks("003-175b-700gb-100gbps")
    gradient = _checks("003-175b-700gb-100gbps")[0].value
    assert sync.value == pytest.approx(2 * 127 / 128 * gradient / 12e9, rel=0.01)
    assert not sync.holds and sync.factor == pytest.approx(2.06, abs=0.01)


def test_compressed_wire_sizes_by_hand():
    int8, topk, sync = _checks("002-int8-topk-error-feedback")
    # int8: 1 byte a value and one fp32 scale per block, against 4 bytes a value
    assert int8.value == pytest.approx(0.75, abs=0.001) and int8.holds
    # top 5% as int8 values with uint32 indices: 0.05 x 5 / 4 of the dense bytes
    assert topk.value == pytest.approx(1 - 0.05 * 5 / 4, abs=0.001) and topk.holds
    # the all-gather of 1,024 workers' pairs: far slower than the stated 35 ms
    assert sync.value > 1.0 and not sync.holds


def test_placement_ratio_matches_the_collective_command():
    (util,) = _checks("002-clos-3to1-cross-rack")
    busbw = {}
    for placement in ("blocked", "interleaved"):
        args = ["collective", "all-reduce", "--cluster", "roce-3tier-3to1", "--gpus", "64"]
        args += ["--sizes", "1GiB:1GiB", "--algorithm", "ring", "--placement", placement]
        out = CliRunner().invoke(app, [*args, "--json"])
        assert out.exit_code == 0, out.output
        busbw[placement] = json.loads(out.output)["rows"][0]["busbw_Bps"]
    assert util.ratio and util.value == pytest.approx(busbw["interleaved"] / busbw["blocked"])
    assert util.value < 1 / 3 and util.holds  # 3:1 uplinks: at most a third


@pytest.mark.parametrize(
    ("target", "value", "holds"),
    [
        ({"claimed": 1.0}, 1.25, True),
        ({"claimed": 1.0}, 1.26, False),
        ({"claimed": 1.0}, 0.80, True),  # 1 / 1.25
        ({"claimed": 1.0}, 0.79, False),
        ({"at_least": 0.8}, 0.65, True),  # 0.65 x 1.25 >= 0.8
        ({"at_least": 0.8}, 0.63, False),
        ({"at_most": 0.6}, 0.75, True),
        ({"at_most": 0.6}, 0.76, False),
        ({"at_least": 0.8, "tolerance": 0}, 0.7999, False),
    ],
)
def test_verdict_tolerance(target, value, holds):
    check = Check(says="x", metric="sync_s", **target)
    assert claims._verdict(check, value).holds is holds


def test_a_check_states_exactly_one_target():
    with pytest.raises(ValueError, match="exactly one of claimed, at_least, at_most"):
        Check(says="x", metric="sync_s", claimed=1.0, at_most=2.0)


def test_cli_json_and_bad_claim_files(tmp_path):
    out = CliRunner().invoke(app, ["claims", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)["claims"]
    assert len(doc) == len(SEEDS)
    for c in doc:
        assert set(c) >= {"scenario", "source", "says", "reading", "checks", "holds"}
        assert all({"value", "factor", "holds"} <= set(k) for k in c["checks"])

    base = yaml.safe_load(SEEDS["002-gpt4-gradient-bytes"].read_text())
    cases = {
        "none.yaml": ({k: v for k, v in base.items() if k != "claim"}, "states no claim"),
        "two.yaml": (
            base | {"claim": base["claim"] | {"checks": [{"says": "x", "metric": "sync_s"}]}},
            "claim.checks.0: give exactly one of claimed, at_least, at_most",
        ),
        "metric.yaml": (
            base
            | {
                "claim": base["claim"]
                | {"checks": [{"says": "x", "metric": "speed", "claimed": 1}]}
            },
            "claim.checks.0.metric",
        ),
        "where.yaml": (
            base
            | {
                "claim": base["claim"]
                | {"checks": [{"says": "x", "metric": "sync_s", "claimed": 1, "where": {"tp": 0}}]}
            },
            "claim.checks.0",
        ),
    }
    for name, (data, words) in cases.items():
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        result = CliRunner().invoke(app, ["claims", str(path)])
        assert result.exit_code == 2, (name, result.output)
        assert str(path) in result.output and words in result.output, result.output
        assert "Traceback" not in result.output
