"""Chakra .et traces: the wire format by hand against known bytes, a commsim layout written
and read back (counts, dependencies, sizes, step time), and bad files as one-line errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from commsim.cli.options import setup_from_flags
from commsim.specs import SpecError
from commsim.traces import protowire as pw
from commsim.traces.chakra import chakra_files, import_chakra, read_chakra
from commsim.traces.export import export_graph
from commsim.traces.pricing import ClusterPricer
from commsim.traces.replay import replay

LLAMA = dict(model="llama2-7b", cluster="dgx-a100-ib", global_batch=32, micro_batch=1, seq_len=1024)


def test_varints_by_hand():
    # protobuf's encoding guide: 150 is 96 01; 300 is ac 02; -1 as int64 is ten bytes
    assert pw.varint(150) == b"\x96\x01"
    assert pw.varint(300) == b"\xac\x02"
    assert pw.varint(-1) == b"\xff" * 9 + b"\x01"
    assert pw.read_varint(b"\xac\x02", 0) == (300, 2)
    assert pw.signed64(pw.read_varint(pw.varint(-5), 0)[0]) == -5
    assert pw.unzigzag(pw.zigzag(-3)) == -3 and pw.zigzag(-1) == 1
    # field 1 = 150: 08 96 01 (the guide's Test1 message)
    assert pw.field_varint(1, 150) == b"\x08\x96\x01"
    assert pw.fields(b"\x08\x96\x01") == {1: [(0, 150)]}
    # packed and unpacked repeated values read alike
    assert pw.repeated_varints(pw.fields(pw.packed(4, [3, 270]))[4]) == [3, 270]
    assert pw.repeated_varints([(0, 3), (0, 270)]) == [3, 270]


def _export(tmp_path, **kw):
    setup = setup_from_flags(None, **(LLAMA | kw))
    graph, step = export_graph(setup)
    paths = []
    for rank, data in chakra_files(graph, graph.metadata).items():
        path = tmp_path / f"trace.{rank}.et"
        path.write_bytes(data)
        paths.append(path)
    return setup, graph, step, paths


def _reads_back_the_same(setup, paths, written):
    """The files replay the step exactly as recorded, and re-priced on the same cluster."""
    back = import_chakra(paths)
    assert replay(back).step_s == written
    s = setup.scenario.strategy
    shards = int(back.metadata.get("ps_shards", 1))
    priced = ClusterPricer(back, setup.cluster, setup.n_gpus, s.algorithm, s.placement, shards)
    assert replay(back, priced).step_s == pytest.approx(written, rel=1e-12)


MOE = dict(model="mixtral-8x7b", cluster="dgx-h100-ib", gpus=16, tp=2, pp=2, ep=2)


@pytest.mark.parametrize(
    "layout",
    [
        dict(gpus=8),
        dict(gpus=16, tp=2, pp=2),
        dict(gpus=16, tp=2, pp=2, zero=1),
        MOE,
        dict(gpus=32, tp=2, pp=4, interleave=2, zero=1),
        dict(gpus=32, tp=2, pp=4, order="tp-cp-ep-pp-dp"),
    ],
)
def test_exported_layout_reads_back_the_same(tmp_path, layout):
    setup, graph, step, paths = _export(tmp_path, **layout)
    back = import_chakra(paths)
    assert back.counts() == graph.counts()
    for rank, nodes in graph.ranks.items():
        again = back.ranks[rank]
        assert [(n.id, n.kind, n.op, n.bytes, n.deps, n.peer, n.tag) for n in again] == [
            (n.id, n.kind, n.op, n.bytes, n.deps, n.peer, n.tag) for n in nodes
        ]
    assert back.groups == graph.groups | {"world": back.groups["world"]}
    written = replay(graph).step_s
    assert replay(back).step_s == written  # recorded durations: exactly
    s = setup.scenario.strategy
    priced = ClusterPricer(back, setup.cluster, setup.n_gpus, s.algorithm, s.placement)
    assert replay(back, priced).step_s == pytest.approx(written, rel=1e-12)  # re-priced
    if "tp" not in layout:  # plain DDP: the step predict reports
        assert written == pytest.approx(step, rel=1e-12)
    else:  # the pipeline schedule; predict's closed form charges sends as step.pipeline says
        assert written == pytest.approx(step, rel=0.01)


@pytest.mark.parametrize(
    "layout",
    [
        dict(interleave=1),
        dict(interleave=2),
        dict(interleave=4),
        dict(interleave=2, zero=1),
        dict(zero=1, overlap_param_gather=False),
        dict(interleave=2, zero=2, overlap_param_gather=False),
        dict(interleave=2, order="tp-cp-ep-pp-dp"),
        dict(tp_overlap=True),
        dict(tp_overlap=True, interleave=2),
    ],
)
def test_pipeline_export_replays_the_schedule_exactly(layout):
    """The replayed graph ends where step.pipeline's simulation of the same schedule ends,
    plus the exposed sync and the optimizer: interleaved too, where the sync the model hides
    under the last micro-batch's backward starts before that chunk's backward does."""
    from commsim.step.pipeline import chunk_times, simulate
    from commsim.step.predict import step_model, strategy_layouts

    setup = setup_from_flags(None, **(LLAMA | dict(gpus=8, tp=2, pp=2, global_batch=16) | layout))
    graph, _ = export_graph(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    row = L.row(0)
    t = chunk_times(row, step_model(setup).evaluate(L).row(0))
    assert t.dp_hidden > 0
    end = max(op.end for op in simulate(row["pp"], row["micro_batches"], row["interleave"], t))
    assert replay(graph).step_s == pytest.approx(end + t.dp_exposed + t.optimizer, rel=1e-13)


def test_node_counts_are_the_layouts_collectives(tmp_path):
    """tp 2 x pp 2 x dp 4: every rank runs 2 all-reduces a block forward and 2 backward for
    each micro-batch on its stage's 16 blocks, sends and receives each micro-batch's
    activations and gradients once, and all-reduces each of its stage's buckets."""
    setup, graph, _, _ = _export(tmp_path, gpus=16, tp=2, pp=2)
    m = setup.micro_batches(setup.scenario.strategy)  # 32 / (4 x 1) = 8
    rank0 = graph.ranks[0]
    tp = [n for n in rank0 if n.kind == "coll" and n.pg.startswith("tp")]
    assert len(tp) == m * 16 * (2 + 2)
    assert all(n.bytes == 1 * 1024 * 4096 * 2 for n in tp)  # b s h, bf16
    assert sum(n.kind == "send" for n in rank0) == m  # stage 0 sends forwards only
    assert sum(n.kind == "recv" for n in rank0) == m
    from commsim.step.predict import step_model, strategy_layouts

    model = step_model(setup)
    buckets = model.dp.sync_plan(strategy_layouts(setup, [setup.scenario.strategy]), 0).buckets
    dp = [n for n in rank0 if n.kind == "coll" and n.pg.startswith("dp")]
    assert [n.bytes for n in dp] == pytest.approx(list(buckets.bytes))


def test_tp_overlap_runs_the_same_collectives_beside_the_compute(tmp_path):
    """tp_overlap: the same tensor-parallel all-reduces (count, size, price), each chunk's
    off the compute chain, waited for by the op's next node; read back the same."""
    _, plain, _, _ = _export(tmp_path, gpus=16, tp=2, pp=2)
    setup, graph, _, paths = _export(tmp_path, gpus=16, tp=2, pp=2, tp_overlap=True)
    assert graph.counts()["coll all-reduce"] == plain.counts()["coll all-reduce"]
    tp = [n for n in graph.ranks[0] if n.kind == "coll" and n.pg.startswith("tp")]
    assert {(n.bytes, n.duration) for n in tp} == {
        (n.bytes, n.duration) for n in plain.ranks[0] if n.kind == "coll" and n.pg.startswith("tp")
    }
    sends = [n for n in graph.ranks[0] if n.kind == "send"]
    assert all(len(n.deps) == 2 for n in sends)  # the compute and the last all-reduce
    assert replay(import_chakra(paths)).step_s == replay(graph).step_s


def test_tp_overlap_where_the_all_reduces_outlast_the_op():
    """Communication-bound (tp 8 across nodes): a forward's all-reduces outlast its compute;
    the schedule takes each op's exposed share from the step model's breakdown (forward and
    backward apart), and the replay is the schedule."""
    from commsim.step.pipeline import chunk_times, simulate
    from commsim.step.predict import step_model, strategy_layouts

    setup = setup_from_flags(
        None,
        **(LLAMA | dict(gpus=64, tp=8, pp=4, cluster="roce-3tier-3to1", placement="interleaved"))
        | dict(tp_overlap=True),
    )
    graph, _ = export_graph(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    row = L.row(0)
    t = chunk_times(row, step_model(setup).evaluate(L).row(0))
    end = max(op.end for op in simulate(row["pp"], row["micro_batches"], row["interleave"], t))
    schedule = end + t.dp_exposed + t.optimizer
    assert t.tp_forward > 0 and replay(graph).step_s == pytest.approx(schedule, rel=1e-9)


@pytest.mark.parametrize("layout", [dict(tp=2), dict(), dict(tp=2, overlap=False)])
def test_zero3_one_stage_replays_predict_exactly(tmp_path, layout):
    """ZeRO-3 on one stage, where compute hides the prefetched gathers (and without
    overlap, where nothing hides): the unit graph replays step.fsdp's closed form exactly:
    2 first gathers and the last reduce-scatter a micro-batch exposed, or all of it; the
    same re-priced and read back from the files."""
    setup, graph, step, paths = _export(tmp_path, gpus=8, global_batch=16, zero=3, **layout)
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_zero3_node_counts_by_hand(tmp_path):
    """Llama 2 7B, tp 2 x dp 4, ZeRO-3, 4 micro-batches of 32 blocks: per micro-batch 32
    units gathered forward and backward plus the end layers each way, 32 reduce-scatters,
    each of a unit's parameters per GPU (bf16 gathered, fp32 gradients) on its dp group."""
    setup, graph, _, _ = _export(tmp_path, gpus=8, tp=2, global_batch=16, zero=3)
    rank0 = graph.ranks[0]
    z3 = [n for n in rank0 if n.name.startswith("zero3")]
    gathers = [n for n in z3 if n.op == "all-gather" and "unit" in n.name]
    scatters = [n for n in z3 if n.op == "reduce-scatter"]
    assert (len(gathers), len(scatters)) == (4 * 2 * 32, 4 * 32)
    assert sum("end layers" in n.name for n in z3) == 4 * 2
    block = setup.workload.layers[1].params  # block 0 (after the embedding)
    assert gathers[0].bytes == block / 2 * 2 and scatters[0].bytes == block / 2 * 4
    assert {n.pg for n in z3} == {"dp0"} and graph.groups["dp0"] == ("dp", (0, 2, 4, 6))


def test_zero3_where_the_stream_is_busier_than_the_units():
    """Gathers and reduce-scatters outlast the units' compute (10 GbE): the unit graph
    replays at most the closed form (which charges a gather and a reduce-scatter under
    every backward unit but the first; the last has no gather left to hide) and at least
    the ZeRO-3 traffic itself."""
    setup = setup_from_flags(
        None, **(LLAMA | dict(gpus=16, cluster="ethernet-10g", global_batch=16, zero=3))
    )
    graph, step = export_graph(setup)
    written = replay(graph).step_s
    traffic = sum(n.duration for n in graph.ranks[0] if n.name.startswith("zero3"))
    assert traffic < written <= step


CP = dict(global_batch=16, seq_len=4096)


@pytest.mark.parametrize(
    "layout",
    [
        dict(gpus=8, cp=2),
        dict(gpus=16, cp=4, tp=2, global_batch=2),
        dict(gpus=8, cp=2, recompute="selective"),
        dict(gpus=8, cp=2, recompute="full"),
        dict(gpus=8, cp=2, recompute="op"),
        dict(gpus=8, cp=4, seq_len=8192, cluster="pcie-4gpu", global_batch=2),  # ring shows
    ],
)
def test_context_parallel_one_stage_replays_predict_exactly(tmp_path, layout):
    """Ring attention on one stage: per block cp - 1 steps of max(transfer, attention
    share), the step model's closed form, exactly; re-priced and read back the same."""
    setup, graph, step, paths = _export(tmp_path, **(CP | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    if "cluster" in layout:
        from commsim.step.predict import predict

        assert predict(setup).to_dict()["cp_comm_s"] > 0.02 * step
    _reads_back_the_same(setup, paths, written)


def test_context_parallel_node_counts_by_hand(tmp_path):
    """Llama 2 7B, cp 2 x dp 4, 4 micro-batches of 32 blocks: a ring step a block, one
    K/V send forward, two backward (K/V, then their gradients), each b s / cp x 2 x 32 kv
    heads x 128 x 2 bytes, to the other rank of the cp group (ranks 0 and 1: cp after tp)."""
    _, graph, _, _ = _export(tmp_path, gpus=8, cp=2, **CP)
    rank0 = graph.ranks[0]
    sends = [n for n in rank0 if n.kind == "send"]
    recvs = [n for n in rank0 if n.kind == "recv"]
    assert len(sends) == len(recvs) == 4 * 32 * (1 + 2)
    assert {n.bytes for n in sends} == {4096 / 2 * 2 * 32 * 128 * 2}
    assert {n.peer for n in sends + recvs} == {1} and graph.groups["cp0"] == ("cp", (0, 1))


def test_the_pipeline_inside_each_replica(tmp_path):
    """Rank order tp-cp-ep-pp-dp, tp 2 x pp 4 x dp 4: a replica is 8 consecutive ranks (tp
    fastest, then the stages), so data-parallel peers are 8 apart and rank 2 (stage 1)
    receives from rank 0 and sends to rank 4."""
    _, graph, _, _ = _export(tmp_path, gpus=32, tp=2, pp=4, order="tp-cp-ep-pp-dp")
    dp = {ranks for kind, ranks in graph.groups.values() if kind == "dp"}
    assert (0, 8, 16, 24) in dp and (3, 11, 19, 27) in dp
    assert {n.peer for n in graph.ranks[2] if n.kind == "recv"} == {0, 4}
    assert {n.peer for n in graph.ranks[2] if n.kind == "send"} == {0, 4}
    assert {n.peer for n in graph.ranks[0] if n.kind == "send"} == {2}


def test_gzip_and_int_types_are_read(tmp_path):
    _, graph, _, paths = _export(tmp_path, gpus=2)
    gz = tmp_path / "z.0.et"
    gz.write_bytes(gzip.compress(paths[0].read_bytes()))
    meta, nodes = read_chakra(gz)
    assert meta["version"] == "1.0.0"
    coll = next(n for n in nodes if n.type == 7)
    assert coll.attrs["comm_size"] > 0


def _corrupt(tmp_path, data: bytes):
    path = tmp_path / "bad.0.et"
    path.write_bytes(data)
    return path


def _messages(tmp_path):
    _, _, _, paths = _export(tmp_path, gpus=2)
    return pw.split_delimited(paths[0].read_bytes())


def test_bad_files_are_one_line_errors(tmp_path):
    msgs = _messages(tmp_path)
    whole = pw.delimited(msgs)
    with pytest.raises(SpecError, match="truncated"):
        read_chakra(_corrupt(tmp_path, whole[:-7]))
    other = pw.field_bytes(1, "0.0.3")
    with pytest.raises(SpecError, match="schema '0.0.3'"):
        read_chakra(_corrupt(tmp_path, pw.delimited([other, *msgs[1:]])))
    with pytest.raises(SpecError, match="version: missing"):
        read_chakra(_corrupt(tmp_path, pw.delimited([b"", *msgs[1:]])))
    odd = pw.field_varint(1, 99) + pw.field_bytes(2, "x") + pw.field_varint(3, 12)
    with pytest.raises(SpecError, match="node 99.type: unknown node type 12"):
        read_chakra(_corrupt(tmp_path, pw.delimited([*msgs, odd])))
    bare = pw.field_varint(1, 98) + pw.field_bytes(2, "ar") + pw.field_varint(3, 7)
    with pytest.raises(SpecError, match="node 98.attr.comm_type: missing"):
        import_chakra([_corrupt(tmp_path, pw.delimited([*msgs, bare]))])
    with pytest.raises(SpecError, match="named <prefix>.<rank>.et"):
        import_chakra([tmp_path / "trace.et"])


@pytest.mark.parametrize(
    "layout",
    [
        dict(gpus=8, fsdp_shard=2),
        dict(gpus=8, tp=2, fsdp_shard=2),
        dict(gpus=16, fsdp_shard=4, overlap=False),
    ],
)
def test_hybrid_sharding_one_stage_replays_predict_exactly(tmp_path, layout):
    """HSDP on one stage, where compute hides the prefetched gathers (and without overlap):
    the units' shard-group gathers and reduce-scatters and the replica all-reduces replay
    step.fsdp's closed form exactly; re-priced and read back the same."""
    setup, graph, step, paths = _export(tmp_path, global_batch=16, zero=3, **layout)
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_hybrid_sharding_node_counts_by_hand(tmp_path):
    """Llama 2 7B on 8 GPUs, dp 8 sharded in groups of 2 (4 replicas), 2 micro-batches of
    32 blocks: per micro-batch 32 units gathered forward and backward plus the end layers
    each way on the shard group, 32 reduce-scatters there, each followed by an all-reduce
    of the shard's half of the gradient over the 4 replicas."""
    setup, graph, _, _ = _export(tmp_path, gpus=8, global_batch=16, zero=3, fsdp_shard=2)
    rank0 = graph.ranks[0]
    block = setup.workload.layers[1].params
    gathers = [n for n in rank0 if n.op == "all-gather"]
    scatters = [n for n in rank0 if n.op == "reduce-scatter"]
    replicas = [n for n in rank0 if n.op == "all-reduce"]
    assert (len(gathers), len(scatters), len(replicas)) == (2 * (2 * 32 + 2), 2 * 32, 2 * 32)
    assert {n.bytes for n in gathers if "unit" in n.name} == {block * 2}  # bf16
    assert {n.bytes for n in scatters} == {block * 4} and {n.bytes for n in replicas} == {
        block * 4 / 2
    }
    assert {n.pg for n in gathers + scatters} == {"shard0"} and {n.pg for n in replicas} == {
        "replica0"
    }
    assert graph.groups["shard0"] == ("shard", (0, 1))
    assert graph.groups["replica0"] == ("replica", (0, 2, 4, 6))
    # each reduce-scatter's all-reduce follows it on the stream
    ids = {n.id: n for n in rank0}
    assert all(ids[n.deps[-1]].op == "reduce-scatter" for n in replicas)
    assert graph.counts()["coll all-reduce"] == 8 * 2 * 32


@pytest.mark.parametrize(
    "layout",
    [
        dict(gpus=8, cp=2),
        dict(gpus=16, cp=2, tp=2, global_batch=8),
        dict(gpus=8, cp=2, recompute="full"),
        dict(gpus=8, cp=2, overlap=False),
    ],
)
def test_context_parallel_with_zero3_replays_predict_exactly(tmp_path, layout):
    """Context parallelism under ZeRO-3: each unit is a block of ring attention, its
    gathers and reduce-scatters on the dp x cp group; on one stage, where compute hides
    the gathers, the replay is `predict`'s step (ring and ZeRO-3 exposure add up as the
    step model adds them), read back and re-priced the same."""
    setup, graph, step, paths = _export(tmp_path, zero=3, **(CP | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_context_parallel_with_zero3_node_counts_by_hand(tmp_path):
    """Llama 2 7B, cp 2 x dp 4, ZeRO-3, 4 micro-batches of 32 blocks: the ZeRO-3 counts
    (32 units gathered each way plus the end layers, 32 reduce-scatters a micro-batch) on
    the 8-rank dp x cp group, and the ring's 3 sends a block (1 forward, 2 backward)."""
    setup, graph, _, _ = _export(tmp_path, gpus=8, cp=2, zero=3, **CP)
    rank0 = graph.ranks[0]
    assert sum(n.op == "all-gather" for n in rank0) == 4 * (2 * 32 + 2)
    assert sum(n.op == "reduce-scatter" for n in rank0) == 4 * 32
    assert sum(n.kind == "send" for n in rank0) == sum(n.kind == "recv" for n in rank0)
    assert sum(n.kind == "send" for n in rank0) == 4 * 32 * 3
    block = setup.workload.layers[1].params
    assert {n.bytes for n in rank0 if n.op == "reduce-scatter"} == {block * 4}
    assert graph.groups["dp0"] == ("dp", tuple(range(8)))


FOLDED = dict(model="mixtral-8x7b", cluster="dgx-h100-ib", gpus=8, tp=2)


@pytest.mark.parametrize(
    "layout",
    [
        dict(ep=4, etp=1),
        dict(ep=2, etp=1),
        dict(ep=4),  # etp = tp, one expert-data-parallel rank: its buckets run nothing
        dict(ep=2, zero=3, global_batch=16, seq_len=4096),  # ZeRO-3 of expert parameters
        dict(ep=4, etp=1, zero=3, global_batch=16, overlap=False),
    ],
)
def test_folded_expert_grid_one_stage_replays_predict_exactly(tmp_path, layout):
    """MoE parallel folding (etp other than tp) and ZeRO-3 of expert parameters on one
    stage: expert all-to-alls on the folded ep groups, expert buckets (or units) on the
    expert-data-parallel groups; the replay is `predict`'s step, read back and re-priced."""
    setup, graph, step, paths = _export(tmp_path, **(FOLDED | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_folded_expert_grid_pipelined(tmp_path):
    """tp 2 x pp 2 x dp 4 with ep 4 folded over tp x dp (etp 1): the schedule's replay,
    within predict's send accounting as other pipelines."""
    setup, graph, step, paths = _export(tmp_path, **(FOLDED | dict(gpus=16, pp=2, ep=4, etp=1)))
    assert replay(graph).step_s == pytest.approx(step, rel=0.01)
    _reads_back_the_same(setup, paths, replay(graph).step_s)


def test_folded_expert_grid_node_counts_by_hand(tmp_path):
    """Mixtral 8x7B, tp 2 x dp 4, ep 4 x etp 1 (edp 2), 8 micro-batches of 32 MoE blocks:
    per micro-batch 32 x (1 + 1) tensor-parallel all-reduces (attention's: the MoE layer's
    take the expert grid's) and 32 x (2 + 2) all-to-alls, no expert tensor-parallel
    all-reduce (etp 1); ep groups of 4 consecutive ranks (the
    expert grid [edp, ep, etp] read over the ranks in order), edp pairs 4 apart; the
    buckets' all-reduces on dp (dense) and edp (experts) groups, one each."""
    setup, graph, _, _ = _export(tmp_path, **(FOLDED | dict(ep=4, etp=1)))
    rank0 = graph.ranks[0]
    by_pg = {}
    for n in rank0:
        if n.kind == "coll":
            by_pg.setdefault((n.op, n.pg), []).append(n)
    assert len(by_pg[("all-reduce", "tp0")]) == 8 * 32 * 2
    a2a = by_pg[("all-to-all", "ep0")]
    assert len(a2a) == 8 * 32 * 4
    sh = step_shape(setup)
    assert {n.bytes for n in a2a} == {1 * 1024 * 4096 * 2 * sh.routed / 2}
    assert graph.groups["ep0"] == ("ep", (0, 1, 2, 3)) and graph.groups["ep1"][1] == (4, 5, 6, 7)
    assert graph.groups["edp0"] == ("edp", (0, 4)) and not any(
        k == "etp" for k, _ in graph.groups.values()
    )
    from commsim.step.predict import step_model, strategy_layouts

    b = (
        step_model(setup)
        .dp.sync_plan(strategy_layouts(setup, [setup.scenario.strategy]), 0)
        .buckets
    )
    assert [n.bytes for n in by_pg[("all-reduce", "dp0")]] == list(b.bytes[~b.expert])
    assert [n.bytes for n in by_pg[("all-reduce", "edp0")]] == list(b.bytes[b.expert])


def test_expert_zero3_node_counts_by_hand(tmp_path):
    """Mixtral 8x7B, tp 2 x dp 4, ep 2 (etp 2, edp 2), ZeRO-3, 4 micro-batches of 32
    blocks: each unit gathers its dense parameters (over tp) on dp and its experts' (over
    etp x ep) on edp, forward and backward, plus the end layers; reduce-scatters both."""
    setup, graph, _, _ = _export(tmp_path, **(FOLDED | dict(ep=2, zero=3, global_batch=16)))
    rank0 = graph.ranks[0]
    sh = step_shape(setup)
    dense = [n for n in rank0 if n.op == "all-gather" and n.pg == "dp0" and "unit" in n.name]
    expert = [n for n in rank0 if n.op == "all-gather" and n.pg == "edp0"]
    assert len(dense) == len(expert) == 4 * 2 * 32
    assert {n.bytes for n in dense} == {(sh.block_params - sh.expert_params) / 2 * 2}
    assert {n.bytes for n in expert} == {sh.expert_params / (2 * 2) * 2}
    scatters = [n for n in rank0 if n.op == "reduce-scatter"]
    assert len(scatters) == 4 * 2 * 32 and graph.counts()["coll all-gather"] == 8 * 4 * (2 * 65)


def step_shape(setup):
    from commsim.step.shape import Shape

    return Shape.of(setup.workload)


GPT2 = dict(model="gpt2-xl", cluster="aws-p4d", gpus=16, global_batch=64)


@pytest.mark.parametrize(
    "layout",
    [
        dict(compression="powersgd:4"),
        dict(compression="topk:0.01+int8", error_feedback=True),
        dict(compression="int8"),
        dict(compression="fp16", overlap=False),
        dict(overlap=False),  # uncompressed, every bucket after the backward
    ],
)
def test_compressed_ddp_replays_predict_exactly(tmp_path, layout):
    """A comm hook's step (step.timeline): encodes on the compute chain inside the last
    backward, each bucket's collectives on its compressed payloads after its encode, the
    decodes after the backward; the replay is `predict`'s step, read back and re-priced."""
    setup, graph, step, paths = _export(tmp_path, **(GPT2 | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    _reads_back_the_same(setup, paths, written)


def test_compressed_ddp_node_counts_by_hand(tmp_path):
    """fp16 (a cast each way, 6 HBM bytes an element each) and int8 (ZeRO++'s qgZ: an
    all-to-all and an all-gather of n bytes plus one fp32 scale per chunk) on GPT-2 XL's
    buckets of n fp32 gradients: one encode and one decode a bucket, of the HBM model's
    seconds, and the hook's collectives, in order, each of its payload's bytes."""
    from commsim.compression import INT8_CHUNK
    from commsim.step.predict import step_model, strategy_layouts

    setup, graph, _, _ = _export(tmp_path, **(GPT2 | dict(compression="fp16")))
    L = strategy_layouts(setup, [setup.scenario.strategy])
    n = step_model(setup).dp.sync_plan(L, 0).buckets.bytes / 4
    rank0 = graph.ranks[0]
    hbm = setup.gpu.stream_bandwidth
    for kind in ("encode", "decode"):
        codec = [x for x in rank0 if x.name.startswith(kind)]
        assert [x.duration for x in codec] == pytest.approx(list(6.0 * n / hbm), rel=1e-12)
    colls = [x for x in rank0 if x.kind == "coll"]
    assert [(x.op, x.bytes) for x in colls] == [("all-reduce", 2 * k) for k in n]
    _, graph, _, _ = _export(tmp_path, **(GPT2 | dict(compression="int8")))
    colls = [x for x in graph.ranks[0] if x.kind == "coll"]
    wire = [k + 4 * -(-k // INT8_CHUNK) for k in n]
    assert [(x.op, x.bytes) for x in colls] == [
        (op, w) for w in wire for op in ("all-to-all", "all-gather")
    ]
    ids = {x.id: x for x in graph.ranks[0]}
    assert all(ids[x.deps[0]].op == "all-to-all" for x in colls if x.op == "all-gather")
    assert {x.pg for x in colls} == {"dp0"} and len(graph.groups["dp0"][1]) == 16


@pytest.mark.parametrize("layout", [dict(), dict(ps_shards=4), dict(ps_shards=2, overlap=False)])
def test_parameter_server_ddp_replays_predict_exactly(tmp_path, layout):
    """The parameter server (--algorithm ps) on plain DDP: each bucket an all-reduce
    collective of the bucket's bytes, lasting the push and pull step.groups prices; the
    replay is `predict`'s step, and re-priced from the files (the algorithm and the server
    count in the trace's metadata) the same."""
    setup, graph, step, paths = _export(tmp_path, **(GPT2 | dict(algorithm="ps") | layout))
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=1e-12)
    assert graph.metadata["algorithm"] == "ps"
    assert graph.metadata["ps_shards"] == str(layout.get("ps_shards", 1))
    _reads_back_the_same(setup, paths, written)


def test_parameter_server_pipelined_needs_its_server_count(tmp_path):
    """tp 2 x pp 2 x dp 4 under ps with 2 servers: every all-reduce (tensor-parallel ones
    too, as the step model prices them) priced as the parameter server's, the dp groups'
    with 2 servers; read back, re-priced with the metadata's server count it is the
    recorded step, with 1 server it is not (the count matters here)."""
    layout = dict(gpus=16, tp=2, pp=2, algorithm="ps", ps_shards=2)
    setup, graph, step, paths = _export(tmp_path, **layout)
    written = replay(graph).step_s
    assert written == pytest.approx(step, rel=0.01)  # the schedule: send accounting
    _reads_back_the_same(setup, paths, written)
    back = import_chakra(paths)
    one = ClusterPricer(back, setup.cluster, setup.n_gpus, "ps", "blocked", 1)
    assert abs(replay(back, one).step_s / written - 1) > 0.01


def test_parameter_server_node_counts_by_hand(tmp_path):
    """GPT-2 XL on 16 GPUs under ps: one all-reduce a bucket, of the bucket's bytes, on
    the 16-rank dp group, each priced as step.groups prices the parameter server there."""
    from commsim.step.predict import step_model, strategy_layouts

    setup, graph, _, _ = _export(tmp_path, **(GPT2 | dict(algorithm="ps", ps_shards=4)))
    L = strategy_layouts(setup, [setup.scenario.strategy])
    model = step_model(setup)
    b = model.dp.sync_plan(L, 0).buckets
    colls = [x for x in graph.ranks[0] if x.kind == "coll"]
    assert [(x.op, x.bytes) for x in colls] == [("all-reduce", k) for k in b.bytes]
    ps = [float(model.groups.price("all-reduce", "dp", L, np.array([k]))[0]) for k in b.bytes]
    assert [x.duration for x in colls] == pytest.approx(list(ps), rel=1e-12)
    assert graph.counts()["coll all-reduce"] == 16 * len(b.bytes)


def test_zero12_gathers_after_the_optimizer_where_not_overlapped(tmp_path):
    """ZeRO-1 without --overlap-param-gather (Megatron-core's default off, DeepSpeed's
    stage 1-2): the reduce-scatters before the optimizer, each bucket's parameter
    all-gather after it, one by one, the step ending with the last."""
    setup, graph, _, _ = _export(tmp_path, gpus=16, tp=2, pp=2, zero=1, overlap_param_gather=False)
    rank0 = graph.ranks[0]
    at = next(j for j, x in enumerate(rank0) if x.name == "optimizer")
    before = [x.op for x in rank0[:at] if x.name.startswith("dp ")]
    after = [x.op for x in rank0[at + 1 :]]
    assert set(before) == {"reduce-scatter"} and set(after) == {"all-gather"}
    assert len(before) == len(after) and rank0[at + 1].deps == (at,)
