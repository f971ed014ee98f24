"""Parameter server: closed form by hand (the server's fan-in), shards on the servers."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.evaluate import collective_time

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB
OV = A / 2  # the default per-message overhead: alpha is all endpoint (o + o)


def t(n, **kw):
    return float(collective_time("all-reduce", "ps", n, S, A, B, **kw))


@pytest.mark.parametrize(
    "n,kw,expected",
    [
        # N=4, 2 shards: a server takes 3 shards of S/2 in push and gives 3 in pull,
        # handling the 3 messages one by one: 2 (alpha + 2 o + 3 S/2 / B) = 2 (2 us + ...)
        (4, {"ps_shards": 2}, 2 * (A + 2 * OV + 3 * S / 2 / B)),
        (4, {"ps_shards": 4}, 2 * (2 * A + 3 * S / 4 / B)),
        # an explicit overhead (alpha 1 us of which o = 0.2 us is endpoint): 2 (1 + 2 x 0.2
        # us + ...)
        (4, {"overhead": 0.2 * A}, 2 * (1.4 * A + 3 * S / B)),
    ],
)
def test_closed_form_by_hand(n, kw, expected):
    assert t(n, **kw) == pytest.approx(expected, rel=1e-12)


def test_parameter_server_loses_small_messages_at_scale():
    # 64 ranks, 8 B: the server handles 63 messages each way, 2 (a + 62 o) = 64 a, against
    # RHD's 2 lg 64 = 12 a and the tree's 12 steps of a + 3 o = 2.5 a = 30 a
    ps = t(64, ps_shards=1) - 2 * 63 * S / B
    assert ps == pytest.approx(64 * A)
    small = {
        alg: float(collective_time("all-reduce", alg, 64, 8.0, A, B))
        for alg in ("ring", "tree", "rhd", "ps")
    }
    assert small["rhd"] < small["tree"] < small["ps"] < small["ring"]
    assert small["rhd"] == pytest.approx(12 * A, rel=1e-3)


def test_servers_take_every_shard():
    n, k = 6, 2
    push, pull = build_schedule("all-reduce", "ps", n, S, ps_shards=k)
    received = np.bincount(push.dst, weights=push.nbytes, minlength=n)
    assert received == pytest.approx([(n - 1) * S / k] * k + [0.0] * (n - k))
    assert np.array_equal(pull.src, push.dst) and np.array_equal(pull.dst, push.src)
