"""The data-parallel sync of a pipeline as Megatron-core runs it: each model chunk's reduction
launched as the chunk's last backward ends in the cool-down, the parameter gathers under the
next forward. A hand-computed pipeline, the closed form against the simulated schedule, and
what the model charges a Llama-3-like interleaved layout."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.dpsync import SyncPlan, chunk_blocks, chunk_kind, chunk_leads, reduce_part
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel, schedule_groups
from commsim.step.pipeline import event_kind, pipeline_events
from commsim.step.sync import BucketCosts, tail_of_leads
from commsim.workload.presets import build_workload


def _plan(chunk, reduce, gather, v, ready=None):
    """A SyncPlan of buckets with these chunks and costs (launch order)."""
    chunk = np.asarray(chunk)
    reduce, gather = np.asarray(reduce, float), np.asarray(gather, float)
    ready = np.zeros(len(chunk)) if ready is None else np.asarray(ready, float)
    leads = chunk_leads(chunk, ready, v)
    none = np.zeros(len(chunk))
    costs = BucketCosts(reduce + gather, none, none)
    return SyncPlan(
        chunks=(),
        chunk=chunk,
        leads=leads,
        costs=costs,
        params=gather,
        reduce=tail_of_leads(BucketCosts(reduce, none, none), leads),
        gather=tail_of_leads(BucketCosts(gather, none, none), leads),
        serial=float(costs.network.sum()),
    )


def _parts(m, v, forward=1.0, backward=2.0, optimizer=0.5):
    """A StepBreakdown row of chunk ops of these seconds, no collectives or sends."""
    ops = m * v
    zero = dict(tp_comm=0.0, cp_comm=0.0, ep_comm=0.0, comm_forward=0.0, pp_comm=0.0)
    return zero | dict(
        compute=ops * (forward + backward),
        forward=ops * forward,
        backward=ops * backward,
        dp_comm=0.0,
        dp_exposed=0.0,
        optimizer=optimizer,
        wgrad=ops * backward / 2,
    )


def _layout(p, m, v, overlap=True, zero=1):
    return dict(pp=p, micro_batches=m, interleave=v, zero=zero, recompute="none", overlap=overlap)


def test_a_hand_computed_two_stage_two_chunk_pipeline():
    # p = 2, v = 2, m = 2, chunk ops forward 1 s, backward 2 s: stage 0 runs F(0,0) F(0,1)
    # F(1,0) F(1,1), then B(1,0) B(1,1) B(0,0) B(0,1), the pipeline ending at (m + (p - 1) /
    # v) x v x 3 = 15 s. Chunk 1's last backward ends 2 backwards (4 s) before the end: its
    # reduce-scatter (5 s) runs 11..16, chunk 0's (1 s) after its own end at 16..17: 2 s
    # past 15. Gathers from 0 in forward order: chunk 0's (1.5 s) is needed at 0, chunk
    # 1's (2 s, ending at 3.5) by chunk 1's first forward at 2: the step waits 1.5 s.
    plan = _plan(chunk=[1, 0], reduce=[5.0, 1.0], gather=[2.0, 1.5], v=2)
    events = pipeline_events(_layout(2, 2, 2), _parts(2, 2), plan)
    assert max(ev.end_s for ev in events) == pytest.approx(1.5 + 15.0 + 2.0 + 0.5)
    assert float(plan.reduce.at(2 * 2.0, True)) == pytest.approx(2.0)  # x = g x backward
    assert float(plan.gather.at(2 * 1.0, True)) == pytest.approx(1.5)  # x = g x forward
    exposed = [ev for ev in events if event_kind(ev) == "dp" and ev.stream == "stage 0"]
    assert exposed[0].end_s - exposed[0].start_s == pytest.approx(2.0)
    # without overlap: everything after the pipeline, serially
    flat = pipeline_events(_layout(2, 2, 2, overlap=False), _parts(2, 2), plan)
    assert max(ev.end_s for ev in flat) == pytest.approx(15.0 + 9.5 + 0.5)


def test_one_chunk_reduces_bucket_by_bucket_under_the_last_backward():
    # v = 1: buckets ready at 25% and 75% of the first stage's last backward (2 s): the
    # first (3 s) launches 1.5 s before the end, the second (1 s) after it: 2.5 s past
    plan = _plan(chunk=[0, 0], reduce=[3.0, 1.0], gather=[0.0, 0.0], v=1, ready=[0.25, 0.75])
    events = pipeline_events(_layout(2, 4, 1, zero=0), _parts(4, 1), plan)
    assert max(ev.end_s for ev in events) == pytest.approx((4 + 1) * 3.0 + 2.5 + 0.5)
    assert float(plan.reduce.at(2.0, True)) == pytest.approx(2.5)


@pytest.mark.parametrize("p, m, v", [(2, 4, 1), (4, 8, 2), (4, 8, 4), (3, 9, 3), (4, 6, 2)])
def test_random_plans_closed_form_is_the_laid_out_schedule(p, m, v):
    rng = np.random.default_rng(p * 100 + m * 10 + v)
    first, last = (int(x[0]) for x in schedule_groups(np.array([p]), np.array([m])))
    for _ in range(20):
        n = int(rng.integers(1, 4))
        chunk = np.repeat(np.arange(v)[::-1], n)
        ready = np.tile(np.sort(rng.uniform(0, 1, n)), v)
        reduce, gather = rng.uniform(0, 6, chunk.size), rng.uniform(0, 3, chunk.size)
        plan = _plan(chunk, reduce, gather, v, ready)
        fwd, bwd = rng.uniform(0.5, 1.5), rng.uniform(1.0, 3.0)
        events = pipeline_events(_layout(p, m, v), _parts(m, v, fwd, bwd), plan)
        x_b, x_f = (bwd, fwd) if v == 1 else (last * bwd, first * fwd)
        closed = (m + (p - 1) / v) * v * (fwd + bwd) + 0.5
        closed += float(plan.reduce.at(x_b, True)) + float(plan.gather.at(x_f, True))
        assert max(ev.end_s for ev in events) == pytest.approx(closed, rel=1e-12)


def test_chunk_split_and_what_each_chunk_holds():
    # Llama 3 405B: 7 layers on each end stage of 8 chunks (arXiv:2407.21783 Sec. 3.3.2)
    assert chunk_blocks("first", 7, 8) == [0, 1, 1, 1, 1, 1, 1, 1]
    assert chunk_blocks("last", 7, 8) == [1, 1, 1, 1, 1, 1, 1, 0]
    assert chunk_blocks("middle", 8, 8) == [1] * 8
    assert chunk_blocks("only", 12, 1) == [12]
    kinds = [chunk_kind(k, c, 4) for k in ("first", "middle", "last") for c in (0, 3)]
    assert kinds == ["first", "middle", "middle", "middle", "middle", "last"]
    assert chunk_kind("last", 0, 1) == "last"


def test_schedule_groups_follow_megatrons_grouping():
    first, last = schedule_groups(np.array([4, 4, 3, 4]), np.array([8, 6, 7, 2]))
    # 8 in groups of 4; 6 in one group of 6; 7 in groups of 4 (4 + 3); 2 < 4: one group of 2
    assert first.tolist() == [4, 6, 4, 2] and last.tolist() == [4, 6, 3, 2]


def _toy_model(nic="200Gbps", params=None, backend="gloo"):
    spec = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)
    cluster = make_cluster(nodes=4, gpus_per_node=8, nics=8, nic_bw=nic, backend=backend)
    return StepModel(build_workload(spec), cluster, catalog.GPUS["a100-80gb"], 32, 64, None)


def _uncontended_sync(hm, L, b):
    """Layout 0's exposed sync as the model prices it, but with the compute at full speed
    beside it (the pipeline's simulation does not slow it: step.contention)."""
    m, v = int(L.micro_batches[0]), int(L.interleave[0])
    c = hm.compute(L)
    crit = (b["tp_comm"] + b["cp_comm"] + b["ep_comm"]) / m
    span_f = float(c.forward[0]) + b["comm_forward"] / m
    span_b = float(c.backward[0]) + crit - b["comm_forward"] / m
    first, last = (float(x[0]) for x in schedule_groups(L.pp, L.micro_batches))
    x_b = span_b if v == 1 else last * span_b / v
    x_f = span_f if v == 1 else first * span_f / v
    return hm.dp.sync(L, np.array([x_b]), np.array([x_f]))[1]


@pytest.mark.parametrize("nic", ["200Gbps", "2Gbps"])
def test_the_models_sync_is_the_simulated_one_with_free_sends(nic):
    # every layout's step model against the pipeline simulated op by op with its buckets
    # laid out on the schedule; sends set to nothing (they are what the two count apart)
    hm = _toy_model(nic)
    exposed_seen = set()
    for pp, v, m, zero, ov, mb in itertools.product(
        [2, 4], [1, 2, 4], [4, 8, 12], [0, 1, 2], [True, False], [1, 25]
    ):
        if 8 % (pp * v) or (v > 1 and m < pp):
            continue
        L = Layouts.build(
            dp=32 // pp, pp=pp, interleave=v, micro_batches=m, zero=zero, overlap=ov, bucket_mb=mb
        )
        b = hm.evaluate(L).row(0)
        exposed = _uncontended_sync(hm, L, b)
        c = hm.compute(L)
        crit = (b["tp_comm"] + b["cp_comm"] + b["ep_comm"]) / m
        tick = float(c.forward[0] + c.backward[0]) + crit
        closed = (m + (pp - 1) / v) * tick + float(exposed[0]) + b["optimizer"]
        events = pipeline_events(L.row(0), b | {"pp_comm": 0.0}, hm.dp.sync_plan(L, 0))
        assert max(ev.end_s for ev in events) == pytest.approx(closed, rel=1e-9)
        exposed_seen.add(round(float(exposed[0]) / max(b["dp_comm"], 1e-300), 1))
    assert len(exposed_seen) > 3  # hidden, partly hidden and exposed syncs all met


def test_with_paid_sends_the_simulation_is_the_models_step_less_its_extra_sends():
    hm = _toy_model(backend="nccl")  # NCCL kernels on the GPU: the compute beside them slows
    for v in (1, 2):
        L = Layouts.build(dp=8, pp=4, interleave=v, micro_batches=8, zero=1)
        b = hm.evaluate(L).row(0)
        events = pipeline_events(L.row(0), b, hm.dp.sync_plan(L, 0))
        send = b["pp_comm"] / (2 * 8 * v)
        contention = b["dp_exposed"] - float(_uncontended_sync(hm, L, b)[0])
        assert contention > 0  # the compute beside the sync is slower (step.contention)
        short = b["step"] - contention - max(ev.end_s for ev in events)
        if v == 1:  # as without the buckets: the end stages' three missing sends
            assert short == pytest.approx(3 * send, rel=1e-9)
        else:  # at most m + 1 sends (pipeline.py's docstring)
            assert -1e-12 <= short <= (8 + 1) * send + 1e-12


def test_interleaving_hides_the_reductions_in_the_cool_down():
    # the same stage and buckets: with v chunks the earlier chunks reduce during the
    # cool-down, so less of the sync is exposed than under one micro-batch's backward
    hm = _toy_model("2Gbps")
    L = Layouts.build(dp=8, pp=4, interleave=2, micro_batches=8, zero=1, bucket_mb=1)
    b = hm.evaluate(L).row(0)
    plan = hm.dp.sync_plan(L, 0)
    assert set(plan.chunk.tolist()) == {0, 1}
    assert plan.chunk[0] == 1  # the last chunk launches first
    off = hm.evaluate(
        Layouts.build(dp=8, pp=4, interleave=2, micro_batches=8, zero=1, bucket_mb=1, overlap=False)
    ).row(0)
    assert b["dp_comm"] == pytest.approx(off["dp_comm"])
    assert b["dp_exposed"] < off["dp_exposed"]


def test_a_sync_that_cannot_run_stays_inf_without_a_warning():
    # network = reduce-scatter + all-gather; NCCL_ALGO=tree leaves neither: both inf, and the
    # reduction is inf (not inf - inf = NaN with numpy's RuntimeWarning, which plan printed)
    network, gather = np.array([3.0, np.inf]), np.array([1.0, np.inf])
    with np.errstate(all="raise"):
        assert list(reduce_part(network, gather)) == [2.0, np.inf]


def test_plan_under_nccl_algo_tree_prints_no_numpy_warning():
    import warnings

    from typer.testing import CliRunner

    from commsim.cli.app import app

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value encountered in subtract"
        res = CliRunner().invoke(app, ["plan", "--nccl-algo", "tree", "--zero", "1", "--json"])
    assert res.exception is None and res.exit_code == 0, res.output
    assert json.loads(res.output)["candidates"] == []  # nothing can run, as its notes say
