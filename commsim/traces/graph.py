"""A training step as an execution graph: per rank, nodes with durations and the nodes they
wait for (Chakra's model: compute, collective, send and receive nodes, data and control
dependencies merged, since a replay treats both alike). Kineto traces are turned into one
(imported.py), commsim layouts are exported as one (export.py), Chakra files hold one."""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("comp", "coll", "send", "recv")


@dataclass(frozen=True)
class Node:
    """One node of one rank.

    A collective runs on process group `pg` and meets the same-numbered collective of that
    group on every member rank; a send goes to `peer` and meets that rank's receive from
    this one, in order. `duration` is what was recorded (compute, and communication as it
    ran); a replay may price communication instead."""

    id: int
    kind: str
    name: str
    duration: float
    deps: tuple[int, ...] = ()
    op: str | None = None  # collectives: commsim's op (all-reduce, ...)
    bytes: float = 0.0  # nccl-tests' size; sends: the message
    pg: str | None = None
    peer: int | None = None  # sends: destination rank; receives: source rank
    tag: int | None = None  # sends and receives: matched by tag when given, else in order


@dataclass
class Graph:
    """Every rank's nodes, and the process groups they name: name -> (description, ranks).
    Groups with one description are one parallel dimension's replicas (all tensor-parallel
    groups, ...): their collectives run at the same time and are priced together."""

    ranks: dict[int, list[Node]]
    groups: dict[str, tuple[str, tuple[int, ...]]]
    metadata: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Nodes by kind, and collectives by op, over all ranks."""
        out: dict[str, int] = {}
        for nodes in self.ranks.values():
            for n in nodes:
                out[n.kind] = out.get(n.kind, 0) + 1
                if n.kind == "coll":
                    key = f"coll {n.op}"
                    out[key] = out.get(key, 0) + 1
        return out
