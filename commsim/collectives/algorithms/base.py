"""What an algorithm module is made of: its schedule (steps of concurrent flows), its
closed form (the same schedule collapsed on uniform links, as terms) and the record the
registry reads (Algorithm).

Ranks 0..n-1 are in ring / placement order; consecutive groups of gpus_per_node ranks
share a node. A Step is a set of concurrent flows (src rank -> dst rank, bytes, NIC rail)
run `repeat` times; identical steps are emitted once, so a 2(N-1)-step ring is one Step
and evaluation on thousands of GPUs stays cheap.

On links that are uniform (per tier) a step costs its busiest rank's latency, alpha plus
LogP's overhead o for every further distinct peer it handles (alpha_with_fanin), plus the
bytes through its busiest link over B. A closed form lists its schedule's steps that way,
as Rounds and Pipelines whose bytes are multiples of the op's size S, over numpy arrays
of group sizes; collectives.evaluate sums them, and the tests route every schedule on
uniform topologies and check the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Step:
    """Concurrent flows src -> dst of nbytes each, on NIC `rail` (-1: the GPU's own).

    `repeat` identical rounds; a pipelined step (stages > 1) is the steady state of a
    pipeline `stages` deep passing `repeat` chunks, which takes repeat + stages - 1 rounds
    (the fill costs full rounds: the usual pipeline model) but moves `repeat` chunks."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    rail: np.ndarray
    repeat: int = 1
    stages: int = 1

    @property
    def rounds(self) -> int:
        return self.repeat + self.stages - 1

    def transposed(self) -> Step:
        """The same flows reversed: a reduce-scatter step becomes an all-gather step."""
        return replace(self, src=self.dst, dst=self.src)


Schedule = list[Step]


def make_step(src, dst, nbytes, repeat: int = 1, stages: int = 1) -> Step:
    """A Step from rank arrays and bytes (a scalar or one per flow), with no rail preference."""
    src = np.asarray(src, dtype=np.int64)
    return Step(
        src=src,
        dst=np.asarray(dst, dtype=np.int64),
        nbytes=np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape).copy(),
        rail=np.full(src.shape, -1, dtype=np.int64),
        repeat=repeat,
        stages=stages,
    )


def transposed(steps: Schedule) -> Schedule:
    """A schedule run backwards with every flow reversed (reduce-scatter -> all-gather)."""
    return [s.transposed() for s in reversed(steps)]


def split_channels(step: Step, channels: int) -> Step:
    """Channel c carries 1/channels of every flow on NIC rail c, as NCCL's channels do."""
    return replace(
        step,
        src=np.repeat(step.src, channels),
        dst=np.repeat(step.dst, channels),
        nbytes=np.repeat(step.nbytes / channels, channels),
        rail=np.tile(np.arange(channels, dtype=np.int64), step.src.size),
    )


def traffic(schedule: Schedule, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank sends and receives over the whole schedule (pipeline fill excluded)."""
    sent, received = np.zeros(n), np.zeros(n)
    for s in schedule:
        sent += np.bincount(s.src, weights=s.nbytes * s.repeat, minlength=n)
        received += np.bincount(s.dst, weights=s.nbytes * s.repeat, minlength=n)
    return sent, received


def pipeline_time(chunks, stages, alpha, work) -> np.ndarray:
    """A pipeline of `stages` stages passing `chunks` chunks: chunks + stages - 1 steps of
    alpha + work / chunks each (work: seconds one stage needs for the whole buffer)."""
    return (chunks + stages - 1) * (alpha + work / chunks)


def pipeline_chunks(stages, alpha, work, size) -> np.ndarray:
    """Chunk count minimising pipeline_time; shared by the closed form and the schedule.

    d/dk of (k + D - 1)(alpha + W / k) vanishes at k* = sqrt((D - 1) W / alpha); we take
    the better of its two integer neighbours, at least 1 and at most `size` (a chunk of at
    least one byte), so alpha = 0 gives one-byte chunks rather than infinitely many.
    """
    stages, alpha, work, size = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (stages, alpha, work, size))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        best = np.sqrt((stages - 1) * work / alpha)
    best = np.where(np.isnan(best), 1.0, best)
    top = np.maximum(1.0, np.floor(size))
    lo = np.clip(np.floor(best), 1.0, top)
    hi = np.clip(np.ceil(best), 1.0, top)
    better_lo = pipeline_time(lo, stages, alpha, work) <= pipeline_time(hi, stages, alpha, work)
    return np.where(better_lo, lo, hi)


def floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2 x) for integers x >= 1, exact (frexp: x = m 2^e with 0.5 <= m < 1)."""
    return np.frexp(x.astype(float))[1] - 1


def pow2_split(n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, lg p, r): the largest power of two p <= n and the r = n - p extra ranks."""
    lg = floor_log2(n)
    p = 2**lg
    return p, lg, n - p


@dataclass(frozen=True)
class Rounds:
    """`count` steps in each of which the busiest rank handles `peers` distinct peers and,
    over all of them, `load` x S bytes cross its busiest link: on uniform links
    count alpha_with_fanin(alpha, peers, o) + load S / B. `tier`: which links ("net": the
    one link of a flat group; "intra", "inter": a two-tier algorithm's)."""

    count: Any
    peers: Any
    load: Any
    tier: str = "net"


@dataclass(frozen=True)
class Pipeline:
    """A pipeline `stages` deep whose step, with the whole buffer as one chunk, has its
    busiest rank handle `peers` distinct peers and move `load` x S bytes: in k chunks
    (k + stages - 1)(alpha_with_fanin(alpha, peers, o) + load S / (k B)), k the given
    chunk count or pipeline_chunks' optimum."""

    stages: Any
    peers: Any
    load: Any
    tier: str = "net"


Term = Rounds | Pipeline
ScheduleFn = Callable[..., Schedule]  # (op, n, size, *, gpus_per_node, ps_shards, chunks)
TermsFn = Callable[..., list[Term]]  # (op, n array, *, gpus_per_node, ps_shards)


@dataclass(frozen=True)
class Form:
    """One op of an algorithm: its schedule on n >= 2 ranks, its closed-form terms,
    whether the graph splits its flows over the node's NIC rails (NCCL's channels) or runs
    them as posted (gloo's sends, nccl-tests' sendrecv), and whether it is pipelined (its
    chunk count, so the shape of its time, changes with the size; otherwise its time is
    affine in the size)."""

    schedule: ScheduleFn
    terms: TermsFn
    channels: bool = True
    pipelined: bool = False


def no_check(n, **_) -> None:
    """Parameters every algorithm accepts: nothing to refuse."""


@dataclass(frozen=True)
class Algorithm:
    """What the registry knows of one algorithm: its name, the ops it serves (op -> Form),
    whether it runs on whole nodes only, whether its closed form needs two link tiers,
    whether `auto` (and the planner) choose among it or it runs only when named (gloo's
    own), and a check of its parameters (n, ps_shards) raising ValueError."""

    name: str
    forms: Mapping[str, Form]
    whole_nodes: bool = False
    two_tier: bool = False
    searched: bool = True
    check: Callable[..., None] = field(default=no_check)
