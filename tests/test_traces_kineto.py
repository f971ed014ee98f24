"""Kineto traces: reading (NCCL kernels with PyTorch's metadata, gloo annotations), the step
summary against hand-computed figures, and the imported graph's replay."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from commsim.specs import SpecError
from commsim.traces.imported import import_step
from commsim.traces.intervals import difference, measure, union
from commsim.traces.kineto import read_kineto
from commsim.traces.replay import replay
from commsim.traces.summary import summarize

GROUP = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]}


def _x(name, ts, dur, cat="kernel", tid=7, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _coll(ts, dur, nelems, name="allreduce", out=None, **extra):
    return _x(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        ts,
        dur,
        stream=20,
        **{
            "Collective name": name,
            "In msg nelems": nelems,
            "Out msg nelems": out or nelems,
            "dtype": "Float",
            "Group size": 4,
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": "[0, 1, 2, 3]",
        }
        | extra,
    )


def nccl_trace(rank=0):
    """Two steps of 1000 us: compute kernels on stream 7, two all-reduces on stream 20.
    Step 1: compute [0,400) [450,800); all-reduce A [300,500) 1 MiB, B [820,900) 256 KiB;
    then compute [900,1000) (the optimizer waits for B)."""
    ev = [
        _x("ProfilerStep#1", 1000, 1000, cat="user_annotation", tid=1),
        _x("ProfilerStep#2", 2000, 1000, cat="user_annotation", tid=1),
    ]
    for base in (1000, 2000):
        ev += [_x("sm80_gemm", base, 400), _x("sm80_gemm", base + 450, 350)]
        ev += [_coll(base + 300, 200, 2**18), _coll(base + 820, 80, 2**16)]
        ev += [_x("adam_kernel", base + 900, 100)]
    info = {"backend": "nccl", "rank": rank, "world_size": 4, "pg_config": [GROUP]}
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": ev}


def _write(tmp_path, doc, name="t.json", gz=False):
    path = tmp_path / name
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_interval_sets_by_hand():
    assert union([(3, 4), (0, 2), (1, 3)]).tolist() == [[0, 4]]
    assert measure([(0, 2), (1, 3), (5, 6)]) == 4
    assert difference([(0, 10)], [(2, 3), (5, 7)]).tolist() == [[0, 2], [3, 5], [7, 10]]


def test_interval_measure_against_a_grid():
    rng = np.random.default_rng(0)
    a = np.sort(rng.uniform(0, 100, (40, 2)), axis=1)
    b = np.sort(rng.uniform(0, 100, (40, 2)), axis=1)
    grid = np.linspace(0, 100, 200001)[:-1] + 0.00025  # cell midpoints, 0.0005 wide
    ina = ((grid[:, None] >= a[:, 0]) & (grid[:, None] < a[:, 1])).any(1)
    inb = ((grid[:, None] >= b[:, 0]) & (grid[:, None] < b[:, 1])).any(1)
    assert measure(difference(a, b)) == pytest.approx((ina & ~inb).sum() * 0.0005, abs=0.05)


def test_nccl_kernels_are_read_with_their_metadata(tmp_path):
    t = read_kineto(_write(tmp_path, nccl_trace(), gz=True))
    assert (t.rank, t.world, t.backend, t.gpu) == (0, 4, "nccl", True)
    assert [s.number for s in t.steps] == [1, 2]
    a = t.collectives[0]
    assert (a.op, a.bytes, a.group, a.pg) == ("all-reduce", 2**20, (0, 1, 2, 3), "0")
    assert a.duration == pytest.approx(200e-6)


def test_all_gather_counts_its_output(tmp_path):
    doc = nccl_trace()
    doc["traceEvents"].append(_coll(1100, 10, 2**10, name="_allgather_base", out=2**12))
    t = read_kineto(_write(tmp_path, doc))
    ag = [c for c in t.collectives if c.op == "all-gather"]
    assert ag[0].bytes == 2**12 * 4


def test_step_summary_by_hand(tmp_path):
    s = summarize([read_kineto(_write(tmp_path, nccl_trace()))])
    first = s.steps[0]
    # busy [0,400) [450,800) [900,1000): 850 us; comm [300,500) [820,900): 280 us; gaps
    # [400,450) (A still runs, but compute resumes before it ends: idle) and [800,900),
    # which B's end closes: a wait of 100 us, the only exposed time; compute 1000 - 100
    assert first.step_s == pytest.approx(1000e-6)
    assert first.busy_s == pytest.approx(850e-6)
    assert first.comm_s == pytest.approx(280e-6)
    assert first.exposed_comm_s == pytest.approx(100e-6)
    assert first.compute_s == pytest.approx(900e-6)
    assert first.idle_s == pytest.approx(50e-6)
    c = s.collectives[0]
    # 1 MiB in 200 us on 4 ranks: algbw 5.24 GB/s, busbw x 2 (4-1)/4 = 1.5
    assert c.algbw_Bps == pytest.approx(2**20 / 200e-6)
    assert c.busbw_Bps == pytest.approx(1.5 * 2**20 / 200e-6)


def test_imported_step_replays_to_the_measured_step(tmp_path):
    graph = import_step([read_kineto(_write(tmp_path, nccl_trace()))], 1)
    assert replay(graph).step_s == pytest.approx(1000e-6, abs=1e-12)
    # the optimizer waited for the second all-reduce: double it and the step grows by 80 us
    slow = replay(
        graph, lambda r, n: n.duration * (2 if n.kind == "coll" and n.bytes < 2**19 else 1)
    )
    assert slow.step_s == pytest.approx(1080e-6)


def _gloo_all_reduce(ts, dur):
    """gloo's annotation of a 1000-float all-reduce on its worker thread (tid 9)."""
    args = {"Input Dims": [[1000]], "Input type": ["float"]}
    return _x("gloo:all_reduce", ts, dur, cat="user_annotation", tid=9, **args)


def _gloo_trace(tmp_path, events):
    """Rank 1 of 2 on gloo, these events."""
    info = {"backend": "gloo", "rank": 1, "world_size": 2, "pg_config": [GROUP | {"ranks": [0, 1]}]}
    return read_kineto(_write(tmp_path, {"distributedInfo": info, "traceEvents": events}))


def test_gloo_annotations_on_the_default_group(tmp_path):
    ev = [
        _x("ProfilerStep#5", 0, 500, cat="user_annotation", tid=1),
        _x("aten::addmm", 10, 300, cat="cpu_op", tid=1),
        _x("c10d::allreduce_", 310, 20, cat="cpu_op", tid=1),
        _gloo_all_reduce(320, 100),
        _x("aten::add_", 430, 50, cat="cpu_op", tid=1),
    ]
    t = _gloo_trace(tmp_path, ev)
    assert not t.gpu
    (c,) = t.collectives
    assert (c.op, c.bytes, c.group) == ("all-reduce", 4000, (0, 1))
    f = summarize([t]).steps[0]
    # busy [10,310) [430,480); launch [310,330); the wait [330,430) ends with the all-reduce
    assert f.busy_s == pytest.approx(350e-6)
    assert f.exposed_comm_s == pytest.approx(120e-6)
    assert f.compute_s == pytest.approx(380e-6)


def _first_coll_args(d):
    return next(e["args"] for e in d["traceEvents"] if "Collective name" in e["args"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("traceEvents"), "traceEvents: missing"),
        (
            lambda d: d.__setitem__(
                "traceEvents", [e for e in d["traceEvents"] if "Step" not in e["name"]]
            ),
            "no ProfilerStep#N",
        ),
        (lambda d: _first_coll_args(d).pop("In msg nelems"), "In msg nelems: missing"),
        (lambda d: _first_coll_args(d).__setitem__("dtype", "Quaternion"), "unknown dtype"),
        (lambda d: d["traceEvents"][3].pop("dur"), r"traceEvents\[3\].dur: missing"),
        (lambda d: d["traceEvents"][3].__setitem__("dur", -50), r"\[3\].dur: negative duration"),
        (
            lambda d: _first_coll_args(d).__setitem__("In msg nelems", "abc"),
            "In msg nelems: not an element count",
        ),
        (
            lambda d: _first_coll_args(d).__setitem__("Out msg nelems", -5),
            "Out msg nelems: not an element count",
        ),
    ],
)
def test_bad_traces_are_one_line_errors(tmp_path, mutate, message):
    doc = nccl_trace()
    mutate(doc)
    with pytest.raises(SpecError, match=message):
        read_kineto(_write(tmp_path, doc))


def test_a_collective_on_a_group_without_the_traces_rank(tmp_path):
    """Rank 0's trace whose all-reduces run on ranks [1, 2, 3]: a trace of another rank (or
    a wrong distributedInfo.rank), refused naming the collective; it was summarised and
    priced as rank 0's."""
    doc = nccl_trace(0)
    for e in doc["traceEvents"]:
        if "Process Group Ranks" in e["args"]:
            e["args"]["Process Group Ranks"] = "[1, 2, 3]"
    with pytest.raises(SpecError, match=r"distributedInfo.rank: 0, but its 'allreduce' at 300 us"):
        read_kineto(_write(tmp_path, doc))


def test_a_collective_on_ranks_outside_the_world(tmp_path):
    """A trace of world_size 2 whose all-reduces run on ranks 0-3: trace calibrate wrote
    them and fit refused its own results ('group rank 3 outside world size 2')."""
    doc = nccl_trace(0)
    doc["distributedInfo"]["world_size"] = 2
    with pytest.raises(SpecError, match=r"world_size: 2, but its 'allreduce' at 300 us runs on"):
        read_kineto(_write(tmp_path, doc))


def test_a_group_of_over_30_ranks_as_libkineto_writes_it(tmp_path):
    """libkineto writes "Process Group Ranks" of a group over 30 ranks as its first 30 and
    '...' (kTruncatLength): the whole group is distributedInfo.pg_config's (every 64-rank
    trace was refused as 'not a list of ranks'); without it the group is unknown."""
    doc = nccl_trace(0)
    ranks = list(range(64))
    cut = "[" + ", ".join(map(str, ranks[:30])) + ", ...]"
    doc["distributedInfo"] |= {"world_size": 64, "pg_config": [GROUP | {"ranks": ranks}]}
    for e in doc["traceEvents"]:
        if "Process Group Ranks" in e["args"]:
            e["args"] |= {"Process Group Ranks": cut, "Group size": 64}
    t = read_kineto(_write(tmp_path, doc))
    assert {c.group for c in t.collectives} == {tuple(ranks)}
    doc["distributedInfo"]["pg_config"] = []
    unknown = read_kineto(_write(tmp_path, doc))
    assert {c.group for c in unknown.collectives} == {None}
    with pytest.raises(SpecError, match=r"pg_config: no ranks of process group '0'"):
        import_step([unknown])  # a replay needs the group: one line, not the graph's error


def test_gloo_dims_that_are_no_sizes(tmp_path):
    """A gloo annotation's Input Dims holding a negative or non-numeric extent is one error
    naming the field, never a negative or crashed size."""
    for dims in ([[-4]], [["x"]]):
        ev = [_x("ProfilerStep#5", 0, 500, cat="user_annotation", tid=1), _gloo_all_reduce(20, 9)]
        ev[1]["args"]["Input Dims"] = dims
        with pytest.raises(SpecError, match=r"traceEvents\[1\].args.Input Dims: not an element"):
            _gloo_trace(tmp_path, ev)


def test_truncated_file(tmp_path):
    path = _write(tmp_path, nccl_trace())
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(SpecError, match="truncated"):
        read_kineto(path)
    gz = _write(tmp_path, nccl_trace(), "t.json.gz", gz=True)
    gz.write_bytes(gz.read_bytes()[:-40])
    with pytest.raises(SpecError, match="truncated"):
        read_kineto(gz)


def test_gloo_ddp_step_as_the_testbed_records_it(tmp_path):
    """A DDP step on CPU as the emulated testbed's traces show it: the rank launches the
    all-reduce, gloo's thread opens its annotation 60 us after the rank began waiting and
    closes it 30 us after the step ended; DDP's bucket copies (into the bucket before the
    launch, back to the gradients after the wait) are communication, not compute."""
    ev = [
        _x("ProfilerStep#3", 0, 1000, cat="user_annotation", tid=1),
        _x("aten::addmm", 10, 290, cat="cpu_op", tid=1),
        _x("autograd::engine::evaluate_function: AccumulateGrad", 300, 40, cat="cpu_op", tid=1),
        _x("torch::distributed::reducer::mul_out", 305, 10, cat="cpu_op", tid=1),
        _x("c10d::allreduce_", 320, 10, cat="cpu_op", tid=1),
        _gloo_all_reduce(400, 630),
        _x("torch.distributed.ddp.reducer::copy_bucket_to_grad", 900, 20, cat="cpu_op", tid=1),
        _x("aten::add_", 920, 80, cat="cpu_op", tid=1),
    ]
    t = _gloo_trace(tmp_path, ev)
    f = summarize([t]).steps[0]
    # the step is its annotation (not the all-reduce's late end, 1030); busy [10,305)
    # [315,320) [330,340) [920,1000): 390 us; communication calls [305,315) [320,330)
    # [900,920): 40 us; the wait [340,900), in which the all-reduce runs though it opened
    # its record late: 560 us; exposed 600, compute 400, of which [0,10) idle
    assert f.step_s == pytest.approx(1000e-6)
    assert f.busy_s == pytest.approx(390e-6)
    assert f.exposed_comm_s == pytest.approx(600e-6)
    assert f.compute_s == pytest.approx(400e-6)
    assert f.idle_s == pytest.approx(10e-6)
    # replayed with the recorded durations: the copy back and the optimizer (100 us) after
    # the all-reduce's recorded end, 1030 (imported.py: the replay counts gloo's overrun)
    assert replay(import_step([t], 3)).step_s == pytest.approx(1130e-6, abs=1e-12)
