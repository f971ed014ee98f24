"""NCCL_ALGO / NCCL_PROTO as NCCL parses them (src/graph/tuning.cc parseList and
ncclTopoTuneModel): the enable matrices of NCCL's own documented examples, what its tuner may
still pick, LL128 named explicitly, the pre-2.24 fallback, and the CLI's flags and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.collectives.group import GroupCost
from commsim.collectives.nccl import overrides
from commsim.collectives.nccl.tables import (
    ALGORITHMS,
    COLLNET_DIRECT,
    LL,
    LL128,
    PROTOCOLS,
    RING,
    SIMPLE,
    TREE,
)
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec
from commsim.topology.build import build_cluster
from commsim.topology.placement import place

runner = CliRunner()
AR, AG = overrides.OP_FUNCTION["all-reduce"], overrides.OP_FUNCTION["all-gather"]


def _on(row, names):
    return {names[i] for i in np.nonzero(row == 1)[0]}


def test_nccls_own_examples():
    """The examples in tuning.cc's comment above parseList (2.24+)."""
    o = overrides.parse(
        "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", None, "2.30"
    )
    assert _on(o.algo[AG], ALGORITHMS) == {"Ring", "CollNetDirect"}
    assert _on(o.algo[AR], ALGORITHMS) == {"Tree", "CollNetDirect"}
    assert _on(o.algo[overrides.OP_FUNCTION["broadcast"]], ALGORITHMS) == {"Ring"}
    o = overrides.parse(None, "LL,Simple;allreduce:^LL", "2.30")
    assert _on(o.proto[AG], PROTOCOLS) == {"LL", "Simple"}
    assert _on(o.proto[AR], PROTOCOLS) == {"LL128", "Simple"}  # ^: everything but LL, forced
    o = overrides.parse(None, "^LL128;allreduce:LL128", "2.30")
    assert _on(o.proto[AG], PROTOCOLS) == {"LL", "Simple"}
    assert _on(o.proto[AR], PROTOCOLS) == {"LL128"}


def test_unset_protocols_keep_nccls_default_rule_for_ll128():
    o = overrides.parse("Ring", None, "2.30")
    assert o.protocol("all-reduce", LL128) == overrides.DEFAULT
    assert o.protocol("all-reduce", LL) == o.protocol("all-reduce", SIMPLE) == 1
    assert overrides.parse(None, None, "2.30") is None


@pytest.mark.parametrize(
    ("algo", "proto", "version", "says"),
    [
        ("allgather:ring", None, "2.21", "one list for every collective"),
        ("ring;tree", None, "2.30", "must name a collective"),
        ("rnig", None, "2.30", "knows no 'rnig'"),
        ("PAT", None, "2.21", "knows no 'PAT'"),
        (None, "allgather:LL;allgatter:LL", "2.30", "no collective 'allgatter'"),
        (";", None, "2.30", "names no algo"),
    ],
)
def test_values_nccl_refuses_or_ignores_are_refused(algo, proto, version, says):
    with pytest.raises(ValueError, match=says):
        overrides.parse(algo, proto, version)


def _group(topology="dgx-a100-ib", gpus=64, **nccl):
    spec = load_spec(ClusterSpec, catalog.topology_path(topology, "--cluster", ""))
    spec = spec.model_copy(update={"nccl": spec.nccl.model_copy(update=nccl)})
    built = build_cluster(spec, gpus, topology)
    return GroupCost(built, place(built, gpus, "blocked"))


SIZES = np.array([1e3, 1e5, 1e7, 1e9])


@pytest.mark.parametrize(("algo", "proto"), [("ring", None), (None, "Simple"), ("^ring", "^LL")])
def test_a_restriction_is_the_cheapest_allowed_candidate(algo, proto):
    """Independently of the tuner's code path: the fastest of NCCL's own estimates among
    the unrestricted model's candidates that the variables allow (by name), never faster
    than NCCL's free choice."""
    free, kept = _group(), _group(algo=algo, proto=proto)
    names = kept.nccl_choice("all-reduce", SIZES)
    model = free.comm()
    o = overrides.parse(algo, proto, "2.30")
    allowed = [
        k
        for k, c in enumerate(model.candidates["all-reduce"])
        if o.algo[AR, c.algorithm] and o.proto[AR, c.protocol]
    ]
    lat, bw = model.terms("all-reduce", SIZES, np.array(allowed))
    table = lat + SIZES / bw
    best = np.argmin(table, axis=0)
    want = [model.candidates["all-reduce"][allowed[b]].name for b in best]
    assert names == want
    assert np.all(kept.time("all-reduce", "auto", SIZES) >= free.time("all-reduce", "auto", SIZES))


def test_ll128_named_is_on_where_nccls_default_leaves_it_off():
    """A PCIe box without NVLink: NCCL enables LL128 by default only over NVLink, but
    NCCL_PROTO=LL128 (or ^LL, which leaves LL128 set to 1 as well) turns it on."""
    free = {c.protocol for c in _group("pcie-4gpu", 4).comm().candidates["all-reduce"]}
    assert LL128 not in free
    for proto in ("LL128", "^LL"):
        forced = _group("pcie-4gpu", 4, proto=proto).comm().candidates["all-reduce"]
        assert LL128 in {c.protocol for c in forced}


def test_before_2_24_no_collnet_brings_ring_and_tree_back():
    """NCCL_ALGO=CollNetDirect without CollNet: 2.21 warns and runs Ring and Tree; 2.30
    has no algorithm left and refuses the call."""
    old = _group(version="2.21", algo="CollNetDirect").comm().candidates["all-reduce"]
    assert {c.algorithm for c in old} == {RING, TREE}
    assert COLLNET_DIRECT not in {c.algorithm for c in old}
    with pytest.raises(ValueError, match="no algorithm/protocol for all-reduce"):
        _group(algo="CollNetDirect").time("all-reduce", "auto", SIZES)


def test_cli_flags_restrict_and_refuse():
    base = ["collective", "all-gather", "--cluster", "dgx-a100-ib", "--gpus", "64"]
    base += ["--sizes", "1KiB:1MiB", "--algorithm", "auto", "--json"]
    out = runner.invoke(app, [*base, "--nccl-proto", "Simple"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["nccl_proto"] == "Simple" and doc["nccl_algo"] is None
    assert {r["protocol"] for r in doc["rows"]} == {"Simple"}
    bad = runner.invoke(app, [*base, "--nccl-algo", "tree"])
    assert bad.exit_code == 2
    assert "NCCL_ALGO=tree" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    typo = runner.invoke(app, [*base, "--nccl-proto", "Simpel"])
    assert typo.exit_code == 2 and "knows no 'Simpel'" in typo.stderr


def test_predict_takes_the_flags():
    args = ["predict", "--model", "gpt2-xl", "--cluster", "dgx-a100-ib", "--gpus", "16", "--json"]
    free = json.loads(runner.invoke(app, args).stdout)
    ring = runner.invoke(app, [*args, "--nccl-algo", "ring", "--nccl-proto", "Simple"])
    assert ring.exit_code == 0, ring.output
    assert json.loads(ring.stdout)["step_time_s"] >= free["step_time_s"]
    bad = runner.invoke(app, [*args, "--nccl-algo", "nvls"])
    assert bad.exit_code == 2 and "NCCL_ALGO=nvls" in bad.stderr


def test_nccl_algo_ring_on_8_h100_as_nccl_tests_ran_it():
    """NVIDIA/nccl-tests#212 (sjeaugey): "~370GB/s ... with NCCL_ALGO=RING" on 8x H100,
    all-reduce busbw at large sizes; the same as the node with NVLS switched off."""
    from commsim.collectives.algorithms import bus_factor

    size = 8 * 2.0**30
    busbw = size / _group("dgx-h100-ib", 8, algo="RING").time("all-reduce", "auto", size)[0]
    busbw *= bus_factor("all-reduce", 8) / 1e9
    assert busbw == pytest.approx(370, rel=0.03)
    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-h100-ib", "--cluster", ""))
    spec = spec.model_copy(update={"node": spec.node.model_copy(update={"nvls": False})})
    built = build_cluster(spec, 8, "dgx-h100-ib")
    no_nvls = GroupCost(built, place(built, 8, "blocked")).time("all-reduce", "auto", size)[0]
    assert size / no_nvls * bus_factor("all-reduce", 8) / 1e9 == pytest.approx(busbw, rel=1e-9)


def test_a_named_algorithm_the_variables_disable_cannot_run():
    """commsim's `algorithm: tree` under NCCL is NCCL's Tree: with NCCL_ALGO=ring the group
    no longer runs it (the planner drops such layouts) and predict says so in one line."""
    assert "tree" in _group().algorithms("all-reduce")
    assert "tree" not in _group(algo="ring").algorithms("all-reduce")  # rhd, ps...: graph ones
    args = ["predict", "--model", "gpt2-xl", "--cluster", "dgx-a100-ib", "--gpus", "16"]
    out = runner.invoke(app, [*args, "--algorithm", "tree", "--nccl-algo", "ring"])
    assert out.exit_code == 2
    assert "--algorithm tree" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def _nccl_profile(tmp_path, **nccl):
    """A calibration profile with an NCCL block and nothing fitted but `nccl`'s fields."""
    import yaml

    path = tmp_path / "p.yaml"
    provenance = {"files": [], "runs": [], "date": "", "points": 0, "commsim": "0"}
    doc = {"format": 2, "cluster": "dgx-a100-ib", "backend": "nccl", "hardware": {},
           "tiers": {}, "algorithms": {}, "nccl": {"version": "2.30", **nccl},
           "provenance": provenance}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_profile_sets_nccl_algo_and_proto_unless_the_cluster_does(tmp_path):
    from commsim.profile import carry_over, load_profile

    profile = load_profile(_nccl_profile(tmp_path, algo="ring", proto="Simple"))
    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-a100-ib", "--cluster", ""))
    applied, notes = carry_over(spec, profile)
    assert (applied.nccl.algo, applied.nccl.proto) == ("ring", "Simple")
    assert "NCCL_ALGO=ring (the profile's)" in notes
    own = spec.model_copy(update={"nccl": spec.nccl.model_copy(update={"proto": "LL"})})
    kept, notes = carry_over(own, profile)
    assert (kept.nccl.algo, kept.nccl.proto) == ("ring", "LL")
    assert "NCCL_PROTO=LL (the cluster's) stands over the profile's Simple" in notes


def test_the_profiles_overrides_price_as_the_flags_do_and_a_flag_wins(tmp_path):
    """`collective` and `predict` with the profile's NCCL_ALGO / NCCL_PROTO give what the
    same values as flags give; a flag given with the profile replaces its value."""
    path = str(_nccl_profile(tmp_path, algo="ring", proto="Simple"))
    base = ["collective", "all-gather", "--cluster", "dgx-a100-ib", "--gpus", "64"]
    base += ["--sizes", "1KiB:1MiB", "--algorithm", "auto", "--json"]
    flags = ["--nccl-algo", "ring", "--nccl-proto", "Simple"]
    by_profile = json.loads(runner.invoke(app, [*base, "--profile", path]).stdout)
    by_flags = json.loads(runner.invoke(app, [*base, *flags]).stdout)
    assert [r["time_s"] for r in by_profile["rows"]] == [r["time_s"] for r in by_flags["rows"]]
    assert {(r["nccl_algorithm"], r["protocol"]) for r in by_profile["rows"]} == {
        ("Ring", "Simple")
    }
    ll = json.loads(runner.invoke(app, [*base, "--profile", path, "--nccl-proto", "LL"]).stdout)
    assert {r["protocol"] for r in ll["rows"]} == {"LL"}
    args = ["predict", "--model", "gpt2-xl", "--cluster", "dgx-a100-ib", "--gpus", "16", "--json"]
    step = json.loads(runner.invoke(app, [*args, "--profile", path]).stdout)["step_time_s"]
    assert step == json.loads(runner.invoke(app, [*args, *flags]).stdout)["step_time_s"]


def test_a_profiles_bad_override_is_one_line_naming_file_and_field(tmp_path):
    path = str(_nccl_profile(tmp_path, proto="Simpel"))
    base = ["collective", "all-gather", "--cluster", "dgx-a100-ib", "--gpus", "64"]
    out = runner.invoke(app, [*base, "--sizes", "1KiB", "--profile", path])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1
    assert f"{path}: nccl: NCCL_PROTO='Simpel'" in out.stderr and "knows no" in out.stderr


@pytest.mark.parametrize("command", ["predict", "collective"])
def test_a_version_other_than_the_profiles_fit_is_refused(tmp_path, command):
    """A profile's NCCL fit is priced by the version it ran at: `--nccl-version` naming
    another is refused in one line (predict used to keep the profile's silently), the same
    version is accepted."""
    path = str(_nccl_profile(tmp_path))
    args = ["predict", "--model", "gpt2-xl", "--gpus", "16"]
    if command == "collective":
        args = ["collective", "all-reduce", "--gpus", "16", "--sizes", "1MiB"]
    args += ["--cluster", "dgx-a100-ib", "--profile", path]
    out = runner.invoke(app, [*args, "--nccl-version", "2.18"])
    assert out.exit_code == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "--nccl-version 2.18: the profile" in out.stderr and "fitted at NCCL 2.30" in out.stderr
    assert runner.invoke(app, [*args, "--nccl-version", "2.30"]).exit_code == 0
