"""MoE in the step model: parallel folding (the expert grid over the attention grid's ranks),
experts' memory, and the MoE layer's kernels, against hand-computed cases and an independent
rank generator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import make_cluster
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.planner.search import enumerate_layouts, search
from commsim.report import labels
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec
from commsim.step.block_gemms import mlp_gemms
from commsim.step.compute import _Block, _prices
from commsim.step.gemm import Rates, gemm_seconds, tile_utilisation
from commsim.step.groups import Groups
from commsim.step.kernel_bytes import ELEMENTWISE, GROUPED_GEMM_STREAMS, PERMUTE_PASS, ROUTER_BYTES
from commsim.step.layouts import RANK_ORDERS, Layouts
from commsim.step.memory import ParallelLayout, memory_per_gpu
from commsim.step.predict import predict, step_model
from commsim.workload.presets import build_workload

MOE = ModelSpec(
    name="toy-moe",
    layers=4,
    hidden=1024,
    heads=8,
    vocab=1000,
    seq_len=512,
    gated_mlp=True,
    ffn_hidden=2048,
    experts=8,
    top_k=2,
    capacity_factor=1.0,
    moe_ffn_hidden=512,
)
H100 = catalog.GPUS["h100"]


def megatron_groups(kind, tp, cp, dp, pp, ep, etp, order):
    """Expert groups as Megatron-core's expert RankGenerator lays them out, written from its
    rank arithmetic: tp=etp, ep, dp=edp, cp=1 in the order's dimensions (fastest first:
    etp, ep, edp, pp; or etp, ep, pp, edp for the pipeline inside data parallelism)."""
    edp = tp * cp * dp // (ep * etp)
    sizes = {"etp": etp, "ep": ep, "edp": edp, "pp": pp}
    dims = ["etp", "ep", "edp", "pp"] if order == "tp-cp-ep-dp-pp" else ["etp", "ep", "pp", "edp"]
    groups = {}
    for coords in itertools.product(*(range(sizes[d]) for d in dims)):
        rank, stride = 0, 1
        for d, c in zip(dims, coords, strict=True):
            rank += c * stride
            stride *= sizes[d]
        key = tuple(c for d, c in zip(dims, coords, strict=True) if d != kind)
        groups.setdefault(key, set()).add(rank)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize(
    "tp,cp,dp,pp,ep,etp,order",
    [
        (2, 1, 16, 2, 32, 1, "tp-cp-ep-dp-pp"),  # Qwen3-235B's fold: ep spans tp x dp
        (2, 1, 8, 2, 4, 2, "tp-cp-ep-dp-pp"),  # etp = tp: ep out of dp, as before folding
        (2, 2, 4, 1, 8, 2, "tp-cp-ep-dp-pp"),  # ep spans cp and dp
        (4, 2, 2, 2, 2, 1, "tp-cp-ep-dp-pp"),  # ep inside the tp ranks, edp over the rest
        (2, 2, 2, 2, 4, 1, "tp-cp-ep-pp-dp"),  # pipeline inside dp: ep x etp = tp x cp
    ],
)
def test_expert_groups_are_megatrons(tp, cp, dp, pp, ep, etp, order):
    n = tp * cp * dp * pp
    groups = Groups(make_cluster(nodes=n // 8 or 1, gpus_per_node=min(n, 8), nics=1), n)
    for kind in ("ep", "edp", "etp"):
        got = groups.members(0, kind, tp, dp, pp, ep, cp, 1, RANK_ORDERS.index(order), etp)
        assert {frozenset(r) for r in got.tolist()} == megatron_groups(
            kind, tp, cp, dp, pp, ep, etp, order
        ), kind


def test_qwen3_235b_fold_by_hand():
    # tp 2, dp 16, pp 8 on 256 GPUs, ep 32, etp 1: a stage's 32 ranks are one ep group,
    # each GPU alone in its expert-data-parallel and expert-tensor-parallel groups
    groups = Groups(make_cluster(nodes=32, gpus_per_node=8, nics=8), 256)
    ep = groups.members(0, "ep", 2, 16, 8, 32, 1, 1, 0, 1)
    assert ep.shape == (8, 32) and ep[1].tolist() == list(range(32, 64))
    assert groups.members(0, "edp", 2, 16, 8, 32, 1, 1, 0, 1).shape == (256, 1)
    assert groups.cost(0, "edp", 2, 16, 8, 32, 1, 1, 1, 0, 1) is None  # nothing to reduce


def _memory(**kw):
    base = dict(dp=4, tp=2, pp=1, micro_batch=1, zero=1, grad_bytes=4, sequence_parallel=True)
    return memory_per_gpu(build_workload(MOE), ParallelLayout(**base | kw))


def test_experts_shard_over_ep_times_etp():
    w = build_workload(MOE)
    expert = w.expert_params  # one block's experts
    assert expert == 8 * 3 * 1024 * 512  # gate, up, down of 512 for 8 experts
    folded = _memory(ep=8, etp=1)  # ep x etp = 8: an eighth of every block's experts
    carved = _memory(ep=2)  # etp = tp = 2, ep 2 out of dp: a quarter
    # weights: 2 bytes x 4 blocks x experts x (1/4 - 1/8)
    assert carved.params - folded.params == pytest.approx(2 * 4 * expert * (1 / 4 - 1 / 8))
    # ZeRO-1 shards the experts' optimizer states over edp = tp dp / (ep etp): whatever the
    # fold, each GPU keeps 12 bytes x experts / (tp dp) of them
    assert carved.optimizer == pytest.approx(folded.optimizer)
    # fp32 main gradients (unsharded under ZeRO-1): 4 bytes x (1/4 - 1/8)
    assert carved.grads - folded.grads == pytest.approx(4 * 4 * expert * (1 / 4 - 1 / 8))


def test_tile_utilisation_of_concurrent_gemms_by_hand():
    # 1024 x 5760 output: 4 x 45 = 180 whole tiles; alone 2 waves on 132 SMs (180 / 264),
    # four at once 720 tiles in 6 waves (720 / 792)
    assert float(tile_utilisation(1024, 5760, 132)) == pytest.approx(180 / 264)
    assert float(tile_utilisation(1024, 5760, 132, 4)) == pytest.approx(720 / 792)
    # the four take 4 x flops / (rate x 720 / 792) (their outputs' write aside)
    t = gemm_seconds(1024, 5760, 2880, 1e15, 132, 4, 4, write=0.0)
    assert float(t) == pytest.approx(4 * 2 * 1024 * 5760 * 2880 / (1e15 * 720 / 792))


def _block(tp, ep, etp, tokens=4096.0, fp8=False):
    w = build_workload(MOE)
    arr = lambda x: np.array([float(x)])  # noqa: E731
    prices = _prices(w.arch, Layouts.build(tp=tp), ELEMENTWISE["norm"][1])
    return _Block(
        w.arch, Rates.of(H100), arr(tokens), arr(tp), arr(ep), arr(etp), np.array([fp8]),
        np.array([True]), w, arr(tp), prices, arr(8 / Rates.of(H100).memory),
    )  # fmt: skip


def test_moe_layer_kernels_by_hand():
    # t = 4096 tokens, tp 2: 2048 on this GPU, 2 copies each (top 2): 4096 copies; ep 4,
    # etp 1: 2 local experts of 8 x 2 / (2 x 8) x 4096 = 2048 rows each, width 512
    rates = Rates.of(H100)
    gemms, elementwise, moved = _block(2, 4, 1)._moe()
    seconds, cast, elementwise, moved = (
        float(x[0]) for x in (gemms.fwd, gemms.cast, elementwise, moved)
    )
    assert cast == 0.0  # BF16
    util = 128 / 132  # 2 experts x 8 x 8 tiles of 256 x 128 at once: one wave
    write = 2 / rates.memory  # each output element through HBM (gemm_seconds)
    up = 2 * 2048 * 1024 * (1024 * 2 / (rates.gemm * util) + write)  # gate + up: 2 x 512
    down = 2 * 2048 * 1024 * (512 * 2 / (rates.gemm * util) + write)
    router = 2048 * 8 * (1024 * 2 / (rates.gemm * (8 / 128) * (8 / 132)) + write)  # 8 columns
    assert seconds == pytest.approx(up + down + router)
    # SwiGLU reads gate and up, writes their product (3 x 512 x 2 bytes) per copy; the
    # router's 21 bytes per token and expert
    assert elementwise == pytest.approx(4096 * 3 * 512 * 2 + 2048 * 8 * ROUTER_BYTES)
    # permute and unpermute the 4096 copies, sort and unsort them by local expert: 4 passes
    # reading and writing h = 1024 bf16 values
    assert moved == pytest.approx(2 * PERMUTE_PASS * (4096 + 4096) * 1024 * 2)
    assert GROUPED_GEMM_STREAMS == 4


@pytest.mark.parametrize("tp,ep,etp", [(1, 1, 1), (2, 4, 1), (2, 2, 2), (4, 8, 1), (4, 2, 4)])
def test_expert_flops_do_not_depend_on_the_fold(tp, ep, etp):
    # whatever the grid, a GPU's expert GEMMs do its own tokens' share: t / tp tokens x top
    # 2 x 3 matrices of 1024 x 512 x 2 FLOPs (an independent count from the workload's side)
    b = _block(tp, ep, etp)
    rows = b.etp * b.ep * 2 / (b.tp * 8)
    shapes = mlp_gemms(b.arch, b.tokens * rows, 512, b.etp, 8 / b.ep)
    flops = sum(2 * m * n * k * count for m, n, k, count in shapes)
    assert float(flops[0]) == pytest.approx(4096 / tp * 2 * 3 * 1024 * 512 * 2)


def _predict(*args):
    base = ["predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib", "--gpus", "16"]
    return CliRunner().invoke(app, [*base, "--global-batch", "64", *args])


@pytest.mark.parametrize(
    "args,expect",
    [
        (("--tp", "2", "--ep", "8", "--etp", "4"), "ep x etp = 8 x 4 does not divide a stage's"),
        (
            ("--tp", "2", "--pp", "2", "--ep", "8", "--etp", "1", "--order", "tp-cp-ep-pp-dp"),
            "tp-cp-ep-pp-dp with pp > 1 needs ep x etp = tp x cp",
        ),
    ],
)
def test_bad_expert_grids_exit_2_in_one_line(args, expect):
    result = _predict(*args)
    assert result.exit_code == 2, result.output
    assert expect in result.output and len(result.output.strip().splitlines()) == 1


def test_folded_expert_parallelism_predicts():
    result = _predict("--tp", "2", "--ep", "8", "--etp", "1", "--zero", "1", "--json")
    assert result.exit_code == 0, result.output
    assert '"etp": 1' in result.output


def test_the_search_and_predict_agree_on_folded_layouts():
    # layouts whose ep spans tp ranks (etp 1 under tp 2), priced by the vectorised search and
    # by predict one at a time: one model, one figure
    overrides = dict(model=MOE, cluster="dgx-h100-ib", gpus=16, global_batch=64)
    setup = resolve(load_scenario(None, overrides)[0], check=False)
    layouts = enumerate_layouts(setup, {"tp": 2, "etp": 1, "zero": 1, "recompute": "none"})
    folded = np.nonzero(layouts.ep * layouts.expert_tp > layouts.tp)[0]
    assert set(layouts.ep[folded].tolist()) == {4, 8}  # ep over tp and dp ranks, 8 experts
    found = search(step_model(setup), layouts)
    row = {int(i): k for k, i in enumerate(found.fitting)}
    picks = [i for i in folded.tolist() if i in row][:12]
    assert picks
    for i in picks:
        strategy = layouts.strategy(i, setup.scenario.strategy)
        sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
        predicted = predict(variant, strategy).step_time_s
        assert predicted == pytest.approx(float(found.breakdown.step[row[i]]), rel=1e-9)


@pytest.mark.parametrize("command", ["predict", "plan"])
@pytest.mark.parametrize("flag", [("--ep", "4"), ("--etp", "1")])
def test_expert_flags_on_a_dense_model_are_refused(command, flag):
    args = ["--model", "llama2-7b", "--cluster", "dgx-h100-ib", "--gpus", "16"]
    result = CliRunner().invoke(app, [command, *args, "--global-batch", "64", *flag])
    assert result.exit_code == 2, result.output
    assert f"{' '.join(flag)}: expert " in result.output and "needs experts" in result.output


def test_plan_explains_the_expert_dimensions():
    # the winner and two layouts differing from it only in ep, or only in etp
    base = dict(tp=2, pp=1, cp=1, zero=1, recompute="none", interleave=1, ep=8, etp=1)
    base |= dict(algorithm="ring", bucket_mb=25.0, overlap=True, placement="blocked")
    base |= dict(compression="none", error_feedback=False, order="tp-cp-ep-dp-pp")
    base |= dict(fsdp_shard=None, precision="bf16", tp_overlap=False, flash_attention=True)
    figures = dict(compute_s=1.0, comm_s=0.2, codec_s=0.0, exposed_comm_s=0.1, overlap_ratio=0.5)
    figures |= dict(bubble_s=0.0, tp_comm_s=0.0, ep_comm_s=0.1, pp_comm_s=0.0, dp_exposed_s=0.0)
    rows = [
        dict(strategy=base, step_time_s=1.0, **figures),
        dict(strategy=base | {"ep": 4}, step_time_s=1.25, **figures),
        dict(strategy=base | {"etp": None, "ep": 8}, step_time_s=1.5, **figures),
    ]
    text = "\n".join(labels.explain_winner(rows))
    assert "best other expert parallelism (ep 4): +250 ms per step" in text
    assert "best other expert tensor parallelism (etp 2): +500 ms per step" in text
