"""Memory per GPU against hand-computed cases: ZeRO's model states, Korthikanti's activations,
pipeline in-flight counts, buffers; the batch variant against the scalar one."""

from pathlib import Path

import numpy as np
import pytest

from commsim.catalog import gpu
from commsim.specs import LayerSpec, ModelSpec, SpecError
from commsim.step.activations import RECOMPUTE, activation_bytes_per_layer
from commsim.step.breakdown import MemoryBreakdown, usable_bytes
from commsim.step.inflight import in_flight
from commsim.step.memory import (
    ACTIVATION_BYTES_PER_FLOP,
    ParallelLayout,
    memory_per_gpu,
    memory_per_gpu_batch,
)
from commsim.step.states import MIB
from commsim.workload.presets import build_workload

GPT3 = 174_604_259_328  # build_workload("gpt3-175b").params, see test_workload
H = 12288  # GPT-3 175B hidden; 96 layers, 96 heads, vocabulary 50257, context 2048
SBH = 2048 * 1 * H  # s * b * h at s = 2048, b = 1
BUCKETS = 2 * 25 * MIB  # default buffers below ZeRO-3 (no workspace given)


def one_layer(params: float):
    return build_workload(
        ModelSpec(
            name="flat",
            kind="custom",
            custom_layers=[LayerSpec(name="w", params=params, forward_flops=0)],
        )
    )


@pytest.mark.parametrize(
    "zero, gb",  # ZeRO Figure 1: 7.5B parameters, 64 GPUs, K = 12
    [(0, 120.0), (1, 31.40625), (2, 16.640625), (3, 1.875)],
)
def test_zero_figure_1(zero, gb):
    # (2 + 2 + 12) 7.5; 4 x 7.5 + 12 x 7.5/64; 2 x 7.5 + 14 x 7.5/64; 16 x 7.5/64 (GB)
    m = memory_per_gpu(one_layer(7.5e9), ParallelLayout(dp=64, zero=zero))
    assert m.params + m.grads + m.optimizer == pytest.approx(gb * 1e9)
    assert m.activations == 0


def test_gpt3_states_by_zero_stage():
    w = build_workload("gpt3-175b")
    got = [memory_per_gpu(w, ParallelLayout(dp=64, zero=z)) for z in range(4)]
    expected = [
        (2 * GPT3, 2 * GPT3, 12 * GPT3),  # 16 bytes/parameter: 2.79 TB
        (2 * GPT3, 2 * GPT3, 12 * GPT3 / 64),
        (2 * GPT3, 2 * GPT3 / 64, 12 * GPT3 / 64),
        (2 * GPT3 / 64, 2 * GPT3 / 64, 12 * GPT3 / 64),  # 16 Psi / Nd = 43.65 GB
    ]
    for m, (p, g, o) in zip(got, expected, strict=True):
        assert (m.params, m.grads, m.optimizer) == pytest.approx((p, g, o))
    assert got[3].params + got[3].grads + got[3].optimizer == pytest.approx(43.65e9, rel=1e-3)


def test_fp32_gradients_are_megatrons_18_bytes():
    # Megatron distributed-optimizer table: bf16 params, fp32 grads: 18 bytes, 6 + 12/d sharded
    m = memory_per_gpu(one_layer(1e9), ParallelLayout(dp=8, grad_bytes=4))
    assert m.params + m.grads + m.optimizer == pytest.approx(18e9)
    m = memory_per_gpu(one_layer(1e9), ParallelLayout(dp=8, zero=1, grad_bytes=4))
    assert m.params + m.grads + m.optimizer == pytest.approx((6 + 12 / 8) * 1e9)


def test_llama2_7b_ddp_does_not_fit_h100():
    w = build_workload("llama2-7b")
    m = memory_per_gpu(w, ParallelLayout(dp=8, recompute="full"))
    assert m.params + m.grads + m.optimizer == 16 * 6_738_415_616  # 107.8 GB of states alone
    h100 = gpu("h100")
    assert not m.fits(h100)
    assert m.reason(h100).startswith("needs ")
    assert "of 85.5 GB usable on h100 (86 GB, no reserve): optimizer 80.9 GB" in m.reason(h100)
    assert "(86 GB, less 10% reserve)" in m.reason(h100, 0.1)


def test_gpt3_megatron_layout_fits_80gb():
    # Korthikanti et al.: GPT-3 175B at t = 8, p = 16, b = 1, s = 2048, SP + selective
    w = build_workload("gpt3-175b")
    layout = ParallelLayout(
        tp=8, pp=16, seq_len=2048, recompute="selective", sequence_parallel=True
    )
    m = memory_per_gpu(w, layout)
    block = (12 * H * H + 7 * H) / 8 + 6 * H  # matrices and column biases split, 6h replicated
    first = 6 * block + 50257 * H / 8 + 2048 * H  # 96/16 blocks, vocab split, positions not
    assert m.params == pytest.approx(2 * first)  # the first stage is the worst
    assert m.optimizer == pytest.approx(12 * first)
    acts = 16 * 6 * 34 * SBH / 8  # pp micro-batches of 6 layers, 34sbh/t each: 10.27 GB
    assert m.activations == pytest.approx(acts)
    assert m.buffers == BUCKETS
    assert m.total == pytest.approx(16 * first + acts + BUCKETS)  # 34.8 GB
    assert m.fits(gpu("h100")) and m.reason(gpu("h100")) == ""
    # tensor parallelism alone, scores kept (no FlashAttention): sbh(10 + 24/8 + 5 x 96 x
    # 2048/(12288 x 8)) = 23sbh a layer; with FlashAttention the 5as/h term goes: 13sbh
    bare = memory_per_gpu(w, ParallelLayout(tp=8, pp=16, flash=False))
    assert bare.activations == pytest.approx(16 * 6 * 23 * SBH)  # 55.6 GB
    flash = memory_per_gpu(w, ParallelLayout(tp=8, pp=16))
    assert flash.activations == pytest.approx(16 * 6 * 13 * SBH)
    # context parallelism over 4: each GPU keeps a quarter of every sequence
    cp = memory_per_gpu(w, ParallelLayout(tp=8, pp=16, cp=4, flash=False, recompute="selective"))
    assert cp.activations == pytest.approx(16 * 6 * 13 * SBH / 4)
    # 79.0 GB with the scores: within NVML's 85.5 GB, not with a 10% reserve (77.0 GB)
    assert bare.total == pytest.approx(16 * first + 16 * 6 * 23 * SBH + BUCKETS)
    assert bare.fits(gpu("h100")) and not bare.fits(gpu("h100"), 0.1)


@pytest.mark.parametrize(
    "t, sp, recompute, per_sbh",  # Korthikanti Table 2 at s = 2048, h = 12288, a = 96: 5as/h = 80
    [
        (1, False, 0, 34 + 80),  # no parallelism
        (8, False, 0, 10 + 24 / 8 + 80 / 8),  # tensor parallel
        (8, True, 0, (34 + 80) / 8),  # tensor + sequence parallel
        (8, False, 1, 10 + 24 / 8),  # tensor parallel + selective
        (8, True, 1, 34 / 8),  # tensor + sequence parallel + selective
        (8, False, 2, 2),  # full recompute: the layer input
        (8, True, 2, 2 / 8),  # full recompute, input sharded by sequence parallelism
    ],
)
def test_korthikanti_table_2(t, sp, recompute, per_sbh):
    got = activation_bytes_per_layer(2048, 1, H, 96, t, sp, recompute)
    assert got == pytest.approx(per_sbh * SBH)


def test_single_stage_activations_add_the_output_layer():
    # pp = 1: 96 layers of 23sbh, plus 4sbh/t(1 + v/h) for norm, logits and cross-entropy
    w = build_workload("gpt3-175b")
    m = memory_per_gpu(w, ParallelLayout(tp=8, micro_batch=2, flash=False))
    per_layer = 23 * 2 * SBH
    assert m.activations == pytest.approx(96 * per_layer + 4 * 2 * SBH / 8 * (1 + 50257 / H))


def test_in_flight_counts():
    assert in_flight(0, 8) == 8  # 1F1B: the first stage holds pp micro-batches
    assert in_flight(5, 8) == 3  # rank r holds pp - r
    assert in_flight(0, 8, micro_batches=4) == 4  # no more than there are
    # interleaved, pp = 4, v = 2: pp(1 + (pp - 1)/(pp v)) = 4 x (1 + 3/8) = 5.5 = (2 x 3 + 4 + 1)/2
    assert in_flight(0, 4, 2) == 5.5
    assert in_flight(3, 4, 2) == 2.5  # last rank: ((v - 1)pp + 1)/v
    assert in_flight(0, 4, 2, micro_batches=2) == 2  # 4 chunk passes of 2: at most m v / v
    assert in_flight(2, 4, micro_batches=16, schedule="gpipe") == 16  # GPipe: all of them
    assert in_flight(0, 1, micro_batches=16, schedule="gpipe") == 1  # pp = 1: accumulation
    with pytest.raises(ValueError, match="micro_batches"):
        in_flight(0, 4, schedule="gpipe")


def test_interleaving_grows_first_stage_activations():
    w = build_workload("gpt3-175b")
    base = dict(tp=8, pp=16, recompute="selective", sequence_parallel=True)
    plain = memory_per_gpu(w, ParallelLayout(**base)).activations
    inter = memory_per_gpu(w, ParallelLayout(**base, interleave=3)).activations
    assert inter / plain == pytest.approx((16 + 15 / 3) / 16)  # 96/(16 x 3) = 2 layers a chunk


def test_last_stage_when_worse():
    # GPipe with 32 micro-batches: every stage holds all 32; the last adds the output layer
    w = build_workload("gpt3-175b")
    layout = ParallelLayout(tp=8, pp=16, recompute="full", micro_batches=32)
    m = memory_per_gpu(w, layout, schedule="gpipe")
    out = 32 * 4 * SBH / 8 * (1 + 50257 / H)
    assert m.activations == pytest.approx(32 * 6 * 2 * SBH + out)
    last = 6 * ((12 * H * H + 7 * H) / 8 + 6 * H) + 2 * H + 50257 * H / 8  # tied table copy
    assert m.params == pytest.approx(2 * last)


def test_zero3_buffers_gather_the_largest_layer():
    w = build_workload("gpt3-175b")
    m = memory_per_gpu(w, ParallelLayout(dp=64, zero=3))
    # two gathered copies (2 bytes) and a full gradient (2 bytes) of one block, 12h^2 + 13h
    assert m.buffers == 6 * (12 * H * H + 13 * H)
    # the workspace outside the tensors (step.workspace) is added as given
    spare = memory_per_gpu(w, ParallelLayout(dp=64, zero=3, workspace=5e8))
    assert spare.buffers - m.buffers == spare.workspace == 5e8


def test_resnet_activation_rule():
    w = build_workload("resnet50")
    layers = w.layers
    # conv outputs: positions (FLOPs / 2 params) x channels (the next batch norm's size)
    outputs = sum(
        layer.forward_flops / (2 * layer.params) * layers[i + 1].tensors[0]
        for i, layer in enumerate(layers[:-1])
        if layer.forward_flops
    )
    assert outputs == 11_113_984
    m = memory_per_gpu(w, ParallelLayout(dp=8, micro_batch=32))
    assert m.activations == pytest.approx(32 * 4 * outputs)  # 1.42 GB
    assert m.params + m.grads + m.optimizer == 16 * 25_557_032
    assert ACTIVATION_BYTES_PER_FLOP * w.forward_flops == pytest.approx(4 * outputs)


def test_custom_transformer_takes_its_heads_from_the_spec():
    spec = ModelSpec(name="mine", layers=4, hidden=512, heads=8, vocab=1000, seq_len=128)
    w = build_workload(spec)
    assert w.heads == 8
    m = memory_per_gpu(w, ParallelLayout(flash=False))
    sbh = 128 * 512
    assert m.activations == pytest.approx(
        4 * sbh * (34 + 5 * 8 * 128 / 512) + 4 * sbh * (1 + 1000 / 512)
    )


def test_bad_layout():
    w = build_workload("gpt2-xl")
    with pytest.raises(ValueError, match="recompute"):
        ParallelLayout(recompute="some")
    with pytest.raises(ValueError, match="zero"):
        memory_per_gpu(w, ParallelLayout(zero=4))
    with pytest.raises(ValueError, match="tp"):
        memory_per_gpu(w, ParallelLayout(tp=0))


@pytest.mark.parametrize(
    "name", ["gpt3-175b", "llama2-70b", "bert-large", "resnet50", "mixtral-8x7b"]
)
def test_batch_equals_scalar(name):
    w = build_workload(name)
    rng = np.random.default_rng(0)
    n = 64
    cols = dict(
        dp=rng.choice([1, 2, 8, 64], n),
        tp=rng.choice([1, 2, 4, 8], n),
        pp=rng.choice([1, 2, 4, 8], n),
        micro_batch=rng.choice([1, 2, 4], n),
        zero=rng.integers(0, 4, n),
        recompute=rng.integers(0, 3, n),
        sequence_parallel=rng.integers(0, 2, n).astype(bool),
        interleave=rng.choice([1, 2], n),
    )
    cols["ep"] = np.minimum(rng.choice([1, 2, 4, 8], n), cols["dp"])  # divides dp
    m = rng.choice([4, 16, 64], n)
    batch = memory_per_gpu_batch(w, **cols, micro_batches=m, grad_bytes=4)
    for i in range(n):
        layout = ParallelLayout(
            dp=int(cols["dp"][i]),
            tp=int(cols["tp"][i]),
            pp=int(cols["pp"][i]),
            micro_batch=int(cols["micro_batch"][i]),
            zero=int(cols["zero"][i]),
            recompute=RECOMPUTE[cols["recompute"][i]],
            sequence_parallel=bool(cols["sequence_parallel"][i]),
            interleave=int(cols["interleave"][i]),
            ep=int(cols["ep"][i]),
            micro_batches=int(m[i]),
            grad_bytes=4,
        )
        assert batch[i] == pytest.approx(memory_per_gpu(w, layout).total, rel=1e-12)


def test_usable_bytes():
    # NVML's 81,559 MiB (catalog.HBM_NVML), less no reserve unless the user sets one
    assert usable_bytes(gpu("h100")) == 81_559 * 2**20
    assert usable_bytes(gpu("h100"), 0.1) == pytest.approx(0.9 * 81_559 * 2**20)


def test_expert_parameters_divide_over_ep():
    w = build_workload("mixtral-8x7b")
    one = memory_per_gpu(w, ParallelLayout(dp=8, tp=2))
    eight = memory_per_gpu(w, ParallelLayout(dp=8, tp=2, ep=8))
    # 32 blocks of 8 experts, split over tp = 2, then over ep = 8: 2-byte weights
    experts = 32 * w.expert_params / 2
    assert one.params - eight.params == pytest.approx(2 * experts * (1 - 1 / 8))
    assert one.activations == eight.activations
    # ZeRO-1 shards expert optimizer states over the dp / ep = 1 replicas: not at all
    z1 = memory_per_gpu(w, ParallelLayout(dp=8, tp=2, ep=8, zero=1))
    assert z1.optimizer == pytest.approx(
        12 * ((one.params / 2 - experts) / 8 + experts / 8), rel=1e-12
    )
    with pytest.raises(ValueError, match="ep"):
        memory_per_gpu(w, ParallelLayout(dp=4, ep=8))


def test_activation_widths_follow_the_architecture():
    from commsim.step.activations import ActivationWidths
    from commsim.workload.presets import build_workload

    def widths(name):
        w = ActivationWidths.of(build_workload(name).arch)
        return (w.replicated, w.split, w.scores)

    # GPT (4h MLP, MHA, dropout): Korthikanti's 10 + 24/t and 5as/h
    assert widths("gpt3-175b") == pytest.approx((10.0, 24.0, 5.0))
    # Llama 3 8B: no dropout; Q 4096, K and V 1024 (GQA), output 4096; SwiGLU 14336 kept
    # as gate, up and product: (2 (4096 + 1024 + 1024 + 4096) + 6 x 14336) / 4096 = 26
    assert widths("llama3-8b") == pytest.approx((8.0, 26.0, 2.0))
    # Mixtral: each of top-2 x 1.25 routed copies keeps the expert's inside and its input
    moe = (2 * (4096 + 1024 + 1024 + 4096) + 2.5 * 6 * 14336 + 1.5 * 2 * 4096) / 4096
    assert widths("mixtral-8x7b") == pytest.approx((8.0, moe, 2.0))


def test_a_hf_config_with_dropout_keeps_its_masks(tmp_path):
    import json

    from commsim.workload.hf import read_config

    gpt2 = read_config("tests/data/hf/gpt2-xl/config.json")
    llama = read_config("tests/data/hf/meta-llama-3-8b/config.json")
    assert gpt2.dropout is True and llama.dropout is False
    bad = tmp_path / "config.json"
    bad.write_text(
        json.dumps(
            json.loads(Path("tests/data/hf/meta-llama-3-8b/config.json").read_text())
            | {"attention_dropout": 2}
        )
    )
    with pytest.raises(SpecError, match="attention_dropout: expected a probability"):
        read_config(bad)


def test_a_near_miss_is_told_apart_from_the_room():
    """A need just over the room gets the decimals that show it is over: never 77.0 of 77.0."""
    h100 = gpu("h100")
    room = h100.hbm_bytes * 0.9
    m = MemoryBreakdown(params=room + 3e6, grads=0.0, optimizer=0.0, activations=0.0, buffers=0.0)
    assert "needs 76.972 GB of 76.969 GB usable" in m.reason(h100, 0.1)


def test_fsdp_keeps_fp32_shards_that_are_the_master():
    """ZeRO-3 as DeepSpeed keeps it: 2 (bf16 weights) + 4 (fp32 grads) + 12 (master, m, v);
    as PyTorch FSDP keeps it: 4 (fp32 weights, the master) + 4 (fp32 grads) + 8 (m, v)."""
    w = one_layer(1e9)
    zero = memory_per_gpu(w, ParallelLayout(dp=8, zero=3, grad_bytes=4))
    fsdp = memory_per_gpu(w, ParallelLayout(dp=8, zero=3, grad_bytes=4, fsdp_states=True))
    assert zero.params + zero.grads + zero.optimizer == pytest.approx(18e9 / 8)
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == pytest.approx((4e9 / 8, 4e9 / 8, 8e9 / 8))
    # below ZeRO-3 the flag changes nothing (and a strategy refuses it there)
    one = memory_per_gpu(w, ParallelLayout(dp=8, zero=1, grad_bytes=4, fsdp_states=True))
    assert one == memory_per_gpu(w, ParallelLayout(dp=8, zero=1, grad_bytes=4))


def test_fsdp_flag_states_and_refusal():
    from commsim.cli.options import setup_from_flags
    from commsim.scenario import load_scenario, resolve
    from commsim.specs import SpecError

    setup = setup_from_flags(None, fsdp=True, model="llama2-7b", gpus=8, global_batch=8)
    assert (setup.scenario.strategy.zero, setup.scenario.strategy.states) == (3, "fsdp")
    sc, src = load_scenario(None, {"model": "llama2-7b", "zero": 1, "states": "fsdp", "gpus": 8})
    with pytest.raises(SpecError, match="strategy.states: fsdp describes ZeRO-3"):
        resolve(sc, src)


def test_search_and_predict_agree_on_fsdp_states():
    from commsim.planner.search import enumerate_layouts, search
    from commsim.scenario import load_scenario, resolve
    from commsim.step.predict import predict, step_model

    sc, src = load_scenario(None, {"model": "llama2-7b", "gpus": 16, "zero": 3, "states": "fsdp"})
    setup = resolve(sc, src)
    layouts = enumerate_layouts(setup, {"zero": 3})
    found = search(step_model(setup), layouts)
    for k, i in list(enumerate(found.fitting))[:: max(1, len(found.fitting) // 15)]:
        strategy = layouts.strategy(int(i), setup.scenario.strategy)
        assert strategy.states == "fsdp"
        variant = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        one = type(setup)(variant, setup.source, setup.cluster, setup.gpu, setup.workload)
        got = predict(one, strategy)
        assert got.memory.total == pytest.approx(float(found.memory[i]), rel=1e-12)
        assert got.step_time_s == pytest.approx(float(found.breakdown.step[k]), rel=1e-9)


def test_the_batch_arguments_are_the_layouts_fields():
    """memory_per_gpu hands memory_per_gpu_batch's formulas its layout's fields by name: the
    batch function takes exactly those (and the workload, the schedule)."""
    import inspect
    from dataclasses import fields

    taken = set(inspect.signature(memory_per_gpu_batch).parameters) - {"workload", "schedule"}
    assert taken == {f.name for f in fields(ParallelLayout)}
