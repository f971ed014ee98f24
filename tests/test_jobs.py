"""Several jobs on one fabric (commsim.multijob): allocation, shared links, slowdowns."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import make_cluster, make_spec
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.collectives.group import GroupCost
from commsim.multijob import JobsSpec, run_jobs
from commsim.topology.placement import allocate, place, pod_of_node
from commsim.topology.routing import Background

JOB = {"model": "gpt2-xl", "gpus": 64, "global_batch": 512, "seq_len": 1024}


def _two_pods():
    """16 nodes of 8 GPUs, two pods of 4 leaves, 4:1 between the pods."""
    return make_spec(
        nodes=16, nics=8, nic_bw="200Gbps", tiers=3, leaves_per_pod=4, oversubscription=(1, 4)
    )


def _jobs(allocation: str, jobs=None, **extra) -> JobsSpec:
    data = {"cluster": _two_pods().model_dump(), "allocation": allocation, **extra}
    data["jobs"] = jobs or [JOB | {"name": "a"}, JOB | {"name": "b"}]
    return JobsSpec.model_validate(data)


def test_identical_jobs_on_disjoint_pods_run_at_single_job_speed():
    a, b = run_jobs(_jobs("packed"), "test")
    assert (a.pods, b.pods) == (1, 1)
    assert set(a.nodes) & set(b.nodes) == set()
    assert a.shared.step_time_s == a.alone.step_time_s == b.shared.step_time_s
    assert a.slowdown == 1.0


def test_fragmented_jobs_share_the_aggregation_tier_and_slow_down():
    a, b = run_jobs(_jobs("fragmented"), "test")
    assert (a.pods, b.pods) == (2, 2)
    assert a.slowdown > 1.0 and b.slowdown > 1.0
    assert a.shared.parts["dp_comm_s"] > a.alone.parts["dp_comm_s"]


def test_sharing_a_leaf_uplink_halves_the_rate_as_max_min_says():
    # 4 single-GPU nodes, 2 leaves of 2, each leaf's uplink = one 100 Gb/s NIC (2:1).
    # Job A on nodes 0 and 2, job B on 1 and 3: A's ring flow 0 -> 2 and B's 1 -> 3 share
    # leaf 0's uplink (and 2 -> 0, 3 -> 1 leaf 1's): max-min gives each 12.5 / 2 GB/s.
    # A ring all-reduce of 2 ranks moves S each way: alone S / 12.5e9 s, shared twice that.
    c = make_cluster(nodes=4, gpus_per_node=1, nodes_per_leaf=2, oversubscription=(2.0,))
    alone = GroupCost(c, np.array([0, 2])).affine("all-reduce", "ring")[1]
    c.background = Background(np.array([1, 3]), np.array([3, 1]), np.array([-1, -1]))
    c.solved_steps = {}
    shared = GroupCost(c, np.array([0, 2])).affine("all-reduce", "ring")[1]
    assert alone == pytest.approx(1 / 12.5e9, rel=1e-9)
    assert shared == pytest.approx(2 / 12.5e9, rel=1e-9)
    # a background on other leaves changes nothing
    c.background = Background(np.array([1]), np.array([1]), np.array([-1]))
    c.solved_steps = {}
    assert GroupCost(c, np.array([0, 2])).affine("all-reduce", "ring")[1] == alone


def test_allocation_policies():
    c = make_cluster(nodes=16, tiers=3, leaves_per_pod=2)  # 4 pods of 4 nodes
    packed = allocate(c, [4, 4], "packed")
    assert [n.tolist() for n in packed] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    pods = pod_of_node(c)
    for nodes in allocate(c, [4, 4], "fragmented"):
        assert sorted(pods[nodes].tolist()) == [0, 1, 2, 3]  # one node in every pod
    first, again = allocate(c, [8], "random", seed=3), allocate(c, [8], "random", seed=3)
    assert first[0].tolist() == again[0].tolist() != list(range(8))
    rest = allocate(c, [2], "packed", exclude=[0, 1])
    assert rest[0].tolist() == [2, 3]
    with pytest.raises(ValueError, match="need 17 nodes; 16 are free"):
        allocate(c, [17], "packed")


def test_a_job_runs_on_its_allocation():
    c = make_cluster(nodes=4, gpus_per_node=2)
    c.allocation = np.array([6, 7, 2, 3])
    assert place(c, 4, "blocked").tolist() == [6, 7, 2, 3]
    assert sorted(place(c, 4, "interleaved").tolist()) == [2, 3, 6, 7]
    assert place(c, 4, "topology-aware").tolist() == [2, 3, 6, 7]


def test_jobs_command(tmp_path):
    path = tmp_path / "jobs.yaml"
    doc = _jobs("packed").model_dump(mode="json")
    path.write_text(yaml.safe_dump(doc))
    runner = CliRunner()
    out = runner.invoke(app, ["jobs", str(path), "--allocation", "fragmented", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["allocation"] == "fragmented"
    assert [j["name"] for j in got["jobs"]] == ["a", "b"]
    job = got["jobs"][0]
    assert job["slowdown"] == pytest.approx(job["shared_step_time_s"] / job["alone_step_time_s"])
    assert {"nodes", "pods", "gpus", "alone", "shared", "strategy"} <= set(job)
    table = runner.invoke(app, ["jobs", str(path)])
    assert table.exit_code == 0 and "slowdown" in table.stdout


@pytest.mark.parametrize(
    "change, message",
    [
        ({"jobs": [JOB | {"nodes": [0, 1]}]}, "jobs.0.nodes: 2 nodes for 8 needed"),
        ({"jobs": [JOB | {"cluster": "aws-p4d"}]}, "jobs.0.cluster: jobs share"),
        ({"jobs": [JOB | {"gpus": 200}]}, "jobs.0: gpus: 200 GPUs requested"),
        ({"jobs": [JOB, JOB | {"gpus": 128, "global_batch": 1024}]}, "need 24 nodes; 16 are free"),
        ({"jobs": [JOB | {"strategy": {"tp": 3}}]}, "strategy"),
        ({"allocation": "spread"}, "allocation"),
    ],
)
def test_bad_jobs_files_exit_2_naming_the_field(tmp_path, change, message):
    doc = _jobs("packed").model_dump(mode="json") | change
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = CliRunner().invoke(app, ["jobs", str(path)])
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output


def test_group_levels():
    from commsim.topology.placement import group_level

    c = make_cluster(nodes=16, gpus_per_node=2, tiers=3, leaves_per_pod=2)  # 4 pods of 4
    assert group_level(c, np.array([[0, 1], [2, 3]])) == "node"
    assert group_level(c, np.array([[0, 2]])) == "rack"
    assert group_level(c, np.array([[0, 6]])) == "pod"
    assert group_level(c, np.array([[0, 1], [0, 8]])) == "fabric"


def test_pipeline_inside_dp_puts_the_replicas_across_pods():
    from commsim.step.groups import Groups
    from commsim.step.layouts import RANK_ORDERS
    from commsim.topology.placement import group_level

    # 4 pods of 4 nodes of 2 GPUs; tp 2, pp 4, dp 4: Megatron's order puts each pipeline
    # stage (4 nodes) in one pod, so pipelines cross pods; tp-cp-ep-pp-dp puts each
    # pipeline in one pod and the replicas across pods
    c = make_cluster(nodes=16, gpus_per_node=2, tiers=3, leaves_per_pod=2)
    g = Groups(c, 32)
    levels = {}
    for order in RANK_ORDERS:
        grid = g._ranks(0, 2, 1, 4, 4, RANK_ORDERS.index(order))
        levels[order] = (
            group_level(c, grid.transpose(0, 2, 3, 1).reshape(-1, 4)),  # dp
            group_level(c, grid.transpose(1, 2, 3, 0).reshape(-1, 4)),  # pp
        )
    assert levels == {"tp-cp-ep-dp-pp": ("pod", "fabric"), "tp-cp-ep-pp-dp": ("fabric", "pod")}
    dp = g.members(0, "dp", 2, 4, 4, order=RANK_ORDERS.index("tp-cp-ep-pp-dp"))
    assert sorted(dp.ravel().tolist()) == list(range(32))


def test_plan_searches_the_rank_order():
    from commsim.planner.search import enumerate_layouts
    from commsim.scenario import resolve
    from commsim.specs import Scenario
    from commsim.step.layouts import RANK_ORDERS

    spec = make_spec(nodes=16, tiers=3, leaves_per_pod=2, oversubscription=(1, 7))
    scenario = Scenario(model="llama3-8b", cluster=spec, gpus=128, global_batch=256, seq_len=2048)
    layouts = enumerate_layouts(resolve(scenario, check=False), {"tp": 8, "zero": 1})
    outer = layouts.order == RANK_ORDERS.index("tp-cp-ep-pp-dp")
    assert outer.any() and (layouts.pp[outer] > 1).all() and (layouts.dp[outer] > 1).all()
