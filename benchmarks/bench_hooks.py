"""PyTorch's DDP comm hooks on the emulated cluster: measured against predicted speedups.

Brings a testbed up (default testbeds/2x2-oversub.yaml: 4 hosts, 160 Mbit/s links, 2:1
uplinks), runs `commsim calibrate run` on every host with a small-size all-reduce sweep
on the world and on rank 0's rack (for the fit) and the DDP step of a 2.7M-parameter MLP
with no hook, fp16 and PowerSGD, then prints each hook's measured and predicted speedup
over plain DDP twice: with the catalog cluster (no profile), and with a profile fitted to
the sweep of the same run.

Needs root, iproute2 and torch; about a minute per repeat.
Run: sudo .venv/bin/python benchmarks/bench_hooks.py [--testbed FILE] [--repeats N]
     [--sizes 16KiB:4MiB]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from commsim.calibrate import hooks
from commsim.calibrate.fit import fit_profile
from commsim.calibrate.records import read_results
from commsim.calibrate.testbed import network, runner
from commsim.calibrate.testbed.spec import TestbedSpec, cluster_spec, load_testbed

ROOT = Path(__file__).resolve().parent.parent
HOOKS = "none,fp16,powersgd:1,powersgd:4"
# 384 wide, 2 blocks: 10.6 MB of fp32 gradients, ~1 s to all-reduce at 160 Mbit/s
# against ~15 ms of compute, so the hooks' traffic decides the step.
MODEL = ["--width", "384", "--depth", "2", "--batch", "32", "--bucket-mb", "25"]


def measure(bed: TestbedSpec, out: Path, sizes: str) -> float:
    """One harness run on every host of the testbed; its wall seconds."""
    cmd = ["env", "OMP_NUM_THREADS=1", sys.executable, "-m", "commsim.cli.calibrate"]
    cmd += ["run", "--out", str(out), "--ops", "all-reduce", "--sizes", sizes]
    cmd += ["--groups", "tiers", "--warmup", "2", "--repeats", "10", *MODEL]
    cmd += ["--comm-hooks", HOOKS, "--timeout", "60"]
    t0 = time.monotonic()
    result = runner.run(bed, cmd, timeout=300)
    if result.returncode != 0:
        tail = "\n".join(f"[{r}] {line}" for r, line in result.lines[-20:])
        raise SystemExit(f"harness failed:\n{tail}")
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", default=str(ROOT / "testbeds" / "2x2-oversub.yaml"))
    ap.add_argument("--repeats", type=int, default=1, help="independent harness runs")
    ap.add_argument("--sizes", default="16KiB:4MiB", help="all-reduce sweep the fit sees")
    args = ap.parse_args()
    bed = load_testbed(Path(args.testbed)).model_copy(update={"prefix": "cshooks"})
    spec = cluster_spec(bed)
    print("| run | profile | hook | measured step | speedup | predicted step | speedup | error |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            network.up(bed)
            for i in range(args.repeats):
                out = Path(tmp) / f"run{i}.jsonl"
                took = measure(bed, out, args.sizes)
                results = read_results(out)
                fitted = fit_profile(results, spec, source=str(out)).profile
                for label, prof in (("none", None), ("fitted", fitted)):
                    for h in hooks.hook_speedups(results, spec, prof):
                        print(
                            f"| {i + 1} | {label} | {h.compression} | "
                            f"{1e3 * h.measured_step_s:.1f} ms | {h.measured_speedup:.2f}x | "
                            f"{1e3 * h.predicted_step_s:.1f} ms | {h.predicted_speedup:.2f}x | "
                            f"{100 * h.error:+.1f}% |"
                        )
                tiers = ", ".join(
                    f"{t} {1e6 * f.alpha_s:.0f} us, {f.bandwidth_Bps / 1e6:.2f} MB/s"
                    for t, f in fitted.tiers.items()
                )
                print(f"<!-- run {i + 1}: {took:.0f} s; fitted {tiers} -->")
        finally:
            network.down(bed.prefix)


if __name__ == "__main__":
    main()
