"""Solve max-min once per orbit: identical pods, units, rails and planes evaluated once.

A symmetry of a step is a permutation g of the flows (what a shift of the job by whole
units or pods, or a rotation of the NICs or planes, does to each flow's source, destination
and rail) that maps the step's flows onto its flows, sizes kept, together with a permutation
s of the links they use, capacities kept, such that the route of g(f) is s(route of f) hop
by hop. Max-min fair rates are unique, so they are the same on every flow of an orbit, and
the fluid model keeps that true as flows finish. Then one representative flow per orbit,
each hop on its link's orbit with weight |flow orbit| / |link orbit| (the number of that
orbit's flows crossing each link of the link orbit, per representative hop), gives the same
water-filling: every share is (remaining capacity) / (weighted flow count), as on the full
graph. The symmetries are not assumed: each candidate is checked on the routes themselves,
so hashed ECMP (no symmetry) is solved whole and anything that passes is exact. Tests
compare against the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from commsim.topology.build import Cluster

# Below this many flows in a step the whole graph solves faster than the symmetries are
# checked; either way the answer is the same (tests set it to 0 to compare the two).
MIN_FLOWS = 16384


@dataclass(frozen=True)
class Reduction:
    """The quotient problem: representative flows on link orbits."""

    reps: np.ndarray  # flow index of each orbit's representative
    orbit: np.ndarray  # orbit of every flow (index into reps)
    paths: np.ndarray  # representative paths on link-orbit ids, -1 padded
    weights: np.ndarray  # per hop: |flow orbit| / |link orbit|
    capacity: np.ndarray  # per link orbit


def _translations(cluster: Cluster) -> list[int]:
    """Node shifts to try, smallest first: powers-of-two multiples of a leaf's unit and of
    a pod, below the cluster's nodes."""
    unit = cluster.spec.fabric.nodes_per_leaf
    pod = unit * cluster.spec.fabric.leaves_per_pod
    shifts = set()
    for step in (unit, pod):
        t = step
        while t < cluster.n_nodes:
            if cluster.n_nodes % t == 0:
                shifts.add(t)
            t *= 2
    return sorted(shifts)


def _moves(cluster: Cluster):
    """Candidate symmetries as functions of (src, dst, rail) -> (src', dst', rail')."""
    gpn, n = cluster.gpus_per_node, cluster.n_gpus
    ports, per_nic = cluster.nics_per_node, cluster.ports_per_nic
    nics = ports // per_nic

    def shift(t):
        return lambda s, d, r: ((s + t * gpn) % n, (d + t * gpn) % n, r)

    def nic_turn(s, d, r):
        step = gpn // nics
        turn = lambda g: g - g % gpn + (g % gpn + step) % gpn  # noqa: E731
        return turn(s), turn(d), np.where(r >= 0, (r + per_nic) % ports, r)

    def port_turn(s, d, r):
        q = r % per_nic
        return s, d, np.where(r >= 0, r - q + (q + 1) % per_nic, r)

    moves = [(t, shift(t)) for t in _translations(cluster)]
    if nics > 1 and gpn % nics == 0:
        moves.append((0, nic_turn))
    if per_nic > 1:
        moves.append((0, port_turn))
    return moves


def _used(paths: np.ndarray, n_links: int) -> np.ndarray:
    """The link ids the paths cross, ascending (bincount: linear, no sort or hash)."""
    return np.flatnonzero(np.bincount(paths[paths >= 0], minlength=n_links))


def _first_of(labels: np.ndarray, count: int) -> np.ndarray:
    """The first index of each label 0..count-1."""
    first = np.empty(count, dtype=np.int64)
    first[labels[::-1]] = np.arange(labels.size)[::-1]
    return first


_PROBES = 64  # flows a move is tried on before all of them: most moves fail at once
_BLOCK = 16  # then the first 1 / _BLOCK of the flows (whole groups, sharing links), routes too
_SPAN = 1 << 20  # room under a flow's key for its size class and repeat index


def _tags(keys: np.ndarray, shape: np.ndarray) -> np.ndarray | None:
    """A unique integer per flow: its key, its size class (equal sizes, equal class) and
    which of the flows with that key and size it is, so that several flows between the
    same endpoints on the same rail (one a tree) map one to one."""
    sizes = np.sort(shape)
    distinct = sizes[np.concatenate([[True], sizes[1:] != sizes[:-1]])]
    code = np.searchsorted(distinct, shape)
    base = keys * _SPAN + code * (_SPAN // 1024)
    order = np.argsort(base, kind="stable")
    ranked = base[order]
    start = np.concatenate([[True], ranked[1:] != ranked[:-1]])
    first = np.maximum.accumulate(np.where(start, np.arange(ranked.size), 0))
    repeat = np.empty(ranked.size, dtype=np.int64)
    repeat[order] = np.arange(ranked.size) - first
    if distinct.size > 1024 or repeat.max() >= _SPAN // 1024:
        return None  # too many size classes or repeats to tag: solve the step whole
    return base + repeat


def _keys(src, dst, rail, width, ports) -> np.ndarray:
    return (src * width + dst) * (ports + 1) + (rail + 1)


def _flow_map(sorted_keys, order, shape, target, mine) -> np.ndarray | None:
    """The flow permutation a move makes (target: the moved flows' keys, mine: their
    sizes; shape: every flow's), or None when it does not map the step onto itself (a flow
    it makes is not there, or has another size)."""
    at = np.searchsorted(sorted_keys, target).clip(0, sorted_keys.size - 1)
    if (sorted_keys[at] != target).any():
        return None
    image = order[at]
    return None if (shape[image] != mine).any() else image


def _link_map(own, mapped, used, capacity) -> np.ndarray | None:
    """The link permutation that carries every route `own` onto its image's route `mapped`
    (the same flows' rows), or None when there is none (a link would go to two links, two
    links to one, or capacities differ). On some of the flows a None refutes the whole
    step's: every conflict among some routes is one among all of them."""
    hop = own >= 0
    if (hop != (mapped >= 0)).any():
        return None
    sigma = np.full(capacity.size, -1, dtype=np.int64)
    sigma[own[hop]] = mapped[hop]
    if (sigma[own[hop]] != mapped[hop]).any():
        return None
    if np.bincount(sigma[used]).max() > 1 or (capacity[sigma[used]] != capacity[used]).any():
        return None
    return sigma


def _components(size: int, pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[int, np.ndarray]:
    """(count, label of each of `size` items): connected components under the pairs."""
    a = np.concatenate([p[0] for p in pairs])
    b = np.concatenate([p[1] for p in pairs])
    graph = coo_matrix((np.ones(a.size, dtype=np.int8), (a, b)), shape=(size, size))
    return connected_components(graph, directed=False)


def reduce(cluster: Cluster, src, dst, rail, shape, paths) -> Reduction | None:
    """The quotient of a step under the symmetries that hold for it, or None when none
    does. shape: each flow's relative size (a persistent flow: inf)."""
    n_flows, width, ports = src.size, cluster.n_gpus, cluster.nics_per_node
    if n_flows < 2:
        return None
    own = _keys(src, dst, rail, width, ports)
    tag = _tags(own, shape)
    if tag is None:
        return None
    rest = tag - own * _SPAN  # size class and repeat index: a move keeps both
    order = np.argsort(tag)
    keys = tag[order]
    length = (paths >= 0).sum(axis=1)

    def _target(move, at: slice) -> np.ndarray:
        """The tags of the flows `at` once moved."""
        return _keys(*move(src[at], dst[at], rail[at]), width, ports) * _SPAN + rest[at]

    def _image(move, at: slice) -> np.ndarray | None:
        """Where the move takes the flows `at` (None: not onto the step's flows, or onto
        routes of other lengths, which no link map carries)."""
        image = _flow_map(keys, order, shape, _target(move, at), shape[at])
        return None if image is None or (length[image] != length[at]).any() else image

    def _refuted(move) -> bool:
        """A cheap refusal first, on some flows: most moves fail at once, and under hashed
        ECMP most fail only on the links, which a block of whole groups' flows shows."""
        if _image(move, slice(None, None, max(1, n_flows // _PROBES))) is None:
            return True
        block = slice(0, max(1, n_flows // _BLOCK))
        image = _image(move, block)
        if image is None:
            return True
        part = paths[block]
        return _link_map(part, paths[image], _used(part, n_links), cluster.capacity) is None

    n_links = cluster.capacity.size
    used = _used(paths, n_links)
    flow_pairs, link_pairs, shifted = [], [], []
    for t, move in _moves(cluster):
        if t and any(t % s == 0 for s in shifted):
            continue  # a multiple of an accepted shift: already in the group
        if _refuted(move):
            continue
        image = _image(move, slice(None))
        if image is None:
            continue
        sigma = _link_map(paths, paths[image], used, cluster.capacity)
        if sigma is None:
            continue
        shifted += [t] if t else []
        flow_pairs.append((np.arange(n_flows), image))
        link_pairs.append((used, sigma[used]))
    if not flow_pairs:
        return None
    return _quotient(cluster, paths, used, flow_pairs, link_pairs)


def _quotient(cluster: Cluster, paths, used, flow_pairs, link_pairs) -> Reduction:
    """Representatives, orbit sizes and hop weights from the accepted symmetries."""
    n_orbits, orbit = _components(paths.shape[0], flow_pairs)
    reps, flow_size = _first_of(orbit, n_orbits), np.bincount(orbit)
    # a symmetry carries the links in use onto links in use: their orbits, numbered 0..
    position = np.full(cluster.capacity.size, -1, dtype=np.int64)
    position[used] = np.arange(used.size)
    moved = [(position[a], position[b]) for a, b in link_pairs]
    n_link_orbits, link_orbit = _components(used.size, moved)
    of_link = np.full(cluster.capacity.size, -1, dtype=np.int64)
    of_link[used] = link_orbit
    link_size = np.bincount(link_orbit, minlength=n_link_orbits)
    first = used[_first_of(link_orbit, n_link_orbits)]
    rep_paths = paths[reps]
    hop = rep_paths >= 0
    quotient = np.where(hop, of_link[np.where(hop, rep_paths, 0)], -1)
    weights = np.where(hop, flow_size[:, None] / link_size[np.where(hop, quotient, 0)], 0.0)
    return Reduction(reps, orbit, quotient, weights, cluster.capacity[first])
