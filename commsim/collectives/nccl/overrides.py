"""NCCL_ALGO and NCCL_PROTO as NCCL reads them: which algorithms and protocols its tuner may
pick for each collective (src/graph/tuning.cc: parseList and ncclTopoTuneModel).

A value is a comma-separated list of names (case-insensitive), or, after a leading '^',
the names to leave out. From 2.24.3 a list may name its collective, and entries are
';'-separated: "ring,tree;allgather:ring" (every entry after the first names one; a named
entry replaces that collective's list). Algorithms: Tree, Ring, CollNetDirect,
CollNetChain, NVLS, NVLSTree, PAT (2.23+); protocols: LL, LL128, Simple; collectives:
Broadcast, Reduce, AllGather, ReduceScatter, AllReduce (src/init.cc ncclFuncStr).

What NCCL does with them: the listed ones stay enabled, the rest are off; NCCL's own
rules still switch off what cannot run here (NVLSTree on one node, CollNet and multi-node
NVLS without CollNet, ...); LL128 named explicitly is on even where NCCL would not enable
it by default (it is "2", NCCL's default rule, unless NCCL_PROTO names it). Before 2.24
NCCL ignored unknown names and, without CollNet, brought Ring and Tree back when no other
algorithm was left ("ignoring NCCL_ALGO=COLLNET"); commsim refuses unknown names at any
version (a typo would otherwise silently change nothing) and keeps that fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from commsim.collectives.nccl.tables import (
    ALGORITHMS,
    NVLS,
    NVLS_TREE,
    PAT,
    PROTOCOLS,
    RING,
    TREE,
    parse_version,
)

FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
OP_FUNCTION = {"broadcast": 0, "all-gather": 2, "reduce-scatter": 3, "all-reduce": 4}
DEFAULT = 2  # LL128's state when NCCL_PROTO does not name it: NCCL's platform rule decides
PER_COLLECTIVE = (2, 24)  # parseList takes "collective:list" entries from 2.24.3
PAT_FIRST = (2, 23)  # ncclAlgoStr has "PAT" from 2.23.4


@dataclass(frozen=True)
class Overrides:
    """What NCCL_ALGO / NCCL_PROTO leave enabled: per collective (FUNCTIONS) and algorithm
    1 or 0; per collective and protocol 1 (on), 0 (off) or DEFAULT; and whether the version
    brings Ring and Tree back when the list leaves none of Ring, Tree, NVLS, NVLSTree."""

    algo: np.ndarray
    proto: np.ndarray
    fallback: bool

    def algorithm(self, op: str, a: int, collnet: bool, nodes: int) -> bool:
        """Whether NCCL_ALGO leaves algorithm `a` on for `op` on `nodes` nodes (collnet:
        CollNet is up). The fallback looks at what is left after NCCL's own rules (NVLSTree
        off on one node, NVLS off across nodes without CollNet; 2.18 tuning.cc)."""
        row = self.algo[OP_FUNCTION[op]]
        if self.fallback and not collnet:
            live = row[[RING, TREE]].any() or row[NVLS] and nodes == 1
            if not (live or row[NVLS_TREE] and nodes > 1):
                return a in (RING, TREE) or bool(row[a])
        return bool(row[a])

    def protocol(self, op: str, p: int) -> int:
        """NCCL_PROTO's state of protocol `p` for `op`: 1, 0 or DEFAULT."""
        return int(self.proto[OP_FUNCTION[op], p])


def parse(algo: str | None, proto: str | None, version: str) -> Overrides | None:
    """The overrides of NCCL `version` for these values (None when neither is set); a
    ValueError naming the variable for a value NCCL would refuse or ignore."""
    if algo is None and proto is None:
        return None
    return _parse(algo, proto, str(version))


@lru_cache(maxsize=256)
def _parse(algo: str | None, proto: str | None, version: str) -> Overrides:
    v = parse_version(version)[:2]
    names = ALGORITHMS if v >= PAT_FIRST else ALGORITHMS[:PAT]
    algos = np.ones((len(FUNCTIONS), len(ALGORITHMS)), dtype=int)
    protos = np.ones((len(FUNCTIONS), len(PROTOCOLS)), dtype=int)
    protos[:, PROTOCOLS.index("LL128")] = DEFAULT
    if algo is not None:
        algos[:, : len(names)] = _parse_list("NCCL_ALGO", algo, names, v, version)
        algos[:, len(names) :] = 0
    if proto is not None:
        protos = _parse_list("NCCL_PROTO", proto, PROTOCOLS, v, version, protos)
    return Overrides(algos, protos, fallback=v < PER_COLLECTIVE)


def _parse_list(
    var: str, text: str, names: tuple[str, ...], v, version: str, start: np.ndarray | None = None
) -> np.ndarray:
    """parseList: one row per collective, one column per name, 1 where enabled."""
    out = np.ones((len(FUNCTIONS), len(names)), dtype=int) if start is None else start.copy()
    entries = [e for e in str(text).split(";") if e]  # strtok: empty entries vanish
    if not entries:
        raise ValueError(f"{var}={text!r}: names no {var.removeprefix('NCCL_').lower()}")
    for k, entry in enumerate(entries):
        prefix, sep, items = entry.partition(":")
        if not sep:
            prefix, items = None, entry
        if prefix is not None and v < PER_COLLECTIVE:
            raise ValueError(
                f"{var}={text!r}: NCCL {version} takes one list for every collective "
                "('collective:list' entries came in 2.24)"
            )
        if prefix is None and k:
            raise ValueError(f"{var}={text!r}: every entry but the first must name a collective")
        rows = _rows(var, text, prefix)
        drop = items.startswith("^")
        out[rows] = int(drop)
        for item in (i for i in items.removeprefix("^").split(",") if i):
            match = [j for j, n in enumerate(names) if n.lower() == item.lower()]
            if not match:
                raise ValueError(
                    f"{var}={text!r}: NCCL {version} knows no {item!r} (it has {', '.join(names)})"
                )
            out[rows, match[0]] = int(not drop)
    return out


def _rows(var: str, text: str, prefix: str | None) -> list[int]:
    """The collectives an entry applies to: all, or the one its prefix names."""
    if prefix is None:
        return list(range(len(FUNCTIONS)))
    match = [i for i, f in enumerate(FUNCTIONS) if f.lower() == prefix.lower()]
    if not match:
        raise ValueError(
            f"{var}={text!r}: no collective {prefix!r} (NCCL's are {', '.join(FUNCTIONS)})"
        )
    return match
