"""Speed at scale (issue 13): the Colossus-class fabric from 1,024 to 131,072 GPUs.

Per GPU count, each in a fresh process (its peak RSS its own): build the fabric, price a
congestion-aware 1 GiB data-parallel all-reduce over every GPU on the graph (ring,
hierarchical and NCCL's choice), and predict a full hybrid-layout step (Llama 3 70B, tp 8,
pp 8, ZeRO-1, 16 micro-batches a replica). Then the start-up of `commsim --help` and of a
`predict` of the default scenario, and (with --sizing) `plan` sizing 1,024 -> 131,072 GPUs
on three fabrics: every fabric and size alone (time and peak memory against GPU count),
then all three in one run (the goal).
Goals: 131,072 GPUs built and both priced in < 60 s and < 4 GiB; sizing < 2 minutes;
--help and the default predict < 1 s.
Run: .venv/bin/python benchmarks/bench_scale.py [--sizing | --sizing-only]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

FABRIC = "colossus-class-131k"
SIZING_FABRICS = "colossus-class-131k,deepseek-mpft-16k,dgx-h100-ib"
SIZES = [1024 * 2**k for k in range(8)]  # 1,024 ... 131,072
ALGORITHMS = ("ring", "hierarchical", "nccl")
ROOT = Path(__file__).resolve().parent.parent
COMMSIM = [str(ROOT / ".venv/bin/commsim")]


def one_case(n_gpus: int) -> dict:
    """Build, all-reduce and hybrid step at one size, in this process."""
    from commsim import catalog
    from commsim.collectives.group import GroupCost
    from commsim.scenario import resolve
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec, Scenario, Strategy
    from commsim.step.predict import predict
    from commsim.topology.build import build_cluster
    from commsim.topology.placement import place

    spec = load_spec(ClusterSpec, catalog.topology_path(FABRIC))
    t0 = time.perf_counter()
    cluster = build_cluster(spec, n_gpus)
    out: dict = {"gpus": n_gpus, "build_s": time.perf_counter() - t0}
    cost = GroupCost(cluster, place(cluster, n_gpus, "blocked"))
    for algorithm in ALGORITHMS:
        t = time.perf_counter()
        seconds, chosen = cost.time_and_choice("all-reduce", algorithm, 2.0**30)
        out[f"allreduce_{algorithm}_s"] = time.perf_counter() - t
        out[f"allreduce_{algorithm}_predicted_s"] = float(seconds[0])
        out["nccl_chose"] = chosen[0]
    dp = n_gpus // 64
    strategy = Strategy(tp=8, pp=8, zero=1, grad_dtype="bf16", algorithm="nccl")
    scenario = Scenario(
        model="llama3-70b",
        cluster=spec,
        gpus=n_gpus,
        global_batch=16 * dp,
        seq_len=8192,
        strategy=strategy,
    )
    t = time.perf_counter()
    prediction = predict(resolve(scenario))
    out["step_s"] = time.perf_counter() - t
    out["step_predicted_s"] = prediction.step_time_s
    out["peak_rss_MiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _timed(args: list[str]) -> float:
    """Wall seconds of a command (best of three: the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    return best


def _plan_args(gpus: str, fabrics: str) -> list[str]:
    """`commsim plan` sizing Llama 3 70B (8k tokens a sequence, 16,384 a batch, 15T tokens)."""
    args = ["plan", "--model", "llama3-70b", "--gpus", gpus, "--seq-len", "8192"]
    return [*args, "--global-batch", "16384", "--tokens", "15e12", "--fabric", fabrics, "--json"]


def sized(gpus: str, fabrics: str) -> dict:
    """Wall seconds, CPU seconds (all processes: what a shared machine's load does not
    change much) and peak RSS (the largest of the command and its sizing workers) of one
    `plan` sizing run, in this (fresh) process's children."""
    t = time.perf_counter()
    subprocess.run([*COMMSIM, *_plan_args(gpus, fabrics)], check=True, capture_output=True)
    took = time.perf_counter() - t
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "s": took,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_MiB": usage.ru_maxrss / 1024,
    }


def _sized_fresh(gpus: str, fabrics: str) -> dict:
    """sized() in a fresh process, so that its peak RSS is this run's alone."""
    run = subprocess.run(
        [sys.executable, __file__, "--sized", gpus, fabrics],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(run.stdout)


def sizing_bench() -> None:
    """Every fabric at every size alone (time and memory against GPU count; a fabric's
    total is the sum of its sizes, one after another), then the goal: one `plan` sizing
    1,024 -> 131,072 GPUs on the three fabrics, its points on both cores."""
    fabrics = SIZING_FABRICS.split(",")
    print("plan sizing, llama3-70b, one fabric and size per run: wall s / peak RSS MiB")
    print(f"{'GPUs':>7} " + " ".join(f"{f:>26}" for f in fabrics))
    total = {f: [0.0, 0.0] for f in fabrics}
    for n in SIZES:
        cells = [_sized_fresh(f"{n}:{n}", f) for f in fabrics]
        for f, c in zip(fabrics, cells, strict=True):
            total[f] = [total[f][0] + c["s"], max(total[f][1], c["peak_rss_MiB"])]
        row = (f"{c['s']:>15.1f} s {c['peak_rss_MiB']:>6.0f} MiB" for c in cells)
        print(f"{n:>7} " + " ".join(row), flush=True)
    row = (f"{t:>15.1f} s {m:>6.0f} MiB" for t, m in total.values())
    print(f"{'all':>7} " + " ".join(row))
    sizing_goal()


def sizing_goal() -> None:
    """The goal: one `plan` sizing 1,024 -> 131,072 GPUs on the three fabrics."""
    r = _sized_fresh("1024:131072", SIZING_FABRICS)
    print(f"plan sizing 1,024 -> 131,072 GPUs on {SIZING_FABRICS}: {r['s']:.0f} s wall, ", end="")
    print(f"{r['cpu_s']:.0f} s CPU, peak RSS {r['peak_rss_MiB']:.0f} MiB (goal < 120 s)")


def main(sizing: bool) -> None:
    print(f"{FABRIC}: build, 1 GiB all-reduce over all GPUs, hybrid step (llama3-70b tp8 pp8)")
    head = f"{'GPUs':>7} {'build':>7} " + " ".join(f"{a:>13}" for a in ALGORITHMS)
    print(head + f" {'step':>7} {'total':>7} {'peak RSS':>9}  NCCL picks")
    for n in SIZES:
        run = subprocess.run(
            [sys.executable, __file__, "--case", str(n)], check=True, capture_output=True, text=True
        )
        r = json.loads(run.stdout)
        times = [r[f"allreduce_{a}_s"] for a in ALGORITHMS]
        total = r["build_s"] + sum(times) + r["step_s"]
        print(
            f"{n:>7} {r['build_s']:>6.2f}s "
            + " ".join(f"{t:>12.2f}s" for t in times)
            + f" {r['step_s']:>6.2f}s {total:>6.2f}s {r['peak_rss_MiB']:>5.0f} MiB"
            + f"  {r['nccl_chose']}"
        )
    print(f"commsim --help: {_timed([*COMMSIM, '--help']):.2f} s")
    print(f"commsim predict (default scenario): {_timed([*COMMSIM, 'predict']):.2f} s")
    if sizing:
        sizing_bench()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        print(json.dumps(one_case(int(sys.argv[2]))))
    elif len(sys.argv) == 4 and sys.argv[1] == "--sized":
        print(json.dumps(sized(sys.argv[2], sys.argv[3])))
    elif "--sizing-goal" in sys.argv:
        sizing_goal()
    elif "--sizing-only" in sys.argv:
        sizing_bench()
    else:
        main("--sizing" in sys.argv)
