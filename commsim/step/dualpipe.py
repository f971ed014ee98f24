"""DeepSeek-V3's DualPipe (arXiv:2412.19437 sec. 3.2.1, Table 2): a bidirectional pipeline.

Rank i of pp (even) holds stage i of one copy of the model and stage pp - 1 - i of a
second copy; half of a step's micro-batches enter at rank 0, half at rank pp - 1, and each
rank pairs a forward of one direction with a backward of the other, their communication
hidden under each other's compute. Its closed form (Table 2): a bubble of
(pp / 2 - 1)(F&B + B - 3W) against 1F1B's (pp - 1)(F + B), parameters twice, activations of
pp + 1 micro-batch stages at the peak. `order` is the op order of every rank as
deepseek-ai/DualPipe runs it (dualpipe/dualpipe.py at 3da1bbe, DualPipe.step: its eight
steps), `simulate` runs it against the dependencies: the event-level check of the bubble.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bubble(pp, fb, b, w):
    """Seconds of DualPipe's bubble (Table 2): (pp / 2 - 1)(F&B + B - 3W), F&B a forward and
    a backward overlapped (a tick), B a whole backward, W its weight-gradient part; at 0 when
    W outgrows (F&B + B) / 3, which no layout priced here reaches (W is at most half of B)."""
    return (np.asarray(pp) / 2 - 1) * np.maximum(fb + b - 3 * w, 0.0)


def in_flight(pp):
    """Micro-batch stages whose activations a rank holds at its peak (Table 2: pp + 1), over
    the two stages it holds: (pp + 1) / 2 passes over both stages' layers."""
    return (np.asarray(pp) + 1) / 2


def problem(pp: int, interleave: int, micro_batches: int) -> str | None:
    """Why a layout cannot run DualPipe (None when it can): DualPipe.step asserts an even
    rank count and an even micro-batch count of at least twice the ranks; its two stages a
    rank are its chunks (no interleaving)."""
    if pp < 2 or pp % 2:
        return f"DualPipe needs an even pp of at least 2, not {pp}"
    if interleave > 1:
        return "DualPipe's two stages a rank are its chunks: interleave must be 1"
    if micro_batches % 2 or micro_batches < 2 * pp:
        return (
            f"DualPipe needs an even number of micro-batches, at least 2 x pp = {2 * pp}; this "
            f"layout has {micro_batches} (global_batch / (dp x micro_batch))"
        )
    return None


def applies(pp, interleave, micro_batches) -> np.ndarray:
    """Where each layout can run DualPipe (`problem` is None), vectorised over its distinct
    (pp, interleave, micro-batches)."""
    cols = np.atleast_1d(pp, interleave, micro_batches)
    cols = np.stack(np.broadcast_arrays(*cols)).astype(np.int64)
    keys, inverse = np.unique(cols, axis=1, return_inverse=True)
    ok = np.array([problem(*map(int, k)) is None for k in keys.T], dtype=bool)
    return ok[inverse.reshape(-1)]


def order(pp: int, m: int, rank: int) -> list[tuple]:
    """The ops of `rank` in run order, DualPipe.step's eight steps: ("F", phase),
    ("B", phase, deferred) a backward (deferred: its weight gradient left for a later "W",
    zero-bubble style), ("W",) the oldest deferred weight gradient, ("FB", f, b) a forward of
    phase f overlapped with a backward of phase b. Phase 0 is the stage nearer the rank's
    end of the pipeline (stage min(rank, pp - 1 - rank) of its direction)."""
    half, near = pp // 2, min(rank, pp - 1 - rank)
    middle = rank in (half - 1, half)
    ops: list[tuple] = [("F", 0)] * ((half - near - 1) * 2)  # 1: nF0
    ops += [("F", 0), ("F", 1)] * (near + 1)  # 2: nF0F1
    ops += [("B", 1, True), ("W",), ("F", 1)] * (half - near - 1)  # 3: nB1W1F1
    for i in range(m // 2 - pp + near + 1):  # 4: nF0B1F1B0, the middle ranks' first unpaired
        ops += [("F", 0), ("B", 1, False)] if i == 0 and middle else [("FB", 0, 1)]
        ops += [("FB", 1, 0)]
    ops += [("B", 1, False), ("FB", 1, 0)] * (half - near - 1)  # 5: nB1F1B0
    deferred = False  # 6: nB1B0, the second half deferring weight gradients
    for i in range(near + 1):
        deferred = deferred or (i == (near + 1) // 2 and near % 2 == 1)
        ops += [("B", 1, deferred)]
        deferred = deferred or (i == (near + 1) // 2 and near % 2 == 0)
        ops += [("B", 0, deferred)]
    ops += [("W",), ("B", 0, True)] * (half - near - 1)  # 7: nWB0
    return ops + [("W",)] * (near + 1)  # 8: nW


def phase_leads(pp: int, rank: int) -> tuple[int, int]:
    """(after, before) of a rank's data-parallel sync in `order`: after, the phase-0
    backward ops (whole or weight-deferred) it runs once its phase-1 stage's gradients are
    all computed (by its last phase-1 backward, or the W of a deferred one), the W ops among
    them left out (a lower bound, exact on the end ranks, where as many W as deferred B
    follow); before, the phase-0 forwards it runs before its first phase-1 forward. The
    tail of `order` does not depend on m (taken at its least, 2 pp)."""
    ops = order(pp, 2 * pp, rank)
    waiting: list[int] = []  # phases of the deferred weight gradients, oldest first
    last = 0  # the op that completes the phase-1 gradients
    for i, op in enumerate(ops):
        if op[0] == "W":
            last = i if waiting.pop(0) == 1 else last
        elif op[0] == "B" and op[2]:
            waiting.append(op[1])
        elif op[0] != "F" and op[1 if op[0] == "B" else 2] == 1:
            last = i
    after = sum(op[0] in ("B", "FB") for op in ops[last + 1 :])
    before = [op[1] for op in ops if op[0] in ("F", "FB")].index(1)
    return after, before


@dataclass(frozen=True)
class Durations:
    """Seconds of a stage's forward and whole backward (each with its collectives), of the
    backward's weight-gradient part, and of one hand-off to the neighbouring rank."""

    forward: float
    backward: float
    wgrad: float
    send: float = 0.0


def _stage(pp: int, rank: int, phase: int) -> tuple[int, int]:
    """(direction, stage) of a rank's phase: direction 0 runs from rank 0, 1 from rank pp - 1."""
    direction = phase if rank < pp // 2 else 1 - phase
    return direction, rank if direction == 0 else pp - 1 - rank


def simulate(pp: int, m: int, d: Durations) -> list[tuple]:
    """Run every rank's order against the dependencies (a forward waits for the previous
    stage's of its micro-batch, a backward for the next stage's, or at the last stage for
    its own forward; an overlapped pair for both inputs; a hand-off follows every forward
    and backward that has a neighbour to send to). Returns (rank, kind, phase, micro-batch,
    start, end, the rank it sends to or None) for every forward F, backward B, backward
    with its weight gradient deferred D and deferred weight gradient W, sorted by rank and
    start."""
    orders = [order(pp, m, r) for r in range(pp)]
    done: dict[tuple, float] = {}
    at, free = [0] * pp, [0.0] * pp
    count = [[[0, 0], [0, 0]] for _ in range(pp)]  # [rank][F or B][phase]
    waiting: list[list[int]] = [[] for _ in range(pp)]  # deferred weight gradients' mbs
    out = []
    while any(at[r] < len(orders[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while at[r] < len(orders[r]):
                op = orders[r][at[r]]
                parts = _parts(pp, r, op, count[r])
                deps = [dep for *_, dep in parts if dep is not None]
                if any(dep not in done for dep in deps):
                    break
                t = max([free[r]] + [done[dep] for dep in deps])
                for kind, phase, mb, key, _ in parts:
                    _, direction, stage, _ = key
                    to = stage + 1 if kind == "F" else stage - 1
                    to = None if to in (-1, pp) else to if direction == 0 else pp - 1 - to
                    deferred = kind == "B" and op[0] == "B" and op[2]
                    span = d.forward if kind == "F" else d.backward - deferred * d.wgrad
                    end = t + span + (0.0 if to is None else d.send)
                    if deferred:
                        waiting[r].append((phase, mb))
                    done[key] = end
                    out.append((r, "D" if deferred else kind, phase, mb, t, end, to))
                    count[r][kind == "B"][phase] += 1
                    t = end
                if op[0] == "W":
                    end = t + d.wgrad
                    out.append((r, "W", *waiting[r].pop(0), t, end, None))
                    t = end
                free[r], at[r], moved = t, at[r] + 1, True
        if not moved:
            raise RuntimeError(f"DualPipe schedule deadlocks (pp={pp}, m={m})")
    return sorted(out, key=lambda e: (e[0], e[4]))


def _parts(pp: int, r: int, op: tuple, count) -> list[tuple]:
    """The forward and backward an op runs: (kind, phase, micro-batch, its key, the key it
    waits for)."""
    if op[0] == "W":
        return []
    kinds = [("F", op[1]), ("B", op[2])] if op[0] == "FB" else [(op[0], op[1])]
    parts = []
    for kind, phase in kinds:
        direction, stage = _stage(pp, r, phase)
        mb = count[kind == "B"][phase]
        if kind == "F":
            dep = ("F", direction, stage - 1, mb) if stage > 0 else None
        else:
            dep = ("B", direction, stage + 1, mb) if stage < pp - 1 else ("F", direction, stage, mb)
        parts.append((kind, phase, mb, (kind, direction, stage, mb), dep))
    return parts


def ranks(dual, first, middle, last) -> list[tuple]:
    """The (rank, layers, end-layer parameters, holds the loss, exists) of the first, a middle
    and the last rank, as step.memory prices them. DualPipe puts stage i and pp - 1 - i on rank
    i: an end rank holds the first and the last stage (the embedding, the head and the loss),
    a middle one two middle stages; every parameter is held twice over the pipeline (Table
    2: "Parameter 2x"), its ZeRO shards spread over both copies' data-parallel ranks."""
    layers, params = first[1] + last[1], first[2] + last[2]
    pair = (np.where(dual, layers, first[1]), np.where(dual, params, first[2]))
    return [
        (first[0], *pair, first[3] | dual, first[4]),
        (middle[0], np.where(dual, 2 * middle[1], middle[1]), *middle[2:]),
        (last[0], np.where(dual, layers, last[1]), np.where(dual, params, last[2]), *last[3:]),
    ]
