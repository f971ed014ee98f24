"""The emulated cluster: spec validation and placement everywhere; as root, real namespaces,
shaped links measured with TCP streams, multi-rank runs, and teardown after a crash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsim.calibrate.testbed import goodput, network, runner
from commsim.calibrate.testbed.host import ETC_NETNS, TestbedError, owned_namespaces, state_path
from commsim.calibrate.testbed.spec import CPU_BUDGET, GOODPUT, cluster_spec, hosts, load_testbed
from commsim.cli import testbed as testbed_cli
from commsim.specs import SpecError
from commsim.topology.build import build_cluster

TESTBEDS = Path(__file__).resolve().parent.parent / "testbeds"
OVERSUB = TESTBEDS / "2x2-oversub.yaml"
TOL = 0.15

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the testbed needs root and iproute2 (ip, tc) for network namespaces",
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tb.yaml"
    path.write_text(text)
    return path


GOOD = "name: t\nracks: 2\nhosts_per_rack: 2\nhost_rate: 160Mbps\nuplink_rate: 160Mbps\n"


# ---------------------------------------------------------------- no root needed


@pytest.mark.parametrize("path", sorted(TESTBEDS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_testbeds_load_and_build(path):
    spec = load_testbed(path)
    cluster = build_cluster(cluster_spec(spec))
    assert cluster.n_gpus == spec.n_hosts
    assert int(cluster.rack_of_node.max()) + 1 == spec.racks
    # the uplink capacity commsim sees is the one the testbed shapes (or all host links)
    expect = min(spec.uplink_rate, spec.hosts_per_rack * spec.host_rate)
    assert cluster.summary()["leaf_uplink_Bps"] == pytest.approx(expect)
    # links, not the two CPUs, must be the bottleneck
    assert spec.n_hosts * spec.host_rate <= CPU_BUDGET


def test_oversubscribed_file_is_2_to_1():
    spec = load_testbed(OVERSUB)
    assert (spec.racks, spec.hosts_per_rack, spec.prefix) == (2, 2, "cs")
    assert spec.host_rate == spec.uplink_rate == 20e6
    assert spec.oversubscription == 2.0
    assert cluster_spec(spec).fabric.oversubscription == [2.0, 1.0]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (GOOD + "latency: 1ms\n", "latency", "cannot emulate latency"),
        (GOOD.replace("160Mbps\nuplink", "fast\nuplink"), "host_rate", "not a rate"),
        (GOOD.replace("uplink_rate: 160Mbps", "uplink_rate: 10Gbps"), "uplink_rate", "1 Gbit/s"),
        (GOOD.replace("racks: 2", "racks: 0"), "racks", "greater than or equal to 1"),
        (GOOD + "prefix: Bad-1\n", "prefix", "pattern"),
        (GOOD + "colour: red\n", "colour", "Extra inputs"),
        (GOOD.replace("racks: 2\nhosts_per_rack: 2", "racks: 9\nhosts_per_rack: 9"), "", "over 64"),
        (GOOD.replace("name: t\n", ""), "name", "required"),
        ("- racks: 2\n", "", "expected a mapping"),
        ("racks: [2\n", "line", "invalid YAML"),
    ],
)
def test_bad_spec_names_file_and_field(tmp_path, text, field, words):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_testbed(path)
    assert err.value.source == str(path)
    assert field in err.value.field
    assert words in str(err.value)


def test_zero_latency_is_accepted(tmp_path):
    assert load_testbed(write(tmp_path, GOOD + "latency: 0us\n")).latency == 0.0


def test_placements_match_commsim():
    spec = load_testbed(OVERSUB)

    def names(*args):
        return [h.name for h in runner.rank_hosts(spec, *args)]

    assert names("blocked") == ["r0h0", "r0h1", "r1h0", "r1h1"]
    assert names("interleaved") == ["r0h0", "r1h0", "r0h1", "r1h1"]
    # a smaller job takes the first hosts in rack order, as commsim's build_cluster does
    assert names("interleaved", 3) == ["r0h0", "r1h0", "r0h1"]
    assert names("blocked", 2) == ["r0h0", "r0h1"]
    assert names("r1h1,r0h0") == ["r1h1", "r0h0"]
    assert names(["cs-r1h0", "r0h1"], 2) == ["r1h0", "r0h1"]


@pytest.mark.parametrize(
    ("placement", "world_size", "words"),
    [
        ("diagonal", None, "neither blocked"),
        ("r0h0,r9h9", None, "'r9h9'"),
        ("r0h0,r0h0", None, "listed twice"),
        ("r0h0,r0h1", 3, "3 ranks but 2 hosts"),
        ("blocked", 5, "must be 1..4"),
        ("blocked", 0, "must be 1..4"),
    ],
)
def test_bad_placement(placement, world_size, words):
    with pytest.raises(SpecError, match=words):
        runner.rank_hosts(load_testbed(OVERSUB), placement, world_size)


def test_rank_env_is_torchrun_style():
    spec = load_testbed(OVERSUB)
    ranks = runner.rank_hosts(spec, "interleaved")
    env = runner.rank_env(spec, ranks, 1, 29511)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "10.77.0.1" and env["MASTER_PORT"] == "29511"
    assert env["COMMSIM_HOST"] == "r1h0" and env["COMMSIM_RACK"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_needs_root_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match=r"^commsim testbed needs root: .*uid 1000"):
        network.up(load_testbed(OVERSUB))
    result = CliRunner().invoke(testbed_cli.testbed_app, ["up", str(OVERSUB)])
    assert result.exit_code == 2
    assert "needs root" in result.output and "Traceback" not in result.output


def test_needs_iproute2_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/sbin/ip")
    with pytest.raises(TestbedError, match="needs iproute2: tc not found"):
        network.down("cs")


def test_cli_bad_input_exits_2(tmp_path):
    runner = CliRunner()
    bad = write(tmp_path, GOOD + "latency: 2ms\n")
    result = runner.invoke(testbed_cli.testbed_app, ["up", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}: latency:" in result.output and "Traceback" not in result.output
    result = runner.invoke(testbed_cli.testbed_app, ["run", str(OVERSUB)])
    assert result.exit_code == 2 and "give the command after --" in result.output


# ---------------------------------------------------------------- as root, real namespaces


def _prefix(tag: str) -> str:
    return f"t{tag}{os.getpid() % 100000}"


def _root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in out.stdout.splitlines())


@pytest.fixture(scope="module")
def bed():
    """The 2:1 oversubscribed 2x2 testbed under a prefix of its own, always torn down."""
    spec = load_testbed(OVERSUB).model_copy(update={"prefix": _prefix("b")})
    before = _root_links()
    try:
        network.up(spec)
        yield spec
    finally:
        network.down(spec.prefix)
    assert set(_root_links()) <= set(before)  # nothing made in (or left in) the root namespace


@pytest.mark.root
@needs_root
def test_up_makes_shaped_namespaces(bed):
    names = {h.netns for h in hosts(bed)} | {f"{bed.prefix}-sw"}
    assert set(owned_namespaces(bed.prefix)) == names
    state = json.loads(state_path(bed.prefix).read_text())
    assert set(state["namespaces"]) == names and len(state["links"]) == 2 * (4 + 2)
    addr = subprocess.run(
        ["ip", "-n", f"{bed.prefix}-r1h0", "-o", "-4", "addr", "show", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "10.77.1.1/16" in addr
    qdisc = subprocess.run(
        ["tc", "-n", f"{bed.prefix}-sw", "qdisc", "show", "dev", "up0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "htb" in qdisc
    assert any(row["prefix"] == bed.prefix and row["state"] == "up" for row in network.status())


@pytest.mark.root
@needs_root
def test_host_link_reaches_host_rate(bed):
    (rate,) = goodput.measure(bed, [("r0h0", "r0h1")]).rates
    assert rate == pytest.approx(bed.host_rate * GOODPUT, rel=TOL)


@pytest.mark.root
@needs_root
def test_oversubscribed_uplink_is_shared(bed):
    """Both hosts of rack 0 send to rack 1 at once: each gets half the uplink, and nothing
    is dropped."""
    alone = goodput.measure(bed, [("r0h0", "r1h0")]).rates[0]
    both = goodput.measure(bed, [("r0h0", "r1h0"), ("r0h1", "r1h1")]).rates
    assert alone == pytest.approx(bed.uplink_rate * GOODPUT, rel=TOL)
    for rate in both:
        assert rate == pytest.approx(bed.uplink_rate / 2 * GOODPUT, rel=TOL)
    # both directions at once (each uplink carries data one way and ACKs the other): still fair
    cross = [("r0h0", "r1h0"), ("r0h1", "r1h1"), ("r1h0", "r0h0"), ("r1h1", "r0h1")]
    for rate in goodput.measure(bed, cross).rates:
        assert rate == pytest.approx(bed.uplink_rate / 2 * GOODPUT, rel=TOL)
    stats = subprocess.run(
        ["tc", "-n", f"{bed.prefix}-sw", "-s", "qdisc", "show"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "dropped" in stats and all(
        line.split("dropped ")[1].startswith("0,")
        for line in stats.splitlines()
        if "dropped" in line
    )  # the fabric is lossless


ENV_PRINTER = (
    "import json, os, socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
    "s.connect((os.environ['MASTER_ADDR'], 9)); "
    "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', "
    "'COMMSIM_HOST', 'COMMSIM_RACK'); "
    "print(json.dumps({k: os.environ[k] for k in keys} | {'addr': s.getsockname()[0]}))"
)


@pytest.mark.root
@needs_root
def test_run_starts_each_rank_in_its_namespace(bed):
    result = runner.run(bed, [sys.executable, "-c", ENV_PRINTER], "interleaved", 3, port=29555)
    assert result.returncode == 0 and result.codes == [0, 0, 0]
    envs = {int(e["RANK"]): e for e in (json.loads(line) for _, line in result.lines)}
    by_name = {h.name: h for h in hosts(bed)}
    for rank, host in enumerate(["r0h0", "r1h0", "r0h1"]):
        env = envs[rank]
        assert (env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"]) == ("3", "0", "29555")
        assert env["MASTER_ADDR"] == "10.77.0.1"
        assert (env["COMMSIM_HOST"], env["COMMSIM_RACK"]) == (host, host[1])
        assert env["addr"] == by_name[host].address  # it really runs in that namespace


@pytest.mark.root
@needs_root
def test_run_failing_rank_kills_the_rest(bed):
    script = 'if [ "$RANK" = 2 ]; then sleep 0.3; exit 3; fi; sleep 30'
    start = time.monotonic()
    result = runner.run(bed, ["sh", "-c", script])
    assert time.monotonic() - start < 10
    assert result.returncode == 3 and result.failed == [2]
    assert sorted(result.killed) == [0, 1, 3]


@pytest.mark.root
@needs_root
def test_run_timeout_gives_124(bed):
    result = runner.run(bed, ["sleep", "30"], world_size=2, timeout=0.5)
    assert result.returncode == 124 and result.timed_out and sorted(result.killed) == [0, 1]


@pytest.mark.root
@needs_root
def test_cli_status_and_check(bed, tmp_path):
    runner = CliRunner()
    status = json.loads(runner.invoke(testbed_cli.testbed_app, ["status", "--json"]).output)
    assert any(t["prefix"] == bed.prefix for t in status["testbeds"])
    spec_file = write(tmp_path, OVERSUB.read_text() + f"prefix: {bed.prefix}\n")
    result = runner.invoke(
        testbed_cli.testbed_app, ["check", str(spec_file), "--seconds", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    links = json.loads(result.output)["links"]
    assert [row["link"] for row in links][:3] == [
        "host link (same rack)",
        "rack uplink, one flow",
        "rack uplink shared by 2",
    ]
    assert all(abs(row["ratio"] - 1) <= TOL for row in links)


@pytest.mark.root
@needs_root
def test_down_after_a_crash_removes_leftovers():
    spec = load_testbed(OVERSUB).model_copy(update={"prefix": _prefix("c")})
    try:
        network.up(spec)
        network.up(spec)  # idempotent: the second removes the first
        # a crash: the state file is gone and a half-made namespace is lying around
        state_path(spec.prefix).unlink()
        subprocess.run(["ip", "netns", "add", f"{spec.prefix}-r7h7"], check=True)
        assert any(
            r["prefix"] == spec.prefix and r["state"] == "leftover" for r in network.status()
        )
        removed = network.down(spec.prefix)
        assert len(removed) == 6
        assert owned_namespaces(spec.prefix) == []
        assert not list(ETC_NETNS.glob(f"{spec.prefix}-*"))
        with pytest.raises(TestbedError, match="is not up"):
            runner.run(spec, ["true"])
    finally:
        network.down(spec.prefix)
