"""Calibration end to end on the emulated cluster: measure one placement for real, fit,
then predict a different placement and a different world size and measure those too.

The testbed is testbeds/2x2-oversub.yaml (2 racks x 2 hosts, 160 Mbit/s host links, one
160 Mbit/s uplink per rack: 2:1). The fit sees only the blocked placement of 4 ranks (r0h0
r0h1 | r1h0 r1h1), whose ring crosses each uplink once per direction, and the rack's own
2-rank group. It must then predict

- the interleaved placement of 4 ranks (r0h0 r1h0 r0h1 r1h1): every ring hop crosses the
  racks, two flows share each uplink, and collectives take twice as long; and
- 3 ranks spread over both racks (r0h0 r1h0 r0h1), a world size it never saw,

within 15% for every measured size of 1 MiB and more (the issue's bar), for all-reduce
and all-gather with gloo. Both must run: the placement changes the time twofold, so a
model that ignored the topology would miss by ~50%.

Why these choices (see benchmarks/RESULTS.md, "Calibration accuracy on the emulated
testbed"): the sweep starts at 64 KiB because below it this 2-core machine's scheduling
latency (about 1 ms per ring step with 4 ranks, 0.25 ms with 2) swamps the link's, and a
fit that includes those points pulls the bandwidth above the line rate. all-to-all, and a
2-rank all-gather or send-recv, send a large message to a peer while receiving one from it,
which gloo over TCP does not overlap here (a 2-rank send-recv takes twice the model's time;
gloo's all-reduce, cut into small segments, is unaffected, and a plain TCP socket in the
same namespaces carries both directions at full rate): benchmarked, not asserted.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the harness needs torch (pip install 'commsim[calibrate]')")

from commsim.calibrate.fit import fit_profile  # noqa: E402
from commsim.calibrate.records import read_results  # noqa: E402
from commsim.calibrate.testbed import network, runner  # noqa: E402
from commsim.calibrate.testbed.spec import GOODPUT, TestbedSpec, cluster_spec, load_testbed  # noqa: E402
from commsim.calibrate.validate import validate  # noqa: E402

OVERSUB = Path(__file__).resolve().parent.parent / "testbeds" / "2x2-oversub.yaml"
MIB = 2**20
# all-gather on 3 ranks moves a multiple of 3 floats: its "1 MiB" point is 1,048,572 B
FLOOR = MIB - 64
TOL = 0.15
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


@pytest.fixture(scope="module")
def bed():
    """2x2-oversub under a prefix of its own, always torn down."""
    spec = load_testbed(OVERSUB).model_copy(update={"prefix": f"cse2e{os.getpid() % 10000}"})
    try:
        network.up(spec)
        yield spec
    finally:
        network.down(spec.prefix)


def _measure(spec: TestbedSpec, out: Path, placement: str, world: int, groups: str) -> None:
    """`commsim calibrate run` on every rank of the placement, as a user would run it."""
    cmd = [
        "env",
        "OMP_NUM_THREADS=1",  # 4 ranks share 2 cores: no intra-op thread pools
        sys.executable,
        "-m",
        "commsim.cli.calibrate",
        "run",
        "--out",
        str(out),
        "--backend",
        "gloo",
        "--ops",
        OPS,
        "--sizes",
        "64KiB:4MiB",
        "--groups",
        groups,
        "--bucket-mb",
        "",
        "--warmup",
        "2",
        "--repeats",
        "15",
        "--timeout",
        "60",
    ]
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


def test_fit_one_placement_predict_another_and_another_world_size(bed, tmp_path):
    cluster = cluster_spec(bed)
    runs = {
        "fit": ("blocked", 4, "tiers"),  # the world and rank 0's rack (2 ranks)
        "interleaved": ("interleaved", 4, "world"),
        "world3": ("interleaved", 3, "world"),
    }
    files = {name: tmp_path / f"{name}.jsonl" for name in runs}
    for name, (placement, world, groups) in runs.items():
        _measure(bed, files[name], placement, world, groups)

    fitted = fit_profile(read_results(files["fit"]), cluster, source=str(files["fit"]))
    profile = fitted.profile
    assert set(profile.tiers) == {"inter-node", "cross-rack"}  # the data separate the tiers
    # the fitted rates are TCP goodput on 160 Mbit/s links (20 MB/s line rate): 95.6%
    for tier in profile.tiers.values():
        assert tier.bandwidth_Bps == pytest.approx(bed.host_rate * GOODPUT, rel=0.1)

    checked = {
        name: validate(read_results(files[name]), cluster, profile, min_bytes=FLOOR)
        for name in ("interleaved", "world3")
    }
    big = {
        name: [r for r in v.rows if r.kind == "collective" and r.bytes >= FLOOR]
        for name, v in checked.items()
    }
    # what was measured: both ops at 1, 2 and 4 MiB, every group across the racks
    for name, world in (("interleaved", 4), ("world3", 3)):
        rows = big[name]
        assert sorted({r.op for r in rows}) == ["all-gather", "all-reduce"]
        assert len(rows) == 6 and all(r.span == "cross-rack" for r in rows)
        assert all(r.group_size == world for r in rows)

    # the placement matters twofold here: predicting it is not a formality
    blocked = validate(read_results(files["fit"]), cluster, profile)
    for op in ("all-reduce", "all-gather"):
        b = next(r for r in blocked.rows if r.op == op and r.group_size == 4 and r.bytes == 4 * MIB)
        i = next(r for r in big["interleaved"] if r.op == op and r.bytes == 4 * MIB)
        assert i.measured_s / b.measured_s == pytest.approx(2.0, rel=0.15)
        assert i.predicted_s / b.predicted_s == pytest.approx(2.0, rel=0.1)

    # the bar: every point of 1 MiB and more within 15%, for both predictions
    for name, rows in big.items():
        print(f"{name}:\n{_table(rows)}")  # shown with -s
        worst = max(abs(r.error) for r in rows)
        assert worst <= TOL, f"{name}: a prediction is {100 * worst:.1f}% off:\n{_table(rows)}"
        assert float(np.median([abs(r.error) for r in rows])) <= TOL
