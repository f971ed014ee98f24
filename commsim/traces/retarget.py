"""A traced step re-derived at another scale: the layout the trace implies (tp, pp given,
dp = ranks / (tp pp)), each traced rank placed at the same (stage, data-parallel index,
tensor index) of the new layout (Megatron order: tp fastest, then dp, then pp), every
data-parallel group grown or shrunk to the new dp, the other groups kept, and every group
of the new layout listed so concurrent groups share the fabric when priced.

What is kept, and said so: compute per micro-batch and micro-batches per step (the per-GPU
batch: weak scaling), message sizes (nccl-tests sizes of DDP's and ZeRO's collectives do
not change with dp), the order of each rank's work and its waits.
"""

from __future__ import annotations

from dataclasses import replace

from commsim.specs import SpecError
from commsim.traces.graph import Graph

ASSUMPTIONS = (
    "compute per micro-batch and micro-batches per step kept (per-GPU batch: weak scaling)",
    "message sizes kept (nccl-tests sizes of data-parallel collectives do not depend on dp)",
    "ranks in Megatron order (tensor fastest, then data, then pipeline stages)",
    "ranks without a trace reach each collective with the traced ones",
    "a process group's collectives run one at a time, in launch order",
)


def _kind(ranks: tuple[int, ...], tp: int, dp: int) -> str:
    """'dp' for a data-parallel group (dp members, stride tp), else 'other'."""
    if (
        dp > 1
        and len(ranks) == dp
        and all(b - a == tp for a, b in zip(ranks[:-1], ranks[1:], strict=True))
    ):
        return "dp"
    return "other"


def check_layout(world: int, gpus: int, tp: int, pp: int) -> None:
    """The traced layout (tp x pp of `world` ranks) and the new scale fit: positive counts,
    both GPU counts multiples of tp x pp; a SpecError naming the flag otherwise."""
    for flag, n in (("--gpus", gpus), ("--tp", tp), ("--pp", pp)):
        if n < 1:
            raise SpecError(f"{flag} {n}", "", "must be a positive count")
    for flag, n in (("--tp/--pp: the traced ranks", world), ("--gpus", gpus)):
        if n % (tp * pp):
            raise SpecError(flag, "", f"{n} is not a multiple of tp x pp = {tp * pp}")


def retarget(graph: Graph, world: int, gpus: int, tp: int = 1, pp: int = 1) -> Graph:
    """The graph at `gpus` GPUs (see the module docstring)."""
    check_layout(world, gpus, tp, pp)
    dp0, dp1 = world // (tp * pp), gpus // (tp * pp)

    def new(rank: int) -> int | None:
        s, d, t = rank // (tp * dp0), (rank // tp) % dp0, rank % tp
        return s * tp * dp1 + d * tp + t if d < dp1 else None

    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    pg_of: dict[tuple[str, int], str] = {}  # (old pg, new rank) -> new pg
    for name, (desc, ranks) in graph.groups.items():
        if _kind(ranks, tp, dp0) == "dp":
            for s in range(pp):
                for t in range(tp):
                    members = tuple(s * tp * dp1 + d * tp + t for d in range(dp1))
                    key = f"{name}@{s}.{t}"
                    groups[key] = (desc, members)
                    for r in members:
                        pg_of[(name, r)] = key
        else:
            mapped = tuple(new(r) for r in ranks)
            if None in mapped:
                continue
            groups[name] = (desc, mapped)  # type: ignore[assignment]
            for r in mapped:
                pg_of[(name, r)] = name  # type: ignore[index]
    ranks = {}
    for rank, nodes in graph.ranks.items():
        r = new(rank)
        if r is None:
            continue
        ranks[r] = [
            replace(
                n,
                pg=pg_of.get((n.pg, r), n.pg) if n.pg is not None else None,
                peer=new(n.peer) if n.peer is not None else None,
            )
            for n in nodes
        ]
    if not ranks:
        raise SpecError("--gpus", "", f"{gpus} GPUs keep none of the traced ranks")
    return Graph(ranks, groups, dict(graph.metadata))
