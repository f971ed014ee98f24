"""`commsim trace`: export and import round trip, summary and predict on a synthetic trace,
bad input as one line and exit code 2 with nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

from test_traces_kineto import _write, nccl_trace
from typer.testing import CliRunner

from commsim.cli.app import app

runner = CliRunner()
LAYOUT = ["--model", "llama2-7b", "--cluster", "dgx-a100-ib", "--global-batch", "16"]
LAYOUT += ["--micro-batch", "1", "--seq-len", "1024", "--gpus", "8", "--tp", "2", "--pp", "2"]


def test_export_then_import_gives_the_same_step(tmp_path):
    out = runner.invoke(app, ["trace", "export", "--out", str(tmp_path / "t"), *LAYOUT, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["files"] == 8
    files = sorted(str(p) for p in tmp_path.glob("t.*.et"))
    back = runner.invoke(app, ["trace", "import", *files, "--cluster", "dgx-a100-ib", "--json"])
    assert back.exit_code == 0, back.output
    again = json.loads(back.output)
    assert again["nodes"] == doc["nodes"]
    assert again["recorded_s"] == doc["replayed_s"]
    assert abs(again["priced_s"] / doc["replayed_s"] - 1) < 1e-12


def test_export_refuses_what_it_cannot_write(tmp_path):
    """A layout the export does not write (expert all-to-alls under another micro-batch's
    compute), and a bad flag: one line, exit 2, nothing written."""
    scenario = tmp_path / "moe.yaml"
    scenario.write_text(
        "model: mixtral-8x7b\ncluster: dgx-h100-ib\ngpus: 16\nglobal_batch: 32\n"
        "micro_batch: 1\nseq_len: 1024\nstrategy: {tp: 2, pp: 2, ep: 2, ep_overlap: true}\n"
    )
    out_dir = tmp_path / "out"
    for args, says in (
        ([str(scenario)], "strategy.ep_overlap: not exported to Chakra"),
        ([*LAYOUT, "--zero", "3", "--fsdp-shard", "3"], "--fsdp-shard 3"),
    ):
        out = runner.invoke(app, ["trace", "export", "--out", str(out_dir / "t"), *args])
        assert out.exit_code == 2, out.output
        assert says in out.output and "Traceback" not in out.output
        assert len(out.output.strip().splitlines()) == 1
        assert not out_dir.exists()


def test_summary_and_predict_json(tmp_path):
    paths = [str(_write(tmp_path, nccl_trace(r), f"r{r}.json")) for r in range(4)]
    out = runner.invoke(app, ["trace", "summary", *paths, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert len(doc["steps"]) == 8 and abs(doc["median"]["exposed_comm_s"] - 100e-6) < 1e-12
    pred = runner.invoke(
        app, ["trace", "predict", *paths, "--cluster", "dgx-a100-ib", "--gpus", "64", "--json"]
    )
    assert pred.exit_code == 0, pred.output
    p = json.loads(pred.output)
    assert p["layout"]["dp"] == 64 and p["assumptions"]
    assert abs(p["traced_s"] - 1000e-6) < 1e-12 and p["predicted_s"] > 900e-6


def test_bad_trace_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    out = runner.invoke(app, ["trace", "summary", str(bad)])
    assert (
        out.exit_code == 2
        and "truncated" in out.output
        and len(out.output.strip().splitlines()) == 1
    )
    plot = runner.invoke(
        app, ["trace", "summary", str(_write(tmp_path, nccl_trace())), "--plot", "x.png"]
    )
    assert plot.exit_code == 2 and "--plot: needs --cluster" in plot.output
    # a plot path that cannot take an image: one line before any work (a directory was an
    # IsADirectoryError traceback; x.txt got a PNG)
    for where, says in ((tmp_path, "is a directory"), (tmp_path / "x.txt", "not an image")):
        args = ["trace", "summary", str(_write(tmp_path, nccl_trace())), "--cluster", "dgx-a100-ib"]
        out = runner.invoke(app, [*args, "--plot", str(where)])
        assert out.exit_code == 2 and says in out.output, out.output
    assert not (tmp_path / "x.txt").exists()


def test_parameter_server_export_imports_at_its_price(tmp_path):
    """--algorithm ps: the trace's metadata carries the algorithm and server count, and
    `trace import --cluster` prices the step it recorded; a server count that is not one
    is a one-line error."""
    out = runner.invoke(
        app, ["trace", "export", "--out", str(tmp_path / "t"), *LAYOUT, "--algorithm", "ps"]
    )
    assert out.exit_code == 0, out.output
    files = sorted(str(p) for p in tmp_path.glob("t.*.et"))
    back = runner.invoke(app, ["trace", "import", *files, "--cluster", "dgx-a100-ib", "--json"])
    doc = json.loads(back.output)
    assert abs(doc["priced_s"] / doc["recorded_s"] - 1) < 1e-12
    from commsim.traces.chakra import chakra_files, import_chakra

    graph = import_chakra(files)
    for rank, data in chakra_files(graph, graph.metadata | {"ps_shards": "two"}).items():
        (tmp_path / f"bad.{rank}.et").write_bytes(data)
    bad = sorted(str(p) for p in tmp_path.glob("bad.*.et"))
    out = runner.invoke(app, ["trace", "import", *bad, "--cluster", "dgx-a100-ib"])
    assert out.exit_code == 2 and "metadata.ps_shards: 'two': not a server count" in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_readme_export_examples_run(tmp_path, monkeypatch):
    """The README's `trace export` lines run as written (in a scratch folder): one file a
    rank; one stage replays to `predict`'s step exactly, the pipeline within its send
    accounting."""
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("### `commsim trace`: real workloads in and out", 1)[1]
    text = block.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    lines = [shlex.split(x, comments=True) for x in text.splitlines()]
    exports = [x for x in lines if x[:3] == ["commsim", "trace", "export"]]
    assert len(exports) == 3
    monkeypatch.chdir(tmp_path)
    for cmd in exports:
        out = runner.invoke(app, [*cmd[1:], "--json"])
        assert out.exit_code == 0, out.output
        doc = json.loads(out.output)
        assert doc["files"] == int(cmd[cmd.index("--gpus") + 1])
        exact = "--pp" not in cmd
        tolerance = 1e-12 if exact else 0.01
        assert abs(doc["replayed_s"] / doc["predicted_s"] - 1) < tolerance


def test_traces_of_one_run_one_per_rank(tmp_path):
    """Two traces of one rank, a rank outside its world, or traces of two world sizes are
    one line naming the file and field, exit 2, on every command that reads traces."""
    r0 = str(_write(tmp_path, nccl_trace(0), "r0.json"))
    other = nccl_trace(1)
    other["distributedInfo"]["world_size"] = 2
    outside = nccl_trace(0)
    outside["distributedInfo"]["rank"] = 7
    cases = (
        ([r0, r0], "distributedInfo.rank: 0 again"),
        ([r0, str(_write(tmp_path, other, "w2.json"))], "world_size: 2, but"),
        ([str(_write(tmp_path, outside, "r7.json"))], "rank: 7 outside world_size 4"),
    )
    for files, says in cases:
        for cmd in (["summary"], ["predict", "--cluster", "dgx-a100-ib"], ["kernels"]):
            out = runner.invoke(app, ["trace", *cmd, *files])
            assert out.exit_code == 2, out.output
            assert says in out.output and len(out.output.strip().splitlines()) == 1


def test_pricing_flags_are_checked_never_ignored(tmp_path):
    """A pricing flag without --cluster, an unknown algorithm or placement, a layout that does
    not divide the traced ranks, or a count below 1 is one line naming the flag, exit 2:
    never dropped (--gpus 0 was the traced scale, --algorithm bogus ring), nor a traceback."""
    paths = [str(_write(tmp_path, nccl_trace(r), f"r{r}.json")) for r in range(4)]
    predict = ["trace", "predict", *paths, "--cluster", "dgx-a100-ib"]
    for args, says in (
        (["trace", "summary", *paths, "--step", "1"], "--step: needs --cluster"),
        (["trace", "summary", *paths, "--algorithm", "ring"], "--algorithm: needs --cluster"),
        (["trace", "import", "t.0.et", "--placement", "blocked"], "--placement: needs --cluster"),
        ([*predict, "--algorithm", "bogus"], "--algorithm: 'bogus': not one of auto, nccl"),
        ([*predict, "--placement", "bogus"], "--placement: 'bogus': not one of blocked"),
        ([*predict, "--gpus", "0"], "--gpus 0: must be a positive count"),
        ([*predict, "--tp", "0"], "--tp 0: must be a positive count"),
        ([*predict, "--tp", "3"], "the traced ranks: 4 is not a multiple of tp x pp = 3"),
    ):
        out = runner.invoke(app, args)
        assert out.exit_code == 2, (args, out.output)
        assert says in out.output and len(out.output.strip().splitlines()) == 1, out.output
    ok = runner.invoke(app, [*predict, "--algorithm", "ring", "--step", "1", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["step"] == 1


def test_trace_calibrate_appends_once_and_says_what_in_json(tmp_path):
    """The same traces imported twice are the same runs, refused with nothing written (the
    run ids came from Python's per-process hash, so a second import doubled every point);
    an --out that cannot be written is one line, not a traceback; --json says what was added,
    as `calibrate import` and `import-nccl-tests` do."""
    paths = [str(_write(tmp_path, nccl_trace(r), f"r{r}.json")) for r in range(4)]
    out = tmp_path / "r.jsonl"
    first = runner.invoke(app, ["trace", "calibrate", *paths, "--out", str(out), "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.output) == {"out": str(out), "runs": 4, "measurements": 16}
    before = out.read_text()
    again = subprocess.run(  # another process: another string hash seed
        [sys.executable, "-m", "commsim.cli", "trace", "calibrate", *paths, "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 2 and "is already imported into it" in again.stderr
    assert out.read_text() == before
    for where, says in ((tmp_path, "is a directory"), (tmp_path / "no" / "r.jsonl", "not exist")):
        bad = runner.invoke(app, ["trace", "calibrate", *paths, "--out", str(where)])
        assert bad.exit_code == 2 and says in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1


def test_export_prefix_that_names_no_file(tmp_path):
    """--out '' or DIR/ wrote hidden files .0.et, .1.et, ...; a file where its directory
    goes was a FileExistsError traceback: one line naming --out, nothing written."""
    blocker = tmp_path / "f"
    blocker.write_text("")
    for prefix, says in (
        ("", "--out '': names no file"),
        (f"{tmp_path}/", "names no file"),
        (f"{blocker}/t", "cannot make its directory"),
    ):
        out = runner.invoke(app, ["trace", "export", "--out", prefix, *LAYOUT])
        assert out.exit_code == 2 and says in out.output, out.output
        assert len(out.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_import_refuses_a_file_named_for_a_rank_it_did_not_trace(tmp_path):
    """Rank 1's file renamed rank 9: its collectives run on groups without rank 9; it was
    replayed (and priced) as rank 9 all the same."""
    runner.invoke(app, ["trace", "export", "--out", str(tmp_path / "t"), *LAYOUT])
    moved = tmp_path / "t.9.et"
    (tmp_path / "t.1.et").rename(moved)
    out = runner.invoke(app, ["trace", "import", str(tmp_path / "t.0.et"), str(moved)])
    assert out.exit_code == 2, out.output
    assert "t.9.et: node" in out.output and "not rank 9 (the file's name)" in out.output


def test_short_steps_print_in_a_unit_that_shows_them(tmp_path):
    """A 1 us step printed as '0.00 ms' (every trace line was in ms with two decimals): each
    time is in the unit that keeps its digits (units.fmt_time), as the tables are."""
    paths = []
    for r in range(4):
        doc = nccl_trace(r)
        for e in doc["traceEvents"]:
            e["ts"], e["dur"] = 1000 + (e["ts"] - 1000) / 1000, e["dur"] / 1000
        paths.append(str(_write(tmp_path, doc, f"r{r}.json")))
    out = runner.invoke(app, ["trace", "predict", *paths, "--cluster", "dgx-a100-ib"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("step 2: 1 us on 4 traced ranks") and "0.00" not in out.output


def test_summary_of_a_trace_without_collectives_says_so(tmp_path):
    """A step without communication printed an empty 'collectives (medians)' table."""
    doc = nccl_trace(0)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "Collective name" not in e["args"]]
    out = runner.invoke(app, ["trace", "summary", str(_write(tmp_path, doc))])
    assert out.exit_code == 0, out.output
    assert "no collectives traced" in out.output and "collectives (medians)" not in out.output


def test_trace_calibrate_without_a_recorded_backend(tmp_path):
    """Traces without distributedInfo.backend: the backend their collectives were recorded
    by (NCCL's kernels here), not 'unknown', which calibrate fit then refused; none at all
    to tell it by is one line naming the field."""
    docs = [nccl_trace(r) for r in range(4)]
    for d in docs:
        del d["distributedInfo"]["backend"]
    paths = [str(_write(tmp_path, d, f"r{r}.json")) for r, d in enumerate(docs)]
    out = tmp_path / "r.jsonl"
    done = runner.invoke(app, ["trace", "calibrate", *paths, "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert json.loads(out.read_text().splitlines()[0])["backend"] == "nccl"
    for d in docs:
        d["traceEvents"] = [e for e in d["traceEvents"] if "Collective name" not in e["args"]]
    bare = [str(_write(tmp_path, d, f"b{r}.json")) for r, d in enumerate(docs)]
    bad = runner.invoke(app, ["trace", "calibrate", *bare, "--out", str(tmp_path / "b.jsonl")])
    assert bad.exit_code == 2 and "distributedInfo.backend: missing" in bad.output
