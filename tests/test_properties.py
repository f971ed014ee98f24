"""Property-based tests (hypothesis) over the spec loaders and the command line's flags: for
any input, either exit 0 with finite, non-negative figures, or exit 2 with one line naming
the flag or the file and field; never a traceback, a NaN or an infinity. Examples are
bounded and derandomized: the same inputs on every run, a few seconds of CI."""

from __future__ import annotations

import json
import math
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.spec_io import parse_spec
from commsim.specs import ClusterSpec, SpecError

CHECKED = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FEW = settings(CHECKED, max_examples=12)

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
)
quantities = st.builds(
    lambda n, unit: f"{n}{unit}",
    numbers,
    st.sampled_from(["", "B", "GB", "PiB", "Gbps", "GB/s", "us", "ms", "d", "x", " B/s"]),
)
values = st.one_of(numbers, quantities, st.text(max_size=12), st.none(), st.booleans())

CLUSTER: dict[str, Any] = yaml.safe_load(
    """
name: prop
nodes: 4
node:
  gpu: a100
  gpus_per_node: 8
  interconnect: nvswitch
  intra_latency: 1us
  nics: {count: 2, bandwidth: 100Gbps, latency: 2us}
fabric: {kind: infiniband, nodes_per_leaf: 2, link_latency: 100ns, switch_latency: 200ns}
"""
)
PATHS = [
    ("nodes",),
    ("node", "gpus_per_node"),
    ("node", "intra_latency"),
    ("node", "intra_bandwidth"),
    ("node", "pcie_bandwidth"),
    ("node", "nics", "count"),
    ("node", "nics", "bandwidth"),
    ("node", "nics", "latency"),
    ("fabric", "nodes_per_leaf"),
    ("fabric", "oversubscription"),
    ("fabric", "link_latency"),
    ("fabric", "switch_latency"),
]


def _finite_and_not_negative(obj: Any, where: str = "") -> None:
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, (int, float)):
        assert math.isfinite(obj) and obj >= 0, f"{where} = {obj}"
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _finite_and_not_negative(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _finite_and_not_negative(v, f"{where}[{i}]")


@CHECKED
@given(path=st.sampled_from(PATHS), value=values)
def test_a_cluster_file_is_valid_or_one_spec_error(path, value):
    data = json.loads(json.dumps(CLUSTER))
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    try:
        spec = parse_spec(ClusterSpec, data, "c.yaml")
    except SpecError as e:
        text = str(e)
        assert text.startswith("c.yaml: ") and "\n" not in text
        assert ".".join(path[:2]) in text or path[0] in text
        return
    _finite_and_not_negative(spec.model_dump(), "cluster")


def _answered(*args: str) -> dict[str, Any] | None:
    """The command's JSON on exit 0 (checked finite and non-negative), None on exit 2 (one
    error line naming a flag or a file's field); any other outcome fails."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines() if result.stderr else []
        lines = lines or result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert "--" in lines[0] or ": " in lines[0][7:], lines[0]
        assert "Traceback" not in result.output and not result.stdout.strip()
        return None
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    _finite_and_not_negative(doc, args[0])
    return doc


flag_value = st.one_of(
    st.integers(min_value=-3, max_value=5000).map(str),
    st.sampled_from(["0", "1", "2", "8", "inf", "-inf", "nan", "1e400", "1e-300", "", "x", "3.5"]),
)
PREDICT_FLAGS = st.dictionaries(
    st.sampled_from(
        [
            "--gpus",
            "--global-batch",
            "--micro-batch",
            "--seq-len",
            "--tp",
            "--pp",
            "--zero",
            "--bucket-mb",
            "--tokens",
            "--price-per-gpu-hour",
            "--interleave",
            "--ep",
        ]
    ),
    flag_value,
    max_size=3,
)
WORDS = st.dictionaries(
    st.sampled_from(["--compression", "--recompute", "--algorithm", "--placement", "--model"]),
    st.sampled_from(
        [
            "none",
            "int8",
            "topk:0.01",
            "topk:2",
            "powersgd:0",
            "full",
            "ring",
            "tree",
            "nccl",
            "magic",
            "interleaved",
            "llama3-8b",
            "bert-large",
            "resnet50",
            "",
        ]
    ),
    max_size=2,
)


@CHECKED
@given(flags=PREDICT_FLAGS, words=WORDS)
def test_predict_answers_any_flags(flags, words):
    args = [x for k, v in {**flags, **words}.items() for x in (k, v)]
    _answered("predict", *args)


@FEW
@given(flags=PREDICT_FLAGS.filter(lambda f: "--gpus" not in f), top=flag_value)
def test_plan_answers_any_flags(flags, top):
    args = [x for k, v in flags.items() for x in (k, v)]
    _answered("plan", "--top", top, *args)


@CHECKED
@given(
    sizes=st.builds(lambda a, b: f"{a}:{b}", quantities, quantities),
    gpus=st.integers(min_value=-2, max_value=300).map(str),
    algorithm=st.sampled_from(["all", "auto", "ring", "tree", "rhd", "magic", "ring|tree"]),
)
def test_collective_answers_any_sizes(sizes, gpus, algorithm):
    _answered(
        "collective", "all-reduce", "--sizes", sizes, "--gpus", gpus, "--algorithm", algorithm
    )
