"""Issue 14's inputs: each is answered, with one line naming the flag or the file and field
and exit 2, never a silent wrong number, an inf, a NaN, a traceback or a half-written file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.spec_io import load_spec, parse_spec
from commsim.specs import ClusterSpec, SpecError
from commsim.units import UnitError, parse_bytes, parse_rate, parse_time

CLUSTER = """
name: bare
nodes: 4
node:
  gpu: {gpu}
  gpus_per_node: 8
  interconnect: nvswitch
  nics: {{count: 1, bandwidth: {bandwidth}}}
fabric: {{kind: infiniband, nodes_per_leaf: 2}}
"""


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(*args: str, says: str):
    """The command exits 2 with one error line that contains `says`."""
    result = run(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert says in lines[0], lines[0]
    for bad in ("Traceback", "nan", "inf "):
        assert bad not in lines[0]


def _cluster(tmp_path: Path, gpu: str = "a100", bandwidth: str = "100Gbps") -> str:
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.format(gpu=gpu, bandwidth=bandwidth))
    return str(path)


@pytest.mark.parametrize("command", [("topo", "show"), ("predict", "--cluster")])
def test_a_bare_rate_in_a_file_is_refused(tmp_path, command):
    """100 read as bytes/s made a 2.7e7 s step and `topo show` 0.00 GB/s."""
    path = _cluster(tmp_path, bandwidth="100")
    extra = ("--gpus", "32", "--global-batch", "512") if command[0] == "predict" else ()
    refused(*command, path, *extra, says="c.yaml: node.nics.bandwidth: 100 has no unit")


def test_units_required_from_files_but_not_from_python():
    assert parse_rate("100Gbps", bare=False) == 12.5e9
    assert parse_time(0, bare=False) == 0.0  # zero is zero in any unit
    for parse, value in ((parse_rate, 100), (parse_bytes, "4096"), (parse_time, "2")):
        with pytest.raises(UnitError, match="has no unit"):
            parse(value, bare=False)
        assert parse(value) > 0  # Python callers pass SI numbers
    assert parse_bytes("1PiB") == 2.0**50 and parse_bytes("1EB") == 1e18
    with pytest.raises(UnitError, match="not a finite size"):
        parse_bytes("1e400B")


def test_a_spec_dumped_as_json_reads_back_with_its_units():
    spec = load_spec(ClusterSpec, "topologies/dgx-h100-ib.yaml")
    data = spec.model_dump(mode="json")
    assert data["node"]["nics"]["bandwidth"].endswith("B/s")
    assert parse_spec(ClusterSpec, data, "dump") == spec


@pytest.mark.parametrize(
    "args,says",
    [
        (("predict", "--bucket-mb", "inf"), "--bucket-mb inf: Input should be a finite number"),
        (("predict", "--tokens", "inf"), "--tokens inf: Input should be a finite number"),
        (("predict", "--price-per-gpu-hour", "inf"), "--price-per-gpu-hour inf: Input should"),
        (
            ("predict", "--tokens", "1e300", "--price-per-gpu-hour", "1e308"),
            "training.cost is not a finite number",
        ),
        (("collective", "all-reduce", "--gpus", "1"), "--gpus 1: a collective needs at least 2"),
        (("collective", "all-reduce", "--sizes", "1e400B"), "--sizes: '1e400B' is not a finite"),
        (("compression", "convergence", "--workers", "2000"), "--workers 2000: at most 256"),
        (("compression", "bench", "--repeats", "0"), "--repeats 0: time each compressor"),
    ],
)
def test_no_inf_or_nan_ever_printed(args, says):
    refused(*args, says=says)


def test_petabyte_sizes_in_both_spellings():
    for size in ("1PiB", "1PB"):
        result = run("collective", "all-reduce", "--gpus", "8", "--sizes", f"1TiB:{size}", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["rows"]


@pytest.mark.parametrize(
    "args,says",
    [
        (("plan", "--deadline", "0d", "--tokens", "1e9"), "--deadline 0d: must be a positive"),
        (("plan", "--budget", "0", "--tokens", "1e9"), "--budget 0: must be a positive"),
        (("plan", "--budget", "-5", "--tokens", "1e9"), "--budget -5: must be a positive"),
        (("plan", "--gpu", "h100"), "--gpu: applies to cluster sizing only"),
        (("plan", "--objective", "cost"), "--objective: applies to cluster sizing only"),
        (("plan", "--top", "-1"), "--top -1: show at least 1 row"),
        (("plan", "--fsdp", "--zero", "1"), "--fsdp: is ZeRO-3, but --zero 1 is given"),
        (("predict", "--fsdp", "--zero", "1"), "--fsdp: is ZeRO-3, but --zero 1 is given"),
        (
            ("plan", "--gpus", "64:128", "--deepspeed", "ds.json", "--tokens", "1e9"),
            "--deepspeed: not in cluster sizing",
        ),
        (("plan", "--checkpoint-interval", "1h"), "--checkpoint-interval: failures and goodput"),
        (("collective", "all-reduce", "--algorithm", "magic"), "--algorithm magic: all-reduce has"),
        (("predict", "--error-feedback"), "--error-feedback: keeps what a lossy compressor"),
        (("predict", "--kernels", "torchtitan"), "--kernels torchtitan: prices the roofline's"),
        (("plan", "--kernels", "llm-foundry"), "(0.45): give --compute-efficiency roofline"),
        (("predict", "--compute-efficiency", "fast"), "--compute-efficiency fast: Input should"),
        (("predict", "--zero", "3", "--bucket-mb", "50"), "--bucket-mb 50.0: ZeRO-3/FSDP"),
        (("predict", "--zero", "3", "--compression", "int8"), "--compression int8: a DDP comm"),
        (("calibrate", "fit", "r.jsonl", "--cluster", "x", "-o", "/no/p.yaml"), "-o '/no/p.yaml'"),
        (("plan", "--tp", "3"), "--tp 3: 3 does not divide the model's 25 attention heads"),
        (
            ("plan", "--tp", "5", "--gpus", "32"),
            "--tp 5: tp x pp x cp = 5 x 1 x 1 does not divide the 32",
        ),
        (
            ("predict", "--zero", "3", "--no-overlap-param-gather"),
            "--no-overlap-param-gather: false moves ZeRO 1-2's overlapped parameter all-gathers",
        ),
        (("plan", "--zero", "0", "--no-overlap-param-gather"), "needs zero 1 or 2 and overlap on"),
        (("plan", "--pp", "100"), "--pp 100: 100 pipeline stages for 48 layers"),
        (("plan", "--pp", "3"), "--pp 3: tp x pp x cp = 1 x 3 x 1 does not divide"),
        (("plan", "--cluster", "dgx-a100-ib", "--pp", "64"), "--pp 64: 64 pipeline stages for 48"),
        (
            ("plan", "--tokens", "1e9", "--gpus", "8:1000000000"),
            "--gpus: 536,870,912 GPUs: no layout of gpt2-xl at global batch 512 uses more than",
        ),
    ],
)
def test_flags_that_would_be_ignored_are_refused(args, says):
    """Each of these was accepted and ignored (or ran for minutes) on main."""
    refused(*args, says=says)


@pytest.mark.parametrize(
    "args,says",
    [
        (("predict", "--tp", "-2"), "--tp -2: Input should be greater than or equal to 1"),
        (("predict", "--cluster", "nowhere"), "--cluster nowhere: unknown topology 'nowhere'"),
        (("predict", "--gpus", "100000"), "--gpus 100000: 100000 GPUs requested"),
        (("predict", "--cluster", ""), "--cluster '': empty: give a topology name"),
        (("collective", "all-reduce", "--cluster", "x"), "--cluster: unknown topology 'x'"),
    ],
)
def test_a_flag_is_blamed_not_the_scenario_file(args, says):
    refused(*args, says=says)
    assert "default.yaml" not in run(*args).output


def test_a_binary_or_empty_file_names_itself(tmp_path):
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(bytes(range(128, 256)))
    refused("predict", str(garbage), says="garbage.yaml: not a text file (byte 0 is not UTF-8)")
    refused("predict", "--cluster", str(garbage), says="garbage.yaml: not a text file")
    with pytest.raises(SpecError, match="give a file name"):
        load_spec(ClusterSpec, "")


def test_a_pattern_in_a_message_keeps_its_brackets(tmp_path):
    """rich read `[a-z]` in the testbed prefix pattern as markup and printed '^{0,9}$'."""
    bed = tmp_path / "tb.yaml"
    bed.write_text(
        "name: x\nprefix: 'AB!'\nracks: 2\nhosts_per_rack: 2\n"
        "host_rate: 100Mbps\nuplink_rate: 100Mbps\n"
    )
    refused("testbed", "check", str(bed), says="pattern '^[a-z][a-z0-9]{0,9}$'")


@pytest.mark.parametrize(
    "flag,path,says",
    [
        ("--plot", "{tmp}/missing/a.png", "directory '{tmp}/missing' does not exist"),
        ("--plot", "{tmp}", "is a directory"),
        ("--plot", "{tmp}/out.txt", "not an image format"),
        ("--html", "{tmp}/missing/r.html", "directory '{tmp}/missing' does not exist"),
    ],
)
def test_output_paths_are_checked_before_any_work(tmp_path, flag, path, says):
    path, says = path.format(tmp=tmp_path), says.format(tmp=tmp_path)
    refused("predict", flag, path, says=f"{flag} {path!r}: {says}")
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_a_plot_goes_where_it_is_said_to(tmp_path):
    """A name without a suffix is written as a PNG under that very name."""
    path = tmp_path / "timeline"
    result = run("predict", "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"timeline written to {path}\n" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["timeline"]


def test_a_gpu_the_catalog_lacks_comes_from_yaml(tmp_path):
    gpu = tmp_path / "gb200.yaml"
    gpu.write_text(
        "name: gb200\npeak_flops: 2.5e15\nhbm_bytes: 186GB\nhbm_bandwidth: 8TB/s\n"
        "nvlink_bandwidth: 900GB/s\ncompute_capability: 10.0\nnvlink_links: 18\n"
        "source: NVIDIA GB200 NVL72 datasheet, per GPU\n"
    )
    path = _cluster(tmp_path, gpu=str(gpu))
    result = run("predict", "--cluster", path, "--gpus", "32", "--global-batch", "512", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["memory"]["usable_bytes"] == pytest.approx(186e9)  # no reserve by default
    refused(
        "predict",
        "--cluster",
        _cluster(tmp_path, gpu="mi999"),
        "--gpus",
        "32",
        says="unknown GPU 'mi999'",
    )


def test_help_needs_no_pydantic():
    """`commsim --help` imports no spec machinery (it took 1.2 s when it did)."""
    import subprocess
    import sys

    code = "import sys, commsim.cli.app; print('pydantic' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_a_usage_error_is_one_line_too():
    refused("predict", "--gpus", "inf", says="Invalid value for '--gpus'")
    refused("predict", "--no-such-flag", says="No such option: --no-such-flag")


def test_an_overlap_ratio_never_rounds_below_zero():
    """With one-token sequences every bit of communication is exposed: 1 - exposed / comm
    rounded to -2.2e-16 (found by tests/test_properties.py)."""
    result = run("plan", "--seq-len", "1", "--top", "1", "--json")
    ratios = [c["overlap_ratio"] for c in json.loads(result.stdout)["candidates"]]
    assert ratios and all(0.0 <= r <= 1.0 for r in ratios)


@pytest.mark.parametrize(
    "command",
    [
        ("goodput",),
        ("topo", "show", "aws-p4d"),
        ("compression", "convergence"),
        ("calibrate", "validate", "r.jsonl", "--profile", "p.yaml", "--cluster", "x"),
    ],
)
def test_every_plot_path_is_checked_first(tmp_path, command):
    refused(*command, "--plot", str(tmp_path / "no" / "a.png"), says="does not exist")


def test_a_gpu_without_a_compute_capability_under_nccl_names_the_field(tmp_path):
    # NCCL's tuner reads the GPU's compute capability: a GPU file without one is refused
    # naming the cluster's node.gpu, not with NCCL's internal error
    gpu = tmp_path / "mygpu.yaml"
    gpu.write_text(
        "name: mygpu\npeak_flops: 5e14\nhbm_bytes: 80GB\nhbm_bandwidth: 2TB/s\n"
        "nvlink_bandwidth: 300GB/s\nsource: a test\n"
    )
    text = Path("topologies/dgx-a100-ib.yaml").read_text()
    cluster = tmp_path / "c.yaml"
    cluster.write_text(re.sub(r"gpu: \S+", f"gpu: {gpu}", text, count=1))
    result = CliRunner().invoke(app, ["collective", "all-reduce", "--cluster", str(cluster)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "node.gpu: mygpu has no compute_capability" in result.output


def test_a_gpu_file_beside_the_cluster_file_is_found_from_anywhere(tmp_path, monkeypatch):
    """A cluster file naming its GPU file by a relative path finds it beside itself, from any
    working directory; a relative path that is not beside it stays the user's path."""
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec

    home = tmp_path / "clusters"
    home.mkdir()
    (home / "mygpu.yaml").write_text(
        "name: mygpu\npeak_flops: 5e14\nhbm_bytes: 96GB\nhbm_bandwidth: 2TB/s\n"
        "nvlink_bandwidth: 300GB/s\nsource: a test\ncompute_capability: 9.0\n"
    )
    text = Path("topologies/dgx-a100-ib.yaml").read_text()
    (home / "c.yaml").write_text(re.sub(r"gpu: \S+", "gpu: mygpu.yaml", text, count=1))
    monkeypatch.chdir(tmp_path)
    spec = load_spec(ClusterSpec, "clusters/c.yaml")
    assert Path(spec.node.gpu) == home / "mygpu.yaml"
    (home / "d.yaml").write_text(re.sub(r"gpu: \S+", "gpu: elsewhere.yaml", text, count=1))
    assert load_spec(ClusterSpec, "clusters/d.yaml").node.gpu == "elsewhere.yaml"


_FP8_ONLY = "applies to FP8 training (precision fp8)"


@pytest.mark.parametrize(
    "command,strategy,says",
    [  # plan searches FP8 and gives its FP8 layouts the FP8 savers: predict only
        ("predict", {"fp8_param": True}, f"strategy.fp8_param: {_FP8_ONLY}"),
        ("predict", {"fp8_cache": True}, f"strategy.fp8_cache: {_FP8_ONLY}"),
        *(
            (command, {"recompute_modules": [module]}, f"{module}: llama2-7b has no {what}")
            for command in ("predict", "plan")
            for module, what in (("mla_up_proj", "MLA's"), ("moe_act", "routed experts"))
        ),
    ],
)
def test_a_memory_saver_the_layout_cannot_use_is_refused(tmp_path, command, strategy, says):
    """Memory savers that would save nothing for this model or precision: one line, exit 2."""
    path = tmp_path / "s.yaml"
    doc = dict(model="llama2-7b", cluster="dgx-h100-ib", gpus=8, global_batch=64)
    path.write_text(json.dumps(doc | {"strategy": strategy}))
    refused(command, str(path), says=says)


_CP_JOB = ("--model", "llama2-7b", "--cluster", "dgx-h100-ib", "--gpus", "256")
_CP_SPLIT = "sequence length 4095 does not split into 2 x cp = 4 chunks"


@pytest.mark.parametrize(
    "args",
    [
        ("predict", *_CP_JOB, "--tp", "2"),
        ("plan", *_CP_JOB),  # plan ranked cp 2 layouts that predict refused
        ("plan", *_CP_JOB[:4], "--gpus", "64:256", "--tokens", "1e9"),  # sizing checks pins too
    ],
)
def test_a_cp_that_cannot_split_the_sequence_is_refused_alike(args):
    extra = ("--global-batch", "1024", "--seq-len", "4095", "--cp", "2")
    refused(*args, *extra, says=f"--cp 2, --seq-len 4095: {_CP_SPLIT}")


def test_a_sequence_flag_that_a_files_cp_cannot_split_is_blamed(tmp_path):
    path = tmp_path / "s.yaml"
    doc = dict(model="llama2-7b", cluster="dgx-h100-ib", gpus=256, global_batch=1024)
    path.write_text(json.dumps(doc | {"strategy": {"tp": 2, "cp": 2}}))
    refused("predict", str(path), "--seq-len", "4095", says=f"--seq-len 4095: {_CP_SPLIT}")
    assert "s.yaml" not in run("predict", str(path), "--seq-len", "4095").output


_STRAGGLERS = [
    (("--duration", "soon"), "--duration soon: not a time: 'soon'"),
    (("--duration", "0s"), "--duration 0s: must be positive"),
    (("--jitter", "normal:abc"), "--jitter normal:abc: the CV 'abc' is not a number"),
    (("--jitter", "bogus:0.1"), "--jitter bogus:0.1: unknown distribution 'bogus'"),
    (("--jitter", "lognormal:nan"), "--jitter lognormal:nan: the coefficient of variation"),
    (("--jitter", "exponential:2"), "--jitter exponential:2: a shifted exponential with cv 2"),
    (("--jitter", "normal:10"), "--jitter normal:10: a normal with cv 10 draws a negative time"),
    (("--local-steps", "0"), "--local-steps 0: at least 1 step between syncs"),
    (("--slow-rank", "0"), "--slow-rank 0.0: a slowdown factor must be finite and at least 1"),
    (("--slow-rank", "nan"), "--slow-rank nan: a slowdown factor"),
    (("--slow-rank", "inf"), "--slow-rank inf: a slowdown factor"),
    (("--link-factor", "0"), "--link-factor 0.0: a slowdown factor"),
    (("--link-factor", "2"), "--link-factor 2.0: degrades a --link; none given"),
    (("--link", ""), "--link '': give a link as A:B"),
    (("--link", "leaf0:nowhere"), "--link 'leaf0:nowhere': no such link in the job's cluster"),
    (("--tp", "3"), "--tp 3: tp x pp x cp = 3 x 1 x 1 does not divide the 64 GPUs"),
    (("--pp", "0"), "--pp 0: Input should be greater than or equal to 1"),
    (("--gpus", "0"), "--gpus 0: Input should be greater than or equal to 1"),
    (("--model", "nope"), "--model nope: unknown model 'nope'"),
    (("--cluster", "nope"), "--cluster nope: unknown topology 'nope'"),
    (("--global-batch", "7"), "--global-batch 7: 7 is not a multiple"),
    (("--micro-batch", "0"), "--micro-batch 0: Input should be"),
    (("--seq-len", "0"), "--seq-len 0: Input should be"),
]
_GOODPUT = [
    (("--gpus", "100000"), "--gpus 100000: 100000 GPUs requested"),
    (("--tp", "3"), "--tp 3: tp x pp x cp = 3 x 1 x 1 does not divide the 64 GPUs"),
    (("--zero", "5"), "--zero 5: Input should be 0, 1, 2 or 3"),
    (("--tokens", "0"), "--tokens 0.0: Input should be greater than 0"),
    (("--price-per-gpu-hour", "nan"), "--price-per-gpu-hour nan: Input should be a finite"),
    (("--recovery", "bogus"), "--recovery bogus: must be one of cold"),
    (("--interval", "soon"), "--interval soon: not a time"),
    (("--interval", "0s"), "--interval 0s: the checkpoint interval must be positive"),
    (("--spares", "-1"), "--spares -1: spares must not be negative"),
    (("--spare-target", "1.5"), "--spare-target 1.5: spare_target must be in (0, 1)"),
    *(((f"--{k}", "soon"), f"--{k} soon: not a time") for k in ("repair", "detect", "init")),
    *(((f"--{k}", "-1s"), f"--{k} -1s: not a time") for k in ("reschedule", "warmup")),
    (("--rate-scale", "0"), "--rate-scale 0.0: must be a positive, finite factor"),
    (("--rate-scale", "nan"), "--rate-scale nan: must be a positive, finite factor"),
    # failures so frequent that no restart outlasts the MTBF: was a ZeroDivisionError traceback
    (
        ("--rate-scale", "1e300"),
        "is not a finite number: an input is out of range (check --rate-scale",
    ),
    (("--monte-carlo", "-1"), "--monte-carlo -1: must not be negative"),
    (("--seed", "-1", "--monte-carlo", "2"), "--seed -1: must not be negative"),
    (("--seed", "3"), "--seed 3: seeds the --monte-carlo runs; none asked for"),
    (("--gpus", "64:128", "--tokens", "1e9", "--monte-carlo", "2"), "--monte-carlo 2: applies"),
    (("--recovery", "ring-rebuild", "--zero", "1"), "--recovery ring-rebuild: no recovery"),
    (("--recovery", "cold", "--spares", "2"), "--spares 2: cold recovery does not use it"),
    (("--recovery", "per-step", "--interval", "1h"), "--interval 1h: per-step recovery does"),
]


@pytest.mark.parametrize(
    "command,args,says",
    [("stragglers", *case) for case in _STRAGGLERS] + [("goodput", *case) for case in _GOODPUT],
)
def test_each_reliability_flag_names_itself(tmp_path, monkeypatch, command, args, says):
    """`stragglers --duration soon` said "not a time: 'soon'", `--tp 3` blamed default.yaml,
    `--rate-scale 0` printed an inf MTTI, `--seed 3` alone was ignored: each flag's bad value
    is one line naming the flag, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    plot = ("--plot", str(tmp_path / "g.png")) if command == "goodput" else ()
    result = run(command, *args, *plot)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()  # (refused() would take a nan given for a nan printed)
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output
    assert "Traceback" not in result.output and "default.yaml" not in result.output
    assert list(tmp_path.iterdir()) == []


_SIZING = [
    (("--recovery", "bogus"), "--recovery bogus: must be one of cold, hot-spare"),
    (("--checkpoint-interval", "soon"), "--checkpoint-interval soon: not a time: 'soon'"),
    (("--checkpoint-interval", "0s"), "--checkpoint-interval 0s: the checkpoint interval must"),
    (("--recovery", "hot-spare", "--spares", "-1"), "--spares -1: spares must not be negative"),
    (("--spare-target", "2"), "--spare-target 2.0: spare_target must be in (0, 1)"),
    (("--recovery", "in-memory", "--spare-target", "nan"), "--spare-target nan: spare_target"),
    (("--spares", "2"), "--spares 2: cold recovery does not use it"),  # cold is the default
    (("--recovery", "per-step", "--checkpoint-interval", "1h"), "--checkpoint-interval 1h: per"),
    (("--recovery", "in-memory", "--sync-save"), "--no-async-save: in-memory recovery does not"),
    (("--recovery", "none", "--async-save"), "--async-save: --recovery none prices no failures"),
    (("--deadline", "soon"), "--deadline soon: not a time: 'soon'"),
    (("--deadline", "-1d"), "--deadline -1d: not a time"),
    (("--budget", "nan"), "--budget nan: must be a positive, finite amount"),
    (("--objective", "bogus"), "--objective bogus: must be one of time-to-train"),
    (("--fabric", "nope"), "--fabric nope: unknown topology 'nope'"),
    (("--fabric", ","), "--fabric ,: empty: give a topology name"),
    (("--gpu", "nope"), "--gpu nope: unknown GPU 'nope'"),
    (("--gpus", "64:32"), "--gpus 64:32: HIGH must not be below LOW"),
    (("--gpus", "a:128"), "--gpus a:128: must be a positive count or LOW:HIGH, not 'a'"),
    (("--top", "5"), "--top 5: rows of one cluster's ranking; sizing shows every size"),
]


@pytest.mark.parametrize("args,says", _SIZING)
def test_each_sizing_flag_names_itself(tmp_path, monkeypatch, args, says):
    """`plan --gpus LOW:HIGH --checkpoint-interval soon` said "not a time: 'soon'", `--gpu nope`
    blamed default.yaml, `--spares 2` under cold recovery was ignored: each sweep-mode flag's
    bad value is one line naming the flag and value, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    files = ("--plot", "s.png", "--csv", "s.csv", "--html", "s.html")
    sweep = ("plan", "--gpus", "64:128", "--tokens", "1e9")
    result = run(*sweep, *files, *args)  # a later --gpus replaces the sweep's
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output
    assert "Traceback" not in result.output and "default.yaml" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_is_its_one_line_without_the_warnings_on_the_way(capsys):
    # --jitter lognormal:1e300 printed scipy's overflow warnings above its error line: held
    # while the command works, dropped when it is refused, shown when it succeeds
    import warnings

    import typer

    from commsim.report import terminal

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(typer.Exit), terminal.user_errors():
            warnings.warn("overflow encountered in multiply", RuntimeWarning, stacklevel=1)
            raise ValueError("--jitter lognormal:1e300: out of range")
    assert seen == []  # dropped with the refusal, not passed on to be shown
    err = capsys.readouterr().err
    assert err.strip() == "error: --jitter lognormal:1e300: out of range"
    with pytest.warns(RuntimeWarning, match="overflow"), terminal.user_errors():
        warnings.warn("overflow encountered in multiply", RuntimeWarning, stacklevel=1)


def test_a_slow_rank_near_the_largest_float_prices_without_overflow():
    # each layer's share of the step is taken before its seconds (step.predict): a 1e300x
    # straggler's step stays finite and throughput 0% with no numpy overflow on the way
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run("stragglers", "--slow-rank", "1e300", "--json")
    assert result.exit_code == 0, result.output
    wait = json.loads(result.stdout)["slow_rank"]["mitigations"][0]
    assert wait["name"] == "wait" and 0 < wait["throughput"] < 1e-290
