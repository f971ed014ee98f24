"""Algorithm choice: the closed-form optimum and NCCL's ring-or-tree rule."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.evaluate import collective_time, hierarchical_time
from commsim.collectives.select import best_algorithm

pytestmark = pytest.mark.filterwarnings("error")

A, B = 5e-6, 25e9


def test_best_is_the_minimum_of_the_candidates():
    n = np.array([2, 6, 8, 48, 1024])[:, None]
    size = 2.0 ** np.arange(0, 34, 3)[None, :]
    names, times = best_algorithm("all-reduce", n, size, A, B)
    assert names.shape == times.shape == (5, 12)
    for alg in ("ring", "tree", "rhd"):
        assert np.all(times <= collective_time("all-reduce", alg, n, size, A, B))
    for (i, j), name in np.ndenumerate(names):
        own = collective_time("all-reduce", name, n[i, 0], size[0, j], A, B)
        assert times[i, j] == own


def test_choices_follow_latency_and_bandwidth():
    # N=6 is not a power of two. 8 B: RHD's 2 lg 4 + 2 = 6 steps beat the ring's 10.
    # 1 GiB: the ring moves 2 (5/6) S against RHD's 2 (3/4) S + 2 S of folding.
    names, _ = best_algorithm("all-reduce", 6, [8.0, 2.0**30], A, B)
    assert names.tolist() == ["rhd", "ring"]
    # N=8, a power of two: RHD has the ring's bandwidth term and fewer steps, always
    names, _ = best_algorithm("all-reduce", 8, [8.0, 2.0**30], A, B)
    assert names.tolist() == ["rhd", "rhd"]
    names, _ = best_algorithm("all-gather", 6, [8.0, 2.0**30], A, B)
    assert names.tolist() == ["rhd", "ring"]
    names, _ = best_algorithm("broadcast", 6, [8.0, 2.0**30], A, B)
    assert names.tolist() == ["ring", "ring"]


def test_ps_and_hierarchical_compete_only_when_asked_or_possible():
    names, _ = best_algorithm("all-reduce", 8, 2.0**30, A, B, ps_shards=8)
    assert names != "ps"
    names, times = best_algorithm(
        "all-reduce", 8, 2.0**30, A, B, ps_shards=8, candidates=("ring", "ps")
    )
    # ps with 8 shards: 2 (a + 6 o + 7/8 S/B) = 8 a + 2 (7/8) S/B (o = a/2, each server
    # handles 7 messages) beats the ring's 14 a + 2 (7/8) S/B
    assert names == "ps"
    assert times == pytest.approx(2 * (4 * A + 7 / 8 * 2.0**30 / B))
    # small messages at 64 ranks: the server's 63 messages each way, 2 (a + 62 o) = 64 a,
    # lose to RHD's 12 a even when PS is a candidate
    names, times = best_algorithm(
        "all-reduce", 64, 8.0, A, B, candidates=("ring", "tree", "rhd", "ps")
    )
    assert names == "rhd"
    # an explicit overhead (a with a fabric part, o = a / 5): 2 (a + 62 a / 5) for PS
    _, ps = best_algorithm("all-reduce", 64, 0.0, A, B, overhead=A / 5, candidates=("ps",))
    assert ps == pytest.approx(2 * (A + 62 * A / 5))
    with pytest.raises(ValueError, match="intra_alpha"):
        best_algorithm("all-reduce", 8, 1.0, A, B, candidates=("hierarchical",))


def test_hierarchical_wins_large_messages_on_fast_nodes():
    # 64 nodes x 8 GPUs, NVLink 450 GB/s at 1 us inside, 25 GB/s at 5 us between
    n, g, size = 512, 8, np.array([2.0**10, 2.0**30])
    names, times = best_algorithm(
        "all-reduce", n, size, A, B, gpus_per_node=g, intra_alpha=1e-6, intra_bandwidth=450e9
    )
    assert names.tolist() == ["rhd", "hierarchical"]
    assert times[1] == hierarchical_time("all-reduce", 64, g, 2.0**30, 1e-6, 450e9, A, B)
    # overheads reach the phases (rings: one peer a step, so nothing changes)
    two_tier = dict(gpus_per_node=g, intra_alpha=1e-6, intra_bandwidth=450e9)
    _, plain = best_algorithm("all-reduce", n, size, A, B, candidates=("hierarchical",), **two_tier)
    _, heavy = best_algorithm(
        "all-reduce", n, size, A, B, overhead=A, intra_overhead=1e-6,
        candidates=("hierarchical",), **two_tier,
    )  # fmt: skip
    assert heavy.tolist() == plain.tolist() and plain[1] == times[1]
    # a group that is not whole nodes cannot run it
    names, _ = best_algorithm(
        "all-reduce", 500, 2.0**30, A, B, gpus_per_node=g, intra_alpha=1e-6, intra_bandwidth=450e9
    )
    assert names != "hierarchical"
