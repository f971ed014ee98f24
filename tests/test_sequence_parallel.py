"""Sequence parallelism as a strategy field: the element-wise work of each tensor-parallel rank
(norms, residual adds, the embedding's output) on 1 / tp of the sequence with it, on all of it
without (Korthikanti et al. 2022); the activation memory as step.memory counts it; predict and
the search pricing the field alike; the layouts Megatron refuses without it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import check_layout, load_scenario, resolve
from commsim.specs import ModelSpec, SpecError
from commsim.step.compute import stage_times
from commsim.step.kernel_bytes import ACT, MASK
from commsim.step.layouts import Layouts
from commsim.step.predict import predict, step_model
from commsim.workload.presets import build_workload

# GPT style: learned positions, LayerNorm, a 4h MLP with GeLU
TOY = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)
A100 = catalog.GPUS["a100-80gb"]
HBM = 1.70e12  # its BabelStream Triad (catalog: hbm_efficiency), what the roofline runs at


def _times(tp: int, sp: bool, micro_batch: int = 2):
    w = build_workload(TOY)
    L = Layouts.build(tp=tp, micro_batch=micro_batch, sequence_parallel=sp, flash=True)
    return stage_times(w, A100, L)


@pytest.mark.parametrize("tp", [2, 4])
def test_without_sp_each_rank_runs_the_norms_and_residuals_on_the_whole_sequence(tp):
    """By hand: b s = 2 x 256 = 512 tokens; a block's norms (read + write h, twice) and
    residual adds (read 2 h + write h, twice) move 10 h bf16 values per token and their
    dropouts 2 h 1-byte masks, so without SP a tp rank moves 512 (1 - 1 / tp) x (10 x 512 x 2
    + 2 x 512) bytes more forward; backward, each norm 5 h values (dx and the weight's
    gradient each read dy and x), each residual fork's gradient sum 3 h, each dropout's
    backward reads dy and the mask and writes dx (2 + 1 + 2 bytes of h);
    the final norm (read + write h) and the embedding's output (write + read h) 4 h values
    per token more forward; nothing else changes."""
    on, off = _times(tp, True), _times(tp, False)
    extra_tokens = 512 * (1 - 1 / tp)
    block = extra_tokens * (10 * 512 * ACT + 2 * 512 * MASK) / HBM
    block_b = extra_tokens * (2 * (5 + 3) * 512 * ACT + 2 * 512 * (2 * ACT + MASK)) / HBM
    end = extra_tokens * 2 * 512 * ACT / HBM
    assert float(off.block_fwd[0] - on.block_fwd[0]) == pytest.approx(block, rel=1e-12)
    assert float(off.block_bwd[0] - on.block_bwd[0]) == pytest.approx(block_b, rel=1e-12)
    norm_b = extra_tokens * 5 * 512 * ACT / HBM
    assert float(off.post_bwd[0] - on.post_bwd[0]) == pytest.approx(norm_b, rel=1e-12)
    assert float(off.op_replay[0] - on.op_replay[0]) == pytest.approx(block, rel=1e-12)
    assert float(off.pre_fwd[0] - on.pre_fwd[0]) == pytest.approx(end, rel=1e-12)
    assert float(off.post_fwd[0] - on.post_fwd[0]) == pytest.approx(end, rel=1e-12)
    assert float(off.core_fwd[0]) == float(on.core_fwd[0])


def test_without_sp_the_norm_work_does_not_shrink_with_tp():
    """An independent reading: without SP the element-wise work a rank does on the held
    tokens is the single-GPU one at any tp, so (off - on) at tp equals what tp = 1 moves
    beyond tp's slice: on(1) - on(tp) less the parts that shrink either way (GEMMs, the
    MLP activation), which are the same with SP on and off."""
    one = _times(1, True)
    for tp in (2, 4, 8):
        on, off = _times(tp, True), _times(tp, False)
        shrinking = (one.block_fwd - on.block_fwd) - (one.block_fwd - off.block_fwd)
        assert float(shrinking[0]) == pytest.approx(float((off.block_fwd - on.block_fwd)[0]))
        # and at tp = 1 the flag changes nothing
    assert float(_times(1, False).block_fwd[0]) == float(one.block_fwd[0])


def test_the_memory_model_reads_the_field():
    """step.memory's sequence_parallel flag (the activations kept split over tp) comes from
    the strategy, alike in predict (memory_per_gpu) and in the search (memory_per_gpu_batch):
    without SP a tp = 4 layout keeps more."""
    totals = {}
    for sp in (True, False):
        setup = _setup(tp=4, recompute="selective", sequence_parallel=sp)
        strategy = setup.scenario.strategy
        layouts = Layouts.of([strategy], 1, setup.dp, setup.micro_batches)
        searched = float(step_model(setup).memory(layouts)[0])
        totals[sp] = predict(setup).memory.total
        assert totals[sp] == pytest.approx(searched, rel=1e-12)
    assert totals[False] > totals[True]


def _setup(model=TOY, gpus=32, **strategy):
    fields = dict(model=model, cluster="dgx-a100-ib", gpus=gpus, global_batch=64, seq_len=256)
    sc, src = load_scenario(None, fields | strategy)  # strategy fields go to the strategy
    sc = sc.model_copy(update={"compute_efficiency": None})  # the roofline, not one rate
    return resolve(sc, src, check=False)


def test_predict_and_the_search_agree_without_sequence_parallelism():
    """... and with the stack's other fields: autograd's gradient accumulation (a 2021
    stack's), a one-pass norm backward (Transformer Engine's), each searched as given."""
    setup = _setup(sequence_parallel=False, grad_accumulation="autograd", norm_backward="one-pass")
    layouts = enumerate_layouts(setup)
    assert not layouts.sequence_parallel.any()
    assert (layouts.grad_accumulation == 1).all()  # autograd
    assert (layouts.norm_backward == 1).all()  # one-pass
    assert not layouts.tp_overlap.any()  # Megatron overlaps TP comm only under SP
    found = search(step_model(setup), layouts)
    rank = {int(i): k for k, i in enumerate(found.fitting)}
    tp_rows = [i for i in found.fitting if layouts.tp[i] > 1]
    picks = np.random.default_rng(3).choice(tp_rows, size=15, replace=False)
    for i in picks:
        strategy = layouts.strategy(int(i), setup.scenario.strategy)
        assert (strategy.sequence_parallel, strategy.grad_accumulation) == (False, "autograd")
        assert strategy.norm_backward == "one-pass"
        sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
        got = predict(variant, strategy)
        assert got.step_time_s == pytest.approx(float(found.breakdown.step[rank[int(i)]]), 1e-9)


def test_sp_off_is_slower_and_takes_more_memory_than_on():
    for sp in (True, False):
        setup = _setup(tp=4, sequence_parallel=sp, recompute="selective")
        p = predict(setup)
        if sp:
            step_on, mem_on = p.step_time_s, p.memory.total
        else:
            assert p.step_time_s > step_on and p.memory.total > mem_on


def test_what_megatron_refuses_without_sequence_parallelism():
    with pytest.raises(SpecError, match="tp_overlap needs sequence parallelism"):
        setup = _setup(tp=4, sequence_parallel=False, tp_overlap=True)
        check_layout(setup, setup.scenario.strategy)
    moe = TOY.model_copy(update={"name": "toy-moe", "experts": 4, "top_k": 2})
    with pytest.raises(SpecError, match="MoE with tp > 1 needs sequence parallelism"):
        setup = _setup(moe, tp=2, sequence_parallel=False)
        check_layout(setup, setup.scenario.strategy)
    setup = _setup(moe, sequence_parallel=False)
    layouts = enumerate_layouts(setup)
    assert len(layouts) and (layouts.tp == 1).all()  # the search keeps what Megatron runs


def test_predict_and_plan_take_the_flag(tmp_path):
    scenario = tmp_path / "roofline.yaml"  # no compute_efficiency: the roofline prices it
    scenario.write_text(
        "model: llama2-7b\nseq_len: 1024\ncluster: dgx-a100-ib\ngpus: 16\nglobal_batch: 32\n"
    )
    args = [str(scenario), "--tp", "4"]
    run = CliRunner().invoke
    out = run(app, ["predict", *args, "--no-sequence-parallel", "--json"])
    assert out.exit_code == 0, out.output
    off = json.loads(out.output)
    assert off["strategy"]["sequence_parallel"] is False
    on = json.loads(run(app, ["predict", *args, "--json"]).output)
    assert on["strategy"]["sequence_parallel"] is True
    assert off["compute_s"] > on["compute_s"]
    out = run(app, ["plan", *args, "--no-sequence-parallel", "--top", "3", "--json"])
    assert out.exit_code == 0, out.output
    assert all(
        c["strategy"]["sequence_parallel"] is False for c in json.loads(out.output)["candidates"]
    )
    moe = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib", "--gpus", "16"]
    moe += ["--global-batch", "32", "--tp", "2", "--no-sequence-parallel"]
    out = run(app, ["plan", *moe])  # a pinned tp > 1 that no MoE layout takes without SP
    assert out.exit_code == 2
    assert "--no-sequence-parallel: MoE with tp > 1 needs sequence parallelism" in out.output
    out = run(app, ["predict", *args, "--no-sequence-parallel", "--tp-overlap"])
    assert out.exit_code == 2
    assert "--no-sequence-parallel: tp_overlap needs sequence parallelism" in out.output
    assert "Traceback" not in out.output
