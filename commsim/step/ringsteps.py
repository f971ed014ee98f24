"""A layer's ring attention as its steps, priced once for both of its readers: the step
model sums them in closed form (StepModel._context_parallel) and the Chakra export writes
them node by node (traces.writer), so the two cannot disagree.

A step is a transfer (sends round the ring, or one all-gather) beside the attention it
overlaps, which runs slower on the SMs the transfer's NCCL kernel leaves (step.contention);
the next step waits for both. Transformer Engine's ring is step.context's, PyTorch's
step.torch_ring's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from commsim.step.contention import compute_end, exposed


@dataclass(frozen=True)
class Leg:
    """`count` steps alike: each `sends` messages of `nbytes` one after another (`message`
    seconds each), or one all-gather of `nbytes` output (op "all-gather", `message` its
    seconds), beside attention of `alone` seconds (`beside`: its seconds on the SMs the
    transfer leaves; None, no contention). Per-layout arrays, or one layout's floats."""

    count: np.ndarray | float
    message: np.ndarray | float
    alone: np.ndarray | float
    beside: np.ndarray | float | None
    nbytes: np.ndarray | float
    op: str = "send-recv"
    sends: int = 1

    @property
    def transfer(self):
        """Seconds of a step's transfer: its messages one after another."""
        return self.sends * self.message

    def attention(self):
        """Seconds a step's attention takes beside its transfer (step.contention)."""
        return compute_end(self.alone, self.beside, self.transfer)

    def added(self):
        """Seconds the leg's steps take beyond their attention alone."""
        return self.count * exposed(self.alone, self.beside, self.transfer)

    def row(self, i: int) -> Leg:
        """Layout i's leg, in floats."""
        at = {k: _at(getattr(self, k), i) for k in ("count", "message", "alone", "nbytes")}
        return replace(self, beside=None if self.beside is None else _at(self.beside, i), **at)


def _at(x, i: int) -> float:
    return float(np.asarray(x).reshape(-1)[i] if np.ndim(x) else x)


@dataclass(frozen=True)
class Ring:
    """One layer's ring attention per micro-batch: its forward's and its backward's legs,
    the merges of the steps' partial results (seconds, forward and backward), and whether
    the backward replays the forward's ring first (recomputation of attention)."""

    forward: tuple[Leg, ...]
    backward: tuple[Leg, ...]
    merge: tuple[np.ndarray | float, np.ndarray | float]
    replay: np.ndarray | bool

    def per_layer(self) -> tuple[np.ndarray, np.ndarray]:
        """Seconds the ring adds to a layer beyond its attention alone, forward and backward
        (a replay's forward in the backward)."""
        fwd = sum(leg.added() for leg in self.forward) + self.merge[0]
        bwd = sum(leg.added() for leg in self.backward) + self.merge[1]
        return fwd, bwd + np.where(self.replay, fwd, 0.0)

    def row(self, i: int) -> Ring:
        """Layout i's ring, in floats."""
        return Ring(
            tuple(leg.row(i) for leg in self.forward),
            tuple(leg.row(i) for leg in self.backward),
            (_at(self.merge[0], i), _at(self.merge[1], i)),
            bool(_at(self.replay, i)),
        )
