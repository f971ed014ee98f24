"""The recompute time of Strategy.recompute_modules: each module's replayed forward, kernel by
kernel, against hand-computed FLOPs and bytes, and as the step model adds it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.activations import recompute_code
from commsim.step.compute import _Block, _prices
from commsim.step.gemm import Rates, tile_utilisation
from commsim.step.kernel_bytes import ACT, ELEMENTWISE, FP8_CAST
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.step.shape import Shape
from commsim.workload.presets import build_workload

H100 = catalog.GPUS["h100"]
MOE = ModelSpec(
    name="toy-moe", layers=4, hidden=1024, heads=8, vocab=1000, seq_len=512, gated_mlp=True,
    ffn_hidden=2048, experts=8, top_k=2, capacity_factor=1.0, moe_ffn_hidden=512,
)  # fmt: skip


def _block(w, tp=1, tokens=4096.0, fp8=False, split=None):
    arr = lambda x: np.array([float(x)])  # noqa: E731
    prices = _prices(w.arch, Layouts.build(tp=tp), ELEMENTWISE["norm"][1])  # Megatron's kernels
    return _Block(
        w.arch, Rates.of(H100), arr(tokens), arr(tp), arr(1), arr(tp), np.array([fp8]),
        np.array([True]), w, arr(split or tp), prices, arr(8 / Rates.of(H100).memory),
    )  # fmt: skip


def _replay(block, *modules):
    return float(block.module_replay(np.array([recompute_code(modules)]))[0])


def test_layernorm_replays_the_two_norms_forward():
    # two norms, each reading and writing h = 1024 bf16 values of the 4096 / 2 tokens a
    # sequence-parallel rank holds; under FP8 each output cast again (read 2, write 1 + 1)
    w = build_workload(MOE)
    hbm = Rates.of(H100).memory
    assert _replay(_block(w, tp=2), "layernorm") == pytest.approx(2 * 2048 * 1024 * 4 / hbm)
    fp8 = _replay(_block(w, tp=2, fp8=True), "layernorm")
    assert fp8 == pytest.approx(2 * 2048 * 1024 * (4 + 4) / hbm)
    assert _replay(_block(w, tp=2)) == 0.0


def test_moe_act_replays_swiglu_on_every_routed_copy():
    # 4096 tokens x top 2 = 8192 copies, SwiGLU reads gate and up and writes the product (3 x
    # 512 values, 2 B) on each; every block of the toy is MoE
    w = build_workload(MOE)
    hbm = Rates.of(H100).memory
    got = _replay(_block(w), "moe_act")
    assert got == pytest.approx(8192 * 512 * 3 * 2 / hbm)
    # the layernorm's and the experts' replays add up
    both = _replay(_block(w), "moe_act", "layernorm")
    assert both == pytest.approx(got + _replay(_block(w), "layernorm"))


def test_mla_up_proj_replays_the_up_projections_by_hand():
    # DeepSeek-V3, 4096 tokens on one GPU: Q's up-projection 1536 -> 128 x (128 + 64) and
    # the keys' and values' 512 -> 128 x (128 + 128), 2 m n k FLOPs each; their outputs of
    # 4096 rows tile into 16 x 192 = 3,072 and 16 x 256 = 4,096 tiles of 256 x 128, 24 and 32
    # waves on 132 SMs, each output written (2 B an element); then the rotary embedding of
    # Q and K (read and write)
    w = build_workload("deepseek-v3")
    c, rates = w.arch, Rates.of(H100)
    out = 2 / rates.memory
    q = 2 * 4096 * 24576 * 1536 / (rates.gemm * 3072 / (24 * 132)) + 4096 * 24576 * out
    kv = 2 * 4096 * 32768 * 512 / (rates.gemm * 4096 / (32 * 132)) + 4096 * 32768 * out
    rotary = 2 * 4096 * (c.heads + c.kv_heads) * c.head_width * ACT / rates.memory
    assert _replay(_block(w), "mla_up_proj") == pytest.approx(q + kv + rotary, rel=1e-12)
    assert float(tile_utilisation(4096, 24576, 132)) == pytest.approx(3072 / (24 * 132))
    # the same FLOPs counted from the model's shape (Shape.mla_up_flops, per sample)
    flops = 2 * 4096 * (1536 * 128 * 192 + 512 * 128 * 256)
    assert Shape.of(build_workload("deepseek-v3", 4096)).mla_up_flops == flops
    assert FP8_CAST == 4


def _model(w, n=8):
    cluster = make_cluster(nodes=n // 8, gpus_per_node=8, nics=8, nic_bw="400Gbps")
    return StepModel(w, cluster, H100, n, 64, None)


def test_the_step_adds_the_replay_to_each_backward_unless_the_forward_is_replayed_anyway():
    w = build_workload(MOE)
    model = _model(w)
    code = recompute_code(["layernorm", "moe_act"])
    L = Layouts.build(
        dp=8, micro_batches=8, recompute=[0, 0, 1, 1, 2, 2], recompute_parts=[0, code] * 3
    )
    c = model.compute(L)
    replay = model._stage_times(L).module_replay
    extra = c.backward[1::2] - c.backward[0::2]
    assert extra[:2] == pytest.approx(4 * replay[1::2][:2])  # 4 blocks, none and selective
    assert extra[2] == 0.0  # full recomputation replays the whole forward already
    assert (c.forward[1::2] == c.forward[0::2]).all()


def test_hardware_flops_count_the_replayed_up_projections():
    # one efficiency for every FLOP: the replayed up-projections take their FLOPs' time, and
    # the hardware FLOP/s count them (hfu), the model FLOP/s (mfu) do not
    w = build_workload("deepseek-v3", 4096)
    model = StepModel(
        w, make_cluster(nodes=8, gpus_per_node=8, nics=8, nic_bw="400Gbps"), H100, 64, 64, 0.5
    )
    code = recompute_code(["mla_up_proj"])
    L = Layouts.build(dp=64, ep=64, micro_batches=1, recompute_parts=[0, code])
    b = model.evaluate(L)
    sh = model.shape
    extra = sh.blocks * sh.mla_up_flops / (H100.peak_flops * 0.5)
    assert b.backward[1] - b.backward[0] == pytest.approx(extra, rel=1e-9)
    hfu_flops = b.hfu * b.step * 64 * H100.peak_flops
    assert hfu_flops[1] - hfu_flops[0] == pytest.approx(64 * sh.blocks * sh.mla_up_flops, rel=1e-6)
    assert b.mfu[1] < b.mfu[0]
