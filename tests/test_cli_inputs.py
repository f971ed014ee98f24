"""Bad input to predict, plan, collective, topo and jobs found by trying them as a new user
would (session 10): each is refused in one line naming the file or flag, the field and the
problem, exit 2, or was a flag accepted and then ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app

SCENARIO = "model: gpt2-xl\ncluster: aws-p4d\ngpus: 8\nglobal_batch: 8\nseq_len: 1024\n"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(*args: str, says: str) -> str:
    """The command exits 2 with one error line that contains `says`; the line."""
    result = run(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert says in lines[0], lines[0]
    return lines[0]


def _file(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_strategy_that_is_not_a_mapping_names_the_file_and_field(tmp_path):
    """`strategy: ring` was 'dictionary update sequence element #0 has length 1'."""
    path = _file(tmp_path, SCENARIO + "strategy: ring\n")
    refused("predict", path, says="s.yaml: strategy: expected a mapping of strategy fields")


def test_an_empty_scenario_path_is_refused_not_the_default():
    """`predict ''` ran the built-in scenario: the argument was accepted and ignored."""
    for command in ("predict", "plan"):
        refused(command, "", says="give a file name")


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """PyYAML kept the last of two `model:` (or `tp:`) keys silently: the scenario that ran was
    not the one the file seemed to say."""
    path = _file(tmp_path, SCENARIO + "model: llama2-7b\n")
    refused("predict", path, says="s.yaml: line 6: invalid YAML: duplicated key 'model' (first on")
    path = _file(tmp_path, SCENARIO + "strategy:\n  tp: 1\n  tp: 2\n", "t.yaml")
    refused(
        "plan", path, says="t.yaml: line 8: invalid YAML: duplicated key 'tp' (first on line 7)"
    )


def test_a_merged_key_may_still_be_overridden(tmp_path):
    """YAML's merge (`<<: *job`, as scenarios/jobs-meta-24k.yaml uses) brings keys the mapping
    may override: that is not a duplicate."""
    from commsim.spec_io import read_yaml

    path = _file(tmp_path, "a: &x {name: a, gpus: 8}\nb: {<<: *x, name: b}\n")
    assert read_yaml(path)["b"] == {"name": "b", "gpus": 8}


def test_true_where_a_number_goes_is_refused(tmp_path):
    """pydantic read `gpus: true` as 1 GPU and `tp: on` as tp 1; a yes/no field still takes
    yes, and reshard_after_forward (true, false or a name) still takes false."""
    path = _file(tmp_path, SCENARIO.replace("gpus: 8", "gpus: true"))
    refused("predict", path, says="s.yaml: gpus: true is a yes/no, not a number")
    path = _file(tmp_path, SCENARIO + "strategy: {tp: on}\n", "t.yaml")
    refused("predict", path, says="t.yaml: strategy.tp: true is a yes/no, not a number")
    path = _file(tmp_path, SCENARIO + "compute_efficiency: yes\n", "c.yaml")
    refused("predict", path, says="c.yaml: compute_efficiency: true is a yes/no, not a number")
    strategy = "strategy: {overlap: yes, zero: 3, reshard_after_forward: false}\n"
    result = run("predict", _file(tmp_path, SCENARIO + strategy, "ok.yaml"), "--json")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args,says",
    [
        (("predict", "--nccl-version", "abc"), "--nccl-version abc: not an NCCL version"),
        (("plan", "--nccl-algo", "bogus"), "--nccl-algo bogus: NCCL_ALGO='bogus': NCCL 2.30"),
        (("collective", "all-reduce", "--nccl-version", "0.1"), "--nccl-version 0.1: NCCL 0.1"),
        (("collective", "all-reduce", "--nccl-proto", "x"), "--nccl-proto x: NCCL_PROTO='x'"),
        (("collective", "all-reduce", "--backend", "mpi"), "--backend mpi: Input should be"),
        (("collective", "all-reduce", "--gpus", "100000"), "--gpus 100000: 100000 GPUs requested"),
        (("topo", "show", "aws-p4d", "--gpus", "0"), "--gpus 0: must be at least 1"),
        (("topo", "show", "aws-p4d", "--gpus", "2000"), "--gpus 2000: 2000 GPUs requested"),
    ],
)
def test_a_cluster_flag_is_blamed_not_the_cluster(args, says):
    """These named `what-if: cluster.nccl.version` or the cluster (`dgx-h100-ib: backend`), not
    the flag that set the value."""
    line = refused(*args, says=says)
    assert "what-if" not in line and "dgx-h100-ib:" not in line and "aws-p4d:" not in line


@pytest.mark.parametrize(
    "args,says",
    [
        (("--ps-shards", "0"), "--ps-shards 0: must be between 1 and the 8 ranks"),
        (("--ps-shards", "3", "--algorithm", "ring"), "--ps-shards 3: only the parameter server"),
        (("--ps-shards", "2", "--algorithm", "nccl"), "--algorithm nccl runs none for all-reduce"),
    ],
)
def test_ps_shards_is_refused_where_no_parameter_server_runs(args, says):
    """--ps-shards 0 was blamed on `--algorithm all`, and --ps-shards 3 with ring accepted and
    ignored; with the parameter server among the algorithms it still runs."""
    refused("collective", "all-reduce", "--gpus", "8", "--sizes", "1MiB", *args, says=says)
    ok = run("collective", "all-reduce", "--gpus", "8", "--sizes", "1MiB", "--ps-shards", "2")
    assert ok.exit_code == 0, ok.output


def test_an_unknown_placement_names_the_flag():
    """collective said `unknown placement 'x'` without the flag."""
    refused("collective", "all-reduce", "--placement", "x", says="--placement x: choose from")


def test_a_single_zero_size_is_refused_not_a_traceback():
    """`--sizes 0B` (one size, no range) skipped the range's check and divided by zero."""
    from commsim.units import UnitError, parse_size_range

    for text in ("0B", "0"):
        refused("collective", "all-reduce", "--sizes", text, says=f"--sizes: size range '{text}'")
    with pytest.raises(UnitError, match="0 < low <= high"):
        parse_size_range("0B")
    assert parse_size_range("1MiB") == (2.0**20, 2.0**20)


def test_a_size_that_is_not_whole_bytes_is_refused():
    """`--sizes 1.5B` was timed as 1.5 bytes (the JSON's `bytes`) and shown as `2 B`."""
    for text in ("1.5B", "0.3KiB:4KiB", "1B:2.5B"):
        refused("collective", "all-reduce", "--sizes", text, says="a whole number of bytes")
    ok = run("collective", "all-reduce", "--gpus", "8", "--sizes", "0.5KiB:1.5KiB", "--json")
    assert ok.exit_code == 0, ok.output


JOBS = """name: two
cluster: dgx-h100-ib
allocation: packed
jobs:
  - {name: a, model: llama2-7b, gpus: 16, global_batch: 32, seq_len: 1024}
  - {name: b, model: llama2-7b, gpus: 16, global_batch: 32, seq_len: 1024}
"""


def test_jobs_seed_is_refused_where_nothing_is_drawn(tmp_path):
    """--seed 3 under the packed allocation was accepted and ignored; --seed -1 (and a file's
    seed: -1) was blamed on the file's `jobs`."""
    path = _file(tmp_path, JOBS)
    refused("jobs", path, "--seed", "3", says="--seed 3: only the random allocation draws nodes")
    refused("jobs", path, "--seed", "-1", "--allocation", "random", says="--seed -1: must be a")
    refused("jobs", _file(tmp_path, JOBS + "seed: -1\n", "n.yaml"), says="n.yaml: seed: Input")


def test_two_jobs_of_one_name_are_refused(tmp_path):
    """Two jobs named `a` gave two rows `a` and two JSON jobs that could not be told apart."""
    path = _file(tmp_path, JOBS.replace("name: b", "name: a"))
    refused("jobs", path, says="s.yaml: jobs.1.name: 'a' is job 0's name too")


def test_an_unknown_allocation_names_its_value(tmp_path):
    refused("jobs", _file(tmp_path, JOBS), "--allocation", "x", says="--allocation x: choose from")


def test_a_bucket_cap_ddp_cannot_take_is_refused_naming_the_flag():
    """--bucket-mb 1e308 overflowed the bytes to inf: a numpy RuntimeWarning, then an error
    about `strategy.first_bucket_mb` that no flag sets. DDP's cap is int64 bytes."""
    result = run("predict", "--bucket-mb", "1e308")
    assert "RuntimeWarning" not in result.output
    refused("predict", "--bucket-mb", "1e308", says="--bucket-mb 1e+308: Input should be less")
    refused("plan", "--bucket-mb", "1e13", says="--bucket-mb 10000000000000.0: Input should be")


@pytest.mark.parametrize("flag,value", [("--seq-len", "77"), ("--tokens", "1000000000.0")])
def test_tokens_for_a_model_without_a_sequence_are_refused(flag, value):
    """ResNet-50 took --seq-len 77 and --tokens 1e9 and ignored both (no time to train)."""
    for command in ("predict", "plan"):
        says = f"{flag} {value}: resnet50 has no sequence"
        refused(command, "scenarios/resnet50-10gbe.yaml", "--gpus", "8", flag, value, says=says)


@pytest.mark.parametrize("flag", ["--no-flash-attention", "--sequence-parallel"])
def test_attention_flags_for_a_model_without_attention_are_refused(flag):
    """ResNet-50 took --no-flash-attention and --(no-)sequence-parallel and ignored them."""
    for command in ("predict", "plan"):
        args = (command, "scenarios/resnet50-10gbe.yaml", "--gpus", "8", flag)
        refused(*args, says=f"{flag}: resnet50 has no sequence")


def test_a_price_without_tokens_is_refused(tmp_path):
    """--price-per-gpu-hour without tokens was accepted and ignored: no cost without a time
    to train. With tokens (a flag or the scenario's) it prices them."""
    for command in ("predict", "plan"):
        args = (command, "--gpus", "8", "--global-batch", "8", "--price-per-gpu-hour", "3")
        refused(*args, says="--price-per-gpu-hour 3.0: prices the GPU-hours of training on")
    path = _file(tmp_path, SCENARIO + "tokens: 1e9\n")
    result = run("predict", path, "--price-per-gpu-hour", "3", "--json")
    assert result.exit_code == 0, result.output


SIZING = ("plan", "--gpus", "8:16", "--tokens", "1e9", "--global-batch", "64")


def test_an_empty_fabric_is_refused_not_the_scenario_cluster():
    """`--fabric ''` sized the scenario's cluster: the flag was accepted and ignored."""
    refused(*SIZING, "--fabric", "", says="--fabric '': empty: give a topology name")


def test_a_fabric_named_twice_is_refused():
    """`--fabric aws-p4d,aws-p4d` sized it twice: every row twice, two picks marked."""
    refused(*SIZING, "--fabric", "aws-p4d,aws-p4d", says="--fabric aws-p4d,aws-p4d: aws-p4d named")


def test_cluster_beside_fabric_is_refused():
    """`--cluster dgx-h100-ib --fabric aws-p4d` sized aws-p4d alone: --cluster was ignored."""
    args = (*SIZING, "--fabric", "aws-p4d", "--cluster", "dgx-h100-ib")
    refused(*args, says="--cluster dgx-h100-ib: sizing runs on the --fabric topologies")


@pytest.mark.parametrize(
    "args,says",
    [
        (("predict", "--profile", ""), "--profile '': String should have at least 1 character"),
        (("plan", "--deepspeed", ""), "--deepspeed '': String should have at least 1 character"),
        (("collective", "all-reduce", "--profile", ""), "--profile '': empty path: give a file"),
    ],
)
def test_an_empty_profile_or_deepspeed_path_is_refused(args, says):
    """An empty --profile or --deepspeed (or `profile: ''` in a scenario) was accepted and
    ignored: no profile applied, no config read."""
    refused(*args, says=says)


def test_an_empty_profile_in_a_scenario_is_refused(tmp_path):
    path = _file(tmp_path, SCENARIO + "profile: ''\n")
    refused("predict", path, says="s.yaml: profile: String should have at least 1 character")


@pytest.mark.parametrize(
    "flag,says",
    [("--gpu", "--gpu '': unknown GPU ''"), ("--objective", "--objective '': must be one of")],
)
def test_an_empty_sizing_flag_is_refused_not_the_default(flag, says):
    """`--gpu ''` sized the fabric's own GPU and `--objective ''` picked by time to train:
    both accepted and ignored."""
    refused(*SIZING, flag, "", says=says)


@pytest.mark.parametrize(
    "args,says",
    [
        (("collective", "all-reduce", "--nccl-version", "2.21"), "--nccl-version 2.21: set NCCL"),
        (("predict", "--nccl-algo", "ring"), "--nccl-algo ring: set NCCL's tuning, but the"),
        (("plan", "--nccl-proto", "LL"), "--nccl-proto LL: set NCCL's tuning, but the collec"),
    ],
)
def test_nccl_flags_under_gloo_are_refused(args, says):
    """Under --backend gloo the NCCL flags were accepted and ignored (the JSON's nccl_* null)."""
    refused(*args, "--backend", "gloo", says=says)
    assert "run on gloo" in run(*args, "--backend", "gloo").output


@pytest.mark.parametrize(
    "args",
    [
        ("collective", "all-gather", "--gpus", "8", "--nccl-algo", "tree"),
        ("predict", "--gpus", "8", "--global-batch", "8", "--zero", "1", "--nccl-algo", "tree"),
    ],
)
def test_nothing_left_to_run_under_nccl_algo_names_that_flag(args):
    """collective blamed `--algorithm all` and predict named no flag when --nccl-algo left
    NCCL nothing to run (NCCL's own "No algorithm/protocol available")."""
    line = refused(*args, says="--nccl-algo tree: NCCL runs no ")
    assert "--algorithm" not in line


@pytest.fixture
def bars(monkeypatch):
    """terminal.progress replaced by a bar that records its label and each advance."""
    from commsim.report import terminal

    made = []

    class Bar:
        def __init__(self, total, label):
            made.append(label)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def advance(self, _):
            made.append("advanced")

    monkeypatch.setattr(terminal, "progress", Bar)
    return made


def test_topo_show_plot_has_a_progress_bar(tmp_path, bars):
    """Drawing colossus-class-131k takes about 20 s, and ran without a progress bar."""
    result = run("topo", "show", "aws-p4d", "--gpus", "16", "--plot", str(tmp_path / "t.png"))
    assert result.exit_code == 0, result.output
    assert bars == ["drawing 16 GPUs", "advanced"] and (tmp_path / "t.png").exists()


def test_predict_has_a_progress_bar(bars):
    """Pricing a step takes about a second at 16,384 GPUs, and showed nothing meanwhile."""
    assert run("predict", "--gpus", "8", "--global-batch", "8").exit_code == 0
    assert bars == ["pricing the step", "advanced"]


def test_plan_with_fsdp_shard_pinned_searches_the_layouts_it_applies_to():
    """`plan --fsdp-shard 4` failed with numpy's 'cannot reshape array of size 8 into shape
    (8,0,4,1,1)': the pin was applied to every layout, dp 1 and ZeRO 0-2 included."""
    import json

    result = run("plan", "--gpus", "8", "--global-batch", "64", "--fsdp-shard", "4", "--json")
    assert result.exit_code == 0, result.output
    rows = [c["strategy"] for c in json.loads(result.stdout)["candidates"]]
    assert rows and all(s["zero"] == 3 and s["fsdp_shard"] == 4 for s in rows)


def test_plan_tp_overlap_pinned_is_kept_or_refused():
    """`plan --tp-overlap` ranked gpt2-xl's tp 1 layouts (25 heads: no tp > 1) without it:
    the pin silently dropped. Now the layouts it applies to, or predict's refusal."""
    import json

    refused("plan", "--gpus", "8", "--global-batch", "64", "--tp-overlap", says="--tp-overlap:")
    args = ("--model", "llama2-7b", "--cluster", "dgx-h100-ib", "--global-batch", "64")
    result = run("plan", "--gpus", "16", *args, "--tp-overlap", "--json")
    assert result.exit_code == 0, result.output
    rows = [c["strategy"] for c in json.loads(result.stdout)["candidates"]]
    assert rows and all(s["tp_overlap"] and s["tp"] > 1 for s in rows)


def test_plan_refuses_fp8_pinned_on_a_gpu_without_it():
    """`plan --precision fp8` on A100s ranked 200 'fp8' layouts that predict refuses."""
    args = ("plan", "--gpus", "8", "--global-batch", "64", "--precision", "fp8")
    refused(*args, says="--precision fp8: a100-40gb has no FP8 tensor cores")


def test_plan_fsdp_shard_no_layout_takes_says_why():
    """`plan --fsdp-shard 3` said 'hybrid sharding is ZeRO-3 (FSDP)' (the scenario's zero 0)
    though the search takes ZeRO-3 for it: the reason is that 3 divides no dp."""
    args = ("plan", "--gpus", "8", "--global-batch", "64", "--fsdp-shard", "3")
    refused(*args, says="--fsdp-shard 3: 3 does not divide the data-parallel degree 8")


def test_a_claimed_figure_of_zero_or_below_is_refused(tmp_path):
    """`claimed: 0` printed 'does not hold (infx)' (and null in the JSON), `claimed: -56` a
    negative time and a factor of -2.06x: a figure with a relative tolerance is above 0."""
    seed = Path("scenarios/seeds/003-175b-700gb-100gbps.yaml").read_text()
    for bad in ("0", "-56"):
        path = _file(tmp_path, seed.replace("claimed: 56,", f"claimed: {bad},"), f"c{bad}.yaml")
        refused("claims", path, says="claim.checks.1.claimed: Input should be greater than 0")


def test_a_yes_no_among_a_jobs_node_ids_is_refused(tmp_path):
    """`nodes: [true]` passed the int check (bool is an int) and raised numpy's IndexError
    with a traceback."""
    path = _file(tmp_path, JOBS.replace("seq_len: 1024}", "seq_len: 1024, nodes: [true]}", 1))
    refused("jobs", path, says="s.yaml: jobs.0.nodes: expected a list of node ids")


def test_a_json_key_given_twice_is_refused(tmp_path):
    """Two `zero_optimization` objects in a ds_config.json: json kept the second silently."""
    path = _file(tmp_path, '{"zero_optimization": {"stage": 2}, "zero_optimization": {}}', "d.json")
    refused("predict", "--deepspeed", path, says="d.json: zero_optimization: given twice")


def test_a_config_json_whose_shape_is_wrong_names_itself(tmp_path):
    """`--model bad.json` (32 heads, hidden 4097) was blamed on scenarios/default.yaml."""
    import json

    config = json.loads(Path("tests/data/hf/meta-llama-3-8b/config.json").read_text())
    path = _file(tmp_path, json.dumps(config | {"hidden_size": 4097}), "bad.json")
    args = ("--cluster", "dgx-h100-ib", "--gpus", "8", "--global-batch", "8")
    line = refused("predict", "--model", path, *args, says="bad.json: model.heads: 32 does not")
    assert "default.yaml" not in line


@pytest.mark.parametrize(
    "args",
    [
        ("predict", "--plot", "{d}/x.png", "--html", "{d}/x.png"),
        ("plan", "--plot", "{d}/x.png", "--csv", "{d}/./x.png"),
        ("collective", "all-reduce", "--gpus", "8", "--html", "{d}/x.out", "--csv", "{d}/x.out"),
    ],
)
def test_two_output_flags_naming_one_file_are_refused(tmp_path, args):
    """`--plot x.png --html x.png` wrote the plot, then the page over it: the plot asked for
    was lost. Now refused before any work, nothing written."""
    args = tuple(a.format(d=tmp_path) for a in args)
    refused(*args, says="writes that file too; give each its own")
    assert list(tmp_path.iterdir()) == []


def test_an_output_over_an_input_file_is_refused(tmp_path):
    """`predict s.yaml --csv s.yaml` replaced the scenario with the CSV row; `collective
    --cluster c.yaml --html c.yaml` the cluster file. Refused, the input left as it was."""
    path = _file(tmp_path, SCENARIO)
    refused("predict", path, "--csv", path, says=f"--csv {path!r}: this run reads that file")
    refused("plan", path, "--html", path, says="this run reads that file; give another name")
    assert Path(path).read_text() == SCENARIO


@pytest.mark.parametrize(
    "args,says",
    [
        (("--gpus", "3"), "--gpus 3: 512 is not a multiple of data-parallel degree x micro_batch"),
        (("--gpus", "12", "--tp", "8"), "--gpus 12, --tp 8: tp x pp x cp = 8 x 1 x 1 does not"),
    ],
)
def test_a_split_the_gpus_flag_breaks_names_that_flag(args, says):
    """`predict --gpus 3` blamed scenarios/default.yaml's global_batch, which is fine on the
    scenario's 64 GPUs: the flag that broke the split is named with the others given."""
    line = refused("predict", *args, says=says)
    assert "default.yaml" not in line


def test_tokens_fewer_than_one_step_are_refused(tmp_path):
    """--tokens 1e-3 printed a time to train of 16.11 ns: less than one step's tokens."""
    refused("predict", "--tokens", "1e-3", says="--tokens 0.001: 0.001 is less than one step's")
    path = _file(tmp_path, SCENARIO + "tokens: 8000\n")  # one step: 8 x 1,024 = 8,192
    refused("predict", path, says="s.yaml: tokens: 8000 is less than one step's 8,192 tokens")
    assert run("predict", _file(tmp_path, SCENARIO + "tokens: 8192\n", "ok.yaml")).exit_code == 0
