"""DDP comm hooks in the harness: PyTorch's own fp16 and PowerSGD hooks timed on loopback
and on the emulated 2:1 testbed, and commsim's predicted speedups checked against them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from commsim.calibrate.records import read_results
from commsim.cli.app import app
from commsim.collectives.backends import ALGORITHMS
from commsim.specs import ClusterSpec, SpecError

torch = pytest.importorskip("torch")
from commsim.calibrate.harness.config import HarnessConfig  # noqa: E402

hooks = pytest.importorskip("commsim.calibrate.hooks")

pytestmark = pytest.mark.torch

OVERSUB = Path(__file__).resolve().parent.parent / "testbeds" / "2x2-oversub.yaml"
LOOPBACK = """
name: loopback-2
description: one host, 2 CPU ranks over loopback
nodes: 1
node:
  gpu: cpu-host
  gpus_per_node: 2
  interconnect: pcie
  intra_latency: 50us
  intra_bandwidth: 2GB/s
  pcie_bandwidth: 32GB/s
  nics: {count: 1, bandwidth: 10Gbps, latency: 20us}
fabric: {kind: ethernet, nodes_per_leaf: 1, link_latency: 1us, switch_latency: 5us}
"""
HOOKS = ["--comm-hooks", "none,fp16,powersgd:1"]
NO_SWEEP = ["--sizes", "8B:8B", "--ops", "all-reduce", "--groups", "world"]


def _cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "commsim.cli.calibrate", "run", "--out", str(out), *args]


def _ddp(path: Path) -> list[dict]:
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in records if r["kind"] == "ddp"]


def test_every_hook_of_a_cap_takes_the_least_disturbed_compute():
    """Compute and the optimizer run under no_sync, where no hook runs: one quantity measured
    per hook; a disturbed measurement (16x, as a shared host once gave) does not stand."""
    from commsim.calibrate.records import DDPRecord

    kw = dict(kind="ddp", run="r", bucket_mb=25, first_bucket_mb=25, step_s=1.0)
    kw |= dict(exposed_comm_s=0.5, repeats=5)
    ddps = [
        DDPRecord(**kw, compute_s=0.35, optimizer_s=0.03, compression="none"),
        DDPRecord(**kw, compute_s=0.022, optimizer_s=0.002, compression="fp16"),
        DDPRecord(**kw, compute_s=0.019, optimizer_s=0.001, compression="powersgd:1"),
    ]
    same = hooks._same_compute(ddps)
    assert {(d.compute_s, d.optimizer_s) for d in same} == {(0.019, 0.001)}
    assert [d.compression for d in same] == ["none", "fp16", "powersgd:1"]
    assert [d.step_s for d in same] == [1.0, 1.0, 1.0]


def test_hooks_steps_are_measured_interleaved(monkeypatch):
    """Every round times each hook's no_sync step then its full step, the hooks' order
    rotated by one a round (ABC, BCA, CAB): a spell of load cannot fall on one hook only."""
    from types import SimpleNamespace

    from commsim.calibrate.harness import ddp as harness_ddp

    calls = []

    def fake_step(run, ddp, opt, x, y, *, sync, clock=None):
        calls.append((ddp, sync))
        if clock is not None:
            clock.launching, clock.handled, clock.end = 0.25, 1.0, 1.5
        return (2.0 if sync else 1.0), 0.1

    monkeypatch.setattr(harness_ddp, "_ddp_step", fake_step)
    clock = harness_ddp.CommClock.__new__(harness_ddp.CommClock)  # no hooks: set by the step
    setups = [
        harness_ddp._Setup(1.0, h, (h, None, None, None), 0, True, clock if h == "b" else None)
        for h in "abc"
    ]
    harness_ddp._timed(SimpleNamespace(cfg=SimpleNamespace(ddp_repeats=3)), setups)
    order = "abcbcacab"
    assert calls == [(h, sync) for h in order for sync in (False, True)]
    assert [len(s.step) for s in setups] == [3, 3, 3]
    assert [s.exposed for s in setups] == [[], [0.75] * 3, []]  # 0.25 + 1.5 - 1.0


def test_config_checks_hook_names():
    assert HarnessConfig(out="x").comm_hooks == ("none",)
    HarnessConfig(out="x", backend="gloo", comm_hooks=("fp16", "powersgd:4"))
    for bad in (("powersgd:0",), ("int8",), ("powersgd",), ()):
        with pytest.raises(SpecError, match="--comm-hooks"):
            HarnessConfig(out="x", comm_hooks=bad)
    with pytest.raises(SpecError, match="bf16 hook needs CUDA"):
        HarnessConfig(out="x", backend="gloo", comm_hooks=("bf16",))


@pytest.mark.slow
def test_local_run_records_one_step_per_hook_and_bucket(tmp_path):
    """Two gloo ranks: one ddp record per (bucket cap, hook), named as commsim spells it,
    and hook_speedups turns them into one row each (the uncompressed one at speedup 1)."""
    out = tmp_path / "results.jsonl"
    tiny = ["--width", "64", "--depth", "2", "--batch", "4", "--bucket-mb", "0.05,1"]
    done = subprocess.run(
        _cmd(out, "--local", "2", *NO_SWEEP, *tiny, *HOOKS, "--timeout", "60"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ddp = _ddp(out)
    pairs = [(cap, hook) for cap in (0.05, 1.0) for hook in ("none", "fp16", "powersgd:1")]
    assert [(d["bucket_mb"], d["compression"]) for d in ddp] == pairs
    assert [d["error_feedback"] for d in ddp] == [False, False, True] * 2
    assert [d["overlap"] for d in ddp] == [True, True, False] * 2  # gloo: one bucket at a time
    assert all(d["step_s"] > 0 and d["compute_s"] > 0 for d in ddp)
    # exposed communication by the harness's hooks in the full steps themselves
    assert all(d["exposed_by"] == "commclock" for d in ddp)
    assert all(0 < d["exposed_comm_s"] < d["step_s"] for d in ddp)

    results = read_results(out)
    (run,) = results.runs.values()
    assert len(run.ddp) == 6  # the new fields leave older readers working
    spec = ClusterSpec.model_validate(yaml.safe_load(LOOPBACK))
    rows = hooks.hook_speedups(results, spec)
    assert [(r.bucket_mb, r.compression) for r in rows] == [
        (d["bucket_mb"], d["compression"]) for d in ddp
    ]
    for r in rows:
        assert r.predicted_step_s > 0 and r.measured_speedup > 0
        assert (r.codec_s > 0) == (r.compression != "none")
        if r.compression == "none":
            assert r.measured_speedup == r.predicted_speedup == 1.0

    # `calibrate validate` predicts each hooked step with its hook and tabulates speedups
    cluster = tmp_path / "loopback-2.yaml"
    cluster.write_text(LOOPBACK)
    profile = tmp_path / "profile.yaml"
    intra = {"alpha_s": 50e-6, "efficiency": 1.0, "line_rate_Bps": 2e9, "points": 1}
    profile.write_text(
        yaml.safe_dump(
            {
                "format": 2,
                "cluster": "loopback-2",
                "backend": "gloo",
                "hardware": {"intra-node": "cpu-host GPUs over pcie"},
                "tiers": {"intra-node": intra | {"fitted": ["alpha", "bandwidth"]}},
                "algorithms": dict(ALGORITHMS["gloo"]),
                "provenance": {"files": [], "runs": [], "date": "", "points": 1, "commsim": "0"},
            }
        )
    )
    args = ["calibrate", "validate", str(out), "--profile", str(profile), "--cluster"]
    shown = CliRunner().invoke(app, [*args, str(cluster)])
    assert shown.exit_code == 0, shown.output
    assert "DDP comm hooks" in shown.output and "powersgd:1 + EF (no overlap)" in shown.output
    doc = json.loads(CliRunner().invoke(app, [*args, str(cluster), "--json"]).output)
    steps = [r["op"] for r in doc["rows"] if r["kind"] == "ddp-step"]
    assert steps == [f"ddp {h}".replace("ddp none", "ddp") for _, h in pairs]
    assert [(h["bucket_mb"], h["compression"]) for h in doc["hooks"]] == pairs


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the testbed needs root and iproute2 (ip, tc) for network namespaces",
)


# 40 Mbit/s links: the 4 ranks' ring injects 4 x 5 MB/s, a fifth of what the two cores
# forward (testbed.spec.CPU_BUDGET), so the links set the rate with the host loaded too;
# at the testbed's own 160 Mbit/s the ring took 80% of it, and a loaded CI host measured the
# uncompressed step at 2.18 s for 0.87 s of link time (fp16: 0.49 s).
HOOK_RATE = 40e6 / 8
CPU_BOUND = 1.25  # the uncompressed step over its link-rate prediction (measured: +5-9%)
# fp16's speedup error is held to FP16_MODEL (README's claim for it; measured +1 to +4%)
# plus the measurement's own spread: each step's (p90 - p10) / 2 over its median, both
# steps'. Past FP16_NOISY (the bound this test had before) the run is too noisy to check.
FP16_MODEL, FP16_NOISY = 0.05, 0.25


@pytest.mark.slow
@pytest.mark.root
@needs_root
def test_hooks_speed_up_a_slow_link_as_predicted(tmp_path):
    """4 ranks on the 2x2-oversub testbed at 40 Mbit/s, a 0.33M-parameter MLP whose 1.3 MB
    of gradients take ~0.41 s to all-reduce against a few ms of compute: fp16 halves the
    traffic (speedup > 1.3), PowerSGD rank 1 nearly removes it (faster still). The harness
    times the three hooks' steps interleaved (one round: each hook once), so a spell of load
    falls on all of them. commsim, with no profile (catalog rates, placeholder latencies),
    must price the uncompressed step at the link's rate (else the CPU set it: said so),
    order the hooks as measured and get fp16's bandwidth-bound speedup within 5% plus the
    steps' measured spread.
    PowerSGD's step is latency- and CPU-bound (torch's hook loops over tensors in Python,
    orthogonalises and copies for error feedback), where the speedup swings with tens of
    ms: there only the ordering is asserted (see benchmarks/RESULTS.md for the errors)."""
    from commsim.calibrate.testbed import network, runner
    from commsim.calibrate.testbed.spec import cluster_spec, load_testbed

    update = {"prefix": f"csh{os.getpid() % 100000}", "host_rate": HOOK_RATE}
    bed = load_testbed(OVERSUB).model_copy(update=update | {"uplink_rate": HOOK_RATE})
    out = tmp_path / "results.jsonl"
    model = ["--width", "136", "--depth", "2", "--batch", "32", "--bucket-mb", "25"]
    cmd = ["env", "OMP_NUM_THREADS=1", *_cmd(out, *NO_SWEEP, *model, *HOOKS, "--timeout", "120")]
    t0 = time.monotonic()
    try:
        network.up(bed)
        result = runner.run(bed, cmd, timeout=300)  # a hang guard: ~40 s quiet
    finally:
        network.down(bed.prefix)
    took = time.monotonic() - t0
    assert result.returncode == 0, "\n".join(line for _, line in result.lines[-20:])
    results = read_results(out)
    rows = hooks.hook_speedups(results, cluster_spec(bed))
    (run,) = results.runs.values()
    spread = {d.compression: (d.step_p90_s - d.step_p10_s) / 2 / d.step_s for d in run.ddp}
    print(f"\n{'hook':>11} {'measured':>9} {'spread':>7} {'speedup':>8} {'predicted':>9} "
          f"{'speedup':>8} error")  # fmt: skip
    for r in rows:
        print(
            f"{r.compression:>11} {r.measured_step_s:9.3f} {100 * spread[r.compression]:6.1f}% "
            f"{r.measured_speedup:8.2f} {r.predicted_step_s:9.3f} {r.predicted_speedup:8.2f} "
            f"{100 * r.error:+5.1f}%"
        )
    tolerance = FP16_MODEL + spread["none"] + spread["fp16"]
    print(f"testbed up, run and down in {took:.0f} s; fp16 held to {100 * tolerance:.1f}%")
    by = {r.compression: r for r in rows}
    none = by["none"]
    assert none.measured_step_s < CPU_BOUND * none.predicted_step_s, (
        f"the uncompressed step took {none.measured_step_s:.3f} s against "
        f"{none.predicted_step_s:.3f} s at the links' rate: the CPU, not the link, set the "
        f"rate (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    assert by["fp16"].measured_speedup > 1.3
    assert by["powersgd:1"].measured_speedup > by["fp16"].measured_speedup
    assert by["powersgd:1"].predicted_speedup > by["fp16"].predicted_speedup > 1.0
    assert tolerance < FP16_NOISY, f"the steps' repeats spread too far to check: {spread}"
    assert abs(by["fp16"].error) < tolerance, by["fp16"]
    assert by["fp16"].codec_s < 0.05 * by["fp16"].predicted_step_s
