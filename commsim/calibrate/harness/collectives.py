"""Every collective over the size sweep, on the world and on rank 0's rack and host.

Timing, as nccl-tests does it but across processes: each op's sweep starts with one
untimed run at its largest size (nccl-tests' warm-up for the large size: a TCP connection's
window and rate settle before the first size is timed), then per size a warm-up and per
repeat a barrier on the group and the op timed on every rank; a repeat's time is the
slowest rank's (every rank's times are all-gathered at the end); the record keeps the
median, p10/p90, each repeat's time and each rank's median (timing "slowest-rank").
Besides the whole world, each op runs on the ranks of rank 0's rack and of rank 0's host
where those are smaller groups, so a fit can tell the link tiers apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from commsim.calibrate.harness.rank import Run, gather_over_ranks, max_over_ranks
from commsim.collectives.algorithms import bus_factor
from commsim.units import fmt_bytes


def tier_groups(ranks: Sequence[dict[str, Any]], mode: str) -> list[tuple[str, list[int]]]:
    """The groups to measure: the world, then (mode "tiers") the ranks of rank 0's rack if
    they span several hosts, and the ranks of rank 0's host if they are several: each a
    smaller tier, all containing rank 0 (the writer)."""
    world = list(range(len(ranks)))
    groups = [("world", world)] if len(world) > 1 else []
    if mode != "tiers":
        return groups
    me = ranks[0]
    if me.get("rack") is not None:
        rack = [r["rank"] for r in ranks if r.get("rack") == me["rack"]]
        if len({ranks[r]["host"] for r in rack}) > 1 and len(rack) < len(world):
            groups.append(("rack", rack))
    host = [r["rank"] for r in ranks if r["host"] == me["host"]]
    if 1 < len(host) < len(world) and all(host != g for _, g in groups):
        groups.append(("host", host))
    return groups


_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _op(
    op: str, nbytes: int, group, members: list[int], me: int, device: torch.device
) -> tuple[Callable[[], None], int]:
    """A closure running `op` once on zero-filled float32 buffers (zeros stay zeros:
    no overflow, no denormals), and the bytes it moves by nccl-tests' convention."""
    n = len(members)
    elems = max(1, nbytes // 4)
    per = max(1, elems // n)  # per-rank chunk where the buffer splits over the group

    def zeros(k: int) -> torch.Tensor:
        return torch.zeros(k, dtype=torch.float32, device=device)

    if op == "all-reduce":
        t = zeros(elems)
        return lambda: dist.all_reduce(t, group=group), 4 * elems
    if op == "all-gather":
        inp, out = zeros(per), zeros(per * n)
        return lambda: _all_gather(out, inp, group=group), 4 * per * n
    if op == "reduce-scatter":
        inp, out = zeros(per * n), zeros(per)
        return lambda: _reduce_scatter(out, inp, group=group), 4 * per * n
    if op == "broadcast":
        t = zeros(elems)
        return lambda: dist.broadcast(t, src=members[0], group=group), 4 * elems
    if op == "all-to-all":
        inp, out = zeros(per * n), zeros(per * n)
        return lambda: dist.all_to_all_single(out, inp, group=group), 4 * per * n
    send, recv = zeros(elems), zeros(elems)
    nxt, prev = members[(me + 1) % n], members[(me - 1) % n]

    def sendrecv() -> None:
        ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prev, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    return sendrecv, 4 * elems


def _time_op(fn: Callable[[], None], run: Run, group) -> np.ndarray:
    """Warm up, pick the repeat count from the slowest warm-up (same on every rank), then
    time each repeat after a barrier; every group rank's time of every repeat (a row a
    rank)."""
    cfg = run.cfg
    for _ in range(cfg.warmup - 1):
        fn()
        run.progress.tick()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    fn()
    run.sync()
    (slowest,) = max_over_ranks([time.perf_counter() - t0], run, group)
    repeats = int(np.clip(cfg.point_budget_s / max(slowest, 1e-9), 3, cfg.repeats))
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        run.progress.tick()
        t0 = time.perf_counter()
        fn()
        run.sync()
        times.append(time.perf_counter() - t0)
    return gather_over_ranks(times, run, group)


def _supported(op: str, group, members: list[int], me: int, run: Run) -> str | None:
    """None if the backend runs `op` on this group, else why not. Members try it once; the
    verdict is agreed by the whole world (one all-reduce MIN), so every rank then walks the
    same points."""
    reason = None
    if me >= 0:
        try:
            fn, _ = _op(op, 4 * len(members), group, members, me, run.device)
            fn()
            run.sync()
        except (RuntimeError, NotImplementedError, ValueError) as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    flag = torch.tensor([0 if reason else 1], dtype=torch.int32, device=run.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if int(flag.item()) == 1:
        return None
    return reason or "unsupported on another rank"


def measure_collectives(run: Run, ranks: list[dict[str, Any]]) -> None:
    """Every (group, op, size) point; all ranks meet at a world barrier before each, so
    ranks outside a group wait at most one point."""
    grid = run.cfg.size_grid()
    for name, members in tier_groups(ranks, run.cfg.groups):
        group = None if len(members) == run.world else dist.new_group(members)
        inside = run.rank in members
        me = members.index(run.rank) if inside else -1
        for op in run.cfg.ops:
            run.progress.tick(f"{op} on the {name} group ({len(members)} ranks)")
            why = _supported(op, group, members, me, run)
            if why is not None:
                run.emit(
                    {"kind": "collective", "op": op, "group": members, "status": "unsupported"}
                    | {"error": why}
                )
                continue
            if inside:  # warm the group's connections at the largest size, as nccl-tests does
                fn, _ = _op(op, grid[-1], group, members, me, run.device)
                fn()
                run.sync()
            for size in grid:
                run.progress.tick(f"{op} of {fmt_bytes(size)} on the {name} group")
                dist.barrier()
                if not inside:
                    continue
                fn, nbytes = _op(op, size, group, members, me, run.device)
                per_rank = _time_op(fn, run, group)
                t = per_rank.max(axis=0)  # each repeat: the slowest rank's time
                median = float(np.median(t))
                algbw = nbytes / median
                factor = 1.0 if op == "send-recv" else float(bus_factor(op, len(members)))
                run.emit(
                    {
                        "kind": "collective",
                        "op": op,
                        "group": members,
                        "status": "ok",
                        "bytes": nbytes,
                        "dtype": "float32",
                        "time_s": median,
                        "timing": "slowest-rank",
                        "times_s": [float(x) for x in t],
                        "rank_times_s": [float(x) for x in np.median(per_rank, axis=1)],
                        "p10_s": float(np.percentile(t, 10)),
                        "p90_s": float(np.percentile(t, 90)),
                        "min_s": float(t.min()),
                        "max_s": float(t.max()),
                        "repeats": int(t.size),
                        "algbw_Bps": algbw,
                        "busbw_Bps": algbw * factor,
                    }
                )
