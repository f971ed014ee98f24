"""The simulated pipeline schedule against 1F1B's structure and the hybrid model's formula."""

from __future__ import annotations

import itertools

import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.report.plots import plot_pipeline
from commsim.specs import ModelSpec
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.step.pipeline import (
    chunk_times,
    event_kind,
    event_stage,
    idle_gaps,
    pipeline_events,
    pipeline_span,
    simulate,
    stage_order,
)
from commsim.workload.presets import build_workload

F, B, TP_F, TP_B = 1.0, 2.0, 0.25, 0.25  # seconds per micro-batch on a whole stage


def _layout(p, m, v=1, zero=0, recompute="none", overlap=True):
    return dict(
        pp=p, micro_batches=m, interleave=v, zero=zero, recompute=recompute, overlap=overlap
    )


def _parts(m, v=1, send=0.0, dp_comm=0.6, dp_exposed=0.2, optimizer=0.5):
    """A StepBreakdown row for uniform stages: every micro-batch costs the same."""
    return dict(
        compute=m * (F + B),
        forward=m * F,
        backward=m * B,
        tp_comm=m * (TP_F + TP_B),
        cp_comm=0.0,
        ep_comm=0.0,
        comm_forward=m * TP_F,
        pp_comm=m * 2.0 * send * v,
        dp_comm=dp_comm,
        dp_exposed=dp_exposed,
        optimizer=optimizer,
        wgrad=m * B / 2,
    )


def _tick(v=1, send=0.0):
    return F + B + TP_F + TP_B + 2.0 * send * v  # as parallel.py's tick


def _span(events):
    start, end = pipeline_span(events)
    return end - start


def _idle(events, stage):
    start, end = pipeline_span(events)
    return sum(b - a for a, b in idle_gaps(events, stage, start, end))


def _times(m, v, s):
    """Chunk durations with sends of s seconds."""
    return chunk_times(_layout(1, m, v), _parts(m, v, send=s))


def test_1f1b_order_p4_m8():
    p, m = 4, 8
    for k in range(p):
        order = stage_order(p, m, 1, k)
        kinds = "".join(kind for kind, _, _ in order)
        warm = p - 1 - k
        # warm-up forwards, then one forward one backward, then the cool-down backwards
        assert kinds == "F" * warm + "FB" * (m - warm) + "B" * warm
        assert [i for kind, _, i in order if kind == "F"] == list(range(m))
        assert [i for kind, _, i in order if kind == "B"] == list(range(m))
    assert stage_order(4, 2, 1, 0) == [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)]


def test_interleaved_order_is_megatron_depth_first():
    # p = 2, v = 2, m = 4, stage 0: warm-up 2 (p - 1) + (v - 1) p = 4 forwards: micro-batches
    # 0, 1 of chunk 0 then of chunk 1; backwards walk the chunks in reverse
    order = stage_order(2, 4, 2, 0)
    assert order[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1)]
    assert order[4:8] == [("F", 0, 2), ("B", 1, 0), ("F", 0, 3), ("B", 1, 1)]
    assert order[-4:] == [("B", 1, 2), ("B", 1, 3), ("B", 0, 2), ("B", 0, 3)]
    assert sorted(order) == sorted(itertools.product("FB", range(2), range(4)))


@pytest.mark.parametrize("p, m", [(4, 8), (2, 1), (3, 5), (8, 16), (1, 4)])
def test_1f1b_makespan_is_the_model_formula_with_free_sends(p, m):
    events = pipeline_events(_layout(p, m), _parts(m))
    assert _span(events) == pytest.approx((m + p - 1) * _tick(), rel=1e-12)


@pytest.mark.parametrize("p, m", [(3, 2), (4, 8), (8, 16)])
def test_1f1b_makespan_with_sends_is_three_sends_under_the_formula(p, m):
    # the model charges every stage two sends per micro-batch; the end stages send one way
    s = 0.1
    events = pipeline_events(_layout(p, m), _parts(m, send=s))
    assert _span(events) == pytest.approx((m + p - 1) * _tick(send=s) - 3 * s, rel=1e-12)


@pytest.mark.parametrize("p, m", [(4, 8), (2, 3), (8, 8)])
def test_1f1b_bubble_fraction(p, m):
    events = pipeline_events(_layout(p, m), _parts(m, dp_exposed=0.0, optimizer=0.0))
    for k in range(p):
        assert _idle(events, k) / _span(events) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 16, 4), (2, 4, 2), (8, 8, 2), (3, 9, 3)])
def test_interleaved_makespan_is_the_model_formula(p, m, v):
    # exact with free sends; with paid ones, under the formula by at most m + 1 sends (the
    # end stages' missing hand-offs), never under the formula without sends
    events = pipeline_events(_layout(p, m, v), _parts(m, v))
    assert _span(events) == pytest.approx((m + (p - 1) / v) * _tick(v), rel=1e-12)
    s = 0.1
    span = _span(pipeline_events(_layout(p, m, v), _parts(m, v, send=s)))
    formula = (m + (p - 1) / v) * _tick(v, s)
    assert (m + (p - 1) / v) * _tick(v) < span <= formula + 1e-9
    assert span >= formula - (m + 1) * s - 1e-9


def test_interleaved_idles_less_than_1f1b():
    p, m = 4, 8
    plain = pipeline_events(_layout(p, m), _parts(m))
    for v in (2, 4):
        inter = pipeline_events(_layout(p, m, v), _parts(m, v))
        assert _idle(inter, 0) < _idle(plain, 0)
        assert _idle(inter, 0) == pytest.approx((p - 1) / v * _tick())  # the bubble, per stage


@pytest.mark.parametrize("p, m, v", [(4, 6, 2), (3, 7, 2), (4, 9, 3)])
def test_interleaved_groups_of_more_than_p_keep_the_formula(p, m, v):
    # p does not divide m: the micro-batches go in larger groups, as Megatron-core allows
    span = _span(pipeline_events(_layout(p, m, v), _parts(m, v)))
    assert span == pytest.approx((m + (p - 1) / v) * _tick(v), rel=1e-12)


def test_interleaving_fewer_micro_batches_than_stages_misses_the_formula():
    # m < p (Megatron-core refuses it): the (p - 1) / v bubble is out of reach; with one
    # micro-batch, interleaving saves nothing at all
    p, v = 4, 2
    for m in (1, 3):
        span = _span(pipeline_events(_layout(p, m, v), _parts(m, v)))
        assert span > (m + (p - 1) / v) * _tick(v) + 0.1
    one = _span(pipeline_events(_layout(p, 1, v), _parts(1, v)))
    assert one == pytest.approx(p * _tick())


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (3, 7, 3), (5, 10, 2)])
def test_dependencies_and_one_op_at_a_time(p, m, v):
    s = 0.05
    events = pipeline_events(_layout(p, m, v), _parts(m, v, send=s))
    for k in range(p):
        busy = sorted(
            (ev.start_s, ev.end_s)
            for ev in events
            if event_stage(ev) == k and event_kind(ev) in ("forward", "backward", "tp", "send")
        )
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(busy))
    ops = {(o.kind, o.stage, o.chunk, o.mb): o for o in simulate(p, m, v, _times(m, v, s))}
    for (kind, k, c, i), op in ops.items():
        if kind == "F":
            src = (k - 1, c) if k > 0 else (p - 1, c - 1) if c > 0 else None
        else:
            src = (k + 1, c) if k < p - 1 else (0, c + 1) if c < v - 1 else None
        if src is None:
            continue
        prev = ops[(kind, *src, i)]
        assert prev.to == k  # it sent to this stage ...
        assert prev.end - prev.tp_end == pytest.approx(s)
        assert op.start >= prev.end - 1e-12  # ... and this op waited for the send to land
    sends = [ev for ev in events if event_kind(ev) == "send"]
    assert len(sends) == 2 * m * (p * v - 1)  # every chunk boundary, both ways


@pytest.mark.parametrize("v", [1, 2])
def test_zero3_gathers_are_prefetched_before_their_use(v):
    p, m = 4, 8
    layout = _layout(p, m, v, zero=3)
    parts = _parts(m, v, send=0.05, dp_comm=m * 1.5, dp_exposed=m * 0.3)
    events = pipeline_events(layout, parts)
    starts = {(event_stage(ev), ev.label): ev.start_s for ev in events}
    gathers = [ev for ev in events if event_kind(ev) == "zero3"]
    assert len(gathers) == 2 * m * v * p  # one per forward and per backward of each chunk
    for ev in gathers:
        use = starts[(event_stage(ev), ev.label.removeprefix("gather "))]
        assert ev.end_s <= use + 1e-12
        assert ev.start_s >= 0.0
    for k in range(p):
        mine = sorted((ev.start_s, ev.end_s) for ev in gathers if event_stage(ev) == k)
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(mine))
    # without overlap nothing is prefetched: the model counts ZeRO-3 traffic as exposed
    flat = pipeline_events(_layout(p, m, v, zero=3, overlap=False), parts)
    assert not [ev for ev in flat if event_kind(ev) == "zero3"]


def test_the_step_ends_with_dp_sync_and_optimizer():
    p, m = 4, 8
    parts = _parts(m, dp_comm=0.6, dp_exposed=0.2, optimizer=0.5)
    events = pipeline_events(_layout(p, m), parts)
    start, end = pipeline_span(events)
    assert start == 0.0
    assert max(ev.end_s for ev in events) == pytest.approx(end + 0.2 + 0.5)
    for k in range(p):
        last = max(
            ev.end_s
            for ev in events
            if event_stage(ev) == k and event_kind(ev) in ("forward", "backward", "tp", "send")
        )
        tail = {ev.label: ev for ev in events if event_stage(ev) == k and event_kind(ev) == "dp"}
        assert tail["dp sync"].start_s == pytest.approx(last)
        hidden = [ev for ev in events if event_stage(ev) == k and event_kind(ev) == "dp hidden"]
        assert hidden[0].end_s == pytest.approx(last)
        assert hidden[0].end_s - hidden[0].start_s == pytest.approx(0.4)


def test_ops_take_the_breakdowns_forward_backward_and_their_collectives():
    # a full recompute's backward (3x the forward here) and the critical collectives of the
    # forwards (tp + cp + ep) as the breakdown gives them, the backward the rest
    parts = _parts(2) | dict(forward=2.0, backward=6.0, cp_comm=0.4, ep_comm=0.2)
    parts["comm_forward"] = 0.5
    ops = simulate(1, 2, 1, chunk_times(_layout(1, 2, recompute="full"), parts))
    fwd = [o.compute_end - o.start for o in ops if o.kind == "F"]
    bwd = [o.compute_end - o.start for o in ops if o.kind == "B"]
    assert fwd == pytest.approx([1.0, 1.0]) and bwd == pytest.approx([3.0, 3.0])
    critical = 2 * (TP_F + TP_B) + 0.4 + 0.2
    for o in ops:  # one forward, one backward: F0 B0 F1 B1
        want = 0.25 if o.kind == "F" else (critical - 0.5) / 2
        assert o.tp_end - o.compute_end == pytest.approx(want)


def test_every_schedule_runs_to_the_end():
    for p, m, v in itertools.product(range(1, 7), range(1, 11), range(1, 4)):
        ops = simulate(p, m, v, _times(m, v, 0.01))
        assert len(ops) == 2 * p * m * v


def test_against_the_hybrid_model():
    # a toy GPT on 32 GPUs, dp 8 x pp 4: the model's step is the simulated step plus the three
    # sends the end stages do not make
    spec = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)
    cluster = make_cluster(nodes=4, gpus_per_node=8, nics=8, nic_bw="200Gbps")
    hm = StepModel(build_workload(spec), cluster, catalog.GPUS["a100-80gb"], 32, 64, 0.5)
    layouts = Layouts.build(dp=8, pp=4, micro_batches=8, zero=1)
    parts = hm.evaluate(layouts).row(0)
    events = pipeline_events(layouts.row(0), parts)
    send = parts["pp_comm"] / (2 * 8)
    assert send > 0
    assert max(ev.end_s for ev in events) == pytest.approx(parts["step"] - 3 * send, rel=1e-9)


@pytest.mark.parametrize("p, v, zero", [(4, 2, 3), (20, 1, 0)])
def test_plot_writes_a_png(tmp_path, p, v, zero):
    m = 2 * p
    events = pipeline_events(_layout(p, m, v, zero=zero), _parts(m, v, send=0.05))
    pred = {"step_time_s": max(ev.end_s for ev in events), "bubble_s": (p - 1) / v * _tick(v)}
    path = tmp_path / "pipeline.png"
    plot_pipeline(pred, events, str(path), "toy")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
