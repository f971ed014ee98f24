"""Repeatability of calibration on the emulated testbed (issue 15): the same calibration run
several times, each profile carried over to testbed shapes its fit never saw, and DDP steps.

Calibration, as the issue's new user ran it: testbeds/2x2-oversub.yaml at its own rates
(160 Mbit/s host links and uplinks, 2:1), blocked, `--groups tiers` (the world and rank 0's
rack), 64 KiB-4 MiB, every op, gloo; `commsim testbed check --out` first, so the fit
compares its bandwidths with the link check. Every run brings the testbed up, measures and
fits anew. Held out, each measured once by its own harness run on its own testbed: other
host counts, rates and oversubscription (2 racks x 3 hosts at 100 Mbit/s, 3:1; 3 racks x 2
hosts at 200 Mbit/s with 100 Mbit/s uplinks, 4:1; 2 racks x 2 hosts at 50 Mbit/s, 2:1; one
rack of 2 hosts at 320 Mbit/s), blocked and interleaved, all-reduce and all-gather of
1-4 MiB; and the DDP step of a 34 MiB model (MLP 512 wide, 4 blocks) with 1, 25 and 100 MiB
bucket caps on the calibration shape.

Each run's profile predicts every held-out point by carrying its link classes over to the
shape's cluster (profile.carry_over: alpha as fitted, bandwidth as its share of the line
rate at the shape's own rates); the uncalibrated prediction is the shape's cluster as
`commsim testbed cluster` writes it (line rates, placeholder latencies). Criteria (issue
15): fitted bandwidths agree within 3% across runs, each run's alphas lie within the other
runs' intervals; held-out all-reduce and all-gather of 1 MiB and more: median |error| at or
under 5% in every run and never worse than uncalibrated; DDP steps within 8%. Also shown:
the first run's profile carried to a held-out shape through the CLI alone (testbed
cluster, calibrate fit, calibrate validate), which must give the API's numbers.

Needs root, iproute2 and torch; about 15 minutes on a 2-core machine.
Run: sudo .venv/bin/python benchmarks/bench_repeatability.py [--runs 4] [--json FILE]
     [--keep DIR]; --measured DIR fits and predicts what --keep DIR kept; --from-json FILE
     reprints a report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_calibration import FLOOR, OPS, TESTBEDS, Measure, measure

from commsim.calibrate.fit import fit_profile
from commsim.calibrate.records import append_records, read_results
from commsim.calibrate.testbed import goodput, network
from commsim.calibrate.testbed.spec import TestbedSpec, cluster_spec, load_testbed
from commsim.calibrate.validate import validate

PREFIX = "csrep"
CAL = Measure("blocked", 4, "tiers", "64KiB:4MiB", "", OPS)
HELD_OPS = "all-reduce,all-gather"
BIG = "1MiB:4MiB"
DDP = Measure("blocked", 4, "world", "1MiB:1MiB", "1,25,100", "all-reduce",
              ("--width", "512", "--depth", "4", "--batch", "32"))  # fmt: skip
GOALS = {"bandwidth spread": 3.0, "held-out median": 5.0, "ddp step": 8.0}


@dataclass(frozen=True)
class Shape:
    """A held-out testbed: racks x hosts at its own rates, and what is measured on it."""

    name: str
    racks: int
    hosts: int
    host_mbit: float
    uplink_mbit: float
    measures: tuple[Measure, ...]

    def spec(self) -> TestbedSpec:
        return TestbedSpec.model_validate(
            {
                "name": self.name,
                "racks": self.racks,
                "hosts_per_rack": self.hosts,
                "host_rate": f"{self.host_mbit}Mbps",
                "uplink_rate": f"{self.uplink_mbit}Mbps",
                "prefix": PREFIX,
            }
        )


def _held(placement: str, world: int) -> Measure:
    return Measure(placement, world, "world", BIG, "", HELD_OPS)


SHAPES = (
    Shape("2x3-3to1-100M", 2, 3, 100, 100, (_held("blocked", 6), _held("interleaved", 6))),
    Shape("3x2-4to1-200M", 3, 2, 200, 100, (_held("blocked", 6), _held("interleaved", 6))),
    Shape("2x2-2to1-50M", 2, 2, 50, 50, (_held("interleaved", 4), _held("interleaved", 3))),
    Shape("1x2-320M", 1, 2, 320, 320, (_held("blocked", 2),)),
)


def _calibration_spec() -> TestbedSpec:
    base = load_testbed(TESTBEDS / "2x2-oversub.yaml")
    return base.model_copy(update={"prefix": PREFIX})


def _links(spec: TestbedSpec, out: Path, log) -> list[dict]:
    """The link check, appended to the results file as `testbed check --out` does."""
    rows = goodput.check(spec, seconds=1.0)
    record = {"kind": "link-check", "run": f"check-{time.time_ns()}", "testbed": spec.name}
    append_records(out, [record | {"links": rows}])
    for r in rows:
        log(f"   link check {r['link']:30s} ratio {r['ratio']:.3f} CPU {100 * r['cpu_busy']:.0f}%")
    return rows


def on_testbed(spec: TestbedSpec, jobs: list[tuple[Measure, Path]], log) -> list[dict]:
    """Bring the testbed up, check its links into the first file, run every job, tear it
    down; the link check and each job's wall time and CPU load."""
    try:
        network.up(spec)
        done = [{"links": _links(spec, jobs[0][1], log)}]
        for m, out in jobs:
            info = measure(spec, m, out)
            log(f"   measured {spec.name} {m.label}: {info['wall_s']:.0f} s, CPU "
                f"{100 * info['cpu_busy']:.0f}% busy")  # fmt: skip
            done.append(info)
        return done
    finally:
        network.down(spec.prefix)


def _profile_doc(profile) -> dict:
    return {
        "tiers": {t: f.model_dump() for t, f in profile.tiers.items()},
        "call_overhead_s": profile.call_overhead_s,
        "call_overhead_ci_s": profile.call_overhead_ci_s,
        "warnings": profile.warnings,
        "notes": profile.notes,
        "robust_sd": profile.provenance.robust_sd,
    }


def _errors(checked, kind: str = "collective") -> list[dict]:
    """All-reduce and all-gather of 1 MiB and more (kind collective), or the DDP steps
    (kind ddp-step), of a validation."""
    return [
        {
            "kind": r.kind,
            "op": r.op,
            "ranks": r.group_size,
            "bytes": r.bytes,
            "bucket_mb": r.bucket_mb,
            "measured_s": r.measured_s,
            "predicted_s": r.predicted_s,
            "error_pct": 100 * r.error,
        }  # fmt: skip
        for r in checked.rows
        if r.kind == kind
        and not r.unmodelled
        and (kind == "ddp-step" or (r.bytes >= FLOOR and r.op in ("all-reduce", "all-gather")))
    ]


def cli_demo(cal_file: Path, shape: Shape, held_file: Path, workdir: Path, profile) -> dict:
    """The first run's data through the CLI alone: the clusters from their testbeds, the
    fit, and the held-out validation with the profile carried over; and the same
    validation by the API with the benchmark's own fit of that run."""
    commsim = [sys.executable, "-m", "commsim.cli"]

    def cli(*args: str) -> str:
        return subprocess.run([*commsim, *args], check=True, capture_output=True, text=True).stdout

    cal_yaml, shape_yaml = workdir / "cal.yaml", workdir / "shape.yaml"
    shape_testbed = workdir / "shape-testbed.yaml"
    shape_testbed.write_text(json.dumps(shape.spec().model_dump(mode="json")))
    cli("testbed", "cluster", str(TESTBEDS / "2x2-oversub.yaml"), "-o", str(cal_yaml))
    cli("testbed", "cluster", str(shape_testbed), "-o", str(shape_yaml))
    prof = workdir / "profile.yaml"
    cli("calibrate", "fit", str(cal_file), "--cluster", str(cal_yaml), "-o", str(prof))
    doc = json.loads(cli("calibrate", "validate", str(held_file), "--cluster", str(shape_yaml),
                         "--profile", str(prof), "--min-bytes", str(FLOOR), "--json"))  # fmt: skip
    api = validate(read_results(held_file), cluster_spec(shape.spec()), profile, min_bytes=FLOOR)
    return {"shape": shape.name, "file": held_file.name, "notes": doc["notes"],
            "median_abs_pct": doc["median_abs_pct_error"],
            "api_median_abs_pct": api.summary("collective")["median_abs_pct_error"]}  # fmt: skip


def _files(workdir: Path, runs: int) -> dict:
    """Where each measurement goes (or went, for --measured)."""
    held = {
        shape.name: [
            workdir / f"{shape.name}-{m.label.replace(' ', '')}.jsonl" for m in shape.measures
        ]  # fmt: skip
        for shape in SHAPES
    }
    cal = [workdir / f"cal-{k}.jsonl" for k in range(runs)]
    return {"cal": cal, "held": held, "ddp": workdir / "ddp.jsonl"}


def measure_all(files: dict, log) -> dict:
    """Every calibration run, held-out shape and the DDP steps, on their testbeds."""
    cal = _calibration_spec()
    info: dict = {"cal": [], "held": {}}
    for k, out in enumerate(files["cal"]):
        log(f"== calibration run {k + 1} of {len(files['cal'])}")
        info["cal"].append(on_testbed(cal, [(CAL, out)], log))
    for shape in SHAPES:
        log(f"== held out: {shape.name}")
        jobs = list(zip(shape.measures, files["held"][shape.name], strict=True))
        info["held"][shape.name] = on_testbed(shape.spec(), jobs, log)
    log("== DDP steps on the calibration shape")
    info["ddp"] = on_testbed(cal, [(DDP, files["ddp"])], log)
    return info


def analyse(files: dict, workdir: Path, log) -> dict:
    """Fit each calibration run, predict the held-out points and the DDP steps with each
    profile and without one, and run the CLI path once."""
    cal_cluster = cluster_spec(_calibration_spec())
    fits = []
    for out in files["cal"]:
        profile = fit_profile(read_results(out), cal_cluster, source=str(out)).profile
        fits.append({"file": str(out), "profile": _profile_doc(profile), "object": profile})
        for t, f in profile.tiers.items():
            log(f"   {out.name} {t}: alpha {f.alpha_s * 1e6:.0f} us, {100 * f.efficiency:.1f}%")
        for w in profile.warnings:
            log(f"   warning: {w}")
    evaluation = evaluate(fits, files["held"], files["ddp"], cal_cluster)
    first = SHAPES[0]
    demo = cli_demo(
        files["cal"][0], first, files["held"][first.name][-1], workdir, fits[0]["object"]
    )
    for f in fits:
        f.pop("object")
    return {"fits": fits, "evaluation": evaluation, "cli": demo}


def evaluate(fits: list[dict], held: dict, ddp_file: Path, cal_cluster) -> dict:
    """Every run's held-out and DDP errors, and the uncalibrated ones."""
    shapes = {s.name: s for s in SHAPES}

    def errors(name: str, profile) -> list[dict]:
        cluster = cluster_spec(shapes[name].spec())
        return [e for f in held[name] for e in _errors(
            validate(read_results(f), cluster, profile, min_bytes=FLOOR))]  # fmt: skip

    out = {"uncalibrated": {name: errors(name, None) for name in held}, "runs": []}
    for fit in fits:
        prof = fit["object"]
        per_shape = {name: errors(name, prof) for name in held}
        ddp = _errors(validate(read_results(ddp_file), cal_cluster, prof), "ddp-step")
        out["runs"].append({"held_out": per_shape, "ddp": ddp})
    unc = validate(read_results(ddp_file), cal_cluster, None)
    out["ddp_uncalibrated"] = _errors(unc, "ddp-step")
    return out


def _median(errors: list[dict]) -> float:
    return float(np.median([abs(e["error_pct"]) for e in errors])) if errors else float("nan")


def report(doc: dict) -> dict:
    """Print the figures against the criteria; returns the verdicts."""
    fits, ev = doc["fits"], doc["evaluation"]
    print("\nfitted link classes (share of line rate; alpha) per run:")
    tiers = list(fits[0]["profile"]["tiers"])
    verdicts = {}
    for t in tiers:
        effs = [f["profile"]["tiers"][t]["efficiency"] for f in fits]
        alphas = [f["profile"]["tiers"][t]["alpha_s"] for f in fits]
        cis = [f["profile"]["tiers"][t]["alpha_ci_s"] for f in fits]
        spread = 100 * (max(effs) / min(effs) - 1)
        outside = sum(
            1 for i, a in enumerate(alphas) for j, ci in enumerate(cis)
            if i != j and ci and not ci[0] <= a <= ci[1]
        )  # fmt: skip
        pairs = len(alphas) * (len(alphas) - 1)
        consensus = float(np.median(alphas))
        missed = sum(1 for c in cis if c and not c[0] <= consensus <= c[1])
        print(f"  {t:10s} efficiency " + ", ".join(f"{100 * e:.2f}%" for e in effs)
              + f" (spread {spread:.2f}%); alpha " + ", ".join(
                  f"{a * 1e6:.0f} [{c[0] * 1e6:.0f}, {c[1] * 1e6:.0f}] us" if c else
                  f"{a * 1e6:.0f} us" for a, c in zip(alphas, cis, strict=True)))  # fmt: skip
        print(
            f"  {'':10s} alphas outside another run's interval: {outside} of {pairs}; "
            f"intervals without the runs' median {consensus * 1e6:.0f} us: {missed}"
        )
        verdicts[f"{t} bandwidth spread <= 3%"] = spread <= GOALS["bandwidth spread"]
        verdicts[f"{t} alphas within the others' intervals"] = outside == 0
    overheads = [f["profile"]["call_overhead_s"] for f in fits]
    print("  per-call constant: " + ", ".join(f"{o * 1e3:+.2f} ms" for o in overheads))
    cal = doc.get("measurements", {}).get("cal")
    if cal:  # the CPU's busy share while each calibration run measured (all its users)
        print("  CPU busy while measuring: " + ", ".join(
            f"{100 * c[1]['cpu_busy']:.0f}%" for c in cal))  # fmt: skip
    unc = ev["uncalibrated"]
    unc_all = [e for v in unc.values() for e in v]
    print("\nheld-out all-reduce and all-gather >= 1 MiB, median |error| (worst):")
    print(f"  {'uncalibrated':14s} all {_median(unc_all):5.2f}%  " + "  ".join(
        f"{n} {_median(v):5.2f}%" for n, v in unc.items()))  # fmt: skip
    for k, run in enumerate(ev["runs"]):
        every = [e for v in run["held_out"].values() for e in v]
        worst = max(abs(e["error_pct"]) for e in every)
        print(
            f"  {'run ' + str(k + 1):14s} all {_median(every):5.2f}% ({worst:.1f}%)  "
            + "  ".join(f"{n} {_median(v):5.2f}%" for n, v in run["held_out"].items())
        )
        verdicts[f"run {k + 1} held-out median <= 5%"] = _median(every) <= GOALS["held-out median"]
        verdicts[f"run {k + 1} not worse than uncalibrated"] = _median(every) <= _median(unc_all)
        for name, v in run["held_out"].items():
            verdicts[f"run {k + 1} {name} not worse"] = _median(v) <= _median(unc[name])
    print("\nDDP step error by bucket cap (uncalibrated, then each run):")
    row = [f"{e['bucket_mb']:g} MiB {e['error_pct']:+.1f}%" for e in ev["ddp_uncalibrated"]]
    print("  uncalibrated  " + ", ".join(row))
    for k, run in enumerate(ev["runs"]):
        print(f"  run {k + 1:<9d} " + ", ".join(
            f"{e['bucket_mb']:g} MiB {e['error_pct']:+.1f}%" for e in run["ddp"]))  # fmt: skip
        worst = max(abs(e["error_pct"]) for e in run["ddp"])
        verdicts[f"run {k + 1} DDP steps within 8%"] = worst <= GOALS["ddp step"]
    cli = doc["cli"]
    print(
        f"\nCLI alone, run 1 carried to {cli['shape']} ({cli['file']}, >= 1 MiB): median "
        f"{cli['median_abs_pct']:.2f}%, the API {cli['api_median_abs_pct']:.2f}%"
    )
    verdicts["the CLI alone gives the API's prediction"] = bool(
        np.isclose(cli["median_abs_pct"], cli["api_median_abs_pct"], rtol=1e-9)
    )
    print("\ncriteria:")
    for name, ok in verdicts.items():
        print(f"  {'met    ' if ok else 'NOT met'} {name}")
    return verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4, help="calibration runs (at least 4)")
    ap.add_argument("--json", help="write every fit, measurement and error here")
    ap.add_argument("--keep", help="keep the results files (JSONL) in this directory")
    ap.add_argument("--from-json", help="print the report of an earlier --json; measure nothing")
    ap.add_argument("--measured", help="fit and predict what an earlier --keep DIR measured")
    args = ap.parse_args()
    if args.from_json:
        report(json.loads(Path(args.from_json).read_text()))
        return
    if os.geteuid() != 0 and not args.measured:
        raise SystemExit("bench_repeatability needs root (network namespaces): run it with sudo")
    start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.0f} s] {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-repeatability-") as tmp:
        workdir = Path(args.measured or args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        files = _files(workdir, args.runs)
        measured = {"reused": str(workdir)} if args.measured else measure_all(files, log)
        doc = {"measurements": measured} | analyse(files, workdir, log)
    doc |= {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()},
        "wall_s": time.monotonic() - start,
    }
    doc["verdicts"] = report(doc)
    print(f"total {doc['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
