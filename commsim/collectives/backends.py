"""What each communication backend runs for each collective, by the registry's algorithm
names (collectives.algorithms) or 'nccl' (NCCL's own choice); 'a|b' runs the faster of a
and b, of those that can run on the group (GroupCost)."""

from __future__ import annotations

from commsim.collectives.algorithms import lookup

ALGORITHMS: dict[str, dict[str, str]] = {
    # gloo as torch's ProcessGroupGloo calls it for CPU tensors (ProcessGroupGloo.cpp):
    "gloo": {
        "all-reduce": "ring",  # gloo/allreduce.cc: ring reduce-scatter, then ring all-gather
        "all-gather": "ring",  # gloo/allgather.cc: N-1 ring steps, two segments in flight
        # ProcessGroupGloo::reduce_scatter_tensor_coalesced: a full all-reduce of the input,
        # each rank keeps its chunk
        "reduce-scatter": "allreduce-ring",
        # gloo/broadcast.cc: binomial tree rooted at the root, not pipelined; a rank posts
        # all its sends at once, so they share its link
        "broadcast": "binomial",
        "all-to-all": "direct",  # gloo/alltoall.cc: every send and receive posted at once
        "send-recv": "direct",  # each rank sends to the next and receives from the previous
    },
    # NCCL: its tuner's choice of algorithm and protocol for the collectives it prices
    # (GroupCost under the nccl backend; collectives.nccl); all-to-all and send-recv are
    # point-to-point sends, each rank's posted at once
    "nccl": {
        "all-reduce": "nccl",
        "all-gather": "nccl",
        "reduce-scatter": "nccl",
        "broadcast": "nccl",
        "all-to-all": "direct",
        "send-recv": "direct",
    },
}


def choices(backend: str, op: str) -> tuple[str, ...]:
    """The algorithms `backend` chooses between for `op` (one unless spelled 'a|b')."""
    return tuple(ALGORITHMS[backend][op].split("|"))


for _backend, _table in ALGORITHMS.items():  # every name is a registered algorithm of its op
    for _op in _table:
        for _name in choices(_backend, _op):
            if _name != "nccl":
                lookup(_op, _name)
