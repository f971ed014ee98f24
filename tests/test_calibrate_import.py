"""Measurements from other tools (calibrate import: CSV or JSON of op, bytes, world,
placement, time, timing convention), and the workflow's other commands: the cluster a
testbed emulates, a profile carried to another cluster (calibrate apply), validation
without a profile, --backend on predict."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from commsim.calibrate.importer import import_table
from commsim.calibrate.records import read_results, record_line
from commsim.cli.app import app
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec, SpecError

runner = CliRunner()
HEADER = "op,bytes,world,placement,time_s,timing,rank_times_s,backend\n"
ROWS = (
    "all-reduce,1MiB,4,r0/a r0/b r1/c r1/d,0.083,slowest-rank,,gloo\n"
    "all-gather,1048576,4,r0/a r0/b r1/c r1/d,,per-rank,0.041 0.042 0.040 0.043,gloo\n"
    "all-reduce,4MiB,2,r0/a r1/c,0.22,rank0,,gloo\n"
)


def run(*args: str):
    return runner.invoke(app, list(args))


def test_csv_rows_become_runs_by_placement(tmp_path):
    path = tmp_path / "mytool.csv"
    path.write_text(HEADER + ROWS)
    records = import_table([str(path)], tool="mytool")
    out = tmp_path / "r.jsonl"
    out.write_text("".join(record_line(r) for r in records))
    res = read_results(out)
    assert len(res.runs) == 2  # two placements
    first, second = res.runs.values()
    assert first.meta.source == "mytool" and first.meta.hosts == ["a", "b", "c", "d"]
    assert [r.rack for r in first.meta.ranks] == ["r0", "r0", "r1", "r1"]
    (_, ar), (_, ag) = first.collectives
    assert ar.bytes == 2**20 and ar.timing == "slowest-rank" and ar.time_s == 0.083
    assert ag.timing == "per-rank" and ag.time_s == 0.043  # the slowest rank's
    assert second.collectives[0][1].timing == "rank0"


def test_json_list_and_the_backend_flag(tmp_path):
    path = tmp_path / "m.json"
    rows = [{"op": "broadcast", "bytes": 65536, "world": 2, "placement": "h0 h1",
             "time_s": 0.004, "timing": "slowest-rank"}]  # fmt: skip
    path.write_text(json.dumps(rows))
    with pytest.raises(SpecError, match="m.json: item 0: backend: missing"):
        import_table([str(path)])
    (meta, coll) = import_table([str(path)], backend="nccl")
    assert meta["backend"] == "nccl" and meta["ranks"][1] == {"rank": 1, "host": "h1", "rack": None}
    assert coll["group"] == [0, 1]


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ("gather,1MiB,2,a b,0.1,slowest-rank,,gloo\n", "line 2: op"),
        ("all-reduce,1MiB,2,a b c,0.1,slowest-rank,,gloo\n", "line 2: placement names 3"),
        ("all-reduce,lots,2,a b,0.1,slowest-rank,,gloo\n", "line 2: bytes: not a size"),
        ("all-reduce,1MiB,2,a b,0.1,median,,gloo\n", "line 2: timing: 'median' is not one"),
        ("all-reduce,1MiB,2,a b,,per-rank,0.1,gloo\n", "line 2: rank_times_s has 1 times"),
        ("all-reduce,1MiB,2,a b,-1,slowest-rank,,gloo\n", "line 2: time_s: expected positive"),
        ("all-reduce,1MiB,2,a b,0.1,slowest-rank,,gloo,7\n", "line 2: 9 values for the header's 8"),
        ("all-reduce,1MiB,2,a b,0.1,slowest-rank,,mpi\n", "line 2: backend: 'mpi' is not one of"),
        ("all-reduce,1MiB,2.5,a b,0.1,slowest-rank,,gloo\n", "line 2: world: expected a whole"),
        ("all-gather,8,2,a b,0.5,per-rank,0.1 0.2,gloo\n", "line 2: time_s: 0.5 s is not"),
    ],
)
def test_a_bad_row_names_its_line_and_field(tmp_path, row, where):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + row)
    with pytest.raises(SpecError, match=f"t.csv: {where}"):
        import_table([str(path)])


@pytest.mark.parametrize(
    ("table", "where"),
    [
        ("op,bytes,world,placement,time_ms,timing\nall-reduce,8,1,a,3,rank0\n", "time_ms: not a"),
        (
            '[{"op": "all-reduce", "bytes": 8, "world": 1, "placement": "a", "timing": "rank0",'
            ' "time_s": 1, "backend": "gloo", "repeats": 0}]',
            "repeats: expected a whole number",
        ),
        (
            "op,bytes,world,placement,time_s,timing,repeats\nall-reduce,8,1,a,3,rank0,2.5\n",
            "repeats: expected a whole number >= 1, got '2.5'",
        ),
    ],
)
def test_columns_it_does_not_know_and_counts_that_are_none(tmp_path, table, where):
    """An unknown column (a unit in its name) is refused, not dropped; repeats must count."""
    path = tmp_path / ("t.json" if table.startswith("[") else "t.csv")
    path.write_text(table)
    with pytest.raises(SpecError, match=where):
        import_table([str(path)], backend="gloo")
    out = run(
        "calibrate", "import", str(path), "--out", str(tmp_path / "r.jsonl"), "--backend", "x"
    )
    assert out.exit_code == 2 and "--backend: 'x' is not one of gloo, nccl" in out.output


def test_import_json_and_an_output_it_cannot_write(tmp_path):
    """--json says what was added (import and import-nccl-tests); --out a directory, or in
    one that does not exist, is one line naming the flag (it was an IsADirectoryError
    traceback)."""
    table = tmp_path / "t.csv"
    table.write_text(HEADER + ROWS)
    out = tmp_path / "r.jsonl"
    doc = json.loads(run("calibrate", "import", str(table), "--out", str(out), "--json").stdout)
    assert doc == {"out": str(out), "runs": 2, "measurements": 3}
    log = "tests/data/all_reduce_perf_2x8.log"
    nccl = run("calibrate", "import-nccl-tests", log, "--out", str(out), "--json")
    assert json.loads(nccl.stdout) == {"out": str(out), "runs": 1, "measurements": 25}
    for where in (tmp_path, tmp_path / "missing" / "r.jsonl"):
        bad = run("calibrate", "import", str(table), "--out", str(where))
        assert bad.exit_code == 2 and f"--out '{where}'" in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1


def test_import_then_validate_without_a_profile(tmp_path):
    table, out = tmp_path / "t.csv", tmp_path / "r.jsonl"
    table.write_text(HEADER + ROWS)
    cluster = tmp_path / "c.yaml"
    assert run("testbed", "cluster", "testbeds/2x2-oversub.yaml", "-o", str(cluster)).exit_code == 0
    assert load_spec(ClusterSpec, cluster).name == "2x2-oversub"
    done = run("calibrate", "import", str(table), "--out", str(out), "--source", "mytool")
    assert done.exit_code == 0, done.output
    again = run("calibrate", "import", str(table), "--out", str(out))
    assert again.exit_code == 2 and "is already imported" in again.output
    doc = json.loads(
        run("calibrate", "validate", str(out), "--cluster", str(cluster), "--json").stdout
    )
    assert doc["backend"] == "gloo" and doc["notes"][0].startswith("no profile")
    assert len(doc["rows"]) == 3 and doc["unmodelled_points"] == 0


def test_apply_carries_a_profile_to_another_testbed_shape(tmp_path):
    from test_calibrate_fit import _profile

    from commsim.calibrate.testbed.spec import cluster_spec, load_testbed
    from commsim.files import write_atomic
    from commsim.profile import profile_yaml, tier_params

    small = cluster_spec(load_testbed("testbeds/2x2-oversub.yaml"))
    fitted = {t: (a * 100, b * 0.95) for t, (a, b) in tier_params(small).items()}
    prof = tmp_path / "p.yaml"
    write_atomic(prof, profile_yaml(_profile(small.name, fitted, small, overhead=1e-3)))
    target = tmp_path / "t.yaml"
    assert run("testbed", "cluster", "testbeds/3x2-4to1.yaml", "-o", str(target)).exit_code == 0
    out = tmp_path / "applied.yaml"
    result = run("calibrate", "apply", str(prof), "--cluster", str(target), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "carried over from '2x2-oversub' (gloo):" in result.output
    assert "inter-node: alpha 2700 us, 95.0% of its 10 MB/s = 9.5 MB/s" in result.output
    applied = load_spec(ClusterSpec, out)
    assert tier_params(applied)["cross-rack"][1] == pytest.approx(0.95 * 5e6)
    assert applied.call_overhead == 1e-3
    for where in (tmp_path, tmp_path / "missing" / "c.yaml"):  # was an IsADirectoryError traceback
        bad = run("calibrate", "apply", str(prof), "--cluster", str(target), "-o", str(where))
        assert bad.exit_code == 2 and f"-o '{where}'" in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1
    # on the testbed's cluster the collective prices gloo's own algorithm
    doc = json.loads(run("collective", "broadcast", "--cluster", str(out), "--gpus", "6",
                         "--sizes", "1MiB", "--algorithm", "auto", "--json").stdout)  # fmt: skip
    assert doc["backend"] == "gloo" and doc["rows"][0]["algorithm"] == "binomial"


def test_backend_flag_on_predict_and_plan():
    common = ("--model", "gpt2-xl", "--cluster", "dgx-a100-ib", "--gpus", "16")
    nccl = json.loads(run("predict", *common, "--json").stdout)
    gloo = run("predict", *common, "--backend", "gloo", "--json")
    assert gloo.exit_code == 0, gloo.output
    assert json.loads(gloo.stdout)["comm_s"] != nccl["comm_s"]
    bad = run("predict", *common, "--backend", "mpi")
    assert bad.exit_code == 2 and "--backend: 'mpi': nccl or gloo" in bad.output
    plan = run("plan", *common, "--backend", "gloo", "--top", "1", "--json")
    assert plan.exit_code == 0, plan.output


def test_testbed_up_can_write_its_cluster_without_root_it_fails_cleanly(tmp_path, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    out = tmp_path / "c.yaml"
    result = run("testbed", "up", "testbeds/2x2-full.yaml", "--cluster-out", str(out))
    assert result.exit_code == 2 and "root" in result.output
    assert yaml.safe_load(out.read_text())["name"] == "2x2-full"  # written before the refusal
    # a cluster file that cannot be written is one line naming the flag (was a traceback)
    for args in (("cluster", "-o"), ("up", "--cluster-out")):
        bad = run("testbed", args[0], "testbeds/2x2-full.yaml", args[1], str(tmp_path))
        assert bad.exit_code == 2 and f"{args[1]} '{tmp_path}': is a directory" in bad.output
        assert len(bad.output.strip().splitlines()) == 1


def test_validate_min_bytes_named_and_a_floor_above_every_point_said(tmp_path):
    """--min-bytes that is no size names the flag (it was 'not a size: ...' alone); a floor
    above every measured size says so instead of leaving the summary line out."""
    table, out = tmp_path / "t.csv", tmp_path / "r.jsonl"
    table.write_text(HEADER + ROWS)
    assert run("calibrate", "import", str(table), "--out", str(out)).exit_code == 0
    args = ("calibrate", "validate", str(out), "--cluster", "dgx-a100-ib", "--min-bytes")
    bad = run(*args, "-1")
    assert bad.exit_code == 2 and bad.output.startswith("error: --min-bytes -1: not a size")
    high = run(*args, "1TiB")
    assert high.exit_code == 0, high.output
    assert "collectives of 1 TiB and more: none measured (--min-bytes)" in high.output
    plain = run(*args[:-1])  # no floor given: no 'of 0 B and more' in the summary's label
    assert "collectives: median |error|" in plain.output and "0 B and more" not in plain.output


def test_fit_says_when_the_per_call_overhead_was_not_fitted(tmp_path):
    """One op on one group cannot tell the per-call overhead from alpha: the line said
    'per-call overhead 0 (95%: -; negative: the links give each call a head start)'."""
    rows = "".join(
        f"all-reduce,{2**k},2,r0/a r0/b,{1e-4 + 2**k / 2e7:.6g},slowest-rank,,gloo\n"
        for k in range(10, 24, 2)
    )
    table, out = tmp_path / "t.csv", tmp_path / "r.jsonl"
    table.write_text(HEADER + rows)
    assert run("calibrate", "import", str(table), "--out", str(out)).exit_code == 0
    cluster = tmp_path / "c.yaml"
    assert run("testbed", "cluster", "testbeds/2x2-oversub.yaml", "-o", str(cluster)).exit_code == 0
    fit = run("calibrate", "fit", str(out), "--cluster", str(cluster), "-o", str(tmp_path / "p"))
    assert fit.exit_code == 0, fit.output
    assert "per-call overhead 0 (the cluster's value: not fitted, see the notes)" in fit.output
