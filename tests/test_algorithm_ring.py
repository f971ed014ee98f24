"""Ring all-reduce, reduce-scatter, all-gather: hand-computed closed forms and schedules."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule, bus_factor
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB


def t(op, n, **kw):
    return float(collective_time(op, "ring", n, S, A, B, **kw))


@pytest.mark.parametrize(
    "op,n,kw,expected",
    [
        # ring AR, N=4: 2(N-1) steps of S/N
        ("all-reduce", 4, {}, 2 * 3 * A + 2 * 3 / 4 * S / B),
        ("reduce-scatter", 4, {}, 3 * A + 3 / 4 * S / B),
        ("all-gather", 4, {}, 3 * A + 3 / 4 * S / B),
        # rings give every rank one peer per step: the overhead never shows
        ("all-reduce", 4, {"overhead": 5 * A}, 2 * 3 * A + 2 * 3 / 4 * S / B),
    ],
)
def test_closed_form_by_hand(op, n, kw, expected):
    assert t(op, n, **kw) == pytest.approx(expected, rel=1e-12)


def test_ring_bus_bandwidth_approaches_link_bandwidth():
    # nccl-tests' point of busbw: a bandwidth-bound ring all-reduce shows busbw = B
    big = 2.0**40
    time = float(collective_time("all-reduce", "ring", 64, big, 0.0, B))
    assert big / time * bus_factor("all-reduce", 64) == pytest.approx(B)


@pytest.mark.parametrize("n", [2, 5, 8, 12])
def test_bytes_each_rank_sends(n):
    # all-reduce: 2(N-1)/N S per rank; RS/AG: (N-1)/N S
    sent = traffic(build_schedule("all-reduce", "ring", n, S), n)[0]
    assert sent == pytest.approx(np.full(n, 2 * (n - 1) / n * S))
    for op in ("reduce-scatter", "all-gather"):
        sent = traffic(build_schedule(op, "ring", n, S), n)[0]
        assert sent == pytest.approx(np.full(n, (n - 1) / n * S))


def test_identical_steps_are_emitted_once():
    (ring,) = build_schedule("all-reduce", "ring", 16384, S)
    assert ring.repeat == 2 * 16383 and ring.rounds == ring.repeat and ring.src.size == 16384
