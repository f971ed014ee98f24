"""Direct exchanges, every message posted at once: all-to-all (every pair), and send-recv
as nccl-tests' sendrecv runs it (a shift: each rank sends to the next)."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Algorithm, Form, Rounds, Schedule, make_step


def all_to_all(op: str, n: int, size: float, **_) -> Schedule:
    """Every rank sends S/N to every other rank, all at once: n(n-1) flows, so the graph
    form of all-to-all suits groups of up to a few thousand ranks."""
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    return [make_step(src[keep], dst[keep], size / n)]


def all_to_all_terms(op: str, n, **_) -> list[Rounds]:
    # One step: each rank sends S/N to each of the N-1 others at once, all sharing its
    # link, and handles the N-1 messages out (and in) one by one:
    # a + (N-2) o + (N-1)/N S/b. (Thakur et al. 2005's pairwise exchange pays (N-1) a.)
    return [Rounds(1, n - 1, (n - 1) / n)]


def shift(op: str, n: int, size: float, **_) -> Schedule:
    """nccl-tests' sendrecv: every rank sends the buffer to the next and receives from the
    previous, at once (one step, one peer each way)."""
    ranks = np.arange(n)
    return [make_step(ranks, (ranks + 1) % n, size)]


def shift_terms(op: str, n, **_) -> list[Rounds]:
    # One step, one peer each way, the whole buffer: a + S/b.
    return [Rounds(1, 1, 1.0)]


ALGORITHM = Algorithm(
    "direct",
    {
        "all-to-all": Form(all_to_all, all_to_all_terms),
        # one message each way, not split over NIC rails (as calibrated against gloo)
        "send-recv": Form(shift, shift_terms, channels=False),
    },
)
