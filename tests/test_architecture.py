"""The package's layers run one way: no import circles, and the core never reaches an edge.

Reads every `from commsim... import` and `import commsim...` in commsim/, at module level and
inside functions alike, and builds the module graph from them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import commsim

ROOT = Path(commsim.__file__).parent
# the edges: command line, output, calibration against real runs, notebooks' API, seed claims
EDGES = ("commsim.cli", "commsim.report", "commsim.calibrate", "commsim.whatif", "commsim.claims")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> module for every commsim import in commsim/."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("commsim"):
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("commsim")]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert graph.has_edge("commsim.cli.claims", "commsim.claims")  # imported inside claims_cmd
    assert graph.number_of_edges() > 100


def test_no_import_circles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles[:5])


def test_the_core_never_imports_an_edge():
    wrong = [
        f"{a} -> {b}"
        for a, b in import_graph().edges
        if not a.startswith(EDGES) and b.startswith(EDGES)
    ]
    assert wrong == []


def test_planning_never_imports_torch():
    heavy = []
    for path in ROOT.rglob("*.py"):
        if _module(path).startswith("commsim.calibrate"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            heavy += [f"{_module(path)}: {n}" for n in names if n.split(".")[0] == "torch"]
    assert heavy == []
