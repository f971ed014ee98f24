"""benchmarks/moe_imbalance.py: the busiest GPU's load under uniform random top-k routing,
its closed form against hand cases, exhaustive enumeration and Monte Carlo."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import load_script

mi = load_script("moe_imbalance")


def test_expected_max_of_normals_by_hand():
    assert mi.expected_max_normal(1) == 0.0
    # two: E max(Z1, Z2) = E |Z1 - Z2| / 2 = sqrt(2) sqrt(2 / pi) / 2 = 1 / sqrt(pi)
    assert mi.expected_max_normal(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-9)
    # three normals: 3 / (2 sqrt(pi)) (the classic order-statistic result)
    assert mi.expected_max_normal(3) == pytest.approx(3 / (2 * np.sqrt(np.pi)), rel=1e-9)


def test_per_token_variance_is_the_hypergeometric_one():
    # 8 experts, top 2, 4 GPUs of 2 experts: every pair of experts equally likely; the
    # copies GPU 0 gets, counted over all 28 pairs, against the closed form's variance
    copies = [sum(e // 2 == 0 for e in pair) for pair in itertools.combinations(range(8), 2)]
    var = np.var(copies)
    assert var == pytest.approx(2 * 0.25 * 0.75 * 6 / 7)  # k p (1 - p) (E - k) / (E - 1)
    # at T = 1 token the closed form is E[max of 4] x sqrt(var / (1 - p)) / (k p)
    p = 0.25
    expect = mi.expected_max_normal(4) * np.sqrt(var) / np.sqrt(1 - p) / (2 * p)
    assert mi.busiest_excess(1, 2, 8, 4) == pytest.approx(expect)


@pytest.mark.parametrize("tokens,top_k,experts,ranks", [(4000, 1, 4, 4), (3000, 2, 16, 4)])
def test_closed_form_against_monte_carlo(tokens, top_k, experts, ranks):
    closed = mi.busiest_excess(tokens, top_k, experts, ranks)
    mc, se = mi.monte_carlo_excess(tokens, top_k, experts, ranks, trials=400, seed=1)
    # the normal approximation of the maximum is good to a few per cent of the excess here
    assert abs(mc - closed) < 4 * se + 0.05 * closed, (mc, se, closed)


def test_the_script_lists_every_moe_run():
    rows = mi.moe_rows(mi.pr.load())
    assert {r["id"] for r in rows} >= {
        "mbridge2511-qwen3-30b-a3b-16",
        "mbridge2511-qwen3-235b-a22b-256",
        "deepseek-v3-pretrain-2048",
    }
    qwen = next(r for r in rows if r["id"] == "mbridge2511-qwen3-235b-a22b-256")
    # ep 32 x etp 1 GPUs of 1 x 4096 / 2 tokens each (sequence parallelism over tp 2)
    assert qwen["tokens"] == 32 * 2048 and qwen["routing"] == "forced balance"
