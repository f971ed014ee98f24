"""Planner speed: hybrid layouts priced per second, and the issue's GPT-3 sizing sweep.

Goals (issue 3): 100,000 strategies evaluated a second; the GPT-3 175B sizing sweep over
256..16,384 H100s on two fabrics in under a minute on a 2-core machine.
Run: .venv/bin/python benchmarks/bench_planner.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import load_scenario, resolve
from commsim.step.predict import step_model

SWEEP = [
    "plan",
    "--model",
    "gpt3-175b",
    "--tokens",
    "300e9",
    "--gpu",
    "h100",
    "--gpus",
    "256:16384",
    "--fabric",
    "dgx-h100-ib,roce-3tier-3to1",
    "--price-per-gpu-hour",
    "2.5",
    "--global-batch",
    "1536",
    "--seq-len",
    "2048",
    "--json",
]


WARM_REPEATS = 3  # warm: the best of this many passes, so a busy core does not set the figure


def _timed(evaluate, layouts) -> float:
    """Seconds of one warm pass: group costs cached, the vectorised arithmetic alone."""
    t0 = time.perf_counter()
    evaluate(layouts)
    return time.perf_counter() - t0


def layouts_per_second(gpus: int, cluster: str, roofline: bool = False) -> None:
    """Cold and warm layouts a second; `roofline`: compute by the roofline per kernel class
    (contention included) instead of the built-in scenario's one compute_efficiency."""
    fields = dict(model="gpt3-175b", cluster=cluster, gpus=gpus, global_batch=1536, seq_len=2048)
    scenario, source = load_scenario(None, fields)
    if roofline:
        scenario = scenario.model_copy(update={"compute_efficiency": None})
    setup = resolve(scenario, source, check=False)
    model = step_model(setup)
    layouts = enumerate_layouts(setup)
    t0 = time.perf_counter()
    found = search(model, layouts)  # cold: every distinct group priced on the graph
    cold = time.perf_counter() - t0
    model.evaluate(layouts)  # the layouts that do not fit too: search skips them
    big = layouts.take(np.tile(np.arange(len(layouts)), 20))
    warm = min(_timed(model.evaluate, big) for _ in range(WARM_REPEATS))  # cached groups
    print(
        f"{cluster} {gpus:>6} GPUs{' roofline' if roofline else ''}: "
        f"{len(layouts):>6} layouts ({len(found.fitting)} fit), "
        f"cold {cold:6.2f} s "
        f"({len(layouts) / cold:>9,.0f}/s), warm {len(big):>7} layouts in {warm:.3f} s "
        f"({len(big) / warm:>11,.0f}/s)"
    )


def main() -> None:
    for gpus in (1024, 16384):
        layouts_per_second(gpus, "dgx-h100-ib")
    layouts_per_second(1024, "dgx-h100-ib", roofline=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "commsim.cli.app", *SWEEP], check=True, capture_output=True
    )
    print(f"sizing sweep (14 points, 2 fabrics): {time.perf_counter() - t0:.1f} s wall")


if __name__ == "__main__":
    main()
