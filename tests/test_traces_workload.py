"""A traced workload (traces.workload) in predict, plan and the what-if API: the compute per
micro-batch the traces measured, kept exactly at the traced layout (by hand), the same as a
scenario given that efficiency by hand, scaled by FLOPs elsewhere; bad input one line."""

from __future__ import annotations

import json

import pytest
import yaml
from test_traces_kineto import _write, _x, nccl_trace
from typer.testing import CliRunner

from commsim import catalog, whatif
from commsim.cli.app import app
from commsim.traces.kineto import read_kineto
from commsim.traces.workload import read_workload

runner = CliRunner()
SYNCED = 2**20 + 2**18  # bytes nccl_trace all-reduces a step (Float: 4 bytes an element)
FLOPS = 1e9  # forward FLOPs per sample of the one-layer model below
A100 = catalog.gpu("a100-80gb", "test", "gpu").peak_flops


def _traces(tmp_path, optimizer_us=20):
    """nccl_trace's four ranks, each step with a CPU optimizer annotation of optimizer_us."""
    paths = []
    for r in range(4):
        doc = nccl_trace(r)
        for base in (1000, 2000):
            doc["traceEvents"].append(
                _x("Optimizer.step#Adam.step", base + 880, optimizer_us, "cpu_op", tid=1)
            )
        paths.append(str(_write(tmp_path, doc, f"r{r}.json")))
    return paths


def _scenario(tmp_path, params=SYNCED // 4, flops=FLOPS, gpus=4, micro_batch=8):
    layer = {"name": "net", "params": params, "forward_flops": flops}
    doc = {
        "name": "traced",
        "model": {"name": "net", "kind": "custom", "custom_layers": [layer]},
        "cluster": "dgx-a100-ib",
        "gpus": gpus,
        "global_batch": 4 * micro_batch * 2,  # two micro-batches a step at 4 GPUs
        "micro_batch": micro_batch,
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_traced_workload_by_hand(tmp_path):
    w = read_workload([read_kineto(p) for p in _traces(tmp_path)])
    # a step of 1000 us, 100 us of it exposed (nccl_trace), 20 us of optimizer
    assert (w.ranks, w.dp, w.steps, w.micro_batches) == (4, 4, 2, 1)
    assert w.compute_s == pytest.approx(880e-6, abs=1e-12)
    assert w.optimizer_s == pytest.approx(20e-6, abs=1e-12)
    assert (w.sync_bytes, w.sync_elements) == (SYNCED, SYNCED / 4)


def test_predict_keeps_the_traced_compute(tmp_path):
    paths = _traces(tmp_path)
    scenario = _scenario(tmp_path)
    out = runner.invoke(app, ["predict", scenario, "--trace", str(tmp_path / "r*.json"), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    trace = doc["trace"]
    # 3 FLOPs (forward + backward) x F x micro-batch at the GPU's peak, over 880 us
    assert trace["compute_efficiency"] == pytest.approx(3 * FLOPS * 8 / (A100 * 880e-6))
    assert doc["forward_s"] + doc["backward_s"] == pytest.approx(2 * 880e-6, rel=1e-12)
    assert not any("is it the model traced" in a for a in trace["assumed"])
    # the same as the scenario given that efficiency by hand
    by_hand = whatif.change(whatif.load(scenario), compute_efficiency=trace["compute_efficiency"])
    assert whatif.predict(by_hand).step_time_s == pytest.approx(doc["step_time_s"], rel=1e-12)
    # the what-if API's traced workload gives the same
    traced = whatif.traced(paths)
    assert whatif.predict(whatif.load(scenario), traced).step_time_s == pytest.approx(
        doc["step_time_s"], rel=1e-12
    )


def test_other_scales_keep_the_rate(tmp_path):
    traced = whatif.traced(_traces(tmp_path), micro_batch=8)
    base = whatif.load(_scenario(tmp_path))
    # 64 GPUs, the same micro-batch: the same compute per micro-batch (weak scaling)
    big = whatif.predict(whatif.change(base, gpus=64, global_batch=64 * 8 * 2), traced)
    assert big.to_dict()["forward_s"] + big.to_dict()["backward_s"] == pytest.approx(2 * 880e-6)
    # half the micro-batch: half the FLOPs, half the time, twice the micro-batches
    sweep = whatif.sweep(base, "micro_batch", [4, 8], traced)
    small, traced_mb = (p.to_dict() for p in sweep.predictions)
    assert small["forward_s"] == pytest.approx(traced_mb["forward_s"], rel=1e-12)
    assert small["backward_s"] / 4 == pytest.approx(440e-6 * 2 / 3)


def test_a_model_of_other_size_is_said(tmp_path):
    _traces(tmp_path)
    out = runner.invoke(
        app,
        ["predict", _scenario(tmp_path, params=10**6), "--trace", str(tmp_path / "r*.json")],
    )
    assert out.exit_code == 0, out.output
    assert "is it the model traced?" in out.output and "from the trace:" in out.output


def test_plan_searches_at_the_traced_rate(tmp_path):
    _traces(tmp_path)
    args = ["plan", _scenario(tmp_path), "--trace", str(tmp_path / "r*.json"), "--json"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["trace"]["compute_per_micro_batch_s"] == pytest.approx(880e-6)
    assert doc["candidates"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--trace-tp", "2"], "--trace-tp: needs --trace"),
        (["--trace", "nowhere/*.json"], "matches no file"),
        (["--trace", "TRACES", "--trace-tp", "3"], "does not divide 4 ranks"),
        (["--trace", "TRACES", "--trace-micro-batch", "0"], "not a positive number"),
    ],
)
def test_bad_trace_flags_are_one_line(tmp_path, extra, says):
    _traces(tmp_path)
    extra = [str(tmp_path / "r*.json") if x == "TRACES" else x for x in extra]
    out = runner.invoke(app, ["predict", _scenario(tmp_path), *extra])
    assert out.exit_code == 2, out.output
    assert says in out.output and len(out.output.strip().splitlines()) == 1


def test_faster_than_the_gpu_is_refused(tmp_path):
    _traces(tmp_path)
    scenario = _scenario(tmp_path, flops=1e15)
    out = runner.invoke(app, ["predict", scenario, "--trace", str(tmp_path / "r*.json")])
    assert out.exit_code == 2 and "of the a100-80gb's peak" in out.output


def test_plan_sizing_refuses_a_trace(tmp_path):
    _traces(tmp_path)
    args = ["plan", _scenario(tmp_path), "--gpus", "4:16", "--trace", str(tmp_path / "r*.json")]
    out = runner.invoke(app, args)
    assert out.exit_code == 2 and "--trace" in out.output


@pytest.mark.torch
@pytest.mark.slow
def test_harness_traces_give_the_workload(tmp_path, harness_traces):
    """The harness's real gloo traces: every gradient element DDP all-reduced is one of the
    model's parameters, the optimizer is torch.optim's own annotation, and predict at the
    traced layout computes for exactly the traced time."""
    results, prof = harness_traces
    records = [json.loads(x) for x in results.read_text().splitlines()]
    model = next(r for r in records if r["kind"] == "model")
    layers = [
        {"name": x["name"], "params": sum(x["tensors"]), "forward_flops": x["forward_flops"]}
        for x in model["layers"]
    ]
    doc = {
        "name": "harness",
        "model": {"name": model["name"], "kind": "custom", "custom_layers": layers},
        "cluster": "dgx-a100-ib",
        "gpus": 2,
        "global_batch": 2 * model["batch"],
        "micro_batch": model["batch"],
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    traces = str(prof / "*-rank*.json")
    out = runner.invoke(app, ["predict", str(tmp_path / "s.yaml"), "--trace", traces, "--json"])
    assert out.exit_code == 0, out.output
    pred = json.loads(out.output)
    t = pred["trace"]
    w = whatif.traced(sorted(str(p) for p in prof.glob("*-rank*.json")))
    assert w.sync_elements == sum(x["params"] for x in layers)
    assert w.optimizer_s > 0 and w.micro_batches == 1 and t["traced_gpus"] == 2
    assert not any("is it the model traced" in a for a in t["assumed"])
    assert pred["forward_s"] + pred["backward_s"] == pytest.approx(w.compute_s, rel=1e-12)
    # the kernel classes split the busy time: the MLP's GEMMs (aten::addmm/mm) and the rest
    from commsim.traces.intervals import measure
    from commsim.traces.kineto import read_kineto

    t = read_kineto(sorted(prof.glob("*-rank*.json"))[0])
    parts = {c: measure(v) for c, v in t.classes.items()}
    assert parts["gemm"] > parts["other"] > 0 and parts["attention"] == 0
    assert sum(parts.values()) == pytest.approx(measure(t.compute), rel=1e-9)
    paths = [str(p) for p in sorted(prof.glob("*-rank*.json"))]
    scenario = ["--scenario", str(tmp_path / "s.yaml"), "--json"]
    kernels = runner.invoke(app, ["trace", "kernels", *paths, *scenario])
    assert kernels.exit_code == 0, kernels.output
    gemm = json.loads(kernels.output)["classes"][0]
    assert gemm["class"] == "gemm" and 0 < gemm["fitted"] < gemm["catalog"]
