"""The bytes outside the tensors (step.workspace) against hand counts of each library's
sizes, NCCL's channel counts from published logs and from the priced groups' own NCCL
model, and the user-set fragmentation reserve through predict and its JSON."""

import json

import numpy as np
import pytest

from commsim.catalog import gpu
from commsim.scenario import resolve
from commsim.specs import Scenario, Strategy
from commsim.step import workspace as ws
from commsim.step.predict import predict, step_model, strategy_layouts

MIB = 2**20
# NCCL's three protocol buffers of one connection: 512 KiB + 4,915,200 B + 4 MiB
CONNECTION = 524_288 + 4_915_200 + 4_194_304


def _setup(gpus=16, **strategy):
    s = Scenario(
        model="llama3-8b",
        cluster="dgx-h100-ib",
        gpus=gpus,
        global_batch=64,
        strategy=Strategy(**strategy),
    )
    return resolve(s)


def test_library_sizes_by_hand():
    assert ws.NCCL_LL == 8 * 512 * 8 * 16 == 524_288
    assert ws.NCCL_LL128 == 4_915_200
    assert ws.NCCL_SIMPLE == 4_194_304
    assert ws.ring_bytes(24) == 24 * CONNECTION == 231_211_008
    assert ws.TORCH_BLAS_BYTES == 8_519_680  # :4096:2:16:8


@pytest.mark.parametrize(
    ("name", "fp8", "overlap", "expected"),
    [
        ("h100", False, False, 2 * 32 * MIB),  # two handles' 32 MiB on sm 9.0
        ("h100", True, False, 2 * 32 * MIB + 32 * MIB),  # and TE's one
        ("h100", True, True, 2 * 32 * MIB + 3 * 32 * MIB),  # TE's three UB streams
        ("a100", False, False, 2 * 8_519_680),
        ("a100", True, False, 2 * 8_519_680 + 4 * MIB),
    ],
)
def test_blas_bytes(name, fp8, overlap, expected):
    assert ws.blas_bytes(gpu(name), np.array([fp8]), np.array([overlap]))[0] == expected


def test_one_node_tensor_parallel_ring_matches_the_published_channels():
    # 8 H100 on one node: the communicator runs 24 channels (NVIDIA/TensorRT-LLM#953's log)
    setup = _setup(gpus=8, tp=8)
    model = step_model(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    assert ws.nccl_bytes(model.groups, L)[0] == 24 * CONNECTION


def test_nccl_bytes_against_the_priced_groups():
    # independently: each ring kind's GroupCost (the one collectives are priced on) and its
    # NCCL communicator, summed with the pipeline's two point-to-point buffers
    setup = _setup(gpus=64, tp=4, pp=2, cp=2)
    model = step_model(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    placement, tp, dp, pp, cp = (int(c[0]) for c in (L.placement, L.tp, L.dp, L.pp, L.cp))
    want = 2 * 4 * MIB  # the previous and the next stage
    for kind in ("tp", "cp", "dp"):
        cost = model.groups.cost(placement, kind, tp, dp, pp, 1, 1, cp)
        if cost is not None:
            want += cost.comm().graphs.comm_channels * CONNECTION
    assert ws.nccl_bytes(model.groups, L)[0] == want


def test_predict_adds_the_workspace_and_search_agrees():
    setup = _setup(gpus=16, tp=8, precision="fp8", tp_overlap=True)
    p = predict(setup)
    model = step_model(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    tp_ring, dp_ring = 24 * CONNECTION, ws.nccl_bytes(model.groups, L)[0] - 24 * CONNECTION
    assert dp_ring > 0  # the two nodes' data-parallel pairs
    blas = 2 * 32 * MIB + 3 * 32 * MIB
    # userbuffers: Llama 3 8B's 8192 tokens x 4096 a buffer, 6 FP8 gathers, 4 bf16 scatters
    ub = (6 * 1 + 4 * 2) * 8192 * 4096
    assert p.memory.workspace == pytest.approx(400 * MIB + blas + tp_ring + dp_ring + ub)
    assert model.memory(L)[0] == pytest.approx(p.memory.total, rel=1e-12)


def test_memory_reserve_is_the_users():
    setup = _setup(gpus=8, tp=8)
    hbm = setup.gpu.hbm_bytes
    assert predict(setup).memory_usable == hbm
    reserved = resolve(setup.scenario.model_copy(update={"memory_reserve": 0.1}))
    p = predict(reserved)
    assert p.memory_usable == pytest.approx(0.9 * hbm)
    assert p.to_dict()["memory"]["reserve_fraction"] == 0.1
    assert step_model(reserved).usable == pytest.approx(0.9 * hbm)


def test_memory_reserve_flag():
    from typer.testing import CliRunner

    from commsim.cli.app import app

    base = ["predict", "--model", "llama3-8b", "--cluster", "dgx-h100-ib", "--gpus", "8"]
    base += ["--global-batch", "64", "--tp", "8", "--json"]
    result = CliRunner().invoke(app, [*base, "--memory-reserve", "0.25"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    assert memory["reserve_fraction"] == 0.25
    assert memory["usable_bytes"] == pytest.approx(0.75 * gpu("h100").hbm_bytes)
    assert memory["workspace_bytes"] == 400 * MIB + 2 * 32 * MIB + 24 * CONNECTION
    bad = CliRunner().invoke(app, [*base, "--memory-reserve", "1.5"])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and "--memory-reserve 1.5" in lines[0], bad.output


def test_plan_keeps_the_reserve_free():
    from typer.testing import CliRunner

    from commsim.cli.app import app

    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-ib", "--gpus", "8"]
    args += ["--global-batch", "16", "--tp", "8", "--json"]
    fitting = []
    for reserve in ("0", "0.8"):  # every layout needs more than the 17.1 GB 0.8 leaves
        result = CliRunner().invoke(app, [*args, "--memory-reserve", reserve])
        assert result.exit_code == 0, result.output
        fitting.append(json.loads(result.stdout)["fitting"])
    assert fitting[0] > 0 and fitting[1] == 0


def test_userbuffers_by_hand():
    # 2048 tokens x 12,288 (GPT-3's micro-batch): bf16 10 x 2 B, FP8 6 x 1 + 4 x 2 B a value
    L = strategy_layouts(_setup(gpus=8, tp=8), [Strategy(tp=8, tp_overlap=True)] * 2)
    L = L.take(np.array([0, 1]))
    L.fp8[1] = True
    values = 2048 * 12288
    assert list(ws.userbuffers_bytes(L, values)) == [20 * values, 14 * values]
    off = strategy_layouts(_setup(gpus=8, tp=8), [Strategy(tp=8)])
    assert ws.userbuffers_bytes(off, values)[0] == 0.0


def test_cpu_hosts_hold_no_cuda_workspace():
    spec = _setup(gpus=8, tp=8).cluster.spec
    cpu = spec.model_copy(update={"node": spec.node.model_copy(update={"gpu": "cpu-host"})})
    s = Scenario(model="gpt2-xl", cluster=cpu, gpus=8, global_batch=8, compute_efficiency=0.5)
    setup = resolve(s)
    model = step_model(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    assert model.workspace(L)[0] == 0.0 and predict(setup).memory.workspace == 0.0


def test_expert_all_to_all_connects_every_peer():
    # Mixtral over ep 8 inside one node: the all-to-all's 7 peers, a Simple buffer each,
    # beside the data-parallel ring (dp 8 on one node: the published 24 channels)
    s = Scenario(
        model="mixtral-8x7b",
        cluster="dgx-h100-ib",
        gpus=8,
        global_batch=64,
        strategy=Strategy(ep=8),
    )
    setup = resolve(s)
    model = step_model(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    assert ws.nccl_bytes(model.groups, L)[0] == 24 * CONNECTION + 7 * 4 * MIB
