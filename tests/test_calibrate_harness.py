"""The torch.distributed harness for real: gloo ranks on loopback (`--local N`), the JSONL
they append, fit and validate on it, and what happens when a rank hangs or dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from commsim.calibrate.records import read_results
from commsim.cli.calibrate import calibrate_app

torch = pytest.importorskip("torch")
from commsim.calibrate.harness.collectives import tier_groups  # noqa: E402
from commsim.calibrate.harness.config import HarnessConfig  # noqa: E402

pytestmark = pytest.mark.torch

LOCAL_CLUSTER = """
name: loopback-{n}
description: one host, {n} CPU ranks talking over loopback
nodes: 1
node:
  gpu: cpu-host
  gpus_per_node: {n}
  interconnect: pcie
  intra_latency: 50us
  intra_bandwidth: 2GB/s
  pcie_bandwidth: 32GB/s
  nics: {{count: 1, bandwidth: 10Gbps, latency: 20us}}
fabric:
  kind: ethernet
  nodes_per_leaf: 1
  link_latency: 1us
  switch_latency: 5us
"""
TINY = ["--warmup", "1", "--repeats", "4", "--width", "32", "--depth", "1", "--batch", "4"]


def _run(out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "commsim.cli.calibrate", "run", "--out", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_tier_groups():
    ranks = [
        {"rank": 0, "host": "a", "rack": "0"},
        {"rank": 1, "host": "a", "rack": "0"},
        {"rank": 2, "host": "b", "rack": "0"},
        {"rank": 3, "host": "c", "rack": "1"},
    ]
    assert tier_groups(ranks, "tiers") == [
        ("world", [0, 1, 2, 3]),
        ("rack", [0, 1, 2]),
        ("host", [0, 1]),
    ]
    assert tier_groups(ranks, "world") == [("world", [0, 1, 2, 3])]
    one_host = [{"rank": r, "host": "a", "rack": None} for r in range(3)]
    assert tier_groups(one_host, "tiers") == [("world", [0, 1, 2])]


def test_config_refuses_bad_values():
    from commsim.specs import SpecError

    with pytest.raises(SpecError, match="--ops: unknown op 'gather'"):
        HarnessConfig(out="x", ops=("gather",))
    with pytest.raises(SpecError, match="--repeats"):
        HarnessConfig(out="x", repeats=1)
    for sizes, says in (("8B:1B", "must satisfy 0 < low"), ("abc", "not a size: 'abc'")):
        with pytest.raises(SpecError, match=f"--sizes: .*{says}"):  # the flag named
            HarnessConfig(out="x", sizes=sizes)
    assert HarnessConfig(out="x", sizes="8B:64B").size_grid() == [8, 16, 32, 64]


def test_run_outside_a_launcher_says_how(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    result = CliRunner().invoke(calibrate_app, ["run", "--out", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2
    assert "not set: run under torchrun" in result.output and "--local N" in result.output


@pytest.mark.slow
def test_local_run_then_fit_and_validate(tmp_path):
    """Two gloo ranks measure every op and a DDP step; the file feeds fit and validate."""
    out = tmp_path / "results.jsonl"
    out.write_text('{"kind": "meta", "run": "killed mid-wr')  # an earlier run's cut line
    before = out.read_text()
    done = _run(out, "--local", "2", "--sizes", "8B:64KiB", "--bucket-mb", "0.05,1", *TINY)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.startswith(before + "\n")  # appended after the old content, never truncated
    out.write_text(text[len(before) + 1 :])  # the harness's records alone
    records = _lines(out)
    meta = records[0]
    assert meta["kind"] == "meta" and meta["backend"] == "gloo" and meta["world_size"] == 2
    assert [r["rank"] for r in meta["ranks"]] == [0, 1]
    assert set(meta["versions"]) == {"commsim", "torch", "python"}
    coll = [r for r in records if r["kind"] == "collective"]
    ok = [r for r in coll if r["status"] == "ok"]
    ops = {r["op"] for r in coll}
    assert ops == {
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "broadcast",
        "all-to-all",
        "send-recv",
    }
    assert len(ok) == 14 * len({r["op"] for r in ok})  # 8 B .. 64 KiB each
    for r in ok:
        assert r["p10_s"] <= r["time_s"] <= r["p90_s"] and r["repeats"] >= 3
        assert r["bytes"] >= 8 and r["busbw_Bps"] > 0
        # every repeat's slowest-rank time, and each rank's median: the slowest rank's
        # time of a repeat is never below a rank's
        assert r["timing"] == "slowest-rank" and len(r["times_s"]) == r["repeats"]
        assert r["time_s"] == pytest.approx(float(np.median(r["times_s"])))
        assert len(r["rank_times_s"]) == 2 and max(r["rank_times_s"]) <= max(r["times_s"])
    model = next(r for r in records if r["kind"] == "model")
    assert [layer["name"] for layer in model["layers"]][:3] == [
        "0.Linear",
        "1.LayerNorm",
        "2.Linear",
    ]
    assert all(layer["forward_s"] > 0 and layer["backward_s"] > 0 for layer in model["layers"])
    ddp = [r for r in records if r["kind"] == "ddp"]
    assert [d["bucket_mb"] for d in ddp] == [0.05, 1.0]
    # DDP's own buckets (sizes and parameters, as its logger reports them) match commsim's
    # model of them under the installed torch's first-bucket rule
    from commsim.calibrate.validate import harness_workload
    from commsim.step.buckets import MIB, assign_buckets, ddp_first_bucket_bytes

    workload = harness_workload(read_results(out).runs[meta["run"]].model)
    for d in ddp:
        cap = int(d["bucket_mb"] * MIB)  # as DDP rounds it
        first = ddp_first_bucket_bytes(cap, True, torch.__version__)
        assert d["first_bucket_mb"] * MIB == pytest.approx(first)
        mine = assign_buckets(workload.tensor_params * 4.0, cap, first)
        assert sorted(d["buckets_bytes"]) == sorted(
            4 * int(workload.tensor_params[b].sum()) for b in mine
        )
        assert sorted(map(sorted, d["buckets_params"])) == sorted(map(sorted, mine))
    assert (records[-1]["kind"], records[-1]["status"]) == ("end", "complete")

    cluster = tmp_path / "loopback.yaml"
    cluster.write_text(LOCAL_CLUSTER.format(n=2))
    prof = tmp_path / "profile.yaml"
    runner = CliRunner()
    fitted = runner.invoke(
        calibrate_app, ["fit", str(out), "--cluster", str(cluster), "-o", str(prof), "--json"]
    )
    assert fitted.exit_code == 0, fitted.output
    doc = json.loads(fitted.stdout)
    assert set(doc["tiers"]) == {"intra-node"}
    tier = doc["tiers"]["intra-node"]
    assert tier["alpha_ci_s"][0] <= tier["alpha_s"] <= tier["alpha_ci_s"][1]
    assert doc["compute"]["flops_per_s"] > 0
    plot = tmp_path / "validate.png"
    checked = runner.invoke(
        calibrate_app,
        [
            "validate",
            str(out),
            "--profile",
            str(prof),
            "--cluster",
            str(cluster),
            "--json",
            "--plot",
            str(plot),
        ],
    )
    assert checked.exit_code == 0, checked.output
    doc = json.loads(checked.stdout)
    kinds = {r["kind"] for r in doc["rows"]}
    assert kinds == {"collective", "ddp-step", "ddp-exposed"}
    # gloo's 2-rank all-gather and send-recv and its all-to-all are not modelled
    pairwise = sum(r["op"] in ("all-gather", "send-recv", "all-to-all") for r in ok)
    assert doc["points"] == len(ok) - pairwise and doc["unmodelled_points"] == pairwise
    assert doc["median_abs_pct_error"] >= 0 and doc["ddp_step"]["points"] == 2
    assert plot.stat().st_size > 1000


def _wait_for(path: Path, count: int, deadline: float) -> list[dict]:
    while time.monotonic() < deadline:
        if path.exists():
            records = _lines(path) if path.read_text().endswith("\n") else []
            if sum(r["kind"] == "collective" for r in records) >= count:
                return records
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} measurements in {path} in time")


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hang", "die"])
def test_a_rank_that_hangs_or_dies_ends_the_run_clearly(tmp_path, fault):
    """Rank 1 stops (SIGSTOP) or is killed mid-sweep: rank 0 reports it within the
    timeout, records why, and every measurement already taken stays in the file."""
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "commsim.cli.calibrate", "run", "--out", str(out)]
    cmd += ["--local", "2", "--sizes", "8B:8KiB", "--ops", "all-reduce,broadcast"]
    cmd += ["--repeats", "400", "--warmup", "1", "--bucket-mb", "", "--timeout", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    try:
        records = _wait_for(out, 2, time.monotonic() + 60)
        victim = records[0]["ranks"][1]["pid"]
        kept = records[: 1 + sum(r["kind"] == "collective" for r in records)]
        os.kill(victim, signal.SIGSTOP if fault == "hang" else signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=40)
        took = time.monotonic() - t0
    finally:
        if victim is not None:
            _kill_quietly(victim)
        proc.kill()
    assert proc.returncode == 1
    assert "calibrate run failed: rank 0:" in err
    assert "measurements so far are in" in err
    assert "rank 1 ended with killed by signal 9" in err
    assert took < 4 + 10 + 8  # the timeout, the launcher's grace, slack
    run = next(iter(read_results(out).runs.values()))  # the file is whole
    assert run.end is not None and run.end.status == "failed"
    assert "failed" in run.end.message
    now = [json.loads(x) for x in out.read_text().splitlines()]
    assert now[: len(kept)] == kept  # nothing measured before was lost
