"""Calibration files: the results JSONL, nccl-tests logs, profiles, and the CLI's handling
of bad input (one line naming the file and line, exit 2, nothing overwritten)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from commsim.calibrate.ncclt import nccl_version, parse_log
from commsim.calibrate.records import append_records, read_results, record_line
from commsim.cli.calibrate import calibrate_app
from commsim.files import write_atomic
from commsim.profile import Profile, load_profile, profile_yaml
from commsim.specs import SpecError

DATA = Path(__file__).parent / "data"
ALL_REDUCE = DATA / "all_reduce_perf_2x8.log"
ALL_GATHER = DATA / "all_gather_perf_dgx.log"
TWO_TESTS = DATA / "broadcast_sendrecv_4x1.log"


def _meta(run: str = "r1", world: int = 2) -> dict:
    ranks = [{"rank": r, "host": "h0", "local_rank": r} for r in range(world)]
    return {
        "kind": "meta",
        "run": run,
        "source": "harness",
        "backend": "gloo",
        "world_size": world,
        "ranks": ranks,
    }


def _coll(run: str = "r1", size: float = 1024.0, t: float = 1e-4) -> dict:
    return {"kind": "collective", "run": run, "op": "all-reduce", "group": [0, 1]} | {
        "bytes": size,
        "time_s": t,
    }


def _ddp(run: str = "r1", **hook) -> dict:
    times = {"compute_s": 0.03, "optimizer_s": 0.006, "step_s": 0.04, "exposed_comm_s": 0.01}
    return {"kind": "ddp", "run": run, "bucket_mb": 1, "first_bucket_mb": 1, "repeats": 5} | (
        times | hook
    )


def _write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(record_line(r) for r in records) + tail)
    return path


# --------------------------------------------------------------------------- JSONL


def test_results_roundtrip(tmp_path):
    path = _write(tmp_path / "r.jsonl", [_meta(), _coll(size=8), _coll(size=16)])
    res = read_results(path)
    (run,) = res.runs.values()
    assert run.meta.world_size == 2 and run.meta.hosts == ["h0"]
    assert [c.bytes for _, c in run.collectives] == [8, 16]
    assert [line for line, _ in run.collectives] == [2, 3]
    assert res.backends == {"gloo"}


@pytest.mark.parametrize(
    ("tail", "line", "words"),
    [
        ('{"kind": "collective", "run": "r1", "op": "all-re', 3, "invalid JSON (truncated line?)"),
        ('{"kind": "collective", "run": "r1", "op": "all-reduce", "group": [0]}\n', 3, "time_s"),
        ('{"kind": "collective", "run": "r1", "op": "all-reduce"}\n', 3, "group: Field required"),
        ('{"kind": "collective", "run": "r1", "op": "gather", "group": [0]}\n', 3, "op"),
        ('{"kind": "banana", "run": "r1"}\n', 3, "unknown record kind"),
        ("[1, 2]\n", 3, "expected a JSON object"),
        (record_line(_coll(run="r9")), 3, "before its meta"),
        (record_line(_meta()), 3, "starts twice"),
        (record_line(_coll() | {"group": [0, 5]}), 3, "outside world size"),
        (record_line(_ddp() | {"compression": "zip"}), 3, "compression: unknown compressor"),
    ],
)
def test_bad_results_lines_name_the_line(tmp_path, tail, line, words):
    path = _write(tmp_path / "bad.jsonl", [_meta(), _coll()], tail)
    with pytest.raises(SpecError) as err:
        read_results(path)
    assert f"bad.jsonl: line {line}:" in str(err.value)
    assert words in str(err.value)


def test_ddp_records_keep_their_comm_hook(tmp_path):
    plain, hooked = _ddp(), _ddp(compression="POWERSGD:2", error_feedback=True, overlap=False)
    (run,) = read_results(_write(tmp_path / "d.jsonl", [_meta(), plain, hooked])).runs.values()
    assert [(d.compression, d.error_feedback, d.overlap) for d in run.ddp] == [
        ("none", False, True),
        ("powersgd:2", True, False),
    ]


def test_meta_needs_every_rank_once(tmp_path):
    bad = _meta() | {"ranks": [{"rank": 0, "host": "a"}, {"rank": 0, "host": "b"}]}
    with pytest.raises(SpecError, match="line 1.*each of 0..1 once"):
        read_results(_write(tmp_path / "m.jsonl", [bad]))


def test_append_never_truncates_and_heals_a_cut_line(tmp_path):
    path = _write(tmp_path / "r.jsonl", [_meta(), _coll()], '{"kind": "coll')
    before = path.read_text()
    append_records(path, [_coll(size=2048)])
    text = path.read_text()
    assert text.startswith(before)  # nothing lost
    assert text.endswith(record_line(_coll(size=2048)))  # the new record is whole
    with pytest.raises(SpecError, match="line 3: invalid JSON"):
        read_results(path)  # the cut line is still reported, by its own number


def test_write_atomic_replaces_whole(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("old")
    write_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]  # no temporary left


# --------------------------------------------------------------------------- nccl-tests


def test_parse_all_reduce_log():
    records = parse_log(ALL_REDUCE)
    meta, rows = records[0], records[1:]
    assert meta["kind"] == "meta" and meta["backend"] == "nccl"
    assert meta["world_size"] == 16
    assert meta["versions"] == {"nccl-tests": "2.18.3", "nccl": "2.29.7"}
    assert {r["host"] for r in meta["ranks"]} == {"node-a01", "node-a02"}
    assert [r["local_rank"] for r in meta["ranks"]][:9] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    assert all(r["op"] == "all-reduce" and r["group"] == list(range(16)) for r in rows)
    first, last = rows[0], rows[-1]
    assert first["bytes"] == 8 and first["time_s"] == pytest.approx(116.58e-6)
    assert last["bytes"] == 134217728 and last["time_s"] == pytest.approx(849.13e-6)
    assert last["algbw_Bps"] == pytest.approx(158.06e9)
    assert last["busbw_Bps"] == pytest.approx(296.37e9)
    assert last["repeats"] == 20
    assert len(rows) == 25  # 8 B .. 128 MiB
    res_meta_ok = read_results_from(records)
    assert res_meta_ok == 16


def read_results_from(records: list[dict]) -> int:
    """The records validate as a results file would (returns the world size)."""
    from commsim.calibrate.records import MetaRecord, parse_record

    recs = [parse_record(r, "mem", i) for i, r in enumerate(records, 1)]
    return next(r for r in recs if isinstance(r, MetaRecord)).world_size


def test_parse_older_log_takes_op_from_file_name():
    records = parse_log(ALL_GATHER)
    meta = records[0]
    assert meta["world_size"] == 8 and meta["versions"]["nccl-tests"] == "unknown"
    assert {r["op"] for r in records[1:]} == {"all-gather"}
    assert records[1]["bytes"] == 32  # nccl-tests skips sizes under one element a rank


def test_parse_two_tests_in_one_log():
    records = parse_log(TWO_TESTS)
    metas = [r for r in records if r["kind"] == "meta"]
    assert len(metas) == 2 and metas[0]["run"] != metas[1]["run"]
    ops = [
        [r["op"] for r in records if r.get("run") == m["run"] and r["kind"] != "meta"]
        for m in metas
    ]
    assert set(ops[0]) == {"broadcast"} and set(ops[1]) == {"send-recv"}
    assert len(ops[0]) == len(ops[1]) == 15  # 1 KiB .. 16 MiB
    assert metas[0]["versions"]["nccl"] == "2.23.4"


def test_nccl_version_codes():
    assert nccl_version(23003) == "2.30.3"
    assert nccl_version(21903) == "2.19.3"
    assert nccl_version(2804) == "2.8.4"


def _edit(src: Path, dst: Path, old: str, new: str, count: int = 1) -> Path:
    text = src.read_text()
    assert old in text
    dst.write_text(text.replace(old, new, count))
    return dst


def _row_line(log: Path, size: int) -> tuple[int, str]:
    """(line number, text) of a log's data row for `size` bytes."""
    for n, line in enumerate(log.read_text().splitlines(), start=1):
        if line.split()[:1] == [str(size)]:
            return n, line
    raise AssertionError(f"no {size} B row")


def test_wrong_elements_are_refused(tmp_path):
    n, row = _row_line(ALL_REDUCE, 33554432)
    bad = _edit(ALL_REDUCE, tmp_path / "all_reduce_perf.log", row, row[:-1] + "7")
    with pytest.raises(SpecError, match=rf"line {n}: 7 wrong elements at 33554432 B"):
        parse_log(bad)


def test_truncated_row_and_truncated_file(tmp_path):
    lines = ALL_REDUCE.read_text().splitlines()
    cut = tmp_path / "all_reduce_perf.log"
    cut.write_text("\n".join(lines[:40] + [lines[40][:60]]) + "\n")
    with pytest.raises(SpecError, match=r"line 41: truncated row: 6 of 13 columns"):
        parse_log(cut)
    cut.write_text("\n".join(lines[:45]) + "\n")
    with pytest.raises(SpecError, match=r"line 45: the log ends inside a results table"):
        parse_log(cut)


def test_malformed_row(tmp_path):
    n, row = _row_line(ALL_REDUCE, 65536)
    time_us = row.split()[5]
    bad = _edit(ALL_REDUCE, tmp_path / "x_all_reduce_perf.log", row, row.replace(time_us, "9x.1"))
    with pytest.raises(SpecError, match=rf"line {n}: malformed row"):
        parse_log(bad)


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        (5, "nan", "times nan / "),
        (9, "inf", "/ inf us must be positive and finite"),
        (6, "nan", "algbw nan / busbw"),
        (0, "-65536", "size -65536 B"),  # a signed row is refused, not skipped as chatter
    ],
)
def test_rows_with_numbers_that_are_no_measurement(tmp_path, column, value, says):
    n, row = _row_line(ALL_REDUCE, 65536)
    tokens = row.split()
    tokens[column] = value
    bad = _edit(ALL_REDUCE, tmp_path / "all_reduce_perf.log", row, "  ".join(tokens))
    with pytest.raises(SpecError, match=rf"line {n}: .*{re.escape(says)}"):
        parse_log(bad)


def test_unknown_versions_and_formats(tmp_path):
    v3 = _edit(ALL_REDUCE, tmp_path / "a.log", "version 2.18.3", "version 3.0.0")
    with pytest.raises(SpecError, match=r"line 2: nccl-tests version 3.0.0: this reader knows 2.x"):
        parse_log(v3)
    # nccl-tests before 2.10 printed no root column and an `error` column
    old = "    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
    older = _edit(
        ALL_GATHER,
        tmp_path / "all_gather_perf.log",
        old,
        "     time   algbw   busbw  error     time   algbw   busbw  error",
    )
    with pytest.raises(SpecError, match=r"line 14: unsupported nccl-tests table"):
        parse_log(older)


def test_log_without_a_test_name_needs_op(tmp_path):
    anon = tmp_path / "run7.log"
    anon.write_text(ALL_GATHER.read_text())
    with pytest.raises(SpecError, match="cannot tell which test"):
        parse_log(anon)
    assert {r["op"] for r in parse_log(anon, op="all-gather")[1:]} == {"all-gather"}


def test_op_flag_that_contradicts_the_log(tmp_path):
    """--op broadcast on a log that says it ran all_reduce_perf imported 25 all-reduce
    timings as broadcasts; the help says --op is for a log that does not say."""
    with pytest.raises(SpecError, match=r"--op broadcast: .*line 2\) says it tests all-reduce"):
        parse_log(ALL_REDUCE, op="broadcast")
    assert {r["op"] for r in parse_log(ALL_REDUCE, op="all-reduce")[1:]} == {"all-reduce"}


def test_not_an_nccl_tests_log(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n# just a comment\n")
    with pytest.raises(SpecError, match="no nccl-tests results table"):
        parse_log(junk)


# --------------------------------------------------------------------------- CLI


runner = CliRunner()


def test_cli_import_appends_and_refuses_twice(tmp_path):
    out = tmp_path / "results.jsonl"
    ok = runner.invoke(
        calibrate_app, ["import-nccl-tests", str(ALL_REDUCE), str(TWO_TESTS), "--out", str(out)]
    )
    assert ok.exit_code == 0, ok.output
    before = out.read_text()
    assert len(read_results(out).runs) == 3
    again = runner.invoke(calibrate_app, ["import-nccl-tests", str(ALL_REDUCE), "--out", str(out)])
    assert again.exit_code == 2
    assert "is already imported" in again.output
    assert out.read_text() == before


def test_cli_import_bad_log_writes_nothing(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_text(record_line(_meta()))
    before = out.read_text()
    bad = _edit(ALL_REDUCE, tmp_path / "all_reduce_perf.log", "version 2.18.3", "version 9.1")
    result = runner.invoke(
        calibrate_app, ["import-nccl-tests", str(ALL_GATHER), str(bad), "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "all_reduce_perf.log: line 2:" in result.output
    assert "Traceback" not in result.output
    assert out.read_text() == before


def test_a_run_placed_on_a_cluster_it_cannot_fit_names_the_file_and_line(tmp_path):
    """Two ranks on one host of a one-GPU-a-node cluster: the error named the run id alone,
    not the results file and line that hold it."""
    from commsim.calibrate.testbed.spec import cluster_spec, load_testbed

    cluster = tmp_path / "c.yaml"  # one host a node, one 'GPU' a host
    spec = cluster_spec(load_testbed("testbeds/2x2-oversub.yaml"))
    cluster.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    path = _write(tmp_path / "r.jsonl", [_meta(), _coll()])  # both ranks on host h0
    result = runner.invoke(calibrate_app, ["validate", str(path), "--cluster", str(cluster)])
    assert result.exit_code == 2, result.output
    assert f"{path}: line 1 (run r1): placement: host 'h0' ran 2 ranks" in result.output


def test_results_with_a_repeat_count_below_one(tmp_path):
    """A collective measured -2 times was read as it stood."""
    path = _write(tmp_path / "r.jsonl", [_meta(), _coll() | {"repeats": -2}])
    with pytest.raises(SpecError, match="line 2: bad collective record: repeats: Input should be"):
        read_results(path)


@pytest.mark.parametrize("line", ['"time_s":Infinity', '"bytes":NaN', '"times_s":[1e-4,NaN]'])
def test_results_with_a_number_that_is_not_finite(tmp_path, line):
    """Python's json reads Infinity and NaN: a record holding one is refused with its line
    and field, never fitted (inf gave RuntimeWarnings and 'nothing to fit') nor printed
    (validate's table showed 'inf s')."""
    good = record_line(_coll()).rstrip("}\n")
    path = _write(tmp_path / "r.jsonl", [_meta()], good + "," + line + "}\n")
    field = line.split('"')[1]
    with pytest.raises(SpecError, match=rf"line 2: bad collective record: {field}.*finite"):
        read_results(path)


def test_cli_fit_bad_results_line_exit_2(tmp_path):
    results = _write(tmp_path / "r.jsonl", [_meta(), _coll()], "{oops\n")
    profile = tmp_path / "p.yaml"
    profile.write_text("keep me")
    result = runner.invoke(
        calibrate_app, ["fit", str(results), "--cluster", "dgx-h100-ib", "-o", str(profile)]
    )
    assert result.exit_code == 2
    assert "r.jsonl: line 3: invalid JSON" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert profile.read_text() == "keep me"


def _nccl_cluster(tmp_path: Path) -> Path:
    """Two 8-GPU nodes on one leaf: what the all_reduce log ran on."""
    path = tmp_path / "two-nodes.yaml"
    path.write_text(
        """
name: two-h100-nodes
nodes: 2
node:
  gpu: h100
  gpus_per_node: 8
  interconnect: nvswitch
  intra_latency: 2us
  pcie_bandwidth: 64GB/s
  nics: {count: 8, bandwidth: 400Gbps, latency: 3us}
fabric:
  kind: infiniband
  nodes_per_leaf: 2
  link_latency: 100ns
  switch_latency: 200ns
"""
    )
    return path


def _fitted_nccl_logs(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """Synthetic nccl-tests logs of NCCL 2.29.7 on two H100 nodes whose network steps take
    1.3 x NCCL's latencies, NVLink steps 0.8 x, and whose ring channels carry 25 GB/s on
    one node and 40 GB/s across (NCCL's search: 30 and 48); the cluster file as NCCL
    would see it; the results file they import to."""
    from synth_nccl import two_h100_nodes, write_logs

    spec = two_h100_nodes()
    true = spec.nccl.model_copy(
        update={
            "latency_scale": {"net": 1.3, "nvlink": 0.8},
            "channel_bandwidth_intra": 25e9,
            "channel_bandwidth_inter": 40e9,
        }
    )
    logs = write_logs(tmp_path, spec.model_copy(update={"nccl": true}))
    cluster = tmp_path / "two-nodes.yaml"
    cluster.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    out = tmp_path / "results.jsonl"
    result = runner.invoke(calibrate_app, ["import-nccl-tests", *map(str, logs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, cluster, logs


def test_cli_fit_and_validate_nccl_tests(tmp_path):
    out, cluster, _ = _fitted_nccl_logs(tmp_path)
    prof = tmp_path / "profile.yaml"
    fit = runner.invoke(
        calibrate_app, ["fit", str(out), "--cluster", str(cluster), "-o", str(prof), "--json"]
    )
    assert fit.exit_code == 0, fit.output
    doc = json.loads(fit.stdout)
    nccl = doc["nccl"]
    assert doc["backend"] == "nccl" and nccl["version"] == "2.29.7"  # what the logs ran
    assert set(nccl["fitted"]) == {
        "latency_scale.nvlink",
        "latency_scale.net",
        "channel_bandwidth_intra",
        "channel_bandwidth_inter",
    }
    # the logs follow the model with 2% noise: the fit finds the parameters again
    assert nccl["latency_scale"]["net"] == pytest.approx(1.3, rel=0.03)
    assert nccl["latency_scale"]["nvlink"] == pytest.approx(0.8, rel=0.03)
    assert nccl["channel_bandwidth_intra_Bps"] == pytest.approx(25e9, rel=0.04)
    assert nccl["channel_bandwidth_inter_Bps"] == pytest.approx(40e9, rel=0.04)
    lo, hi = nccl["latency_scale_ci"]["net"]
    assert lo < nccl["latency_scale"]["net"] < hi
    profile = load_profile(prof)
    assert profile.cluster == "two-h100-nodes" and profile.tiers == {}
    assert profile.algorithms["all-reduce"] == "nccl"
    plot = tmp_path / "v.png"
    val = runner.invoke(
        calibrate_app,
        [
            "validate",
            str(out),
            "--profile",
            str(prof),
            "--cluster",
            str(cluster),
            "--json",
            "--plot",
            str(plot),
        ],
    )
    assert val.exit_code == 0, val.output
    doc = json.loads(val.stdout)
    assert len(doc["rows"]) == 3 * 28
    assert {"predicted_s", "measured_s", "error"} <= set(doc["rows"][0])
    assert doc["median_abs_pct_error"] < 2.5 and doc["max_abs_pct_error"] < 8
    assert plot.stat().st_size > 1000
    # the table names each parameter
    table = runner.invoke(calibrate_app, ["fit", str(out), "--cluster", str(cluster), "-o",
                                          str(tmp_path / "p2.yaml")])  # fmt: skip
    assert table.exit_code == 0 and "latency_scale.net" in table.output


def test_an_nccl_fit_says_what_it_could_not_determine(tmp_path):
    # only the one-node all-gather: nothing crosses the network, so the network latency
    # factor and the multi-node channel bandwidth keep NCCL's values
    from synth_nccl import two_h100_nodes

    from commsim.calibrate.fit import fit_profile
    from commsim.calibrate.ncclt import parse_log
    from commsim.calibrate.records import read_results

    _, _, logs = _fitted_nccl_logs(tmp_path)
    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps(r) + "\n" for r in parse_log(logs[2])))
    profile = fit_profile(read_results([str(one)]), two_h100_nodes()).profile
    assert set(profile.nccl.fitted) == {"latency_scale.nvlink", "channel_bandwidth_intra"}
    assert profile.nccl.channel_bandwidth_inter_Bps is None and "net" not in (
        profile.nccl.latency_scale
    )


def test_cli_validate_profile_on_another_cluster_of_the_same_classes(tmp_path):
    out = tmp_path / "results.jsonl"
    runner.invoke(calibrate_app, ["import-nccl-tests", str(ALL_REDUCE), "--out", str(out)])
    cluster = _nccl_cluster(tmp_path)
    prof = tmp_path / "p.yaml"
    runner.invoke(calibrate_app, ["fit", str(out), "--cluster", str(cluster), "-o", str(prof)])
    # the same GPUs and fabric under another name and node count: the profile travels
    other = tmp_path / "other.yaml"
    text = cluster.read_text().replace("name: two-h100-nodes", "name: elsewhere")
    other.write_text(text.replace("nodes: 2\n", "nodes: 4\n"))
    ok = runner.invoke(
        calibrate_app, ["validate", str(out), "--profile", str(prof), "--cluster", str(other)]
    )
    assert ok.exit_code == 0, ok.output
    assert "carried over from 'two-h100-nodes'" in ok.output
    # other GPUs: another class, refused naming it
    a100 = tmp_path / "a100.yaml"
    a100.write_text(text.replace("gpu: h100", "gpu: a100"))
    result = runner.invoke(
        calibrate_app, ["validate", str(out), "--profile", str(prof), "--cluster", str(a100)]
    )
    assert result.exit_code == 2
    assert "p.yaml: hardware.intra-node: fitted on h100 GPUs over nvswitch, but cluster " in (
        result.output
    )


def test_profile_yaml_roundtrip_keeps_infinite_bounds(tmp_path):
    prof = Profile.model_validate(
        {
            "cluster": "c",
            "backend": "gloo",
            "hardware": {"intra-node": "h100 GPUs over nvswitch"},
            "tiers": {
                "intra-node": {
                    "alpha_s": 1e-5,
                    "alpha_ci_s": [9e-6, 1.1e-5],
                    "efficiency": 0.9,
                    "efficiency_ci": [0.5, float("inf")],
                    "line_rate_Bps": 1e9,
                    "points": 10,
                    "fitted": ["alpha", "bandwidth"],
                }
            },
            "algorithms": {"all-reduce": "ring"},
            "provenance": {
                "files": ["f"],
                "runs": ["r"],
                "date": "d",
                "points": 10,
                "commsim": "0",
            },
        }
    )
    path = tmp_path / "p.yaml"
    write_atomic(path, profile_yaml(prof))
    assert load_profile(path) == prof
    assert prof.tiers["intra-node"].bandwidth_Bps == pytest.approx(0.9e9)


def test_profile_with_bad_field_names_file_and_field(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("format: 2\ncluster: c\nbackend: gloo\ntiers: {intra-node: {alpha_s: -1}}\n")
    with pytest.raises(SpecError, match=r"p.yaml: hardware: Field required \(and 3 more\)"):
        load_profile(path)
    good = {"hardware": {}, "algorithms": {}, "provenance": {"files": [], "runs": [],
            "date": "", "points": 0, "commsim": "0"}}  # fmt: skip
    path.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()) | good))
    with pytest.raises(SpecError, match=r"p.yaml: tiers.intra-node.alpha_s"):
        load_profile(path)
    # a profile of the first format (one cluster's absolute bandwidths): refit, says how
    path.write_text("cluster: c\nbackend: gloo\ntiers: {}\n")
    with pytest.raises(SpecError, match=r"p.yaml: format: a format-1 profile .* calibrate fit"):
        load_profile(path)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"latency_scale": {"net": -3.0}}, "nccl.latency_scale.net: Input should be greater"),
        ({"version": "banana"}, "nccl.version: not an NCCL version: 'banana'"),
    ],
)
def test_profile_nccl_fit_that_no_nccl_runs_is_refused_at_load(tmp_path, edit, says):
    """A negative latency factor or an unreadable version is refused naming the profile's
    field when it is loaded; it was carried into clusters by `calibrate apply` and failed
    later with the blame on --sizes or --algorithm."""
    nccl = {"version": "2.29.7", "latency_scale": {"net": 1.5}} | edit
    doc = {"format": 2, "cluster": "c", "backend": "nccl", "hardware": {}, "tiers": {},
           "algorithms": {},
           "nccl": nccl, "provenance": {"files": [], "runs": [], "date": "", "points": 0,
           "commsim": "0"}}  # fmt: skip
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=rf"p.yaml: {re.escape(says)}"):
        load_profile(path)
    path.write_text(yaml.safe_dump(doc | {"nccl": {"version": "2.29.7"}}))
    assert load_profile(path).nccl.version == "2.29.7"


def test_a_fit_of_runs_under_nccl_algo_keeps_it(tmp_path):
    """Logs of runs that exported NCCL_ALGO=ring (NCCL's INFO line on every rank), timed by
    NCCL's model restricted to ring with known parameters: the fit prices them under ring,
    finds the parameters again and the profile carries NCCL_ALGO=ring; a log whose ranks
    disagree, and runs that disagree, are refused."""
    import numpy as np
    from synth_nccl import BINARY, nccl_tests_log, two_h100_nodes

    from commsim.calibrate.fit import fit_profile
    from commsim.calibrate.ncclt import parse_log
    from commsim.calibrate.records import read_results

    spec = two_h100_nodes()
    true = spec.nccl.model_copy(
        update={"algo": "ring", "latency_scale": {"net": 1.3}, "channel_bandwidth_inter": 40e9}
    )
    sizes = 2.0 ** np.arange(3, 31)
    records = []
    for k, op in enumerate(("all-reduce", "all-gather")):
        log = tmp_path / f"{BINARY[op]}.log"
        text = nccl_tests_log(spec.model_copy(update={"nccl": true}), op, 2, sizes, seed=k,
                              env={"NCCL_ALGO": "ring"})  # fmt: skip
        log.write_text(text)
        records += parse_log(log)
    assert records[0]["nccl_env"] == {"NCCL_ALGO": "ring"}
    out = tmp_path / "r.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    nccl = fit_profile(read_results([str(out)]), spec).profile.nccl
    assert (nccl.algo, nccl.proto) == ("ring", None)
    assert nccl.latency_scale["net"] == pytest.approx(1.3, rel=0.05)
    assert nccl.channel_bandwidth_inter_Bps == pytest.approx(40e9, rel=0.05)
    mixed = tmp_path / "mixed.log"
    mixed.write_text(text.replace("to ring", "to tree", 1))
    with pytest.raises(SpecError, match=r"line \d+: NCCL_ALGO=ring, but an earlier rank"):
        parse_log(mixed)
    other = dict(records[0], nccl_env={"NCCL_ALGO": "tree"}, run="other")
    rows = [dict(r, run="other") for r in records[1:29]]
    out.write_text("".join(json.dumps(r) + "\n" for r in [*records, other, *rows]))
    with pytest.raises(SpecError, match="the runs exported different NCCL_ALGO"):
        fit_profile(read_results([str(out)]), spec)


def test_fit_refuses_a_point_no_model_reaches(tmp_path):
    """A size no collective has (1e300 B) sends the fit's error to infinity: one line naming
    the file, line and point, exit 2, no profile (it was pydantic's multi-line 'validation
    error for Provenance' after numpy's overflow warnings)."""
    out = tmp_path / "r.jsonl"
    ok = runner.invoke(calibrate_app, ["import-nccl-tests", str(ALL_REDUCE), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    lines = out.read_text().splitlines()
    rec = json.loads(lines[3])
    lines[3] = json.dumps(rec | {"bytes": 1e300})
    out.write_text("\n".join(lines) + "\n")
    profile = tmp_path / "p.yaml"
    result = runner.invoke(
        calibrate_app, ["fit", str(out), "--cluster", "dgx-h100-ib", "-o", str(profile)]
    )
    assert result.exit_code == 2, result.output
    assert "r.jsonl: line 4: all-reduce of 1e+300 B in" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not profile.exists()
