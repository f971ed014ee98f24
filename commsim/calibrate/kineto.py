"""Profiler traces as calibration data: each traced collective of known size and group a
`collective` record (calibrate.records), one run per rank's trace, its meta record saying
where each rank ran (each trace's host_name: every rank's trace is needed), so
`calibrate fit` fits link tiers to what a real job's collectives took, as it does
nccl-tests logs (ncclt.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from commsim.calibrate.records import FORMAT_VERSION
from commsim.specs import SpecError
from commsim.traces.kineto import RankTrace
from commsim.traces.summary import bandwidths

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all")


def _backend(t: RankTrace) -> str:
    """The backend of a trace's collectives: distributedInfo's, else what recorded them
    (gloo's annotations, NCCL's kernels); a SpecError when neither tells (a fit prices one
    backend's algorithms: 'unknown' made it refuse the results trace calibrate wrote)."""
    seen = {"gloo" if c.name.startswith("gloo:") else "nccl" for c in t.collectives}
    if t.backend:
        return t.backend
    if len(seen) != 1:
        raise SpecError(t.source, "distributedInfo.backend", "missing: give the backend traced")
    return seen.pop()


def trace_records(traces: list[RankTrace]) -> list[dict[str, Any]]:
    """A meta record and one collective record per measured collective, per trace. Each
    collective's time is this rank's record of it (nccl-tests reports the same per rank)."""
    out: list[dict[str, Any]] = []
    hosts = {t.rank: str(t.metadata.get("host_name") or f"rank{t.rank}") for t in traces}
    for t in traces:
        missing = sorted(set(range(t.world)) - set(hosts))
        if missing:
            raise SpecError(
                t.source,
                "distributedInfo.world_size",
                f"no trace of rank {missing[0]}: give every rank's (host_name says where it ran)",
            )
        points = []
        for c in t.collectives:
            if c.op not in OPS or c.bytes is None or not c.group or c.duration <= 0:
                continue
            algbw, busbw = bandwidths(c)
            points.append(
                {
                    "kind": "collective",
                    "op": c.op,
                    "group": list(c.group),
                    "bytes": c.bytes,
                    "time_s": c.duration,
                    "repeats": 1,
                    "algbw_Bps": algbw,
                    "busbw_Bps": busbw,
                }
            )
        # the run's id from what it measured (not Python's per-process hash of the path): the
        # same trace imported twice is the same run, which the results file refuses
        digest = hashlib.sha1(json.dumps(points, sort_keys=True).encode()).hexdigest()[:10]
        run = f"trace-{t.rank}-{digest}"
        out.append(
            {
                "kind": "meta",
                "run": run,
                "format": FORMAT_VERSION,
                "source": "harness",
                "backend": _backend(t),
                "world_size": t.world,
                "ranks": [{"rank": r, "host": hosts[r]} for r in range(t.world)],
                "file": t.source,
            }
        )
        out += [{"run": run} | p for p in points]
    return out
