"""The element-wise inventory of a block (step.compute._Block._elementwise) against a
hand-written count of its HBM traffic, and with a feature removed against the difference it
must make."""

from __future__ import annotations

import pytest

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.compute import stage_times
from commsim.step.gemm import Rates, gemm_seconds
from commsim.step.kernel_bytes import ACT, FUSED_WGRAD, GRAD_ADD, MASK
from commsim.step.layouts import GRAD_ACCUMULATIONS, Layouts
from commsim.workload.presets import build_workload

GPT = ModelSpec(name="toy", layers=4, hidden=512, heads=8, vocab=1000, seq_len=256)
A100 = catalog.GPUS["a100-80gb"]
HBM = 1.70e12  # its BabelStream Triad (catalog: hbm_efficiency), what the roofline runs at
EPILOGUE = (FUSED_WGRAD - ACT) / HBM  # seconds an element a fused wgrad GEMM writes more


def _block_fwd(model: ModelSpec, tp=2, sp=True):
    L = Layouts.build(tp=tp, micro_batch=1, sequence_parallel=sp)
    return float(stage_times(build_workload(model), A100, L).block_fwd[0])


@pytest.mark.parametrize("sp", [True, False])
def test_dropout_masks_by_hand(sp):
    """GPT-style blocks train with dropout (Megatron --hidden-dropout 0.1): each of the two
    fused bias-dropout-adds writes a 1-byte mask of h per token it holds; 256 tokens over
    tp = 2 with SP (128 held), all 256 without: 2 x 512 x 1 x held bytes more."""
    held = 128 if sp else 256
    extra = 2 * 512 * MASK * held / HBM
    with_dropout = _block_fwd(GPT, sp=sp)
    without = _block_fwd(GPT.model_copy(update={"dropout": False}), sp=sp)
    assert with_dropout - without == pytest.approx(extra, rel=1e-9)


def test_the_masks_are_a_fixed_share_of_the_held_work():
    """Independently of the split: the mask bytes over the rest of the held work (norms
    2 x 2 h and residual adds 2 x 3 h of ACT bytes) is 2 MASK / (10 ACT), whatever tp or
    SP; the rest of the block (GEMMs, attention, the MLP activation) does not see it."""
    share = 2 * MASK / (10 * ACT)
    for tp, sp in ((2, True), (4, True), (4, False)):
        held_with = _block_fwd(GPT, tp, sp) - _block_fwd(GPT, tp, not sp)
        nodrop = GPT.model_copy(update={"dropout": False})
        held_without = _block_fwd(nodrop, tp, sp) - _block_fwd(nodrop, tp, not sp)
        assert held_with / held_without == pytest.approx(1 + share, rel=1e-9)


def _times(fused: bool, tp=2, micro_batches=4, model=GPT, unfused="autograd"):
    how = GRAD_ACCUMULATIONS.index("fused" if fused else unfused)
    L = Layouts.build(tp=tp, micro_batch=1, micro_batches=micro_batches, grad_accumulation=how)
    return stage_times(build_workload(model), A100, L)


def test_unfused_gradient_accumulation_by_hand():
    """A GPT block has 12 h^2 + 13 h parameters (Narayanan et al. 2021's count); h = 512,
    tp = 2, 4 micro-batches a step: autograd adds 3 of 4 micro-batches' gradients into
    .grad, 3 x 2 bytes a parameter of the GPU's half: 3/4 x 6 x (12 h^2 + 13 h) / 2 bytes
    more per micro-batch backward; nothing forward. The weight-gradient GEMMs write their
    12 h^2 / 2 weights' bf16 gradients (2 bytes) where the fused ones read and write the fp32
    main gradient (8): 6 bytes an element less (EPILOGUE)."""
    h = 512
    block = 0.75 * GRAD_ADD * (12 * h * h + 13 * h) / 2 / HBM - EPILOGUE * 12 * h * h / 2
    fused, unfused = _times(True), _times(False)
    assert float(unfused.block_bwd[0] - fused.block_bwd[0]) == pytest.approx(block, rel=1e-9)
    assert float(unfused.block_fwd[0]) == float(fused.block_fwd[0])
    one = _times(False, micro_batches=1)  # one micro-batch a step: its gradients are kept
    delta = float(one.block_bwd[0] - fused.block_bwd[0])
    assert delta == pytest.approx(-EPILOGUE * 12 * h * h / 2, rel=1e-9)


def test_fp32_accumulation_by_hand():
    """Into an fp32 buffer (Megatron's main_grad, DeepSpeed's bf16 optimizer) every
    micro-batch adds: read the 2-byte gradient, read and write the 4-byte sum, 10 bytes a
    parameter, whatever the micro-batch count."""
    h = 512
    block = 10 * (12 * h * h + 13 * h) / 2 / HBM - EPILOGUE * 12 * h * h / 2
    for m in (1, 4):
        fused, fp32 = _times(True, micro_batches=m), _times(False, micro_batches=m, unfused="fp32")
        assert float(fp32.block_bwd[0] - fused.block_bwd[0]) == pytest.approx(block, rel=1e-9)


@pytest.mark.parametrize("tp,m", [(1, 2), (2, 4), (4, 16)])
def test_unfused_adds_over_a_step_move_every_parameter_m_minus_1_times(tp, m):
    """Independently of how the parameters split into blocks, embedding and head: over a
    step's m micro-batches the adds move GRAD_ADD bytes per parameter the GPU holds, m - 1
    times (all the model's parameters over tp, the workload's own count)."""
    w = build_workload(GPT)
    fused, unfused = _times(True, tp, m), _times(False, tp, m)
    diff = lambda f: float((getattr(unfused, f) - getattr(fused, f))[0])  # noqa: E731
    per_micro_batch = GPT.layers * diff("block_bwd") + diff("pre_bwd") + diff("post_bwd")
    expected = (m - 1) * GRAD_ADD * w.params / tp / HBM
    # less each weight-gradient GEMM's fp32 epilogue: the blocks' 12 h^2 and the head's h v
    h = GPT.hidden
    epilogue = EPILOGUE * (GPT.layers * 12 * h * h + h * GPT.vocab) / tp
    assert m * (per_micro_batch + epilogue) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "name,measured", [("a100-80gb", 1.70e12), ("h100", 2.97e12), ("h200", 4.15e12)]
)
def test_memory_bound_kernels_run_at_the_measured_stream_bandwidth(name, measured):
    """The roofline's HBM rate is BabelStream's Triad on the GPU (Azure's ND v4/v5 results),
    not the datasheet's; where none is measured, the datasheet's."""
    assert Rates.of(catalog.GPUS[name]).memory == pytest.approx(measured, rel=1e-12)
    b200 = catalog.GPUS["b200"]
    assert Rates.of(b200).memory == b200.hbm_bandwidth


def test_only_the_memory_bound_part_scales_with_the_hbm_efficiency():
    """t(e) = (GEMMs, attention) + bytes / (bw e): halving e adds what the memory-bound part
    took at e, so t(1/4) - t(1/2) = 2 (t(1/2) - t(1))."""
    w = build_workload(GPT)
    L = Layouts.build(tp=2, micro_batch=2)

    def fwd(e):
        gpu = A100.model_copy(update={"hbm_efficiency": e})
        return float(stage_times(w, gpu, L).block_fwd[0])

    assert fwd(0.25) - fwd(0.5) == pytest.approx(2 * (fwd(0.5) - fwd(1.0)), rel=1e-9)
    assert fwd(0.5) > fwd(1.0)


def test_the_cross_entropy_passes_by_hand():
    """Megatron's vocab-parallel cross-entropy over b s = 256 tokens x 1000 / 2 logits: 38
    bytes a logit forward (cast 6, max 4, subtract 8, exp 8, sum 4, divide 8), 14 backward
    (multiply 8, cast back 6); the rest of the last layers (norm, head) as before."""
    w = build_workload(GPT)
    L = Layouts.build(tp=2, micro_batch=1)
    t = stage_times(w, A100, L)
    logits = 256 * 1000 / 2
    rate, write = Rates.of(A100).gemm, ACT / HBM
    head = gemm_seconds(256, 500, 512, rate, 108, write=write)
    norm = 2 * 128 * 512 * ACT / HBM  # on the 128 tokens a rank holds under SP
    assert float(t.post_fwd[0]) == pytest.approx(norm + head + 38 * logits / HBM, rel=1e-9)
    norm_b = 5 * 128 * 512 * ACT / HBM
    # the head's data gradient (256 x 512 out) and its weight gradient (512 x 500 out, into
    # the fp32 main gradient: 8 bytes an element, grad_accumulation "fused")
    dgrad = gemm_seconds(256, 512, 500, rate, 108, write=write)
    wgrad = gemm_seconds(512, 500, 256, rate, 108, write=8 / HBM)
    expect = norm_b + dgrad + wgrad + 14 * logits / HBM
    assert float(t.post_bwd[0]) == pytest.approx(expect, rel=1e-9)


def test_fp8_cast_writes_the_copy_and_its_transpose():
    """An FP8 block's forward minus a BF16 one's, on an H100 (toy GPT, tp 2, 256 tokens):
    its four GEMMs at the FP8 rate instead of BF16's, plus each GEMM input cast by TE's
    cast_transpose, read 2 bytes, write 1 + 1 (FP8_CAST = 4): inputs of 512 (QKV, up), 256
    (the output projection's q slice) and 1,024 (down) columns a token; backward, each
    GEMM's output gradient cast the same way."""
    h100 = catalog.GPUS["h100"]
    rates = Rates.of(h100)
    shapes = [(256, 768, 512), (256, 512, 256), (256, 1024, 512), (256, 512, 1024)]

    def gemms(rate, way="fwd"):
        # forward X W (m x n out); backward dY W^T (m x k) and X^T dY (k x n, into the fp32
        # main gradient: 8 bytes an element); each output through HBM
        act, fp32, sms = 2 / rates.memory, 8 / rates.memory, rates.sms
        if way == "fwd":
            return sum(float(gemm_seconds(m, n, k, rate, sms, write=act)) for m, n, k in shapes)
        return sum(
            float(gemm_seconds(m, k, n, rate, sms, write=act))
            + float(gemm_seconds(k, n, m, rate, sms, write=fp32))
            for m, n, k in shapes
        )

    cast = (2 + 1 + 1) * 256 * (512 + 256 + 512 + 1024) / h100.stream_bandwidth
    w = build_workload(GPT)
    t = {p: stage_times(w, h100, Layouts.build(tp=2, micro_batch=1, fp8=p)) for p in (True, False)}
    fwd = {p: float(t[p].block_fwd[0]) for p in t}
    assert fwd[True] - fwd[False] == pytest.approx(gemms(rates.fp8) - gemms(rates.gemm) + cast)
    # backward: dgrad and wgrad GEMMs and each GEMM's output gradient cast with its
    # transpose: 768, 512, 1,024 and 512 columns a token
    grad_cast = (2 + 1 + 1) * 256 * (768 + 512 + 1024 + 512) / h100.stream_bandwidth
    bwd = float(t[True].block_bwd[0] - t[False].block_bwd[0])
    assert bwd == pytest.approx(gemms(rates.fp8, "bwd") - gemms(rates.gemm, "bwd") + grad_cast)


@pytest.mark.parametrize("sp", [True, False])
def test_dropout_backward_reads_the_mask(sp):
    """Backward, each dropout's gradient is dy x mask x scale (the autograd of Megatron's
    bias_dropout_add): read dy (2 bytes) and the mask (1), write dx (2), h per held token,
    twice a block: 2 x 512 x 5 x held bytes more than a block without dropout."""
    held = 128 if sp else 256
    L = Layouts.build(tp=2, micro_batch=1, sequence_parallel=sp)

    def bwd(model):
        return float(stage_times(build_workload(model), A100, L).block_bwd[0])

    extra = 2 * 512 * (2 + 1 + 2) * held / HBM
    assert bwd(GPT) - bwd(GPT.model_copy(update={"dropout": False})) == pytest.approx(extra)


@pytest.mark.parametrize("sp", [True, False])
def test_a_one_pass_norm_backward_reads_dy_and_x_once(sp):
    """Transformer Engine's norm backward (one kernel: read dy and x, write dx: 3 values a
    row) against Apex's and PyTorch's two passes (5): 2 values of h fewer a held token for
    each of a block's two norms and for the final norm, nothing else changes."""
    held = 128 if sp else 256
    w = build_workload(GPT)

    def times(norm_backward):
        L = Layouts.build(tp=2, micro_batch=1, sequence_parallel=sp, norm_backward=norm_backward)
        return stage_times(w, A100, L)

    two, one = times(0), times(1)
    fewer = held * 2 * 512 * ACT / HBM  # (5 - 3) h values of ACT bytes a norm
    assert float(two.block_bwd[0] - one.block_bwd[0]) == pytest.approx(2 * fewer)
    assert float(two.post_bwd[0] - one.post_bwd[0]) == pytest.approx(fewer)
    assert float(two.block_fwd[0]) == float(one.block_fwd[0])
