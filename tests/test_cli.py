"""The command line as a user meets it: JSON keys, tables, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_collective_json_rows():
    doc = run_json(
        "collective",
        "all-reduce",
        "--cluster",
        "dgx-a100-ib",
        "--gpus",
        "16",
        "--sizes",
        "1MiB:4MiB",
        "--algorithm",
        "ring",
    )
    rows = doc["rows"]
    assert [r["bytes"] for r in rows] == [2**20, 2**21, 2**22]
    for r in rows:
        assert set(r) >= {"bytes", "time_s", "algbw_Bps", "busbw_Bps", "algorithm"}
        assert r["algbw_Bps"] == pytest.approx(r["bytes"] / r["time_s"])
        assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"] * 2 * 15 / 16)


def test_collective_auto_is_what_the_backend_runs():
    # auto is what the backend runs: under gloo its own algorithm (a ring all-reduce), under
    # NCCL (the default on GPUs) NCCL's own choice, the same as --algorithm nccl; 'a|b|...'
    # takes the fastest of those named
    common = (
        "collective",
        "all-reduce",
        "--cluster",
        "aws-p4d",
        "--gpus",
        "32",
        "--sizes",
        "8B:64MiB",
    )
    every = run_json(*common, "--algorithm", "all", "--backend", "gloo")["rows"]
    auto = run_json(*common, "--algorithm", "auto", "--backend", "gloo")["rows"]
    fastest = run_json(*common, "--algorithm", "ring|tree|rhd|ps", "--backend", "gloo")["rows"]
    for a, f in zip(auto, fastest, strict=True):
        same = {r["algorithm"]: r["time_s"] for r in every if r["bytes"] == a["bytes"]}
        assert a["algorithm"] == "ring" and a["time_s"] == pytest.approx(same["ring"])
        assert f["time_s"] == pytest.approx(min(t for k, t in same.items() if k != "hierarchical"))
    auto = run_json(*common, "--algorithm", "auto")
    nccl = run_json(*common, "--algorithm", "nccl")
    assert auto["backend"] == "nccl" and auto["nccl_version"] == "2.30"
    assert [r["time_s"] for r in auto["rows"]] == [r["time_s"] for r in nccl["rows"]]


def test_collective_runs_any_registered_algorithm():
    # gloo's binomial broadcast is not among 'all' (auto's choices) but runs when named
    doc = run_json("collective", "broadcast", "--gpus", "8", "--sizes", "1KiB:2KiB",
                   "--algorithm", "binomial")  # fmt: skip
    assert [r["algorithm"] for r in doc["rows"]] == ["binomial", "binomial"]
    every = run_json("collective", "broadcast", "--gpus", "8", "--sizes", "1KiB:1KiB")["rows"]
    assert [r["algorithm"] for r in every] == ["ring"]


def test_collective_table_prints():
    result = run(
        "collective", "all-gather", "--cluster", "pcie-4gpu", "--gpus", "8", "--sizes", "1KiB:1MiB"
    )
    assert result.exit_code == 0, result.output
    assert "busbw" in result.output


def test_predict_json_keys(tmp_path):
    png = tmp_path / "step.png"
    doc = run_json("predict", "--plot", str(png))
    for key in (
        "step_time_s",
        "compute_s",
        "comm_s",
        "exposed_comm_s",
        "overlap_ratio",
        "overlap_efficiency",
        "scaling_efficiency",
        "mfu",
        "tflops_per_gpu",
        "buckets",
    ):
        assert key in doc
    assert doc["step_time_s"] >= doc["compute_s"]
    assert doc["exposed_comm_s"] == pytest.approx(doc["step_time_s"] - doc["compute_s"])
    assert png.stat().st_size > 10_000


def test_predict_flags_override_the_scenario():
    base = run_json("predict", "--no-overlap")
    more = run_json("predict", "--no-overlap", "--gpus", "128", "--global-batch", "1024")
    assert base["strategy"]["overlap"] is False
    assert more["comm_s"] > base["comm_s"]  # ring over more ranks: more steps, same bytes


def test_plan_ranks_best_first():
    ddp = ("--tp", "1", "--pp", "1", "--zero", "0", "--recompute", "none", "--micro-batch", "1")
    doc = run_json(
        "plan", "--placement", "blocked", "--algorithm", "ring", "--compression", "none", *ddp
    )
    times = [c["step_time_s"] for c in doc["candidates"]]
    assert times == sorted(times)
    assert len(times) == 8 * 2  # bucket sizes x overlap on/off (DDP, micro-batch pinned)
    hybrid = run_json("plan", "--placement", "blocked", "--algorithm", "ring")["candidates"]
    assert any(c["strategy"]["zero"] or c["strategy"]["tp"] > 1 for c in hybrid)
    assert [c["step_time_s"] for c in hybrid] == sorted(c["step_time_s"] for c in hybrid)
    assert {"strategy", "step_time_s", "mfu"} <= set(doc["candidates"][0])


def test_topo_list_and_show(tmp_path):
    names = {t["name"] for t in run_json("topo", "list")["topologies"]}
    assert {
        "dgx-a100-ib",
        "dgx-h100-ib",
        "aws-p4d",
        "roce-3tier-3to1",
        "ethernet-10g",
        "pcie-4gpu",
    } <= names
    png = tmp_path / "g.png"
    doc = run_json("topo", "show", "roce-3tier-3to1", "--gpus", "64", "--plot", str(png))
    assert doc["gpus"] == 64 and doc["racks"] == 2
    assert png.exists()


def _bad(tmp_path, text: str, name: str = "bad.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "args,expect",
    [
        (("predict", "no/such/file.yaml"), "file not found"),
        (("predict", "--cluster", "nowhere"), "unknown topology 'nowhere'"),
        (("predict", "--model", "gpt-9"), "gpt-9"),
        (("predict", "--gpus", "100000"), "100000 GPUs requested"),
        (("predict", "--algorithm", "magic"), "--algorithm magic: Input should be"),
        (("predict", "--global-batch", "100"), "--global-batch 100: 100 is not a multiple"),
        (("collective", "all-reduce", "--sizes", "4GiB:1KiB"), "size range"),
        (("collective", "gather"), "unknown op"),
        (("collective", "broadcast", "--algorithm", "rhd", "--gpus", "8"), "rhd"),
        (("collective", "all-reduce", "--placement", "random", "--gpus", "8"), "placement"),
        (("topo", "show", "nowhere"), "unknown topology"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, expect):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert expect in result.output
    assert "Traceback" not in result.output


def test_bad_files_name_file_and_field(tmp_path):
    bad_yaml = _bad(tmp_path, "model: [unclosed\n")
    result = run("predict", str(bad_yaml))
    assert result.exit_code == 2 and "invalid YAML" in result.output and "bad.yaml" in result.output

    cluster = _bad(
        tmp_path,
        """
name: broken
nodes: 2
node: {gpu: a100-80gb, gpus_per_node: 8, interconnect: nvswitch,
       nics: {count: 1, bandwidth: 0Gbps}}
fabric: {kind: infiniband, nodes_per_leaf: 1}
""",
        "cluster.yaml",
    )
    result = run("predict", "--cluster", str(cluster))
    assert result.exit_code == 2
    assert "cluster.yaml: node.nics.bandwidth: must be positive" in result.output

    good = cluster.read_text().replace("0Gbps", "100Gbps")
    unknown_gpu = _bad(tmp_path, good.replace("a100-80gb", "z9000"), "gpu.yaml")
    result = run("topo", "show", str(unknown_gpu))
    assert result.exit_code == 2 and "unknown GPU 'z9000'" in result.output
    assert "gpu.yaml: node.gpu" in result.output

    split = _bad(
        tmp_path,
        good.replace("nodes_per_leaf: 1", "nodes_per_leaf: 1, uplinks_per_leaf: 0"),
        "split.yaml",
    )
    result = run("topo", "show", str(split))
    assert result.exit_code == 2 and "disconnected" in result.output


def test_compression_bench_json_rows():
    doc = run_json("compression", "bench", "--compressors", "fp16,topk:0.05", "--repeats", "1")
    rows = doc["rows"]
    assert {r["compressor"] for r in rows} == {"fp16", "topk:0.05"}
    assert {r["gradients"] for r in rows} == {"synthetic block", "digits MLP"}
    for r in rows:
        assert set(r) >= {"compressor", "wire_ratio", "delta", "encode_s_per_MB", "decode_s_per_MB"}
    fp16 = next(r for r in rows if r["compressor"] == "fp16")
    assert fp16["wire_ratio"] == 0.5 and fp16["delta"] > 0.999999


def test_compression_convergence_json(tmp_path):
    png = tmp_path / "curves.png"
    doc = run_json(
        "compression",
        "convergence",
        "--compressors",
        "topk:0.05",
        "--steps",
        "40",
        "--error-feedback",
        "on",
        "--plot",
        str(png),
    )
    names = [(r["compressor"], r["error_feedback"]) for r in doc["rows"]]
    assert names == [("none", False), ("topk:0.05", True)]
    assert doc["rows"][0]["accuracy_retained"] == 1.0
    assert png.exists()


def test_predict_with_compression_and_plan_plot(tmp_path):
    doc = run_json("predict", "--compression", "powersgd:4", "--error-feedback")
    assert doc["strategy"]["compression"] == "powersgd:4" and doc["codec_s"] > 0
    png = tmp_path / "bw.png"
    doc = run_json(
        "plan",
        "scenarios/resnet50-10gbe.yaml",
        "--algorithm",
        "ring",
        "--placement",
        "blocked",
        "--bucket-mb",
        "25",
        "--plot",
        str(png),
    )
    sweep = doc["bandwidth_sweep"]
    assert set(sweep["step_time_s"]) >= {"none", "fp16", "powersgd:4"}
    assert png.exists()


@pytest.mark.parametrize(
    "args,expect",
    [
        (("predict", "--compression", "zip"), "unknown compressor 'zip'"),
        (("compression", "bench", "--compressors", "topk:2"), "--compressors: compressor 'topk:2'"),
        (("compression", "bench", "--compressors", ","), "--compressors ',': names no compressor"),
        (("compression", "convergence", "--compressors", "zip"), "--compressors: unknown"),
        (("compression", "convergence", "--error-feedback", "maybe"), "both, on or off"),
        (("compression", "convergence", "--steps", "0"), "--steps 0: must be at least 1"),
        (("compression", "convergence", "--workers", "0"), "--workers 0: must be at least 1"),
        (("compression", "convergence", "--seed", "-1"), "--seed -1: must be at least 0"),
    ],
)
def test_bad_compression_input_exits_2(args, expect):
    """One line naming the flag (an empty --compressors was an empty table and exit 0; a
    negative --seed numpy's bare 'expected non-negative integer')."""
    result = run(*args)
    assert result.exit_code == 2 and expect in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_profile_flag_reprices_the_cluster(tmp_path):
    from test_calibrate_io import _fitted_nccl_logs

    prof = tmp_path / "p.yaml"
    out, cluster, _ = _fitted_nccl_logs(tmp_path)
    assert (
        run("calibrate", "fit", str(out), "--cluster", str(cluster), "-o", str(prof)).exit_code == 0
    )
    args = (
        "collective",
        "all-reduce",
        "--cluster",
        str(cluster),
        "--gpus",
        "16",
        "--sizes",
        "1GiB",
        "--algorithm",
        "ring",
    )
    plain = run_json(*args)["rows"][0]
    fitted = run_json(*args, "--profile", str(prof))
    # the logs came from 40 GB/s ring channels across nodes; NCCL's search says 48, and
    # NCCL 2.29.7 ran them
    assert fitted["nccl_version"] == "2.29.7"
    assert fitted["rows"][0]["time_s"] == pytest.approx(plain["time_s"] * 48 / 40, rel=0.05)
    elsewhere = run("predict", "--profile", str(prof))  # default scenario: aws-p4d (A100s)
    assert elsewhere.exit_code == 2
    assert "hardware.intra-node: fitted on h100 GPUs over nvswitch" in elsewhere.output


@pytest.mark.parametrize("module", ["commsim.cli", "commsim.cli.app"])
def test_python_m_runs_the_whole_command(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    )
    for command in ("predict", "plan", "collective", "claims", "topo", "calibrate", "testbed"):
        assert command in done.stdout


def test_compute_efficiency_flag_picks_the_roofline_or_one_rate(tmp_path):
    """--compute-efficiency roofline prices as a scenario without compute_efficiency does
    (the stack's kernels then count); a number sets one rate for every FLOP."""
    fields = dict(model="llama3-8b", cluster="dgx-h100-ib", gpus=8, global_batch=16, seq_len=8192)
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(fields | {"strategy": {"zero": 3}}))
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in fields.items()] + ["--zero", "3"]
    by_file = run_json("predict", str(path))["step_time_s"]
    by_flag = run_json("predict", *flags, "--compute-efficiency", "roofline")["step_time_s"]
    assert by_flag == by_file
    titan = run_json(
        "predict", *flags, "--compute-efficiency", "roofline", "--kernels", "torchtitan"
    )
    assert titan["step_time_s"] > by_flag  # eager kernels move more bytes
    half = run_json("predict", *flags, "--compute-efficiency", "0.5")
    third = run_json("predict", *flags, "--compute-efficiency", "0.25")
    assert third["compute_s"] == pytest.approx(2 * half["compute_s"], rel=0.02)


def test_grad_dtype_flag_sets_the_buffer_and_is_refused_where_fsdp_ignores_it():
    """--grad-dtype bf16 halves the gradient buffer (NeMo's grad_sync_dtype); PyTorch FSDP
    (states: fsdp) keeps fp32 shards, so there the flag is refused, not ignored."""
    base = ["--model", "gpt2-xl", "--cluster", "aws-p4d", "--gpus", "16", "--global-batch", "64"]
    runs = {
        v: CliRunner().invoke(app, ["predict", *base, "--zero", "1", "--json", "--grad-dtype", v])
        for v in ("fp32", "bf16")
    }
    grads = {v: json.loads(r.stdout)["memory"]["grads_bytes"] for v, r in runs.items()}
    assert grads["bf16"] == pytest.approx(grads["fp32"] / 2)
    bad = CliRunner().invoke(
        app, ["predict", *base, "--zero", "3", "--fsdp", "--grad-dtype", "bf16"]
    )
    assert bad.exit_code == 2
    assert len(bad.output.strip().splitlines()) == 1 and "--grad-dtype bf16" in bad.output


def test_compression_bench_shows_a_tiny_wire_ratio():
    """randomk:1e-9 sends one value of a 50 MB bucket: its wire ratio, 8e-08, printed as
    0.0000 in the table while --json had it."""
    out = run("compression", "bench", "--compressors", "randomk:1e-9", "--repeats", "1")
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if "synthetic block" in line)
    assert row.split("randomk:1e-09")[1].split()[1] == "7.947e-08"
