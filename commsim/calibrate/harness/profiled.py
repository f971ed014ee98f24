"""Profiled DDP steps: after a bucket cap's timed steps, `ddp_repeats` steps under no_sync
(compute alone) and as many full steps, under torch.profiler; each rank writes its trace,
`<profile_dir>/<what>-rank<r>.json`. Each step's timed part is a `ProfilerStep#N`
annotation (what profiler.step() opens), so the trace's steps are exactly what the
harness timed; the harness's own clock readings of those steps go into the trace as
`commsim_harness` (kind compute or step, seconds, optimizer seconds and, on CPU, the
exposed communication by commclock's hooks), for checking what the trace says against
them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from commsim.calibrate.harness.commclock import CommClock
from commsim.calibrate.harness.rank import Run


def profile_steps(run: Run, batch: tuple, step, what: str) -> Path:
    """Profile the steps; return this rank's trace file."""
    ddp, opt, x, y = batch
    activities = [ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    out = Path(run.cfg.profile_dir or ".")
    out.mkdir(parents=True, exist_ok=True)
    timings = []
    clock = CommClock(ddp) if run.device.type == "cpu" else None
    with profile(activities=activities, record_shapes=True) as prof:  # sizes of gloo's ops
        for i in range(2 * run.cfg.ddp_repeats):
            sync = i >= run.cfg.ddp_repeats
            if clock:
                clock.start()
            total, optimizer = step(
                run,
                ddp,
                opt,
                x,
                y,
                sync=sync,
                scope=lambda i=i: record_function(f"ProfilerStep#{i}"),
                clock=clock,
            )
            timings.append(
                {
                    "step": i,
                    "kind": "step" if sync else "compute",
                    "s": total,
                    "optimizer_s": optimizer,
                }
                | ({"exposed_s": clock.exposed_s()} if clock else {})
            )
        if clock:
            clock.remove()
        prof.add_metadata_json("commsim_harness", json.dumps({"what": what, "steps": timings}))
    path = out / f"{what}-rank{run.rank}.json"
    prof.export_chrome_trace(str(path))
    torch.distributed.barrier()
    return path
