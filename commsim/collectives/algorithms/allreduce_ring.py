"""gloo's reduce-scatter as torch's ProcessGroupGloo runs it
(reduce_scatter_tensor_coalesced): a full ring all-reduce of the input, each rank keeping
its chunk. Priced where a backend table or the user names it, never chosen by `auto`."""

from __future__ import annotations

from commsim.collectives.algorithms import ring
from commsim.collectives.algorithms.base import Algorithm, Form, Rounds, Schedule


def schedule(op: str, n: int, size: float, **_) -> Schedule:
    """The ring all-reduce of the whole input (ring.schedule)."""
    return ring.schedule("all-reduce", n, size)


def terms(op: str, n, **_) -> list[Rounds]:
    # The ring all-reduce's: 2(N-1)(a + S/(N b)) (Patarasuk & Yuan 2009).
    return ring.terms("all-reduce", n)


ALGORITHM = Algorithm("allreduce-ring", {"reduce-scatter": Form(schedule, terms)}, searched=False)
