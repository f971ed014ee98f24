"""Compute per kernel class (traces.kernels): classes read by hand from a synthetic trace,
the roofline's split by classes against a closed form, efficiencies fitted back from a
trace made with known ones, the fitted GPU written and read back; bad input one line."""

from __future__ import annotations

import json

import pytest
from test_traces_kineto import _write, _x, nccl_trace
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.cli.options import setup_from_flags
from commsim.traces.kernels import fit_kernels, measured, roofline
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
    assert parts["gemm"] == pytest.approx(3 * 1e9 * 8 / (gpu.peak_flops * gpu.gemm_efficiency))
    assert parts["attention"] == pytest.approx(0.0, abs=1e-15)
    assert parts["other"] == pytest.approx(0.0, abs=1e-15)


def _made_with(tmp_path, parts, slower):
    """A one-rank GPU trace whose classes take `slower` x the roofline's parts."""
    ev = [_x("ProfilerStep#1", 0, 10**7, cat="user_annotation", tid=1)]
    ts = 10.0
    names = {
        "gemm": "sm90_xmma_gemm_bf16",
        "attention": "flash_fwd_kernel",
        "other": "vectorized_elementwise_kernel",
    }
    for cls, name in names.items():
        dur = parts[cls] * slower[cls] * 1e6
        ev.append(_x(name, ts, dur))
        ts += dur + 1.0
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 8}, "traceEvents": ev}
    return read_kineto(_write(tmp_path, doc))


def test_efficiencies_fitted_back_from_a_trace_made_with_them(tmp_path):
    setup = setup_from_flags(None, **LLAMA)
    parts = roofline(setup, setup.scenario.strategy, 1)
    assert all(v > 0 for v in parts.values())
    # the parts add up to the roofline's compute (no one efficiency: the kernel rates)
    from commsim.step.model import StepModel
    from commsim.step.predict import strategy_layouts

    s = setup.scenario
    model = StepModel(setup.workload, setup.cluster, setup.gpu, 8, s.global_batch, None)
    c = model.compute(strategy_layouts(setup, [s.strategy]))
    assert sum(parts.values()) == pytest.approx(float(c.forward[0] + c.backward[0]), rel=1e-12)
    t = _made_with(tmp_path, parts, {"gemm": 2.0, "attention": 4.0, "other": 1.25})
    fit = fit_kernels(setup, [t], 1)
    gpu = catalog.gpu("a100-80gb")
    assert fit.fitted("gemm") == pytest.approx(gpu.gemm_efficiency / 2, rel=1e-6)
    assert fit.fitted("attention") == pytest.approx(gpu.attention_efficiency / 4, rel=1e-6)
    # the share of the datasheet HBM bandwidth reached: the catalog's, slowed 1.25x
    assert fit.fitted("other") == pytest.approx(gpu.hbm_efficiency / 1.25, rel=1e-6)


def test_the_fitted_gpu_is_written_and_read_back(tmp_path):
    setup = setup_from_flags(None, **LLAMA)
    parts = roofline(setup, setup.scenario.strategy, 1)
    t = _made_with(tmp_path, parts, {"gemm": 2.0, "attention": 4.0, "other": 1.0})
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
    gpu = catalog.gpu("a100-80gb")
    assert back.gemm_efficiency == pytest.approx(gpu.gemm_efficiency / 2, rel=1e-6)
    assert back.attention_efficiency == pytest.approx(gpu.attention_efficiency / 4, rel=1e-6)
    assert (back.peak_flops, back.hbm_bandwidth) == (gpu.peak_flops, gpu.hbm_bandwidth)
    # faster than the GPU can: one line, exit 2, nothing written
    fast = _made_with(tmp_path, parts, {"gemm": 0.5, "attention": 1.0, "other": 1.0})
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
    assert parts["other"] > on["other"] and parts["gemm"] == pytest.approx(on["gemm"], rel=1e-12)
    t = _made_with(tmp_path, parts, {"gemm": 1.0, "attention": 1.0, "other": 1.0})
    flags = ["--model", "llama2-7b", "--cluster", "dgx-a100-ib", "--micro-batch", "1"]
    flags += ["--seq-len", "2048", "--tp", "2", "--json"]
    gpu = catalog.gpu("a100-80gb")

    def hbm(*more):
        res = runner.invoke(app, ["trace", "kernels", t.source, *flags, *more])
        assert res.exit_code == 0, res.output
        return {r["class"]: r for r in json.loads(res.output)["classes"]}["other"]

    assert hbm("--no-sequence-parallel")["fitted"] == pytest.approx(gpu.hbm_efficiency)
    assert hbm()["fitted"] < gpu.hbm_efficiency
