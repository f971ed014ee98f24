"""Recursive halving-doubling (Thakur, Rabenseifner & Gropp 2005, "Optimization of
collective communication operations in MPICH", IJHPCA 19(1)): Rabenseifner's all-reduce,
reduce-scatter by recursive halving, all-gather by recursive doubling; ranks beyond the
largest power of two fold into a partner first."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import (
    Algorithm,
    Form,
    Rounds,
    Schedule,
    make_step,
    pow2_split,
    transposed,
)


def fold(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rabenseifner's fold for n not a power of two (Thakur et al. 2005): with p the largest
    power of two <= n and r = n - p, even rank 2i < 2r hands its data to odd rank 2i+1.

    Returns the even ranks, the odd ranks and `members` (the rank playing virtual rank v)."""
    p = 1 << (n.bit_length() - 1)
    r = n - p
    even, odd = np.arange(0, 2 * r, 2), np.arange(1, 2 * r, 2)
    return even, odd, np.concatenate([odd, np.arange(2 * r, n)])


def halving(members: np.ndarray, weight: np.ndarray, block: float) -> Schedule:
    """Recursive halving at distance 1, 2, 4, ...: after distance d/2, virtual rank v holds
    the blocks of the ranks congruent to v mod d; at distance d it sends its partner those
    congruent to the partner mod 2d. weight: blocks per virtual rank."""
    v = np.arange(members.size)
    steps = []
    d = 1
    while d < members.size:
        held = np.bincount(v % (2 * d), weights=weight, minlength=2 * d) * block
        partner = v ^ d
        steps.append(make_step(members, members[partner], held[partner % (2 * d)]))
        d *= 2
    return steps


def all_reduce(op: str, n: int, size: float, **_) -> Schedule:
    """Rabenseifner: fold, reduce-scatter by halving, all-gather by doubling, unfold."""
    even, odd, members = fold(n)
    rs = halving(members, np.ones(members.size), size / members.size)
    core = rs + transposed(rs)
    if even.size == 0:
        return core
    return [make_step(even, odd, size), *core, make_step(odd, even, size)]


def reduce_scatter(op: str, n: int, size: float, **_) -> Schedule:
    """Fold, recursive halving over the N blocks of S/N (folded ranks hold two), unfold."""
    even, odd, members = fold(n)
    weight = np.where(np.arange(members.size) < even.size, 2.0, 1.0)
    core = halving(members, weight, size / n)
    if even.size == 0:
        return core
    return [make_step(even, odd, size), *core, make_step(odd, even, size / n)]


def all_gather(op: str, n: int, size: float, **_) -> Schedule:
    """Recursive doubling: the reduce-scatter run backwards, every flow reversed."""
    return transposed(reduce_scatter(op, n, size))


def halving_blocks(lg: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Blocks the busiest pair moves over recursive halving on p = 2^lg virtual ranks of
    which the first r hold two blocks: sum over j = 1..lg of p/2^j + ceil(r/2^j)."""
    total = 2.0**lg - 1
    for j in range(1, int(np.max(lg, initial=0)) + 1):
        total = total + np.where(j <= lg, np.ceil(r / 2.0**j), 0.0)
    return total


def all_reduce_terms(op: str, n, **_) -> list[Rounds]:
    # Rabenseifner's algorithm (Thakur et al.): reduce-scatter by recursive halving then
    # all-gather by recursive doubling on p = 2^floor(lg N) ranks: 2 lg p a + 2 (p-1)/p S/b.
    # N not a power of two: the first 2r ranks pair up, the even one hands its vector to
    # its odd neighbour before (a + S/b) and gets the result back after (a + S/b). Every
    # step, folds included, gives a rank one peer each way.
    p, lg, r = pow2_split(n)
    folds = 2 * (r > 0)
    return [Rounds(2 * lg, 1, 2 * (p - 1) / p), Rounds(folds, 1, folds)]


def scatter_gather_terms(op: str, n, **_) -> list[Rounds]:
    # Reduce-scatter by recursive halving (Thakur et al.) on p ranks, distance 1, 2, 4, ...:
    # lg p steps, the busiest pair moving halving_blocks blocks of S/N in all. All-gather
    # by recursive doubling is the same schedule run backwards. N not a power of two: as
    # in all-reduce the extra ranks fold in (a + S/b) and get their block (a + S/(N b)).
    p, lg, r = pow2_split(n)
    folded = r > 0
    return [Rounds(lg, 1, halving_blocks(lg, r) / n), Rounds(2 * folded, 1, folded * (1 + 1 / n))]


ALGORITHM = Algorithm(
    "rhd",
    {
        "all-reduce": Form(all_reduce, all_reduce_terms),
        "reduce-scatter": Form(reduce_scatter, scatter_gather_terms),
        "all-gather": Form(all_gather, scatter_gather_terms),
    },
)
