"""Direct exchanges: all-to-all (every pair at once) and send-recv (nccl-tests' shift)."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB


@pytest.mark.parametrize(
    "n,kw,expected",
    [
        # N=4: 3 messages of S/4 share the link in one step, handled one by one:
        # alpha + 2 o + 3/4 S/B = 2 us + 3/4 S/B
        (4, {}, 2 * A + 3 / 4 * S / B),
        # an explicit overhead (alpha 1 us of which o = 0.2 us is endpoint): N=8 pays
        # 1 + 6 x 0.2 us
        (8, {"overhead": 0.2 * A}, 2.2 * A + 7 / 8 * S / B),
    ],
)
def test_all_to_all_by_hand(n, kw, expected):
    got = float(collective_time("all-to-all", "direct", n, S, A, B, **kw))
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8, 12])
def test_all_to_all_bytes_each_rank_sends(n):
    sent = traffic(build_schedule("all-to-all", "direct", n, S), n)[0]
    assert sent == pytest.approx(np.full(n, (n - 1) / n * S))


def test_shift_is_one_step_of_neighbours():
    (step,) = build_schedule("send-recv", "direct", 3, 64.0)
    assert step.src.tolist() == [0, 1, 2] and step.dst.tolist() == [1, 2, 0]


def test_send_recv_by_hand():
    # one step, one peer each way, the whole buffer: alpha + S/B at any n > 1
    got = collective_time("send-recv", "direct", [1, 2, 4, 100], S, A, B)
    assert got.tolist() == pytest.approx([0.0] + [A + S / B] * 3, rel=1e-12)


def test_send_recv_is_not_split_over_channels():
    # as calibrated against gloo and nccl-tests: one message each way, on the GPU's own NIC
    (step,) = build_schedule("send-recv", "direct", 4, S, channels=4)
    assert step.src.size == 4 and set(step.rail.tolist()) == {-1}
    (a2a,) = build_schedule("all-to-all", "direct", 4, S, channels=4)
    assert a2a.src.size == 4 * 12
