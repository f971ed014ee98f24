"""Calibration end to end on the emulated cluster: measure one placement for real, fit,
then predict a different placement and a different world size and measure those too; and
a profile fitted on one testbed shape carried to another through the CLI alone. Both fit
the same sweep (one harness run, module fixture `fit_bed`, made through the CLI).

The fitted testbed is 2 racks x 2 hosts, 80 Mbit/s host links, one 80 Mbit/s uplink per
rack: 2:1 (testbeds/2x2-oversub.yaml at half its rates: see the CLI test's docstring for
why). The fit sees only the blocked placement of 4 ranks (r0h0 r0h1 | r1h0 r1h1), whose
ring crosses each uplink once per direction, and the rack's own 2-rank group. It must then
predict

- the interleaved placement of 4 ranks (r0h0 r1h0 r0h1 r1h1): every ring hop crosses the
  racks, two flows share each uplink, and collectives take twice as long; and
- 3 ranks spread over both racks (r0h0 r1h0 r0h1), a world size it never saw,

within 15% for every measured size of 512 KiB and more (the issue's bar, set at 1 MiB on
160 Mbit/s links: the same wire time), for all-reduce and all-gather with gloo. Both must
run: the placement changes the time twofold, so a model that ignored the topology would
miss by ~50%.

Why these choices (see benchmarks/RESULTS.md, "Calibration accuracy on the emulated
testbed"): the sweep starts at 128 KiB (the wire time of 256 KiB at 160 Mbit/s) because
below it this 2-core machine's scheduling latency (about 1 ms per ring step with 4 ranks,
0.25 ms with 2) swamps the link's, and a fit that includes those points pulls the
bandwidth above the line rate (loaded, the 64-128 KiB points' repeats spread 32-44%).
all-to-all, and a 2-rank all-gather or send-recv, send a large message to a peer while
receiving one from it, which gloo over TCP does not overlap here (a 2-rank send-recv takes
twice the model's time; gloo's all-reduce, cut into small segments, is unaffected, and a
plain TCP socket in the same namespaces carries both directions at full rate):
benchmarked, not asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("torch", reason="the harness needs torch (pip install 'commsim[calibrate]')")

from commsim.calibrate.fit import fit_profile  # noqa: E402
from commsim.calibrate.records import read_results  # noqa: E402
from commsim.calibrate.testbed import runner  # noqa: E402
from commsim.calibrate.testbed.spec import GOODPUT, TestbedSpec, cluster_spec, load_testbed  # noqa: E402
from commsim.calibrate.validate import validate  # noqa: E402
from commsim.cli.app import app  # noqa: E402

MIB = 2**20
# all-gather on 3 ranks moves a multiple of 3 floats: its "1 MiB" point is 1,048,572 B
FLOOR = MIB - 64
HALF = FLOOR // 2  # at half the rate: the wire time of FLOOR at the full rate
TOL = 0.15
# the CLI test's largest points: the model's share of the error (the repeatability
# benchmark's runs: within 2.0%; a quiet CI run -2.4%), to which the point's measured
# half-spread, (p90 - p10) / 2 over the median, is added up to TOP_NOISY; a point spread
# wider is held to TOP_MODEL or the uncalibrated model's own error there, the worse (its
# noise would excuse the uncalibrated model's 4.8-6.2%; a loaded run spread a 2 MiB
# all-gather 5.7% and put the calibrated model 3.1% off)
TOP_MODEL, TOP_NOISY = 0.03, 0.05
OPS = "all-reduce,all-gather"

pytestmark = [
    pytest.mark.root,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
        reason="the emulated cluster needs root and iproute2 (ip, tc) for network namespaces",
    ),
]


def _cli(*args: str) -> str:
    """One commsim command as a user types it (the CLI's own app, in this process: no
    interpreter start and import per command); its stdout."""
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, f"commsim {' '.join(args)}:\n{done.output}"
    return done.stdout


def _testbed(tmp_path: Path, name: str, racks: int, hosts: int, host: str, uplink: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    prefix = f"cs{name[:3]}{os.getpid() % 1000}"
    path.write_text(
        f"name: {name}\nracks: {racks}\nhosts_per_rack: {hosts}\nhost_rate: {host}\n"
        f"uplink_rate: {uplink}\nprefix: {prefix}\n"
    )
    return path


def _harness(*flags: str) -> list[str]:
    run = ["--", "env", "OMP_NUM_THREADS=1", sys.executable, "-m", "commsim.cli.calibrate"]
    return [*run, "run", "--backend", "gloo", "--bucket-mb", "", "--warmup", "2", *flags]


@dataclass(frozen=True)
class FitBed:
    """The fitted testbed, up: its spec, the cluster YAML `testbed up` wrote, and the
    results file holding its link check and the fit's sweep."""

    spec: TestbedSpec
    cluster: Path
    results: Path


@pytest.fixture(scope="module")
def fit_bed(tmp_path_factory):
    """2 racks x 2 hosts at 80 Mbit/s (2:1), brought up, checked and swept through the CLI
    alone: the blocked placement's 4 ranks and rank 0's rack (2 ranks), all-reduce,
    all-gather and broadcast from 128 KiB to 2 MiB. Both tests fit this one sweep; the bed
    stays up for the placements the first test measures, and is always torn down."""
    tmp = tmp_path_factory.mktemp("fitshape")
    path = _testbed(tmp, "fitshape", 2, 2, "80Mbps", "80Mbps")
    cluster, results = tmp / "small-cluster.yaml", tmp / "fit.jsonl"
    try:
        _cli("testbed", "up", str(path), "--cluster-out", str(cluster))
        _cli("testbed", "check", str(path), "--seconds", "1", "--out", str(results))
        _cli("testbed", "run", str(path), "--timeout", "400", *_harness(
            "--out", str(results), "--ops", "all-reduce,all-gather,broadcast",
            "--sizes", "128KiB:2MiB", "--groups", "tiers", "--repeats", "8"))  # fmt: skip
        yield FitBed(load_testbed(path), cluster, results)
    finally:
        _cli("testbed", "down", "--prefix", yaml.safe_load(path.read_text())["prefix"])


def _measure(spec: TestbedSpec, out: Path, placement: str, world: int, sizes: str) -> None:
    """`commsim calibrate run` on every rank of the placement, as a user would run it: 8
    repeats, as the fit's sweep (the harness's 2 s point budget cuts the 1-2 MiB points to
    3-8 anyway; the bars below are on medians, with the observed errors within 8%)."""
    cmd = ["env", "OMP_NUM_THREADS=1"]  # 4 ranks share 2 cores: no intra-op thread pools
    cmd += [sys.executable, "-m", "commsim.cli.calibrate", "run", "--out", str(out)]
    cmd += ["--backend", "gloo", "--ops", OPS, "--sizes", sizes]
    cmd += ["--groups", "world", "--bucket-mb", "", "--warmup", "2", "--repeats", "8"]
    cmd += ["--timeout", "60"]
    result = runner.run(spec, cmd, placement, world, timeout=180, port=29571)
    tail = "\n".join(f"[{r}] {line}" for r, line in result.lines[-20:])
    assert result.returncode == 0, f"{placement} x{world} failed:\n{tail}"


def _table(rows) -> str:
    return "\n".join(
        f"  {r.op:10s} {r.group_size} ranks {r.bytes / MIB:5.2f} MiB: measured "
        f"{r.measured_s * 1e3:7.1f} ms, predicted {r.predicted_s * 1e3:7.1f} ms, "
        f"{100 * r.error:+5.1f}%"
        for r in rows
    )


def test_fit_one_placement_predict_another_and_another_world_size(fit_bed, tmp_path):
    bed = fit_bed.spec
    cluster = cluster_spec(bed)
    # the fit sees the whole sweep (fit_bed's); the predictions are checked from 512 KiB, so
    # only those sizes are measured (the smaller ones took 10-25% of each run, never checked)
    runs = {"interleaved": ("interleaved", 4), "world3": ("interleaved", 3)}
    files = {name: tmp_path / f"{name}.jsonl" for name in runs}
    for name, (placement, world) in runs.items():
        _measure(bed, files[name], placement, world, "512KiB:2MiB")

    fitted = fit_profile(read_results(fit_bed.results), cluster, source=str(fit_bed.results))
    profile = fitted.profile
    assert set(profile.tiers) == {"inter-node", "cross-rack"}  # the data separate the tiers
    # the fitted rates are TCP goodput on 80 Mbit/s links (10 MB/s line rate): 95.6%
    for name, tier in profile.tiers.items():  # the links, not the CPU, set the rate
        share = tier.bandwidth_Bps / (bed.host_rate * GOODPUT)
        print(f"{name}: {share:.3f} of goodput")
        why = "the CPU, not the link, set the rate" if share < 1 else "more than the link carries"
        assert abs(share - 1) <= 0.1, (
            f"{name} fitted at {share:.3f} of the links' TCP goodput: {why} (load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )

    checked = {
        name: validate(read_results(files[name]), cluster, profile, min_bytes=HALF)
        for name in ("interleaved", "world3")
    }
    big = {
        name: [r for r in v.rows if r.kind == "collective" and r.bytes >= HALF]
        for name, v in checked.items()
    }
    # what was measured: both ops at 512 KiB, 1 and 2 MiB, every group across the racks
    for name, world in (("interleaved", 4), ("world3", 3)):
        rows = big[name]
        assert sorted({r.op for r in rows}) == ["all-gather", "all-reduce"]
        assert len(rows) == 6 and all(r.span == "cross-rack" for r in rows)
        assert all(r.group_size == world for r in rows)

    # the placement matters twofold here: predicting it is not a formality
    blocked = validate(read_results(fit_bed.results), cluster, profile)
    for op in ("all-reduce", "all-gather"):
        b = next(r for r in blocked.rows if r.op == op and r.group_size == 4 and r.bytes == 2 * MIB)
        i = next(r for r in big["interleaved"] if r.op == op and r.bytes == 2 * MIB)
        print(f"{op}: interleaved / blocked {i.measured_s / b.measured_s:.3f} measured, "
              f"{i.predicted_s / b.predicted_s:.3f} predicted")  # fmt: skip
        assert i.measured_s / b.measured_s == pytest.approx(2.0, rel=0.15)
        assert i.predicted_s / b.predicted_s == pytest.approx(2.0, rel=0.1)

    # the bar: every point of 512 KiB and more within 15%, for both predictions
    for name, rows in big.items():
        print(f"{name}:\n{_table(rows)}")  # shown with -s
        worst = max(abs(r.error) for r in rows)
        assert worst <= TOL, f"{name}: a prediction is {100 * worst:.1f}% off:\n{_table(rows)}"
        assert float(np.median([abs(r.error) for r in rows])) <= TOL


def test_a_profile_fitted_on_one_shape_predicts_another_through_the_cli_alone(fit_bed, tmp_path):
    """Fit on 2 racks x 2 hosts at 80 Mbit/s (2:1); predict 2 racks x 3 hosts at
    50 Mbit/s (3:1): another host count, rate and oversubscription, with nothing written
    by hand. (Where flows share an uplink or pass onto a slower one, 1-2 MiB collectives
    run 5-30% over the model on this testbed: benchmarks/bench_repeatability.py measures
    those shapes too; here the largest points are held within 3% plus their measured spread: the
    repeatability benchmark's runs put them within 2.0%, and uncalibrated they are off by
    4.8-6.2%.) The rates are half what they were (160 and 100 Mbit/s), so that the ranks
    inject at most 40% of what the two cores forward (testbed.spec.CPU_BUDGET): at the old
    rates a loaded host made the CPU set the rate, the fit read bandwidths up to 2.6% over
    TCP goodput and 4 MiB points missed by up to 11% (benchmarks/RESULTS.md). The sizes
    are halved with the rates, so every point keeps its wire time: 2 MiB here is what
    4 MiB was, 512 KiB what 1 MiB was; the fit's sweep starts at 128 KiB (the wire time of
    256 KiB before: loaded, the 64-128 KiB points' repeats spread 32-44%). The fit is
    fit_bed's sweep, made through the CLI."""
    other = _testbed(tmp_path, "othershape", 2, 3, "50Mbps", "50Mbps")
    held, other_yaml = tmp_path / "held.jsonl", tmp_path / "other-cluster.yaml"
    prof = tmp_path / "profile.yaml"
    fitted = json.loads(
        _cli(
            "calibrate",
            "fit",
            str(fit_bed.results),
            "--cluster",
            str(fit_bed.cluster),
            "-o",
            str(prof),
            "--json",
        )  # fmt: skip
    )
    assert set(fitted["tiers"]) == {"inter-node", "cross-rack"}
    for name, tier in fitted["tiers"].items():  # shown with -s
        print(f"{name}: efficiency {tier['efficiency']:.4f}, 95% {tier['efficiency_ci']}")
    for tier in fitted["tiers"].values():  # TCP goodput is 95.6% of the line rate
        assert tier["efficiency"] == pytest.approx(GOODPUT, abs=0.04)
    try:
        _cli("testbed", "up", str(other), "--cluster-out", str(other_yaml))
        _cli("testbed", "run", str(other), "--placement", "blocked", "--timeout", "400",
             *_harness("--out", str(held), "--ops", "all-reduce,all-gather", "--sizes",
                       "512KiB:2MiB", "--groups", "world", "--repeats", "5"))  # fmt: skip
    finally:
        _cli("testbed", "down", "--prefix", yaml.safe_load(other.read_text())["prefix"])
    args = ["calibrate", "validate", str(held), "--cluster", str(other_yaml), "--json"]
    calibrated = json.loads(_cli(*args, "--profile", str(prof), "--min-bytes", str(HALF)))
    plain = json.loads(_cli(*args, "--min-bytes", str(HALF)))
    assert calibrated["notes"][0] == "carried over from 'fitshape' (gloo):"
    rows = [r for r in calibrated["rows"] if r["bytes"] >= HALF]
    print("\n".join(f"{r['op']} {r['bytes']:.0f} B: {100 * r['error']:+.1f}%" for r in rows))
    assert len(rows) == 6 and calibrated["points"] == 6
    print(f"median {calibrated['median_abs_pct_error']:.2f}%, "
          f"uncalibrated {plain['median_abs_pct_error']:.2f}%")  # fmt: skip
    assert calibrated["median_abs_pct_error"] <= 5.0
    assert calibrated["median_abs_pct_error"] <= plain["median_abs_pct_error"]
    # the largest points: within TOP_MODEL plus the point's own measured spread; a point
    # whose spread alone passes TOP_NOISY cannot tell the calibrated model from the
    # uncalibrated one, so there the calibrated one is held to the worse of TOP_MODEL and
    # the uncalibrated one's error on that point (the median check above covers the rest)
    uncalibrated = {(r["op"], r["bytes"]): abs(r["error"]) for r in plain["rows"]}
    spread = {
        (r["op"], r["bytes"]): (r["p90_s"] - r["p10_s"]) / 2 / r["time_s"]
        for r in map(json.loads, held.read_text().splitlines())
        if r.get("kind") == "collective" and r.get("status") == "ok"
    }
    for r in (r for r in rows if r["bytes"] >= 2 * MIB - 64):
        noise = spread[r["op"], r["bytes"]]
        noisy = max(TOP_MODEL, uncalibrated[r["op"], r["bytes"]])
        allowed = TOP_MODEL + noise if noise <= TOP_NOISY else noisy
        assert abs(r["error"]) <= allowed, f"{r}: repeats spread {noise:.1%}"
