"""Compute per kernel class (traces.kernels): classes read by hand from a synthetic trace,
the roofline's split by parts against a closed form and the GEMMs' output writes against a
count by hand, one GEMM's efficiency fitted by hand, efficiencies fitted back from a trace
made by the roofline at known ones, the fitted GPU written and read back; bad input one
line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_traces_kineto import _write, _x, nccl_trace
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.cli.options import setup_from_flags
from commsim.step.gemm import gemm_seconds
from commsim.traces.kernels import KernelFit, fit_kernels, measured, roofline
from commsim.traces.kineto import read_kineto

runner = CliRunner()
LLAMA = dict(model="llama2-7b", cluster="dgx-a100-ib", gpus=8, global_batch=8, micro_batch=1)
LLAMA |= dict(seq_len=2048, tp=2)


def test_classes_by_hand(tmp_path):
    t = read_kineto(_write(tmp_path, nccl_trace()))
    got, steps = measured([t])
    # per step: sm80_gemm kernels of 400 and 350 us, adam_kernel 100 us (nccl_trace)
    assert steps == 2
    assert got == pytest.approx({"gemm": 750e-6, "attention": 0.0, "other": 100e-6}, abs=1e-12)


def test_the_roofline_by_class_against_a_closed_form(tmp_path):
    # a model without blocks runs every FLOP at the GEMM rate: 3 F b / (peak x efficiency)
    layer = {"name": "net", "params": 1000, "forward_flops": 1e9}
    path = tmp_path / "s.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "net",
                "model": {"name": "net", "kind": "custom", "custom_layers": [layer]},
                "cluster": "dgx-a100-ib",
                "gpus": 4,
                "global_batch": 32,
                "micro_batch": 8,
            }
        )
    )
    setup = setup_from_flags(str(path))
    gpu = catalog.gpu("a100-80gb")
    parts = roofline(setup, setup.scenario.strategy, 8)
    assert parts["math"] == pytest.approx(3 * 1e9 * 8 / (gpu.peak_flops * gpu.gemm_efficiency))
    for part in ("write", "attention", "other"):  # no GEMM shapes: nothing written
        assert parts[part] == pytest.approx(0.0, abs=1e-15)


def test_the_gemm_writes_against_a_count_by_hand():
    """Llama 2 7B, tp 2, 2048 tokens, pp 1, no recomputation: each block's four GEMMs
    (QKV 2048 x 6144 x 4096, O 2048 x 4096 x 2048, gate+up 2048 x 11008 x 4096, down
    2048 x 4096 x 5504) write their forward (m x n) and data-gradient (m x k) outputs in
    bf16 and their weight gradients (k x n) fused into the fp32 main gradient, read and
    written (8 B); the LM head (2048 x 16000 x 4096) likewise. At the streaming bandwidth."""
    setup = setup_from_flags(None, **LLAMA)
    parts = roofline(setup, setup.scenario.strategy, 1)
    fwd, dgrad = 2048 * (6144 + 4096 + 11008 + 4096), 2048 * (4096 + 2048 + 4096 + 5504)
    wgrad = 4096 * (6144 + 2048 + 11008 + 5504)
    head = 2 * (2048 * 16000 + 2048 * 4096) + 8 * 4096 * 16000
    written = 32 * (2 * (fwd + dgrad) + 8 * wgrad) + head
    assert parts["write"] == pytest.approx(written / setup.gpu.stream_bandwidth, rel=1e-12)


def test_one_gemm_fitted_by_hand():
    """A 4096^3 GEMM on an A100 (108 SMs): 16 x 32 = 512 tiles of 256 x 128 in 5 waves,
    so its math runs at 512 / 540 of the rate; 2 x 4096^3 FLOPs at 312 TFLOP/s x 0.75 x
    512 / 540 take 0.619466 ms, its bf16 output (32 MiB) at 1.7 TB/s 0.019738 ms. Traced at
    that (planted efficiency 0.75), the catalog's 0.9 fits 0.75 back; roofline / traced
    alone would read 0.9 x (0.516222 + 0.019738) / (0.619466 + 0.019738) = 0.7546."""
    gpu = catalog.gpu("a100-80gb").model_copy(update={"gemm_efficiency": 0.9})
    math = 2 * 4096**3 / (312e12 * 0.9 * 512 / 540)
    write = 4096 * 4096 * 2 / 1.7e12
    traced = 2 * 4096**3 / (312e12 * 0.75 * 512 / 540) + write
    assert traced == pytest.approx(0.619466e-3 + 0.019738e-3, rel=1e-6)
    # the same seconds as the roofline prices the GEMM (step.gemm)
    planted = gemm_seconds(4096, 4096, 4096, 312e12 * 0.75, 108, write=2 / 1.7e12)
    assert float(planted) == pytest.approx(traced, rel=1e-12)
    times = {"gemm": traced, "attention": 0.0, "other": 0.0}
    parts = {"math": math, "fp8": 0.0, "write": write, "attention": 0.0, "other": 0.0}
    fit = KernelFit(gpu, times, parts, False, 1, "hand.json")
    assert fit.fitted("gemm") == pytest.approx(0.75, rel=1e-12)
    assert 0.9 * (math + write) / traced == pytest.approx(0.7546, abs=1e-4)


def _trace(tmp_path, times, name="t.json"):
    """A one-rank GPU trace whose classes take `times` seconds."""
    ev = [_x("ProfilerStep#1", 0, 10**7, cat="user_annotation", tid=1)]
    ts = 10.0
    names = {
        "gemm": "sm90_xmma_gemm_bf16",
        "attention": "flash_fwd_kernel",
        "other": "vectorized_elementwise_kernel",
    }
    for cls, kernel in names.items():
        dur = times[cls] * 1e6
        ev.append(_x(kernel, ts, dur))
        ts += dur + 1.0
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 8}, "traceEvents": ev}
    return read_kineto(_write(tmp_path, doc, name))


def _made_with(tmp_path, setup, **planted):
    """A trace whose classes take what the roofline gives at the setup's GPU with the
    `planted` figures."""
    gpu = setup.gpu.model_copy(update=planted)
    p = roofline(dataclasses.replace(setup, gpu=gpu), setup.scenario.strategy, 1)
    gemm = p["math"] + p["fp8"] + p["write"]
    times = {"gemm": gemm, "attention": p["attention"], "other": p["other"]}
    return _trace(tmp_path, times)


def test_the_parts_add_up_to_the_roofline():
    setup = setup_from_flags(None, **LLAMA)
    parts = roofline(setup, setup.scenario.strategy, 1)
    assert parts.pop("fp8") == 0  # BF16: no FP8 math
    assert all(v > 0 for v in parts.values())
    # the parts add up to the roofline's compute (no one efficiency: the kernel rates)
    from commsim.step.model import StepModel
    from commsim.step.predict import strategy_layouts

    s = setup.scenario
    model = StepModel(setup.workload, setup.cluster, setup.gpu, 8, s.global_batch, None)
    c = model.compute(strategy_layouts(setup, [s.strategy]))
    assert sum(parts.values()) == pytest.approx(float(c.forward[0] + c.backward[0]), rel=1e-12)


@pytest.mark.parametrize("flags", [LLAMA, LLAMA | dict(cluster="dgx-h100-ib", seq_len=4096)])
def test_efficiencies_fitted_back_from_a_trace_made_with_them(tmp_path, flags):
    setup = setup_from_flags(None, **flags)
    gpu = setup.gpu
    planted = {"gemm_efficiency": 0.55, "attention_efficiency": 0.3}
    fit = fit_kernels(setup, [_made_with(tmp_path, setup, **planted)], 1)
    assert fit.fitted("gemm") == pytest.approx(0.55, rel=1e-9)
    assert fit.fitted("attention") == pytest.approx(0.3, rel=1e-9)
    assert fit.fitted("other") == pytest.approx(gpu.hbm_efficiency, rel=1e-9)
    # the GEMMs' writes take a share worth fitting: their math alone over the traced
    # GEMMs (the writes booked as element-wise work) reads low
    assert gpu.gemm_efficiency * fit.parts["math"] / fit.traced["gemm"] < 0.55 * 0.97
    # the fitted GPU's roofline gives the traced GEMM and attention seconds back
    again = roofline(dataclasses.replace(setup, gpu=fit.fitted_gpu()), setup.scenario.strategy, 1)
    assert again["math"] + again["fp8"] + again["write"] == pytest.approx(
        fit.traced["gemm"], rel=1e-9
    )
    assert again["attention"] == pytest.approx(fit.traced["attention"], rel=1e-9)
    # slower HBM: the element-wise share fitted back, the GEMMs' writes slower too
    slow = fit_kernels(setup, [_made_with(tmp_path, setup, hbm_efficiency=0.6)], 1)
    assert slow.fitted("other") == pytest.approx(0.6, rel=1e-9)
    assert slow.fitted("gemm") < gpu.gemm_efficiency


def test_fp8_efficiency_fitted_back_with_the_bf16_gemms_held(tmp_path):
    # under FP8 the LM head (and an MoE router) stay BF16: the GEMM class holds both, and the
    # FP8 efficiency is fitted to the FP8 math alone, the BF16 math at the catalog's figure
    setup = setup_from_flags(
        None, **LLAMA | dict(cluster="dgx-h100-ib", seq_len=4096, precision="fp8")
    )
    parts = roofline(setup, setup.scenario.strategy, 1)
    assert parts["fp8"] > 0 and parts["math"] > 0  # the LM head in BF16
    # by hand: the LM head's forward, data- and weight-gradient math at the BF16 rate, 4,096
    # tokens x 32,000 / tp 2 vocabulary x 4,096 hidden each, over the share of 132 SMs their
    # 256 x 128 output tiles keep busy: 2,000 tiles in 16 waves, 512 in 4, and the weight
    # gradient's 63 x 32 = 2,016 in 16 (16,000 rows in 63 tiles of 256)
    gpu = setup.gpu
    one = 2 * 4096 * 16000 * 4096 / (gpu.peak_flops * gpu.gemm_efficiency)
    busy = [2000 / 2112, 512 / 528, 16000 / 16128 * 2016 / 2112]
    assert parts["math"] == pytest.approx(sum(one / u for u in busy), rel=1e-12)
    fit = fit_kernels(setup, [_made_with(tmp_path, setup, fp8_gemm_efficiency=0.5)], 1)
    assert fit.fitted("gemm") == pytest.approx(0.5, rel=1e-9)
    assert fit.bf16_held("gemm") == parts["math"] and fit.bf16_held("attention") == 0
    again = roofline(dataclasses.replace(setup, gpu=fit.fitted_gpu()), setup.scenario.strategy, 1)
    assert again["math"] + again["fp8"] + again["write"] == pytest.approx(
        fit.traced["gemm"], rel=1e-9
    )
    # the command says what it held, in the table and the JSON
    t = _made_with(tmp_path, setup, fp8_gemm_efficiency=0.5)
    flags = ["--model", "llama2-7b", "--cluster", "dgx-h100-ib", "--micro-batch", "1"]
    flags += ["--seq-len", "4096", "--tp", "2", "--precision", "fp8"]
    res = runner.invoke(app, ["trace", "kernels", t.source, *flags, "--json"])
    assert res.exit_code == 0, res.output
    gemm = json.loads(res.output)["classes"][0]
    assert gemm["bf16_held_s"] == pytest.approx(parts["math"], rel=1e-12)
    assert gemm["fitted"] == pytest.approx(0.5, rel=1e-9)
    text = " ".join(runner.invoke(app, ["trace", "kernels", t.source, *flags]).output.split())
    assert "is BF16 math under FP8 (LM head, router), held at the catalog's" in text


def test_traced_gemms_faster_than_their_writes_are_refused(tmp_path):
    setup = setup_from_flags(None, **LLAMA)
    parts = roofline(setup, setup.scenario.strategy, 1)
    times = {"gemm": 0.9 * parts["write"], "attention": parts["attention"], "other": 1e-3}
    t = _trace(tmp_path, times, "fast.json")
    flags = ["--model", "llama2-7b", "--cluster", "dgx-a100-ib", "--micro-batch", "1"]
    res = runner.invoke(app, ["trace", "kernels", t.source, *flags, "--seq-len", "2048"] + [
        "--tp", "2", "--json"])  # fmt: skip
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and "fast.json: gemm_efficiency:" in line
    assert "writes of their outputs" in line and "inf" not in line


def test_the_fitted_gpu_is_written_and_read_back(tmp_path):
    setup = setup_from_flags(None, **LLAMA)
    gpu = catalog.gpu("a100-80gb")
    halves = dict(gemm_efficiency=gpu.gemm_efficiency / 2)
    t = _made_with(tmp_path, setup, **halves, attention_efficiency=gpu.attention_efficiency / 4)
    out = tmp_path / "gpu.yaml"
    flags = ["--model", "llama2-7b", "--cluster", "dgx-a100-ib", "--micro-batch", "1"]
    flags += ["--seq-len", "2048", "--tp", "2"]
    res = runner.invoke(
        app, ["trace", "kernels", t.source, *flags, "--gpu-out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [r["class"] for r in doc["classes"]] == ["gemm", "attention", "other"]
    back = catalog.gpu(str(out))
    assert back.gemm_efficiency == pytest.approx(gpu.gemm_efficiency / 2, rel=1e-6)
    assert back.attention_efficiency == pytest.approx(gpu.attention_efficiency / 4, rel=1e-6)
    assert (back.peak_flops, back.hbm_bandwidth) == (gpu.peak_flops, gpu.hbm_bandwidth)
    # faster than the GPU can: one line, exit 2, nothing written
    fast = _made_with(tmp_path, setup, gemm_efficiency=1.2)
    bad = tmp_path / "bad.yaml"
    res = runner.invoke(app, ["trace", "kernels", fast.source, *flags, "--gpu-out", str(bad)])
    assert res.exit_code == 2 and "peak" in res.output and not bad.exists()
    assert len(res.output.strip().splitlines()) == 1


def test_a_trace_without_sequence_parallelism_is_fitted_as_run(tmp_path):
    """A tp 2 run without sequence parallelism runs the element-wise work of the whole
    sequence on each rank: made with that roofline, `--no-sequence-parallel` fits the
    catalog's HBM share back, and the default (on) reads the same trace as slower HBM."""
    off = setup_from_flags(None, **LLAMA | dict(sequence_parallel=False))
    parts = roofline(off, off.scenario.strategy, 1)
    on = roofline(setup_from_flags(None, **LLAMA), off.scenario.strategy.model_copy(
        update={"sequence_parallel": True}), 1)  # fmt: skip
    assert parts["other"] > on["other"] and parts["math"] == pytest.approx(on["math"], rel=1e-12)
    t = _made_with(tmp_path, off)
    flags = ["--model", "llama2-7b", "--cluster", "dgx-a100-ib", "--micro-batch", "1"]
    flags += ["--seq-len", "2048", "--tp", "2", "--json"]
    gpu = catalog.gpu("a100-80gb")

    def hbm(*more):
        res = runner.invoke(app, ["trace", "kernels", t.source, *flags, *more])
        assert res.exit_code == 0, res.output
        return {r["class"]: r for r in json.loads(res.output)["classes"]}["other"]

    assert hbm("--no-sequence-parallel")["fitted"] == pytest.approx(gpu.hbm_efficiency)
    # the figure it compares with is the catalog's HBM share (it printed '-' / null)
    assert hbm()["catalog"] == gpu.hbm_efficiency
    assert hbm()["fitted"] < gpu.hbm_efficiency


def test_a_layout_the_traced_ranks_cannot_hold_names_the_flag(tmp_path):
    """The traced ranks (8) hold tp x pp: --tp 3 was fitted as if it did, --tp 4 --pp 4 was a
    ZeroDivisionError traceback; a bad scenario field a flag set names the flag, not the
    built-in scenario file."""
    setup = setup_from_flags(None, **LLAMA)
    t = _made_with(tmp_path, setup)
    flags = ["--model", "llama2-7b", "--cluster", "dgx-a100-ib", "--seq-len", "2048"]
    for more, says in (
        (["--tp", "3"], "--tp/--pp: the traced ranks: 8 is not a multiple of tp x pp = 3"),
        (["--tp", "4", "--pp", "4"], "the traced ranks: 8 is not a multiple of tp x pp = 16"),
        (["--micro-batch", "0"], "--micro-batch 0: Input should be greater than or equal to 1"),
    ):
        res = runner.invoke(app, ["trace", "kernels", t.source, *flags, *more])
        assert res.exit_code == 2, res.output
        assert says in res.output and len(res.output.strip().splitlines()) == 1
