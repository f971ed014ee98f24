"""Profiler traces of the harness's DDP step on the emulated cluster: what the trace summary
says against the harness's own clock, and commsim's prediction from the imported step.

Brings a testbed up (default testbeds/2x2-oversub.yaml: 4 hosts, 160 Mbit/s links, 2:1
uplinks), runs `commsim calibrate run --profile-dir` on every host (an all-reduce sweep for
the fit, then the DDP step of a 1.2M-parameter MLP in 25 MiB buckets, profiled), then
prints per rank:

- the trace's step, compute and exposed communication (commsim.traces.summary) against the
  harness's timings of the same steps (embedded in each trace as commsim_harness): step
  and exposed of the full steps (exposed by the harness's hooks, calibrate.harness.
  commclock: the same quantity), compute of the no_sync steps; medians over the steps, and
  the worst step's exposed error; beside them the harness's older estimate, full step -
  no_sync compute, which also counts how much slower compute runs next to communication;
- the step predicted from the imported trace (every rank's step as one graph, its
  collectives priced on the testbed's cluster with a profile fitted to the sweep of the
  same run, compute as traced) against the measured step.

Needs root, iproute2 and torch; about two minutes.
Run: sudo .venv/bin/python benchmarks/bench_traces.py [--testbed FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from commsim.calibrate.fit import fit_profile
from commsim.calibrate.records import read_results
from commsim.calibrate.testbed import network, runner
from commsim.calibrate.testbed.spec import TestbedSpec, cluster_spec, load_testbed
from commsim.profile import apply_profile
from commsim.topology.build import build_cluster
from commsim.traces.imported import import_step
from commsim.traces.kineto import RankTrace, read_kineto
from commsim.traces.pricing import ClusterPricer
from commsim.traces.replay import replay
from commsim.traces.summary import step_figures

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["--width", "256", "--depth", "2", "--batch", "32", "--bucket-mb", "25"]


def measure(bed: TestbedSpec, out: Path, prof: Path, world: int = 4) -> None:
    """One harness run, profiled, on the first `world` hosts of the testbed."""
    cmd = ["env", "OMP_NUM_THREADS=1", sys.executable, "-m", "commsim.cli.calibrate", "run"]
    # from 4 KiB: at 160 Mbit/s 64 KiB takes 3.3 ms, so a sweep starting there leaves alpha
    # (about 0.1 ms) to the noise, and a fit of zero is refused by the fabric's own latency
    cmd += ["--out", str(out), "--ops", "all-reduce", "--sizes", "4KiB:4MiB", "--groups", "tiers"]
    cmd += ["--warmup", "2", "--repeats", "8", *MODEL, "--timeout", "60"]
    cmd += ["--profile-dir", str(prof)]
    result = runner.run(bed, cmd, "blocked", world, timeout=600, port=29573)
    if result.returncode != 0:
        tail = "\n".join(f"[{r}] {line}" for r, line in result.lines[-20:])
        raise RuntimeError(f"harness failed:\n{tail}")


def against_harness(trace: RankTrace) -> dict[str, float]:
    """Medians over the steps of the trace's figures and of the harness's own, same steps,
    and the largest error of a full step's exposed, relative to the harness's."""
    own = {s["step"]: s for s in trace.metadata["commsim_harness"]["steps"]}
    rows = [(own[s.number], step_figures(trace, k)) for k, s in enumerate(trace.steps)]
    comp = [r for r in rows if r[0]["kind"] == "compute"]
    full = [r for r in rows if r[0]["kind"] == "step"]
    h_compute = float(np.median([h["s"] for h, _ in comp]))
    h_step = float(np.median([h["s"] for h, _ in full]))
    worst = max(abs(f.exposed_comm_s / h["exposed_s"] - 1) for h, f in full)
    return {
        "harness_compute_s": h_compute,
        "harness_step_s": h_step,
        "harness_exposed_s": float(np.median([h["exposed_s"] for h, _ in full])),
        "harness_step_minus_compute_s": h_step - h_compute,
        "trace_compute_s": float(np.median([f.compute_s for _, f in comp])),
        "trace_step_s": float(np.median([f.step_s for _, f in full])),
        "trace_exposed_s": float(np.median([f.exposed_comm_s for _, f in full])),
        "trace_step_compute_s": float(np.median([f.compute_s for _, f in full])),
        "worst_exposed_error": worst,
    }


def predicted(traces: list[RankTrace], cluster, algorithm: str) -> tuple[float, float]:
    """(median measured, median predicted) step of the full steps, every rank's graph."""
    numbers = [
        s.number
        for s in traces[0].steps
        if traces[0].metadata["commsim_harness"]["steps"][s.number]["kind"] == "step"
    ]
    measured, priced = [], []
    for n in numbers:
        graph = import_step(traces, n)
        price = ClusterPricer(graph, cluster, len(traces), algorithm)
        priced.append(replay(graph, price).step_s)
        k = next(i for i, s in enumerate(traces[0].steps) if s.number == n)
        measured.append(max(t.window(k)[1] - t.window(k)[0] for t in traces))
    return float(np.median(measured)), float(np.median(priced))


def run(bed: TestbedSpec, tmp: Path) -> dict:
    out, prof = tmp / "results.jsonl", tmp / "prof"
    measure(bed, out, prof)
    spec = cluster_spec(bed)
    profile = fit_profile(read_results(out), spec, source=str(out)).profile
    traces = [read_kineto(p) for p in sorted(prof.glob("*-rank*.json"))]
    cluster = build_cluster(apply_profile(spec, profile), len(traces))
    ranks = [against_harness(t) | {"rank": t.rank} for t in traces]
    m, p = predicted(traces, cluster, profile.algorithms["all-reduce"])
    return {"ranks": ranks, "measured_step_s": m, "predicted_step_s": p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", default=str(ROOT / "testbeds" / "2x2-oversub.yaml"))
    ap.add_argument("--keep", help="keep the results and traces in this folder")
    args = ap.parse_args()
    bed = load_testbed(Path(args.testbed)).model_copy(update={"prefix": "cstrace"})
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        try:
            network.up(bed)
            doc = run(bed, where)
        finally:
            network.down(bed.prefix)
    print(
        "| rank | step: harness / trace | compute: harness / trace | exposed: harness / trace "
        "| errors: step, compute, exposed (worst step) | step - compute: harness |"
    )
    print("| ---: | ---: | ---: | ---: | --- | ---: |")
    for r in doc["ranks"]:
        errs = [
            r["trace_step_s"] / r["harness_step_s"] - 1,
            r["trace_compute_s"] / r["harness_compute_s"] - 1,
            r["trace_exposed_s"] / r["harness_exposed_s"] - 1,
        ]
        print(
            f"| {r['rank']} | {1e3 * r['harness_step_s']:.1f} / {1e3 * r['trace_step_s']:.1f} ms "
            f"| {1e3 * r['harness_compute_s']:.2f} / {1e3 * r['trace_compute_s']:.2f} ms "
            f"| {1e3 * r['harness_exposed_s']:.1f} / {1e3 * r['trace_exposed_s']:.1f} ms | "
            + ", ".join(f"{100 * e:+.2f}%" for e in errs)
            + f" ({100 * r['worst_exposed_error']:.2f}%) "
            f"| {1e3 * r['harness_step_minus_compute_s']:.1f} ms |"
        )
    m, p = doc["measured_step_s"], doc["predicted_step_s"]
    print(
        f"\npredicted from the imported trace: {1e3 * p:.1f} ms against {1e3 * m:.1f} ms "
        f"measured ({100 * (p / m - 1):+.1f}%)"
    )


if __name__ == "__main__":
    main()
