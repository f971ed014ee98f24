"""The PyTorch stacks' element-wise kernels (step.eager, Strategy.kernels): each inventory's
bytes by hand, op by op; a block's and the loss's time against the closed-form difference
from Megatron's kernels; FSDP2's copy-out per gather; predict and the search alike."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from commsim import catalog, whatif
from commsim.cli.app import app
from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec, SpecError
from commsim.step import eager
from commsim.step.compute import stage_times
from commsim.step.layouts import Layouts
from commsim.step.predict import predict, step_model
from commsim.workload.presets import build_workload

# Llama style: RMSNorm, SwiGLU, rotary, grouped-query attention (8 heads over 2 K/V heads)
LLAMA = ModelSpec(
    name="toy-llama", layers=4, hidden=512, heads=8, kv_heads=2, ffn_hidden=1536,
    gated_mlp=True, vocab=1000, seq_len=256,
)  # fmt: skip
GPT = ModelSpec(name="toy", layers=4, hidden=512, heads=8, vocab=1000, seq_len=256)
H100 = catalog.GPUS["h100"]
HBM = H100.stream_bandwidth


def test_each_inventory_by_hand():
    """Bytes an element, read + write of every kernel (bf16 2, fp32 4):
    RMSNorm forward: float 2+4, pow 4+4, mean 4, x*r 4+4, type_as 4+2, *w 2+2 = 36;
    backward: dy*w 2+2, dy*y 4+2, sum 2, to fp32 2+4, g*r 4+4, g*x 8+4, sum 4, mean's 4,
    pow(1) copy 4+4, 2*that 4+4, grad*that 8+4, the two summed 8+4, to bf16 4+2 = 92;
    SwiGLU silu 2+2, product 4+2 = 10, backward three of 4+2 = 18; RoPE cast 2+4, complex
    product 4+4, cast 4+2 = 20 each way; torch cross-entropy cast 2+4, log_softmax 4+4 = 14,
    backward zeros 4, log_softmax's 8+4, cast 4+2 = 22; the fused one 2 and 2+2, and
    Composer's two training metrics' log_softmax in fp32 forward, 2 x (2+4): 14 and 4."""
    hand = {
        "RMSNORM_FORWARD": 36,
        "RMSNORM_BACKWARD": 92,
        "SWIGLU_FORWARD": 10,
        "SWIGLU_BACKWARD": 18,
        "ROPE_FORWARD": 20,
        "ROPE_BACKWARD": 20,
        "TORCH_CE_FORWARD": 14,
        "TORCH_CE_BACKWARD": 22,
        "FUSED_CE_FORWARD": 14,
        "FUSED_CE_BACKWARD": 4,
    }
    assert {name: eager.total(getattr(eager, name)) for name in hand} == hand


def test_repeat_kv_by_hand():
    """Llama 3 8B: 32 heads over 8 K/V heads of 128: K and V each read 8 x 128 and write
    32 x 128 bf16 values a token, 2 x 2 x 40 x 128 = 20,480 bytes, backward the same;
    nothing without grouped-query attention."""
    assert eager.repeat_kv_bytes(32, 8, 128) == (20480, 20480)
    assert eager.repeat_kv_bytes(32, 32, 128) == (0, 0)


def _times(model, kernels, **fields):
    L = Layouts.build(micro_batch=2, kernels=eager.KERNELS.index(kernels), **fields)
    return stage_times(build_workload(model), H100, L)


def test_eager_block_against_megatron_in_closed_form():
    """b s = 512 tokens, h = 512, width 1536, q and k 8 + 2 heads of 64, tp 1. Per token,
    forward: two norms 2 x 512 x (36 - 4), SwiGLU 1536 x (10 - 6), RoPE 640 x (20 - 4), the
    K/V copies 2 x 2 x 10 x 64; backward: norms 2 x 512 x (92 - 10) (Megatron's two-pass:
    5 values), SwiGLU 1536 x (18 - 10), RoPE 640 x (20 - 4), the copies' sums again."""
    t, h, w, qk, repeat = 512, 512, 1536, 640, 2 * 2 * 10 * 64
    fwd = t * (2 * h * 32 + w * 4 + qk * 16 + repeat) / HBM
    bwd = t * (2 * h * 82 + w * 8 + qk * 16 + repeat) / HBM
    mega, titan = _times(LLAMA, "megatron"), _times(LLAMA, "torchtitan")
    assert float(titan.block_fwd[0] - mega.block_fwd[0]) == pytest.approx(fwd, rel=1e-9)
    assert float(titan.block_bwd[0] - mega.block_bwd[0]) == pytest.approx(bwd, rel=1e-9)
    # compiled blocks run Megatron's kernels but for the K/V copies SDPA needs
    comp = _times(LLAMA, "torchtitan-compile")
    assert float(comp.block_fwd[0] - mega.block_fwd[0]) == pytest.approx(t * repeat / HBM, 1e-9)
    # op-level checkpointing replays the forward's element-wise work at the stack's price
    op = dict(recompute=3)
    replay = float(_times(LLAMA, "torchtitan", **op).op_replay[0])
    assert replay - float(_times(LLAMA, "megatron", **op).op_replay[0]) == pytest.approx(fwd)


def test_the_loss_and_final_norm_by_hand():
    """512 tokens x 1000 logits: torchtitan's eager loss 14 and 22 bytes a logit against
    Megatron's 38 and 14; llm-foundry's fused one with Composer's metrics 14 and 4; the
    final RMSNorm eager (36, 92
    against 4, 10 bytes of h) in torchtitan only."""
    logits, norm = 512 * 1000, 512 * 512
    mega = _times(LLAMA, "megatron")
    for kernels, (f, b), (nf, nb) in (
        ("torchtitan", (14 - 38, 22 - 14), (32, 82)),
        ("torchtitan-compile", (14 - 38, 22 - 14), (0, 0)),
        ("llm-foundry", (14 - 38, 4 - 14), (0, 0)),
    ):
        got = _times(LLAMA, kernels)
        fwd, bwd = (f * logits + nf * norm) / HBM, (b * logits + nb * norm) / HBM
        assert float(got.post_fwd[0] - mega.post_fwd[0]) == pytest.approx(fwd, rel=1e-9)
        assert float(got.post_bwd[0] - mega.post_bwd[0]) == pytest.approx(bwd, rel=1e-9)


def test_a_gpt_block_runs_the_same_kernels_under_llm_foundry():
    """LayerNorm and GeLU are one ATen kernel each, as Megatron's: only the loss differs."""
    mega, foundry = _times(GPT, "megatron"), _times(GPT, "llm-foundry")
    assert float(foundry.block_fwd[0]) == float(mega.block_fwd[0])
    assert float(foundry.block_bwd[0]) == float(mega.block_bwd[0])


@pytest.mark.parametrize("kernels", ["torchtitan", "torchtitan-compile"])
def test_fsdp2_copy_out_by_hand(kernels):
    """ZeRO-3 under FSDP2: 4 bytes a block parameter (a Llama block: 2 x 512 x (512 + 128)
    attention, 3 x 512 x 1536 MLP, 2 x 512 norms) before the forward and before the
    backward; with a full recompute the replayed forward carries the backward's; FSDP1
    (llm-foundry) copies nothing, nor do other ZeRO stages."""
    params = 2 * 512 * (512 + 128) + 3 * 512 * 1536 + 2 * 512
    copy = 4 * params / HBM
    base, z3 = _times(LLAMA, kernels, zero=1), _times(LLAMA, kernels, zero=3)
    assert float(z3.block_fwd[0] - base.block_fwd[0]) == pytest.approx(copy, rel=1e-9)
    assert float(z3.block_bwd[0] - base.block_bwd[0]) == pytest.approx(copy, rel=1e-9)
    full = dict(zero=3, recompute=2)
    assert float(_times(LLAMA, kernels, **full).block_bwd[0]) == pytest.approx(
        float(_times(LLAMA, kernels, zero=1, recompute=2).block_bwd[0]), rel=1e-12
    )
    foundry = _times(LLAMA, "llm-foundry", zero=3).block_fwd[0]
    assert float(foundry) == float(_times(LLAMA, "llm-foundry", zero=1).block_fwd[0])


@pytest.mark.parametrize("stack", ["torchtitan", "llm-foundry"])
def test_predict_and_the_search_agree_on_a_stack(stack):
    """The search carries the scenario's kernels to every layout and prices them, the
    optimizer step included, as predict."""
    fields = dict(model=LLAMA, cluster="dgx-h100-ib", gpus=16, global_batch=32, seq_len=256)
    sc, src = load_scenario(None, fields | {"kernels": stack, "states": "fsdp"})
    setup = resolve(sc.model_copy(update={"compute_efficiency": None}), src, check=False)
    layouts = enumerate_layouts(setup)
    assert (layouts.kernels == eager.KERNELS.index(stack)).all()
    found = search(step_model(setup), layouts)
    rank = {int(i): k for k, i in enumerate(found.fitting)}
    z3 = [i for i in found.fitting if layouts.zero[i] == 3]
    picks = np.random.default_rng(5).choice(z3, size=min(8, len(z3)), replace=False)
    for i in picks:
        strategy = layouts.strategy(int(i), setup.scenario.strategy)
        assert strategy.kernels == stack
        sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
        got = predict(variant, strategy)
        k = rank[int(i)]
        assert got.step_time_s == pytest.approx(float(found.breakdown.step[k]), 1e-9)
        assert got.parts["optimizer_s"] == pytest.approx(float(found.breakdown.optimizer[k]))


def test_what_if_takes_the_stack():
    """whatif.change sets kernels like any strategy field: on Llama 3 8B at 8K the eager
    stack is the slowest of the three (the compiled one may beat Megatron's: its eager loss
    moves 36 bytes a logit against Megatron's 52); a name that is not a stack is refused."""
    base = whatif.load(changes={"model": "llama3-8b", "seq_len": 8192, "gpus": 8})
    base = base.model_copy(update={"compute_efficiency": None})  # the roofline, not one rate
    step = {
        k: whatif.predict(whatif.change(base, {"kernels": k})).step_time_s
        for k in ("megatron", "torchtitan-compile", "torchtitan")
    }
    assert step["torchtitan"] > max(step["megatron"], step["torchtitan-compile"])
    assert step["megatron"] != step["torchtitan-compile"]
    with pytest.raises(SpecError, match="kernels"):
        whatif.change(base, {"kernels": "jax"})


def test_the_flag_in_predict_and_plan(tmp_path):
    """--kernels reaches predict and every layout plan searches (a scenario on the roofline:
    one compute_efficiency prices no kernel); a stack that is not one is one line naming the
    flag, exit 2."""
    scenario = tmp_path / "llama.yaml"
    scenario.write_text(
        "name: t\nmodel: llama3-8b\ncluster: dgx-h100-ib\ngpus: 8\nglobal_batch: 16\n"
        "seq_len: 8192\ncompute_efficiency: null\n"
    )
    run, common = CliRunner(), [str(scenario), "--json"]
    steps = {}
    for k in ("megatron", "torchtitan"):
        out = run.invoke(app, ["predict", *common, "--zero", "3", "--kernels", k])
        assert out.exit_code == 0, out.output
        steps[k] = json.loads(out.output)
        assert steps[k]["strategy"]["kernels"] == k
    assert steps["torchtitan"]["step_time_s"] > steps["megatron"]["step_time_s"]
    plan = json.loads(run.invoke(app, ["plan", *common, "--kernels", "torchtitan"]).output)
    assert {c["strategy"]["kernels"] for c in plan["candidates"]} == {"torchtitan"}
    bad = run.invoke(app, ["predict", *common, "--kernels", "jax"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "--kernels jax" in bad.output


@pytest.mark.parametrize("kernels", ["megatron", "torchtitan", "llm-foundry"])
def test_scaling_efficiency_is_one_on_one_gpu_whatever_the_kernels(kernels):
    """The single-GPU reference runs the layout's own kernels: one GPU is its own reference."""
    fields = dict(model="llama2-7b", cluster="dgx-h100-ib", gpus=1, global_batch=4, seq_len=2048)
    fields |= dict(compute_efficiency="roofline", kernels=kernels)
    scenario, source = load_scenario(None, fields)
    assert predict(resolve(scenario, source)).scaling_efficiency == pytest.approx(1.0)
