"""DeepSeek-V3's DualPipe: its bubble against the paper's formula and its schedule run event
by event, its memory (two stages a rank, pp + 1 in flight), and where it is refused."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import make_cluster
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec
from commsim.step import dualpipe
from commsim.step.layouts import Layouts
from commsim.step.memory import ParallelLayout, memory_per_gpu
from commsim.step.model import StepModel
from commsim.step.pipeline import ChunkTimes, simulate_dualpipe
from commsim.step.predict import predict
from commsim.workload.presets import build_workload

GPT = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)


def _bubble(pp, m, d):
    """The busiest rank's idle time in the event-level schedule."""
    ops = dualpipe.simulate(pp, m, d)
    span = max(op[5] for op in ops)
    return span - m * (d.forward + d.backward + 2 * d.send)


@pytest.mark.parametrize("pp", [2, 4, 6, 8])
def test_bubble_by_hand_and_by_the_schedule(pp):
    # F = 1, B = 2, W = 1 (a GEMM's backward twice its forward, half of it weight gradient):
    # Table 2's (pp/2 - 1)(F&B + B - 3W) = (pp/2 - 1)(3 + 2 - 3) = pp - 2, against 1F1B's
    # (pp - 1)(F + B) = 3 (pp - 1); the schedule run op by op leaves every rank idle as long
    d = dualpipe.Durations(1.0, 2.0, 1.0)
    assert float(dualpipe.bubble(pp, 3.0, 2.0, 1.0)) == pp - 2
    for m in (2 * pp, 2 * pp + 6):
        assert _bubble(pp, m, d) == pytest.approx(pp - 2, abs=1e-12)


def test_the_formula_is_the_papers_estimate_elsewhere():
    # away from B = 2F, W = F the run schedule and Table 2 part (README: a documented gap):
    # F = 1, B = 2.3, W = 0.7 on 8 ranks: 9.5 s idle where the formula says 3 x 3.5
    d = dualpipe.Durations(1.0, 2.3, 0.7)
    assert _bubble(8, 16, d) == pytest.approx(9.5)
    assert float(dualpipe.bubble(8, 3.3, 2.3, 0.7)) == pytest.approx(10.5)


def test_the_range_the_readme_states():
    # the schedule's idle time over Table 2's, B / F 1.5-3, W / B 0.3-0.6, pp 4-16
    ratios = []
    for pp, b, share in itertools.product(
        (4, 6, 8, 16), (1.5, 2.0, 2.5, 3.0), (0.3, 0.4, 0.5, 0.6)
    ):
        d = dualpipe.Durations(1.0, b, share * b)
        ratios.append(_bubble(pp, 2 * pp + 4, d) / float(dualpipe.bubble(pp, 1 + b, b, share * b)))
    assert min(ratios) == pytest.approx(0.765, abs=5e-4)
    assert max(ratios) == pytest.approx(1.538, abs=5e-4)


def test_every_rank_runs_each_micro_batch_once_and_holds_pp_plus_one():
    pp, m = 6, 16
    ops = dualpipe.simulate(pp, m, dualpipe.Durations(1.0, 2.0, 1.0))
    for r in range(pp):
        mine = [op for op in ops if op[0] == r]
        forwards = sorted((p, mb) for _, k, p, mb, *_ in mine if k == "F")
        assert forwards == [(p, mb) for p in (0, 1) for mb in range(m // 2)]
        backs = [(p, mb) for _, k, p, mb, *_ in mine if k in ("B", "D")]
        assert len(backs) == m and len(set(backs)) == m
        weights = [(p, mb) for _, k, p, mb, *_ in mine if k == "W"]
        deferred = [(p, mb) for _, k, p, mb, *_ in mine if k == "D"]
        assert deferred and sorted(weights) == sorted(deferred)  # each deferred one run once
        # activations live from a forward to its weight gradient: pp + 1 at the peak
        live = peak = 0
        for _, k, *_ in mine:
            live += {"F": 1, "B": -1, "W": -1}.get(k, 0)
            peak = max(peak, live)
        assert peak == pp + 1 == 2 * float(dualpipe.in_flight(pp))


def test_sends_are_paid_by_every_op_with_a_neighbour():
    # a rank's hand-offs lengthen its ops, not its count of them: the end ranks send nothing
    # after the forward of their far stage nor the backward of their near one
    ops = dualpipe.simulate(4, 8, dualpipe.Durations(1.0, 2.0, 1.0, send=0.5))
    tos = {(op[0], op[1], op[2]): op[6] for op in ops if op[1] in ("F", "B")}
    assert tos[(0, "F", 0)] == 1 and tos[(0, "F", 1)] is None  # stage 0 of 0, stage 3 of 1
    assert tos[(3, "F", 0)] == 2 and tos[(3, "F", 1)] is None
    assert tos[(1, "F", 0)] == 2 and tos[(1, "F", 1)] == 0


def test_events_of_the_schedule_keep_compute_collectives_and_sends_apart():
    t = ChunkTimes(1.0, 2.0, 0.1, 0.2, 0.05, 0.0, 0.0, 0.0, 0.0, wgrad=1.0)
    ops = simulate_dualpipe(4, 8, t)
    assert all(op.compute_end <= op.tp_end <= op.end for op in ops)
    whole = max(op.end for op in ops)
    d = dualpipe.Durations(1.1, 2.2, 1.0, 0.05)
    assert whole == pytest.approx(max(op[5] for op in dualpipe.simulate(4, 8, d)))


@pytest.mark.parametrize(
    "pp,v,m,says",
    [
        (3, 1, 12, "even pp"),
        (1, 1, 12, "even pp"),
        (4, 2, 16, "interleave must be 1"),
        (4, 1, 6, "at least 2 x pp = 8"),
        (4, 1, 9, "an even number of micro-batches"),
    ],
)
def test_where_it_cannot_run(pp, v, m, says):
    assert says in dualpipe.problem(pp, v, m)
    assert not dualpipe.applies(pp, v, m)[0]
    assert dualpipe.problem(4, 1, 8) is None and dualpipe.applies([4, 3], 1, 8).tolist() == [
        True,
        False,
    ]


def test_memory_holds_two_stages_and_pp_plus_one_micro_batches():
    # 8 layers over pp 4, no ZeRO: 1F1B's rank 0 holds layers 0-1 and 4 micro-batches of
    # them; DualPipe's holds layers 0-1 and 6-7 (embedding and head too), 5 micro-batch
    # stages of activations: (4 + 1) / 2 passes over its 4 layers
    w = build_workload(GPT, 256, "toy")
    one = memory_per_gpu(w, ParallelLayout(dp=2, pp=4, micro_batches=8))
    dual = memory_per_gpu(w, ParallelLayout(dp=2, pp=4, micro_batches=8, dualpipe=True))
    assert dual.params > one.params
    per_layer = one.activations  # rank 0 of 1F1B: 4 x 2 layers' worth (no loss there)
    stage_act = per_layer / (4 * 2)
    assert dual.activations == pytest.approx(5 / 2 * 4 * stage_act + _output(w))
    # parameters twice, ZeRO-1's optimizer shards over both copies' ranks (2 x dp = 4)
    z1d = memory_per_gpu(w, ParallelLayout(dp=2, pp=4, zero=1, micro_batches=8, dualpipe=True))
    blocks = sum(lay.params for lay in w.layers if lay.name.startswith("block."))
    ends = w.params - blocks + 1000 * 512  # and the tied head's copy of the embedding
    assert z1d.params == pytest.approx(2 * (blocks / 2 + ends))  # 4 of 8 layers + both ends
    assert z1d.optimizer == pytest.approx(z1d.params / 2 * 12 / 2 / 2)


def _output(w):
    """The loss's activations (Korthikanti sec. 4.3): 4 s b h (1 + v / h), one micro-batch."""
    return 4 * 256 * 512 * (1 + 1000 / 512)


def test_the_step_model_prices_the_formula_and_keeps_its_bound():
    w = build_workload(GPT, 256, "toy")
    cluster = make_cluster(nodes=2, gpus_per_node=8, nics=8, nic_bw="400Gbps")
    model = StepModel(w, cluster, catalog.GPUS["h100"], 16, 64, None)
    L = Layouts.build(dp=4, pp=4, micro_batches=16, schedule=[0, 1])
    b = model.evaluate(L)
    c = model.compute(L)
    tick = (b.step - b.dp_exposed - b.optimizer - b.bubble) / 16
    assert b.bubble[0] == pytest.approx(3 * tick[0])
    # 1F1B's slowest stage is the last (2 layers, the head and the loss); DualPipe's end
    # ranks run it by turns with the first (2 layers and the embedding)
    t = model._stage_times(L)
    assert c.forward[0] == pytest.approx(2 * t.block_fwd[0] + t.post_fwd[0])
    assert c.forward[1] == pytest.approx(2 * t.block_fwd[1] + (t.pre_fwd[1] + t.post_fwd[1]) / 2)
    assert tick[1] < tick[0]
    back = (b.backward + (b.tp_comm + b.cp_comm + b.ep_comm - b.comm_forward) + b.pp_comm / 2) / 16
    want = (4 / 2 - 1) * (tick[1] + back[1] - 3 * c.wgrad[1])
    assert b.bubble[1] == pytest.approx(want)
    assert b.bubble[1] < b.bubble[0]
    assert (model.step_bound(L) <= b.step + 1e-12).all()
    assert b.memory[1] > b.memory[0]


def _scenario(tmp_path, **strategy):
    path = tmp_path / "s.yaml"
    doc = dict(model="llama2-7b", cluster="dgx-a100-ib", gpus=16, global_batch=32, seq_len=1024)
    path.write_text(json.dumps(doc | {"strategy": {"pipeline_schedule": "dualpipe"} | strategy}))
    return str(path)


@pytest.mark.parametrize(
    "command,strategy,says",
    [
        (["predict"], {"pp": 1}, "strategy.pipeline_schedule: DualPipe needs an even pp"),
        (["predict"], {"pp": 2, "interleave": 2}, "interleave must be 1"),
        (["trace", "export", "--out", "OUT"], {"pp": 2}, "not exported to Chakra"),
    ],
)
def test_refused_in_one_line_where_it_cannot_run(tmp_path, command, strategy, says):
    command = [str(tmp_path / "t") if c == "OUT" else c for c in command]
    out = CliRunner().invoke(app, [*command, _scenario(tmp_path, **strategy)])
    assert out.exit_code == 2, out.output
    assert len(out.output.strip().splitlines()) == 1 and says in out.output
    assert not list(tmp_path.glob("t*"))


def test_predict_runs_it_and_draws_its_schedule(tmp_path):
    # pp 2 x dp 8, 32 / 8 = 4 micro-batches: the bubble (2 / 2 - 1)(...) is nil; the Gantt
    # holds each rank's 4 forwards, 4 backwards (some with weight gradients deferred) and those
    out = CliRunner().invoke(app, ["predict", _scenario(tmp_path, pp=2), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["bubble_s"] == 0.0 and doc["strategy"]["pipeline_schedule"] == "dualpipe"
    sc, src = load_scenario(_scenario(tmp_path, pp=2), {})
    events = predict(resolve(sc, src), sc.strategy).events
    for k in (0, 1):
        labels = [e.label.split() for e in events if e.stream == f"stage {k}"]
        assert sum(w[0] == "forward" for w in labels) == 4
        weights = sum(w[0] == "backward" and w[2] == "weights" for w in labels)
        assert sum(w[0] == "backward" and w[2] == "chunk" for w in labels) == 4 - weights
        assert weights == sum(w[0] == "backward" and w[2] == "inputs" for w in labels) > 0


def test_the_flag_pins_it_and_the_tables_name_it():
    """--pipeline-schedule on predict and plan: the same as the scenario field; the layout
    label and the plan's sentence name it, the bubble row gives DualPipe's rule."""
    flags = ["--pp", "4", "--pipeline-schedule", "dualpipe"]
    out = CliRunner().invoke(app, ["predict", *flags])
    assert out.exit_code == 0, out.output
    assert "dp16 pp4 dualpipe mb1" in out.output and "(p / 2 - 1)(F&B + B - 3W)" in out.output
    doc = json.loads(CliRunner().invoke(app, ["predict", *flags, "--json"]).output)
    assert doc["strategy"]["pipeline_schedule"] == "dualpipe" and doc["bubble_s"] > 0
    plan = json.loads(CliRunner().invoke(app, ["plan", *flags, "--top", "2", "--json"]).output)
    assert plan["candidates"] and all(
        c["strategy"]["pipeline_schedule"] == "dualpipe" and c["strategy"]["pp"] == 4
        for c in plan["candidates"]
    )
    bad = CliRunner().invoke(app, ["predict", "--pipeline-schedule", "zigzag"])
    assert bad.exit_code == 2 and "--pipeline-schedule zigzag" in bad.output
