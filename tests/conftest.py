"""Shared test fixtures: small clusters built from specs written inline, the
benchmarks/ scripts loaded as modules, and one profiled harness run the traces tests share."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# pytest-xdist's workers load GNU readline, which exports COLUMNS=80 and LINES=24 off a tty;
# the tests check the page laid out for piped output (120 columns unless COLUMNS is set), so
# they start without them, before commsim's console reads them, and so do their subprocesses.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

from commsim.specs import ClusterSpec  # noqa: E402
from commsim.topology.build import build_cluster  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (make test's first phase) the slow tests go first: the scheduler
    deals the first tests out one at a time, so the long ones split between the workers and
    the short ones fill the end, where a long test dealt last would keep one worker busy
    while the other idles. Otherwise in file order (stable: each file's order kept)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def make_spec(
    *,
    nodes: int = 4,
    gpus_per_node: int = 8,
    nics: int = 1,
    nic_bw: str = "100Gbps",
    intra_bw: str = "300GB/s",
    nodes_per_leaf: int = 2,
    oversubscription: tuple[float, ...] = (1.0, 1.0),
    tiers: int = 2,
    leaves_per_pod: int = 8,
    rail_optimized: bool = False,
    routing: str = "balanced",
    backend: str = "gloo",
    **fabric_extra,
) -> ClusterSpec:
    """A cluster spec with round numbers, for hand-computed expectations: by default its
    collectives run commsim's schedules on the graph (backend gloo), which the hand
    computations follow; backend="nccl" prices them with NCCL's model."""
    return ClusterSpec.model_validate(
        {
            "name": "test",
            "backend": backend,
            "nodes": nodes,
            "node": {
                "gpu": "a100-80gb",
                "gpus_per_node": gpus_per_node,
                "interconnect": "nvswitch",
                "intra_bandwidth": intra_bw,
                "intra_latency": "1us",
                "pcie_bandwidth": "1TB/s",
                "nics": {"count": nics, "bandwidth": nic_bw, "latency": "2us"},
                "rail_optimized": rail_optimized,
            },
            "fabric": {
                "kind": "infiniband",
                "tiers": tiers,
                "nodes_per_leaf": nodes_per_leaf,
                "leaves_per_pod": leaves_per_pod,
                "oversubscription": list(oversubscription),
                "link_latency": "100ns",
                "switch_latency": "200ns",
                "routing": routing,
            }
            | fabric_extra,
        }
    )


def make_cluster(n_gpus: int | None = None, **kw):
    """Build a cluster from make_spec's arguments."""
    return build_cluster(make_spec(**kw), n_gpus)


@pytest.fixture
def uniform_fat_tree():
    """16 single-GPU nodes on a non-blocking 2-tier fat tree with zero switch latency:
    every pair of GPUs sees the same latency and bandwidth."""
    return make_cluster(
        nodes=16, gpus_per_node=1, nodes_per_leaf=4, link_latency="0s", switch_latency="0s"
    )


@pytest.fixture
def nvswitch_node():
    """One 8-GPU NVSwitch node."""
    return make_cluster(nodes=1, gpus_per_node=8)


def load_script(name: str):
    """benchmarks/<name>.py as a module, registered under its name (its dataclasses and the
    scripts that import it resolve to this one)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def random_ddp_layers(rng):
    """Random per-layer forward and backward seconds (some backwards empty), 1-3 tensors a
    layer, and up to 5 buckets of tensor indices in DDP's reverse order: for the timeline
    against its closed forms."""
    n_layers = int(rng.integers(1, 12))
    fwd = rng.uniform(0, 1, n_layers)
    bwd = rng.uniform(0, 2, n_layers) * (rng.uniform(size=n_layers) < 0.9)
    tensor_layer = np.repeat(np.arange(n_layers), rng.integers(1, 4, n_layers))
    order = np.arange(tensor_layer.size)[::-1]
    cuts = np.sort(rng.choice(np.arange(1, order.size), min(order.size - 1, 4), replace=False))
    buckets = [list(b) for b in np.split(order, cuts if order.size > 1 else [])]
    return fwd, bwd, tensor_layer, buckets


@pytest.fixture(scope="session")
def harness_traces(tmp_path_factory):
    """(results file, profile folder) of one `calibrate run --local 2 --profile-dir`: two gloo
    ranks, a short all-reduce sweep, DDP steps of a 2-block MLP of width 1024 (19M
    parameters) in 5 MiB buckets, profiled. Run once for every test that reads real
    harness traces (each run is two torch processes and tens of seconds on 2 cores)."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("harness-traces")
    out, prof = tmp / "r.jsonl", tmp / "prof"
    cmd = [sys.executable, "-m", "commsim.cli.calibrate", "run", "--local", "2", "--out", str(out)]
    cmd += ["--ops", "all-reduce", "--sizes", "64KiB:128KiB", "--warmup", "1", "--repeats", "5"]
    cmd += ["--width", "1024", "--depth", "2", "--batch", "32", "--bucket-mb", "5"]
    cmd += ["--profile-dir", str(prof)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out, prof
