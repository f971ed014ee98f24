"""The what-if API (commsim.whatif) and the notebooks that use it, executed for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim import whatif
from commsim.specs import ClusterSpec, SpecError

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_change_reaches_scenario_strategy_and_cluster_fields():
    base = whatif.load()
    changed = whatif.change(
        base, {"cluster.fabric.oversubscription": [3, 1]}, gpus=32, compression="fp16"
    )
    assert changed.gpus == 32 and changed.strategy.compression == "fp16"
    assert isinstance(changed.cluster, ClusterSpec)
    assert changed.cluster.name == "aws-p4d" and changed.cluster.fabric.oversubscription == [3, 1]
    assert base.gpus == 64 and base.cluster == "aws-p4d"  # the original is untouched


def test_oversubscribed_uplinks_slow_an_interleaved_step():
    # 2 racks of the p4d fabric (8 nodes each); an interleaved ring crosses them every hop,
    # so the change must reach the graph evaluator (x1.8 here, not 3: p4d's ECMP hashing
    # already piles several of the 64 cross-rack flows onto some uplinks at 1:1, and a
    # ring step waits for its slowest flow)
    kw = {"gpus": 128, "global_batch": 512, "placement": "interleaved", "algorithm": "ring"}
    base = whatif.load(None, kw)
    flat = whatif.predict(base)
    oversub = whatif.predict(whatif.change(base, {"cluster.fabric.oversubscription": [3, 1]}))
    assert oversub.parts["comm_s"] > 1.5 * flat.parts["comm_s"]
    assert oversub.parts["compute_s"] == pytest.approx(flat.parts["compute_s"])


def test_sweep_is_the_predictions_one_by_one():
    base = whatif.load()
    sweep = whatif.sweep(base, "bucket_mb", [1, 25, 200])
    one_by_one = [
        whatif.predict(whatif.change(base, bucket_mb=b)).step_time_s for b in (1, 25, 200)
    ]
    assert sweep.column("step_time_s").tolist() == one_by_one
    assert [r["bucket_mb"] for r in sweep.rows(["mfu"])] == [1, 25, 200]
    fig = sweep.plot(["step_time_s", "exposed_comm_s"])
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(KeyError, match="no metric 'speed'"):
        sweep.column("speed")


def test_bad_changes_name_the_field():
    base = whatif.load()
    with pytest.raises(SpecError, match=r"cluster\.fabric\.oversubscription\.0: .*greater than"):
        whatif.change(base, {"cluster.fabric.oversubscription": [0, 1]})
    with pytest.raises(SpecError, match="'nope' is not a section of the cluster"):
        whatif.change(base, {"cluster.nope.x": 1})
    with pytest.raises(SpecError, match="strategy.tp"):
        whatif.change(base, tp=0)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute(cwd=str(path.parent))
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # it drew its plots
    assert "What it comes to" in "".join(c.source for c in nb.cells)


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"uplink-oversubscription", "topk-at-1024-gpus"}


def test_readme_python_examples_run():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
