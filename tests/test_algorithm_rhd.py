"""Recursive halving-doubling: closed forms by hand, folds for non-powers of two."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB


def t(op, n, **kw):
    return float(collective_time(op, "rhd", n, S, A, B, **kw))


@pytest.mark.parametrize(
    "op,n,kw,expected",
    [
        # AR, N=8: 2 lg 8 steps, 2 (N-1)/N S
        ("all-reduce", 8, {}, 2 * 3 * A + 2 * 7 / 8 * S / B),
        # AR, N=6: p=4, r=2: 2 lg 4 steps + fold in and out (alpha + S/B each)
        ("all-reduce", 6, {}, 2 * 2 * A + 2 * 3 / 4 * S / B + 2 * (A + S / B)),
        ("reduce-scatter", 8, {}, 3 * A + 7 / 8 * S / B),
        # RS, N=6: fold 0->1, 2->3 (S); halving over v = 1,3,4,5 holding 2,2,1,1 blocks
        # of S/6: distance 1 moves 3 blocks, distance 2 at most 2; unfold 1->0, 3->2 (S/6)
        ("reduce-scatter", 6, {}, (A + S / B) + (A + 3 * S / 6 / B) + (A + 2 * S / 6 / B)
         + (A + S / 6 / B)),
        ("all-gather", 6, {}, 4 * A + 2 * S / B),
        # one peer per step, folds included: the overhead never shows
        ("all-reduce", 6, {"overhead": 5 * A}, 2 * 2 * A + 2 * 3 / 4 * S / B + 2 * (A + S / B)),
    ],
)  # fmt: skip
def test_closed_form_by_hand(op, n, kw, expected):
    assert t(op, n, **kw) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 8])
def test_bytes_each_rank_sends_on_powers_of_two(n):
    # all-reduce: 2(N-1)/N S per rank; reduce-scatter: (N-1)/N S
    sent = traffic(build_schedule("all-reduce", "rhd", n, S), n)[0]
    assert sent == pytest.approx(np.full(n, 2 * (n - 1) / n * S))
    sent = traffic(build_schedule("reduce-scatter", "rhd", n, S), n)[0]
    assert sent == pytest.approx(np.full(n, (n - 1) / n * S))


def test_non_power_of_two_folds():
    # N=6: ranks 0 and 2 fold into 1 and 3: they send S in, receive the result (AR: S,
    # RS: their block S/6) and take no part in between
    out, into = traffic(build_schedule("all-reduce", "rhd", 6, S), 6)
    assert out[[0, 2]] == pytest.approx([S, S]) and into[[0, 2]] == pytest.approx([S, S])
    out, into = traffic(build_schedule("reduce-scatter", "rhd", 6, S), 6)
    assert out[[0, 2]] == pytest.approx([S, S]) and into[[0, 2]] == pytest.approx([S / 6] * 2)
    # every rank ends with its block of S/6: what it received covers the other N-1 inputs
    # for that block, except that folded pairs pass whole vectors
    ag_out, ag_in = traffic(build_schedule("all-gather", "rhd", 6, S), 6)
    assert ag_out == pytest.approx(into) and ag_in == pytest.approx(out)  # RS run backwards


def test_one_step_per_distance():
    assert len(build_schedule("all-reduce", "rhd", 16384, S)) == 2 * 14
